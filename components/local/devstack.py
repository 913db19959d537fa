"""`make up` / `strata dev up|down`: the bootstrap program's dev stack, offline, end to end.

The stack uses Pulumi.yaml's file:// backend and passphrase secrets; the passphrase is generated
once into a private file unless PULUMI_CONFIG_PASSPHRASE is set.
The bootstrap program itself (its `local` Cluster) starts the local platform.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from .platform import default_state_dir
from .preflight import find_pulumi_with_python_host, missing_dev_stack_requirements
from .progress import Say, stderr_say
from .toolchain import installed

STACK = "dev"


class DevStackError(Exception):
    """The dev stack cannot run; the message says what is missing and how to get it."""


def project_backend(project: Path) -> Path:
    """The file:// backend directory Pulumi.yaml names (created if missing: the DIY backend needs it)."""
    import yaml

    url = (yaml.safe_load((project / "Pulumi.yaml").read_text()).get("backend") or {}).get("url", "")
    if not url.startswith("file://"):
        raise DevStackError(f"the dev stack expects a file:// backend in {project / 'Pulumi.yaml'}, found {url!r}")
    directory = Path(url.removeprefix("file://")).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def dev_environment(project: Path, state_dir: Path) -> dict[str, str]:
    """Secrets and PATH for the dev stack's pulumi runs (the backend is Pulumi.yaml's)."""
    project_backend(project)
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    env.pop("PULUMI_BACKEND_URL", None)  # one backend: the one Pulumi.yaml names
    if not env.get("PULUMI_CONFIG_PASSPHRASE"):
        # The bootstrap hands this passphrase to the platform Stack (as a Secret), so it needs the value
        # itself, not only a file: generated once, kept private, passed by environment, never argv.
        passphrase = state_dir.parent / "passphrase"
        if not passphrase.exists():
            passphrase.parent.mkdir(parents=True, exist_ok=True)
            passphrase.touch(mode=0o600)
            passphrase.write_text(secrets.token_urlsafe(32))
        env["PULUMI_CONFIG_PASSPHRASE"] = passphrase.read_text().strip()
    # The toolchain's kubectl and Flux binaries first; the user's pulumi (with its Python host) is used by path.
    env["PATH"] = os.pathsep.join([*(str(d) for d in installed().bin_dirs), env.get("PATH", "")])
    env["STRATA_STATE_DIR"] = str(state_dir)
    return env


def _pulumi(project: Path, env: dict[str, str], *args: str) -> None:
    cli = find_pulumi_with_python_host()
    if cli is None:
        raise DevStackError("; ".join(missing_dev_stack_requirements()))
    result = subprocess.run([str(cli), *args], cwd=project, env=env)
    if result.returncode != 0:
        raise DevStackError(f"`pulumi {' '.join(args[:2])}` failed (exit {result.returncode}); its output is above")


def up(project: Path, state_dir: Path | None = None, say: Say = stderr_say) -> None:
    missing = missing_dev_stack_requirements()
    if missing:
        raise DevStackError("the dev stack needs: " + "; ".join(missing))
    env = dev_environment(project, state_dir or default_state_dir())
    say(f"==> pulumi up of the {STACK} stack (backend {project_backend(project)})")
    _pulumi(project, env, "stack", "select", STACK, "--create", "--secrets-provider", "passphrase")
    _pulumi(project, env, "up", "--stack", STACK, "--yes", "--skip-preview")
    _pulumi(project, env, "stack", "output", "--stack", STACK)


def down(project: Path, state_dir: Path | None = None, say: Say = stderr_say) -> None:
    env = dev_environment(project, state_dir or default_state_dir())
    say(f"==> pulumi destroy of the {STACK} stack")
    _pulumi(project, env, "destroy", "--stack", STACK, "--yes", "--skip-preview")
