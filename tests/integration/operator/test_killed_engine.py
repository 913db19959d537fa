"""An update whose `pulumi` CLI, or the worker process driving it, is killed mid-run (the kernel's OOM killer,
an admin's kill -9), on the real operator and engine: the CLI cannot release its lock, which the Stack's next
update must not take for another update's."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from strata_components.local import processes

from .conftest import has_condition, stash_program

COUNT = 300  # resources enough that the update lasts long enough to kill it
CLEARED = "the lock it left in the backend is cleared before the stack's next operation"


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


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("victim, said", [
    ("cli", "the pulumi CLI was killed by SIGKILL during the up (out of memory, or killed by hand); " + CLEARED),
    ("worker", "the up's worker process ended without a result (killed: out of memory, or by hand); the CLI it ran "
               "was stopped, and the lock it may have left in the backend is cleared before the stack's next "
               "operation"),
])
def test_an_update_whose_engine_was_killed_clears_the_lock_it_left_and_runs_again(stacks, operator, victim, said):
    stacks.program("big", stash_program(**{f"r{i}": f"v{i}" for i in range(COUNT)}))
    stacks.create("killed", stacks.spec(programRef={"name": "big"}))
    processes.wait_until(stacks.locks, 120, "the first update holding its lock", interval=0.1)
    cli = processes.wait_until(lambda: _update_cli(operator.pid()), 10, "the update's pulumi CLI", interval=0.1)
    os.kill(cli if victim == "cli" else _parent(cli), signal.SIGKILL)
    stack = stacks.wait("killed", lambda o: has_condition(o, "Ready") or has_condition(o, "Stalled"), 240,
                        f"Ready or Stalled after its {victim} was killed")
    failures = [e.message for e in stacks.events("killed", "StackUpdateFailure")]
    # Before, the run said only the CLI's cut-off output, and the next stalled on the lock it left, as a
    # conflict. Now: said as what happened, counted as one failure, and run again.
    assert has_condition(stack, "Ready"), (stack["status"], failures)
    assert failures == [f"Failed to update stack: {said}"]
    assert not stacks.events("killed", "StackUpdateConflictDetected")
    assert not stacks.locks()
    assert stacks.runs("killed") == 2
