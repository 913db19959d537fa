"""The engine port: the one interface between the operator and Pulumi, and its production implementation.

`Engine` is what handlers call. `AutomationEngine` runs every operation in a worker subprocess
(`python -m strata_operator.worker`, which drives `pulumi.automation` against the `pulumi` CLI)
so that no update ever runs inside the Kopf process: each worker gets its own workdir and
PULUMI_HOME and an environment holding only that Stack's variables, under a global concurrency
limit, with at most one operation per Stack at a time. Requests (which carry secrets) travel on the
worker's stdin, never in argv.
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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from .redaction import REDACTOR, redact

Operation = Literal["preview", "up", "refresh", "destroy", "outputs", "remove", "recover"]
Outcome = Literal["succeeded", "failed", "conflict", "cancelled"]
RESULT_PREFIX = "STRATA-RESULT "
# Updates are CPU-bound: beyond about two per core they only add memory (measured with
# benchmarks/fleet.py on 2 cores: 10 at once took 70 s and 1.7 GB for 50 Stacks, 4 took 66 s and 0.67 GB).
DEFAULT_CONCURRENCY = min(10, 2 * (os.cpu_count() or 1))
DEFAULT_TIMEOUT_SECONDS = 3600.0
CANCEL_GRACE_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class UpdateRequest:
    """Everything one operation needs; `env`, `secret_config` and `config` values may be secret."""

    stack_key: str  # <namespace>/<name> of the Stack object: the unit of mutual exclusion
    stack_name: str  # spec.stack
    project_dir: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
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
    # For `recover`: the interrupted run's host and start time (seconds since the epoch).
    interrupted_host: str = ""
    interrupted_since: float = 0.0

    def to_json(self, operation: Operation) -> str:
        body = dataclasses.asdict(self)
        body["operation"] = operation
        return json.dumps(body)


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    outcome: Outcome
    message: str = ""
    outputs: dict[str, tuple[Any, bool]] = dataclasses.field(default_factory=dict)
    permalink: str = ""
    summary: dict[str, int] = dataclasses.field(default_factory=dict)
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    @classmethod
    def from_json(cls, text: str, duration: float) -> "UpdateResult":
        body = json.loads(text)
        outputs = {k: (v["value"], bool(v["secret"])) for k, v in body.get("outputs", {}).items()}
        return cls(body["outcome"], redact(body.get("message", "")), outputs, body.get("permalink", ""),
                   body.get("summary", {}), duration)


class Engine(Protocol):
    """The operator's only way to run Pulumi."""

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
    pulumi_command: str = ""  # path to the `pulumi` binary; empty: found on PATH
    state_dir: Path = Path(os.environ.get("STRATA_OPERATOR_STATE", Path.home() / ".cache/strata/operator"))
    concurrency: int = DEFAULT_CONCURRENCY
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # Directories with language hosts and plugins (e.g. the toolchain's pulumi-language-yaml).
    plugin_dirs: tuple[str, ...] = ()

    def search_path(self) -> str:
        """The workers' PATH: the CLI's directory, the plugin directories, then the system's."""
        found = self.pulumi_command or shutil.which("pulumi") or ""
        if not found:
            raise EngineUnavailable("no `pulumi` CLI on PATH; install it or pass --pulumi /path/to/pulumi")
        return os.pathsep.join([str(Path(found).absolute().parent), *self.plugin_dirs,
                                "/usr/local/bin", "/usr/bin", "/bin"])


class EngineUnavailable(RuntimeError):
    """The engine cannot run at all (no CLI); the message names the fix."""


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


