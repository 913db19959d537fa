"""The Workspace controller (PKO v2's `auto.pulumi.com/v1alpha1` Workspace) on the engine port.

A Workspace is materialised for the process executor: its program fetched into a workdir under the
operator's state directory (git, a Flux artifact URL, a host directory, or projectInfo alone), its
env references checked, status `Ready` as PKO writes it. Under the pod executor it gets its pod
(`<name>-workspace-0`), and turns Ready once the pod answers. Each Workspace's passes run one at a
time in an `ObjectLoop`; a Workspace turning Ready starts the Updates that waited for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import kopf

from ..api import AUTO_GROUP, AUTO_VERSION
from ..api.auto_conditions import READY, STALLED, set_conditions
from ..api.status import WORKSPACE_FAILED, condition
from ..api.validation import SpecInvalid, SpecIssue
from ..api.workspace import (LocalSource, WorkspaceSpec, literal_env, misplaced_backend, not_applicable,
                             parse_workspace, workspace_ready)
from ..api.workspace_template import template_issues
from ..services.redaction import LOG_REDACTOR, redactor_for
from ..sources.archive import SourceError
from ..sources.git import HOST_KEY_PIN_FILE
from ..sources.references import RefError
from ..sources.workspace_program import git_credentials, materialise, resolve_env, stack_config
from .auto_state import (MARKER, RETRY_SECONDS, AutoState, ObjectLoop, Program, auto_event, materialised_program,
                         patch_auto_status, state_of, workspace_dir, workspace_key, workspace_request)
from .context import owned, release, utc_now
from .update import wake_waiting


async def _pulumi_version(ctx: Any, state: AutoState) -> str:
    if not state.pulumi_version:
        with contextlib.suppress(Exception):
            process = await asyncio.create_subprocess_exec(
                str(ctx.settings.engine.pulumi_cli()), "version", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "PULUMI_SKIP_UPDATE_CHECK": "true",
                                                        "HOME": str(ctx.settings.engine.state_dir / "worker")})
            out, _ = await asyncio.wait_for(process.communicate(), 30)
            state.pulumi_version = out.decode().strip().lstrip("v")
    return state.pulumi_version


async def reconcile_workspace(ctx: Any, state: AutoState, body: Any, logger: Any) -> float | None:
    """One pass over a Workspace: the program fetched for its generation, or why not."""
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation") or 0)
    key = (namespace, name)
    status = dict(body.get("status") or {})
    redact = redactor_for(namespace).redact  # as patch_auto_status writes the status, to compare with it

    async def write(ready: tuple[str, str, str], stalled: tuple[str, str, str] | None = None, **fields: Any) -> None:
        conditions = set_conditions(status.get("conditions"), [(READY, *ready)], generation, utc_now())
        if stalled is not None:
            conditions = set_conditions(conditions, [(STALLED, *stalled)], generation, utc_now())
        else:
            conditions = [c for c in conditions if c["type"] != STALLED]
        patch = {"observedGeneration": generation, "conditions": conditions, **fields}
        if any(status.get(k) != v for k, v in patch.items()):
            if await patch_auto_status(ctx, "workspaces", body, patch):
                status.update(patch)

    if meta.get("deletionTimestamp"):
        await write(("False", "Deleting", "Workspace is being deleted"))
        return None
    raw = dict(body.get("spec") or {})
    in_pods = ctx.engine.in_workspace_pods
    ignored = not_applicable(raw, in_pods)
    if (status.get("ignoredFields") or []) != ignored and ignored:
        why = "its workspace pod has no Service and logs at its own level" if in_pods else \
            "the process executor runs updates on the operator's host: they configure PKO's workspace pod"
        auto_event(body, "NotApplicable", f"accepted but not applicable ({why}): {', '.join(ignored)}", warning=True)
    try:
        spec = parse_workspace(raw)
        # Before anything is fetched or run: no workspace pod is made from a forbidden template.
        forbidden = template_issues(raw, "spec", ctx.settings.reserved_placement) if in_pods else []
        if forbidden:
            raise SpecInvalid(forbidden)
    except SpecInvalid as err:
        if (condition(status, STALLED) or {}).get("message") != redact(str(err)):
            auto_event(body, "StackInitializationFailure", str(err), warning=True)
        await write(("False", err.reason, str(err)), ("True", err.reason, str(err)), ignoredFields=ignored or None)
        return None
    program = materialised_program(ctx, body)
    if program is not None and workspace_ready(body):
        wake_waiting(ctx, state, namespace, name)
        return None

    def retry() -> float:
        count = state.failures.get(key, 0)
        state.failures[key] = count + 1
        return RETRY_SECONDS[min(count, len(RETRY_SECONDS) - 1)]

    try:
        # The pod executor's pod reads its Secrets itself (the kubelet): the operator sees plain values only.
        env = literal_env(spec) if in_pods else \
            (await resolve_env(spec, namespace, ctx.kube.secret_data, ctx.kube.configmap_data)).env
        creds = await git_credentials(getattr(spec.source, "auth", None), namespace, ctx.kube.secret_data)
    except RefError as err:
        await write(("False", "WaitingForReference", str(err)), ignoredFields=ignored or None)
        return retry()
    problem = misplaced_backend(raw, env, in_pods)
    invalid = [problem] if problem else []
    for stack in spec.stacks if not in_pods else ():  # the pod's agent resolves them, from its environment
        try:
            stack_config(stack, env, namespace)
        except RefError as err:
            invalid.append(SpecIssue(str(err).split(":")[0], str(err).split(": ", 1)[-1],
                                     "set that variable in spec.env or spec.envFrom"))
    if invalid:
        message = "; ".join(str(i) for i in invalid)
        reason = "SpecInvalid" if problem else "InitializationFailed"
        if (condition(status, STALLED) or {}).get("message") != redact(message):
            auto_event(body, "StackInitializationFailure", message, warning=True)
        await write(("False", reason, message), ("True", reason, message), ignoredFields=ignored or None)
        return None

    if program is None:
        await write(("False", "Initializing", "Fetching the program"), ignoredFields=ignored or None)
        try:
            program, revision = await _fetch_program(ctx, state, spec, namespace, name, generation, meta, creds)
        except SourceError as err:
            if (condition(status, READY) or {}).get("message") != redact(str(err)):
                auto_event(body, "SourceUnavailable", str(err), warning=True)
            await write(("False", "SourceUnavailable", str(err)), ignoredFields=ignored or None)
            return retry()
        auto_event(body, "Initialized", f"Initialized workspace {name!r} at {revision}")
    if in_pods:
        await write(("False", "Initializing", "Starting the workspace pod"), ignoredFields=ignored or None)
        failure = await ctx.engine.prepare(workspace_request(namespace, name, raw, spec, program))
        if failure:
            if (condition(status, READY) or {}).get("message") != redact(failure):
                auto_event(body, WORKSPACE_FAILED, failure, warning=True)
            await write(("False", WORKSPACE_FAILED, failure), ignoredFields=ignored or None)
            return retry()
    state.failures.pop(key, None)
    await write(("True", "Succeeded", ""), pulumiVersion=await _pulumi_version(ctx, state) or None,
                ignoredFields=ignored or None)
    logger.info("workspace %s/%s ready", namespace, name)
    wake_waiting(ctx, state, namespace, name)
    return None


async def _fetch_program(ctx: Any, state: AutoState, spec: WorkspaceSpec, namespace: str, name: str, generation: int,
                         meta: dict[str, Any], creds: Any) -> tuple[Program, str]:
    """The program of this generation, made ready and recorded (the marker); SourceError says why not.
    A pod executor's spec.local is a directory of the pod itself: nothing to fetch."""
    root = workspace_dir(ctx, namespace, name)
    dest = root / f"{generation}-{uuid.uuid4().hex[:8]}"
    marker: dict[str, Any] = {"uid": meta.get("uid"), "generation": meta.get("generation")}
    if ctx.engine.in_workspace_pods and isinstance(spec.source, LocalSource):
        program, revision = Program(local_dir=spec.source.dir), f"local:{spec.source.dir}"
        marker["local_dir"] = spec.source.dir
        dest.mkdir(parents=True, exist_ok=True)
    else:
        try:
            project, revision = await ctx.sources.run(namespace, materialise, spec, dest / "src", creds,
                                                      root / HOST_KEY_PIN_FILE, ctx.settings.allow_operator_refs,
                                                      ctx.sources.max_bytes)
        except SourceError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        program = Program(project, dest / "src")
        marker.update(project=str(project), source_root=str(dest / "src"))
    marker["revision"] = revision
    partial = root / (MARKER + ".partial")
    partial.write_text(json.dumps(marker))
    partial.replace(root / MARKER)
    _remove_old_workdirs(ctx, state, root, dest, namespace, name)
    return program, revision


