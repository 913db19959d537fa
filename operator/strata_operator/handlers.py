"""Kopf handlers: fetch, call the pure functions (spec, planning, status), run the engine, write back.

Each Stack has one daemon that loops `reconcile_stack` and sleeps until the plan's requeue time or
until something relevant changes (the Stack itself, its Program, its Flux source, a prerequisite),
which `wake` signals. Deletion is Kopf's finalizer (PKO's name, so PKO-managed Stacks carry over).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from . import FINALIZER, GROUP, VERSION, flux_events, metrics, status as st
from .approval import (APPROVE_ANNOTATION, EVENT_PLAN_READY, EVENT_PLAN_REFUSED, PLAN_LABEL, PLAN_REFUSED,
                       PlanIdentity, approval_gate, awaiting_message, inputs_digest, plan_chunks, plan_digest,
                       plan_refused, plan_secret_name, plan_status)
from .engine import (AutomationEngine, Engine, EngineSettings, EngineUnavailable, UpdateRequest, UpdateResult,
                     register_secret_outputs)
from .kube import FLUX_GROUP, FLUX_PLURALS, Forbidden, Kube
from .outputs import (outputs_secret_conflict, outputs_secret_data, outputs_secret_manifest,
                      secret_needs_write)
from .podengine import PodEngine, WorkspaceSettings
from .planning import (DEFAULT_STALL_AFTER_FAILURES, Plan, Requests, check_prerequisite, drift_check_due,
                       drift_status, plan_finalize, plan_on_prerequisite_outputs, plan_stack, prerequisite_digests,
                       prerequisites_verdict, suspended_verdict, terminating_namespace_message)
from .redaction import REDACTOR, install_log_redaction, redact
from .resolve import RefError, Resolved, resolve_stack
from .rollout import RolloutStack, parse_waves, rollout_gate, rollout_progress
from .sources import (SourceError, SourceNotReady, download_artifact, flux_artifact, git_branch_head, git_checkout,
                      program_revision, program_status, project_info, safe_extract, subdir,
                      write_program_project)
from .spec import (MIN_RESYNC_SECONDS, STALLED_SPEC_INVALID, WATCHED_FLUX_KINDS, SpecInvalid, StackSpec,
                   local_source_issue, misplaced_file_backend, not_applicable_fields, parse_stack_spec, unused_sources)

RETRY_REFS_SECONDS = 30.0
HOST = socket.gethostname()


def passes_in_flight(concurrency: int) -> int:
    """How many Stacks' reconcile passes run at once: the engine's slots and three times as many more
    (passes that need no run go through while updates queue). The rest wait before reading anything,
    holding nothing for their pass."""
    return max(32, 4 * concurrency)


@dataclasses.dataclass
class OperatorSettings:
    engine: EngineSettings = dataclasses.field(default_factory=EngineSettings)
    stall_after_failures: int = DEFAULT_STALL_AFTER_FAILURES
    min_resync_seconds: int = MIN_RESYNC_SECONDS
    allow_operator_refs: bool = True  # PKO v1's Env/FS refs read the operator's env/files
    metrics_port: int = 8383
    kubeconfig: str | None = None
    flux_events_address: str = ""  # Flux notification-controller event server; "" is off
    workspace: WorkspaceSettings | None = None  # the pod executor's settings; None: the process executor


@dataclasses.dataclass
class Watched:
    """What a live Stack depends on, so changes to those objects wake its daemon."""

    wakeup: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    program: str = ""
    flux: tuple[str, str] = ("", "")
    prerequisites: tuple[str, ...] = ()
    branch_head: tuple[str, float] = ("", 0.0)  # (sha, monotonic time of ls-remote)
    branch_key: tuple[Any, ...] = ()
    # Status fields this process wrote that the watch has not shown yet: a wakeup from another object
    # can arrive before our own patch's event, and planning on the stale status would re-run the update.
    pending: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What of the Stack's own object the last pass planned on (see `intent`): an event that changes
    # none of it (our own status writes) needs no pass.
    seen: tuple[Any, ...] = ()
    # Waiting for earlier waves of its Program's rollout: woken whenever a Stack of that Program changes.
    rollout_waiting: bool = False


def intent(body: Any) -> tuple[Any, ...]:
    """What of a Stack object can call for a run: its spec (generation), the reconcile requests and an
    approval."""
    meta = body.get("metadata", {})
    annotations = meta.get("annotations") or {}
    return meta.get("generation"), Requests.of(annotations, None), annotations.get(APPROVE_ANNOTATION, "")


class Registry:
    def __init__(self) -> None:
        self.stacks: dict[tuple[str, str], Watched] = {}

    def wake(self, namespace: str, name: str, body: Any) -> None:
        watched = self.stacks.get((namespace, name))
        if watched is not None and intent(body) != watched.seen:
            watched.wakeup.set()

    def wake_where(self, namespace: str, predicate) -> None:
        for (ns, name), watched in self.stacks.items():
            if ns == namespace and predicate(watched):
                watched.wakeup.set()


@dataclasses.dataclass
class Context:
    kube: Kube
    engine: Engine
    settings: OperatorSettings
    registry: Registry = dataclasses.field(default_factory=Registry)
    # Every Stack's daemon starts a pass as soon as the Stack exists: unbounded, 1000 new Stacks are 1000
    # passes holding their spec, refs, Program and request for as long as the engine's queue takes.
    passes: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore(passes_in_flight(1)))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


# Set at startup when --flux-events-address is given: every Stack Event also goes to Flux, in its format.
FLUX_EVENTS: flux_events.FluxEventSink | None = None


def _event(body: Any, reason: str, message: str, warning: bool = False, revision: str = "") -> None:
    message = redact(message)[:1024]
    kopf.event(body, type="Warning" if warning else "Normal", reason=reason, message=message)
    if FLUX_EVENTS is not None:
        FLUX_EVENTS.publish(flux_events.build_flux_event(body, reason, message, warning=warning, revision=revision,
                                                         now=_now(), instance=HOST))


class StackSession:
    """One reconcile pass over one Stack: the object as read, and the status it will write."""

    def __init__(self, ctx: Context, body: Any, logger: Any):
        self.ctx, self.body, self.logger = ctx, body, logger
        self.meta = body.get("metadata", {})
        self.namespace, self.name = self.meta["namespace"], self.meta["name"]
        self.generation = int(self.meta.get("generation", 0))
        self.status: dict[str, Any] = dict(body.get("status") or {})
        pending = self.watched.pending
        for field, value in list(pending.items()):
            if self.status.get(field) == value:
                del pending[field]
        self.status.update(pending)
        self.requests = Requests.of(self.meta.get("annotations"), self.status)
        # What this pass found of its prerequisites' outputs (name -> digest); a run records it in lastUpdate.
        self.consumed: dict[str, str] = {}

    def resync_seconds(self, spec: StackSpec) -> int:
        return spec.resync_seconds(self.ctx.settings.min_resync_seconds)

    @property
    def key(self) -> str:
        return _key(self.namespace, self.name)

    @property
    def watched(self) -> Watched:
        return self.ctx.registry.stacks.setdefault((self.namespace, self.name), Watched())

    async def write(self, verdict: st.Verdict | None = None, drifted: tuple[bool, str] | None = None,
                    **fields: Any) -> None:
        """Patch status only when it changes, so idle Stacks cause no writes (and no wakeups).

        observedGeneration and observedReconcileRequest say which spec and request the conditions
        describe, so they are written only with a verdict: kstatus takes observedGeneration ==
        generation with no Reconciling/Stalled as "current", which other fields must not claim."""
        patch: dict[str, Any] = dict(fields)
        if verdict is not None:
            patch.update(observedGeneration=self.generation, observedReconcileRequest=self.requests.pulumi)
            patch["conditions"] = st.build_conditions(self.status.get("conditions"), verdict, self.generation, _now())
            failing = verdict.phase == "stalled" or verdict.reason in (st.RECONCILING_RETRY,
                                                                       st.RECONCILING_PREVIEW_FAILED)
            metrics.mark_failing(self.namespace, self.name, failing)
        if drifted is not None:
            patch["conditions"] = st.with_drifted(patch.get("conditions", self.status.get("conditions")), *drifted,
                                                  self.generation, _now())
        changed = {k: v for k, v in patch.items() if self.status.get(k) != v}
        if "conditions" in changed and not _conditions_differ(self.status.get("conditions"), patch["conditions"]):
            del changed["conditions"]
        if not changed:
            return
        for k, v in changed.items():
            if isinstance(v, str):
                changed[k] = redact(v)
        if "conditions" in changed:
            changed["conditions"] = [{**c, "message": redact(c["message"])} for c in changed["conditions"]]
        await self.ctx.kube.patch_stack_status(
            self.namespace, self.name, {k: st.merge_patch(self.status.get(k), v) for k, v in changed.items()})
        self.status.update(changed)
        self.watched.pending.update(changed)

    async def stall(self, reason: str, message: str, event_reason: str | None = None) -> None:
        before = _condition(self.status, st.STALLED)
        if event_reason and (before is None or before.get("message") != redact(message)):
            _event(self.body, event_reason, message, warning=True)
        await self.write(st.Verdict("stalled", reason, message))


def _condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)


def _conditions_differ(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> bool:
    def strip(cs):
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in cs or []]
    return strip(old) != strip(new)


async def _source_revision(session: StackSession, spec: StackSpec, resolved: Resolved) -> tuple[str, Any]:
    """(revision, handle to materialise it) without fetching the program itself."""
    ctx, ns = session.ctx, session.namespace
    watched = session.watched
    if spec.source_kind == "program" and spec.program_ref is not None:
        program = await ctx.kube.get_program(ns, spec.program_ref.name)
        if program is None:
            raise SourceError(f"unable to retrieve program {spec.program_ref.name!r} for stack")
        return program_revision(program), program
    if spec.source_kind == "local":
        # In the workspace pod, unseen here: its revision is its path (PKO's resync re-runs it periodically).
        return f"local:{spec.local_dir}", None
    if spec.source_kind == "flux" and spec.flux_source is not None:
        ref = spec.flux_source.source_ref
        try:
            source = await ctx.kube.get_flux_source(ref.api_version, ref.kind, ns, ref.name)
        except Forbidden as err:
            raise SourceError(f"spec.fluxSource.sourceRef.kind: {ref.kind}: {err}") from None
        if source is None:
            raise SourceError(f"could not resolve sourceRef: {ref.kind} {ref.name!r} not found")
        artifact = flux_artifact(source)
        return artifact.revision, artifact
    if spec.commit:
        return spec.commit, spec.commit
    # A branch: ls-remote at most once per resync period unless the spec or a request changed.
    branch_key = (session.generation, session.requests)
    sha, checked = watched.branch_head
    loop = asyncio.get_running_loop()
    if not sha or branch_key != watched.branch_key or loop.time() - checked >= session.resync_seconds(spec):
        sha = await asyncio.to_thread(git_branch_head, spec.project_repo, spec.branch, resolved.git)
        watched.branch_head, watched.branch_key = (sha, loop.time()), branch_key
    return sha, sha


async def _materialise(spec: StackSpec, handle: Any, dest: Path, resolved: Resolved) -> Path:
    """Write the program at the planned revision into `dest`; returns the project directory."""
    if spec.source_kind == "local":
        dest.mkdir(parents=True, exist_ok=True)  # nothing to write: the program is in the workspace pod
        return dest
    if spec.source_kind == "program":
        write_program_project(handle, dest)
        return dest
    if spec.source_kind == "flux" and spec.flux_source is not None:
        archive = dest.with_suffix(".tar.gz")
        await asyncio.to_thread(download_artifact, handle, archive)
        await asyncio.to_thread(safe_extract, archive, dest)
        archive.unlink()
        return subdir(dest, spec.flux_source.dir, "spec.fluxSource.dir")
    await asyncio.to_thread(git_checkout, spec.project_repo, handle, dest, resolved.git)
    return subdir(dest, spec.repo_dir, "spec.repoDir")


def _stack_dir(ctx: Context, namespace: str, name: str) -> Path:
    return ctx.settings.engine.state_dir / "stacks" / namespace / name


async def _request(ctx: Context, spec: StackSpec, namespace: str, name: str, project: Path, resolved: Resolved,
                   run_dir: Path, message: str = "", real_outputs: bool = False) -> UpdateRequest:
    env = dict(resolved.env)
    if spec.service_account_name and not ctx.engine.in_workspace_pods:
        # A workspace pod runs as the ServiceAccount itself; a forked worker gets a token kubeconfig for it.
        minted = await ctx.kube.service_account_kubeconfig(namespace, spec.service_account_name)
        if minted is None:
            raise RefError(f"spec.serviceAccountName: ServiceAccount {spec.service_account_name!r} not found in "
                           f"namespace {namespace!r}")
        kubeconfig, token = minted
        REDACTOR.add(token)
        path = run_dir / "kubeconfig"
        path.write_text(kubeconfig)
        path.chmod(0o600)
        env["KUBECONFIG"] = str(path)
    return UpdateRequest(
        stack_key=_key(namespace, name), stack_name=spec.stack, project_dir=str(project), env=env,
        secret_env=tuple(sorted(resolved.secret_env)), config=resolved.config, secret_config=resolved.secret_config,
        secrets_provider=spec.secrets_provider, create=not spec.use_local_stack_only, refresh=spec.refresh,
        expect_no_refresh_changes=spec.expect_no_refresh_changes, targets=tuple(spec.targets),
        target_dependents=spec.target_dependents, environments=tuple(spec.environment), message=message,
        run_program=spec.run_program, real_outputs=real_outputs,
        service_account=spec.service_account_name, workspace_template=spec.workspace_template or {},
        reclaim_workspace=spec.workspace_reclaim_policy == "Delete", mounted=resolved.mounted.to_json(),
        local_dir=spec.local_dir if spec.source_kind == "local" else "",
        source_root=str(_source_root(project, run_dir)))


def _source_root(project: Path, run_dir: Path) -> Path:
    """The materialised source that holds the project (a repository checked out whole, the project in a
    subdirectory): the project's ancestor directly under the run's directory."""
    try:
        return run_dir / project.relative_to(run_dir).parts[0]
    except (ValueError, IndexError):
        return project


async def _recover_interrupted(session: StackSession, spec: StackSpec, resolved: Resolved) -> None:
    """A currentUpdate with no run in this process is a run killed with the operator: clear its lock."""
    current = session.status.get("currentUpdate")
    if not current or session.ctx.engine.busy(session.key):
        return
    run = st.run_from_current_update(current)
    last_good = _stack_dir(session.ctx, session.namespace, session.name) / "last-successful"
    project = last_good if last_good.is_dir() else Path(tempfile.mkdtemp(prefix="strata-recover-"))
    if not (project / "Pulumi.yaml").exists():
        (project / "Pulumi.yaml").write_text("name: recover\nruntime: yaml\n")
    request = await _request(session.ctx, spec, session.namespace, session.name, project, resolved, project)
    request = dataclasses.replace(request, interrupted_host=run.host, interrupted_since=run.started.timestamp())
    result = await session.ctx.engine.recover(request)
    message = f"update {run.name} was interrupted (operator restart); {result.message}"
    _event(session.body, st.EVENT_UPDATE_FAILURE, message, warning=True)
    last = st.failed_update(session.status.get("lastUpdate"), run, st.UPDATE_INTERRUPTED, message, "", _now())
    await session.write(lastUpdate=last, currentUpdate=None)


async def _wait_for_reference(session: StackSession, err: RefError) -> float:
    await session.write(st.Verdict("reconciling", st.RECONCILING_RETRY, f"waiting for a reference: {err}"))
    return RETRY_REFS_SECONDS


async def reconcile_stack(ctx: Context, body: Any, logger: Any) -> float | None:
    """One pass; returns seconds until the next pass is due (None: only when something changes)."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return None  # the finalizer owns a Stack being deleted: nothing more runs, and no stall of ours hides its own
    session = StackSession(ctx, body, logger)
    session.watched.seen = intent(body)
    raw_spec = body.get("spec") or {}
    try:
        spec = parse_stack_spec(dict(raw_spec), session.namespace)
    except SpecInvalid as err:
        await session.stall(err.reason, str(err), st.EVENT_CONFIG_INVALID)
        return None
    elsewhere = local_source_issue(spec, ctx.engine.in_workspace_pods)
    if elsewhere is not None:
        await session.stall(STALLED_SPEC_INVALID, str(elsewhere), st.EVENT_CONFIG_INVALID)
        return None
    inapplicable = not_applicable_fields(dict(raw_spec), ctx.engine.in_workspace_pods)
    unused = unused_sources(spec)
    if (session.status.get("ignoredFields") or []) != inapplicable + unused:
        if inapplicable:
            _event(body, st.EVENT_CONFIG_INVALID,
                   f"accepted but not applicable to Strata's engine: {', '.join(inapplicable)}")
        if unused:
            chosen = {"git": "spec.projectRepo", "flux": "spec.fluxSource", "program": "spec.programRef"}
            _event(body, st.EVENT_CONFIG_INVALID,
                   f"several sources: {chosen[spec.source_kind]} is used (PKO's order: git, Flux, Program); "
                   f"ignored: {', '.join('spec.' + f for f in unused)}")
        # None: the fields are gone, drop the list
        await session.write(ignoredFields=(inapplicable + unused) or None)
    watched = session.watched
    watched.program = spec.program_ref.name if spec.program_ref and spec.source_kind == "program" else ""
    watched.flux = ((spec.flux_source.source_ref.kind, spec.flux_source.source_ref.name)
                    if spec.flux_source and spec.source_kind == "flux" else ("", ""))
    watched.prerequisites = tuple(p.name for p in spec.prerequisites)
    was_suspended = (_condition(session.status, st.READY) or {}).get("reason") == st.SUSPENDED
    if spec.suspend:
        # Nothing is resolved, fetched or run; a run already going finishes first.
        if not was_suspended:
            _event(body, st.EVENT_SUSPENDED, "suspended: no updates run until spec.suspend is false")
        await session.write(suspended_verdict(session.status.get("lastUpdate")))
        return None
    if was_suspended:
        _event(body, st.EVENT_RESUMED, "resumed: running whatever changed while suspended")

    try:
        resolved = await resolve_stack(spec, session.namespace, ctx.kube.secret_data, ctx.kube.configmap_data,
                                       ctx.settings.allow_operator_refs, ctx.engine.in_workspace_pods)
    except RefError as err:
        return await _wait_for_reference(session, err)
    misplaced = misplaced_file_backend(spec, resolved.env.get("PULUMI_BACKEND_URL", ""), ctx.engine.in_workspace_pods)
    if misplaced is not None:
        await session.stall(STALLED_SPEC_INVALID, str(misplaced), st.EVENT_CONFIG_INVALID)
        return None
    try:
        await _recover_interrupted(session, spec, resolved)
    except RefError as err:
        return await _wait_for_reference(session, err)

    poll = float(session.resync_seconds(spec)) if spec.polled else None
    try:
        revision, handle = await _source_revision(session, spec, resolved)
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

    plan = plan_stack(spec, session.generation, session.requests, session.status.get("lastUpdate"), revision,
                      _now(), ctx.settings.stall_after_failures, ctx.settings.min_resync_seconds)
    others = {p.name: await ctx.kube.get_stack(session.namespace, p.name) for p in spec.prerequisites}
    consumed = prerequisite_digests(spec.prerequisites, others)
    plan = plan_on_prerequisite_outputs(spec, plan, session.status.get("lastUpdate"), consumed)
    session.consumed = consumed
    if plan.run is None:
        due, next_check = drift_check_due(spec, session.status.get("lastUpdate"), session.status.get("drift"), _now(),
                                          ctx.settings.min_resync_seconds)
        if due:
            return await _check_drift(session, spec, resolved, plan, revision, handle)
        await session.write(plan.verdict)
        return _sooner(plan.requeue_after, next_check)

    waves = parse_waves(handle) if spec.source_kind == "program" else None
    watched.rollout_waiting = False
    if waves and (session.status.get("lastUpdate") or {}).get("lastSuccessfulCommit") != revision:
        held = await _rollout_gate(session, handle, waves, revision)
        if held is not None:
            watched.rollout_waiting = True
            await session.write(held)
            return None

    checks = []
    for prereq in spec.prerequisites:
        check = check_prerequisite(prereq, others[prereq.name], _now())
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
        problem = await _outputs_secret_problem(session, spec.outputs_secret.name)
        if problem is not None:
            await session.stall(st.STALLED_OUTPUTS_SECRET, problem, st.EVENT_OUTPUT_FAILURE)
            return RETRY_REFS_SECONDS

    if spec.manual_approval and plan.run == "up":
        return await _gated_update(session, spec, resolved, plan, revision, handle)
    return await _run_update(session, spec, resolved, plan, revision, handle)


