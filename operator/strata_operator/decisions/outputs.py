"""Stack outputs beyond `.status.outputs` (pure): digests that say whether outputs changed without
saying what they are, and the Secret that `spec.outputsSecret` names.

Digests are per output, so a dependent can compare only the outputs it consumes
(`spec.prerequisites[].outputs`): a plain output's is `sha256:` of its canonical JSON (its value is in
status anyway); a secret output's is `hmac-sha256:` keyed with the Stack's own random key, kept in the
operator's state directory, so a low-entropy secret cannot be guessed by hashing candidates against
the digest in status. `status.outputsDigest` combines them all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from typing import Any

# Labels on a Stack's outputs Secret: what made it and for which Stack (`kubectl get secret -l`).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "strata-operator"
STACK_LABEL = "pulumi.com/stack-name"
# Keys a Secret's data may have.
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def canonical(value: Any) -> bytes:
    """The JSON encoding digests are taken over: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def output_digest(value: Any, secret: bool, key: bytes) -> str:
    if secret:
        return "hmac-sha256:" + hmac.new(key, canonical(value), hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(canonical(value)).hexdigest()


def output_digests(outputs: dict[str, tuple[Any, bool]], real: dict[str, Any] | None,
                   key: bytes) -> dict[str, str]:
    """Per-output digests over real values. `outputs` are as the event log has them (a secret's value
    withheld); `real` the values read with --show-secrets, if they were. Without them a secret output
    has no digest (it is unknown, not unchanged)."""
    digests = {}
    for name, (value, secret) in outputs.items():
        if not secret:
            digests[name] = output_digest(value, False, key)
        elif real is not None and name in real:
            digests[name] = output_digest(real[name], True, key)
    return digests


def combine_digests(digests: dict[str, str | None]) -> str:
    """One digest over several outputs' digests (by name; None: the output does not exist)."""
    return "sha256:" + hashlib.sha256(canonical(digests)).hexdigest()


def outputs_digest(outputs: dict[str, Any], digests: dict[str, str]) -> str | None:
    """`status.outputsDigest`: over every output, or None when one of them has no digest."""
    if any(name not in digests for name in outputs):
        return None
    return combine_digests({name: digests[name] for name in outputs})


def secret_value(value: Any) -> str:
    """An output as a Secret value: strings as they are, anything else as JSON (as `stack output --json`)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def outputs_secret_data(real: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(base64 `data` of the Secret, output names that cannot be Secret keys and were left out)."""
    data, skipped = {}, []
    for name, value in sorted(real.items()):
        if _SECRET_KEY.match(name) and len(name) <= 253:
            data[name] = base64.b64encode(secret_value(value).encode()).decode()
        else:
            skipped.append(name)
    return data, skipped


def owned_by(obj: dict[str, Any] | None, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in ((obj or {}).get("metadata") or {}).get("ownerReferences") or [])


def outputs_secret_conflict(existing: dict[str, Any] | None, stack_name: str, stack_uid: str,
                            secret_name: str) -> str | None:
    """Why the Secret cannot receive the outputs (it exists and is not this Stack's), or None."""
    if existing is None or owned_by(existing, stack_uid):
        return None
    owners = [f"{ref.get('kind')}/{ref.get('name')}" for ref in
              (existing.get("metadata") or {}).get("ownerReferences") or []]
    held = f"is owned by {', '.join(owners)}" if owners else "has no owner"
    return (f"spec.outputsSecret.name: Secret {secret_name!r} already exists and {held}, not by Stack "
            f"{stack_name!r}; the operator never overwrites a Secret it did not create. Name another Secret in "
            f"spec.outputsSecret.name, or delete {secret_name!r} so the operator can create it")


def outputs_secret_manifest(namespace: str, secret_name: str, stack_name: str, stack_uid: str,
                            data: dict[str, str], resource_version: str = "") -> dict[str, Any]:
    """The Secret holding a Stack's outputs: labelled, and owned by the Stack (deleted with it)."""
    metadata: dict[str, Any] = {
        "name": secret_name, "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, STACK_LABEL: stack_name},
        "ownerReferences": [{"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": stack_name,
                             "uid": stack_uid, "controller": True}],
    }
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata, "data": data}


def secret_needs_write(existing: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether the Secret differs from what it should hold (data, labels, owner): idle runs write nothing."""
    if existing is None:
        return True
    meta, want = existing.get("metadata") or {}, wanted["metadata"]
    labels = meta.get("labels") or {}
    return ((existing.get("data") or {}) != wanted["data"] or existing.get("type", "Opaque") != wanted["type"]
            or any(labels.get(k) != v for k, v in want["labels"].items()))
