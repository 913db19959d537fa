"""Leader election between two real operator processes on one cluster, under the operator's own
ServiceAccount token: one holds the Lease and handles Stacks, the other stands by; a clean stop hands
the Lease over at once, a kill -9 once it lapses. And self-fencing on the real apiserver: a leader
whose Lease is taken over by force mid-update kills that update within the README's 10 s, starts afresh
in the same process as a standby, and runs nothing until the Lease is free again."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import OPERATOR_NAMESPACE, operator_host
from strata_operator.decisions.lease import LEASE_DURATION_SECONDS, RENEW_DEADLINE_SECONDS, micro_time

from .conftest import MIN_RESYNC_SECONDS, STALL_AFTER_FAILURES, Operator, eventually_constant, stash_program

LEASE = "strata-operator-leader"


def _holder(kube_client) -> str:
    try:
        lease = client.CoordinationV1Api(kube_client).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    except client.ApiException as error:
        if error.status == 404:
            return ""
        raise
    return lease.spec.holder_identity or ""


def _identity(operator: Operator) -> str:
    pid = operator.pid()
    assert pid is not None, f"{operator.process.name} is not running"
    return f"{socket.gethostname()}_{pid}"


def _wait_holder(kube_client, operator: Operator, timeout: float, what: str) -> str:
    identity = _identity(operator)
    processes.wait_until(lambda: _holder(kube_client) == identity, timeout, what, log=operator.log)
    return identity


def _session_operator_leads_again(operator: Operator, kube_client) -> None:
    """The tests after these need the session's operator running and leading (a fenced one exited)."""
    if operator.pid() is None:
        operator.start()
    _wait_holder(kube_client, operator, 60, "the session's operator leads again")


def _wait_log(operator: Operator, since: int, text: str, timeout: float = 30) -> str:
    def found() -> str | None:
        tail = operator.log_text()[since:]
        return next((line for line in tail.splitlines() if text in line), None)

    return processes.wait_until(found, timeout, f"{operator.process.name} logs {text!r}", log=operator.log)


def _health(operator: Operator) -> dict:
    with urllib.request.urlopen(operator.health_url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def second(operator: Operator, platform, toolchain, kube_client, plugin_cache, tmp_path) -> Iterator[Operator]:
    """Another operator process like the session's (same flags and ServiceAccount), with its own state."""
    host = operator_host(platform, toolchain, tmp_path / "second", extra_args=(
        "--stall-after-failures", str(STALL_AFTER_FAILURES), "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
        "--plugin-cache", str(plugin_cache), "--verbose"))
    fields = {field.name: getattr(host, field.name) for field in dataclasses.fields(host)}
    fields["process"] = dataclasses.replace(host.process, name="strata-operator-second")
    other = Operator(**fields)
    yield other
    other.stop()
    _session_operator_leads_again(operator, kube_client)


def test_one_leader_runs_stacks_the_standby_takes_over_on_stop_and_on_kill_9(stacks, operator, second,
                                                                             kube_client):
    first_id = _wait_holder(kube_client, operator, 30, "the session's operator holds the Lease")

    # A second operator starts (its health endpoint answers) but stands by, naming the holder.
    second.start()
    standing = _wait_log(second, 0, "standing by")
    assert first_id in standing
    assert _health(second)["leader"] == {"leading": False, "identity": _identity(second),
                                         "lease": f"{OPERATOR_NAMESPACE}/{LEASE}", "holder": first_id}
    assert _holder(kube_client) == first_id

    # A Stack applied now is reconciled by the leader only.
    first_log = len(operator.log_text())
    stacks.program("greeting", stash_program(greeting="hi"))
    stacks.create("one", stacks.spec(programRef={"name": "greeting"}))
    assert stacks.wait_ready("one", 120)["status"]["outputs"] == {"greeting": "hi"}
    assert f"[{stacks.namespace}/one]" in operator.log_text()[first_log:]
    assert stacks.namespace not in second.log_text()
    assert (operator.state_dir / "stacks" / stacks.namespace / "one").is_dir()
    assert not (second.state_dir / "stacks").exists()
    assert _holder(kube_client) == first_id

    # Clean stop: the leader hands the Lease back and the standby takes over without waiting it out.
    first_log = len(operator.log_text())
    second_log = len(second.log_text())
    operator.stop()
    assert "released the Lease" in operator.log_text()[first_log:]
    second_id = _wait_holder(kube_client, second, 30, "the standby took over after a clean stop")
    _wait_log(second, second_log, "leading: took the Lease")

    # The first comes back as a standby; kill -9 of the leader: it takes over once the Lease lapses.
    first_log = len(operator.log_text())
    operator.start()
    assert second_id in _wait_log(operator, first_log, "standing by")
    assert _holder(kube_client) == second_id
    second.kill()
    _wait_holder(kube_client, operator, 60, "the standby took over after the leader's kill -9")
    _wait_log(operator, first_log, "leading: took the Lease")

    # A Stack created afterwards is handled by the new leader.
    stacks.create("two", stacks.spec(programRef={"name": "greeting"}))
    stacks.wait_ready("two", 120)
    assert f"[{stacks.namespace}/two]" in operator.log_text()[first_log:]


# --- Self-fencing: the Lease taken over by force while the leader runs an update ------------------

USURPER = "usurper-from-the-test"


class Usurper:
    """Another holder of the leader Lease, played by the test: takes it by force (no precondition, as a
    buggy or partitioned peer would) and renews it every 2 s, so the leader's renewals find it held."""

    def __init__(self, kube_client):
        self.leases = client.CoordinationV1Api(kube_client)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._renew, daemon=True, name="usurper")

    def _write(self, spec: dict) -> None:
        self.leases.patch_namespaced_lease(LEASE, OPERATOR_NAMESPACE, {"spec": spec},
                                           _content_type="application/merge-patch+json")

    def take(self) -> float:
        """Hold the Lease from now on; the monotonic time the takeover was written."""
        transitions = self.leases.read_namespaced_lease(LEASE, OPERATOR_NAMESPACE).spec.lease_transitions or 0
        now = micro_time(datetime.now(timezone.utc))
        self._write({"holderIdentity": USURPER, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                     "acquireTime": now, "renewTime": now, "leaseTransitions": transitions + 1})
        taken = time.monotonic()
        self.thread.start()
        return taken

    def _renew(self) -> None:
        while not self.stop.wait(2):
            self._write({"holderIdentity": USURPER, "renewTime": micro_time(datetime.now(timezone.utc))})

    def release(self) -> None:
        """Hand the Lease back as a clean stop does (no holder), so a standby takes it at once."""
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join()
            self._write({"holderIdentity": None, "leaseDurationSeconds": 1,
                         "renewTime": micro_time(datetime.now(timezone.utc))})


