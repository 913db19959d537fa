"""The pod executor's upload of a Stack's source to its workspace pod's agent, against the real agent over
TLS: packed into a file and streamed from there (never the whole source in the operator's memory), held
to the operator's source size cap on both sides."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import ssl
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from strata_operator.engine.pod.agent import Agent
from strata_operator.engine.pod.executor import PodEngine, Workspace, WorkspaceError, WorkspaceSettings
from strata_operator.engine.pod.workspace_pod import WorkspaceNames, mint_credentials
from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import EngineSettings
from strata_operator.sources.archive import SOURCE_CAP_HEADER
from strata_operator.sources.work import SourceWork

STACK = "team-a/app"
SOURCE_BYTES = 8 * 1024 * 1024


@contextlib.asynccontextmanager
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Workspace, Path]]:
    """The workspace agent's HTTPS server on a local port, as the operator reaches it, and its sources."""
    names = WorkspaceNames.of(STACK)
    credentials = mint_credentials(names.server_name)
    (tmp_path / "tls.crt").write_text(credentials.certificate)
    (tmp_path / "tls.key").write_text(credentials.private_key)
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    pod = Agent(tmp_path / "workspace", credentials.token, engine=None)  # type: ignore[arg-type]
    runner = web.AppRunner(pod.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=serving)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Workspace(pod=names.pod, uid="uid", address=f"https://127.0.0.1:{port}", server_name=names.server_name,
                        tls=ssl.create_default_context(cadata=credentials.certificate),
                        token=credentials.token), pod.sources
    finally:
        await runner.cleanup()


def engine(tmp_path: Path, max_bytes: int) -> PodEngine:
    return PodEngine(EngineSettings(state_dir=tmp_path / "state", pulumi_command="/bin/true"),
                     WorkspaceSettings(image="strata:1"), None, SourceWork(max_bytes))  # type: ignore[arg-type]


def source(tmp_path: Path) -> tuple[Path, UpdateRequest]:
    """A run's source (a project and 8 MiB that do not compress) and the request that names it."""
    root = tmp_path / "runs" / "app-1" / "src"
    (root / "infra").mkdir(parents=True)
    (root / "infra" / "Pulumi.yaml").write_text("name: p\nruntime: yaml\n")
    (root / "infra" / "data.bin").write_bytes(os.urandom(SOURCE_BYTES))
    return root, UpdateRequest(stack_key=STACK, stack_name="dev", project_dir=str(root / "infra"),
                               source_root=str(root))


def test_a_source_is_streamed_to_the_agent_never_held_whole_in_memory(tmp_path):
    root, request = source(tmp_path)
    pods = engine(tmp_path, max_bytes=64 * 1024 * 1024)

    async def upload() -> tuple[dict[str, str], Path]:
        async with agent(tmp_path) as (workspace, sources):
            try:
                return await pods._upload(workspace, request), sources
            finally:
                await pods._session().close()

    tracemalloc.start()
    try:
        where, sources = asyncio.run(upload())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert where["subdir"] == "infra"
    unpacked = sources / where["source"] / "infra" / "data.bin"
    assert hashlib.sha256(unpacked.read_bytes()).digest() == hashlib.sha256(
        (root / "infra" / "data.bin").read_bytes()).digest()
    assert peak < SOURCE_BYTES / 2, f"{peak} bytes at most in memory for a source of {SOURCE_BYTES}"
    assert sorted(path.name for path in root.parent.iterdir()) == ["src"]  # the packed tarball is gone


def test_a_source_beyond_the_cap_is_refused_before_anything_is_uploaded(tmp_path):
    root, request = source(tmp_path)
    pods = engine(tmp_path, max_bytes=1024 * 1024)

    async def upload() -> Path:
        async with agent(tmp_path) as (workspace, sources):
            try:
                with pytest.raises(WorkspaceError) as refused:
                    await pods._upload(workspace, request)
            finally:
                await pods._session().close()
            assert str(refused.value).startswith(
                f"the upload to the workspace pod: the program's source ({SOURCE_BYTES + 22} bytes of files at least) "
                "exceeds the operator's source size cap of 1 MiB (fix: make the source smaller")
            return sources

    assert list(asyncio.run(upload()).iterdir()) == []
    assert sorted(path.name for path in root.parent.iterdir()) == ["src"]


def test_the_agent_holds_an_upload_to_the_cap_the_operator_sends(tmp_path):
    async def put(cap: int) -> int:
        async with agent(tmp_path) as (workspace, sources), aiohttp.ClientSession() as session:
            options = workspace.options()
            options["headers"] = {**options["headers"], SOURCE_CAP_HEADER: str(cap)}
            async with session.put(f"{workspace.address}/sources/{'0' * 64}", data=b"x" * 5000, **options) as answer:
                assert [path for path in sources.iterdir() if not path.name.startswith(".")] == []
                return answer.status

    assert asyncio.run(put(1000)) == 413
    assert asyncio.run(put(10_000)) == 400  # taken, and refused for what it is: not that digest's tarball
