"""The Stack controller (`pulumi.com/v1` Stack): a daemon per Stack, its wakeups, and its finalizer.

Each Stack has one daemon that loops `reconcile_stack` and sleeps until the plan's requeue time or
until something relevant changes (the Stack itself, its Program, its Flux source, a prerequisite),
which `Registry.wake` signals. A pass parses the spec, resolves its references, finds the source's
revision, asks planning whether to run, and hands a run to stack_update.py. Deletion is Kopf's
finalizer (PKO's name, so PKO-managed Stacks carry over).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import kopf

from ..api import GROUP, SHUTDOWN_DRAIN_SECONDS, VERSION
from ..api import status as st
from ..api.stack import (WATCHED_FLUX_KINDS, StackSpec, local_source_issue, misplaced_file_backend,
                         not_applicable_fields, operator_ref_issues, parse_stack_spec, unused_sources,
                         workspace_template_issues)
from ..api.status import condition
from ..api.validation import STALLED_SPEC_INVALID, SpecInvalid, SpecIssue
from ..decisions.planning import (check_prerequisite, drift_check_due, ever_deployed, new_revision_verdict,
                                  plan_finalize, plan_on_prerequisite_outputs, plan_stack, prerequisite_digests,
                                  prerequisites_verdict, soonest, suspended_verdict, terminating_namespace_message)
from ..decisions.rollout import parse_waves
from ..services import metrics
from ..services.events import HOST, post_event
from ..services.kube import FLUX_GROUP, FLUX_PLURALS, NamespaceNotServed
from ..services.redaction import LOG_REDACTOR
from ..sources.archive import SourceError
from ..sources.flux import SourceNotReady
from ..sources.references import RefError, Resolved, resolve_stack
from .context import (RETRY_REFS_SECONDS, Context, Registry, Watched, in_shard, intent, release, stack_key, utc_now,
                      woken)
from .stack_rollout import gate_on_rollout
from .stack_session import (StackSession, confinement_stalled, materialise_program, source_revision, stack_state_dir,
                            update_request, wait_for_reference)
from .stack_update import (check_drift, gated_update, outputs_secret_problem, recover_interrupted,
                           run_stack_update, run_watched)


async def reconcile_stack(ctx: Context, body: Any, logger: Any) -> float | None:
    """One pass; returns seconds until the next pass is due (None: only when something changes)."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return None  # the finalizer owns a Stack being deleted: nothing more runs, and no stall of ours hides its own
    session = StackSession(ctx, body, logger)
    try:
        return await _reconcile(session, body)
    except NamespaceNotServed as err:
        # Nothing runs until someone grants it: looked at again as a missing reference is.
        await session.stall(st.STALLED_NAMESPACE_NOT_SERVED, str(err), st.EVENT_CONFIG_INVALID)
        return RETRY_REFS_SECONDS


def refused_issues(ctx: Context, spec: StackSpec) -> list[SpecIssue]:
    """What of a Stack's spec this operator refuses to run at all (a team may not have it)."""
    refused = [local_source_issue(spec, ctx.engine.in_workspace_pods),
               *workspace_template_issues(spec, ctx.engine.in_workspace_pods, ctx.settings.reserved_placement)]
    if not ctx.settings.allow_operator_refs:
        refused += operator_ref_issues(spec, ctx.engine.in_workspace_pods)
    return [issue for issue in refused if issue]


