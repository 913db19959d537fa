"""What an update's environment holds: the Stack's own variables, never the operator's credentials."""

import os

from strata_operator.engine import AutomationEngine, EngineSettings, UpdateRequest


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
    assert env["HOME"] == str(tmp_path / "stacks/ns/s/home") and "PYTHONPATH" not in env


def test_a_home_relative_file_backend_is_the_operators_home(tmp_path, monkeypatch):
    env = _env(tmp_path, monkeypatch, PULUMI_BACKEND_URL="file://~/.pulumi-state")
    assert env["PULUMI_BACKEND_URL"] == "file://" + os.path.expanduser("~/.pulumi-state")
    assert _env(tmp_path, monkeypatch, PULUMI_BACKEND_URL="file:///srv/state")["PULUMI_BACKEND_URL"] == "file:///srv/state"
