"""The object store a running update keeps its state in goes away for a while: the Stack says so while it
lasts (Reconciling, reason BackendUnreachable, and a Warning Event naming where), says when it is back,
and ends Ready with no lock left (issue #27 item 4: before, it only said "stack is being processed").
An update or a destroy that fails at once because its store is away (starting, or ending) is the outage's
too: the Stack says so, counts no failure and runs once the store answers. The lock such a run leaves is
cleared before the Stack's next operation, by the operator that lost the run or, restarted meanwhile, the
next (the run stays in status.currentUpdate), as is the lock of an update that finished but whose store was
gone as it deleted that lock.

The store is the real MinIO; the outage is its TCP path cut (every connection closed, new ones
refused) and mended, so the session's MinIO serves the other tests meanwhile; cut by hand, or by the link
itself at a given request of the engine's."""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections.abc import Callable

from strata_components import s3
from strata_components.local import processes
from strata_operator.services.backend_probe import UNSAID

from .conftest import PASSPHRASE, Operator, Stacks, has_condition, stash_program

RESOURCES = 120  # enough checkpoint writes that the update is still running when the path is cut
OUTAGE = 30.0
SNAPSHOT_RETRIES_OUTLASTED = 100.0
REQUEST_LINE = re.compile(r"^[A-Z]+ /\S* HTTP/1\.1$")


