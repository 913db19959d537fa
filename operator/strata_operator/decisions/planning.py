"""What to do with a Stack now: run the engine, or why not and when to look again (pure).

Everything here is a function of the spec, the object's metadata and status, the source revision the
handler resolved, and the time. Nothing runs unless something changed: a new generation, a new
source revision (commit, branch head, artifact, Program generation), a reconcile request
(`pulumi.com/reconciliation-request` or Flux's `reconcile.fluxcd.io/requestedAt`), the resync
period with `continueResyncOnCommitMatch`, or the end of a failure cooldown.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..api import FLUX_REQUESTED_AT_ANNOTATION, RECONCILE_REQUEST_ANNOTATION
from ..api.stack import MIN_RESYNC_SECONDS, Prerequisite, StackSpec
from ..api.status import (EXECUTOR_CANNOT_ISOLATE, FAILED, PULUMI_VERSION_TOO_LOW, READY, RECONCILING_PREREQUISITE,
                          RECONCILING_PREVIEW_FAILED, RECONCILING_PROCESSING, RECONCILING_RETRY,
                          SERVICE_ACCOUNT_REQUIRED, STALLED_CONFLICT, STALLED_UPDATE_FAILED, SUCCEEDED, SUSPENDED,
                          UPDATE_BLOCKED, UPDATE_INTERRUPTED, WORKSPACE_FAILED, Verdict, condition, has_changes,
                          parse_time)
from ..api.validation import STALLED_SPEC_INVALID, SpecIssue, parse_duration
from .approval import PLAN_REFUSED
from .backoff import cooldown_seconds
from .outputs import combine_digests

DEFAULT_STALL_AFTER_FAILURES = 5


@dataclasses.dataclass(frozen=True)
class Requests:
    """The reconcile-request annotations, and which of them were already handled."""

    pulumi: str = ""
    flux: str = ""
    flux_handled: str = ""

    @classmethod
    def of(cls, annotations: dict[str, str] | None, status: dict[str, Any] | None) -> "Requests":
        annotations = annotations or {}
        return cls(pulumi=annotations.get(RECONCILE_REQUEST_ANNOTATION, ""),
                   flux=annotations.get(FLUX_REQUESTED_AT_ANNOTATION, ""),
                   flux_handled=(status or {}).get("lastHandledReconcileAt", ""))

    def answered(self) -> "Requests":
        """The requests once a run has answered them (it records the Flux one as lastHandledReconcileAt)."""
        return dataclasses.replace(self, flux_handled=self.flux)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Either `run` (with the StackUpdateDetected message) or a verdict and when to look again."""

    run: Literal["up", "preview", "destroy"] | None
    message: str
    verdict: Verdict | None = None
    requeue_after: float | None = None


def _elapsed(since: str | None, now: datetime) -> float:
    moment = parse_time(since)
    return float("inf") if moment is None else (now - moment).total_seconds()


def soonest(*delays: float | None) -> float | None:
    """The soonest of the passes asked for (at least a second away), or None: only when woken."""
    present = [max(1.0, d) for d in delays if d is not None]
    return min(present) if present else None