def _is_prerequisite(session: StackSession) -> bool:
    """Whether a live Stack in the namespace lists this one as a prerequisite (its secret outputs then
    need real values for their digests)."""
    return any(session.name in watched.prerequisites for (ns, name), watched in session.ctx.registry.stacks.items()
               if ns == session.namespace and name != session.name)


def _api_problem(secret_name: str, verb: str, err: ApiException) -> str:
    if err.status == 403:
        return (f"spec.outputsSecret.name: the operator may not {verb} Secret {secret_name!r} (HTTP 403): grant it "
                "get, create and update on secrets (rbac/clusterrole.yaml)")
    # Only the status line, never the response body (which may quote what was sent), and redacted anyway.
    return redact(f"spec.outputsSecret.name: {verb} Secret {secret_name!r} failed: HTTP {err.status} {err.reason}")


async def _outputs_secret_problem(session: StackSession, secret_name: str) -> str | None:
    """Before an update: why spec.outputsSecret could not receive its outputs (not this Stack's), or None."""
    try:
        existing = await session.ctx.kube.get_secret(session.namespace, secret_name)
    except ApiException as err:
        return _api_problem(secret_name, "read", err)
    return outputs_secret_conflict(existing, session.name, session.meta.get("uid", ""), secret_name)


async def _write_outputs_secret(session: StackSession, secret_name: str, result: UpdateResult) -> str | None:
    """After a successful up: create or replace the outputs Secret when it differs; the problem, or None.
    Nothing here puts a value into a message: API errors are reduced to their status and reason."""
    if result.real_outputs is None:
        return f"spec.outputsSecret: the update succeeded but {result.outputs_error or 'its outputs were not read'}"
    register_secret_outputs(result.outputs, result.real_outputs)
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
        return _api_problem(secret_name, verb, err)
    if skipped:
        _event(session.body, st.EVENT_OUTPUT_FAILURE,
               f"outputs {', '.join(repr(n) for n in skipped)} are not valid Secret keys (letters, digits, '-', '_', "
               f"'.'): left out of Secret {secret_name!r}", warning=True)
    return None


