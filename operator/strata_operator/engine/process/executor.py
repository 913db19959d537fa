"""The process executor: `Engine` on the Pulumi Automation API, one worker process per operation.

`AutomationEngine` runs every operation in a worker process forked for it by a fork server (`python -m
strata_operator.engine.process.worker`, which drives `pulumi.automation` against the `pulumi` CLI) so
that no update ever runs inside the Kopf process: each worker gets an environment holding only that
Stack's variables, under a global concurrency limit, with at most one operation per Stack at a time.
Namespaces the operator trusts share one fork server; every other namespace has its own, inside its
sandbox (sandbox.py), so its programs and the workers that run them see only that namespace's files.
Requests (which carry secrets) travel over the worker's socket, never argv or files; results come back
as one line, and the operator writes what it keeps (the update's log, a saved plan) where no program can.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from ...api import FILE_BACKEND_ANNOTATION
from ...api.status import EXECUTOR_CANNOT_ISOLATE
from ...api.validation import STALLED_SPEC_INVALID
from ..port import EngineUnavailable, Operation, SerializedEngine, UpdateRequest, UpdateResult
from .bytecode import bytecode_cache_beside
from .memory_limit import ContainerMemory
from .plugins import ambient_plugin_dirs, ambient_plugins, cached_plugins, default_plugin_cache
from .sandbox import SandboxMounts, bwrap_argv, bwrap_binary, probe, tool_paths
from .virtualenvs import default_python_cache

RESULT_PREFIX = "STRATA-RESULT "
# struct ucred: what SCM_CREDENTIALS carries (pid, uid, gid).
CREDENTIALS = struct.Struct("3i")
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
    # Namespaces whose programs run unsandboxed, as the operator's own user ("*": every one; a workspace pod's
    # agent, whose pod is the sandbox). The operator trusts its own namespace, where the platform's Stacks run.
    trusted_namespaces: frozenset[str] = frozenset()
    # bubblewrap, which sandboxes every other namespace (sandbox.py); empty: found on PATH.
    bwrap: str = ""

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


# A sandboxed namespace's fork server left idle this long is stopped (its next operation starts another).
IDLE_FORKSERVER_SECONDS = 600.0
# Beside each Stack's operator-only files: the log of its last engine run (`strata logs stack`), and the key
# of its secret outputs' digests (decisions/outputs.py).
UPDATE_LOG = "last-update.json"
DIGEST_KEY = "outputs-digest.key"


@dataclasses.dataclass(frozen=True)
class Domain:
    """Whom a fork server's workers run for: the trusted namespaces together (`namespace` ""), or one other
    namespace in its sandbox, with the file:// backend directory the platform gave it bound in."""

    namespace: str = ""
    file_backend_root: str = ""

    @property
    def sandboxed(self) -> bool:
        return bool(self.namespace)