def plan_stack(spec: StackSpec, generation: int, requests: Requests, last: dict[str, Any] | None,
               revision: str, now: datetime,
               stall_after_failures: int = DEFAULT_STALL_AFTER_FAILURES,
               min_resync_seconds: int = MIN_RESYNC_SECONDS) -> Plan:
    """Decide for a live (not deleting) Stack whose source resolved to `revision`."""
    kind: Literal["up", "preview"] = "preview" if spec.preview else "up"
    resync_seconds = spec.resync_seconds(min_resync_seconds)
    # Branch heads (ls-remote) and unwatched Flux kinds are polled every resync period; other sources
    # notify by watch.
    poll = float(resync_seconds) if spec.polled else None
    if not last:
        return Plan(kind, "Initial stack update")
    if last.get("generation") != generation:
        return Plan(kind, f"New stack generation: {generation}")
    if last.get("reconcileRequest", "") != requests.pulumi:
        return Plan(kind, f"Sync request: {requests.pulumi!r}")
    if requests.flux and requests.flux != requests.flux_handled:
        return Plan(kind, f"Reconcile requested at {requests.flux}")
    since_last = _elapsed(last.get("lastResyncTime"), now)

    if last.get("state") == SUCCEEDED:
        if last.get("lastSuccessfulCommit", "") != revision:
            return Plan(kind, f"New commit detected: {revision!r}")
        resync = None
        if spec.continue_resync_on_commit_match:
            if since_last >= resync_seconds:
                return Plan(kind, f"Resync time elapsed: {resync_seconds}s")
            resync = resync_seconds - since_last
        return Plan(None, "", Verdict("ready"), soonest(poll, resync))

    if last.get("state") == FAILED:
        if last.get("lastAttemptedCommit", "") != revision:
            return Plan(kind, f"New commit detected: {revision!r}")
        failures = int(last.get("failures", 1))
        message = last.get("message", "") or "update failed"
        if last.get("reason") == UPDATE_INTERRUPTED:
            return Plan(kind, "Resuming the update interrupted by an operator restart")
        if last.get("reason") == PLAN_REFUSED:
            # Nothing was applied, and only a new approval can apply anything: no backoff to wait out.
            return Plan(kind, "The engine refused the approved plan: previewing a new one")
        if last.get("reason") in (UPDATE_BLOCKED, PULUMI_VERSION_TOO_LOW, SERVICE_ACCOUNT_REQUIRED,
                                  EXECUTOR_CANNOT_ISOLATE, STALLED_SPEC_INVALID):
            stalled_reason = STALLED_UPDATE_FAILED if last.get("reason") == UPDATE_BLOCKED else last["reason"]
            return Plan(None, "", Verdict("stalled", stalled_reason,
                                          f"{message}. Retrying cannot fix this: once fixed, change the spec or "
                                          f"set a new {RECONCILE_REQUEST_ANNOTATION} annotation"), poll)
        conflict = last.get("reason") == STALLED_CONFLICT
        if conflict and not spec.retry_on_update_conflict:
            return Plan(None, "", Verdict("stalled", STALLED_CONFLICT,
                                          "another update holds the stack's lock; set retryOnUpdateConflict "
                                          "to retry, or change the spec or source"), poll)
        # A held lock is someone else's update, not this Stack failing: with retryOnUpdateConflict it is
        # retried (with backoff) until the lock is released, never stalled.
        if failures >= stall_after_failures and not conflict:
            stalled_reason = WORKSPACE_FAILED if last.get("reason") == WORKSPACE_FAILED else STALLED_UPDATE_FAILED
            return Plan(None, "", Verdict("stalled", stalled_reason,
                                          f"{failures} consecutive update failures; waiting for a spec or source "
                                          f"change: {message}"), poll)
        wait = cooldown_seconds(failures, spec.retry_max_backoff_duration_seconds)
        if since_last >= wait:
            return Plan(kind, f"Backoff time elapsed: {wait:g}s")
        if last.get("type") == "preview":
            retrying = Verdict("reconciling", RECONCILING_PREVIEW_FAILED,
                               f"preview failed ({failures} attempt(s)): {message}")
        else:
            retrying = Verdict("reconciling", RECONCILING_RETRY, f"{failures} update failure(s): {message}")
        return Plan(None, "", retrying, soonest(poll, wait - since_last))

    # An unknown state (hand-edited status): run, rather than sit silently.
    return Plan(kind, f"Unrecognised last update state {last.get('state')!r}")


def ready_for_another_revision(status: dict[str, Any], revision: str) -> bool:
    """Whether a Stack reads Ready for a revision other than `revision`: kstatus would call it current
    though it has not run `revision` yet (and has not said it will)."""
    ready = condition(status, READY)
    return bool(ready) and ready.get("status") == "True" and ready.get("reason") != SUSPENDED and (
        (status.get("lastUpdate") or {}).get("lastAttemptedCommit") != revision)


def new_revision_verdict(status: dict[str, Any], plan: Plan, revision: str) -> Verdict | None:
    """Reconciling, at once, for a Ready Stack about to run a revision it has not run yet. Its Ready is the
    previous revision's: kstatus, and so a Flux Kustomization waiting on the Stack, would read it as
    current and call a commit deployed before it is. None when nothing needs saying before the run."""
    if plan.run is None or not ready_for_another_revision(status, revision):
        return None
    return Verdict("reconciling", RECONCILING_PROCESSING, plan.message)


def drift_check_due(spec: StackSpec, last: dict[str, Any] | None, drift: dict[str, Any] | None, now: datetime,
                    floor: int = MIN_RESYNC_SECONDS) -> tuple[bool, float | None]:
    """(whether to look for drift now, seconds until the next look) for a Stack with nothing to run.

    Only a Stack whose last update succeeded is checked: drift is a difference from what it applied.
    The interval counts from the last check, or the last update (which refreshed or created the state).
    """
    if spec.drift_detection is None or not last or last.get("state") != SUCCEEDED:
        return False, None
    interval = max(parse_duration(spec.drift_detection.interval), float(floor))
    checked = (drift or {}).get("checkedAt") or ""
    since = min(_elapsed(checked, now), _elapsed(last.get("lastResyncTime"), now))
    if since >= interval:
        return True, interval
    return False, interval - since