async def _reconcile(session: StackSession, body: Any) -> float | None:
    ctx = session.ctx
    session.watched.seen = intent(body)
    raw_spec = body.get("spec") or {}
    try:
        spec = parse_stack_spec(dict(raw_spec), session.namespace)
    except SpecInvalid as err:
        await session.stall(err.reason, str(err), st.EVENT_CONFIG_INVALID)
        return None
    issues = refused_issues(ctx, spec)
    if issues:
        # Before anything is resolved or run: no workspace pod is made from a forbidden template.
        await session.stall(SpecInvalid(issues).reason, "; ".join(str(issue) for issue in issues),
                            st.EVENT_CONFIG_INVALID)
        return None
    inapplicable = not_applicable_fields(dict(raw_spec), ctx.engine.in_workspace_pods)
    unused = unused_sources(spec)
    if (session.status.get("ignoredFields") or []) != inapplicable + unused:
        if inapplicable:
            post_event(body, st.EVENT_CONFIG_INVALID,
                       f"accepted but not applicable to Strata's engine: {', '.join(inapplicable)}")
        if unused:
            chosen = {"git": "spec.projectRepo", "flux": "spec.fluxSource", "program": "spec.programRef"}
            post_event(body, st.EVENT_CONFIG_INVALID,
                       f"several sources: {chosen[spec.source_kind]} is used (PKO's order: git, Flux, Program); "
                       f"ignored: {', '.join('spec.' + f for f in unused)}")
        # None: the fields are gone, drop the list
        await session.write(ignoredFields=(inapplicable + unused) or None)
    watched = session.watched
    watched.program = spec.program_ref.name if spec.program_ref and spec.source_kind == "program" else ""
    watched.flux = ((spec.flux_source.source_ref.kind, spec.flux_source.source_ref.name)
                    if spec.flux_source and spec.source_kind == "flux" else ("", ""))
    watched.prerequisites = tuple(p.name for p in spec.prerequisites)
    was_suspended = (condition(session.status, st.READY) or {}).get("reason") == st.SUSPENDED
    if spec.suspend:
        # Nothing is resolved, fetched or run; a run already going finishes first.
        if not was_suspended:
            post_event(body, st.EVENT_SUSPENDED, "suspended: no updates run until spec.suspend is false")
        await session.write(suspended_verdict(session.status.get("lastUpdate")))
        return None
    if was_suspended:
        post_event(body, st.EVENT_RESUMED, "resumed: running whatever changed while suspended")

    try:
        resolved = await resolve_stack(spec, session.namespace, ctx.kube.secret_data, ctx.kube.configmap_data,
                                       ctx.settings.allow_operator_refs, ctx.engine.in_workspace_pods)
    except RefError as err:
        return await wait_for_reference(session, err)
    misplaced = misplaced_file_backend(spec, resolved.env.get("PULUMI_BACKEND_URL", ""), ctx.engine.in_workspace_pods)
    if misplaced is not None:
        await session.stall(STALLED_SPEC_INVALID, str(misplaced), st.EVENT_CONFIG_INVALID)
        return None
    try:
        waiting = await recover_interrupted(session, spec, resolved)
    except RefError as err:
        return await wait_for_reference(session, err)
    if waiting is not None:
        return waiting

    poll = float(session.resync_seconds(spec)) if spec.polled else None
    try:
        revision, handle = await source_revision(session, spec, resolved)
    except SourceNotReady as err:
        # Woken by the source's own events once Flux has its artifact.
        await session.write(st.Verdict("reconciling", st.RECONCILING_SOURCE, str(err)))
        return None
    except SourceError as err:
        auth = any(s in str(err) for s in ("Authentication failed", "could not read Username", "403", "401",
                                           "Permission denied (publickey"))
        await session.stall(st.STALLED_SOURCE_UNAVAILABLE, str(err),
                            st.EVENT_GIT_AUTH_FAILURE if auth else None)
        return poll

    # Before anything is fetched or run, after the source is known to exist (PKO's order: a missing source is
    # said first): a program that could not be kept from the operator's or other teams' files never runs.
    if await confinement_stalled(session, resolved.env.get("PULUMI_BACKEND_URL", "")):
        return RETRY_REFS_SECONDS  # looked at again: the platform may annotate the namespace meanwhile
    plan = plan_stack(spec, session.generation, session.requests, session.status.get("lastUpdate"), revision,
                      utc_now(), ctx.settings.stall_after_failures, ctx.settings.min_resync_seconds)
    announced = new_revision_verdict(session.status, plan, revision)
    if announced is not None:  # before anything slow: Flux may be checking this Stack's health right now
        await session.write(announced)
    others = {p.name: await ctx.kube.get_stack(session.namespace, p.name) for p in spec.prerequisites}
    consumed = prerequisite_digests(spec.prerequisites, others)
    plan = plan_on_prerequisite_outputs(spec, plan, session.status.get("lastUpdate"), consumed)
    session.consumed = consumed
    if plan.run is None:
        due, next_check = drift_check_due(spec, session.status.get("lastUpdate"), session.status.get("drift"),
                                          utc_now(), ctx.settings.min_resync_seconds)
        if due:
            return await check_drift(session, spec, resolved, plan, revision, handle)
        await session.write(plan.verdict)
        return soonest(plan.requeue_after, next_check)

    waves = parse_waves(handle) if spec.source_kind == "program" else None
    watched.rollout_waiting = False
    if waves and (session.status.get("lastUpdate") or {}).get("lastSuccessfulCommit") != revision:
        held = await gate_on_rollout(session, handle, waves, revision)
        if held is not None:
            watched.rollout_waiting = True
            await session.write(held)
            return None

    checks = []
    for prereq in spec.prerequisites:
        check = check_prerequisite(prereq, others[prereq.name], utc_now())
        if check.rerun_request:
            current = ((others[prereq.name] or {}).get("metadata", {}).get("annotations") or {}).get(
                "pulumi.com/reconciliation-request")
            if current != check.rerun_request:
                await ctx.kube.annotate_stack(session.namespace, prereq.name,
                                              {"pulumi.com/reconciliation-request": check.rerun_request})
        checks.append(check)
    blocked = prerequisites_verdict(checks)
    if blocked is not None:
        await session.write(blocked)
        return None

    if plan.run == "up" and spec.outputs_secret is not None:
        problem = await outputs_secret_problem(session, spec.outputs_secret.name)
        if problem is not None:
            await session.stall(st.STALLED_OUTPUTS_SECRET, problem, st.EVENT_OUTPUT_FAILURE)
            return RETRY_REFS_SECONDS

    if spec.manual_approval and plan.run == "up":
        return await gated_update(session, spec, resolved, plan, revision, handle)
    return await run_stack_update(session, spec, resolved, plan, revision, handle)


