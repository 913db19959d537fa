"""The process executor's sandbox: a namespace's programs see that namespace's own files and nothing else.

A team's program is code the operator runs. Forked as the operator's user with nothing around it, it could
read the operator's token or kubeconfig, its state directory (other Stacks' programs, tokens and logs),
other teams' file:// state and the environment of updates running beside it. So every namespace the
operator does not trust gets a fork server of its own, started inside bubblewrap (Debian's `bwrap`) with:

- new user, mount, PID, IPC and cgroup namespaces (no process of the operator's, nor of another namespace,
  is visible; `/proc` is the sandbox's own) and no capabilities;
- a root holding, read-only, the system's directories, the few files of `/etc` programs need (name
  resolution, CA certificates, users), and the tools updates run (the pulumi CLI, language hosts, plugins,
  the Python interpreter and the operator's own package, which the worker imports);
- read-only, the namespace's directory of the operator's state (`stacks/<namespace>`: its Stacks' sources as
  the operator fetched them, their ServiceAccount tokens, an approved plan);
- read-write, the namespace's sandbox directory (`sandboxes/<namespace>`: its Stacks' HOME, PULUMI_HOME,
  virtualenvs and the copy of the program each run works in), the namespace's uv cache and, when the
  platform gave the namespace one, its file:// backend directory.

The network is the host's: programs reach the API server, their clouds and package indexes as before, and
the local platform's own services on loopback ask for credentials a program does not have. Every worker of
the namespace is forked inside it, so whatever the worker does on the program's files (the stack settings,
the event log, the virtualenv) happens in the program's view, never on a path the program could point at
the operator's files. What comes back to the operator is the worker's result line; the operator writes
nothing where a program can write.

Stacks of one namespace share its sandbox: they are one team's, with one team's identities. Namespaces the
operator trusts (its own, where the platform's Stacks run, and `--trusted-namespace`) run unsandboxed, as
the operator's user. Where bubblewrap cannot run (missing, or no user namespaces: a container under the
runtime's default seccomp profile), programs of the other namespaces are refused, never run unisolated.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# The system's directories, bound read-only (or re-made as the links they are on merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Of /etc, what programs and their tools read: name resolution, TLS trust, user names, the dynamic loader's
# cache, alternatives (Debian's python3 and friends link through it). No credentials live in these.
ETC_ENTRIES = ("resolv.conf", "hosts", "nsswitch.conf", "host.conf", "gai.conf", "services", "protocols",
               "passwd", "group", "localtime", "timezone", "ssl", "ca-certificates", "ca-certificates.conf",
               "pki", "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "os-release", "mime.types")
INSTALL_HINT = "install bubblewrap where the operator runs (Debian: apt-get install bubblewrap)"
# Why bubblewrap fails: a user namespace refused (a container's seccomp profile, a sysctl, AppArmor).
_USERNS_HINTS = ("Operation not permitted", "No permissions to create new namespace", "setting up uid map")


@dataclasses.dataclass(frozen=True)
class SandboxMounts:
    """What one namespace's sandbox sees besides the system: paths bound at the same place inside."""

    read_only: tuple[Path, ...]
    writable: tuple[Path, ...]
    workdir: Path


def bwrap_argv(bwrap: str, mounts: SandboxMounts, command: Sequence[str]) -> list[str]:
    """`command` run by bubblewrap inside `mounts` (pure: the host's layout is read by `system_root_args`).

    Binds are ordered parents first, so a writable directory inside a read-only one stays writable."""
    argv = [bwrap, "--die-with-parent", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try",
            "--cap-drop", "ALL", *system_root_args(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    binds = {**{path: "--ro-bind" for path in _outermost(mounts.read_only)},
             **{path: "--bind" for path in mounts.writable}}
    for path in sorted(binds, key=lambda p: len(p.parts)):
        argv += [binds[path], str(path), str(path)]
    # The directories made to hold those mounts are the sandbox's root's, read-only once it is set up: only the
    # writable binds and /tmp take a write.
    return [*argv, "--remount-ro", "/", "--chdir", str(mounts.workdir), "--", *command]


def system_root_args(root: Path = Path("/")) -> list[str]:
    """The sandbox's system: SYSTEM_DIRS as on the host (a link stays a link), ETC_ENTRIES that exist."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = root / name.lstrip("/")
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    for entry in ETC_ENTRIES:
        if (root / "etc" / entry).exists():
            args += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
    return args


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """`paths` without those inside another of them (binding the outer one shows them already)."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return kept


def tool_paths(search_path: str, extra: Iterable[str | Path] = ()) -> list[Path]:
    """What the worker and the CLI it runs need to read: this Python (its environment and base install), the
    operator's package, and every directory of the updates' PATH outside the system's (the CLI, language
    hosts, plugin directories), plus `extra` (the plugin cache)."""
    found = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent,
             Path(__file__).resolve().parents[3]]
    for entry in [*search_path.split(os.pathsep), *map(str, extra)]:
        if entry and Path(entry).is_dir():
            found += [Path(entry).absolute(), Path(entry).resolve()]
    system = tuple(Path(d) for d in SYSTEM_DIRS)
    return [path for path in found if not any(path.is_relative_to(d) for d in system)]


def bwrap_binary() -> str:
    return shutil.which("bwrap") or ""


def probe(bwrap: str) -> str:
    """Why bubblewrap cannot sandbox an update on this host ("" when it can): it is run once, as updates run it."""
    if not bwrap:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    scratch = Path("/")
    argv = bwrap_argv(bwrap, SandboxMounts(read_only=tuple(tool_paths("")), writable=(), workdir=scratch),
                      [sys.executable, "-c", "import os; os.getpid()"])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bubblewrap ({bwrap}) does not run: {err}"
    if done.returncode == 0:
        return ""
    said = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
    why = said[0]
    if any(hint in why for hint in _USERNS_HINTS):
        why += (" (user namespaces are refused here: a container under its runtime's default seccomp profile, or "
                "kernel.unprivileged_userns_clone=0)")
    return f"bubblewrap ({bwrap}) cannot create a sandbox: {why}"
