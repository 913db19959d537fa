"""An update whose `pulumi` CLI, or the worker process driving it, is killed mid-run (the kernel's OOM killer,
an admin's kill -9), on the real operator and engine: the CLI cannot release its lock, which the Stack's next
update must not take for another update's."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from strata_components.local import processes

from .conftest import has_condition, stash_program

COUNT = 300  # resources enough that the update lasts long enough to kill it


def _locks(backend: str) -> list[Path]:
    return list((Path(backend.removeprefix("file://")) / ".pulumi" / "locks").rglob("*.json"))


def _update_cli(operator_pid: int) -> int | None:
    """The operator's `pulumi up` process, if one runs."""
    for pid in processes.descendants(operator_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"pulumi") and b"up" in argv[1:3]:
            return pid
    return None


def test_an_update_whose_cli_was_killed_clears_the_lock_it_left_and_runs_again(stacks, operator):
    program = stash_program(**{f"r{i}": f"v{i}" for i in range(COUNT)})
    stacks.program("big", program)
    stacks.create("killed", stacks.spec(programRef={"name": "big"}))
    processes.wait_until(lambda: _locks(stacks.backend), 120, "the first update holding its lock", interval=0.1)
    cli = processes.wait_until(lambda: _update_cli(operator.pid()), 10, "the update's pulumi CLI", interval=0.1)
    os.kill(cli, signal.SIGKILL)
    stack = stacks.wait("killed", lambda o: has_condition(o, "Ready") or has_condition(o, "Stalled"), 240,
                        "Ready or Stalled after its CLI was killed")
    failures = [e.message for e in stacks.events("killed", "StackUpdateFailure")]
    assert has_condition(stack, "Ready"), (stack["status"], failures)
    assert not stacks.events("killed", "StackUpdateConflictDetected")
    assert not _locks(stacks.backend)
    # Said as what happened (the CLI's own output was cut off), and counted as one failure: it runs again.
    assert failures == ["Failed to update stack: the pulumi CLI was killed by SIGKILL during the up (out of memory, "
                        "or killed by hand); the lock it left in the backend is cleared before the stack's next "
                        "operation"]
    assert stacks.runs("killed") == 2


def test_an_update_whose_worker_was_killed_clears_what_its_cli_left_and_runs_again(stacks, operator):
    program = stash_program(**{f"r{i}": f"v{i}" for i in range(COUNT)})
    stacks.program("big-worker", program)
    stacks.create("worker-killed", stacks.spec(programRef={"name": "big-worker"}))
    processes.wait_until(lambda: _locks(stacks.backend), 120, "the first update holding its lock", interval=0.1)
    cli = processes.wait_until(lambda: _update_cli(operator.pid()), 10, "the update's pulumi CLI", interval=0.1)
    worker = int(Path(f"/proc/{cli}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(worker, signal.SIGKILL)
    stack = stacks.wait("worker-killed", lambda o: has_condition(o, "Ready") or has_condition(o, "Stalled"), 240,
                        "Ready or Stalled after its worker was killed")
    failures = [e.message for e in stacks.events("worker-killed", "StackUpdateFailure")]
    assert has_condition(stack, "Ready"), (stack["status"], failures)
    assert not stacks.events("worker-killed", "StackUpdateConflictDetected")
    assert not _locks(stacks.backend)
    assert failures == ["Failed to update stack: the up's worker process ended without a result (killed: out of "
                        "memory, or by hand); the CLI it ran was stopped, and the lock it may have left in the "
                        "backend is cleared before the stack's next operation"]
    assert stacks.runs("worker-killed") == 2