def drift_status(summary: dict[str, int], checked_at: str) -> dict[str, Any]:
    """`status.drift`: when the last check ran, and what it found changed outside Pulumi."""
    return {"checkedAt": checked_at, "drifted": has_changes(summary),
            "changes": {op: n for op, n in sorted(summary.items()) if op != "same" and n}}


def suspended_verdict(last: dict[str, Any] | None) -> Verdict:
    """spec.suspend: nothing runs, and Ready keeps what the last update left (Flux's suspended objects)."""
    resume = "nothing runs until spec.suspend is false, then whatever changed meanwhile runs"
    if not last:
        return Verdict("suspended", SUSPENDED, f"suspended before its first update: {resume}")
    commit = last.get("lastAttemptedCommit") or last.get("lastSuccessfulCommit") or ""
    at = f" at {last['lastResyncTime']}" if last.get("lastResyncTime") else ""
    if last.get("state") == SUCCEEDED:
        return Verdict("suspended", SUSPENDED, f"suspended: {resume}; the last update ({commit}) succeeded{at}",
                       last_succeeded=True)
    return Verdict("suspended", SUSPENDED,
                   f"suspended: {resume}; the last update ({commit}) failed{at}: {last.get('message', '')}")


@dataclasses.dataclass(frozen=True)
class PrerequisiteCheck:
    name: str
    problem: str | None
    # When set, the prerequisite is stale: annotate it with this reconcile request to re-run it.
    rerun_request: str | None = None


def check_prerequisite(prereq: Prerequisite, other: dict[str, Any] | None, now: datetime) -> PrerequisiteCheck:
    """PKO semantics: the other Stack must have run its current generation and request, and succeeded
    (within `succeededWithinDuration` if given)."""
    if other is None:
        return PrerequisiteCheck(prereq.name, f"prerequisite {prereq.name!r} not found")
    meta = other.get("metadata", {})
    last = (other.get("status") or {}).get("lastUpdate") or {}
    request = (meta.get("annotations") or {}).get(RECONCILE_REQUEST_ANNOTATION, "")
    if not last or last.get("generation") != meta.get("generation") or last.get("reconcileRequest", "") != request:
        return PrerequisiteCheck(prereq.name, f"prerequisite {prereq.name!r} has not run to completion")
    if last.get("state") != SUCCEEDED:
        return PrerequisiteCheck(prereq.name, f"prerequisite {prereq.name!r} failed")
    outputs = (other.get("status") or {}).get("outputs") or {}
    missing = [name for name in prereq.outputs or () if name not in outputs]
    if missing:
        return PrerequisiteCheck(prereq.name, f"prerequisite {prereq.name!r} has no output "
                                              f"{', '.join(repr(n) for n in missing)}, which this Stack's "
                                              f"spec.prerequisites[].outputs lists: fix the list, or the "
                                              f"prerequisite's program")
    within = prereq.requirement.succeeded_within_duration if prereq.requirement else None
    if within is not None and _elapsed(last.get("lastResyncTime"), now) > parse_duration(within):
        return PrerequisiteCheck(prereq.name, f"prerequisite {prereq.name!r} is out of date (older than {within})",
                                 rerun_request=f"after-{last.get('name', '')}")
    return PrerequisiteCheck(prereq.name, None)


def consumed_digest(prereq: Prerequisite, other: dict[str, Any] | None) -> str | None:
    """The digest of what this Stack consumes of a prerequisite's outputs: all of them
    (`status.outputsDigest`) or those `prereq.outputs` names. None when unknown (the prerequisite has
    not recorded digests, e.g. a secret output whose value was not read): never a reason to re-run."""
    status = (other or {}).get("status") or {}
    if prereq.outputs is None:
        return status.get("outputsDigest") or None
    digests, outputs = status.get("outputDigests") or {}, status.get("outputs") or {}
    if not digests:
        return None
    picked: dict[str, str | None] = {}
    for name in prereq.outputs:
        if name in outputs and name not in digests:
            return None
        picked[name] = digests.get(name)  # None: the output does not exist (yet)
    return combine_digests(picked)


def prerequisite_digests(prerequisites: list[Prerequisite],
                         others: dict[str, dict[str, Any] | None]) -> dict[str, str]:
    """Name -> consumed digest of each prerequisite whose digest is known (recorded in lastUpdate by the run)."""
    found = {p.name: consumed_digest(p, others.get(p.name)) for p in prerequisites}
    return {name: digest for name, digest in found.items() if digest is not None}


