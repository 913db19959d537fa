"""Unpacking a source tarball safely: what Flux artifacts and the workspace agent's uploads go through;
and the cap on a source's size (`SizeCap`, --max-source-bytes) that every source is held to as it is
fetched, unpacked or packed.

Kept apart from git.py and flux.py so that the workspace agent imports nothing else.

tarfile only reads the headers here: every path is made by this module, the same on every Python (the
operator image's Debian 3.11.2 has no extraction filter). Directories and regular files first, each
step of a path opened without following links, so nothing is ever written through one; symbolic links
last, once the whole tree exists, and each is then resolved with every link of its chain: one that
leads outside the destination empties it and refuses the archive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import os
import shutil
import stat
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

from ..services.redaction import mask_patterns

DEFAULT_MAX_SOURCE_BYTES = 512 * 1024 * 1024
# The cap the operator holds a workspace pod's upload to, sent with it: the agent holds it to the same.
SOURCE_CAP_HEADER = "X-Strata-Max-Source-Bytes"
DEFAULT_MAX_MEMBERS = 100_000
# File data is read in chunks of this size, and no header (with its pax records or long names) may be
# larger: one that says otherwise costs the operator neither its memory nor a skip through gigabytes.
CHUNK_BYTES = 64 * 1024

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SourceError(Exception):
    """The source cannot be fetched now (reported as Stalled/SourceUnavailable). Credentials in URLs, keys
    and headers are masked at once; the secrets of the namespace whose source it is are masked where the
    message is shown (that namespace's status and Events; the log masks every secret). No namespace is
    known here, and masking with every namespace's secrets would let one team's secrets mask another's."""

    def __init__(self, message: str):
        super().__init__(mask_patterns(message))


class UnsafeArchive(SourceError):
    """The artifact would write outside its destination, or is larger than allowed."""


class SourceTooLarge(UnsafeArchive):
    """A source larger than the operator's size cap."""


def byte_size(count: int) -> str:
    """A size as --max-source-bytes takes it, in MiB when it is whole ones: 512 MiB, 2000000 bytes."""
    return f"{count >> 20} MiB" if count and count % (1 << 20) == 0 else f"{count} bytes"


@dataclasses.dataclass(frozen=True)
class SizeCap:
    """The operator's cap on one source's size (--max-source-bytes): what git fetches and checks out, a Flux
    artifact downloaded and unpacked, a workspace pod's upload. Each is checked as it is written (never
    buffered whole), and refused naming `field`, the Stack's (or Workspace's) field the source comes from."""

    max_bytes: int = DEFAULT_MAX_SOURCE_BYTES
    field: str = "the source"

    def refusal(self, what: str) -> SourceTooLarge:
        return SourceTooLarge(f"{self.field}: {what} exceeds the operator's source size cap of "
                              f"{byte_size(self.max_bytes)} (fix: make the source smaller, e.g. keep large files and "
                              "build outputs out of it, or have the operator's admins raise --max-source-bytes)")


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files under `root`, links not followed, `.git` directories below it left
    out (a checkout's own history is not its program)."""
    total = 0
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name != ".git"]
        for name in files:
            with contextlib.suppress(OSError):  # gone meanwhile: git's temporary files
                info = os.lstat(os.path.join(directory, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total


def resolves_inside(root: Path, candidate: str) -> bool:
    resolved = os.path.realpath(os.path.join(root, candidate))
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


@dataclasses.dataclass(frozen=True)
class _Link:
    name: str
    parts: tuple[str, ...]
    target: str


class _BoundedStream:
    """The decompressed tarball as tarfile reads it, never past what the unpacker has allowed: a header's
    sizes are the archive's word, and one that lies must not make tarfile buffer or skip beyond it."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.limit, self.after = raw, CHUNK_BYTES, ""

    def allow(self, count: int, after: str) -> None:
        self.limit, self.after = self.raw.tell() + count, after

    def _refuse_beyond(self, position: int) -> None:
        if position > self.limit:
            where = f"after entry {self.after!r}" if self.after else "at its start"
            raise UnsafeArchive(f"archive has a header {where} larger than {CHUNK_BYTES} bytes")

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, size: int = -1) -> bytes:
        self._refuse_beyond(self.raw.tell() + (size if size >= 0 else self.limit + 1))
        try:
            return self.raw.read(size)
        except (OSError, EOFError, zlib.error) as err:  # the compressed stream, told apart from writes
            raise tarfile.ReadError(str(err)) from None

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._refuse_beyond(offset if whence == os.SEEK_SET else self.limit + 1)
        try:
            return self.raw.seek(offset)
        except (OSError, EOFError, zlib.error) as err:
            raise tarfile.ReadError(str(err)) from None


def safe_extract(archive: Path, dest: Path, cap: SizeCap = SizeCap(), max_members: int = DEFAULT_MAX_MEMBERS) -> None:
    """Unpack a tarball (gzipped or not) into `dest`, a new or empty directory. Refused, with `dest`
    left empty: absolute or `..` names, names given twice (`a/b`, `a/./b`, `a//b` are one), hard links,
    devices and fifos, a name written through a link, symbolic links that lead outside `dest` (alone or
    through other links), and archives whose files hold more than the cap or that have more than
    `max_members` entries. Modes keep at most 0o755; owners and times are not restored."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty: an archive is unpacked into a directory of its own")
    root = os.path.realpath(dest)
    root_fd = os.open(root, _DIRECTORY)
    try:
        with open(archive, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw) if gzipped else contextlib.nullcontext(raw) as tarball:
                links = _unpack_files(_BoundedStream(tarball), root_fd, cap, max_members)
        _make_links(links, root_fd, root)
    except BaseException:
        _empty(root)
        raise
    finally:
        os.close(root_fd)


def _unpack_files(stream: _BoundedStream, root_fd: int, cap: SizeCap, max_members: int) -> list[_Link]:
    """Directories and regular files, in the archive's order; the symbolic links, to be made after."""
    seen: set[str] = set()
    links: list[_Link] = []
    written, count, name = 0, 0, ""
    try:
        with tarfile.open(fileobj=stream, mode="r:") as tar:
            while True:
                stream.allow(CHUNK_BYTES, after=name)
                member = tar.next()
                tar.members.clear()  # not kept: entries cost no memory once unpacked
                if member is None:
                    return links
                count, name = count + 1, member.name
                if count > max_members:
                    raise UnsafeArchive(f"archive has more than {max_members} entries")
                parts = _checked_parts(member, seen)
                try:
                    if member.isdir():
                        if parts:  # not the destination's own entry (`./`)
                            os.close(_open_directory(root_fd, parts, name, mode=_mode(member.mode, 0o700)))
                    elif member.issym():
                        links.append(_Link(name, parts, member.linkname))
                    else:
                        stream.allow(member.size, after=name)
                        written = _write_file(tar, member, root_fd, parts, written, cap)
                except OSError as err:
                    raise _refusal(name, err) from None
    except tarfile.TarError as err:
        at = f" (entry {name!r})" if name else ""
        raise SourceError(f"artifact is not a readable tarball{at}: {err}") from None


def _checked_parts(member: tarfile.TarInfo, seen: set[str]) -> tuple[str, ...]:
    """The member's path as its steps under the destination, once the member is known to be safe to make."""
    name = member.name
    if name.startswith("/") or "\0" in name:
        raise UnsafeArchive(f"archive entry {name!r} escapes the destination")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise UnsafeArchive(f"archive entry {name!r} escapes the destination")
    if member.islnk():
        raise UnsafeArchive(f"archive entry {name!r} is a hard link (to {member.linkname!r}): hard links are "
                            "not unpacked")
    if member.ischr() or member.isblk() or member.isfifo():
        raise UnsafeArchive(f"archive entry {name!r} is a device or fifo")
    if not (member.isreg() or member.isdir() or member.issym()):
        raise UnsafeArchive(f"archive entry {name!r} has a type ({member.type!r}) that is not unpacked")
    if member.size < 0 or (member.size and not member.isreg()):
        raise UnsafeArchive(f"archive entry {name!r} has a size of {member.size} bytes in its header, which "
                            "it cannot have")
    if not parts and not member.isdir():
        raise UnsafeArchive(f"archive entry {name!r} names the destination itself")
    if member.issym() and (not member.linkname or member.linkname.startswith("/") or "\0" in member.linkname):
        raise UnsafeArchive(f"archive link {name!r} -> {member.linkname!r} points outside the destination")
    key = "/".join(parts)
    if key in seen:
        raise UnsafeArchive(f"archive entry {name!r} appears twice (as {key!r})")
    seen.add(key)
    return parts


def _mode(mode: int, owner: int) -> int:
    """At most 0o755 (no setuid, setgid, sticky or writes by others); the operator keeps its own access."""
    return mode & 0o755 | owner


def _open_directory(root_fd: int, parts: tuple[str, ...], name: str, mode: int | None = None) -> int:
    """A descriptor of the directory `parts` under the root, made where missing: each step a directory
    of its own, never a link. `mode` is the last step's (an archive's directory entry)."""
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                step = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UnsafeArchive(f"archive entry {name!r} is written through {'/'.join(parts[:index + 1])!r}, "
                                    "which is a link or a file, not a directory") from None
            os.close(fd)
            fd = step
        if mode is not None:
            os.fchmod(fd, mode)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, root_fd: int, parts: tuple[str, ...],
                written: int, cap: SizeCap) -> int:
    """A new regular file (never an existing one, never through a link) with the member's bytes, counted
    as written; the bytes written so far."""
    parent = _open_directory(root_fd, parts[:-1], member.name)
    try:
        fd = os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    with open(fd, "wb") as out:
        data = tar.extractfile(member)
        assert data is not None  # a regular file's
        while chunk := data.read(CHUNK_BYTES):
            written += len(chunk)
            if written > cap.max_bytes:
                raise cap.refusal(f"the archive, unpacked (at entry {member.name!r}),")
            out.write(chunk)
        os.fchmod(out.fileno(), _mode(member.mode, 0o600))
    return written


def _make_links(links: list[_Link], root_fd: int, root: str) -> None:
    """The symbolic links, once every file and directory is there; then each resolved, chains included."""
    for link in links:
        try:
            parent = _open_directory(root_fd, link.parts[:-1], link.name)
            try:
                os.symlink(link.target, link.parts[-1], dir_fd=parent)
            finally:
                os.close(parent)
        except OSError as err:
            raise _refusal(link.name, err) from None
    for link in links:
        path = os.path.join(root, *link.parts)
        # The kernel follows at most 40 links: a longer chain or a loop is refused, and realpath below
        # never walks a long one (each of 100,000 chained links resolved alone: quadratic, hours).
        try:
            os.stat(path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafeArchive(f"archive link {link.name!r} -> {link.target!r} is a loop or a chain of more "
                                    "than 40 links") from None
        if not resolves_inside(Path(root), path):  # a dangling link too: where it would lead
            raise UnsafeArchive(f"archive link {link.name!r} -> {link.target!r} points outside the destination")


def _refusal(name: str, err: OSError) -> SourceError:
    if err.errno == errno.EEXIST:
        return UnsafeArchive(f"archive entry {name!r} collides with another entry's path")
    if err.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafeArchive(f"archive entry {name!r} is written through a link or a file")
    return SourceError(f"archive entry {name!r} cannot be written: {err.strerror}")


def _empty(root: str) -> None:
    """Everything unpacked so far goes (links are removed, never followed)."""
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
