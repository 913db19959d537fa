"""PKO v2's Update (`auto.pulumi.com/v1alpha1`): its spec parsed naming the field, and its status as PKO v2
writes it: conditions Progressing/Failed/Complete with PKO's reasons, the outputs Secret
`<update>-stack-outputs`, and when a completed Update is due for deletion (pure).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from ..api import AUTO_GROUP, AUTO_VERSION
from .auto_conditions import COMPLETE, FAILED, PROGRESSING
from .status import condition
from .validation import SpecInvalid, SpecIssue, parse_duration

UPDATE_TYPES = ("preview", "up", "refresh", "destroy")


# PKO's labels and annotation on an Update's outputs Secret.
COMPONENT_LABEL, UPDATE_NAME_LABEL = "auto.pulumi.com/component", "auto.pulumi.com/update-name"


SECRET_OUTPUTS_ANNOTATION = "pulumi.com/secrets"


_SECRET_KEY_CHARS = re.compile(r"[^-._a-zA-Z0-9]")


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    workspace_name: str
    stack_name: str
    type: str
    ttl_seconds: float | None = None
    parallel: int = 0
    message: str = ""
    expect_no_changes: bool = False
    replace: tuple[str, ...] = ()
    target: tuple[str, ...] = ()
    target_dependents: bool = False
    refresh: bool = False
    continue_on_error: bool = False
    remove: bool = False
    run_program: bool = False


def parse_update(raw: dict[str, Any] | None) -> UpdateSpec:
    """An Update's spec; SpecInvalid names each field that cannot run and its fix."""
    raw = raw or {}
    issues = []
    kind = raw.get("type") or ""
    if kind not in UPDATE_TYPES:
        issues.append(SpecIssue("spec.type", f"{kind!r} is not an operation", f"use one of {', '.join(UPDATE_TYPES)}"))
    if not raw.get("workspaceName"):
        issues.append(SpecIssue("spec.workspaceName", "empty", "name the Workspace in this namespace to update"))
    if not raw.get("stackName"):
        issues.append(SpecIssue("spec.stackName", "empty", "name the Pulumi stack to select (e.g. dev)"))
    ttl = None
    if raw.get("ttlAfterCompleted"):
        try:
            ttl = parse_duration(str(raw["ttlAfterCompleted"]))
        except ValueError:
            issues.append(SpecIssue("spec.ttlAfterCompleted", f"{raw['ttlAfterCompleted']!r} is not a duration",
                                    "write a Go duration such as 90s, 10m or 1h"))
    parallel = int(raw.get("parallel") or 0)
    if parallel < 0:
        issues.append(SpecIssue("spec.parallel", "negative", "give 1 or more, or leave it out for no limit"))
    if issues:
        raise SpecInvalid(issues)
    return UpdateSpec(str(raw["workspaceName"]), str(raw["stackName"]), kind, ttl, parallel, str(raw.get("message") or ""),
                      bool(raw.get("expectNoChanges")), tuple(raw.get("replace") or ()), tuple(raw.get("target") or ()),
                      bool(raw.get("targetDependents")), bool(raw.get("refresh")), bool(raw.get("continueOnError")),
                      bool(raw.get("remove")), bool(raw.get("runProgram")))


def progressing() -> list[tuple[str, str, str, str]]:
    return [(PROGRESSING, "True", "Progressing", ""), (FAILED, "False", "Progressing", ""),
            (COMPLETE, "False", "Progressing", "")]


def waiting(reason: str) -> list[tuple[str, str, str, str]]:
    """Not started: WorkspaceNotFound or WorkspaceNotReady (PKO retries when the Workspace turns Ready)."""
    return [(PROGRESSING, "False", reason, ""), (FAILED, "False", "Progressing", ""),
            (COMPLETE, "False", "Progressing", "")]


def finished(failed_reason: str | None) -> list[tuple[str, str, str, str]]:
    """Complete, succeeded (None) or failed with PKO's reason (Unknown, UpdateConflict, ...)."""
    failed = ("False", "UpdateSucceeded") if failed_reason is None else ("True", failed_reason)
    return [(PROGRESSING, "False", "Complete", ""), (FAILED, *failed, ""), (COMPLETE, "True", "Updated", "")]


def aborted(reason: str) -> list[tuple[str, str, str, str]]:
    """PKO's markFailed: Aborted (interrupted), Canceled, or Strata's SpecInvalid."""
    return [(PROGRESSING, "False", "Failed", ""), (FAILED, "True", reason, ""), (COMPLETE, "True", "Failed", "")]


def ttl_remaining(status: dict[str, Any] | None, ttl_seconds: float | None, now: datetime) -> float | None:
    """Seconds until a completed Update is due for deletion (<= 0: now); None when it is kept."""
    complete = condition(status, COMPLETE)
    if ttl_seconds is None or not complete or complete.get("status") != "True":
        return None
    since = datetime.strptime(complete["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return (since + timedelta(seconds=ttl_seconds) - now).total_seconds()


def _go_json(value: Any) -> bytes:
    """json.Marshal's bytes: compact, map keys sorted, <>& escaped as Go escapes them."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def outputs_secret(namespace: str, name: str, uid: str, outputs: dict[str, tuple[Any, bool]],
                   real: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """PKO's `<update>-stack-outputs` Secret: immutable, one key per output (its name with characters a
    Secret key cannot hold replaced by _) holding the value's JSON, the secret ones listed in the
    annotation pulumi.com/secrets, owned by the Update. Also the outputs left out: secret ones whose
    real value could not be read."""
    data, secrets, missing = {}, [], []
    for output, (value, secret) in sorted(outputs.items()):
        if secret and (real is None or output not in real):
            missing.append(output)
            continue
        key = _SECRET_KEY_CHARS.sub("_", output)
        data[key] = base64.b64encode(_go_json(real[output] if secret else value)).decode()  # type: ignore[index]
        if secret:
            secrets.append(key)
    body = {"apiVersion": "v1", "kind": "Secret", "immutable": True, "data": data,
            "metadata": {"name": f"{name}-stack-outputs", "namespace": namespace,
                         "labels": {COMPONENT_LABEL: "update", UPDATE_NAME_LABEL: name},
                         "annotations": {SECRET_OUTPUTS_ANNOTATION: json.dumps(sorted(secrets), separators=(",", ":"))},
                         "ownerReferences": [{"apiVersion": f"{AUTO_GROUP}/{AUTO_VERSION}", "kind": "Update",
                                              "name": name, "uid": uid}]}}
    return body, missing
