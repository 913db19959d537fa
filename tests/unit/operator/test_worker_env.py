"""What an update's environment holds: the Stack's own variables, never the operator's credentials, and
the language hosts and plugins the operator has."""

import os

from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import AutomationEngine, EngineSettings


def _env(tmp_path, monkeypatch, **stack_env):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("no_proxy", "127.0.0.1,.svc")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.internal/simple")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-own-credential")
    monkeypatch.setenv("PULUMI_ACCESS_TOKEN", "operator-own-token")
    engine = AutomationEngine(EngineSettings(pulumi_command="/bin/true", state_dir=tmp_path))
    return engine.worker_env(UpdateRequest(stack_key="ns/s", stack_name="dev", project_dir=str(tmp_path),
                                           env=stack_env))


def test_network_settings_pass_credentials_do_not(tmp_path, monkeypatch):
    env = _env(tmp_path, monkeypatch, PULUMI_CONFIG_PASSPHRASE="the stack's own")
    assert env["HTTPS_PROXY"] == "http://proxy.internal:3128" and env["no_proxy"] == "127.0.0.1,.svc"
    assert env["PIP_INDEX_URL"] == "https://mirror.internal/simple"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "PULUMI_ACCESS_TOKEN" not in env
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "the stack's own"
    assert env["HOME"] == str(tmp_path / "sandboxes/ns/s/home") and "PYTHONPATH" not in env


def test_a_home_relative_file_backend_is_the_operators_home(tmp_path, monkeypatch):
    env = _env(tmp_path, monkeypatch, PULUMI_BACKEND_URL="file://~/.pulumi-state")
    assert env["PULUMI_BACKEND_URL"] == "file://" + os.path.expanduser("~/.pulumi-state")
    assert _env(tmp_path, monkeypatch, PULUMI_BACKEND_URL="file:///srv/state")["PULUMI_BACKEND_URL"] == "file:///srv/state"


def _executable(directory, name):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text("#!/bin/sh\n")
    (directory / name).chmod(0o755)


def test_updates_get_the_hosts_and_plugins_on_the_operators_path_and_nothing_else(tmp_path):
    cli = tmp_path / "pulumi-install"
    _executable(cli, "pulumi")
    _executable(cli, "pulumi-language-python")
    toolchain = tmp_path / "toolchain-yaml"  # e.g. after `eval "$(strata local env)"`
    _executable(toolchain, "pulumi-language-yaml")
    _executable(tmp_path / "user-bin", "kubectl")
    host_path = os.pathsep.join([str(tmp_path / "user-bin"), str(cli), str(toolchain)])
    settings = EngineSettings(state_dir=tmp_path / "state", host_path=host_path, plugin_cache=tmp_path / "plugins")
    assert settings.search_path().split(os.pathsep) == [str(cli), str(toolchain), "/usr/local/bin", "/usr/bin",
                                                        "/bin"]
    summary = settings.summary()
    assert f"pulumi CLI {cli / 'pulumi'}" in summary
    assert f"python ({cli})" in summary and f"yaml ({toolchain})" in summary


def test_the_startup_line_names_the_shared_plugins(tmp_path):
    _executable(tmp_path / "cli", "pulumi")
    flux = tmp_path / "plugins" / "resource-flux-v1.0.1"
    _executable(flux, "pulumi-resource-flux")
    given = tmp_path / "elsewhere" / "resource-kubernetes-v4.34.2"
    _executable(given, "pulumi-resource-kubernetes")
    settings = EngineSettings(pulumi_command=str(tmp_path / "cli" / "pulumi"), state_dir=tmp_path / "state",
                              plugin_dirs=(str(given),), plugin_cache=tmp_path / "plugins", host_path="")
    summary = settings.summary()
    assert f"resource-flux-v1.0.1 ({tmp_path / 'plugins'})" in summary
    assert f"resource-kubernetes-v4.34.2 ({tmp_path / 'elsewhere'})" in summary
