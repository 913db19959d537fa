"""The process executor: `Engine` on the Pulumi Automation API, one worker process per operation.

`AutomationEngine` runs every operation in a worker process forked for it by a fork server (`python -m
strata_operator.engine.process.worker`, which drives `pulumi.automation` against the `pulumi` CLI) so
that no update ever runs inside the Kopf process: each worker gets its own workdir and PULUMI_HOME and
an environment holding only that Stack's variables, under a global concurrency limit, with at most one
operation per Stack at a time. Requests (which carry secrets) travel over the worker's socket, never
argv or files; results come back as one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ...services.redaction import redact
from ..port import EngineUnavailable, Operation, SerializedEngine, UpdateRequest, UpdateResult
from .bytecode import bytecode_cache_beside
from .memory_limit import ContainerMemory
from .plugins import ambient_plugin_dirs, ambient_plugins, cached_plugins, default_plugin_cache
from .virtualenvs import default_python_cache

RESULT_PREFIX = "STRATA-RESULT "
# The operator image's record of the version of the pulumi CLI it carries (components/local/images.py).
IMAGE_PULUMI_VERSION = "STRATA_PULUMI_VERSION"


# Updates are CPU-bound: beyond about two per core they only add memory (measured with
# benchmarks/fleet.py on 2 cores: 10 at once took 70 s and 1.7 GB for 50 Stacks, 4 took 66 s and 0.67 GB).
DEFAULT_CONCURRENCY = min(10, 2 * (os.cpu_count() or 1))


DEFAULT_TIMEOUT_SECONDS = 3600.0


CANCEL_GRACE_SECONDS = 30.0


# Passed through to updates from the operator's environment: how this host reaches the network.
NETWORK_SETTINGS = frozenset({
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "PIP_FIND_LINKS"})


SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclasses.dataclass
class EngineSettings:
    pulumi_command: str = ""  # path to the `pulumi` binary; empty: found on `host_path`
    state_dir: Path = Path(os.environ.get("STRATA_OPERATOR_STATE", Path.home() / ".cache/strata/operator"))
    concurrency: int = DEFAULT_CONCURRENCY
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # Directories with language hosts and plugins (e.g. the toolchain's pulumi-language-yaml), or plugin
    # install directories (resource-flux-v1.0.1), which are linked like the cache's.
    plugin_dirs: tuple[str, ...] = ()
    # Provider plugins shared by every Stack, laid out like PULUMI_HOME/plugins (plugins.link_plugins).
    plugin_cache: Path = dataclasses.field(default_factory=default_plugin_cache)
    # uv's cache, for every Stack's Python environment (virtualenvs.py); programs are never given its path.
    python_cache: Path = dataclasses.field(default_factory=default_python_cache)
    # The bytecode of each requirements key's environment, shared (bytecode.py); None: each compiles its own.
    bytecode_cache: Path | None = dataclasses.field(default_factory=lambda: bytecode_cache_beside(default_python_cache()))
    # The operator's own PATH: the CLI is found on it, and its directories holding language hosts or
    # plugins are passed on to updates (their environment is otherwise clean).
    host_path: str = dataclasses.field(default_factory=lambda: os.environ.get("PATH", ""))
    # A workspace pod's agent: updates start from the pod's own environment, as PKO's agent runs them
    # (the image's ENV and PATH, workspaceTemplate's env and envFrom); None: only NETWORK_SETTINGS.
    inherited_env: Mapping[str, str] | None = None
    # How to start this Python (the fork server): empty is sys.executable. A workspace pod whose image
    # is not the operator's runs the operator's Python through its own dynamic loader (engine/pod/bundle.py).
    python_command: tuple[str, ...] = ()
    # The CLI's version when known beforehand (the operator image records its own, IMAGE_PULUMI_VERSION):
    # the fork server then skips the Automation API's `pulumi version` run, 0.4 s of CPU per workspace pod.
    pulumi_version: str = ""
    # The container this engine runs in when it has a memory limit of its own (in-cluster operator, workspace
    # pod): an operation that fails as the kernel kills in it for that limit says so. None: on a host.
    container_memory: ContainerMemory | None = None

    def pulumi_cli(self) -> Path:
        found = self.pulumi_command or shutil.which("pulumi", path=self.host_path) or ""
        if not found:
            raise EngineUnavailable("no `pulumi` CLI on PATH; install it or pass --pulumi /path/to/pulumi")
        return Path(found).absolute()

    def search_path(self) -> str:
        """The workers' PATH: the CLI's directory, the plugin directories, the operator's PATH directories
        that hold language hosts or plugins, then the system's."""
        own = [str(self.pulumi_cli().parent), *self.plugin_dirs]
        if self.inherited_env is not None:  # the image's PATH is the program's (its language runtimes, tools)
            return os.pathsep.join(dict.fromkeys([*own, *filter(None, self.host_path.split(os.pathsep)), *SYSTEM_PATH]))
        return os.pathsep.join(dict.fromkeys([*own, *ambient_plugin_dirs(self.host_path), *SYSTEM_PATH]))

    def summary(self) -> str:
        """One line: the CLI, language hosts and plugins updates will use, and where each comes from."""
        found = ambient_plugins(self.search_path().split(os.pathsep))
        hosts = [f"{name.removeprefix('pulumi-language-')} ({path.parent})" for name, path in found.items()
                 if name.startswith("pulumi-language-")]
        ambient = [f"{name} ({path.parent})" for name, path in found.items()
                   if not name.startswith("pulumi-language-")]
        shared = cached_plugins(self.plugin_cache, self.plugin_dirs)
        cached = [f"{name} ({path.parent})" for name, path in shared.items()]
        return (f"updates use the pulumi CLI {self.pulumi_cli()}; language hosts: {', '.join(hosts) or 'none'}; "
                f"plugins linked into every Stack's PULUMI_HOME from the cache {self.plugin_cache} and --plugin-dir: "
                f"{', '.join(cached) or 'none'}; plugins on PATH: {', '.join(ambient) or 'none'}")