async def _check_drift(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
                       handle: Any) -> float | None:
    """A refresh preview of a Stack with nothing to run: status.drift, the Drifted condition, an Event
    and the metric; with remediate, an update that refreshes first when something drifted."""
    ctx, body = session.ctx, session.body
    work = _stack_dir(ctx, session.namespace, session.name) / "runs" / f"drift-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        project = await _materialise(spec, handle, work / "src", resolved)
        request = await _request(ctx, spec, session.namespace, session.name, project, resolved, work, "drift check")
        result = await ctx.engine.refresh(dataclasses.replace(request, preview_only=True))
    except (SourceError, SpecInvalid, RefError) as err:
        result = UpdateResult("failed", str(err))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    metrics.DRIFT_CHECKS.labels(result.outcome).inc()
    now = _now()
    before = session.status.get("drift") or {}
    # A check that failed tells nothing new about drift: what the last one found stands.
    drift = drift_status(result.summary, st.rfc3339(now)) if result.ok else {
        **before, "checkedAt": st.rfc3339(now), "error": result.message}
    drift.setdefault("drifted", False)
    remediate = bool(spec.drift_detection and spec.drift_detection.remediate)
    found = f"{st.changes_text(drift.get('changes') or {})} outside Pulumi, found by a refresh preview at " \
            f"{drift['checkedAt']}"
    if drift["drifted"] and (not before.get("drifted") or before.get("changes") != drift["changes"]):
        _event(body, st.DRIFT_DETECTED, found + ("; remediating with an update" if remediate else ""), warning=True)
    elif before.get("drifted") and not drift["drifted"] and result.ok:
        _event(body, "DriftResolved", "the refresh preview finds no change made outside Pulumi any more")
    elif not result.ok and before.get("error") != result.message:
        _event(body, "DriftCheckFailed", f"drift check failed: {result.message}", warning=True)
    metrics.mark_drifted(session.namespace, session.name, drift["drifted"])
    advice = "remediating with an update that refreshes first" if remediate else \
        "run an update with refresh (a reconcile request with spec.refresh) or set spec.driftDetection.remediate"
    await session.write(plan.verdict, drifted=(drift["drifted"], f"{found}; {advice}") if result.ok else None,
                        drift=drift)
    if drift["drifted"] and remediate:
        return await _run_update(session, spec.model_copy(update={"refresh": True}), resolved,
                                 Plan("up", f"Drift detected ({st.changes_text(drift['changes'])}): remediating"),
                                 revision, handle)
    _, next_check = drift_check_due(spec, session.status.get("lastUpdate"), drift, now,
                                    ctx.settings.min_resync_seconds)
    return _sooner(plan.requeue_after, next_check)


