"""The Update controller (PKO v2's `auto.pulumi.com/v1alpha1` Update) on the engine port.

An Update runs exactly one operation (preview, up, refresh, destroy) of `spec.stackName` in its
Workspace, through `engine.port.Engine` only, and records it as PKO v2 does: conditions
Progressing/Failed/Complete with PKO's reasons, startTime, endTime, message, permalink, projectInfo,
the outputs of an up in an immutable Secret `<update>-stack-outputs` it owns, and its deletion
`ttlAfterCompleted` after completing. An Update whose Workspace is not Ready waits for it
(`wake_waiting`, called by the Workspace controller).

An Update runs once. A completed one is never run again (a restart sees Complete=True); one found
Progressing with no run in this process was interrupted and is marked Failed/Aborted, as PKO does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from ..api import AUTO_GROUP, AUTO_VERSION
from ..api.auto_conditions import COMPLETE, PROGRESSING, is_true, set_conditions
from ..api.status import rfc3339
from ..api.update import (UpdateSpec, aborted, finished, outputs_secret, parse_update, progressing, ttl_remaining,
                          waiting)
from ..api.validation import SpecInvalid
from ..api.workspace import WorkspaceSpec, parse_workspace, workspace_ready
from ..engine.port import UpdateRequest, UpdateResult
from ..services.redaction import LOG_REDACTOR, redactor_for
from ..sources.project import project_info
from ..sources.references import RefError
from ..sources.workspace_program import resolve_env, stack_config
from .auto_state import (AutoState, Program, auto_event, materialised_program, patch_auto_status, state_of,
                         workspace_dir, workspace_key, workspace_request)
from .context import owned, utc_now
from .stack_session import file_backend_root

LOG = logging.getLogger(__name__)
# What PKO's events say, per operation: (past tense for success, verb for failure).
_WORDS = {"preview": ("Previewed", "preview"), "up": ("Updated", "update"), "refresh": ("Refreshed", "refresh"),
          "destroy": ("Destroyed", "destroy")}


def failure_reason(result: UpdateResult) -> str:
    """PKO's Failed reason for an engine failure: its known errors, else the gRPC code Unknown."""
    if result.outcome == "conflict":
        return "UpdateConflict"
    if result.outcome == "cancelled":
        return "Canceled"
    if "invalid access token" in result.message:
        return "InvalidAccessToken"
    return "Unknown"


def wake_waiting(ctx: Any, state: AutoState, namespace: str, workspace: str) -> None:
    """The Updates that waited for this Workspace go now."""
    names = state.waiting.pop((namespace, workspace), set())
    for name in names:
        asyncio.create_task(_restart_update(ctx, state, namespace, name))


async def _restart_update(ctx: Any, state: AutoState, namespace: str, name: str) -> None:
    body = await ctx.kube.get_custom(AUTO_GROUP, AUTO_VERSION, "updates", namespace, name)
    if body is not None:
        _handle_update(ctx, state, body)


