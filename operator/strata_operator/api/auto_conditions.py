"""Conditions of PKO v2's Workspace and Update (`auto.pulumi.com/v1alpha1`), read and written as PKO's
meta.SetStatusCondition writes them (pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .status import condition, rfc3339

PROGRESSING, FAILED, COMPLETE, READY, STALLED = "Progressing", "Failed", "Complete", "Ready", "Stalled"


def is_true(status: dict[str, Any] | None, ctype: str) -> bool:
    return (condition(status, ctype) or {}).get("status") == "True"


def set_conditions(previous: list[dict[str, Any]] | None, wanted: list[tuple[str, str, str, str]], generation: int,
                   now: datetime) -> list[dict[str, Any]]:
    """meta.SetStatusCondition for each (type, status, reason, message): lastTransitionTime moves only when
    the status flips; conditions of other types stay."""
    result = [dict(c) for c in previous or []]
    for ctype, status, reason, message in wanted:
        old = next((c for c in result if c.get("type") == ctype), None)
        new = {"type": ctype, "status": status, "reason": reason, "message": message,
               "observedGeneration": generation,
               "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status
               else rfc3339(now)}
        if old is None:
            result.append(new)
        else:
            old.clear()
            old.update(new)
    return result
