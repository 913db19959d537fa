"""Back up and restore every layer's Pulumi state: `strata backup create|restore`.

The layers keep their state in file:// backends: the bootstrap and platform stacks in the dev home's
`pulumi/`, each team's hand-off and app stacks in `pulumi/teams/<team>/` (its own backend, nested in
the directory). A backend is a directory holding `.pulumi/` (stacks, history, the engine's own
checkpoint backups); a backup is one tar.gz of every backend found under the roots given, with a
manifest naming each backend and the SHA-256 of each file.

A backup is consistent: it waits until no update holds a lock in a backend (`.pulumi/locks/`), copies,
and checks afterwards that no lock appeared and no file changed meanwhile, else tries again. A
restore puts a backend's `.pulumi/` back exactly as it was (files added since are removed), refuses
while an update holds a lock there, and checks every file against the manifest. Nested backends are
separate: restoring `teams/alpha` touches nothing of the platform's, and the other way round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path

STATE_DIR = ".pulumi"
LOCKS = "locks"
MANIFEST = "strata-backup.json"
FORMAT = 1
# How long a backup waits for running updates to release their locks, and how often it looks.
DEFAULT_WAIT_SECONDS = 300.0
POLL_SECONDS = 1.0
ATTEMPTS = 5


class BackupError(Exception):
    """A backup or restore cannot be done; the message names the backend or file and the fix."""


def backend_dir(url_or_path: str) -> Path:
    """The directory of a file:// backend URL (or a plain path); BackupError for another scheme."""
    parsed = urllib.parse.urlsplit(url_or_path)
    if parsed.scheme in ("", "file"):
        return Path(urllib.parse.unquote(parsed.path) if parsed.scheme else url_or_path).expanduser().absolute()
    raise BackupError(f"{url_or_path}: only file:// backends are backed up here; for {parsed.scheme}:// use the "
                      "object store's own versioning or snapshots")


def find_backends(root: Path) -> list[Path]:
    """`root` and every directory below it holding `.pulumi/` (the teams' backends), sorted."""
    found = []
    for directory, subdirs, _files in os.walk(root):
        if STATE_DIR in subdirs:
            found.append(Path(directory))
            subdirs.remove(STATE_DIR)  # the engine's own files: no backend inside
    return sorted(found)


def state_files(backend: Path) -> dict[str, str]:
    """Relative path (under `.pulumi/`) -> SHA-256 of every state file (locks never among them in a
    backup: it is taken, and checked, while none is held)."""
    state = backend / STATE_DIR
    return {path.relative_to(state).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(state.rglob("*")) if path.is_file()}


def held_locks(backend: Path) -> list[str]:
    """The stacks whose update holds a lock now (`project/stack`, from the lock's path)."""
    locks = backend / STATE_DIR / LOCKS
    if not locks.is_dir():
        return []
    return sorted({"/".join(path.relative_to(locks).parts[-3:-1]) for path in locks.rglob("*.json")})


def stacks_of(files: Iterable[str]) -> list[str]:
    """`project/stack` of each checkpoint among a backend's state files."""
    names = set()
    for relative in files:
        parts = relative.split("/")
        if parts[0] == "stacks" and len(parts) >= 3 and parts[-1].endswith((".json", ".json.gz")) \
                and not parts[-1].endswith(".bak"):
            names.add(f"{parts[-2]}/{parts[-1].removesuffix('.gz').removesuffix('.json')}")
    return sorted(names)


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One backend in a backup: where it was, its name in the archive, its files' digests."""

    path: str
    name: str
    files: dict[str, str]

    @property
    def stacks(self) -> list[str]:
        return stacks_of(self.files)


def build_manifest(roots: list[Path], entries: list[BackendEntry]) -> dict:
    return {"format": FORMAT, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "roots": [str(root) for root in roots],
            "backends": [dataclasses.asdict(entry) for entry in entries]}


def _archive_name(index: int) -> str:
    return f"backend-{index}"


def _wait_unlocked(backend: Path, deadline: float, say: Callable[[str], None]) -> None:
    said = ""
    while True:
        locked = held_locks(backend)
        if not locked:
            return
        if time.monotonic() >= deadline:
            raise BackupError(f"{backend}: updates still hold locks ({', '.join(locked)}); wait until they finish, "
                              "or suspend those Stacks (`strata suspend stack NAME`), and back up again")
        if ", ".join(locked) != said:
            said = ", ".join(locked)
            say(f"  {backend}: waiting for the running update(s) of {said} to finish")
        time.sleep(POLL_SECONDS)