# --- Kopf wiring ------------------------------------------------------------------------------


# A stopping operator (an upgrade, a restart, a shard giving a Stack up) lets a running update finish
# rather than cancel it and run it again under its successor: Kopf signals each Stack's daemon, waits
# SHUTDOWN_DRAIN_SECONDS for it to return, then cancels it.
@kopf.daemon(GROUP, VERSION, "stacks", cancellation_backoff=SHUTDOWN_DRAIN_SECONDS, cancellation_timeout=10.0,
             initial_delay=0, when=in_shard)
async def stack_daemon(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, logger: Any,
                       stopped: kopf.DaemonStopped, **_: Any) -> None:
    ctx: Context = memo.ctx
    watched = ctx.registry.stacks.setdefault((namespace, name), Watched())
    on_stop = asyncio.create_task(_stop_waiting(ctx, stack_key(namespace, name), watched, stopped))
    metrics.STACKS_ACTIVE.inc()
    try:
        while not stopped:
            watched.wakeup.clear()
            try:
                async with ctx.passes.held(namespace):
                    if stopped:
                        break
                    delay = await reconcile_stack(ctx, body, logger)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a bug or API outage must not kill the daemon
                logger.error("reconcile failed: %s", LOG_REDACTOR.redact(f"{type(err).__name__}: {err}"))
                delay = RETRY_REFS_SECONDS
            if delay == 0.0:
                continue
            await woken(watched.wakeup, delay)
    finally:
        on_stop.cancel()
        metrics.STACKS_ACTIVE.dec()
        ctx.registry.stacks.pop((namespace, name), None)


async def _stop_waiting(ctx: Context, key: str, watched: Watched, stopped: kopf.DaemonStopped) -> None:
    """Once the daemon is told to stop: an idle one wakes to return at once; a deleted Stack's running
    update is cancelled (its finalizer destroys or releases the stack), any other running update finishes."""
    await stopped.wait()
    if stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
        await ctx.engine.cancel(key)
    watched.wakeup.set()


# The event handlers are coroutines: Kopf runs a plain function on a thread, where iterating the registry
# raced the daemons adding and removing Stacks ("dictionary changed size during iteration", the event's
# wake-ups lost) and asyncio.Event.set is not thread-safe.
@kopf.on.event(GROUP, VERSION, "stacks")
async def stack_changed(namespace: str, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo,
                        **_: Any) -> None:
    if type == "DELETED":
        memo.ctx.engine.forget(stack_key(namespace, name))
    registry: Registry = memo.ctx.registry
    registry.wake(namespace, name, body)
    registry.wake_where(namespace, lambda w: name in w.prerequisites)
    program = ((body.get("spec") or {}).get("programRef") or {}).get("name")
    if program:  # a Stack of a later wave may now go
        registry.wake_where(namespace, lambda w: w.rollout_waiting and w.program == program)


