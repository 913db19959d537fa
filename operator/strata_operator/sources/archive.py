"""Unpacking a source tarball safely: what Flux artifacts and the workspace agent's uploads go through.

Kept apart from git.py and flux.py so that the workspace agent imports nothing else.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path

from ..services.redaction import redact

DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_MEMBERS = 100_000


class SourceError(Exception):
    """The source cannot be fetched now (reported as Stalled/SourceUnavailable); message is redacted."""

    def __init__(self, message: str):
        super().__init__(redact(message))


class UnsafeArchive(SourceError):
    """The artifact would write outside its destination, or is larger than allowed."""


def resolves_inside(root: Path, candidate: str) -> bool:
    resolved = os.path.realpath(os.path.join(root, candidate))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


# Python's own extraction filter where it has one (3.11.4+; the operator image's Debian Python 3.11.2 has
# not): a second line of defence behind the checks below, which alone decide.
_TAR_FILTER = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}


def safe_extract(archive: Path, dest: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
    """Unpack a (gzipped) tarball into `dest`, refusing absolute or escaping paths, links that point
    outside `dest`, device files, and archives that expand past `max_bytes` or `max_members`."""
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_members:
                    raise UnsafeArchive(f"archive has more than {max_members} entries")
                name = member.name
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UnsafeArchive(f"archive entry {name!r} escapes the destination")
                if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                    raise UnsafeArchive(f"archive entry {name!r} is a device or fifo")
                # The parent must resolve inside root: an earlier symlink could point the write elsewhere.
                if not resolves_inside(root, posixpath.dirname(name) or "."):
                    raise UnsafeArchive(f"archive entry {name!r} is written through a link outside the destination")
                if member.issym():
                    target = posixpath.join(posixpath.dirname(name), member.linkname)
                    if member.linkname.startswith("/") or not resolves_inside(root, target):
                        raise UnsafeArchive(f"archive link {name!r} -> {member.linkname!r} points outside")
                if member.islnk() and not resolves_inside(root, member.linkname):
                    raise UnsafeArchive(f"archive hard link {name!r} -> {member.linkname!r} points outside")
                total += max(member.size, 0)
                if total > max_bytes:
                    raise UnsafeArchive(f"archive expands beyond the {max_bytes} byte limit")
                member.mode = (member.mode or 0o644) & 0o755
                tar.extract(member, root, set_attrs=member.isfile() or member.isdir(), **_TAR_FILTER)
    except tarfile.TarError as err:
        raise SourceError(f"artifact is not a readable tarball: {err}") from None
