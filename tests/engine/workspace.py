"""Automation API workspaces on the toolchain's pulumi CLI, and what a file:// backend stores."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from pulumi import automation as auto

# The toolchain's CLI and YAML language host (`make setup`), which the engine tier's operator tests run.
TOOLCHAIN = Path(os.environ.get("STRATA_CACHE", Path.home() / ".cache/strata")) / "toolchain"
PULUMI = TOOLCHAIN / "pulumi-v3.259.0/bin/pulumi"
YAML_HOST = TOOLCHAIN / "pulumi-yaml-v1.38.1/bin"


def workspace_options(toolchain, pulumi_env: dict[str, str], backend: str, work_dir=None,
                      **extra) -> auto.LocalWorkspaceOptions:
    env = {**pulumi_env, "PULUMI_BACKEND_URL": backend}
    return auto.LocalWorkspaceOptions(
        work_dir=str(work_dir) if work_dir else None, pulumi_home=pulumi_env["PULUMI_HOME"], env_vars=env,
        pulumi_command=auto.PulumiCommand(root=str(toolchain.dir("pulumi"))), **extra)


def inline_stack(toolchain, pulumi_env: dict[str, str], backend: str, project: str, stack: str,
                 program: Callable[[], None], work_dir: Path | None = None) -> auto.Stack:
    """A new stack of an inline Python program. The venv's interpreter comes first on PATH so the
    dynamic-provider shim runs providers with the packages this test sees."""
    env = {**pulumi_env, "PATH": f"{Path(sys.executable).parent}:{pulumi_env['PATH']}"}
    opts = workspace_options(toolchain, env, backend, work_dir,
                             project_settings=auto.ProjectSettings(name=project, runtime="python"))
    return auto.create_stack(stack, project_name=project, program=program, opts=opts)


def state_text(backend: str) -> str:
    """Every JSON file of a file:// backend (stack checkpoints, backups, history), concatenated."""
    root = Path(backend.removeprefix("file://"))
    return "\n".join(p.read_text() for p in root.rglob("*.json"))