def _handle_update(ctx: Any, state: AutoState, body: Any) -> None:
    """Decide what an Update event means; anything long runs in a task of its own."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    status = body.get("status") or {}
    if key in state.runs and not state.runs[key].done():
        return
    if meta["name"] in state.waiting.get((key[0], (body.get("spec") or {}).get("workspaceName")), ()):
        return  # started when its Workspace turns Ready (wake_waiting)
    if state.done.get(key) == meta.get("uid") or is_true(status, COMPLETE):
        _schedule_expiry(ctx, state, body)
        return
    if is_true(status, PROGRESSING):
        # Progressing with no run here: the run was interrupted (operator restart). PKO: Aborted.
        state.runs[key] = _logged(_abort(ctx, state, body), key)
        return
    state.runs[key] = _logged(run_update(ctx, state, body), key)


def _logged(coroutine: Any, key: tuple[str, str]) -> asyncio.Task:
    """A task whose failure (a bug, the API unreachable) is logged; the Update is then found Progressing
    with no run, and marked Aborted, as PKO does after a failed reconcile."""
    def report(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            LOG.error("[%s/%s] update failed: %s", *key, LOG_REDACTOR.redact(f"{err.__class__.__name__}: {err}"))
    task = asyncio.create_task(coroutine)
    task.add_done_callback(report)
    return task


async def _abort(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    message = "the update was interrupted (operator restart) and is not run again; create a new Update"
    status = body.get("status") or {}
    patch = {"observedGeneration": meta.get("generation"), "message": message, "endTime": rfc3339(utc_now()),
             "conditions": set_conditions(status.get("conditions"), aborted("Aborted"), meta.get("generation", 0),
                                          utc_now())}
    auto_event(body, "UpdateFailed", f"Update {meta['name']!r} was interrupted: {message}", warning=True)
    await _finish(ctx, state, body, patch)


async def _finish(ctx: Any, state: AutoState, body: Any, patch: dict[str, Any]) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    if await patch_auto_status(ctx, "updates", body, patch):
        state.done[key] = meta.get("uid", "")
        _schedule_expiry(ctx, state, {**body, "status": {**(body.get("status") or {}), **patch}})


def _schedule_expiry(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    try:
        ttl = parse_update(body.get("spec")).ttl_seconds
    except SpecInvalid:
        ttl = None
    remaining = ttl_remaining(body.get("status"), ttl, utc_now())
    if remaining is None or (key in state.expiring and not state.expiring[key].done()):
        return

    async def expire() -> None:
        await asyncio.sleep(max(0.0, remaining))
        # As PKO: the Event first, while the Update still exists, then the deletion.
        auto_event(body, "UpdateExpired", "ttl expired and was deleted")
        await ctx.kube.delete_custom(AUTO_GROUP, AUTO_VERSION, "updates", meta["namespace"], meta["name"],
                                     uid=meta.get("uid", ""))

    state.expiring[key] = asyncio.create_task(expire())


async def run_update(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation") or 0)
    status = dict(body.get("status") or {})

    async def write(conditions: list[tuple[str, str, str, str]], **fields: Any) -> None:
        patch = {"observedGeneration": generation,
                 "conditions": set_conditions(status.get("conditions"), conditions, generation, utc_now()), **fields}
        await patch_auto_status(ctx, "updates", body, patch)
        status.update(patch)

    try:
        spec = parse_update(body.get("spec"))
    except SpecInvalid as err:
        auto_event(body, "UpdateFailed", str(err), warning=True)
        await _finish(ctx, state, body, {"observedGeneration": generation, "message": str(err),
                                         "conditions": set_conditions(status.get("conditions"), aborted("SpecInvalid"),
                                                                      generation, utc_now())})
        return
    await write(progressing())
    workspace = await ctx.kube.get_custom(AUTO_GROUP, AUTO_VERSION, "workspaces", namespace, spec.workspace_name)
    program = materialised_program(ctx, workspace) if workspace is not None else None
    if workspace is None or not workspace_ready(workspace) or program is None:
        state.waiting.setdefault((namespace, spec.workspace_name), set()).add(name)
        await write(waiting("WorkspaceNotFound" if workspace is None else "WorkspaceNotReady"))
        if workspace is not None and workspace_ready(workspace):
            # Ready, but fetched by another process (or before a restart): fetch it here.
            loop = state.workspaces.get((namespace, spec.workspace_name))
            if loop is not None:
                loop.wakeup.set()
        return
    ws_key = (namespace, spec.workspace_name)
    state.using[ws_key] = state.using.get(ws_key, 0) + 1
    run_dir = workspace_dir(ctx, namespace, spec.workspace_name) / "runs" / f"{name}-{uuid.uuid4().hex[:6]}"
    try:
        started = utc_now()
        result, request = await _run_engine(ctx, spec, workspace, namespace, program, run_dir)
        ended = utc_now()
        fields: dict[str, Any] = {"startTime": rfc3339(started), "endTime": rfc3339(ended)}
        info = project_info(program.project) if program.project else None
        if info:
            fields["projectInfo"] = info
        if result.permalink:
            fields["permalink"] = result.permalink
        past, verb = _WORDS[spec.type]
        if result.ok and spec.type == "destroy" and spec.remove and request is not None:
            removed = await ctx.engine.remove_stack(request)
            if not removed.ok:
                result = dataclasses.replace(removed, message=f"the stack was destroyed but not removed: {removed.message}")
        problem = None
        if result.ok and spec.type == "up" and result.outputs:
            problem = await _write_outputs(ctx, body, result)
            if problem is None:
                fields["outputs"] = f"{name}-stack-outputs"
        if result.ok and problem is None:
            fields["message"] = spec.message
            conditions = finished(None)
            auto_event(body, "UpdateSucceeded", f"{past} stack {spec.stack_name!r}")
        else:
            message = problem or f"{spec.type} failed: {result.message}"
            fields["message"] = message
            conditions = finished("Unknown" if problem else failure_reason(result))
            auto_event(body, "UpdateFailed", f"Failed to {verb} stack {spec.stack_name!r}: {message}", warning=True)
        await _finish(ctx, state, body, {"observedGeneration": generation, **fields,
                                         "conditions": set_conditions(status.get("conditions"), conditions,
                                                                      generation, utc_now())})
    finally:
        state.using[ws_key] -= 1
        shutil.rmtree(run_dir, ignore_errors=True)


async def _run_engine(ctx: Any, spec: UpdateSpec, workspace: dict[str, Any], namespace: str, program: Program,
                      run_dir: Path) -> tuple[UpdateResult, UpdateRequest | None]:
    """The operation through the engine port; a workspace that cannot be resolved now fails the Update."""
    options = dict(stack_name=spec.stack_name, create=True, refresh=spec.refresh, targets=spec.target,
                   target_dependents=spec.target_dependents, message=spec.message, run_program=spec.run_program,
                   real_outputs=spec.type == "up", expect_no_changes=spec.expect_no_changes,
                   continue_on_error=spec.continue_on_error, replace=spec.replace, parallel=spec.parallel)
    try:
        raw = dict(workspace.get("spec") or {})
        ws: WorkspaceSpec = parse_workspace(raw)
        if ctx.engine.in_workspace_pods:
            request = workspace_request(namespace, spec.workspace_name, raw, ws, program, **options)
        else:
            request = await _process_request(ctx, spec, ws, namespace, program, run_dir, options)
    except (SpecInvalid, RefError, ApiException) as err:
        text = f"HTTP {err.status} {err.reason}" if isinstance(err, ApiException) else str(err)
        return UpdateResult("failed", text), None  # masked where it is shown, as every status message
    operation = {"preview": ctx.engine.preview, "up": ctx.engine.up, "refresh": ctx.engine.refresh,
                 "destroy": ctx.engine.destroy}[spec.type]
    return await operation(request), request


async def _process_request(ctx: Any, spec: UpdateSpec, ws: WorkspaceSpec, namespace: str, program: Program,
                           run_dir: Path, options: dict[str, Any]) -> UpdateRequest:
    """The process executor's request: the operator reads the workspace's environment and config, and
    mints a kubeconfig for its ServiceAccount (the forked worker has no pod identity)."""
    env = await resolve_env(ws, namespace, ctx.kube.secret_data, ctx.kube.configmap_data)
    stack = ws.stack(spec.stack_name)
    config, secret_config = stack_config(stack, env.env, namespace)
    values = dict(env.env)
    minted = await ctx.kube.service_account_kubeconfig(namespace, ws.service_account_name)
    if minted is None:
        raise RefError(f"spec.serviceAccountName of Workspace {spec.workspace_name!r}: ServiceAccount "
                       f"{ws.service_account_name!r} not found in namespace {namespace!r}")
    redactor_for(namespace).add(minted[1])
    run_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = run_dir / "kubeconfig"
    kubeconfig.write_text(minted[0])
    kubeconfig.chmod(0o600)
    values["KUBECONFIG"] = str(kubeconfig)
    return UpdateRequest(
        stack_key=workspace_key(namespace, spec.workspace_name), project_dir=str(program.project), env=values,
        secret_env=tuple(sorted(env.secret_env)), config=config, secret_config=secret_config,
        secrets_provider=stack.secrets_provider if stack else "", environments=stack.environment if stack else (),
        file_backend_root=await file_backend_root(ctx, namespace, values.get("PULUMI_BACKEND_URL", "")), **options)


async def _write_outputs(ctx: Any, body: Any, result: UpdateResult) -> str | None:
    """Create the outputs Secret; the problem, or None. Never a value in a message."""
    meta = body["metadata"]
    secret, missing = outputs_secret(meta["namespace"], meta["name"], meta.get("uid", ""), result.outputs,
                                     result.real_outputs)
    if missing:
        auto_event(body, "UpdateFailed", f"secret outputs {', '.join(missing)} could not be read "
                   f"({result.outputs_error or 'no values'}): left out of the outputs Secret",
                   warning=True)
    try:
        await ctx.kube.create_secret(meta["namespace"], secret)
    except ApiException as err:
        if err.status == 409:
            existing = await ctx.kube.get_secret(meta["namespace"], secret["metadata"]["name"])
            owners = ((existing or {}).get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("uid") == meta.get("uid") for o in owners):
                return None
        return (f"the up succeeded but its outputs Secret {secret['metadata']['name']!r} could not be created: "
                f"HTTP {err.status} {err.reason}")
    return None


# --- Kopf wiring --------------------------------------------------------------------------------


@kopf.on.event(AUTO_GROUP, AUTO_VERSION, "updates")
async def update_event(type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    ctx, state = memo.ctx, state_of(memo)
    key = (namespace, name)
    if type == "DELETED" or not owned(ctx, body):
        # PKO: a deleted Update is cancelled; its run (if any) is interrupted, nothing is written. One
        # relabelled into another shard is that shard's from now on.
        run = state.runs.pop(key, None)
        if run is not None and not run.done():
            run.cancel()
        for task in (state.expiring.pop(key, None),):
            if task is not None:
                task.cancel()
        state.done.pop(key, None)
        for names in state.waiting.values():
            names.discard(name)
        return
    _handle_update(ctx, state, dict(body))