def _flux_changed(kind: str):
    async def handler(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
        memo.ctx.registry.wake_where(namespace, lambda w: w.flux == (kind, name))
    return handler


for _kind in WATCHED_FLUX_KINDS:
    kopf.on.event(FLUX_GROUP, FLUX_PLURALS[_kind], id=f"flux-{FLUX_PLURALS[_kind]}")(_flux_changed(_kind))


async def _destroy_project(session: StackSession, spec: StackSpec, resolved: Resolved, work: Path,
                           logger: Any) -> Path:
    """The program to destroy with: the source as it is now, else the last successful update's copy."""
    try:
        _, handle = await source_revision(session, spec, resolved)
        return await materialise_program(session, spec, handle, work / "src", resolved)
    except (SourceError, SpecInvalid) as err:
        project = stack_state_dir(session.ctx, session.namespace, session.name) / "last-successful"
        if not project.is_dir():
            message = (f"cannot destroy: the source is unavailable ({err}) and no successful update left a "
                       f"copy of the program; restore the source, or remove the finalizer {session.ctx.settings.shard.finalizer} to "
                       "abandon the stack's resources")
            await session.stall(st.STALLED_DESTROY_BLOCKED, message, st.EVENT_UPDATE_FAILURE)
            raise kopf.TemporaryError(session.redactor.redact(message), delay=60) from None
        logger.info("source unavailable; destroying from the last successful update's program")
        return project


@kopf.on.delete(GROUP, VERSION, "stacks", when=in_shard)
async def finalize_stack(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, logger: Any,
                         retry: int, **_: Any) -> None:
    """Destroy then `stack rm` with destroyOnFinalize; never destroy without it. Never stuck silently."""
    ctx: Context = memo.ctx
    session = StackSession(ctx, body, logger)
    try:
        spec: StackSpec | None = parse_stack_spec(dict(body.get("spec") or {}), namespace)
    except SpecInvalid:
        spec = None
    decision = plan_finalize(spec, refused_issues(ctx, spec) if spec else [], session.status)
    stack_dir = stack_state_dir(ctx, namespace, name)
    metrics.forget(namespace, name)
    if not decision.destroy or spec is None:
        logger.info("releasing stack without destroy: %s", decision.message)
        await release(ctx, namespace, stack_key(namespace, name))
        shutil.rmtree(stack_dir, ignore_errors=True)
        return
    work = stack_dir / "runs" / f"destroy-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        try:
            resolved = await resolve_stack(spec, namespace, ctx.kube.secret_data, ctx.kube.configmap_data,
                                           ctx.settings.allow_operator_refs, ctx.engine.in_workspace_pods)
            waiting = await recover_interrupted(session, spec, resolved, then="the destroy runs")
            if waiting is not None:
                raise kopf.TemporaryError("the state backend does not answer: the destroy waits for it",
                                          delay=waiting)
            project = await _destroy_project(session, spec, resolved, work, logger)
            request = await update_request(ctx, spec, namespace, name, project, resolved, work, "destroy on finalize")
        except (RefError, NamespaceNotServed) as err:
            # A terminating namespace takes the operator's Roles there too (NamespaceNotServed) with its Secrets.
            if await ctx.kube.namespace_terminating(namespace):
                # What the destroy needs went with the namespace, and nothing new can be created in it.
                await session.stall(st.STALLED_NAMESPACE_TERMINATING, terminating_namespace_message(
                    namespace, name, str(err), (session.status.get("lastUpdate") or {}).get("permalink", "")))
            elif isinstance(err, NamespaceNotServed):
                await session.stall(st.STALLED_NAMESPACE_NOT_SERVED, f"cannot destroy: {err}")
            else:
                await session.stall(st.STALLED_DESTROY_BLOCKED, f"cannot destroy: {err}")
            raise kopf.TemporaryError(session.redactor.redact(str(err)), delay=RETRY_REFS_SECONDS) from None
        post_event(body, st.EVENT_UPDATE_DETECTED, decision.message)
        result = await run_watched(session, spec.backend, "the destroy", ctx.engine.destroy(request), HOST, time.time())
        metrics.UPDATE_DURATION.labels("destroy", result.outcome).observe(result.duration)
        if result.ok:
            result = await ctx.engine.remove_stack(request)
        if result.reason == st.STACK_NOT_FOUND and not ever_deployed(session.status):
            # Its first update failed before the backend had the stack (a wrong backend or credential, say).
            post_event(body, st.EVENT_NOT_FOUND, "the stack was never created in its backend (no update of it "
                       "succeeded): nothing to destroy")
        elif result.reason == st.RECONCILING_BACKEND_UNREACHABLE:
            # The backend's outage (its Warning Event is out): tried again once it may answer, not backed off.
            message = f"{result.message}; the destroy runs again once it answers"
            await session.write(st.Verdict("reconciling", st.RECONCILING_BACKEND_UNREACHABLE, message))
            raise kopf.TemporaryError(session.redactor.redact(message), delay=ctx.settings.backend_probe_seconds)
        elif not result.ok:
            message = f"destroy failed: {result.message}"
            post_event(body, st.EVENT_UPDATE_FAILURE, message, warning=True)
            await session.write(st.Verdict("reconciling", st.RECONCILING_RETRY, message))
            raise kopf.TemporaryError(session.redactor.redact(message), delay=min(600, 10 * 3 ** min(retry, 4)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    await release(ctx, namespace, stack_key(namespace, name))
    shutil.rmtree(stack_dir, ignore_errors=True)
