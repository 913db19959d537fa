"""Python programs' dependencies: one virtualenv per Stack, keyed by the hash of what declares them.

PKO v2 runs `pulumi install` in a fresh workspace pod for every update. Here updates share the
host, so a Stack keeps its installed environment and rebuilds it only when its declared dependencies
(requirements.txt, or pyproject.toml and uv.lock), a local directory they install (e.g. `../..`, a
library beside the program in the same repository) or the interpreter change: an unchanged program
costs no install at all. The project's Pulumi.yaml (in the operator's own copy of the source) is
pointed at that virtualenv.

The environments are built with uv, the toolchain Pulumi's Python host knows (`runtime.options.toolchain:
uv`), from the `uv` package the operator depends on: a project that asks for uv is synced from its lock
file (`uv sync --locked`), and a requirements.txt is installed by `uv pip install` unless the project asks
for pip. Every Stack of an operator shares one uv cache, so a package is downloaded and built once and
a repeated install is a set of hard links, uv's default on Linux (the layers' 3300 files in 0.3 s; copies
took 1.6-1.8 s and 2.4 CPU-s in the kernel, on `make up`'s critical path twice). A linked file is the
cache's own, so each is made read-only once linked: a program that opens a file of its environment to
write it gets "Permission denied" instead of rewriting what every other Stack installs from (replacing a
file, as pip and uv do, unlinks it and never reaches the cache). That holds for programs run as any user
but root, which permissions do not stop; in the local topology every update runs as the operator's user,
which owns the cache anyway, and workspace pods each build their own environment. uv locks the cache
against concurrent builds, and programs are never given its path. Where no uv is found (a workspace
image that is not the operator's) requirements.txt falls back to pip. A new environment gets the
bytecode compiled for its requirements key (bytecode.py), which uv does not install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml

from .bytecode import share_bytecode

PROJECT_FILES = ("Pulumi.yaml", "Pulumi.yml")
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".pytest_cache", "build", "dist"}
# How this host reaches a package index, as pip reads it, for uv (which reads only its own names).
UV_FROM_PIP = {"PIP_INDEX_URL": "UV_DEFAULT_INDEX", "PIP_EXTRA_INDEX_URL": "UV_INDEX",
               "PIP_FIND_LINKS": "UV_FIND_LINKS", "PIP_NO_INDEX": "UV_NO_INDEX",
               "PIP_TRUSTED_HOST": "UV_INSECURE_HOST", "PIP_CERT": "SSL_CERT_FILE"}


class PythonEnvError(Exception):
    """Installing the program's dependencies failed; the message carries the installer's last lines,
    `output` all of them (a plugin install that failed inside a package's build is further up)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def project_file(project_dir: Path) -> Path | None:
    return next((project_dir / name for name in PROJECT_FILES if (project_dir / name).exists()), None)


def runtime_name(project: dict) -> str:
    runtime = project.get("runtime")
    return runtime.get("name", "") if isinstance(runtime, dict) else str(runtime or "")


def toolchain(project: dict) -> str:
    """`runtime.options.toolchain` ("uv", "pip", ...), or "" when the project names none."""
    runtime = project.get("runtime")
    options = (runtime.get("options") or {}) if isinstance(runtime, dict) else {}
    return str(options.get("toolchain") or "")


def requirements_key(requirements: bytes, python_version: str, local_trees: bytes = b"") -> str:
    """Changes when the declared dependencies, the local directories they name or the interpreter change."""
    return hashlib.sha256(python_version.encode() + b"\0" + requirements + b"\0" + local_trees).hexdigest()[:16]


def local_requirement_dirs(requirements: str, project_dir: Path) -> list[Path]:
    """The directories a requirements file installs from (`../lib`, `-e ./x`, `file:...`)."""
    found = []
    for line in requirements.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry.startswith(("-e ", "--editable ")):
            entry = entry.split(None, 1)[1].strip()
        if entry.startswith("file:"):
            entry = unquote(urlparse(entry).path)
        if entry.startswith((".", "/")):
            path = (project_dir / entry).resolve()
            if path.is_dir():
                found.append(path)
    return found


def local_source_dirs(pyproject: str, project_dir: Path) -> list[Path]:
    """The directories a uv project installs from (`[tool.uv.sources] name = {path = "../.."}`)."""
    sources = ((tomllib.loads(pyproject).get("tool") or {}).get("uv") or {}).get("sources") or {}
    found = []
    for source in sources.values():
        for entry in source if isinstance(source, list) else [source]:
            path = (project_dir / entry["path"]).resolve() if isinstance(entry, dict) and "path" in entry else None
            if path is not None and path.is_dir():
                found.append(path)
    return found


def tree_digest(root: Path, program_dir: Path | None = None) -> bytes:
    """The content of a source tree (paths and bytes), without VCS data, caches and virtualenvs, nor the
    program's own directory when the tree holds it (`../..`, the repository): the operator writes the
    Stack's settings into that directory, which would otherwise make every update a new environment."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if program_dir is not None and program_dir != root and path.is_relative_to(program_dir):
            continue
        if path.is_file() and not path.is_symlink():
            digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def declared_dependencies(project_dir: Path) -> tuple[str, bytes, list[Path]] | None:
    """(toolchain, the bytes that declare the dependencies, the local directories they install), or None
    when this is not a Python project that declares any: a uv project's pyproject.toml and uv.lock,
    else requirements.txt."""
    found = project_file(project_dir)
    if found is None:
        return None
    project = yaml.safe_load(found.read_text()) or {}
    if runtime_name(project) != "python":
        return None
    chosen = toolchain(project)
    if chosen == "uv":
        pyproject = project_dir / "pyproject.toml"
        if not pyproject.is_file():
            raise PythonEnvError("the program asks for the uv toolchain (runtime.options.toolchain in Pulumi.yaml) "
                                 "but has no pyproject.toml declaring its dependencies; add one (with uv.lock: "
                                 "`uv lock`), or drop the toolchain option to install requirements.txt")
        lock = project_dir / "uv.lock"
        declared = pyproject.read_bytes() + b"\0" + (lock.read_bytes() if lock.is_file() else b"")
        return chosen, declared, local_source_dirs(pyproject.read_text(), project_dir)
    requirements = project_dir / "requirements.txt"
    if not requirements.exists():
        return None
    text = requirements.read_bytes()
    return chosen, text, local_requirement_dirs(text.decode(errors="replace"), project_dir)


def planned_virtualenv(project_dir: Path, venvs_root: Path, python_version: str) -> Path | None:
    """Where this project's virtualenv lives, or None when it is not a Python project with dependencies."""
    declared = declared_dependencies(project_dir)
    if declared is None:
        return None
    chosen, text, local = declared
    # The toolchain is part of the key: an environment pip built is not what uv would build, and back.
    return venvs_root / requirements_key(chosen.encode() + b"\0" + text, python_version,
                                         b"".join(tree_digest(d, project_dir.resolve()) for d in local))


def use_virtualenv(project_file_path: Path, venv: Path) -> None:
    """Point the project's Python runtime at `venv`, keeping every other setting."""
    project = yaml.safe_load(project_file_path.read_text()) or {}
    runtime = project.get("runtime")
    runtime = dict(runtime) if isinstance(runtime, dict) else {"name": runtime}
    # Explicitly pip, over the environment built here: named uv or poetry, or named nothing beside a uv.lock
    # (Pulumi's Python host then picks uv), pulumi would manage the environment itself.
    runtime["options"] = {**(runtime.get("options") or {}), "virtualenv": str(venv), "toolchain": "pip"}
    project["runtime"] = runtime
    # Replaced whole: the worker's CLI runs that prepare the stack read this file meanwhile.
    partial = project_file_path.with_name(f".{project_file_path.name}.partial")
    partial.write_text(yaml.safe_dump(project, sort_keys=False))
    partial.replace(project_file_path)


def default_python_cache(environ: Mapping[str, str] = os.environ) -> Path:
    """uv's cache for the environments of every Stack: the user's, so a new operator home (a fresh `make
    up`) starts warm ($XDG_CACHE_HOME/strata/uv, else ~/.cache/strata/uv)."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strata" / "uv"


def uv_binary() -> str | None:
    """The uv of the `uv` package beside this interpreter, or None (a foreign workspace image)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def uv_environment(env: Mapping[str, str], cache: Path) -> dict[str, str]:
    """The environment uv runs in: this one, the shared cache, and pip's index settings under uv's names.
    TLS is verified against the host's trust store, as curl and git do here (and pip, given its config),
    rather than uv's own bundle: behind a TLS-inspecting proxy only the host's store knows its CA."""
    result = {**env, "UV_CACHE_DIR": str(cache), "UV_LINK_MODE": "hardlink", "UV_NO_PROGRESS": "1",
              "UV_PYTHON_DOWNLOADS": "never", "UV_SYSTEM_CERTS": "1"}
    for pip_name, uv_name in UV_FROM_PIP.items():
        if pip_name in env and uv_name not in env:
            result[uv_name] = env[pip_name]
    return result


def ensure_virtualenv(project_dir: Path, venvs_root: Path, cache: Path, timeout: float = 900,
                      bytecode: Path | None = None) -> Path | None:
    """Create the project's virtualenv (with the worker's interpreter) unless it exists, drop this
    Stack's outdated ones, and point the project at it. `cache`: uv's, shared by every Stack; `bytecode`:
    where the bytecode of each requirements key's environment is shared (bytecode.py), or None."""
    venv = planned_virtualenv(project_dir, venvs_root, sys.version)
    if venv is None:
        return None
    complete = venv / ".strata-complete"
    if not complete.exists():
        # Built where it is used (venv scripts hard-code their directory); the marker says it finished.
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        _install(project_dir, venv, cache, timeout)
        seal_linked_files(venv)
        if bytecode is not None:
            share_bytecode(venv, bytecode)
        complete.touch()
    for stale in venvs_root.iterdir():
        if stale != venv:
            shutil.rmtree(stale, ignore_errors=True)
    use_virtualenv(project_file(project_dir), venv)
    return venv


def _install(project_dir: Path, venv: Path, cache: Path, timeout: float) -> None:
    chosen, _, _ = declared_dependencies(project_dir)  # type: ignore[misc]
    uv = uv_binary() if chosen != "pip" else None
    env = uv_environment(os.environ, cache) if uv else dict(os.environ)
    if chosen == "uv":
        if uv is None:
            raise PythonEnvError("the program asks for the uv toolchain (runtime.options.toolchain in Pulumi.yaml) "
                                 "and this operator has no uv (its workspace image lacks the `uv` package); use the "
                                 "operator's image, or install requirements.txt with pip")
        locked = ["--locked"] if (project_dir / "uv.lock").is_file() else []
        # Seeded with pip, which Pulumi's Python host (toolchain pip, see use_virtualenv) lists packages with;
        # --inexact keeps it, as the project's lock does not name it.
        _run([uv, "venv", "--seed", "--python", sys.executable, str(venv)], "creating the virtualenv", timeout, env=env)
        _run([uv, "sync", *locked, "--inexact", "--python", sys.executable],
             "installing the uv project (pyproject.toml, uv.lock)", timeout, cwd=project_dir,
             env={**env, "UV_PROJECT_ENVIRONMENT": str(venv)})
        return
    if uv is not None:
        # --seed: pip in the environment, as `python -m venv` gives it (Pulumi's Python host lists packages with it).
        _run([uv, "venv", "--seed", "--python", sys.executable, str(venv)], "creating the virtualenv", timeout, env=env)
    else:
        _run([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv", timeout, env=env)
    requirements = (project_dir / "requirements.txt").read_text()
    if any(line.strip() and not line.lstrip().startswith("#") for line in requirements.splitlines()):
        install = [uv, "pip", "install", "--python", str(venv / "bin" / "python")] if uv is not None else \
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        _run([*install, "-r", str(project_dir / "requirements.txt")], "installing requirements.txt", timeout,
             cwd=project_dir, env=env)


def seal_linked_files(venv: Path) -> None:
    """Make every file of `venv` that is hard-linked to uv's cache read-only (module docstring); an
    environment pip built has none."""
    for directory, _dirs, files in os.walk(venv):
        for name in files:
            path = os.path.join(directory, name)
            status = os.lstat(path)
            if stat.S_ISREG(status.st_mode) and status.st_nlink > 1 and status.st_mode & 0o222:
                os.chmod(path, status.st_mode & ~0o222)


def _run(command: list[str], what: str, timeout: float, cwd: Path | None = None,
         env: Mapping[str, str] | None = None) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        raise PythonEnvError(f"{what} took longer than {timeout:.0f}s") from None
    if done.returncode != 0:
        last = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise PythonEnvError(f"{what} failed (the program's dependencies): {last}",
                             output=f"{done.stdout}\n{done.stderr}")