def plan_on_prerequisite_outputs(spec: StackSpec, plan: Plan, last: dict[str, Any] | None,
                                 current: dict[str, str]) -> Plan:
    """A Stack with nothing else to run re-runs when what it consumes of a prerequisite's outputs changed
    since its last run (`lastUpdate.prerequisiteDigests`), not whenever a prerequisite ran: an update of
    the prerequisite that leaves those outputs as they were re-runs nothing. A digest the last run did not
    record (it ran before the prerequisite had one) counts as changed, as it may have."""
    if plan.run is not None or not last:
        return plan
    ran_against = last.get("prerequisiteDigests") or {}
    changed = [name for name, digest in sorted(current.items()) if ran_against.get(name) != digest]
    if not changed:
        return plan
    kind: Literal["up", "preview"] = "preview" if spec.preview else "up"
    names = ", ".join(repr(n) for n in changed)
    return Plan(kind, f"Outputs of prerequisite {names} changed since the last update")


def prerequisites_verdict(checks: list[PrerequisiteCheck]) -> Verdict | None:
    """None when all are satisfied; otherwise Reconciling/PrerequisiteNotSatisfied naming them."""
    failing = [c for c in checks if c.problem]
    if not failing:
        return None
    if len(failing) == 1:
        message = failing[0].problem or ""
    else:
        message = "multiple prerequisites were not satisfied: " + ", ".join(c.name for c in failing)
    return Verdict("reconciling", RECONCILING_PREREQUISITE, message)


@dataclasses.dataclass(frozen=True)
class FinalizePlan:
    destroy: bool
    message: str


def terminating_namespace_message(namespace: str, name: str, problem: str, permalink: str) -> str:
    """NamespaceTerminating (PKO v2's words): the destroy cannot run, so say what is left and how to release."""
    return (f"namespace {namespace!r} is terminating and the destroy cannot run ({problem}); the stack's resources "
            f"will NOT be deleted and must be cleaned up manually (see {permalink or 'the Pulumi backend'}). The "
            f"finalizer is kept so they are not orphaned silently; once they are handled, release the Stack with: "
            f"kubectl patch stack {name} -n {namespace} --type=merge -p '{{\"metadata\":{{\"finalizers\":[]}}}}'")


def plan_finalize(spec: StackSpec | None, refused: Sequence[SpecIssue], status: Mapping[str, Any]) -> FinalizePlan:
    """On deletion: destroy (then `stack rm`) only with destroyOnFinalize; a preview Stack owns nothing, nor
    does one refused before its first update ever started (`refused`: what of its spec the operator never
    runs, such as a forbidden workspace template; its destroy would be refused the same, for ever). One
    refused after it ran still has resources: its destroy fails naming what to fix."""
    if spec is None:
        return FinalizePlan(False, "spec is invalid; releasing without destroy")
    if not spec.destroy_on_finalize:
        return FinalizePlan(False, "destroyOnFinalize is not set; the stack's resources are kept")
    if spec.preview:
        return FinalizePlan(False, "preview stacks create no resources")
    if refused and not status.get("lastUpdate"):
        return FinalizePlan(False, f"no update of it ever ran (refused: {'; '.join(map(str, refused))}): nothing to "
                                   "destroy")
    return FinalizePlan(True, "Stack marked for deletion")


# What the Kubernetes provider says when it finds no cluster configuration at all.
NO_CLUSTER = ("configured Kubernetes cluster is unreachable", "unable to load Kubernetes client configuration")


def missing_service_account(message: str, service_account: str, namespace: str, in_workspace_pods: bool) -> str | None:
    """Why an update failed for want of spec.serviceAccountName, or None. Under the process executor a
    Stack's updates get a cluster only through its ServiceAccount (the operator lends them none of its
    own), so a program deploying through the default Kubernetes provider, as most PKO programs do, finds
    no cluster; retrying cannot change that."""
    if service_account or in_workspace_pods or not any(marker in message for marker in NO_CLUSTER):
        return None
    return (f"the program deploys to Kubernetes through the default provider, and this Stack names no "
            f"spec.serviceAccountName, so its updates have no cluster: the operator lends them no identity of its "
            f"own (fix: set spec.serviceAccountName to a ServiceAccount of namespace {namespace!r} with the rights "
            f"the program needs, e.g. one bound to the ClusterRole `edit` in that namespace; see the README's PKO "
            f"migration notes). The provider said: {message}")


def ever_deployed(status: Mapping[str, Any]) -> bool:
    """Whether any update of the Stack succeeded (so its backend stack exists, or existed): a destroy that
    finds no such stack in the backend of a Stack never deployed has nothing to destroy."""
    last = status.get("lastUpdate") or {}
    return last.get("state") == SUCCEEDED or bool(last.get("lastSuccessfulCommit")) or "outputs" in status
