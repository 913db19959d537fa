"""The engine port: the one interface between the operator and Pulumi, and its production implementation.

`Engine` is what handlers call. `AutomationEngine` runs every operation in a worker process forked
for it by a fork server (`python -m strata_operator.worker`, which drives `pulumi.automation`
against the `pulumi` CLI) so that no update ever runs inside the Kopf process: each worker gets its
own workdir and PULUMI_HOME and an environment holding only that Stack's variables, under a global
concurrency limit, with at most one operation per Stack at a time. Requests (which carry secrets)
travel on the worker's own socket, never in argv.
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
from typing import Any, Literal, Protocol

from .plugins import ambient_plugins, ambient_plugin_dirs, cached_plugins, default_plugin_cache
from .redaction import REDACTOR, redact

Operation = Literal["preview", "up", "refresh", "destroy", "outputs", "remove", "recover"]
# "blocked": failed in a way that retrying cannot fix (a plugin missing everywhere, a backend directory
# that cannot be created); the Stack waits for a change instead of retrying.
Outcome = Literal["succeeded", "failed", "conflict", "cancelled", "blocked"]
RESULT_PREFIX = "STRATA-RESULT "
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


@dataclasses.dataclass(frozen=True)
class UpdateRequest:
    """Everything one operation needs; `secret_config` values and the `env` entries named in `secret_env`
    are secret (the worker redacts those, and only those, from what it reports)."""

    stack_key: str  # <namespace>/<name> of the Stack object: the unit of mutual exclusion
    stack_name: str  # spec.stack
    project_dir: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    secret_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secrets_provider: str = ""
    create: bool = True
    refresh: bool = False
    expect_no_refresh_changes: bool = False
    targets: tuple[str, ...] = ()
    target_dependents: bool = False
    environments: tuple[str, ...] = ()
    message: str = ""
    run_program: bool = False  # destroy: run the program too (spec.runProgram)
    # up: read the outputs' real values (one `stack output --show-secrets` when some are secret), for
    # spec.outputsSecret and for the digests of secret outputs that dependents compare.
    real_outputs: bool = False
    # Manual approval: preview saves its plan here; up applies exactly the plan found here.
    plan_file: str = ""
    # Drift detection: refresh only previews (what changed outside Pulumi), writing nothing.
    preview_only: bool = False
    # For `recover`: the interrupted run's host and start time (seconds since the epoch).
    interrupted_host: str = ""
    interrupted_since: float = 0.0
    # PKO v2's Update options (auto.pulumi.com): fail on any change (preview, up, refresh), go on past
    # resource errors (up, destroy), resources to replace (preview, up), at most this many resource
    # operations at once (0: the CLI's default).
    expect_no_changes: bool = False
    continue_on_error: bool = False
    replace: tuple[str, ...] = ()
    parallel: int = 0
    # The pod executor's: where the workspace pod goes and what it runs as (the process executor ignores them).
    service_account: str = ""  # spec.serviceAccountName; empty: a per-Stack one with no rights
    workspace_template: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # spec.workspaceTemplate
    reclaim_workspace: bool = False  # spec.workspaceReclaimPolicy Delete: no pod kept between updates
    # The references the workspace resolves itself (workspace.MountedRefs.to_json()); the process
    # executor's requests carry their values in env and secret_config instead.
    mounted: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source_root: str = ""  # the materialised source holding project_dir (sent whole to a workspace pod)
    local_dir: str = ""  # the program is this directory of the workspace pod (nothing is uploaded)
    # A PKO v2 Workspace stack's config items (workspace_config.ConfigItem.to_json()), resolved by the
    # workspace pod's agent: their valueFrom.env is the pod's own environment, which the operator never reads.
    env_config: tuple[Mapping[str, Any], ...] = ()

    def to_json(self, operation: Operation) -> str:
        body = dataclasses.asdict(self)
        body["operation"] = operation
        return json.dumps(body)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "UpdateRequest":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return cls(**{name: tuple(value) if isinstance(value, list) else value
                      for name, value in body.items() if name in fields})


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    outcome: Outcome
    message: str = ""
    outputs: dict[str, tuple[Any, bool]] = dataclasses.field(default_factory=dict)
    permalink: str = ""
    summary: dict[str, int] = dataclasses.field(default_factory=dict)
    duration: float = 0.0
    reason: str = ""  # a failure's PKO reason when more specific than the outcome's (WorkspaceFailed)
    # up with real_outputs: every output's real value, secret ones included. Never in repr, and each secret
    # one is registered with the REDACTOR as soon as it arrives.
    real_outputs: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    outputs_error: str = ""  # why real_outputs could not be read
    output_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    outputs_digest: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    def to_json(self) -> str:
        """The worker's result line, which `from_json` reads (the workspace agent sends it on)."""
        return json.dumps({
            "outcome": self.outcome, "message": self.message, "permalink": self.permalink, "summary": self.summary,
            "outputs": {k: {"value": v, "secret": secret} for k, (v, secret) in self.outputs.items()},
            "reason": self.reason, "real_outputs": self.real_outputs, "outputs_error": self.outputs_error,
            "output_digests": self.output_digests, "outputs_digest": self.outputs_digest})

    @classmethod
    def from_json(cls, text: str, duration: float) -> "UpdateResult":
        body = json.loads(text)
        outputs = {k: (v["value"], bool(v["secret"])) for k, v in body.get("outputs", {}).items()}
        real = body.get("real_outputs")
        register_secret_outputs(outputs, real)
        return cls(body["outcome"], redact(body.get("message", "")), outputs, body.get("permalink", ""),
                   body.get("summary", {}), duration, body.get("reason", ""), real,
                   redact(body.get("outputs_error", "")), dict(body.get("output_digests") or {}),
                   body.get("outputs_digest", ""))


