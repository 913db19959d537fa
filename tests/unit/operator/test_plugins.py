"""The plugins every update sees: the shared cache linked into each Stack's PULUMI_HOME, PATH plugins,
and a plugin missing everywhere turned into the command that installs it."""

import os
import threading
from pathlib import Path

import pytest

from strata_operator.engine.process.plugins import (MissingPlugin, ambient_plugin_dirs, ambient_plugins, cached_plugins,
                                                    default_plugin_cache, link_plugins, missing_plugin,
                                                    missing_plugin_advice)

FLUX = "resource-flux-v1.0.1"


def plugin(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    """A plugin install directory as `pulumi plugin install` leaves it."""
    directory = root / name
    directory.mkdir(parents=True)
    for file, text in (files or {f"pulumi-{name.split('-v')[0]}": "#!/bin/sh\n"}).items():
        (directory / file).write_text(text)
        (directory / file).chmod(0o755)
    return directory


def executable(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_default_cache_is_the_operators_own_plugin_directory(monkeypatch, tmp_path):
    assert default_plugin_cache({"PULUMI_HOME": str(tmp_path)}) == tmp_path / "plugins"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_plugin_cache({}) == tmp_path / ".pulumi" / "plugins"


def test_cached_plugins_are_the_complete_install_directories_given_ones_first(tmp_path):
    cache = tmp_path / "cache"
    plugin(cache, FLUX)
    plugin(cache, "resource-kubernetes-v4.34.2")
    plugin(cache, "resource-half-v1.0.0")
    (cache / "resource-half-v1.0.0.partial").touch()  # an unfinished install
    (cache / "resource-kubernetes-v4.34.2.lock").touch()
    plugin(cache, "not-a-plugin")
    given = plugin(tmp_path / "elsewhere", FLUX)
    bin_dir = tmp_path / "bin"  # a --plugin-dir for PATH, not an install directory
    bin_dir.mkdir()
    found = cached_plugins(cache, [str(bin_dir), str(given)])
    assert found == {FLUX: given, "resource-kubernetes-v4.34.2": cache / "resource-kubernetes-v4.34.2"}
    assert cached_plugins(tmp_path / "absent") == {}
    assert cached_plugins(tmp_path / "absent", [given]) == {FLUX: given}


def test_a_stack_gets_a_directory_of_links_the_cli_lists_and_the_cache_is_never_written(tmp_path):
    source = plugin(tmp_path / "cache", FLUX, {"pulumi-resource-flux": "binary", "schema.json": "{}"})
    home = tmp_path / "stack" / "plugins"
    assert link_plugins({FLUX: source}, home) == [FLUX]
    linked = home / FLUX
    # A real directory (the CLI's plugin listing skips symlinked ones) whose entries point into the cache.
    assert linked.is_dir() and not linked.is_symlink()
    assert sorted(p.name for p in linked.iterdir()) == ["pulumi-resource-flux", "schema.json"]
    assert all(p.is_symlink() and p.resolve().parent == source for p in linked.iterdir())
    assert (linked / "pulumi-resource-flux").read_text() == "binary"
    assert link_plugins({FLUX: source}, home) == []  # already linked: nothing to do
    # What a Stack does to its own home (pulumi plugin rm, a reinstall) never reaches the cache.
    for entry in linked.iterdir():
        entry.unlink()
    linked.rmdir()
    assert sorted(p.name for p in source.iterdir()) == ["pulumi-resource-flux", "schema.json"]
    assert not any(name.startswith(".strata-link") for name in os.listdir(home))


def test_a_stacks_own_install_is_kept_and_an_unfinished_one_replaced(tmp_path):
    source = plugin(tmp_path / "cache", FLUX)
    other = plugin(tmp_path / "cache", "resource-kubernetes-v4.34.2")
    home = tmp_path / "stack" / "plugins"
    own = plugin(home, "resource-kubernetes-v4.34.2", {"pulumi-resource-kubernetes": "downloaded by the stack"})
    plugin(home, FLUX, {"pulumi-resource-flux": "half a download"})
    (home / f"{FLUX}.partial").touch()  # left by a failed `pulumi plugin install`
    assert link_plugins({FLUX: source, "resource-kubernetes-v4.34.2": other}, home) == [FLUX]
    assert (own / "pulumi-resource-kubernetes").read_text() == "downloaded by the stack"
    assert (home / FLUX / "pulumi-resource-flux").is_symlink() and not (home / f"{FLUX}.partial").exists()


def test_links_follow_the_cache_and_links_to_removed_plugins_are_dropped(tmp_path):
    first = plugin(tmp_path / "a", FLUX)
    home = tmp_path / "stack" / "plugins"
    link_plugins({FLUX: first}, home)
    moved = plugin(tmp_path / "b", FLUX)
    assert link_plugins({FLUX: moved}, home) == [FLUX]
    assert (home / FLUX / "pulumi-resource-flux").resolve() == moved / "pulumi-resource-flux"
    (moved / "pulumi-resource-flux").unlink()
    moved.rmdir()
    link_plugins({}, home)
    assert not (home / FLUX).exists()
    # A plain symlink in its place (which the CLI would not list) becomes a link directory.
    (home / FLUX).symlink_to(first)
    assert link_plugins({FLUX: first}, home) == [FLUX] and not (home / FLUX).is_symlink()


def test_concurrent_runs_each_see_the_plugin_whole(tmp_path):
    files = {f"file-{i}": str(i) for i in range(30)}
    source = plugin(tmp_path / "cache", FLUX, files)
    errors = []

    def link(home):
        try:
            link_plugins({FLUX: source}, home)
            assert len(list((home / FLUX).iterdir())) == len(files)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    for attempt in range(20):  # races show up in some rounds only
        home = tmp_path / f"stack-{attempt}" / "plugins"
        threads = [threading.Thread(target=link, args=(home,)) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert sorted(os.listdir(home)) == [FLUX]


def test_path_directories_with_language_hosts_or_plugins_are_found_in_order(tmp_path):
    hosts = tmp_path / "hosts"
    executable(hosts, "pulumi-language-yaml")
    executable(hosts, "pulumi-language-python-exec")  # the Python host's helper, not a host
    later = tmp_path / "later"
    executable(later, "pulumi-language-yaml")
    executable(later, "pulumi-resource-kubernetes")
    plain = tmp_path / "plain"
    executable(plain, "kubectl")
    (plain / "pulumi-resource-notexecutable").write_text("")
    path = os.pathsep.join([str(plain), str(hosts), str(tmp_path / "absent"), str(later), str(hosts)])
    assert ambient_plugin_dirs(path) == [str(hosts), str(later)]
    assert ambient_plugins([str(hosts), str(later)]) == {
        "pulumi-language-yaml": hosts / "pulumi-language-yaml",
        "pulumi-resource-kubernetes": later / "pulumi-resource-kubernetes"}


# The texts below are the real messages: pulumi 3.259's engine, and pip building pulumi-flux 1.0.1's sdist.
ENGINE_NOT_FOUND = ("error: no resource plugin 'pulumi-resource-flux' found in the workspace at version v1.0.1 or "
                    "on your $PATH, install the plugin using `pulumi plugin install resource flux v1.0.1 --server "
                    "github://api.github.com/oun`")
ENGINE_DOWNLOAD = ("error: could not load plugin for flux provider 'default_1_0_1': Could not automatically "
                   "download and install resource plugin 'pulumi-resource-flux' at version v1.0.1, install the "
                   "plugin using `pulumi plugin install resource flux v1.0.1 --server github://api.github.com/oun`: "
                   "failed to download plugin: flux-1.0.1: dial tcp: lookup api.github.com: no such host")
PIP_WHEEL = """  running install
  error: [resource plugin flux-1.0.1] downloading from github://api.github.com/oun: no such host
  Traceback (most recent call last):
  subprocess.CalledProcessError: Command '['pulumi', 'plugin', 'install', 'resource', 'flux', '1.0.1', '--server', \
'github://api.github.com/oun']' returned non-zero exit status 255.
  ERROR: Failed building wheel for pulumi-flux
"""
YAML_HOST = "error: no language plugin 'pulumi-language-yaml' found in the workspace or on your $PATH"


@pytest.mark.parametrize("text,expected", [
    (ENGINE_NOT_FOUND, MissingPlugin("resource", "flux", "1.0.1", "github://api.github.com/oun")),
    (ENGINE_DOWNLOAD, MissingPlugin("resource", "flux", "1.0.1", "github://api.github.com/oun")),
    (PIP_WHEEL, MissingPlugin("resource", "flux", "1.0.1", "github://api.github.com/oun")),
    ("error: no resource plugin 'pulumi-resource-random' found in the workspace at version v4.16.0 or on your $PATH",
     MissingPlugin("resource", "random", "4.16.0")),
    (YAML_HOST, MissingPlugin("language", "yaml")),
    ("error: missing required configuration variable 'region'", None),
    ("ERROR: Failed building wheel for psycopg2", None),
])
def test_a_plugin_missing_everywhere_is_recognised_with_its_server(text, expected):
    assert missing_plugin(text) == expected


def test_the_advice_is_the_exact_command_into_the_operators_cache(tmp_path):
    flux = missing_plugin(PIP_WHEEL)
    advice = missing_plugin_advice(flux, tmp_path / "pulumi" / "plugins", "/opt/pulumi/bin")
    assert (f"`PULUMI_HOME={tmp_path / 'pulumi'} pulumi plugin install resource flux 1.0.1 "
            "--server github://api.github.com/oun`") in advice
    assert "flux v1.0.1" in advice and str(tmp_path / "pulumi" / "plugins") in advice
    host = missing_plugin_advice(missing_plugin(YAML_HOST), tmp_path / "plugins", "/opt/pulumi/bin")
    assert "pulumi-language-yaml" in host and "/opt/pulumi/bin" in host and "--plugin-dir" in host
