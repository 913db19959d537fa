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