def register_secret_outputs(outputs: dict[str, tuple[Any, bool]], real: dict[str, Any] | None) -> None:
    """Add the real values of the secret outputs to the REDACTOR (idempotent)."""
    for name, (_, secret) in outputs.items():
        if secret and real is not None and name in real:
            REDACTOR.add(*_secret_strings(real[name]))


def _secret_strings(value: Any) -> list[str]:
    """A secret output's value as text (as written to a Secret) and each string inside it."""
    found = [value if isinstance(value, str) else json.dumps(value, sort_keys=True)]
    if isinstance(value, dict):
        for item in value.values():
            found += _secret_strings(item)
    elif isinstance(value, list):
        for item in value:
            found += _secret_strings(item)
    elif not isinstance(value, str) and value is not None:
        found.append(str(value))
    return found


class Engine(Protocol):
    """The operator's only way to run Pulumi."""

    in_workspace_pods: bool
    """Updates run in a pod per Stack under its ServiceAccount, which resolves the Stack's Secret, Env and
    FS refs itself (requests carry them in `mounted`); otherwise in processes the operator forks, which
    get every value in the request."""

    async def preview(self, request: UpdateRequest) -> UpdateResult: ...

    async def up(self, request: UpdateRequest) -> UpdateResult: ...

    async def refresh(self, request: UpdateRequest) -> UpdateResult: ...

    async def destroy(self, request: UpdateRequest) -> UpdateResult: ...

    async def outputs(self, request: UpdateRequest) -> UpdateResult: ...

    async def remove_stack(self, request: UpdateRequest) -> UpdateResult: ...

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        """Clear what a run killed mid-update left behind (its lock, a truncated checkpoint)."""

    async def cancel(self, stack_key: str) -> bool:
        """Interrupt the Stack's running operation, if any; True if one was running."""

    def busy(self, stack_key: str) -> bool: ...


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
    # The operator's own PATH: the CLI is found on it, and its directories holding language hosts or
    # plugins are passed on to updates (their environment is otherwise clean).
    host_path: str = dataclasses.field(default_factory=lambda: os.environ.get("PATH", ""))
    # A workspace pod's agent: updates start from the pod's own environment, as PKO's agent runs them
    # (the image's ENV and PATH, workspaceTemplate's env and envFrom); None: only NETWORK_SETTINGS.
    inherited_env: Mapping[str, str] | None = None
    # How to start this Python (the fork server): empty is sys.executable. A workspace pod whose image
    # is not the operator's runs the operator's Python through its own dynamic loader (bundle.py).
    python_command: tuple[str, ...] = ()

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


