"""A Stack's program from a Flux source's artifact (GitRepository, OCIRepository, Bucket, ...).

The artifact is downloaded with a timeout and a size cap and checked against `status.artifact.digest`
before it is unpacked (sources/archive.py refuses links or paths that leave the destination and
archives that expand beyond a cap).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..services.redaction import REDACTOR
from .archive import SourceError, UnsafeArchive
from .git import DEFAULT_FETCH_TIMEOUT

DEFAULT_MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


DIGEST_ALGORITHMS = ("sha256", "sha384", "sha512")


class SourceNotReady(SourceError):
    """The source exists and its controller is still working on it: wait for it, nothing is stuck."""


@dataclasses.dataclass(frozen=True)
class FluxArtifact:
    url: str
    revision: str
    digest: str


def flux_artifact(source: dict[str, Any]) -> FluxArtifact:
    """The artifact of a Flux source that is Ready=True. SourceNotReady while its controller has not
    said yet (no Ready condition, or Unknown: a new source), SourceError once it reported a failure."""
    kind = source.get("kind", "source")
    name = source.get("metadata", {}).get("name", "")
    status = source.get("status") or {}
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        why = (ready or {}).get("message") or "no Ready condition yet"
        failed = (ready or {}).get("status") == "False"
        raise (SourceError if failed else SourceNotReady)(f"{kind} {name!r} is not Ready: {why}")
    artifact = status.get("artifact")
    if not artifact or not artifact.get("url"):
        raise SourceError(f"{kind} {name!r} has no artifact")
    # Flux before v1 published a bare sha256 hex in `checksum`.
    digest = artifact.get("digest") or (f"sha256:{artifact['checksum']}" if artifact.get("checksum") else "")
    if not digest:
        raise SourceError(f"{kind} {name!r} artifact has no digest to verify")
    return FluxArtifact(artifact["url"], artifact.get("revision", ""), digest)


def _register_url_credentials(url: str) -> None:
    """Credentials in a URL's userinfo are secrets: masked inside the URL by the redactor's pattern, but
    errors also quote them apart from it (urllib: "nonnumeric port: 'PASSWORD@host'")."""
    with contextlib.suppress(ValueError):
        parts = urllib.parse.urlsplit(url)
        REDACTOR.add(parts.password)


def download_artifact(artifact: FluxArtifact, dest_file: Path, max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
                      timeout: float = DEFAULT_FETCH_TIMEOUT) -> None:
    """Stream the artifact to `dest_file`, refusing more than `max_bytes`, and verify its digest."""
    algorithm, _, expected = artifact.digest.partition(":")
    if algorithm not in DIGEST_ALGORITHMS or not expected:
        raise SourceError(f"unsupported artifact digest {artifact.digest!r}; expected one of {DIGEST_ALGORITHMS}")
    hasher = hashlib.new(algorithm)
    size = 0
    _register_url_credentials(artifact.url)
    try:
        with urllib.request.urlopen(artifact.url, timeout=timeout) as response, dest_file.open("wb") as out:
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    raise UnsafeArchive(f"artifact is larger than the {max_bytes} byte limit")
                hasher.update(chunk)
                out.write(chunk)
    # HTTPException: a URL or an answer http.client cannot use (InvalidURL, BadStatusLine, IncompleteRead).
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise SourceError(f"artifact download from {artifact.url} failed: {err}") from None
    if hasher.hexdigest() != expected.lower():
        raise SourceError(f"artifact digest mismatch: expected {artifact.digest}, got {algorithm}:{hasher.hexdigest()}")
