"""Stack status: kstatus conditions with PKO's reasons, `lastUpdate`, and outputs (pure builders).

Exactly one of three shapes is ever written, so `kubectl wait --for=condition=Ready` and kstatus
both work:
  ready        Ready=True  (ProcessingCompleted)
  reconciling  Ready=False (NotReadyInProgress) + Reconciling=True (reason)
  stalled      Ready=False (NotReadyStalled)    + Stalled=True (reason)
and, while `spec.suspend` is true, Ready=True or False (Suspended) alone: the last update's outcome,
with nothing in progress and nothing stuck (kstatus: Current), as Flux's suspended objects read.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Literal

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
# Strata, spec.driftDetection: beside the three above, never instead of one (kstatus ignores it).
DRIFTED = "Drifted"
DRIFT_DETECTED = "DriftDetected"

# Condition reasons (PKO's names).
READY_COMPLETED = "ProcessingCompleted"
# spec.suspend (Strata, Flux's reason name): Ready keeps the last update's outcome under this reason.
SUSPENDED = "Suspended"
NOT_READY_IN_PROGRESS = "NotReadyInProgress"
NOT_READY_STALLED = "NotReadyStalled"
RECONCILING_PROCESSING = "StackProcessing"
RECONCILING_RETRY = "RetryingAfterFailure"
RECONCILING_PREREQUISITE = "PrerequisiteNotSatisfied"
# A preview Stack's preview failed, within the retry budget (PKO v2).
RECONCILING_PREVIEW_FAILED = "PreviewFailed"
# The Flux source is still being fetched: the Stack waits, it is not stuck (kstatus: in progress).
RECONCILING_SOURCE = "SourceNotReady"
# An update runs but its state backend does not answer (Strata): the engine waits and retries; the Stack
# says so while it lasts (checked every few seconds, services/backend_probe.py).
RECONCILING_BACKEND_UNREACHABLE = "BackendUnreachable"
# SpecInvalid, CrossNamespaceRefForbidden (api/stack.py) and WorkspaceTemplateForbidden (api/validation.py): the
# issues decide between them (SpecInvalid.reason).
STALLED_SOURCE_UNAVAILABLE = "SourceUnavailable"
STALLED_CONFLICT = "UpdateConflict"
STALLED_UPDATE_FAILED = "UpdateFailed"
STALLED_DESTROY_BLOCKED = "DestroyBlocked"
# spec.outputsSecret names a Secret that exists and is not this Stack's, or one the operator may not read
# (Strata): nothing runs until it is renamed, the Secret deleted or the grant given (checked every 30 s).
STALLED_OUTPUTS_SECRET = "OutputsSecretUnwritable"
# lastUpdate.reason of an update that succeeded but whose outputs could not be written to spec.outputsSecret:
# retried with backoff like any failure.
OUTPUTS_SECRET_FAILED = "OutputsSecretFailed"
# The program's dependencies do not install: PKO's workspace that fails to install.
WORKSPACE_FAILED = "WorkspaceFailed"
# On deletion the namespace is terminating and what the destroy needs is gone with it (PKO v2).
STALLED_NAMESPACE_TERMINATING = "NamespaceTerminating"
# lastUpdate.reason of a run that died with the operator (not a Stack failure: resumed without backoff).
UPDATE_INTERRUPTED = "UpdateInterrupted"
OUT_OF_MEMORY = "OutOfMemory"  # the pod executor: the kernel killed a process of the update at the pod's limit
# lastUpdate.reason of a run that failed in a way retrying cannot fix (engine outcome "blocked"): Stalled
# at once, until the spec, the source or a reconcile request changes.
UPDATE_BLOCKED = "UpdateBlocked"
# A blocked run whose cause is the operator's pulumi CLI being too old for what the spec asks (PKO's reason
# for a workspace image's CLI): Stalled at once like UpdateBlocked, under this reason.
PULUMI_VERSION_TOO_LOW = "PulumiVersionTooLow"

# A run whose program reached for a Kubernetes cluster through the default provider, on a Stack with no
# spec.serviceAccountName: under the process executor its updates have no cluster (the operator lends
# them no identity of its own). Stalled at once like UpdateBlocked, under this reason.
SERVICE_ACCOUNT_REQUIRED = "ServiceAccountRequired"
# A Stack of a namespace the operator does not trust, whose program the process executor cannot sandbox
# here (no bubblewrap, no user namespaces): Stalled at once, nothing run (engine/process/sandbox.py).
EXECUTOR_CANNOT_ISOLATE = "ExecutorCannotIsolate"
# A Stack in a namespace the operator does not serve: it has no right to the Secrets, tokens or pods its Stacks
# need there (rbac/served-namespace.yaml), until a team environment or an admin grants them.
STALLED_NAMESPACE_NOT_SERVED = "NamespaceNotServed"

# Event reasons (PKO's names, and Flux's for suspend).
EVENT_SUSPENDED = "Suspended"
EVENT_RESUMED = "Resumed"
EVENT_UPDATE_DETECTED = "StackUpdateDetected"
EVENT_UPDATE_SUCCESSFUL = "StackCreated"
EVENT_UPDATE_FAILURE = "StackUpdateFailure"
EVENT_CONFLICT = "StackUpdateConflictDetected"
EVENT_CONFIG_INVALID = "StackConfigInvalid"
EVENT_GIT_AUTH_FAILURE = "StackGitAuthenticationFailure"
EVENT_INITIALIZATION_FAILURE = "StackInitializationFailure"
EVENT_OUTPUT_FAILURE = "StackOutputRetrievalFailure"
# Also an engine result's and lastUpdate's reason: the backend has no such stack.
EVENT_NOT_FOUND = STACK_NOT_FOUND = "StackNotFound"
EVENT_BACKEND_UNREACHABLE = RECONCILING_BACKEND_UNREACHABLE
EVENT_BACKEND_REACHABLE = "BackendReachable"
# An update finished but could not delete its lock from the backend (gone as it ended): deleted before the next run.
EVENT_LOCK_LEFT = "BackendLockLeft"
# A run lost with its workspace whose update had finished: recorded, not run again.
EVENT_UPDATE_RECOVERED = "StackUpdateRecovered"

SUCCEEDED = "succeeded"
FAILED = "failed"
SECRET_MASK = "[secret]"

Phase = Literal["ready", "reconciling", "stalled", "suspended"]


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the Stack's conditions should say."""

    phase: Phase
    reason: str = READY_COMPLETED
    message: str = "the stack has been processed and is up to date"
    # Suspended only: whether the last update succeeded, which is what Ready says while nothing runs.
    last_succeeded: bool = False