def _package_root() -> str:
    """The directory holding the strata_operator package (installed or a checkout), for the fork server."""
    return str(Path(__file__).resolve().parents[3])


class AutomationEngine(SerializedEngine):
    """`Engine` on the Pulumi Automation API, one forked worker process per operation."""

    in_workspace_pods = False

    def __init__(self, settings: EngineSettings):
        super().__init__(settings.concurrency)
        self.settings = settings
        self._running: dict[str, Worker] = {}
        self._path = settings.search_path()
        # Tuples with their event loop: pipes and locks belong to one (only tests run several loops).
        self._forkserver: tuple[asyncio.AbstractEventLoop, asyncio.subprocess.Process, Path] | None = None
        self._starting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    async def cancel(self, stack_key: str) -> bool:
        worker = self._running.get(stack_key)
        if worker is None or worker.exited:
            return False
        await worker.interrupt()
        return True

    def pulumi_home(self, stack_key: str) -> Path:
        return self.settings.state_dir / "stacks" / stack_key / "pulumi-home"

    def worker_env(self, request: UpdateRequest) -> dict[str, str]:
        """Only the Stack's own variables, what the CLI needs to start and how this host reaches the
        network (proxies, CA bundles, package indexes): no credential of the operator's."""
        home = self.settings.state_dir / "stacks" / request.stack_key / "home"
        home.mkdir(parents=True, exist_ok=True)
        if self.settings.inherited_env is not None:
            env = dict(self.settings.inherited_env)
        else:
            env = {name: value for name, value in os.environ.items() if name.upper() in NETWORK_SETTINGS}
        env.update({
            "PATH": self._path,
            "HOME": str(home),
            "PULUMI_HOME": str(self.pulumi_home(request.stack_key)),
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(request.env)
        backend = env.get("PULUMI_BACKEND_URL", "")
        if backend.startswith("file://~"):
            # `~` is the operator's home, as it is for PKO; HOME above is the Stack's own directory.
            env["PULUMI_BACKEND_URL"] = "file://" + os.path.expanduser(backend[len("file://"):])
        return env

    async def _start_forkserver(self) -> None:
        """The fork server, with a neutral environment: a Stack's own arrives with its request."""
        neutral = self.settings.state_dir / "worker"
        neutral.mkdir(parents=True, exist_ok=True)
        env = {"PATH": self._path, "HOME": str(neutral), "LANG": "C.UTF-8", "PYTHONPATH": _package_root(),
               "PYTHONUNBUFFERED": "1", "PULUMI_SKIP_UPDATE_CHECK": "true"}
        if self.settings.pulumi_version:
            env[IMAGE_PULUMI_VERSION] = self.settings.pulumi_version
        # A short private directory: socket paths are limited to 107 bytes.
        socket_path = Path(tempfile.mkdtemp(prefix="strata-worker-")) / "socket"
        process = await asyncio.create_subprocess_exec(
            *(self.settings.python_command or (sys.executable,)), "-m", "strata_operator.engine.process.worker",
            str(socket_path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=neutral, env=env, start_new_session=True)
        assert process.stdout is not None
        said = await process.stdout.readline()
        if said.strip() != b"ready":
            rest = await process.stdout.read()
            raise EngineUnavailable(redact(f"the worker fork server did not start: {(said + rest).decode()[-800:]}"))
        self._forkserver = (asyncio.get_running_loop(), process, socket_path)

    async def start(self) -> Path:
        """Start the fork server unless it runs (for this event loop); returns its socket."""
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting[0] is not loop:
            self._starting = (loop, asyncio.Lock())
        async with self._starting[1]:
            if self._forkserver is None or self._forkserver[0] is not loop or self._forkserver[1].returncode is not None:
                await self._start_forkserver()
            assert self._forkserver is not None
            return self._forkserver[2]

    async def _connect(self) -> Worker:
        """A fresh worker process, forked for this one operation; a fork server found dead is replaced."""
        for _ in range(2):
            try:
                reader, writer = await asyncio.open_unix_connection(str(await self.start()), limit=2**24)
                said = await reader.readline()
            except OSError:
                said = b""
            if said.strip().isdigit():
                return Worker(int(said), reader, writer)
            self._discard_forkserver()
        raise EngineUnavailable("the worker fork server does not answer, even after a restart")

    def _discard_forkserver(self) -> None:
        if self._forkserver is not None and self._forkserver[1].returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._forkserver[1].kill()
        self._forkserver = None

    async def _run_locked(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        started = time.monotonic()
        memory = self.settings.container_memory
        oom_kills_before = memory.oom_kills() if memory else 0
        try:
            worker = await self._connect()
        except EngineUnavailable as err:
            return UpdateResult("failed", str(err), duration=time.monotonic() - started)
        self._running[request.stack_key] = worker
        payload = json.loads(request.to_json(operation))
        payload["worker_env"] = self.worker_env(request)
        payload["plugin_cache"] = str(self.settings.plugin_cache)
        payload["plugin_dirs"] = list(self.settings.plugin_dirs)
        payload["python_cache"] = str(self.settings.python_cache)
        payload["bytecode_cache"] = str(self.settings.bytecode_cache) if self.settings.bytecode_cache else None
        try:
            stdout = await asyncio.wait_for(worker.communicate(json.dumps(payload)),
                                            timeout=self.settings.timeout_seconds)
        except asyncio.TimeoutError:
            await worker.interrupt()
            killed = (f"; its CLI did not stop within {CANCEL_GRACE_SECONDS:g}s and was killed: the lock it left in "
                      "the backend is cleared before the stack's next operation") if worker.killed else ""
            return UpdateResult("failed", f"{operation} timed out after {self.settings.timeout_seconds:g}s{killed}",
                                duration=time.monotonic() - started, lock_left=worker.killed)
        except asyncio.CancelledError:
            # The operator is stopping or the Stack was deleted: let the CLI cancel cleanly.
            await asyncio.shield(worker.interrupt())
            raise
        finally:
            self._running.pop(request.stack_key, None)
        said = _result_line(stdout)
        if said is None and not worker.interrupted:
            # The worker died without a result (the OOM killer, a kill -9): the CLI it started runs on unwatched,
            # holding the stack's lock, or died writing to it. Stopped as a cancel stops it.
            await worker.stop()
        result = _parse_worker_output(operation, said, stdout, worker.interrupted, time.monotonic() - started)
        if worker.killed:
            result = dataclasses.replace(result, lock_left=True)
        return memory.judged(operation, result, oom_kills_before) if memory else result


@dataclasses.dataclass
class Worker:
    """One forked worker: its process group (it is a session leader) and its connection."""

    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    exited: bool = False
    interrupted: bool = False
    killed: bool = False  # still running after the interrupt's grace: its CLI may have left its lock

    async def communicate(self, payload: str) -> str:
        self.writer.write(payload.encode())
        await self.writer.drain()
        self.writer.write_eof()
        try:
            out = await self.reader.read()
        finally:
            self.exited = True
            self.writer.close()
        return out.decode(errors="replace")

    async def interrupt(self) -> None:
        """Stop the operation the worker runs."""
        self.interrupted = True
        await self.stop()

    async def stop(self) -> None:
        """SIGINT the worker's process group (the CLI cancels gracefully), then SIGKILL after a grace period."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGINT)
        deadline = time.monotonic() + CANCEL_GRACE_SECONDS
        while time.monotonic() < deadline and _alive(self.pid):
            await asyncio.sleep(0.1)
        self.killed = _alive(self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.writer.close()


def _alive(pid: int) -> bool:
    """Whether the process group led by `pid` still has members (its leader is not our child to wait for)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _result_line(stdout: str) -> str | None:
    """The worker's result (JSON), if it said one."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return line[len(RESULT_PREFIX):]
    return None


def _parse_worker_output(operation: Operation, said: str | None, stdout: str, interrupted: bool,
                         duration: float) -> UpdateResult:
    """The operation's result from what the worker `said` (its result line, None without one) and the rest
    of its output."""
    if said is not None:
        result = UpdateResult.from_json(said, duration)
        return dataclasses.replace(result, outcome="cancelled") if interrupted and not result.ok else result
    if interrupted:
        return UpdateResult("cancelled", f"{operation} interrupted", duration=duration)
    tail = "\n".join(stdout.strip().splitlines()[-5:])
    # Its CLI, stopped or dead, may have left the stack's lock: cleared before the next operation.
    return UpdateResult("failed", redact(
        f"the {operation}'s worker process ended without a result "
        f"{f'({tail})' if tail else '(killed: out of memory, or by hand)'}; the CLI it ran was stopped, and the lock "
        "it may have left in the backend is cleared before the stack's next operation"),
        duration=duration, lock_left=True)
