"""Bytecode shared by the Python environments of one requirements key.

uv links a package's files from its cache but no bytecode, so a new environment's first update compiled
every module its program imports (1.6 s of CPU for a layer importing pulumi_kubernetes, on `make up`'s
critical path twice). The first environment of a key is compiled once, in the background at the lowest
priority, into a store beside uv's cache. After each update the names of the modules the program
imported join the key's list (the .pyc files Python wrote); every later environment of that key (another
Stack, a new operator home) gets a copy of the store's bytecode for those, before its program first runs.

The store's files are checked-hash .pyc files: Python uses one only if the hash it records is the hash of
the source beside it, whatever the files' times. So a program that rewrote a source of its own
environment while it was compiled cannot put code into another Stack's environment: what was compiled
from the rewritten source carries that source's hash, which the other environment's source does not have.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Stores kept (the most recently used): about 60 MB each for the layers' environments.
KEPT_STORES = 8
# Beside each store: the modules its key's programs imported (relative .pyc paths), the ones a new
# environment gets.
IMPORTED_SUFFIX = ".imported"
# In each environment: what share_bytecode gave it.
GOT_MARKER = ".strata-bytecode"
# A compile that left its partial store this long ago died; another may start.
PARTIAL_STALE_SECONDS = 600


def bytecode_cache_beside(python_cache: Path) -> Path:
    """Where the stores live: beside uv's cache, which programs are never given either."""
    return python_cache.parent / f"{python_cache.name}-bytecode"


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def share_bytecode(venv: Path, cache: Path) -> str:
    """Give the new environment `venv` its key's bytecode, or start compiling the key's store in the
    background for the next one. The store's name is the environment's (virtualenvs.requirements_key).
    Returns what it got: "imported" (the store's files for the modules programs of the key imported before),
    "all" (the whole store: no program of the key recorded its imports yet) or "none"."""
    store = cache / venv.name
    if store.is_dir():
        imported = imported_list(cache, venv.name)
        install_store(store, site_packages(venv), imported or None)
        os.utime(store)  # recently used: pruned last
        got = "imported" if imported else "all"
    else:
        got = "none"
        if not _compile_running(store):
            cache.mkdir(parents=True, exist_ok=True)
            # Its own session and a neutral environment (the worker's holds the Stack's secrets); it outlives
            # the worker.
            subprocess.Popen([sys.executable, "-m", __name__, str(site_packages(venv)), str(store)],
                             env={"PATH": os.defpath, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    (venv / GOT_MARKER).write_text(got)
    return got


def _imported_path(cache: Path, key: str) -> Path:
    return cache / f"{key}{IMPORTED_SUFFIX}"


def imported_list(cache: Path, key: str) -> set[str]:
    listed = _imported_path(cache, key)
    return set(filter(None, listed.read_text().splitlines())) if listed.is_file() else set()


def record_imported(venv: Path, cache: Path) -> None:
    """Add the modules a program imported to its key's list: the .pyc files Python wrote into its
    environment after an update, which for an environment given no bytecode or only the listed modules'
    are the ones it imported. Names only: the bytecode always comes from the store compiled here."""
    marker = venv / GOT_MARKER
    if not marker.is_file() or marker.read_text() == "all":  # every module's .pyc is there, imported or not
        return
    site = site_packages(venv)
    written = {str(Path(directory, name).relative_to(site))
               for directory, _dirs, files in os.walk(site) if os.path.basename(directory) == "__pycache__"
               for name in files if name.endswith(".pyc")}
    known = imported_list(cache, venv.name)
    if written - known:
        listed = _imported_path(cache, venv.name)
        partial = listed.with_name(f".{listed.name}.{os.getpid()}")
        partial.write_text("".join(f"{name}\n" for name in sorted(written | known)))
        partial.replace(listed)


def _compile_running(store: Path) -> bool:
    now = time.time()
    return any(now - partial.stat().st_mtime < PARTIAL_STALE_SECONDS
               for partial in store.parent.glob(f".{store.name}.*.partial"))


def install_store(store: Path, site: Path, only: set[str] | None = None) -> None:
    """Copy the store's .pyc files (`only` these, when given) into a new environment's site-packages, before
    any program runs in it: the 2724 files of the layers' store took 0.4-1.6 s, the 320 they import a tenth.
    Copies, never links: a program writing into a linked .pyc would write into every other Stack's."""
    if only is None:
        shutil.copytree(store, site, dirs_exist_ok=True, copy_function=_copy_replacing)
        return
    for name in only:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        source = store / name
        if source.is_file():
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            _copy_replacing(source, site / name)


def _copy_replacing(source: Path | str, target: Path | str) -> None:
    """Copy over whatever `target` is: a .pyc a wheel shipped is a hard link into uv's cache, and writing
    into it would write into the cache."""
    Path(target).unlink(missing_ok=True)
    shutil.copyfile(source, target)


def compile_store(site: Path, store: Path) -> Path | None:
    """Compile every module of `site` into a new store at `store` (None: another compile made it first)."""
    partial = store.with_name(f".{store.name}.{os.getpid()}.partial")
    for directory, dirs, files in os.walk(site):  # symbolic links not followed
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = Path(directory).relative_to(site)
        for name in files:
            if not name.endswith(".py"):
                continue
            cfile = partial / relative / "__pycache__" / f"{name[:-3]}.{sys.implementation.cache_tag}.pyc"
            try:
                py_compile.compile(os.path.join(directory, name), cfile=str(cfile), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            except (py_compile.PyCompileError, OSError, ValueError):
                continue  # compiled, or reported, at import as before
    if not site.is_dir():  # the environment went away meanwhile: what was compiled is not all of it
        shutil.rmtree(partial, ignore_errors=True)
        return None
    try:
        partial.rename(store)
    except OSError:  # another compile's store is there
        shutil.rmtree(partial, ignore_errors=True)
        return None
    prune(store.parent)
    return store


def prune(cache: Path, kept: int = KEPT_STORES) -> None:
    stores = sorted((path for path in cache.iterdir() if path.is_dir() and not path.name.startswith(".")),
                    key=lambda path: path.stat().st_mtime, reverse=True)
    for stale in stores[kept:]:
        shutil.rmtree(stale, ignore_errors=True)
        _imported_path(cache, stale.name).unlink(missing_ok=True)


if __name__ == "__main__":
    os.nice(19)  # idle time only: updates come first
    compile_store(Path(sys.argv[1]), Path(sys.argv[2]))