def _remove_old_workdirs(ctx: Any, state: AutoState, root: Path, keep: Path, namespace: str, name: str) -> None:
    """Earlier generations' programs go, unless an Update of this Workspace is under way."""
    if ctx.engine.busy(workspace_key(namespace, name)) or state.using.get((namespace, name)):
        return
    for entry in root.iterdir():
        if entry.is_dir() and entry != keep:
            shutil.rmtree(entry, ignore_errors=True)


@kopf.on.event(AUTO_GROUP, AUTO_VERSION, "workspaces")
async def workspace_event(type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, logger: Any,
                          **_: Any) -> None:
    ctx, state = memo.ctx, state_of(memo)
    key = (namespace, name)
    if type == "DELETED" or not owned(ctx, body):  # gone, or another shard's now: let it go
        loop = state.workspaces.pop(key, None)
        if loop is not None and loop.task is not None:
            loop.task.cancel()
        if not ctx.engine.busy(workspace_key(namespace, name)):
            shutil.rmtree(workspace_dir(ctx, namespace, name), ignore_errors=True)
        if type == "DELETED":  # what a foreground delete's run kept from the garbage collector goes now
            await release(ctx, namespace, workspace_key(namespace, name))
        ctx.engine.forget(workspace_key(namespace, name))
        return
    body = dict(body)
    if workspace_ready(body) and materialised_program(ctx, body) is not None:
        wake_waiting(ctx, state, namespace, name)
    loop = state.workspaces.get(key)
    if loop is None:
        async def run(current: Any) -> float | None:
            try:
                return await reconcile_workspace(ctx, state, current, logger)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a bug or API outage must not stop the Workspace's passes
                logger.error("workspace pass failed: %s", LOG_REDACTOR.redact(f"{err.__class__.__name__}: {err}"))
                return 30.0

        loop = state.workspaces[key] = ObjectLoop(run)
    meta = body["metadata"]
    loop.feed(body, (meta.get("uid"), meta.get("generation"), bool(meta.get("deletionTimestamp"))))