class CuttableLink:
    """A TCP path from a local port to `target` that can be cut and mended; with `trip`, it cuts itself
    when a client sends what `trip` is true of (that request never arrives)."""

    def __init__(self, target: tuple[str, int], trip: Callable[[bytes], bool] | None = None):
        self.target, self.port, self.trip = target, processes.free_ports(1)[0], trip
        self.tripped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def mend(self) -> None:
        listening = socket.socket()
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(("127.0.0.1", self.port))
        listening.listen(64)
        self._keep(listening)
        threading.Thread(target=self._accept, args=(listening,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self, listening: socket.socket) -> None:
        while True:
            try:
                client, _ = listening.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._keep(client)
            self._keep(upstream)
            for source, sink, trip in ((client, upstream, self.trip), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(source, sink, trip), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, trip: Callable[[bytes], bool] | None) -> None:
        try:
            while data := source.recv(65536):
                if trip is not None and trip(data):
                    self.cut()
                    self.tripped.set()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Requests:
    """Trips a CuttableLink on the first request for which `after(line)` holds, once `before(line)` held
    for `times` earlier requests (each an HTTP request line: "PUT /bucket/key?query HTTP/1.1")."""

    def __init__(self, before: Callable[[str], bool], after: Callable[[str], bool], times: int = 1):
        self.before, self.after, self.seen, self.times = before, after, 0, times

    def __call__(self, data: bytes) -> bool:
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        if not REQUEST_LINE.match(line):
            return False  # the rest of a request: its body, sent after its headers
        if self.seen >= self.times and self.after(line):
            return True
        self.seen += self.before(line)
        return False


def writes(kind: str) -> Callable[[str], bool]:
    """A request writing one of the backend's `kind` files (locks, history, stacks)."""
    return lambda line: line.startswith("PUT ") and f"/.pulumi/{kind}/" in line


def _keys(endpoint: str, bucket: str, root: s3.Credentials, prefix: str) -> list[str]:
    status, body = s3.request(endpoint, "GET", f"/{bucket}", root, query={"list-type": "2", "prefix": prefix})
    assert status == 200, body
    return [part.split("</Key>")[0] for part in body.split("<Key>")[1:]]


def _locks(endpoint: str, bucket: str, root: s3.Credentials) -> list[str]:
    return _keys(endpoint, bucket, root, ".pulumi/locks/")


def stored_behind(stacks: Stacks, object_store, resources: int, mended: bool,
                  trip: Callable[[bytes], bool] | None = None, **spec: object) -> tuple[CuttableLink, str]:
    """A bucket reached through a link (unless `mended`, its port refuses; with `trip`, it cuts itself),
    and a Stack `stored` of a Program of `resources` Stash resources keeping its state there (and `spec`);
    the link and the bucket."""
    endpoint, root = object_store
    bucket = f"outage-{uuid.uuid4().hex[:8]}"
    s3.ensure_bucket(endpoint, bucket, root)
    host, port = endpoint.removeprefix("http://").split(":")
    link = CuttableLink((host, int(port)), trip)
    if mended:
        link.mend()
    stacks.secret("store", {"AWS_ACCESS_KEY_ID": root.access_key_id, "AWS_SECRET_ACCESS_KEY": root.secret_access_key,
                            "passphrase": PASSPHRASE})
    stacks.program("many", stash_program(**{f"r{i}": f"v{i}" for i in range(resources)}))
    backend = f"s3://{bucket}?endpoint=http://127.0.0.1:{link.port}&use_path_style=true&region={s3.REGION}"
    stacks.create("stored", stacks.spec(programRef={"name": "many"}, backend=backend, envRefs={
        name: {"type": "Secret", "secret": {"name": "store", "key": key}}
        for name, key in (("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
                          ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
                          ("PULUMI_CONFIG_PASSPHRASE", "passphrase"))}, **spec))
    return link, bucket


def test_a_running_updates_object_store_gone_for_a_while_is_said_while_it_lasts_and_the_update_ends_ready(
        stacks: Stacks, object_store):
    endpoint, root = object_store
    link, bucket = stored_behind(stacks, object_store, RESOURCES, mended=True)
    try:
        # Mid-update: the engine holds the stack's lock in the bucket.
        processes.wait_until(lambda: _locks(endpoint, bucket, root), 120, "the update holding its lock", interval=0.2)
        link.cut()
        cut = time.monotonic()

        stalled = stacks.wait(
            "stored", lambda o: has_condition(o, "Reconciling", "BackendUnreachable"), 30,
            "Reconciling/BackendUnreachable while the store is away")
        said = {c["type"]: c for c in stalled["status"]["conditions"]}["Reconciling"]["message"]
        # A team's Stack (the test's namespace) is told no cause: services/backend_probe.py.
        assert f"127.0.0.1:{link.port} does not answer ({UNSAID})" in said, said
        (warning,) = stacks.wait_events("stored", "BackendUnreachable")
        assert warning.type == "Warning" and f"127.0.0.1:{link.port}" in warning.message

        time.sleep(max(0.0, OUTAGE - (time.monotonic() - cut)))
        link.mend()
        ready = stacks.wait_ready("stored", timeout=180)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded"
        assert len(ready["status"]["outputs"]) == RESOURCES
        assert stacks.wait_events("stored", "BackendReachable", timeout=30)
        assert _locks(endpoint, bucket, root) == []
        # The CLI may have failed to save a snapshot meanwhile, and then fails once the store is back: that
        # failure is the outage's too, so none is counted and the Stack runs again at once.
        assert not stacks.events("stored", "StackUpdateFailure")
    finally:
        link.cut()


def test_an_update_or_destroy_whose_object_store_is_away_as_it_starts_waits_for_it_counting_no_failure(
        stacks: Stacks, object_store):
    endpoint, root = object_store
    # The link not mended: every connection refused.
    link, bucket = stored_behind(stacks, object_store, 3, mended=False, destroyOnFinalize=True)
    try:
        waiting = stacks.wait("stored", lambda o: has_condition(o, "Reconciling", "BackendUnreachable"), 60,
                              "Reconciling/BackendUnreachable while the store is away")
        said = {c["type"]: c for c in waiting["status"]["conditions"]}["Reconciling"]["message"]
        # A team's Stack (the test's namespace) is told no cause: services/backend_probe.py.
        assert f"127.0.0.1:{link.port} does not answer ({UNSAID})" in said, said
        assert said.endswith("the Stack runs again once it answers"), said
        (warning,) = stacks.wait_events("stored", "BackendUnreachable")
        assert warning.type == "Warning" and f"127.0.0.1:{link.port}" in warning.message
        time.sleep(12)  # past a probe's interval: it goes on waiting, saying the same and counting nothing
        waited = stacks.get("stored")
        assert has_condition(waited, "Reconciling", "BackendUnreachable"), waited["status"]
        assert "lastUpdate" not in waited["status"] and not stacks.events("stored", "StackUpdateFailure")
        assert len(stacks.events("stored", "BackendUnreachable")) == 1

        link.mend()
        ready = stacks.wait_ready("stored", timeout=120)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded"
        assert stacks.wait_events("stored", "BackendReachable", timeout=30)

        # Deleted while the store is away again: the destroy waits for it the same way, then runs.
        link.cut()
        stacks.delete("stored")
        stacks.wait("stored", lambda o: any(
            c["type"] == "Reconciling" and c.get("reason") == "BackendUnreachable" and "the destroy" in c["message"]
            for c in o["status"]["conditions"]), 60, "the destroy saying the store is away")
        link.mend()
        processes.wait_until(lambda: stacks.get("stored") is None, 120, "the Stack destroyed and gone")
        assert not stacks.events("stored", "StackUpdateFailure")
        keys = _keys(endpoint, bucket, root, ".pulumi/")
        assert not [k for k in keys if k.endswith("/dev.json") or "/locks/" in k], keys
    finally:
        link.cut()


def test_an_update_whose_store_went_away_as_it_deleted_its_lock_is_ready_and_the_lock_goes_before_the_next(
        stacks: Stacks, object_store):
    endpoint, root = object_store
    # The update finished in the bucket (its history written); deleting its lock finds the store gone. The
    # CLI says so and exits 0: before, the next update found that lock and stalled as a conflict.
    link, bucket = stored_behind(stacks, object_store, 3, mended=True, trip=Requests(
        writes("history"), lambda line: line.startswith("DELETE ") and "/.pulumi/locks/" in line))
    try:
        ready = stacks.wait_ready("stored", timeout=120)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded"
        (left,) = stacks.wait_events("stored", "BackendLockLeft")
        assert left.type == "Warning" and left.message.endswith(
            "the state backend did not answer as it deleted the stack's lock: the operator deletes it before the "
            "Stack's next operation"), left.message
        assert len(_locks(endpoint, bucket, root)) == 1

        link.trip = None
        link.mend()
        stacks.replace_program("many", stash_program(r0="changed", r1="v1", r2="v2"))
        changed = stacks.wait("stored", lambda o: has_condition(o, "Ready") and (o["status"].get("outputs") or {})
                              .get("r0") == "changed", 120, "Ready with the changed Program")
        assert changed["status"]["lastUpdate"]["state"] == "succeeded"
        assert not stacks.events("stored", "StackUpdateConflictDetected")
        assert _locks(endpoint, bucket, root) == []
    finally:
        link.cut()


def test_a_run_lost_with_its_store_is_settled_by_the_next_operator_once_the_store_answers(
        stacks: Stacks, object_store, operator: Operator):
    endpoint, root = object_store
    # The update takes its lock (the stack's second, after `stack init`'s) and the store is gone at once:
    # the run fails, its lock left behind, while the Stack waits for the store.
    link, bucket = stored_behind(stacks, object_store, 3, mended=True,
                                 trip=Requests(writes("locks"), lambda line: True, times=2))
    try:
        waiting = stacks.wait("stored", lambda o: any(
            c["type"] == "Reconciling" and c.get("reason") == "BackendUnreachable"
            and c["message"].endswith("the Stack runs again once it answers")
            for c in (o.get("status") or {}).get("conditions") or []), 120,
            "the run stopped, and the Stack waiting for the store")
        assert waiting["status"].get("currentUpdate"), waiting["status"]  # the run ended, but is not settled
        assert len(_locks(endpoint, bucket, root)) == 1
        # The operator restarts, and finds the store back: the run it lost is in the status, not in its memory.
        operator.stop()
        link.trip = None
        link.mend()
        operator.start()
        ready = stacks.wait_ready("stored", timeout=120)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded" and not ready["status"].get("currentUpdate")
        assert not stacks.events("stored", "StackUpdateConflictDetected")
        assert not stacks.events("stored", "StackUpdateFailure")
        assert _locks(endpoint, bucket, root) == []
    finally:
        link.cut()


def test_an_update_whose_store_is_gone_longer_than_the_engine_retries_fails_with_the_outage_and_runs_again(
        stacks: Stacks, object_store):
    endpoint, root = object_store
    # The store is gone as the update saves its first snapshot, for longer than the engine retries that write
    # (11 tries over 30-70 s, backend/diy/state.go): the CLI fails with "failed to save snapshot", its lock
    # left behind. Whether it fails before the store is back (here, mostly) or just after (in workspace
    # pods, benchmarks/cluster_faults.py --hold 120), that failure is the outage's.
    link, bucket = stored_behind(stacks, object_store, 30, mended=True,
                                 trip=Requests(writes("locks"), writes("stacks"), times=2))
    try:
        assert link.tripped.wait(120), "the update never saved a snapshot"
        time.sleep(SNAPSHOT_RETRIES_OUTLASTED)
        link.trip = None
        link.mend()
        ready = stacks.wait_ready("stored", timeout=180)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded"
        assert not stacks.events("stored", "StackUpdateFailure")
        assert stacks.runs("stored") == 2
        assert _locks(endpoint, bucket, root) == []
    finally:
        link.cut()
