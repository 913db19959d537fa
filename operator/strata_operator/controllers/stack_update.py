"""A Stack's update, once planning says one runs: through the engine port, with manual approval of the
exact plan (kept in Secrets the Stack owns), the outputs Secret, drift checks and their remediation,
and the status and Events that record the run."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from ..api import GROUP, VERSION
from ..api import status as st
from ..api.stack import StackSpec
from ..api.validation import SpecInvalid
from ..decisions.approval import (APPROVE_ANNOTATION, EVENT_PLAN_READY, EVENT_PLAN_REFUSED, PLAN_LABEL, PLAN_REFUSED,
                                  PlanIdentity, approval_gate, awaiting_message, inputs_digest, plan_chunks,
                                  plan_digest, plan_refused, plan_secret_name, plan_status)
from ..decisions.outputs import (outputs_secret_conflict, outputs_secret_data, outputs_secret_manifest,
                                 secret_needs_write)
from ..decisions.planning import Plan, drift_check_due, drift_status, missing_service_account, plan_stack, soonest
from ..decisions.rollout import parse_waves
from ..engine.pod.executor import packed_source
from ..engine.port import RUNS_AGAIN, UpdateRequest, UpdateResult, register_secret_outputs
from ..services import metrics
from ..services.backend_probe import ProbeScope, backend_address, unreachable
from ..services.events import HOST, post_event
from ..services.redaction import LOG_REDACTOR, Redactor
from ..sources.archive import SourceError
from ..sources.project import project_info
from ..sources.references import RefError, Resolved
from .context import utc_now
from .leadership import discover_namespace
from .stack_rollout import rollout_stacks, write_rollout_progress
from .stack_session import (StackSession, materialise_program, run_directory, stack_state_dir, update_request,
                            wait_for_reference)


def _is_prerequisite(session: StackSession) -> bool:
    """Whether a live Stack in the namespace lists this one as a prerequisite (its secret outputs then
    need real values for their digests)."""
    return any(session.name in watched.prerequisites for (ns, name), watched in session.ctx.registry.stacks.items()
               if ns == session.namespace and name != session.name)


def _api_problem(redactor: Redactor, secret_name: str, verb: str, err: ApiException) -> str:
    if err.status == 403:
        return (f"spec.outputsSecret.name: the operator may not {verb} Secret {secret_name!r} (HTTP 403): grant it "
                "get, create and update on secrets (rbac/clusterrole.yaml)")
    # Only the status line, never the response body (which may quote what was sent), and redacted anyway.
    return redactor.redact(f"spec.outputsSecret.name: {verb} Secret {secret_name!r} failed: HTTP {err.status} "
                           f"{err.reason}")


async def outputs_secret_problem(session: StackSession, secret_name: str) -> str | None:
    """Before an update: why spec.outputsSecret could not receive its outputs (not this Stack's), or None."""
    try:
        existing = await session.ctx.kube.get_secret(session.namespace, secret_name)
    except ApiException as err:
        return _api_problem(session.redactor, secret_name, "read", err)
    return outputs_secret_conflict(existing, session.name, session.meta.get("uid", ""), secret_name)


async def _write_outputs_secret(session: StackSession, secret_name: str, result: UpdateResult) -> str | None:
    """After a successful up: create or replace the outputs Secret when it differs; the problem, or None.
    Nothing here puts a value into a message: API errors are reduced to their status and reason."""
    if result.real_outputs is None:
        return f"spec.outputsSecret: the update succeeded but {result.outputs_error or 'its outputs were not read'}"
    register_secret_outputs(result, session.redactor)
    kube, uid = session.ctx.kube, session.meta.get("uid", "")
    data, skipped = outputs_secret_data(result.real_outputs)
    verb = "read"
    try:
        existing = await kube.get_secret(session.namespace, secret_name)
        conflict = outputs_secret_conflict(existing, session.name, uid, secret_name)
        if conflict is not None:
            return conflict
        version = ((existing or {}).get("metadata") or {}).get("resourceVersion", "")
        wanted = outputs_secret_manifest(session.namespace, secret_name, session.name, uid, data, version)
        if secret_needs_write(existing, wanted):
            verb = "create" if existing is None else "update"
            if existing is None:
                await kube.create_secret(session.namespace, wanted)
            else:
                await kube.replace_secret(session.namespace, secret_name, wanted)
    except ApiException as err:
        return _api_problem(session.redactor, secret_name, verb, err)
    if skipped:
        post_event(session.body, st.EVENT_OUTPUT_FAILURE,
                   f"outputs {', '.join(repr(n) for n in skipped)} are not valid Secret keys (letters, digits, "
                   f"'-', '_', '.'): left out of Secret {secret_name!r}", warning=True)
    return None


async def check_drift(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
                      handle: Any) -> float | None:
    """A refresh preview of a Stack with nothing to run: status.drift, the Drifted condition, an Event
    and the metric; with remediate, an update that refreshes first when something drifted."""
    ctx, body = session.ctx, session.body
    work = stack_state_dir(ctx, session.namespace, session.name) / "runs" / f"drift-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        project = await materialise_program(session, spec, handle, work / "src", resolved)
        request = await update_request(ctx, spec, session.namespace, session.name, project, resolved, work,
                                       "drift check")
        result = await ctx.engine.refresh(dataclasses.replace(request, preview_only=True))
    except (SourceError, SpecInvalid, RefError) as err:
        # Shown as status.drift.error, a nested field write() leaves as it is given.
        result = UpdateResult("failed", session.redactor.redact(str(err)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics.DRIFT_CHECKS.labels(result.outcome).inc()
    now = utc_now()
    before = session.status.get("drift") or {}
    # A check that failed tells nothing new about drift: what the last one found stands.
    drift = drift_status(result.summary, st.rfc3339(now)) if result.ok else {
        **before, "checkedAt": st.rfc3339(now), "error": result.message}
    drift.setdefault("drifted", False)
    remediate = bool(spec.drift_detection and spec.drift_detection.remediate)
    found = f"{st.changes_text(drift.get('changes') or {})} outside Pulumi, found by a refresh preview at " \
            f"{drift['checkedAt']}"
    if drift["drifted"] and (not before.get("drifted") or before.get("changes") != drift["changes"]):
        post_event(body, st.DRIFT_DETECTED, found + ("; remediating with an update" if remediate else ""), warning=True)
    elif before.get("drifted") and not drift["drifted"] and result.ok:
        post_event(body, "DriftResolved", "the refresh preview finds no change made outside Pulumi any more")
    elif not result.ok and before.get("error") != result.message:
        post_event(body, "DriftCheckFailed", f"drift check failed: {result.message}", warning=True)
    metrics.mark_drifted(session.namespace, session.name, drift["drifted"])
    advice = "remediating with an update that refreshes first" if remediate else \
        "run an update with refresh (a reconcile request with spec.refresh) or set spec.driftDetection.remediate"
    await session.write(plan.verdict, drifted=(drift["drifted"], f"{found}; {advice}") if result.ok else None,
                        drift=drift)
    if drift["drifted"] and remediate:
        return await run_stack_update(session, spec.model_copy(update={"refresh": True}), resolved,
                                      Plan("up", f"Drift detected ({st.changes_text(drift['changes'])}): remediating"),
                                      revision, handle)
    _, next_check = drift_check_due(spec, session.status.get("lastUpdate"), drift, now,
                                    ctx.settings.min_resync_seconds)
    return soonest(plan.requeue_after, next_check)


@dataclasses.dataclass(frozen=True)
class _Approval:
    """How a run of a Stack with manual approval goes: save a plan made from `identity`, or apply the
    approved plan `digest` whose bytes are `plan`."""

    identity: PlanIdentity | None = None
    digest: str = ""
    plan: bytes = b""


async def _saved_plan(session: StackSession) -> tuple[bytes, str] | None:
    """(plan, inputs digest) from the Stack's plan Secrets, or None when any is gone or does not hold
    exactly the plan `status.plan` names."""
    saved = session.status.get("plan") or {}
    if not saved.get("digest"):
        return None
    parts = []
    for index in range(int(saved.get("secrets") or 1)):
        data = await session.ctx.kube.secret_bytes(session.namespace, plan_secret_name(session.name, index))
        if data is None:
            return None
        parts.append(data)
    plan = b"".join(part.get("plan", b"") for part in parts)
    if plan_digest(plan) != saved["digest"]:
        return None
    return plan, parts[0].get("inputs", b"").decode()


async def _empty_plan_secrets(session: StackSession, first: int, end: int) -> None:
    """A used or replaced plan is emptied, not deleted (the operator may not delete Secrets); the
    Secrets go with the Stack, which owns them."""
    owner = _owner(session)
    for index in range(first, end):
        await session.ctx.kube.write_secret(session.namespace, plan_secret_name(session.name, index), {},
                                            {PLAN_LABEL: session.name}, owner)


async def _drop_plan(session: StackSession) -> None:
    await _empty_plan_secrets(session, 0, int((session.status.get("plan") or {}).get("secrets") or 0))


def _owner(session: StackSession) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "name": session.name,
            "uid": session.meta.get("uid", ""), "controller": True}


async def gated_update(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
                       handle: Any) -> float | None:
    """spec.approval Manual: preview and keep a plan, wait for its approval, then apply exactly it."""
    stored = await _saved_plan(session)
    identity = PlanIdentity(session.generation, revision, session.requests.pulumi,
                            inputs_digest(resolved.config, resolved.secret_config, resolved.env))
    last = session.status.get("lastUpdate") or {}
    refused = last.get("message", "") if last.get("reason") == PLAN_REFUSED else ""
    gate = approval_gate(session.status.get("plan"), stored[1] if stored else None, identity,
                         (session.meta.get("annotations") or {}).get(APPROVE_ANNOTATION, ""),
                         session.namespace, session.name, refused)
    if gate.action == "wait":
        await session.write(gate.verdict)
        return None
    if gate.action == "apply" and stored is not None:
        return await run_stack_update(session, spec, resolved, dataclasses.replace(plan, message=gate.message),
                                      revision, handle,
                                      _Approval(digest=session.status["plan"]["digest"], plan=stored[0]))
    return await run_stack_update(session, spec, resolved,
                                  dataclasses.replace(plan, run="preview", message=gate.message), revision, handle,
                                  _Approval(identity=identity))


async def _keep_plan(session: StackSession, plan: bytes, summary: dict[str, int],
                     identity: PlanIdentity) -> float | None:
    """Store a saved plan in Secrets the Stack owns, show it in status.plan and wait for its approval
    (a plan that changes nothing is applied on the next pass without one)."""
    chunks = plan_chunks(plan)
    digest = plan_digest(plan)
    for index, chunk in enumerate(chunks):
        extra = {"digest": digest.encode(), "inputs": identity.inputs.encode()} if index == 0 else {}
        await session.ctx.kube.write_secret(session.namespace, plan_secret_name(session.name, index),
                                            {"plan": chunk, **extra}, {PLAN_LABEL: session.name}, _owner(session))
    await _empty_plan_secrets(session, len(chunks), int((session.status.get("plan") or {}).get("secrets") or 0))
    saved = plan_status(identity, digest, summary, len(chunks), st.rfc3339(utc_now()))
    if not st.has_changes(summary):
        await session.write(st.Verdict("reconciling", st.RECONCILING_PROCESSING, "applying a plan with no changes"),
                            plan=saved, currentUpdate=None)
        return 0.0
    message = awaiting_message(saved, session.namespace, session.name)
    post_event(session.body, EVENT_PLAN_READY, message)
    await session.write(approval_gate(saved, identity.inputs, identity, "", session.namespace, session.name).verdict,
                        plan=saved, currentUpdate=None)
    return None


async def run_stack_update(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
                           handle: Any, approval: _Approval | None = None) -> float | None:
    ctx = session.ctx
    waiting = await backend_still_away(session, spec.backend)
    if waiting is not None:
        return waiting
    run = st.RunRecord(name=f"{session.name}-{uuid.uuid4().hex[:8]}", kind=plan.run or "up",
                       generation=session.generation, reconcile_request=session.requests.pulumi, commit=revision,
                       started=utc_now(), host=HOST, prerequisite_digests=tuple(sorted(session.consumed.items())),
                       flux_request=session.requests.flux)
    stack_dir = stack_state_dir(ctx, session.namespace, session.name)
    run_dir = run_directory(session, run.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            project = await materialise_program(session, spec, handle, run_dir / "src", resolved)
        except (SourceError, SpecInvalid) as err:
            await session.stall(st.STALLED_SOURCE_UNAVAILABLE, str(err))
            return float(session.resync_seconds(spec)) if spec.project_repo or spec.polled else None
        # The project's name lets a recovery find this run's stack in the backend once the program is gone.
        run = dataclasses.replace(run, project=(project_info(project) or {}).get("name", ""))
        try:
            request = await update_request(ctx, spec, session.namespace, session.name, project, resolved, run_dir,
                                           st.update_message(plan.message, run.name),
                                           real_outputs=spec.outputs_secret is not None or _is_prerequisite(session))
        except RefError as err:
            return await wait_for_reference(session, err)
        plan_file = run_dir / "plan.json"
        if approval is not None:
            if approval.digest:
                plan_file.write_bytes(approval.plan)
            request = dataclasses.replace(request, plan_file=str(plan_file))
        post_event(session.body, st.EVENT_UPDATE_DETECTED, plan.message, revision=revision)
        await session.write(st.Verdict("reconciling", st.RECONCILING_PROCESSING, "stack is being processed"),
                            currentUpdate=st.current_update(run))
        result = await run_watched(session, spec.backend, f"the {run.kind} {run.name}",
                                   ctx.engine.preview(request) if run.kind == "preview" else ctx.engine.up(request),
                                   run.host, run.started.timestamp())
        if result.reason == st.UPDATE_INTERRUPTED and run.kind == "up":
            result = await _finished_before_lost(session, request, run, result)
        metrics.UPDATE_DURATION.labels(run.kind, result.outcome).observe(result.duration)
        if approval is not None and approval.identity is not None and result.ok:
            return await _keep_plan(session, plan_file.read_bytes(), result.summary, approval.identity)
        fields: dict[str, Any] = {"currentUpdate": None, "lastHandledReconcileAt": session.requests.flux}
        if result.ok:
            fields.update(await _succeeded_fields(session, spec, run, result))
            if result.lock_left:
                post_event(session.body, st.EVENT_LOCK_LEFT, (
                    f"the {run.kind} {run.name} finished, but the state backend did not answer as it deleted the "
                    "stack's lock: the operator deletes it before the Stack's next operation"), warning=True)
            fields["projectInfo"] = project_info(project)
            if run.kind == "up":
                _keep_last_successful(project, stack_dir / "last-successful")
                if session.status.get("plan"):  # applied, or no longer wanted (approval turned off)
                    await _drop_plan(session)
                    fields["plan"] = None
                if request.refresh and (session.status.get("drift") or {}).get("drifted"):
                    # The update refreshed first: whatever drifted is Pulumi's again.
                    fields["drift"] = drift_status({}, st.rfc3339(utc_now()))
                    metrics.mark_drifted(session.namespace, session.name, False)
        elif result.reason == st.RECONCILING_BACKEND_UNREACHABLE:
            # The backend's outage, not the program's failure: none is counted, and the Stack runs again
            # once the backend answers. currentUpdate stays: whether the run's update finished, and its lock,
            # are settled then (recover_interrupted), by this process or, restarted, the next.
            session.watched.outage_run = run.name
            if session.watched.backend_down:
                await session.write(st.Verdict("reconciling", st.RECONCILING_BACKEND_UNREACHABLE,
                                               f"{result.message}; the Stack runs again once it answers"))
                return ctx.settings.backend_probe_seconds
            await session.write(st.Verdict("reconciling", st.RECONCILING_PROCESSING,
                                           f"{result.message}; the Stack runs again"))
            return 0.0
        else:
            conflict = result.outcome == "conflict"
            refused = approval is not None and bool(approval.digest) and plan_refused(result.message)
            reason = PLAN_REFUSED if refused else result.reason or {
                "conflict": st.STALLED_CONFLICT, "blocked": st.UPDATE_BLOCKED}.get(result.outcome,
                                                                                   st.STALLED_UPDATE_FAILED)
            message = result.message
            unidentified = missing_service_account(message, spec.service_account_name, session.namespace,
                                                   ctx.engine.in_workspace_pods)
            if unidentified is not None:
                reason, message = st.SERVICE_ACCOUNT_REQUIRED, unidentified
            fields["lastUpdate"] = st.failed_update(session.status.get("lastUpdate"), run, reason, message,
                                                    result.permalink, utc_now())
            if refused:
                # Never applied again: the next pass previews a new plan, which needs a new approval.
                await _drop_plan(session)
                fields["plan"] = None
                post_event(session.body, EVENT_PLAN_REFUSED, f"The engine refused the approved plan {approval.digest}: "
                           f"{result.message}", warning=True, revision=revision)
            post_event(session.body, st.EVENT_CONFLICT if conflict else st.EVENT_UPDATE_FAILURE,
                       f"Failed to update stack: {message}", warning=True, revision=revision)
        if approval is not None and approval.digest:
            fields["lastUpdate"]["plan"] = approval.digest
        # Planned as the status now stands: this run answered the Flux request (lastHandledReconcileAt).
        after = plan_stack(spec, session.generation, session.requests.answered(), fields["lastUpdate"], revision,
                           utc_now(), ctx.settings.stall_after_failures, ctx.settings.min_resync_seconds)
        # The run just recorded answers the plan; if planning wants another run now (e.g. the cooldown is 0)
        # come back immediately rather than writing a misleading verdict.
        await session.write(after.verdict or st.Verdict("reconciling", st.RECONCILING_PROCESSING, after.message),
                            drifted=(False, "") if "drift" in fields else None, **fields)
        waves = parse_waves(handle) if spec.source_kind == "program" else None
        if waves:  # this run moved the Program's rollout on: say so on the Program
            program = await ctx.kube.get_program(session.namespace, handle["metadata"]["name"]) or handle
            await write_rollout_progress(session, program, waves, await rollout_stacks(session, program), revision)
        if after.run:
            return 0.0
        _, next_check = drift_check_due(spec, fields["lastUpdate"], fields.get("drift", session.status.get("drift")),
                                        utc_now(), ctx.settings.min_resync_seconds)
        return soonest(after.requeue_after, next_check)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


async def run_watched(session: StackSession, backend: str, what: str, operation: Awaitable[UpdateResult],
                      host: str, started_at: float) -> UpdateResult:
    """`operation`, a run of the Stack started on `host` at `started_at`, with its backend watched. A run
    that failed while its backend was away, or as it came back, failed with the outage, not the program:
    the result's reason is BackendUnreachable, and its CLI may have given up holding its lock, which it
    could not release, so the engine clears that lock before the Stack's next operation. If the backend
    still does not answer, the outage is said (as by a watch's probe): a run that failed at once, starting
    or ending, is the outage's too."""
    async with backend_watched(session, backend, what) as watch:
        result = await operation
        if result.ok or result.outcome == "conflict" or watch is None:
            return result
        problem = await unreachable(watch.address, watch.scope)
        if not problem and not watch.seen_down:
            return result
        session.ctx.engine.lost_run(session.key, host, started_at)
        session.logger.info("%s failed while its backend was away: %s", what, LOG_REDACTOR.redact(result.message))
        if problem:
            message = f"{not_answering(watch.where, problem)}: {what} stopped"
            if not watch.down:
                watch.went_away(message)
        else:
            # Its CLI gave up during the outage and failed once the backend was back (saving its snapshot, say).
            message = f"the state backend at {watch.where} went away during {what}, which failed ({result.message})"
        result = dataclasses.replace(result, reason=st.RECONCILING_BACKEND_UNREACHABLE, message=message)
    return result


async def backend_still_away(session: StackSession, backend: str, probe: bool = False,
                             then: str = "the Stack runs again") -> float | None:
    """A Stack whose last run ended with its backend away (with `probe`, any Stack) runs again only once
    the backend answers: until then it says so and looks again a probe's interval later (None: it may run).
    An operator told not to probe (--backend-probe-seconds 0: it may not reach what its workspace pods
    reach) never waits."""
    address = backend_address(backend)
    if address is None or session.ctx.settings.backend_probe_seconds <= 0:
        return None
    where = address_name(address)
    if not probe and session.watched.backend_down != where:
        return None
    problem = await unreachable(address, probe_scope(session))
    if not problem:
        return None  # the next run's watch, or the recovery, says it is back
    message = f"{not_answering(where, problem)}: {then} once it answers"
    if session.watched.backend_down != where:
        post_event(session.body, st.EVENT_BACKEND_UNREACHABLE, message, warning=True)
        session.watched.backend_down = where
    await session.write(st.Verdict("reconciling", st.RECONCILING_BACKEND_UNREACHABLE, message))
    return session.ctx.settings.backend_probe_seconds


def probe_scope(session: StackSession) -> ProbeScope:
    """What the backend probe may do for this Stack (services/backend_probe.py): a team's is limited."""
    ctx = session.ctx
    return ProbeScope(platform=session.namespace == ctx.settings.own_namespace,
                      shares_loopback=not ctx.engine.in_workspace_pods)


def address_name(address: tuple[str, int]) -> str:
    """A backend's address as the Stack's conditions and Events name it."""
    return f"{address[0]}:{address[1]}"


def not_answering(at: str, problem: str) -> str:
    """How an outage of the backend at `at` starts wherever it is said."""
    return f"the state backend at {at} does not answer ({problem})"


@contextlib.asynccontextmanager
async def backend_watched(session: StackSession, backend: str, what: str):
    """While `what` (a run) lasts its backend is probed: an outage shows on the Stack (Reconciling, reason
    BackendUnreachable, and a Warning Event) until the backend answers again."""
    address, every = backend_address(backend), session.ctx.settings.backend_probe_seconds
    if address is None or every <= 0:
        yield None
        return
    watch = BackendWatch(session, address, what)
    watcher = asyncio.create_task(watch.run(every))
    try:
        yield watch
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if watch.down and not await unreachable(address, watch.scope):
            # The run ended before the next probe saw the backend back: the pair of Events still closes.
            watch.reachable()
        # Still away: the Stack's next run says when it is back.
        session.watched.backend_down = watch.where if watch.down else ""


class BackendWatch:
    """A running update's backend, probed; an outage said once when it starts and once when it ends, even
    when the run it started in failed before the backend was back (the Stack's next run ends it)."""

    def __init__(self, session: StackSession, address: tuple[str, int], what: str):
        self.session, self.what, self.address = session, what, address
        self.where, self.seen_down, self.scope = address_name(address), False, probe_scope(session)
        self.down = session.watched.backend_down == self.where

    async def run(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            problem = await unreachable(self.address, self.scope)
            if bool(problem) == self.down:
                continue
            if problem:
                message = f"{not_answering(self.where, problem)}: {self.what} waits for it and goes on once it answers"
                self.went_away(message)
                verdict = st.Verdict("reconciling", st.RECONCILING_BACKEND_UNREACHABLE, message)
            else:
                self.reachable()
                verdict = st.Verdict("reconciling", st.RECONCILING_PROCESSING, "stack is being processed")
            try:
                await self.session.write(verdict)
            except Exception as err:  # noqa: BLE001 - the status is a courtesy here; the Event went out, the run goes on
                self.session.logger.warning("cannot write the backend's state to the status: %s",
                                            LOG_REDACTOR.redact(str(err)))

    def went_away(self, message: str) -> None:
        self.down = self.seen_down = True
        post_event(self.session.body, st.EVENT_BACKEND_UNREACHABLE, message, warning=True)

    def reachable(self) -> None:
        self.down = False
        said_reachable(self.session, self.where, self.what)


def said_reachable(session: StackSession, where: str, what: str) -> None:
    """The end of an outage the Stack said (its Warning Event's pair)."""
    post_event(session.body, st.EVENT_BACKEND_REACHABLE, f"the state backend at {where} answers again: {what} goes on")


async def _succeeded_fields(session: StackSession, spec: StackSpec, run: st.RunRecord,
                            result: UpdateResult) -> dict[str, Any]:
    """What a successful run records: an up's outputs (and its outputs Secret), lastUpdate and its Event."""
    fields: dict[str, Any] = {}
    problem = None
    if run.kind == "up":
        if spec.outputs_secret is not None:
            problem = await _write_outputs_secret(session, spec.outputs_secret.name, result)
        # What the engine's state now holds, whether or not the Secret could be written.
        fields["outputs"] = st.outputs_for_status(result.outputs)
        fields["outputDigests"] = result.output_digests or None
        fields["outputsDigest"] = result.outputs_digest or None
    if problem is None:
        fields["lastUpdate"] = st.succeeded_update(run, result.permalink, utc_now())
        # The change summary makes the Stack's Events its update history (the console shows them).
        post_event(session.body, st.EVENT_UPDATE_SUCCESSFUL, st.success_message(result.summary), revision=run.commit)
    else:
        fields["lastUpdate"] = st.failed_update(session.status.get("lastUpdate"), run, st.OUTPUTS_SECRET_FAILED,
                                                problem, result.permalink, utc_now())
        post_event(session.body, st.EVENT_OUTPUT_FAILURE, problem, warning=True)
    return fields


def _recovery_of(request: UpdateRequest, run: st.RunRecord) -> UpdateRequest:
    """`request` as the recovery of `run`: its lock cleared, and for an up, its update looked for."""
    return dataclasses.replace(request, interrupted_host=run.host, interrupted_since=run.started.timestamp(),
                               interrupted_run=run.name if run.kind == "up" else "")


async def _finished_before_lost(session: StackSession, request: UpdateRequest, run: st.RunRecord,
                               lost: UpdateResult) -> UpdateResult:
    """An up lost with its workspace (its pod deleted or restarted mid-run) may have finished its update
    just before: then that update is the result, read back from the backend, rather than a second run of
    the same change. The recovery clears the lost run's lock either way; if it cannot run, the next
    operation's does."""
    recovered = await session.ctx.engine.recover(_recovery_of(request, run))
    if not recovered.finished:
        return lost
    post_event(session.body, st.EVENT_UPDATE_RECOVERED, (
        f"{lost.message.removesuffix(RUNS_AGAIN)}, after its update had finished: that update is recorded, "
        "not run again"), revision=run.commit)
    return dataclasses.replace(recovered, duration=lost.duration)


async def recover_interrupted(session: StackSession, spec: StackSpec, resolved: Resolved,
                              then: str = "the Stack runs again") -> float | None:
    """A currentUpdate with no run in this process is a run that did not conclude: interrupted with the
    operator (killed, or fenced off when its status write failed), or lost with its state backend (away
    as it failed). Once the backend answers, clear what the run left there and, if its update had finished
    and succeeded, record that update rather than running the same change again; until then the Stack
    waits (the seconds until it looks again; None: recovered, or nothing to recover)."""
    current = session.status.get("currentUpdate")
    if not current or session.ctx.engine.busy(session.key):
        return None
    run = st.run_from_current_update(current)
    waiting = await backend_still_away(session, spec.backend, probe=True, then=then)
    if waiting is not None:
        return waiting
    # What the run left in its directory (its source; under the pod executor, the tarball it was packing or
    # uploading, which says so) goes once the run is settled (its currentUpdate cleared): no run uses it.
    run_dir = run_directory(session, run.name)
    try:
        await _settle_interrupted(session, spec, resolved, run, packed_source(run_dir / "src").exists())
    finally:
        if session.status.get("currentUpdate") is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    return None


async def _settle_interrupted(session: StackSession, spec: StackSpec, resolved: Resolved, run: st.RunRecord,
                              packing: bool) -> None:
    """Clear what the interrupted `run` left in the backend and record how it ended (`recover_interrupted`)."""
    # Whether the run failed with its backend's outage (this process saw it, or the one before said the
    # outage), which counts no failure; and the end of an outage the Stack said, not yet said to be over.
    lost_here = session.watched.outage_run == run.name
    unended = session.watched.backend_down or ("" if lost_here else outage_said_before(session, spec.backend))
    session.watched.backend_down = session.watched.outage_run = ""
    if unended:
        said_reachable(session, unended, f"the {run.kind} {run.name}'s recovery")
    outage = lost_here or bool(unended)
    stack_dir = stack_state_dir(session.ctx, session.namespace, session.name)
    last_successful = stack_dir / "last-successful"
    project = _recovery_project(last_successful, run.project, stack_dir / "runs" / f"recover-{run.name}")
    try:
        request = await update_request(session.ctx, spec, session.namespace, session.name, project, resolved,
                                       project)
        result = await session.ctx.engine.recover(_recovery_of(request, run))
    finally:
        if project != last_successful:
            shutil.rmtree(project, ignore_errors=True)
    if result.finished:
        session.logger.info("update %s of %s/%s had finished before the operator lost it: recorded, not run again",
                            run.name, session.namespace, session.name)
        # The run answered the Flux request it started for, as a run recorded the usual way does.
        answered = {"lastHandledReconcileAt": run.flux_request} if run.flux_request else {}
        await session.write(currentUpdate=None, **answered, **await _succeeded_fields(session, spec, run, result))
        if run.flux_request:  # this pass plans on next, as the status now stands
            session.requests = dataclasses.replace(session.requests, flux_handled=run.flux_request)
        return
    if outage and result.ok:
        session.logger.info("the %s %s of %s/%s did not finish before its backend went away: it runs again",
                            run.kind, run.name, session.namespace, session.name)
        await session.write(currentUpdate=None)
        return
    killed = None if outage else await _operator_oom_killed(session, run, packing)
    if killed is not None:
        # Not run again at once: it would most likely kill the operator again. A failure, with backoff, and
        # Stalled after --stall-after-failures: the operator does not crash-loop on one Stack's update.
        reason, message = st.OUT_OF_MEMORY, f"update {run.name} was interrupted: {killed}; {result.message}"
    else:
        cause = "its state backend's outage" if outage else "operator restart"
        reason, message = st.UPDATE_INTERRUPTED, f"update {run.name} was interrupted ({cause}); {result.message}"
    post_event(session.body, st.EVENT_UPDATE_FAILURE, message, warning=True)
    last = st.failed_update(session.status.get("lastUpdate"), run, reason, message, "", utc_now())
    await session.write(lastUpdate=last, currentUpdate=None)


async def _operator_oom_killed(session: StackSession, run: st.RunRecord, packing: bool) -> str | None:
    """In-cluster, how the kernel killed the container of the operator pod that ran `run` (its host) for out
    of memory, as that pod reports it, if it did so after the run started; None otherwise (on a host, a pod
    gone or unreadable, another cause). Under the process executor the run's update shared that container;
    under the pod executor the operator only prepared it there (fetched, packed and uploaded its source):
    `packing`, the operator was packing or uploading this Stack's source as it died."""
    settings = session.ctx.settings
    memory = settings.engine.container_memory
    if memory is None or not run.host:
        return None  # on a host: the machine's memory, no container's limit
    namespace, _ = discover_namespace(settings.kubeconfig)
    try:
        pod = await session.ctx.kube.get_pod(namespace, run.host)
    except ApiException as err:  # without the Role's pods get: the cause stays unnamed
        session.logger.warning("reading the operator pod %s/%s that ran %s: %s", namespace, run.host, run.name,
                               err.reason)
        return None
    if pod is None:
        return None
    if settings.workspace is None:
        return memory.killed_whole(pod, run.started)
    if packing:
        return memory.killed_whole(pod, run.started, "while it packed this Stack's source for its workspace pod")
    return memory.killed_whole(pod, run.started, "during this update (run in its workspace pod: the operator "
                                                 "was not packing this Stack's source)")


def outage_said_before(session: StackSession, backend: str) -> str:
    """Where the backend is whose outage the Stack says (its Reconciling reason BackendUnreachable, said
    by the process before this one), or ""."""
    said = st.condition(session.status, "Reconciling") or {}
    address = backend_address(backend)
    if address is None or said.get("status") != "True" or said.get("reason") != st.RECONCILING_BACKEND_UNREACHABLE:
        return ""
    return address_name(address)


def _recovery_project(last_successful: Path, project_name: str, scratch: Path) -> Path:
    """A project for the recovery's CLI runs: the last successful update's, if it is the same project,
    else an empty one of the interrupted run's name (so a stack name without a project finds its stack), made
    at `scratch`, among the Stack's runs (what a sandboxed worker of its namespace may read)."""
    known = project_info(last_successful)
    if known is not None and (not project_name or known["name"] == project_name):
        return last_successful
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "Pulumi.yaml").write_text(yaml.safe_dump({"name": project_name or "recover", "runtime": "yaml"}))
    return scratch


def _keep_last_successful(project: Path, dest: Path) -> None:
    """The project of the last successful update: what destroy uses when the source is gone."""
    staging = dest.with_name(dest.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(project, staging, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
