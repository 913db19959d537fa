"""The Pulumi project a source materialised: written from a Program object, found in a subdirectory of a
checkout or artifact, and its name and runtime as `status.projectInfo` reports them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ..api.program import program_project
from .archive import SourceError, resolves_inside


def write_program_project(program: dict[str, Any], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Pulumi.yaml").write_text(program_project(program))


def project_info(project_dir: Path) -> dict[str, str] | None:
    """`status.projectInfo` (PKO v2): the project's name and runtime from its Pulumi.yaml, or None if unreadable."""
    for filename in ("Pulumi.yaml", "Pulumi.yml"):
        path = project_dir / filename
        if path.is_file():
            try:
                project = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError:
                return None
            runtime = project.get("runtime")
            runtime = runtime.get("name") if isinstance(runtime, dict) else runtime
            if isinstance(project.get("name"), str) and isinstance(runtime, str):
                return {"name": project["name"], "runtime": runtime}
            return None
    return None


def subdir(root: Path, relative: str, field: str) -> Path:
    """`relative` inside `root`, which must exist and hold Pulumi.yaml; SourceError naming `field` if not."""
    target = Path(os.path.realpath(root / relative)) if relative else root
    if not resolves_inside(Path(os.path.realpath(root)), str(target)):
        raise SourceError(f"{field} {relative!r} leaves the source")
    if not (target / "Pulumi.yaml").is_file() and not (target / "Pulumi.yml").is_file():
        where = f"{field} {relative!r}" if relative else "the root of the source"
        raise SourceError(f"no Pulumi.yaml in {where}")
    for filename in ("Pulumi.yaml", "Pulumi.yml"):
        # The operator reads it (status.projectInfo): a link to a file of the host's would be read as the project.
        if (target / filename).exists() and not resolves_inside(Path(os.path.realpath(root)), str(target / filename)):
            raise SourceError(f"{filename} in {field or 'the source'} {relative!r} is a link leaving the source")
    return target
