"""What the Workspace and Update controllers (PKO v2's `auto.pulumi.com` API) share: this process's state
of their objects (`AutoState`, on the operator's memo), a Workspace's workdir and the program fetched
there, the engine key and request of a Workspace, and their Events and status writes (redacted).

Nothing here patches the objects themselves (no finalizers, no Kopf annotations): only their status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

import kopf

from ..api import AUTO_GROUP, AUTO_VERSION
from ..api.workspace import SECRET_VARIABLES, WorkspaceSpec
from ..engine.pod.workspace_pod import WORKSPACE_SUFFIX
from ..engine.port import UpdateRequest
from ..services.events import post_event
from ..services.redaction import redactor_for
from .context import woken

RETRY_SECONDS = (10.0, 30.0, 60.0, 120.0, 300.0)


MARKER = "current.json"


def workspace_key(namespace: str, name: str) -> str:
    """The engine's unit of mutual exclusion and state (PULUMI_HOME, ...) for a Workspace: '@' is in no
    Kubernetes name, so it never meets a Stack's `<namespace>/<name>`."""
    return f"{namespace}/{name}{WORKSPACE_SUFFIX}"


@dataclasses.dataclass
class ObjectLoop:
    """One object's passes, one at a time: the latest body is handed to `run`, which returns seconds
    until the next pass (None: only when woken)."""

    run: Any
    body: Any = None
    wakeup: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    seen: tuple[Any, ...] = ()

    def feed(self, body: Any, intent: tuple[Any, ...]) -> None:
        self.body = body
        if intent != self.seen:
            self.seen = intent
            self.wakeup.set()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self.wakeup.clear()
            delay = await self.run(self.body)
            if delay == 0.0:
                continue
            await woken(self.wakeup, delay)


@dataclasses.dataclass
class AutoState:
    workspaces: dict[tuple[str, str], ObjectLoop] = dataclasses.field(default_factory=dict)
    failures: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    runs: dict[tuple[str, str], asyncio.Task] = dataclasses.field(default_factory=dict)
    # Updates this process finished (uid): stale events of their own earlier status never re-run them.
    done: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    expiring: dict[tuple[str, str], asyncio.Task] = dataclasses.field(default_factory=dict)
    # Updates waiting for their Workspace (namespace, workspace) -> names.
    waiting: dict[tuple[str, str], set[str]] = dataclasses.field(default_factory=dict)
    # Updates between their first status write and their run (or waiting): Workspace cleanup leaves theirs.
    using: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    pulumi_version: str = ""


def state_of(memo: kopf.Memo) -> AutoState:
    return memo.auto


def auto_event(body: Any, reason: str, message: str, warning: bool = False) -> None:
    """An Event on a Workspace or Update: redacted, never sent to Flux."""
    post_event(body, reason, message, warning, to_flux=False)


async def patch_auto_status(ctx: Any, plural: str, body: Any, status: dict[str, Any]) -> bool:
    meta = body["metadata"]
    redact = redactor_for(meta["namespace"]).redact
    clean = {key: redact(value) if isinstance(value, str) else value for key, value in status.items()}
    if "conditions" in clean:
        clean["conditions"] = [{**c, "message": redact(c["message"])} for c in clean["conditions"]]
    return await ctx.kube.patch_custom_status(AUTO_GROUP, AUTO_VERSION, plural, meta["namespace"], meta["name"], clean)


def workspace_dir(ctx: Any, namespace: str, name: str) -> Path:
    return ctx.settings.engine.state_dir / "workspaces" / namespace / name


@dataclasses.dataclass(frozen=True)
class Program:
    """Where a Workspace's program is, for its current generation: fetched by this process (`project`,
    inside `source_root`), or a directory of its workspace pod (`local_dir`: spec.local, pod executor)."""

    project: Path | None = None
    source_root: Path | None = None
    local_dir: str = ""


def materialised_program(ctx: Any, workspace: dict[str, Any]) -> Program | None:
    """The program this process made ready for the Workspace's current generation, if any."""
    meta = workspace["metadata"]
    try:
        marker = json.loads((workspace_dir(ctx, meta["namespace"], meta["name"]) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("uid") != meta.get("uid") or marker.get("generation") != meta.get("generation"):
        return None
    if marker.get("local_dir"):  # a pod's directory: nothing this process can run (the executor changed)
        return Program(local_dir=marker["local_dir"]) if ctx.engine.in_workspace_pods else None
    project = Path(marker.get("project", ""))
    return Program(project, Path(marker.get("source_root") or project)) if project.is_dir() else None


def workspace_request(namespace: str, name: str, raw: dict[str, Any], spec: WorkspaceSpec, program: Program,
                      **options: Any) -> UpdateRequest:
    """A pod executor's request for the Workspace's pod: the pod is built from the Workspace's spec (PKO's
    WorkspaceSpec, as a Stack's workspaceTemplate) and runs as its ServiceAccount; its environment,
    Secrets included, is the pod's own, and so are the stack's config values taken from it."""
    stack = spec.stack(options.get("stack_name", ""))
    return UpdateRequest(
        stack_key=workspace_key(namespace, name), project_dir=str(program.project or ""),
        source_root=str(program.source_root or ""), local_dir=program.local_dir,
        # Masked in what the update reports: what the pod's env takes from Secrets, and the engine's secrets.
        secret_env=tuple(sorted({var.name for var in spec.env if var.secret} | SECRET_VARIABLES)),
        service_account=spec.service_account_name, workspace_template={"spec": raw},
        env_config=tuple(item.to_json() for item in (stack.config if stack else ())),
        secrets_provider=stack.secrets_provider if stack else "", environments=stack.environment if stack else (),
        **{"stack_name": "", **options})


@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def start_auto(memo: kopf.Memo, **_: Any) -> None:
    """On the operator's own memo: each object's handlers get a shallow copy of it, so state set there
    would be that object's alone."""
    memo.auto = AutoState()


@kopf.on.cleanup()
async def stop_auto(memo: kopf.Memo, **_: Any) -> None:
    state = state_of(memo)
    tasks = [t for t in [*state.runs.values(), *state.expiring.values(),
                         *(loop.task for loop in state.workspaces.values())] if t is not None and not t.done()]
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
