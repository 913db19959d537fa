"""Crafted Flux artifacts served over HTTP to the real operator: each defence refuses its artifact with a
Stalled status naming the problem, runs nothing, and writes nothing outside the Stack's workdir.

The GitRepository is suspended, so source-controller leaves it alone and its status says exactly what
this test publishes (as a compromised or buggy source would)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from strata_operator.sources.archive import DEFAULT_MAX_SOURCE_BYTES

from .conftest import stash_project

FLUX = ("source.toolkit.fluxcd.io", "v1")
OVERSIZE = "/oversize.tar.gz"


def _tarball(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=1) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _bomb() -> bytes:
    """One file of zeros just over the unpacked limit: about a megabyte compressed."""
    buffer = io.BytesIO()
    size = DEFAULT_MAX_SOURCE_BYTES + 1
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=1) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = size

        class Zeros(io.RawIOBase):
            left = size

            def readable(self) -> bool:
                return True

            def readinto(self, target) -> int:
                count = min(len(target), self.left)
                target[:count] = bytes(count)
                self.left -= count
                return count

        tar.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return buffer.getvalue()


class Artifacts(ThreadingHTTPServer):
    """Serves `files` by path, and OVERSIZE as an endless stream of zeros (no Content-Length)."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                if self.path == OVERSIZE:
                    self.send_response(200)
                    self.end_headers()
                    with contextlib.suppress(OSError):
                        for _ in range(DEFAULT_MAX_SOURCE_BYTES // (1 << 20) + 2):
                            self.wfile.write(bytes(1 << 20))
                    return
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        super().__init__(("127.0.0.1", 0), Handler)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Artifacts, Path]]:
    outside = tmp_path_factory.mktemp("outside")
    project = stash_project("crafted", note="crafted").encode()
    files = {
        "/good.tar.gz": _tarball([_file("Pulumi.yaml", project)]),
        "/bomb.tar.gz": _bomb(),
    }
    link = tarfile.TarInfo("escape")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside)
    files["/symlink.tar.gz"] = _tarball([_file("Pulumi.yaml", project), (link, None),
                                        _file("escape/planted", b"written through a link")])
    # A link alone, nothing written through it: a program could still read the operator's files through it.
    files["/link-out.tar.gz"] = _tarball([_file("Pulumi.yaml", project), (link, None)])
    server = Artifacts(files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, outside
    server.shutdown()


def _publish(stacks, name: str, url: str, digest: str) -> None:
    """A suspended GitRepository whose status carries the crafted artifact, and a Stack using it."""
    stacks.custom.create_namespaced_custom_object(*FLUX, stacks.namespace, "gitrepositories", {
        "apiVersion": "/".join(FLUX), "kind": "GitRepository", "metadata": {"name": name},
        "spec": {"url": "http://127.0.0.1:9/none.git", "interval": "1h", "suspend": True}})
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stacks.custom.patch_namespaced_custom_object_status(*FLUX, stacks.namespace, "gitrepositories", name, {
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "crafted",
                                   "lastTransitionTime": now, "observedGeneration": 1}],
                   "artifact": {"url": url, "digest": digest, "revision": "main@sha1:" + "c" * 40,
                                "path": f"gitrepository/{stacks.namespace}/{name}/crafted.tar.gz",
                                "lastUpdateTime": now}}})
    # A backend stack of its own: a refused artifact that ran anyway shows as its own case failing, not
    # as the control Stack meeting its lock.
    stacks.create(name, stacks.spec(stack=name, fluxSource={"sourceRef": {"apiVersion": "/".join(FLUX),
                                                                          "kind": "GitRepository", "name": name}}))


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CASES = {
    # name: (artifact path, digest published for it (None: its real digest), what the Stalled message says)
    "digest-mismatch": ("/good.tar.gz", _sha256(b"something else"), "artifact digest mismatch"),
    "tar-bomb": ("/bomb.tar.gz", None, "spec.fluxSource.sourceRef: the archive, unpacked (at entry 'zeros'), exceeds "
                                       "the operator's source size cap of 512 MiB (fix: "),
    "symlink-escape": ("/symlink.tar.gz", None, "points outside"),
    "link-out": ("/link-out.tar.gz", None, "points outside"),
    "oversize": (OVERSIZE, _sha256(b"never checked"), f"{OVERSIZE} exceeds the operator's source size cap of 512 MiB "
                                                      "(fix: "),
}


def test_each_crafted_artifact_is_refused_with_a_stalled_status_and_nothing_written_outside(stacks, artifacts):
    server, outside = artifacts
    for name, (path, digest, _) in CASES.items():
        _publish(stacks, name, server.url(path), digest or _sha256(server.files[path]))
    _publish(stacks, "control", server.url("/good.tar.gz"), _sha256(server.files["/good.tar.gz"]))

    assert stacks.wait_ready("control", 90)["status"]["outputs"] == {"note": "crafted"}
    for name, (_, _, says) in CASES.items():
        obj = stacks.wait_stalled(name, "SourceUnavailable", 90)
        stalled = next(c for c in obj["status"]["conditions"] if c["type"] == "Stalled")
        assert says in stalled["message"], (name, stalled["message"])
        assert stacks.runs(name) == 0, name
    assert list(outside.iterdir()) == []
    # The operator keeps nothing of a refused artifact but its own scratch files: no planted file anywhere.
    assert not [p for p in stacks.operator.state_dir.rglob("planted")]
