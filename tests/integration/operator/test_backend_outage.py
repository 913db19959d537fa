"""The object store a running update keeps its state in goes away for a while: the Stack says so while it
lasts (Reconciling, reason BackendUnreachable, and a Warning Event naming where), says when it is back,
and ends Ready with no lock left (issue #27 item 4: before, it only said "stack is being processed").
An update or a destroy that fails at once because its store is away (starting, or ending) is the outage's
too: the Stack says so, counts no failure and runs once the store answers.

The store is the real MinIO; the outage is its TCP path cut (every connection closed, new ones
refused) and mended, so the session's MinIO serves the other tests meanwhile."""

from __future__ import annotations

import socket
import threading
import time
import uuid

from strata_components import s3
from strata_components.local import processes

from .conftest import PASSPHRASE, Stacks, has_condition, stash_program

RESOURCES = 120  # enough checkpoint writes that the update is still running when the path is cut
OUTAGE = 30.0


class CuttableLink:
    """A TCP path from a local port to `target` that can be cut and mended."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.port = target, processes.free_ports(1)[0]
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
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _keys(endpoint: str, bucket: str, root: s3.Credentials, prefix: str) -> list[str]:
    status, body = s3.request(endpoint, "GET", f"/{bucket}", root, query={"list-type": "2", "prefix": prefix})
    assert status == 200, body
    return [part.split("</Key>")[0] for part in body.split("<Key>")[1:]]


def _locks(endpoint: str, bucket: str, root: s3.Credentials) -> list[str]:
    return _keys(endpoint, bucket, root, ".pulumi/locks/")


def stored_behind(stacks: Stacks, object_store, resources: int, mended: bool,
                  **spec: object) -> tuple[CuttableLink, str]:
    """A bucket reached through a link (unless `mended`, its port refuses), and a Stack `stored` of a
    Program of `resources` Stash resources keeping its state there (and `spec`); the link and the bucket."""
    endpoint, root = object_store
    bucket = f"outage-{uuid.uuid4().hex[:8]}"
    s3.ensure_bucket(endpoint, bucket, root)
    host, port = endpoint.removeprefix("http://").split(":")
    link = CuttableLink((host, int(port)))
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
        assert f"127.0.0.1:{link.port} does not answer (Connection refused)" in said, said
        (warning,) = stacks.wait_events("stored", "BackendUnreachable")
        assert warning.type == "Warning" and f"127.0.0.1:{link.port}" in warning.message

        time.sleep(max(0.0, OUTAGE - (time.monotonic() - cut)))
        link.mend()
        ready = stacks.wait_ready("stored", timeout=180)
        assert ready["status"]["lastUpdate"]["state"] == "succeeded"
        assert len(ready["status"]["outputs"]) == RESOURCES
        assert stacks.wait_events("stored", "BackendReachable", timeout=30)
        assert _locks(endpoint, bucket, root) == []
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
        assert f"127.0.0.1:{link.port} does not answer (Connection refused)" in said, said
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
