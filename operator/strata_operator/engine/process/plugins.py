"""The language hosts and provider plugins updates use: what the operator has, shared by every Stack.

Each Stack's updates run with a PULUMI_HOME of their own, so nothing one Stack downloads or breaks
reaches another. The provider plugins the operator already has (its plugin cache, laid out like a
PULUMI_HOME/plugins, and the --plugin-dir directories that are plugin install directories such as
`resource-flux-v1.0.1`) are linked into each Stack's PULUMI_HOME/plugins before every run, so an
update never downloads them again, and `pulumi plugin install` (which pulumi-flux's setup.py runs
while its wheel is built) finds them installed. Language hosts and PATH-style plugins reach updates
through their PATH. The functions here have no knowledge of Stacks; the worker calls them.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

KINDS = ("analyzer", "language", "resource", "converter", "tool")
# A plugin install directory, as `pulumi plugin install` names it: KIND-NAME-vVERSION.
_INSTALL_DIR = re.compile(r"^(?P<kind>analyzer|language|resource|converter|tool)-"
                          r"(?P<name>[A-Za-z0-9-][A-Za-z0-9-_.]*[A-Za-z0-9])-v(?P<version>\d[^/]*)$")
# An executable plugin the CLI finds on PATH ("ambient"): pulumi-KIND-NAME.
_EXECUTABLE = re.compile(r"^pulumi-(?:analyzer|language|resource|converter|tool)-[A-Za-z0-9-_.]+$")
# Where a link directory is assembled before it is renamed into place; the CLI ignores dot names.
_STAGING_PREFIX = ".strata-link-"


def default_plugin_cache(environ: Mapping[str, str] = os.environ) -> Path:
    """The operator's own plugin directory: $PULUMI_HOME/plugins, else ~/.pulumi/plugins."""
    home = environ.get("PULUMI_HOME")
    return Path(home).expanduser() / "plugins" if home else Path.home() / ".pulumi" / "plugins"


def is_install_dir(path: Path) -> bool:
    """A complete plugin install directory (a `.partial` file beside it marks an unfinished install)."""
    return (bool(_INSTALL_DIR.match(path.name)) and path.is_dir()
            and not path.with_name(path.name + ".partial").exists())


def cached_plugins(cache: Path, install_dirs: Iterable[str | Path] = ()) -> dict[str, Path]:
    """The plugins every update gets, by install directory name: those given as directories first,
    then the cache's (a missing cache holds none)."""
    found: dict[str, Path] = {}
    for directory in map(Path, install_dirs):
        if is_install_dir(directory):
            found.setdefault(directory.name, directory.resolve())
    with contextlib.suppress(OSError):
        for entry in sorted(cache.iterdir()):
            if is_install_dir(entry):
                found.setdefault(entry.name, entry.resolve())
    return found