class EngineUnavailable(RuntimeError):
    """The engine cannot run at all (no CLI); the message names the fix."""


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


class SerializedEngine:
    """What every executor shares: one operation per Stack at a time, at most `concurrency` at once, and
    each `Engine` operation one `run` of its name (the executor's `_run_locked`)."""

    in_workspace_pods = False

    def __init__(self, concurrency: int):
        self._slots = asyncio.Semaphore(concurrency)
        self._locks: dict[str, asyncio.Lock] = {}

    def busy(self, stack_key: str) -> bool:
        lock = self._locks.get(stack_key)
        return lock is not None and lock.locked()

    def forget(self, stack_key: str) -> None:
        """The object is gone: its lock goes too, unless an operation still holds it (a fleet's churn
        would otherwise keep one per Stack ever seen)."""
        lock = self._locks.get(stack_key)
        if lock is not None and not lock.locked():
            del self._locks[stack_key]

    async def run(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        REDACTOR.add(*request.secret_config.values())
        lock = self._locks.setdefault(request.stack_key, asyncio.Lock())
        async with lock, self._slots:
            return await self._run_locked(operation, request)

    async def _run_locked(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        raise NotImplementedError

    async def preview(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("preview", request)

    async def up(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("up", request)

    async def refresh(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("refresh", request)

    async def destroy(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("destroy", request)

    async def outputs(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("outputs", request)

    async def remove_stack(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("remove", request)

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("recover", request)


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
        # A short private directory: socket paths are limited to 107 bytes.
        socket_path = Path(tempfile.mkdtemp(prefix="strata-worker-")) / "socket"
        process = await asyncio.create_subprocess_exec(
            *(self.settings.python_command or (sys.executable,)), "-m", "strata_operator.worker", str(socket_path),
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
        try:
            worker = await self._connect()
        except EngineUnavailable as err:
            return UpdateResult("failed", str(err), duration=time.monotonic() - started)
        self._running[request.stack_key] = worker
        payload = json.loads(request.to_json(operation))
        payload["worker_env"] = self.worker_env(request)
        payload["plugin_cache"] = str(self.settings.plugin_cache)
        payload["plugin_dirs"] = list(self.settings.plugin_dirs)
        try:
            stdout = await asyncio.wait_for(worker.communicate(json.dumps(payload)),
                                            timeout=self.settings.timeout_seconds)
        except asyncio.TimeoutError:
            await worker.interrupt()
            return UpdateResult("failed", f"{operation} timed out after {self.settings.timeout_seconds:g}s",
                                duration=time.monotonic() - started)
        except asyncio.CancelledError:
            # The operator is stopping or the Stack was deleted: let the CLI cancel cleanly.
            await asyncio.shield(worker.interrupt())
            raise
        finally:
            self._running.pop(request.stack_key, None)
        return _parse_worker_output(operation, stdout, worker.interrupted, time.monotonic() - started)


@dataclasses.dataclass
class Worker:
    """One forked worker: its process group (it is a session leader) and its connection."""

    pid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    exited: bool = False
    interrupted: bool = False

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
        """SIGINT the worker's process group (the CLI cancels gracefully), then SIGKILL after a grace period."""
        self.interrupted = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGINT)
        deadline = time.monotonic() + CANCEL_GRACE_SECONDS
        while time.monotonic() < deadline and _alive(self.pid):
            await asyncio.sleep(0.1)
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


def _parse_worker_output(operation: Operation, stdout: str, interrupted: bool, duration: float) -> UpdateResult:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = UpdateResult.from_json(line[len(RESULT_PREFIX):], duration)
            return dataclasses.replace(result, outcome="cancelled") if interrupted and not result.ok else result
    if interrupted:
        return UpdateResult("cancelled", f"{operation} interrupted", duration=duration)
    tail = "\n".join(stdout.strip().splitlines()[-5:])
    return UpdateResult("failed", redact(f"{operation} worker ended without a result: {tail}"), duration=duration)
