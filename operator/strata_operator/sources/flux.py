"""A Stack's program from a Flux source's artifact (GitRepository, OCIRepository, Bucket, ...).

The artifact is streamed to a file, from an http(s) server only (never the operator's own files), within a
deadline and the operator's source size cap, and checked against `status.artifact.digest` before it is
unpacked (sources/archive.py refuses links or paths that leave the destination and archives that expand
beyond the cap).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..services.redaction import MASK
from .archive import SizeCap, SourceError
from .git import DEFAULT_FETCH_TIMEOUT

# The whole download's: a server trickling a byte within every read's timeout would hold a source thread forever.
DOWNLOAD_DEADLINE_SECONDS = 300.0

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


def _without_url_password(text: str, url: str) -> str:
    """Credentials in a URL's userinfo are masked inside the URL by every redactor's pattern, but errors
    also quote them apart from it (urllib: "nonnumeric port: 'PASSWORD@host'")."""
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(url).password
        if password:
            return text.replace(password, MASK)
    return text


def download_artifact(artifact: FluxArtifact, dest_file: Path, cap: SizeCap = SizeCap(),
                      timeout: float = DEFAULT_FETCH_TIMEOUT,
                      deadline_seconds: float = DOWNLOAD_DEADLINE_SECONDS) -> None:
    """Stream the artifact to `dest_file`, refusing more than the cap or a download that outlasts
    `deadline_seconds` (`timeout`: each read's), and verify its digest."""
    algorithm, _, expected = artifact.digest.partition(":")
    if algorithm not in DIGEST_ALGORITHMS or not expected:
        raise SourceError(f"unsupported artifact digest {artifact.digest!r}; expected one of {DIGEST_ALGORITHMS}")
    if not artifact.url.lower().startswith(("http://", "https://")):
        raise SourceError(f"artifact URL {artifact.url!r}: not http:// or https:// (the operator fetches artifacts "
                          "from a server, never from its own files)")
    hasher = hashlib.new(algorithm)
    size, deadline = 0, time.monotonic() + deadline_seconds
    try:
        with urllib.request.urlopen(artifact.url, timeout=timeout) as response, dest_file.open("wb") as out:
            while chunk := response.read1(1 << 16):  # what has come (read() waits for all 64 KiB)
                size += len(chunk)
                if size > cap.max_bytes:
                    raise cap.refusal(f"the artifact at {artifact.url}")
                if time.monotonic() > deadline:
                    raise SourceError(f"artifact download from {artifact.url} took more than {deadline_seconds:g}s")
                hasher.update(chunk)
                out.write(chunk)
    # HTTPException: a URL or an answer http.client cannot use (InvalidURL, BadStatusLine, IncompleteRead).
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise SourceError(_without_url_password(f"artifact download from {artifact.url} failed: {err}",
                                                artifact.url)) from None
    if hasher.hexdigest() != expected.lower():
        raise SourceError(f"artifact digest mismatch: expected {artifact.digest}, got {algorithm}:{hasher.hexdigest()}")