def _started(pid: int) -> str | None:
    """The process's start time (pids get reused): None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _alive(processes_then: dict[int, str]) -> list[int]:
    return [pid for pid, started in processes_then.items() if _started(pid) == started]


OPENAT = "257"  # x86_64


def _opening(process: Path, fifo: str) -> bool:
    """Whether a thread of `process` is blocked opening `fifo`: a FIFO's reader waits in open() until a
    writer comes, holding no descriptor yet; the path is read from its memory at the syscall's argument."""
    for task in (process / "task").iterdir():
        try:
            if (task / "wchan").read_text() != "wait_for_partner":
                continue
            number, _dirfd, path_at, *_ = (task / "syscall").read_text().split()
            if number != OPENAT:
                continue
            with open(process / "mem", "rb") as memory:
                memory.seek(int(path_at, 16))
                if memory.read(len(fifo) + 1) == fifo.encode() + b"\0":
                    return True
        except (OSError, ValueError):
            continue
    return False


def _holders(fifo: Path) -> list[int]:
    """Processes opening or holding `fifo`: the update's program blocked in fn::readFile on it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if _opening(entry, str(fifo)) or any(os.readlink(fd) == str(fifo) for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _feed(fifo: Path, stop: threading.Event) -> None:
    """Answer every reader of `fifo` with "open" (and EOF) until stopped, without ever blocking."""
    while not stop.is_set():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
            time.sleep(0.1)
            continue
        try:
            os.write(fd, b"open")
        finally:
            os.close(fd)
        time.sleep(0.2)


@pytest.fixture
def usurper(operator: Operator, kube_client) -> Iterator[Usurper]:
    taker = Usurper(kube_client)
    yield taker
    taker.release()
    _session_operator_leads_again(operator, kube_client)



def test_a_leader_whose_lease_is_taken_mid_update_kills_the_update_in_time_and_stands_by(stacks, operator, usurper,
                                                                                      kube_client, tmp_path):
    _wait_holder(kube_client, operator, 30, "the session's operator holds the Lease")
    # The program blocks in fn::readFile on a FIFO nobody writes to: an update that runs until told.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    stacks.program("gated", {"outputs": {"gate": {"fn::readFile": str(gate)}}})
    stacks.create("gated", stacks.spec(programRef={"name": "gated"}))
    readers = processes.wait_until(lambda: _holders(gate), 90, "the leader's update blocked on the gate",
                                   log=operator.log)
    pid = operator.pid()
    below = {p: _started(p) for p in processes.descendants(pid)}
    assert set(readers) <= set(below), "the blocked update is not the leader's"
    assert stacks.get("gated")["status"]["currentUpdate"]
    runs = stacks.runs("gated")
    log_start = len(operator.log_text())

    taken = usurper.take()

    def fenced() -> bool:
        return not _alive(below) and not _holders(gate)

    processes.wait_until(fenced, LEASE_DURATION_SECONDS + 10, "the leader fenced itself", log=operator.log,
                         interval=0.1)
    elapsed = time.monotonic() - taken
    # The README: a leader that cannot renew for 10 s kills its update workers. Its last renewal came
    # before the takeover, so they must be gone within that much of it (and long before a standby could
    # take a Lease that lapsed: 15 s).
    assert elapsed <= RENEW_DEADLINE_SECONDS, f"the leader ran on for {elapsed:.1f} s after losing its Lease"
    said = _wait_log(operator, log_start, "lost leadership")
    assert f"lost leadership: the Lease {OPERATOR_NAMESPACE}/{LEASE} is now held by {USURPER}" in said, said
    assert "worker process(es) killed" in said and "restarting in place as a standby" in said
    assert _holder(kube_client) == USURPER

    # The same process starts afresh (no crash, nothing for a supervisor to restart) and stands by while
    # the Lease is held; nothing runs from it: no process of its old tree, nobody on the gate, no new run.
    assert USURPER in _wait_log(operator, log_start, "standing by")
    assert operator.pid() == pid
    assert eventually_constant(lambda: (_alive(below), _holders(gate), stacks.runs("gated")), 6) == ([], [], runs)

    # Once the Lease is free it leads again and the interrupted Stack converges.
    usurper.release()
    _wait_holder(kube_client, operator, 30, "the restarted operator took the free Lease")
    opened = threading.Event()
    feeder = threading.Thread(target=_feed, args=(gate, opened), daemon=True)
    feeder.start()
    try:
        ready = stacks.wait("gated", lambda o: o["status"].get("outputs") == {"gate": "open"}, 180,
                            "the interrupted update re-run to success")
    finally:
        opened.set()
        feeder.join()
    assert not ready["status"].get("currentUpdate")