def _sooner(*delays: float | None) -> float | None:
    """The soonest of the passes asked for (at least a second away), or None: only when woken."""
    waits = [delay for delay in delays if delay is not None]
    return max(1.0, min(waits)) if waits else None


async def _rollout_stacks(session: StackSession, program: dict[str, Any]) -> list[RolloutStack]:
    """The Stacks of this namespace whose source is this Program."""
    name = program["metadata"]["name"]
    found = []
    for other in await session.ctx.kube.list_stacks(session.namespace):
        spec = other.get("spec") or {}
        if (spec.get("programRef") or {}).get("name") == name and not spec.get("projectRepo") \
                and not spec.get("fluxSource"):
            found.append(RolloutStack(other["metadata"]["name"], other["metadata"].get("labels") or {},
                                      (other.get("status") or {}).get("lastUpdate") or {}))
    return found


async def _rollout_gate(session: StackSession, program: dict[str, Any], waves, revision: str) -> st.Verdict | None:
    """Whether this Stack's wave may run `revision` yet; the Program's progress is brought up to date."""
    stacks = await _rollout_stacks(session, program)
    await _write_rollout_progress(session, program, waves, stacks, revision)
    return rollout_gate(waves, stacks, session.name, revision)


async def _write_rollout_progress(session: StackSession, program: dict[str, Any], waves, stacks: list[RolloutStack],
                                  revision: str) -> None:
    progress = rollout_progress(waves, stacks, revision)
    before = (program.get("status") or {}).get("rollout")
    if progress != before:
        await session.ctx.kube.patch_program_status(session.namespace, program["metadata"]["name"],
                                                    {"rollout": st.merge_patch(before, progress)})
        program.setdefault("status", {})["rollout"] = progress


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