def create(roots: list[Path], out: Path, wait_seconds: float = DEFAULT_WAIT_SECONDS,
           say: Callable[[str], None] = lambda line: None) -> dict:
    """Write a backup of every backend under `roots` to `out`; returns its manifest."""
    backends = [backend for root in roots for backend in find_backends(root)]
    if not backends:
        raise BackupError(f"no Pulumi state (a .pulumi directory) under {', '.join(map(str, roots))}: name the "
                          "backend directory with --backend")
    deadline = time.monotonic() + wait_seconds
    for attempt in range(ATTEMPTS):
        for backend in backends:
            _wait_unlocked(backend, deadline, say)
        entries = [BackendEntry(str(backend), _archive_name(index), state_files(backend))
                   for index, backend in enumerate(backends)]
        manifest = build_manifest(roots, entries)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            data = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime = len(data), int(time.time())
            archive.addfile(info, io.BytesIO(data))
            for backend, entry in zip(backends, entries):
                for relative in entry.files:
                    archive.add(backend / STATE_DIR / relative, f"{entry.name}/{relative}", recursive=False)
        # An update that began during the copy may have written part of it: then the copy is not one moment.
        moved = [str(b) for b, e in zip(backends, entries) if held_locks(b) or state_files(b) != e.files]
        if not moved:
            partial.replace(out)
            for entry in entries:
                say(f"  {entry.path}: {len(entry.stacks)} stack(s) ({', '.join(entry.stacks) or 'none'})")
            return manifest
        partial.unlink()
        say(f"  state changed during the copy ({', '.join(moved)}); copying again ({attempt + 2}/{ATTEMPTS})")
    raise BackupError(f"the state kept changing during {ATTEMPTS} copies: suspend the Stacks that update "
                      "(`strata suspend stack NAME`) and back up again")


def read_manifest(archive_path: Path) -> dict:
    try:
        with tarfile.open(archive_path, "r:gz") as archive:
            member = archive.extractfile(MANIFEST)
            manifest = json.loads(member.read()) if member else None
    except (OSError, tarfile.TarError, KeyError, ValueError) as err:
        raise BackupError(f"{archive_path}: not a strata backup ({err})") from None
    if not manifest or manifest.get("format") != FORMAT:
        raise BackupError(f"{archive_path}: not a strata backup of format {FORMAT}")
    return manifest


def select(manifest: dict, only: list[str]) -> list[BackendEntry]:
    """The backends to restore: all, or those named by path, file:// URL or path relative to a root."""
    entries = [BackendEntry(**entry) for entry in manifest["backends"]]
    if not only:
        return entries
    roots = [Path(root) for root in manifest["roots"]]
    chosen = []
    for wanted in only:
        candidates = {str(backend_dir(wanted))} if os.path.isabs(wanted) or "://" in wanted else \
            {str(root / wanted) for root in roots}
        match = [entry for entry in entries if entry.path in candidates]
        if not match:
            raise BackupError(f"--backend {wanted}: not in this backup; it holds "
                              f"{', '.join(entry.path for entry in entries)}")
        chosen += [entry for entry in match if entry not in chosen]
    return chosen


def restore(archive_path: Path, only: list[str] | None = None,
            say: Callable[[str], None] = lambda line: None) -> list[BackendEntry]:
    """Put the chosen backends' state back exactly as in the backup; returns what was restored."""
    manifest = read_manifest(archive_path)
    entries = select(manifest, only or [])
    for entry in entries:
        locked = held_locks(Path(entry.path))
        if locked:
            raise BackupError(f"{entry.path}: an update is running ({', '.join(locked)} hold a lock); suspend the "
                              "Stacks on this backend (`strata suspend stack NAME`) or stop the operator, then "
                              "restore again")
    with tempfile.TemporaryDirectory(prefix="strata-restore-") as scratch, \
            tarfile.open(archive_path, "r:gz") as archive:
        archive.extractall(scratch, filter="data")
        for entry in entries:
            source = Path(scratch) / entry.name
            got = {relative: hashlib.sha256((source / relative).read_bytes()).hexdigest() for relative in entry.files}
            if got != entry.files:
                bad = sorted(relative for relative in entry.files if got.get(relative) != entry.files[relative])
                raise BackupError(f"{archive_path}: {entry.path}/{STATE_DIR}/{bad[0]} does not match the manifest; "
                                  "the backup is damaged: restore from another one")
            target = Path(entry.path) / STATE_DIR
            staged = Path(entry.path) / f"{STATE_DIR}.restoring"
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir(parents=True)
            for relative in entry.files:
                (staged / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / relative, staged / relative)
            # Swap whole directories: a restore interrupted midway leaves either the old state or the new.
            previous = Path(entry.path) / f"{STATE_DIR}.replaced"
            shutil.rmtree(previous, ignore_errors=True)
            if target.exists():
                target.rename(previous)
            staged.rename(target)
            shutil.rmtree(previous, ignore_errors=True)
            if state_files(Path(entry.path)) != entry.files:
                raise BackupError(f"{entry.path}: the restored state does not match the backup; restore again")
            say(f"  {entry.path}: restored {len(entry.stacks)} stack(s) ({', '.join(entry.stacks) or 'none'})")
    return entries
