"""What the dev stack needs that Strata cannot build: checked in seconds, before anything long starts.

The bootstrap program is a Python Pulumi project using the kubernetes and flux providers, so
`pulumi up` needs a pulumi CLI with its Python language host (`pulumi-language-python`) and the
two provider plugins. The toolchain's CLI is built from Go modules and has neither: they come with
an official Pulumi install. Standard library only, so `make up` can run it before the venv exists.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PLUGINS = {"kubernetes": "4.34.2", "flux": "1.0.1"}
INSTALL_PULUMI = "install the Pulumi CLI with its language hosts (the official installer or package)"


def pulumi_home() -> Path:
    return Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")


def find_pulumi_with_python_host() -> Path | None:
    """A pulumi CLI that has the Python language host beside it or on PATH."""
    candidates = [shutil.which("pulumi"), str(pulumi_home() / "bin" / "pulumi")]
    for candidate in filter(None, candidates):
        cli = Path(candidate)
        if cli.exists() and ((cli.parent / "pulumi-language-python").exists() or shutil.which("pulumi-language-python")):
            return cli
    return None


def _version_key(directory: Path) -> tuple:
    version = directory.name.rsplit("-v", 1)[-1]
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def plugin_dirs() -> list[Path]:
    """The installed provider plugin directories of PLUGINS: each at its pinned version, else the newest."""
    plugins = pulumi_home() / "plugins"
    found = []
    for name, version in PLUGINS.items():
        # Only directories: pulumi keeps `<dir>.lock` and `<dir>.partial` files beside them.
        pinned = plugins / f"resource-{name}-v{version}"
        others = sorted((d for d in plugins.glob(f"resource-{name}-v*") if d.is_dir()), key=_version_key)
        if pinned.is_dir():
            found.append(pinned)
        elif others:
            found.append(others[-1])
    return found


def operator_engine_flags() -> list[str]:
    """`python -m strata_operator` flags that give a local operator's updates this machine's Pulumi
    install: the CLI with its Python language host, and the provider plugins. The operator runs each
    update with a clean PATH and a PULUMI_HOME of its own, so without them a Python program finds
    no language host and would download its plugins. Empty when there is no such install."""
    cli = find_pulumi_with_python_host()
    if cli is None:
        return []
    directories = [cli.parent]
    host = shutil.which("pulumi-language-python")
    if not (cli.parent / "pulumi-language-python").exists() and host:
        directories.append(Path(host).parent)
    directories += plugin_dirs()
    return ["--pulumi", str(cli), *[flag for directory in directories for flag in ("--plugin-dir", str(directory))]]


def missing_dev_stack_requirements() -> list[str]:
    """Each missing piece with how to get it; empty when the dev stack can run."""
    missing = []
    if find_pulumi_with_python_host() is None:
        missing.append(f"the Pulumi Python language host (pulumi-language-python): {INSTALL_PULUMI}")
    plugins = pulumi_home() / "plugins"
    for name, version in PLUGINS.items():
        if not list(plugins.glob(f"resource-{name}-v*")):
            missing.append(f"the {name} provider plugin: pulumi plugin install resource {name} v{version}")
    return missing


def main() -> int:
    missing = missing_dev_stack_requirements()
    if missing:
        print("error: `make up` needs what this machine does not have:", file=sys.stderr)
        for item in missing:
            print(f"  - {item}", file=sys.stderr)
        print("The tests (`make test`) run without them.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
