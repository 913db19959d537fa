"""The agent's runtime for a workspace pod whose image is not the operator's (`workspaceTemplate.spec.image`).

PKO copies its static Go agent into the workspace image from an init container. Strata's agent is
Python, so its init container (the operator image) runs `python -m strata_operator.engine.pod.bundle DIR` and
copies into a volume the interpreter, the standard library, the packages the agent and its workers
import, and every shared library they load, with the dynamic loader that runs them (`launcher`).
The agent then needs nothing of the image: no Python, not even a C library. The updates are the
image's: its `pulumi` CLI and language hosts (PKO's workspace image must hold `pulumi`), its PATH,
its language runtimes and tools.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

BUNDLE_DIR = "/var/run/strata/runtime"  # where the workspace container finds the bundle
BUNDLE_ENV = "STRATA_AGENT_BUNDLE"
LOADER = "ld-linux-x86-64.so.2"
PYTHON = "python3"
# What the agent runs: itself, the fork server's workers, and what those import while updating.
AGENT_MODULES = ("strata_operator.engine.pod.agent", "strata_operator.engine.process.worker", "pulumi.automation",
                 "pulumi.runtime", "pulumi.dynamic", "encodings.idna", "multiprocessing")
# Parts of the standard library no update needs.
_STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "distutils",
                "site-packages", "dist-packages", "config-3", "_tkinter")
_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(|^\s*(/\S+)\s+\(")


def launcher(root: Path) -> list[str]:
    """The command that starts the bundled Python: through its own loader and libraries, so the image's
    C library (or its absence) does not matter."""
    return [str(root / "lib" / LOADER), "--library-path", str(root / "lib"), str(root / "bin" / PYTHON)]


def imported_files(modules: Iterable[str]) -> list[Path]:
    """The files of every module a fresh interpreter loads to import `modules`."""
    script = ("import importlib, json, sys\n"
              f"for name in {list(modules)!r}: importlib.import_module(name)\n"
              "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) "
              "if getattr(m, '__file__', None)})))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    return [Path(p) for p in json.loads(out.splitlines()[-1])]


def top_level_entries(files: Iterable[Path], package_dirs: Iterable[Path]) -> set[Path]:
    """The top-level packages (or single-file modules) of `package_dirs` that hold any of `files`."""
    roots = [d.resolve() for d in package_dirs]
    entries = set()
    for file in files:
        resolved = file.resolve()
        for root in roots:
            if resolved.is_relative_to(root) and resolved != root:
                entries.add(root / resolved.relative_to(root).parts[0])
    return entries


def parse_ldd(output: str) -> dict[str, Path]:
    """soname -> file, from `ldd`'s lines (`libz.so.1 => /lib/.../libz.so.1 (0x...)`, `/lib64/ld-linux... (0x...)`)."""
    found: dict[str, Path] = {}
    for line in output.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        name, path, loader = match.groups()
        if loader:
            found[Path(loader).name] = Path(loader)
        else:
            found[name] = Path(path)
    return found


def shared_libraries(binaries: Iterable[Path]) -> dict[str, Path]:
    libraries: dict[str, Path] = {}
    for binary in binaries:
        result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
        if result.returncode == 0:  # "not a dynamic executable" (a pure-Python wheel's data) is skipped
            libraries.update(parse_ldd(result.stdout))
    return libraries


def build_bundle(dest: Path) -> tuple[int, int]:
    """Copy this interpreter's runtime for the agent into `dest`; (files, bytes) copied."""
    interpreter = Path(os.path.realpath(sys.executable))
    stdlib = Path(os.path.dirname(os.__file__))
    packages = [Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    packages.append(Path(__file__).resolve().parents[3])  # strata_operator, installed or from a checkout
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "lib").mkdir(exist_ok=True)
    shutil.copy2(interpreter, dest / "bin" / PYTHON)
    # The landmark (lib/pythonX.Y/os.py beside bin/) makes `dest` the interpreter's prefix.
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copytree(stdlib, dest / "lib" / version, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda d, names: [n for n in names if n.startswith(_STDLIB_SKIP)
                                             and (Path(d) == stdlib or Path(d).name == "lib-dynload")])
    # Beside the standard library, which is on sys.path in every build (distributions differ on site-packages).
    site = dest / "lib" / version
    for entry in top_level_entries(imported_files(AGENT_MODULES), packages):
        target = site / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, target)
    for directory in packages:  # distribution metadata: importlib.metadata lookups (versions, entry points)
        for info in directory.glob("*.dist-info"):
            shutil.copytree(info, site / info.name, dirs_exist_ok=True)
    objects = [interpreter, *(dest / "lib").rglob("*.so*")]
    for soname, path in shared_libraries(objects).items():
        shutil.copy2(path, dest / "lib" / soname)
    files = [p for p in dest.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else BUNDLE_DIR)
    started = time.monotonic()
    count, size = build_bundle(dest)
    check = subprocess.run([*launcher(dest), "-I", "-c", "import strata_operator.engine.pod.agent, pulumi.automation"],
                           capture_output=True, text=True, env={"PATH": "/nonexistent"})
    if check.returncode != 0:
        sys.exit(f"the agent's runtime does not start from {dest}: {check.stderr[-1500:]}")
    print(f"agent runtime: {count} files, {size / 1e6:.1f} MB in {time.monotonic() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