async def _gated_update(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
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
        return await _run_update(session, spec, resolved, dataclasses.replace(plan, message=gate.message), revision,
                                 handle, _Approval(digest=session.status["plan"]["digest"], plan=stored[0]))
    return await _run_update(session, spec, resolved, dataclasses.replace(plan, run="preview", message=gate.message),
                             revision, handle, _Approval(identity=identity))


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
    saved = plan_status(identity, digest, summary, len(chunks), st.rfc3339(_now()))
    if not st.has_changes(summary):
        await session.write(st.Verdict("reconciling", st.RECONCILING_PROCESSING, "applying a plan with no changes"),
                            plan=saved, currentUpdate=None)
        return 0.0
    message = awaiting_message(saved, session.namespace, session.name)
    _event(session.body, EVENT_PLAN_READY, message)
    await session.write(approval_gate(saved, identity.inputs, identity, "", session.namespace, session.name).verdict,
                        plan=saved, currentUpdate=None)
    return None


async def _run_update(session: StackSession, spec: StackSpec, resolved: Resolved, plan: Plan, revision: str,
                      handle: Any, approval: _Approval | None = None) -> float | None:
    ctx = session.ctx
    run = st.RunRecord(name=f"{session.name}-{uuid.uuid4().hex[:8]}", kind=plan.run or "up",
                       generation=session.generation, reconcile_request=session.requests.pulumi, commit=revision,
                       started=_now(), host=HOST, prerequisite_digests=tuple(sorted(session.consumed.items())))
    stack_dir = _stack_dir(ctx, session.namespace, session.name)
    run_dir = stack_dir / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            project = await _materialise(spec, handle, run_dir / "src", resolved)
        except (SourceError, SpecInvalid) as err:
            await session.stall(st.STALLED_SOURCE_UNAVAILABLE, str(err))
            return float(session.resync_seconds(spec)) if spec.project_repo or spec.polled else None
        try:
            request = await _request(ctx, spec, session.namespace, session.name, project, resolved, run_dir,
                                     plan.message, real_outputs=spec.outputs_secret is not None or
                                     _is_prerequisite(session))
        except RefError as err:
            return await _wait_for_reference(session, err)
        plan_file = run_dir / "plan.json"
        if approval is not None:
            if approval.digest:
                plan_file.write_bytes(approval.plan)
            request = dataclasses.replace(request, plan_file=str(plan_file))
        _event(session.body, st.EVENT_UPDATE_DETECTED, plan.message, revision=revision)
        await session.write(st.Verdict("reconciling", st.RECONCILING_PROCESSING, "stack is being processed"),
                            currentUpdate=st.current_update(run))
        result: UpdateResult = await (ctx.engine.preview(request) if run.kind == "preview" else ctx.engine.up(request))
        metrics.UPDATE_DURATION.labels(run.kind, result.outcome).observe(result.duration)
        if approval is not None and approval.identity is not None and result.ok:
            return await _keep_plan(session, plan_file.read_bytes(), result.summary, approval.identity)
        fields: dict[str, Any] = {"currentUpdate": None, "lastHandledReconcileAt": session.requests.flux}
        if result.ok:
            problem = None
            if run.kind == "up" and spec.outputs_secret is not None:
                problem = await _write_outputs_secret(session, spec.outputs_secret.name, result)
            fields["projectInfo"] = project_info(project)
            if run.kind == "up":
                # What the engine's state now holds, whether or not the Secret could be written.
                fields["outputs"] = st.outputs_for_status(result.outputs)
                fields["outputDigests"] = result.output_digests or None
                fields["outputsDigest"] = result.outputs_digest or None
                _keep_last_successful(project, stack_dir / "last-successful")
                if session.status.get("plan"):  # applied, or no longer wanted (approval turned off)
                    await _drop_plan(session)
                    fields["plan"] = None
                if request.refresh and (session.status.get("drift") or {}).get("drifted"):
                    # The update refreshed first: whatever drifted is Pulumi's again.
                    fields["drift"] = drift_status({}, st.rfc3339(_now()))
                    metrics.mark_drifted(session.namespace, session.name, False)
            if problem is None:
                fields["lastUpdate"] = st.succeeded_update(run, result.permalink, _now())
                _event(session.body, st.EVENT_UPDATE_SUCCESSFUL, "Successfully updated stack", revision=revision)
            else:
                fields["lastUpdate"] = st.failed_update(session.status.get("lastUpdate"), run,
                                                        st.OUTPUTS_SECRET_FAILED, problem, result.permalink, _now())
                _event(session.body, st.EVENT_OUTPUT_FAILURE, problem, warning=True)
        else:
            conflict = result.outcome == "conflict"
            refused = approval is not None and bool(approval.digest) and plan_refused(result.message)
            reason = PLAN_REFUSED if refused else result.reason or {
                "conflict": st.STALLED_CONFLICT, "blocked": st.UPDATE_BLOCKED}.get(result.outcome,
                                                                                   st.STALLED_UPDATE_FAILED)
            fields["lastUpdate"] = st.failed_update(session.status.get("lastUpdate"), run, reason, result.message,
                                                    result.permalink, _now())
            if refused:
                # Never applied again: the next pass previews a new plan, which needs a new approval.
                await _drop_plan(session)
                fields["plan"] = None
                _event(session.body, EVENT_PLAN_REFUSED, f"The engine refused the approved plan {approval.digest}: "
                       f"{result.message}", warning=True, revision=revision)
            _event(session.body, st.EVENT_CONFLICT if conflict else st.EVENT_UPDATE_FAILURE,
                   f"Failed to update stack: {result.message}", warning=True, revision=revision)
        if approval is not None and approval.digest:
            fields["lastUpdate"]["plan"] = approval.digest
        # Planned as the status now stands: this run answered the Flux request (lastHandledReconcileAt).
        after = plan_stack(spec, session.generation, session.requests.answered(), fields["lastUpdate"], revision,
                           _now(), ctx.settings.stall_after_failures, ctx.settings.min_resync_seconds)
        # The run just recorded answers the plan; if planning wants another run now (e.g. the cooldown is 0)
        # come back immediately rather than writing a misleading verdict.
        await session.write(after.verdict or st.Verdict("reconciling", st.RECONCILING_PROCESSING, after.message),
                            drifted=(False, "") if "drift" in fields else None, **fields)
        waves = parse_waves(handle) if spec.source_kind == "program" else None
        if waves:  # this run moved the Program's rollout on: say so on the Program
            program = await ctx.kube.get_program(session.namespace, handle["metadata"]["name"]) or handle
            await _write_rollout_progress(session, program, waves, await _rollout_stacks(session, program), revision)
        if after.run:
            return 0.0
        _, next_check = drift_check_due(spec, fields["lastUpdate"], fields.get("drift", session.status.get("drift")),
                                        _now(), ctx.settings.min_resync_seconds)
        return _sooner(after.requeue_after, next_check)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _keep_last_successful(project: Path, dest: Path) -> None:
    """The project of the last successful update: what destroy uses when the source is gone."""
    staging = dest.with_name(dest.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(project, staging, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)


# --- Kopf wiring ------------------------------------------------------------------------------


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    options: OperatorSettings = memo.get("operator_settings") or OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="strata.pulumi.com")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="strata.pulumi.com")
    settings.posting.level = 100  # only our explicit, redacted Events; never Kopf's log lines
    settings.watching.server_timeout = 270
    install_log_redaction()
    kube = Kube.from_environment(options.kubeconfig)
    engine: Engine = (PodEngine(options.engine, options.workspace, kube) if options.workspace is not None
                      else AutomationEngine(options.engine))
    memo.ctx = Context(kube=kube, engine=engine, settings=options,
                       passes=asyncio.Semaphore(passes_in_flight(options.engine.concurrency)))
    options.engine.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        await engine.start()  # so the first update does not wait for it
    except EngineUnavailable as err:
        logger.warning("%s; the first update will try again", err)
    if options.metrics_port:
        metrics.serve(options.metrics_port)
    if options.flux_events_address:
        global FLUX_EVENTS
        FLUX_EVENTS = flux_events.FluxEventSink(options.flux_events_address)
        FLUX_EVENTS.start()
        logger.info("Stack Events also go to Flux's notification-controller at %s", options.flux_events_address)
    executor = (f"pod executor (a workspace pod per Stack, image {options.workspace.image})"
                if options.workspace is not None else "process executor")
    logger.info("strata operator started: %s, concurrency %d, state in %s", executor, options.engine.concurrency,
                options.engine.state_dir)