def _is_link_dir(path: Path) -> bool:
    """A directory made by `link_plugins`: nothing in it but symlinks (a Stack's own install has files)."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        entries = list(path.iterdir())
    except OSError:  # replaced by a concurrent run just now
        return False
    return bool(entries) and all(entry.is_symlink() for entry in entries)


def _links_to(path: Path, source: Path) -> bool:
    try:
        wanted = {entry.name: entry for entry in source.iterdir()}
        have = {entry.name: Path(os.readlink(entry)) for entry in path.iterdir()}
    except OSError:
        return False
    return have == wanted


def link_plugins(plugins: Mapping[str, Path], plugins_dir: Path) -> list[str]:
    """Give one Stack's PULUMI_HOME/plugins each of `plugins`; returns the names linked anew.

    Each becomes a real directory of symlinks to the shared plugin's files, not one symlink: the CLI
    lists installed plugins with a directory read that skips symlinks, so `pulumi plugin install`
    would call a linked directory installed while the engine would not load it. Nothing is ever
    written into the shared directories (a Stack's own installs and removals change only its links).
    Each directory is assembled under a private name and renamed into place, so a run sees it whole
    or not at all. A plugin the Stack installed itself is kept; an unfinished install of it (its
    `.partial` marker, left by a failed download) is replaced; links to plugins gone from the cache
    are dropped, so the CLI reports them missing instead of failing to start them.
    """
    plugins_dir.mkdir(parents=True, exist_ok=True)
    linked = []
    for name, source in sorted(plugins.items()):
        dest = plugins_dir / name
        partial = dest.with_name(name + ".partial")
        if partial.exists():
            _remove(dest)
            partial.unlink(missing_ok=True)
        elif dest.exists() and not dest.is_symlink() and (not _is_link_dir(dest) or _links_to(dest, source)):
            continue  # the Stack's own install, or linked already
        _place(dest, source)
        linked.append(name)
    for entry in plugins_dir.iterdir():
        if entry.name in plugins or entry.name.startswith(_STAGING_PREFIX) or not _is_link_dir(entry):
            continue  # a shared plugin, one being placed, or the Stack's own
        with contextlib.suppress(OSError):  # removed by a concurrent run just now
            if not any(link.exists() for link in entry.iterdir()):
                _remove(entry)
    return linked


def _remove(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _place(dest: Path, source: Path) -> None:
    staging = dest.with_name(f"{_STAGING_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        for entry in source.iterdir():
            (staging / entry.name).symlink_to(entry)
        if dest.is_symlink() or (_is_link_dir(dest) and not _links_to(dest, source)):
            # An outdated link: moved aside first (a non-empty directory cannot be renamed over). One
            # that a concurrent run placed meanwhile is current, and stays.
            retired = dest.with_name(f"{_STAGING_PREFIX}old-{dest.name}-{uuid.uuid4().hex[:8]}")
            with contextlib.suppress(FileNotFoundError):
                dest.rename(retired)
                _remove(retired)
        try:
            staging.rename(dest)
        except OSError:
            if not dest.exists():
                raise  # not a concurrent run that placed it first
    finally:
        _remove(staging)


def ambient_plugin_dirs(search_path: str) -> list[str]:
    """The directories of `search_path` (a PATH value) that hold language hosts or plugins, in order."""
    found = []
    for directory in dict.fromkeys(d for d in search_path.split(os.pathsep) if d):
        if ambient_plugins([directory]):
            found.append(directory)
    return found


def ambient_plugins(directories: Iterable[str]) -> dict[str, Path]:
    """Executable `pulumi-KIND-NAME` files in `directories`, first one of each name winning, as on PATH."""
    found: dict[str, Path] = {}
    for directory in directories:
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if (_EXECUTABLE.match(entry.name) and not entry.name.endswith("-exec")
                        and entry.name not in found and os.access(entry.path, os.X_OK) and not entry.is_dir()):
                    found[entry.name] = Path(entry.path)
    return found


# --- a plugin that is missing everywhere --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MissingPlugin:
    """A plugin an update needed and could neither find nor download."""

    kind: str
    name: str
    version: str = ""  # without the leading "v"
    server: str = ""  # its download server, when the package names one (flux: github://api.github.com/oun)

    def install_command(self) -> str:
        words = ["pulumi", "plugin", "install", self.kind, self.name]
        if self.version:
            words.append(self.version)
        if self.server:
            words += ["--server", self.server]
        return " ".join(words)


# The engine's messages: "no resource plugin 'pulumi-resource-flux' found in the workspace at version
# v1.0.1 ..." and "Could not automatically download and install resource plugin 'pulumi-resource-flux'
# at version v1.0.1, install the plugin using `pulumi plugin install resource flux v1.0.1 --server X`".
_ENGINE_MISSING = re.compile(r"(?:no|download and install) (?P<kind>analyzer|language|resource|converter|tool) plugin "
                             r"'pulumi-(?P=kind)-(?P<name>[A-Za-z0-9-_.]*[A-Za-z0-9])'"
                             r"(?:[^'`\n]*? at version v(?P<version>[0-9][^\s,`']*))?")
_SUGGESTED = re.compile(r"`pulumi plugin install (?P<args>[^`]+)`")
# A `pulumi plugin install` run by a package's setup.py that failed (subprocess.check_call's error).
_SETUP_INSTALL = re.compile(r"Command '(?P<argv>\[[^\]]*'plugin', 'install'[^\]]*\])' returned non-zero exit status")


def _from_install_args(args: list[str]) -> MissingPlugin | None:
    server = ""
    if "--server" in args and args.index("--server") + 1 < len(args):
        at = args.index("--server")
        server = args[at + 1]
        args = args[:at] + args[at + 2:]
    positional = [arg for arg in args if not arg.startswith("-")]
    if len(positional) < 2 or positional[0] not in KINDS:
        return None
    version = positional[2].removeprefix("v") if len(positional) > 2 else ""
    return MissingPlugin(positional[0], positional[1], version, server)


def missing_plugin(text: str) -> MissingPlugin | None:
    """The plugin an update's error says is missing everywhere, if that is what it says."""
    found = _SETUP_INSTALL.search(text)
    if found:
        with contextlib.suppress(ValueError, SyntaxError):
            argv = [str(arg) for arg in ast.literal_eval(found.group("argv"))]
            return _from_install_args(argv[argv.index("install") + 1:])
    found = _ENGINE_MISSING.search(text)
    if not found:
        return None
    plugin = MissingPlugin(found.group("kind"), found.group("name"), found.group("version") or "")
    suggested = _SUGGESTED.search(text, found.end())
    if suggested:
        named = _from_install_args(suggested.group("args").split())
        if named is not None and (named.kind, named.name) == (plugin.kind, plugin.name):
            return MissingPlugin(plugin.kind, plugin.name, named.version or plugin.version, named.server)
    return plugin


def missing_plugin_advice(plugin: MissingPlugin, cache: Path, cli_dir: str) -> str:
    """What to tell the Stack's owner: which plugin, where updates looked, the command that installs it."""
    if plugin.kind == "language":
        return (f"the language host pulumi-language-{plugin.name} is missing: updates look beside the pulumi CLI "
                f"({cli_dir}) and on the operator's PATH. Put it there, or restart the operator with "
                f"--plugin-dir DIR naming its directory")
    version = f" v{plugin.version}" if plugin.version else ""
    return (f"the {plugin.kind} plugin {plugin.name}{version} is missing: it is not in the operator's plugin cache "
            f"{cache} and could not be downloaded. Install it there as the operator's user: "
            f"`PULUMI_HOME={cache.parent} {plugin.install_command()}`")
