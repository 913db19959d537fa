"""The operator's plugin cache against the real pulumi CLI 3.259: a plugin linked into a Stack's
PULUMI_HOME is one the CLI calls installed and the engine loads, a package build that installs it
(as pulumi-flux's setup.py does) needs no download, and a plugin missing everywhere blocks the Stack
with the command that installs it.

The provider plugin is a real gRPC provider: the Pulumi Python SDK's provider server, run by this
test's interpreter. Nothing here reaches the network for a plugin: this machine cannot reach GitHub.
"""

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from strata_operator.engine.port import UpdateRequest
from tests.engine.workspace import PULUMI, YAML_HOST
from strata_operator.engine.process.executor import AutomationEngine, EngineSettings

pytestmark = pytest.mark.engine


SERVER = "github://api.github.com/strata-test"  # unreachable from here, like pulumi-flux's for an offline host
PROBE = "resource-strataprobe-v0.0.1"
PROVIDER = textwrap.dedent(f"""\
    #!{sys.executable}
    import sys
    from pulumi.provider import Provider, main
    main(Provider("0.0.1", '{{"name": "strataprobe", "version": "0.0.1"}}'), sys.argv[1:])
    """)


def yaml_program(package: str) -> str:
    return textwrap.dedent(f"""\
        name: probe
        runtime: yaml
        resources:
          probe:
            type: pulumi:providers:{package}
            options:
              version: 0.0.1
              pluginDownloadURL: {SERVER}
        """)


# A package whose build installs its provider plugin, exactly as pulumi-flux 1.0.1's setup.py does.
SETUP_PY = textwrap.dedent(f"""\
    from subprocess import check_call
    from setuptools import setup
    from setuptools.command.install import install

    class InstallPluginCommand(install):
        def run(self):
            install.run(self)
            check_call(['pulumi', 'plugin', 'install', 'resource', 'strataprobe', '0.0.1', '--server', '{SERVER}'])

    setup(name='strataprobe', version='0.0.1', py_modules=[], cmdclass={{'install': InstallPluginCommand}})
    """)


@pytest.fixture
def cache(tmp_path) -> Path:
    """The operator's plugin cache with the probe provider installed, as `pulumi plugin install` leaves it."""
    plugins = tmp_path / "operator-home" / "plugins"
    (plugins / PROBE).mkdir(parents=True)
    binary = plugins / PROBE / "pulumi-resource-strataprobe"
    binary.write_text(PROVIDER)
    binary.chmod(0o755)
    return plugins


def _engine(tmp_path, cache: Path) -> AutomationEngine:
    if not PULUMI.exists() or not YAML_HOST.exists():
        pytest.fail(f"toolchain missing: build it with `make setup` ({PULUMI}, {YAML_HOST})")
    return AutomationEngine(EngineSettings(pulumi_command=str(PULUMI), plugin_dirs=(str(YAML_HOST),),
                                           state_dir=tmp_path / "state", plugin_cache=cache, host_path="",
                                           trusted_namespaces=frozenset({"*"})))


def _request(tmp_path, files: dict[str, str]) -> UpdateRequest:
    project = tmp_path / "project"
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    return UpdateRequest(stack_key="ns/probe", stack_name="dev", project_dir=str(project),
                         env={"PULUMI_BACKEND_URL": (tmp_path / "backend").as_uri(),
                              "PULUMI_CONFIG_PASSPHRASE": "pass-phrase-123"},
                         secret_env=("PULUMI_CONFIG_PASSPHRASE",))


def _snapshot(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*"))


def _cli(engine: AutomationEngine, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{PULUMI.parent}:/usr/bin:/bin", "HOME": str(engine.settings.state_dir),
           "PULUMI_HOME": str(engine.pulumi_home("ns/probe")), "PULUMI_SKIP_UPDATE_CHECK": "true"}
    return subprocess.run([str(PULUMI), *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_engine_loads_a_plugin_from_the_cache_and_the_cli_calls_it_installed(tmp_path, cache):
    engine = _engine(tmp_path, cache)
    before = _snapshot(cache.parent)
    result = asyncio.run(engine.up(_request(tmp_path, {"Pulumi.yaml": yaml_program("strataprobe")})))
    assert result.ok, result.message
    assert result.summary.get("create") == 2  # the stack and the provider, created by the linked plugin
    linked = engine.pulumi_home("ns/probe") / "plugins" / PROBE
    assert linked.is_dir() and (linked / "pulumi-resource-strataprobe").is_symlink()

    # What pulumi-flux's setup.py runs: already installed, nothing downloaded (GitHub is unreachable here).
    install = _cli(engine, "plugin", "install", "resource", "strataprobe", "0.0.1", "--server", SERVER)
    assert install.returncode == 0, install.stderr
    listed = _cli(engine, "plugin", "ls")
    assert "strataprobe" in listed.stdout and "0.0.1" in listed.stdout, listed.stdout + listed.stderr
    assert _snapshot(cache.parent) == before  # the Stacks never write into the shared cache


def test_a_plugin_missing_everywhere_blocks_with_the_command_that_installs_it(tmp_path, cache):
    engine = _engine(tmp_path, cache)
    result = asyncio.run(engine.up(_request(tmp_path, {"Pulumi.yaml": yaml_program("strataabsent")})))
    assert result.outcome == "blocked", result.message
    assert (f"`PULUMI_HOME={cache.parent} pulumi plugin install resource strataabsent 0.0.1 --server {SERVER}`"
            in result.message)
    assert sorted(p.name for p in cache.iterdir()) == [PROBE]


def test_a_package_build_that_installs_its_plugin_finds_it_in_the_cache(tmp_path, cache):
    files = {"Pulumi.yaml": "name: probe\nruntime: python\n", "__main__.py": "",
             "requirements.txt": "./strataprobe-package\n", "strataprobe-package/setup.py": SETUP_PY}
    missing = asyncio.run(_engine(tmp_path / "without", tmp_path / "empty" / "plugins").up(
        _request(tmp_path / "without", files)))
    assert missing.outcome == "blocked", missing.message
    assert f"pulumi plugin install resource strataprobe 0.0.1 --server {SERVER}" in missing.message

    engine = _engine(tmp_path, cache)
    result = asyncio.run(engine.up(_request(tmp_path, files)))
    venvs = list((tmp_path / "state" / "sandboxes" / "ns" / "probe" / "venvs").iterdir())
    assert len(venvs) == 1 and (venvs[0] / ".strata-complete").exists(), result.message
    # The virtualenv is built; this engine has no Python language host to run the program with.
    assert result.outcome == "blocked" and "pulumi-language-python is missing" in result.message, result.message
    assert os.listdir(cache) == [PROBE]