@kopf.on.cleanup()
async def stop_flux_events(**_: Any) -> None:
    global FLUX_EVENTS
    sink, FLUX_EVENTS = FLUX_EVENTS, None
    if sink is not None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(sink.drain(), timeout=3)  # the last events (e.g. a failure) still go out
        await sink.stop()


@kopf.on.probe(id="engine")
def engine_ready(memo: kopf.Memo, **_: Any) -> bool:
    return "ctx" in memo


@kopf.daemon(GROUP, VERSION, "stacks", cancellation_timeout=10.0, initial_delay=0)
async def stack_daemon(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, logger: Any,
                       stopped: kopf.DaemonStopped, **_: Any) -> None:
    ctx: Context = memo.ctx
    watched = ctx.registry.stacks.setdefault((namespace, name), Watched())
    metrics.STACKS_ACTIVE.inc()
    try:
        while not stopped:
            watched.wakeup.clear()
            try:
                async with ctx.passes:
                    if stopped:
                        break
                    delay = await reconcile_stack(ctx, body, logger)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a bug or API outage must not kill the daemon
                logger.error("reconcile failed: %s", redact(f"{type(err).__name__}: {err}"))
                delay = RETRY_REFS_SECONDS
            if delay == 0.0:
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(watched.wakeup.wait(), timeout=delay)
    finally:
        metrics.STACKS_ACTIVE.dec()
        ctx.registry.stacks.pop((namespace, name), None)