class AutomationEngine:
    """`Engine` on the Pulumi Automation API, one worker subprocess per operation."""

    def __init__(self, settings: EngineSettings):
        self.settings = settings
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._locks: dict[str, asyncio.Lock] = {}
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self._path = settings.search_path()
        # One worker started ahead of need, so an update does not wait for Python and the
        # Automation API to load (~0.5 s of every run).
        self._spare: tuple[asyncio.AbstractEventLoop, asyncio.subprocess.Process] | None = None
        self._refill: asyncio.Task | None = None

    def busy(self, stack_key: str) -> bool:
        lock = self._locks.get(stack_key)
        return lock is not None and lock.locked()

    async def preview(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("preview", request)

    async def up(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("up", request)

    async def refresh(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("refresh", request)

    async def destroy(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("destroy", request)

    async def outputs(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("outputs", request)

    async def remove_stack(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("remove", request)

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        return await self._run("recover", request)

    async def cancel(self, stack_key: str) -> bool:
        process = self._running.get(stack_key)
        if process is None or process.returncode is not None:
            return False
        await _interrupt(process)
        return True

    def pulumi_home(self, stack_key: str) -> Path:
        return self.settings.state_dir / "stacks" / stack_key / "pulumi-home"

    def worker_env(self, request: UpdateRequest) -> dict[str, str]:
        """Only the Stack's own variables plus what the CLI needs to start: nothing of the operator's."""
        home = self.settings.state_dir / "stacks" / request.stack_key / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": self._path,
            "HOME": str(home),
            "PULUMI_HOME": str(self.pulumi_home(request.stack_key)),
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "LANG": "C.UTF-8",
            "PYTHONPATH": _package_root(),
            "PYTHONUNBUFFERED": "1",
        }
        env.update(request.env)
        return env

    async def _spawn_worker(self) -> asyncio.subprocess.Process:
        """A worker with a neutral environment; the Stack's own arrives with its request on stdin."""
        neutral = self.settings.state_dir / "worker"
        neutral.mkdir(parents=True, exist_ok=True)
        env = {"PATH": self._path, "HOME": str(neutral), "LANG": "C.UTF-8", "PYTHONPATH": _package_root(),
               "PYTHONUNBUFFERED": "1", "PULUMI_SKIP_UPDATE_CHECK": "true"}
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "strata_operator.worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=neutral, env=env, start_new_session=True)

    async def _take_worker(self) -> asyncio.subprocess.Process:
        loop = asyncio.get_running_loop()
        spare, self._spare = self._spare, None
        # A spare's pipes belong to the loop that started it (only tests run several loops).
        if spare is None or spare[0] is not loop or spare[1].returncode is not None:
            worker = await self._spawn_worker()
        else:
            worker = spare[1]
        if self._refill is None or self._refill.done():
            self._refill = loop.create_task(self._keep_spare())
        return worker

    async def _keep_spare(self) -> None:
        if self._spare is None:
            self._spare = (asyncio.get_running_loop(), await self._spawn_worker())

    async def _run(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        REDACTOR.add(*request.secret_config.values())
        lock = self._locks.setdefault(request.stack_key, asyncio.Lock())
        async with lock, self._slots:
            started = time.monotonic()
            process = await self._take_worker()
            self._running[request.stack_key] = process
            payload = json.loads(request.to_json(operation))
            payload["worker_env"] = self.worker_env(request)
            try:
                stdout = await asyncio.wait_for(self._communicate(process, json.dumps(payload)),
                                                timeout=self.settings.timeout_seconds)
            except asyncio.TimeoutError:
                await _interrupt(process)
                return UpdateResult("failed", f"{operation} timed out after {self.settings.timeout_seconds:g}s",
                                    duration=time.monotonic() - started)
            except asyncio.CancelledError:
                # The operator is stopping or the Stack was deleted: let the CLI cancel cleanly.
                await asyncio.shield(_interrupt(process))
                raise
            finally:
                self._running.pop(request.stack_key, None)
            return _parse_worker_output(operation, stdout, process.returncode, time.monotonic() - started)

    @staticmethod
    async def _communicate(process: asyncio.subprocess.Process, payload: str) -> str:
        out, _ = await process.communicate(payload.encode())
        return out.decode(errors="replace")


def _parse_worker_output(operation: Operation, stdout: str, returncode: int | None, duration: float) -> UpdateResult:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return UpdateResult.from_json(line[len(RESULT_PREFIX):], duration)
    tail = "\n".join(stdout.strip().splitlines()[-5:])
    if returncode is not None and returncode < 0:
        return UpdateResult("cancelled", redact(f"{operation} interrupted by signal {-returncode}"), duration=duration)
    return UpdateResult("failed", redact(f"{operation} worker exited with {returncode}: {tail}"), duration=duration)


async def _interrupt(process: asyncio.subprocess.Process) -> None:
    """SIGINT the worker's process group (the CLI cancels gracefully), then SIGKILL after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), timeout=CANCEL_GRACE_SECONDS)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