def condition(status: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    """The condition of type `ctype` in a status, or None."""
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == ctype), None)


def build_conditions(previous: list[dict[str, Any]] | None, verdict: Verdict, generation: int,
                     now: datetime) -> list[dict[str, Any]]:
    """The full conditions list for `verdict`; lastTransitionTime only moves when a status flips."""
    before = {c.get("type"): c for c in previous or []}

    def condition(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
        old = before.get(ctype)
        changed = old is None or old.get("status") != status
        return {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": rfc3339(now) if changed else old["lastTransitionTime"],
        }

    # Conditions of other types (Drifted) are not the verdict's: they stay as they are.
    others = [c for c in previous or [] if c.get("type") not in (READY, RECONCILING, STALLED)]
    return _verdict_conditions(condition, verdict) + others


def _verdict_conditions(condition, verdict: Verdict) -> list[dict[str, Any]]:
    if verdict.phase == "ready":
        return [condition(READY, "True", READY_COMPLETED, verdict.message)]
    if verdict.phase == "suspended":
        return [condition(READY, "True" if verdict.last_succeeded else "False", SUSPENDED, verdict.message)]
    if verdict.phase == "reconciling":
        return [condition(READY, "False", NOT_READY_IN_PROGRESS, "reconciliation is in progress"),
                condition(RECONCILING, "True", verdict.reason, verdict.message)]
    return [condition(READY, "False", NOT_READY_STALLED, "reconciliation is stalled"),
            condition(STALLED, "True", verdict.reason, verdict.message)]


def with_drifted(conditions: list[dict[str, Any]] | None, drifted: bool, message: str, generation: int,
                 now: datetime) -> list[dict[str, Any]]:
    """The conditions with Drifted set (changes were made outside Pulumi) or removed (none found)."""
    kept = [c for c in conditions or [] if c.get("type") != DRIFTED]
    if not drifted:
        return kept
    old = next((c for c in conditions or [] if c.get("type") == DRIFTED), None)
    return kept + [{"type": DRIFTED, "status": "True", "reason": DRIFT_DETECTED, "message": message,
                    "observedGeneration": generation,
                    "lastTransitionTime": old["lastTransitionTime"] if old else rfc3339(now)}]


def changes_text(summary: dict[str, int]) -> str:
    """`create 1, update 2` in the engine's words, without the unchanged ones."""
    shown = {op: n for op, n in sorted(summary.items()) if op != "same" and n}
    return ", ".join(f"{op} {n}" for op, n in shown.items()) or "no changes"


def success_message(summary: dict[str, int]) -> str:
    """The Event of a successful update: PKO's words, then what it changed."""
    return "Successfully updated stack" + (f" ({changes_text(summary)})" if summary else "")


def has_changes(summary: dict[str, int]) -> bool:
    return any(n for op, n in summary.items() if op != "same")


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """Identity of one engine run, recorded when it starts (status.currentUpdate)."""

    name: str
    kind: str  # up | preview | destroy
    generation: int
    reconcile_request: str
    commit: str
    started: datetime
    host: str
    # What the run consumed of its prerequisites' outputs: name -> digest (decisions/planning.prerequisite_digests).
    prerequisite_digests: tuple[tuple[str, str], ...] = ()
    # The program's project name: what a recovery needs to find the run's stack in the backend when the
    # program itself is gone (a stack name need not name its project).
    project: str = ""
    # Flux's reconcile.fluxcd.io/requestedAt this run answers: a recovery that records the run records it too.
    flux_request: str = ""

    def consumed(self) -> dict[str, Any]:
        return {"prerequisiteDigests": dict(self.prerequisite_digests)} if self.prerequisite_digests else {}


def current_update(run: RunRecord) -> dict[str, Any]:
    return {
        "name": run.name,
        "type": run.kind,
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "commit": run.commit,
        "startTime": rfc3339(run.started),
        "host": run.host,
        **({"project": run.project} if run.project else {}),
        **({"fluxRequestedAt": run.flux_request} if run.flux_request else {}),
        **run.consumed(),
    }


def run_from_current_update(current: dict[str, Any]) -> RunRecord:
    return RunRecord(
        name=current.get("name", ""),
        kind=current.get("type", "up"),
        generation=int(current.get("generation", 0)),
        reconcile_request=current.get("reconcileRequest", ""),
        commit=current.get("commit", ""),
        started=parse_time(current.get("startTime")) or datetime.fromtimestamp(0, timezone.utc),
        host=current.get("host", ""),
        prerequisite_digests=tuple(sorted((current.get("prerequisiteDigests") or {}).items())),
        project=current.get("project", ""),
        flux_request=current.get("fluxRequestedAt", ""),
    )


RUN_TAG = "strata run "


def update_message(message: str, run: str) -> str:
    """The message the engine records with a run's update: the plan's words and the run's name, by which
    a recovery tells the interrupted run's update in the backend's history from any other."""
    return f"{message} [{RUN_TAG}{run}]" if message else f"[{RUN_TAG}{run}]"


def is_update_of(message: str, run: str) -> bool:
    """The backend's update `message` was recorded by the run named `run` (see update_message)."""
    return bool(run) and message.endswith(f"[{RUN_TAG}{run}]")


def succeeded_update(run: RunRecord, permalink: str, now: datetime) -> dict[str, Any]:
    return {
        "name": run.name,
        "type": run.kind,
        "state": SUCCEEDED,
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "lastAttemptedCommit": run.commit,
        "lastSuccessfulCommit": run.commit,
        "permalink": permalink,
        "lastResyncTime": rfc3339(now),
        "message": "",
        "failures": 0,
        **run.consumed(),
    }


def failed_update(previous: dict[str, Any] | None, run: RunRecord, reason: str, message: str,
                  permalink: str, now: datetime) -> dict[str, Any]:
    """A failed run; `failures` counts consecutive failures of the same generation, request and commit."""
    prev = previous or {}
    same_target = (prev.get("state") == FAILED and prev.get("generation") == run.generation
                   and prev.get("reconcileRequest", "") == run.reconcile_request
                   and prev.get("lastAttemptedCommit", "") == run.commit)
    return {
        "name": run.name,
        "type": run.kind,
        "state": FAILED,
        "reason": reason,
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "lastAttemptedCommit": run.commit,
        "lastSuccessfulCommit": prev.get("lastSuccessfulCommit", ""),
        "permalink": permalink,
        "lastResyncTime": rfc3339(now),
        "message": message,
        "failures": (int(prev.get("failures", 0)) + 1) if same_target else 1,
        **run.consumed(),
    }


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: keys `new` dropped become null, so a
    stale `lastUpdate.reason` or a removed output does not survive the patch."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = merge_patch(old.get(key), value)
    return patch


def outputs_for_status(outputs: dict[str, tuple[Any, bool]]) -> dict[str, Any]:
    """Stack outputs for `.status.outputs`; secret values never leave the engine: "[secret]"."""
    return {name: SECRET_MASK if secret else value for name, (value, secret) in sorted(outputs.items())}
