"""What the dev stack needs that Strata cannot build: checked in seconds, before anything long starts.

The bootstrap program is a Python Pulumi project using the kubernetes and flux providers, so
`pulumi up` needs a pulumi CLI with its Python language host (`pulumi-language-python`) and the
two provider plugins. The toolchain's CLI is built from Go modules and has neither: they come with
an official Pulumi install. Standard library only, so `make up` can run it before the venv exists.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

PLUGINS = {"kubernetes": "4.34.2", "flux": "1.0.1"}
# Where a plugin is downloaded from when it is not on Pulumi's default server (its package's
# pulumi-plugin.json names it): advice without it fails as written.
PLUGIN_SERVERS = {"flux": "github://api.github.com/oun"}
INSTALL_PULUMI = ("install the Pulumi CLI with its language hosts: `curl -fsSL https://get.pulumi.com | sh` "
                  "(the official installer, into ~/.pulumi/bin), or your system's pulumi package")
# Hosts the plugins above are fetched from; reaching one is what "online" means here.
PLUGIN_HOSTS = (("api.github.com", 443), ("get.pulumi.com", 443))


def plugin_install_command(name: str) -> str:
    """The exact command that installs plugin `name` at its pinned version."""
    server = f" --server {PLUGIN_SERVERS[name]}" if name in PLUGIN_SERVERS else ""
    return f"pulumi plugin install resource {name} v{PLUGINS[name]}{server}"


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


def missing_python_host() -> list[str]:
    if find_pulumi_with_python_host() is None:
        return [f"the Pulumi Python language host (pulumi-language-python): {INSTALL_PULUMI}"]
    return []


def missing_plugins() -> list[str]:
    plugins = pulumi_home() / "plugins"
    return [f"the {name} provider plugin: {plugin_install_command(name)}"
            for name in PLUGINS if not [d for d in plugins.glob(f"resource-{name}-v*") if d.is_dir()]]


def missing_sandbox() -> list[str]:
    """bubblewrap, in which the operator runs every team's program (engine/process/sandbox.py): `make setup`
    installs it as root; anyone else installs it first."""
    if shutil.which("bwrap") or os.geteuid() == 0:
        return []
    return ["bubblewrap (bwrap), the sandbox of each team's programs (without it they are refused, never run "
            "unisolated): apt-get install -y bubblewrap (as root)"]


def missing_dev_stack_requirements() -> list[str]:
    """Each missing piece with the exact command that installs it; empty when the dev stack can run."""
    return [*missing_python_host(), *missing_sandbox(), *missing_plugins()]


def plugin_hosts_reachable(timeout: float = 3.0) -> bool:
    """Whether this machine reaches where pulumi downloads plugins from (then it fetches them itself)."""
    for host, port in PLUGIN_HOSTS:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return True
        except OSError:
            continue
    return False


def report(required: list[str], plugins: list[str], online: bool) -> tuple[int, list[str]]:
    """(exit code, lines) of the preflight: a missing language host or sandbox (`required`) always stops `make
    up`; a missing plugin only offline, since online pulumi downloads it during the update."""
    lines = []
    fatal = required + ([] if online else plugins)
    if fatal:
        lines.append(f"error: `make up` needs what this machine does not have ({'online' if online else 'offline'}):")
        lines += [f"  - {item}" for item in fatal]
    if plugins and online:
        lines.append("warning: provider plugins are missing; this machine is online, so pulumi downloads them "
                     "during `make up` (to install them ahead:)")
        lines += [f"  - {item}" for item in plugins]
    if fatal:
        lines.append("The tests (`make test`) run without them.")
    return (1 if fatal else 0), lines


def main() -> int:
    required, plugins = [*missing_python_host(), *missing_sandbox()], missing_plugins()
    if not required and not plugins:
        return 0
    # Only asked when something is missing: a complete install never touches the network here.
    code, lines = report(required, plugins, online=bool(plugins) and plugin_hosts_reachable())
    for line in lines:
        print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
