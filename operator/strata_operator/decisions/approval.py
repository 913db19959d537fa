"""Manual approval of the exact plan (pure): when to preview and save a plan, when to apply it, and what
the Stack says while it waits.

With `spec.approval.mode: Manual` an update is never run straight away. The operator runs `pulumi
preview --save-plan`, keeps the plan in Secrets owned by the Stack and shows its digest and change
summary in `status.plan`; nothing is applied until the annotation `strata.dev/approve` carries that
digest, and then `pulumi up --plan` applies exactly that plan (the engine refuses any step outside it).
A plan made from another generation, commit, reconcile request or other resolved config and
environment than the current ones is stale: it is replaced by a new preview and never applied.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from ..api.status import Verdict, changes_text, has_changes

APPROVE_ANNOTATION = "strata.dev/approve"
AWAITING_APPROVAL = "AwaitingApproval"
# lastUpdate.reason when the engine refused an approved plan (the program or its inputs strayed from it).
PLAN_REFUSED = "PlanRefused"
EVENT_PLAN_READY = "PlanAwaitingApproval"
EVENT_PLAN_REFUSED = "PlanRefused"
PLAN_LABEL = "strata.dev/plan-of"
# A Secret holds at most 1 MiB; base64 makes 4 bytes of 3, and metadata needs room.
PLAN_CHUNK_BYTES = 700 * 1024
# The engine's words when `up --plan` strays from the plan.
PLAN_VIOLATION_MARKERS = ("violates plan", "plan for this stack", "was not in the plan")


@dataclasses.dataclass(frozen=True)
class PlanIdentity:
    """What a plan was made from: applying it is right only while all of it still holds."""

    generation: int
    revision: str
    reconcile_request: str
    inputs: str  # inputs_digest() of the resolved config and environment


def inputs_digest(config: Mapping[str, Any], secret_config: Mapping[str, str], env: Mapping[str, str]) -> str:
    """A digest of what the update resolved from Secrets and ConfigMaps: kept with the plan in its Secret
    (never in status, where a digest of a weak secret could be guessed by who may not read Secrets)."""
    blob = json.dumps({"config": config, "secrets": secret_config, "env": env}, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def plan_digest(plan: bytes) -> str:
    return "sha256:" + hashlib.sha256(plan).hexdigest()


def plan_chunks(plan: bytes, size: int = PLAN_CHUNK_BYTES) -> list[bytes]:
    """The plan cut into pieces that each fit one Secret (at least one piece, even for an empty plan)."""
    return [plan[start:start + size] for start in range(0, len(plan), size)] or [b""]


def plan_secret_name(stack: str, index: int) -> str:
    return f"{stack}-plan-{index}"


def plan_status(identity: PlanIdentity, digest: str, summary: Mapping[str, int], chunks: int,
                created: str) -> dict[str, Any]:
    """`status.plan`: which plan awaits approval, what it changes and what it was made from."""
    return {"digest": digest, "generation": identity.generation, "revision": identity.revision,
            "reconcileRequest": identity.reconcile_request, "changes": dict(sorted(summary.items())),
            "secrets": chunks, "createdAt": created}


def plan_refused(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in PLAN_VIOLATION_MARKERS)


@dataclasses.dataclass(frozen=True)
class Gate:
    """`plan`: preview and save a new plan; `apply`: run the approved plan; `wait`: say so and wait."""

    action: Literal["plan", "apply", "wait"]
    message: str
    verdict: Verdict | None = None


def awaiting_message(saved: Mapping[str, Any], namespace: str, name: str) -> str:
    return (f"plan {saved['digest']} ({changes_text(saved.get('changes') or {})}) from "
            f"{saved.get('revision') or 'generation ' + str(saved.get('generation'))} awaits approval: "
            f"`strata approve {namespace}/{name}`, or annotate {APPROVE_ANNOTATION}={saved['digest']}")


def approval_gate(saved: Mapping[str, Any] | None, saved_inputs: str | None, current: PlanIdentity,
                  approved: str, namespace: str, name: str, refused: str = "") -> Gate:
    """Decide for a Stack with manual approval whose update is due. `saved` is `status.plan`, and
    `saved_inputs` the inputs digest kept with it (None when its Secrets are gone); `refused`, the
    engine's words when it refused the last approved plan. A plan that changes nothing needs no approval."""
    if not saved or saved_inputs is None:
        return Gate("plan", "Previewing a plan for approval")
    made_from = PlanIdentity(int(saved.get("generation", 0)), saved.get("revision", ""),
                             saved.get("reconcileRequest", ""), saved_inputs)
    if made_from != current:
        stale = [what for what, before, now in (
            ("generation", made_from.generation, current.generation), ("commit", made_from.revision, current.revision),
            ("reconcile request", made_from.reconcile_request, current.reconcile_request),
            ("config or environment", made_from.inputs, current.inputs)) if before != now]
        return Gate("plan", f"Plan {saved['digest']} is stale ({', '.join(stale)} changed): previewing a new one")
    if approved and approved == saved["digest"]:
        return Gate("apply", f"Applying approved plan {saved['digest']}")
    if not has_changes(saved.get("changes") or {}):
        return Gate("apply", f"Applying plan {saved['digest']}, which changes no resource")
    message = awaiting_message(saved, namespace, name)
    if refused:
        message += f"; the engine refused the last approved plan: {refused}"
    return Gate("wait", "", Verdict("reconciling", AWAITING_APPROVAL, message))