@kopf.on.event(GROUP, VERSION, "stacks")
def stack_changed(namespace: str, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        memo.ctx.engine.forget(_key(namespace, name))
    registry: Registry = memo.ctx.registry
    registry.wake(namespace, name, body)
    registry.wake_where(namespace, lambda w: name in w.prerequisites)
    program = ((body.get("spec") or {}).get("programRef") or {}).get("name")
    if program:  # a Stack of a later wave may now go
        registry.wake_where(namespace, lambda w: w.rollout_waiting and w.program == program)


@kopf.on.event(GROUP, VERSION, "programs")
async def program_changed(namespace: str, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo,
                          **_: Any) -> None:
    ctx: Context = memo.ctx
    ctx.registry.wake_where(namespace, lambda w: w.program == name)
    if type == "DELETED":
        return
    previous = dict(body.get("status") or {})
    status = program_status(dict(body), previous, st.rfc3339(_now()))
    if status != previous:  # our own patch's event comes back equal: no write loop
        await ctx.kube.patch_program_status(namespace, name, st.merge_patch(previous, status))


def _flux_changed(kind: str):
    def handler(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
        memo.ctx.registry.wake_where(namespace, lambda w: w.flux == (kind, name))
    return handler


for _kind in WATCHED_FLUX_KINDS:
    kopf.on.event(FLUX_GROUP, FLUX_PLURALS[_kind], id=f"flux-{FLUX_PLURALS[_kind]}")(_flux_changed(_kind))


async def _destroy_project(session: StackSession, spec: StackSpec, resolved: Resolved, work: Path,
                           logger: Any) -> Path:
    """The program to destroy with: the source as it is now, else the last successful update's copy."""
    try:
        _, handle = await _source_revision(session, spec, resolved)
        return await _materialise(spec, handle, work / "src", resolved)
    except (SourceError, SpecInvalid) as err:
        project = _stack_dir(session.ctx, session.namespace, session.name) / "last-successful"
        if not project.is_dir():
            message = (f"cannot destroy: the source is unavailable ({err}) and no successful update left a "
                       f"copy of the program; restore the source, or remove the finalizer {FINALIZER} to "
                       "abandon the stack's resources")
            await session.stall(st.STALLED_DESTROY_BLOCKED, message, st.EVENT_UPDATE_FAILURE)
            raise kopf.TemporaryError(redact(message), delay=60) from None
        logger.info("source unavailable; destroying from the last successful update's program")
        return project


@kopf.on.delete(GROUP, VERSION, "stacks")
async def finalize_stack(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, logger: Any,
                         retry: int, **_: Any) -> None:
    """Destroy then `stack rm` with destroyOnFinalize; never destroy without it. Never stuck silently."""
    ctx: Context = memo.ctx
    session = StackSession(ctx, body, logger)
    try:
        spec: StackSpec | None = parse_stack_spec(dict(body.get("spec") or {}), namespace)
    except SpecInvalid:
        spec = None
    decision = plan_finalize(spec)
    stack_dir = _stack_dir(ctx, namespace, name)
    metrics.forget(namespace, name)
    if not decision.destroy or spec is None:
        logger.info("releasing stack without destroy: %s", decision.message)
        shutil.rmtree(stack_dir, ignore_errors=True)
        return
    work = stack_dir / "runs" / f"destroy-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        try:
            resolved = await resolve_stack(spec, namespace, ctx.kube.secret_data, ctx.kube.configmap_data,
                                           ctx.settings.allow_operator_refs, ctx.engine.in_workspace_pods)
            await _recover_interrupted(session, spec, resolved)
            project = await _destroy_project(session, spec, resolved, work, logger)
            request = await _request(ctx, spec, namespace, name, project, resolved, work, "destroy on finalize")
        except RefError as err:
            if await ctx.kube.namespace_terminating(namespace):
                # What the destroy needs went with the namespace, and nothing new can be created in it.
                await session.stall(st.STALLED_NAMESPACE_TERMINATING, terminating_namespace_message(
                    namespace, name, str(err), (session.status.get("lastUpdate") or {}).get("permalink", "")))
            else:
                await session.stall(st.STALLED_DESTROY_BLOCKED, f"cannot destroy: {err}")
            raise kopf.TemporaryError(redact(str(err)), delay=RETRY_REFS_SECONDS) from None
        _event(body, st.EVENT_UPDATE_DETECTED, decision.message)
        result = await ctx.engine.destroy(request)
        metrics.UPDATE_DURATION.labels("destroy", result.outcome).observe(result.duration)
        if result.ok:
            result = await ctx.engine.remove_stack(request)
        if not result.ok:
            message = f"destroy failed: {result.message}"
            _event(body, st.EVENT_UPDATE_FAILURE, message, warning=True)
            await session.write(st.Verdict("reconciling", st.RECONCILING_RETRY, message))
            raise kopf.TemporaryError(redact(message), delay=min(600, 10 * 3 ** min(retry, 4)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(stack_dir, ignore_errors=True)