@dataclasses.dataclass
class ForkServer:
    loop: asyncio.AbstractEventLoop
    process: asyncio.subprocess.Process
    socket_path: Path
    last_used: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and self.loop is asyncio.get_running_loop()

    def stop(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


class AutomationEngine(SerializedEngine):
    """`Engine` on the Pulumi Automation API, one forked worker process per operation."""

    in_workspace_pods = False

    def __init__(self, settings: EngineSettings):
        super().__init__(settings.concurrency)
        self.settings = settings
        self._running: dict[str, Worker] = {}
        self._path = settings.search_path()
        self._forkservers: dict[Domain, ForkServer] = {}
        # One lock per event loop: fork servers' pipes belong to one (only tests run several loops).
        self._starting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._sandbox_problem: str | None = None

    async def cancel(self, stack_key: str) -> bool:
        worker = self._running.get(stack_key)
        if worker is None or worker.exited:
            return False
        await worker.interrupt()
        return True

    async def release(self, stack_key: str) -> None:
        """The Stack is gone: so is what its programs wrote (HOME, PULUMI_HOME, virtualenvs, scratch)."""
        shutil.rmtree(self.sandbox_dir(stack_key), ignore_errors=True)

    # -- isolation ------------------------------------------------------------------------------
    def trusts(self, namespace: str) -> bool:
        """Whether the namespace's programs run unsandboxed, as the operator's own user."""
        trusted = self.settings.trusted_namespaces
        return "*" in trusted or namespace in trusted

    def cannot_isolate(self, namespace: str) -> str:
        """Why this operator cannot run the namespace's programs apart from its own files and other
        namespaces' ("" when it can, or need not)."""
        return "" if self.trusts(namespace) else self.sandbox_problem()

    def sandbox_problem(self) -> str:
        """Why bubblewrap cannot sandbox programs here ("" when it can): probed once, on first need."""
        if self._sandbox_problem is None:
            self._sandbox_problem = probe(self.settings.bwrap or bwrap_binary())
        return self._sandbox_problem

    def isolation_summary(self) -> str:
        """One line for the operator's start: which namespaces run sandboxed, and whether they can."""
        trusted = self.settings.trusted_namespaces
        if "*" in trusted:
            return "every namespace's programs run unsandboxed, as the operator's user (--trusted-namespace '*')"
        problem = self.sandbox_problem()
        names = ", ".join(sorted(trusted)) or "none"
        if problem:
            return (f"programs of {names} run as the operator's user; those of every other namespace are refused "
                    f"(ExecutorCannotIsolate): {problem}")
        return f"programs of {names} run as the operator's user; every other namespace's in a bubblewrap sandbox"

    def _domain(self, request: UpdateRequest) -> Domain:
        namespace = request.stack_key.split("/", 1)[0]
        return Domain() if self.trusts(namespace) else Domain(namespace, request.file_backend_root)

    # -- where a Stack's files live -------------------------------------------------------------
    def stack_dir(self, stack_key: str) -> Path:
        """The Stack's files only the operator writes: its runs' sources, tokens and plans, its update log."""
        return self.settings.state_dir / "stacks" / stack_key

    def sandbox_dir(self, stack_key: str) -> Path:
        """The Stack's files its programs write: HOME, PULUMI_HOME, virtualenvs, the copy each run works in."""
        return self.settings.state_dir / "sandboxes" / stack_key

    def pulumi_home(self, stack_key: str) -> Path:
        return self.sandbox_dir(stack_key) / "pulumi-home"

    def python_cache(self, domain: Domain) -> Path:
        """uv's cache for the domain's environments: a sandboxed namespace has its own, so no program can put a
        file into an environment of another namespace's (a linked file is the cache's own)."""
        cache = self.settings.python_cache
        return cache.with_name(f"{cache.name}-namespaces") / domain.namespace if domain.sandboxed else cache

    def bytecode_cache(self, domain: Domain) -> Path | None:
        if self.settings.bytecode_cache is None:
            return None
        return bytecode_cache_beside(self.python_cache(domain)) if domain.sandboxed else self.settings.bytecode_cache

    def worker_env(self, request: UpdateRequest) -> dict[str, str]:
        """Only the Stack's own variables, what the CLI needs to start and how this host reaches the
        network (proxies, CA bundles, package indexes): no credential of the operator's."""
        if self.settings.inherited_env is not None:
            env = dict(self.settings.inherited_env)
        else:
            env = {name: value for name, value in os.environ.items() if name.upper() in NETWORK_SETTINGS}
        env.update({
            "PATH": self._path,
            "HOME": str(self.sandbox_dir(request.stack_key) / "home"),
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

    # -- fork servers ---------------------------------------------------------------------------
    def _sandbox_mounts(self, domain: Domain, home: Path) -> SandboxMounts:
        namespace = domain.namespace
        # What the operator fetched for the namespace's Stacks and PKO Workspaces (their runs' sources, tokens).
        sources = [self.settings.state_dir / kind / namespace for kind in ("stacks", "workspaces")]
        writable = [self.settings.state_dir / "sandboxes" / namespace, self.python_cache(domain)]
        bytecode = self.bytecode_cache(domain)
        if bytecode is not None:
            writable.append(bytecode)
        for directory in (*sources, *writable):
            directory.mkdir(parents=True, exist_ok=True)
        root = file_backend_directory(domain.file_backend_root)
        if root is not None:  # the team's state: private to the operator's user, as the worker makes it
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            writable.append(root)
        tools = tool_paths(self._path, [self.settings.plugin_cache, *self.settings.plugin_dirs])
        return SandboxMounts(read_only=(*tools, *sources), writable=tuple(writable), workdir=home)

    async def _start_forkserver(self, domain: Domain) -> ForkServer:
        """The domain's fork server, with a neutral environment (a Stack's own arrives with its request),
        listening on a socket the operator made where no program can reach it, handed over as a descriptor."""
        home = (self.settings.state_dir / "sandboxes" / domain.namespace / ".worker" if domain.sandboxed
                else self.settings.state_dir / "worker")
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": self._path, "HOME": str(home), "LANG": "C.UTF-8", "PYTHONPATH": _package_root(),
               "PYTHONUNBUFFERED": "1", "PULUMI_SKIP_UPDATE_CHECK": "true"}
        if self.settings.pulumi_version:
            env[IMAGE_PULUMI_VERSION] = self.settings.pulumi_version
        # A short private directory: socket paths are limited to 107 bytes.
        socket_path = Path(tempfile.mkdtemp(prefix="strata-worker-")) / "socket"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(socket_path))
        listener.listen(128)
        command = [*(self.settings.python_command or (sys.executable,)), "-m", "strata_operator.engine.process.worker",
                   "--listen-fd", str(listener.fileno())]
        if domain.sandboxed:
            command = bwrap_argv(self.settings.bwrap or bwrap_binary(), self._sandbox_mounts(domain, home), command)
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, cwd=home, env=env, start_new_session=True,
                pass_fds=(listener.fileno(),))
        finally:
            listener.close()  # the fork server holds it now
        assert process.stdout is not None
        said = await process.stdout.readline()
        if said.strip() != b"ready":
            rest = await process.stdout.read()
            where = f" for namespace {domain.namespace}" if domain.sandboxed else ""
            # Masked where it is shown: in the log, and in a Stack's status with its namespace's secrets.
            raise EngineUnavailable(f"the worker fork server{where} did not start: {(said + rest).decode()[-800:]}")
        return ForkServer(asyncio.get_running_loop(), process, socket_path)

    async def start(self, domain: Domain = Domain()) -> Path:
        """Start the domain's fork server unless it runs (for this event loop); returns its socket."""
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting[0] is not loop:
            self._starting = (loop, asyncio.Lock())
        async with self._starting[1]:
            self._stop_idle(domain)
            server = self._forkservers.get(domain)
            if server is None or not server.alive:
                server = self._forkservers[domain] = await self._start_forkserver(domain)
            server.last_used = time.monotonic()
            return server.socket_path

    def _stop_idle(self, keep: Domain) -> None:
        """Stop the sandboxed fork servers nobody used for IDLE_FORKSERVER_SECONDS (each holds an interpreter)."""
        now = time.monotonic()
        for domain, server in list(self._forkservers.items()):
            if domain != keep and domain.sandboxed and now - server.last_used > IDLE_FORKSERVER_SECONDS:
                server.stop()
                del self._forkservers[domain]

    async def _connect(self, domain: Domain) -> Worker:
        """A fresh worker process, forked for this one operation; a fork server found dead is replaced."""
        for _ in range(2):
            try:
                connection, pid = await asyncio.to_thread(_connect_worker, await self.start(domain))
            except OSError:
                pid = 0
            if pid:
                reader, writer = await asyncio.open_unix_connection(sock=connection, limit=2**24)
                return Worker(pid, reader, writer)
            self._discard_forkserver(domain)
        raise EngineUnavailable("the worker fork server does not answer, even after a restart")

    def _discard_forkserver(self, domain: Domain) -> None:
        server = self._forkservers.pop(domain, None)
        if server is not None:
            server.stop()

    # -- one operation --------------------------------------------------------------------------
    def confinement(self, namespace: str, backend_url: str, file_backend_root: str) -> tuple[str, str] | None:
        return confinement_issue(namespace, self.cannot_isolate(namespace), self.trusts(namespace), backend_url,
                                 file_backend_root)

    def refusal(self, request: UpdateRequest) -> UpdateResult | None:
        """The operation, refused before anything runs, when the Stack's program cannot be confined."""
        issue = self.confinement(request.stack_key.split("/", 1)[0], request.env.get("PULUMI_BACKEND_URL", ""),
                                 request.file_backend_root)
        return UpdateResult("blocked", issue[1], reason=issue[0]) if issue is not None else None

    async def _run_locked(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        started = time.monotonic()
        refused = self.refusal(request)
        if refused is not None:
            return refused
        domain = self._domain(request)
        memory = self.settings.container_memory
        oom_kills_before = memory.oom_kills() if memory else 0
        try:
            worker = await self._connect(domain)
        except EngineUnavailable as err:
            return UpdateResult("failed", str(err), duration=time.monotonic() - started)
        self._running[request.stack_key] = worker
        stack_dir = self.stack_dir(request.stack_key)
        payload = json.loads(request.to_json(operation))
        payload["worker_env"] = self.worker_env(request)
        payload["sandbox_dir"] = str(self.sandbox_dir(request.stack_key))
        payload["plugin_cache"] = str(self.settings.plugin_cache)
        payload["plugin_dirs"] = list(self.settings.plugin_dirs)
        payload["python_cache"] = str(self.python_cache(domain))
        bytecode = self.bytecode_cache(domain)
        payload["bytecode_cache"] = str(bytecode) if bytecode else None
        payload["digest_key"] = digest_key(stack_dir / DIGEST_KEY).hex()
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
        if said is not None:
            keep_worker_files(said, stack_dir, request.plan_file)
        result = _parse_worker_output(operation, said, stdout, worker.interrupted, time.monotonic() - started)
        if worker.killed:
            result = dataclasses.replace(result, lock_left=True)
        return memory.judged(operation, result, oom_kills_before) if memory else result


def confinement_issue(namespace: str, cannot_isolate: str, trusted: bool, backend_url: str,
                      file_backend_root: str) -> tuple[str, str] | None:
    """(Stalled reason, message) when a Stack of `namespace` may not run under this executor: its program
    cannot be sandboxed here, or its file:// backend is outside the directory the platform gave the namespace
    (inside the sandbox nothing else is writable, and another team's state must stay unreachable)."""
    if trusted:
        return None
    if cannot_isolate:
        return (EXECUTOR_CANNOT_ISOLATE,
                f"the process executor runs the programs of namespace {namespace!r} sandboxed, apart from the "
                f"operator's files and other namespaces', and cannot here: {cannot_isolate}. Nothing of this Stack "
                "runs unisolated; fix: run the operator with --executor pod (the Operator component's executor: "
                f"\"pod\"), make bubblewrap work where the operator runs, or, if whoever writes Stacks in "
                f"{namespace!r} may act as the operator itself, name it in --trusted-namespace")
    if not backend_url.startswith("file://"):
        return None
    directory = file_backend_directory(backend_url)
    root = file_backend_directory(file_backend_root) if file_backend_root else None
    if root is not None and directory is not None and directory.is_relative_to(root):
        return None
    given = (f"the directory {file_backend_root} (the namespace's annotation {FILE_BACKEND_ANNOTATION})"
             if file_backend_root else f"no directory (namespace {namespace!r} has no annotation "
                                       f"{FILE_BACKEND_ANNOTATION})")
    return (STALLED_SPEC_INVALID,
            f"spec.backend (or PULUMI_BACKEND_URL): the file:// backend {backend_url!r} is not inside the file:// "
            f"state the platform gave namespace {namespace!r}, {given}; programs of this namespace reach no other "
            "directory of the operator's host; fix: keep the state under that directory (the platform's team "
            "environments hand it to each team as its backend), or use an object store backend")


def file_backend_directory(url: str) -> Path | None:
    """The absolute directory of a file:// backend URL, or of a plain path (`~` is the operator's home, as the
    worker reads it)."""
    raw = unquote(url.removeprefix("file://").split("?", 1)[0])
    if not raw:
        return None
    return Path(os.path.normpath(os.path.expanduser(raw)))


def digest_key(path: Path) -> bytes:
    """The Stack's random digest key, created private (0600) on first use; only the operator writes it."""
    try:
        key = path.read_bytes()
        if len(key) == 32:
            return key
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    write_private(path, key)
    return key


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by the operator's user only."""
    partial = path.with_suffix(".partial")
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
        file.write(data)
    partial.replace(path)


def keep_worker_files(said: str, stack_dir: Path, plan_file: str) -> None:
    """Write where only the operator writes what the worker sent back: its run's log (redacted by the worker)
    and a plan it saved."""
    try:
        body = json.loads(said)
    except ValueError:
        return
    if isinstance(body.get("update_log"), dict):
        stack_dir.mkdir(parents=True, exist_ok=True)
        write_private(stack_dir / UPDATE_LOG, json.dumps(body["update_log"]).encode())
    if plan_file and isinstance(body.get("plan"), str):
        with contextlib.suppress(ValueError):
            Path(plan_file).write_bytes(base64.b64decode(body["plan"], validate=True))


def _connect_worker(socket_path: Path) -> tuple[socket.socket, int]:
    """Connect to a fork server and read the line its forked worker says first: (the connection, the
    worker's pid as this process sees it). The pid comes in the kernel's credentials (SCM_CREDENTIALS),
    translated out of a sandbox's own PID namespace; 0 if none came."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    connection.settimeout(30)
    try:
        connection.connect(str(socket_path))
        said, ancillary, _, _ = connection.recvmsg(64, socket.CMSG_SPACE(CREDENTIALS.size))
    except OSError:
        connection.close()
        raise
    pid = next((CREDENTIALS.unpack(data)[0] for level, kind, data in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), 0)
    if not said.endswith(b"\n") or not pid:
        connection.close()
        return connection, 0
    return connection, pid


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
    return UpdateResult("failed", (
        f"the {operation}'s worker process ended without a result "
        f"{f'({tail})' if tail else '(killed: out of memory, or by hand)'}; the CLI it ran was stopped, and the lock "
        "it may have left in the backend is cleared before the stack's next operation"),
        duration=duration, lock_left=True)
