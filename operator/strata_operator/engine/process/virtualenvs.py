"""Python programs' dependencies: one virtualenv per Stack, keyed by the hash of its requirements.

PKO v2 runs `pulumi install` in a fresh workspace pod for every update. Here updates share the
host, so a Stack keeps its installed environment and rebuilds it only when requirements.txt, a
local directory it installs (e.g. `../..`, a library beside the program in the same repository) or
the interpreter changes: an unchanged program costs no install at all. The project's Pulumi.yaml
(in the operator's own copy of the source) is pointed at that virtualenv.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml

PROJECT_FILES = ("Pulumi.yaml", "Pulumi.yml")
SKIPPED_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".pytest_cache", "build", "dist"}


class PythonEnvError(Exception):
    """Installing the program's requirements failed; the message carries pip's last lines, `output` all
    of them (a plugin install that failed inside a package's build is further up)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def project_file(project_dir: Path) -> Path | None:
    return next((project_dir / name for name in PROJECT_FILES if (project_dir / name).exists()), None)


def runtime_name(project: dict) -> str:
    runtime = project.get("runtime")
    return runtime.get("name", "") if isinstance(runtime, dict) else str(runtime or "")


def requirements_key(requirements: bytes, python_version: str, local_trees: bytes = b"") -> str:
    """Changes when the requirements, the local directories they name or the interpreter change."""
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


def tree_digest(root: Path) -> bytes:
    """The content of a source tree (paths and bytes), without VCS data, caches and virtualenvs."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if path.is_file() and not path.is_symlink():
            digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def planned_virtualenv(project_dir: Path, venvs_root: Path, python_version: str) -> Path | None:
    """Where this project's virtualenv lives, or None when it is not a Python project with requirements."""
    found = project_file(project_dir)
    if found is None or runtime_name(yaml.safe_load(found.read_text()) or {}) != "python":
        return None
    requirements = project_dir / "requirements.txt"
    if not requirements.exists():
        return None
    text = requirements.read_bytes()
    local = b"".join(tree_digest(d) for d in local_requirement_dirs(text.decode(errors="replace"), project_dir))
    return venvs_root / requirements_key(text, python_version, local)


def use_virtualenv(project_file_path: Path, venv: Path) -> None:
    """Point the project's Python runtime at `venv`, keeping every other setting."""
    project = yaml.safe_load(project_file_path.read_text()) or {}
    runtime = project.get("runtime")
    runtime = dict(runtime) if isinstance(runtime, dict) else {"name": runtime}
    runtime["options"] = {**(runtime.get("options") or {}), "virtualenv": str(venv)}
    # pulumi would otherwise try to manage the environment itself (uv / poetry).
    runtime["options"].pop("toolchain", None)
    project["runtime"] = runtime
    project_file_path.write_text(yaml.safe_dump(project, sort_keys=False))


def ensure_virtualenv(project_dir: Path, venvs_root: Path, timeout: float = 900) -> Path | None:
    """Create the project's virtualenv (with the worker's interpreter) unless it exists, drop this
    Stack's outdated ones, and point the project at it."""
    venv = planned_virtualenv(project_dir, venvs_root, sys.version)
    if venv is None:
        return None
    complete = venv / ".strata-complete"
    if not complete.exists():
        # Built where it is used (venv scripts hard-code their directory); the marker says it finished.
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv", timeout)
        requirements = (project_dir / "requirements.txt").read_text()
        if any(line.strip() and not line.lstrip().startswith("#") for line in requirements.splitlines()):
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                  "--no-input", "-r", str(project_dir / "requirements.txt")], "installing requirements.txt",
                 timeout, cwd=project_dir)
        complete.touch()
    for stale in venvs_root.iterdir():
        if stale != venv:
            shutil.rmtree(stale, ignore_errors=True)
    use_virtualenv(project_file(project_dir), venv)
    return venv


def _run(command: list[str], what: str, timeout: float, cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise PythonEnvError(f"{what} took longer than {timeout:.0f}s") from None
    if done.returncode != 0:
        last = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise PythonEnvError(f"{what} failed (requirements.txt of the program): {last}",
                             output=f"{done.stdout}\n{done.stderr}")
