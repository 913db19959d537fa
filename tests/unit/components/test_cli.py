import subprocess
import sys
from pathlib import Path

import pytest

from strata_components import cli


@pytest.mark.parametrize("argv", [["local", "--state-dir", "/x", "up"], ["local", "up", "--state-dir", "/x"]])
def test_local_options_work_before_or_after_the_action(argv):
    args = cli.parse(argv)
    assert (args.action, args.state_dir, args.nodes) == ("up", Path("/x"), 1)
    assert args.handler is cli._local_up


def test_local_defaults_apply_when_no_option_is_given(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_STATE_DIR", str(tmp_path / "state"))
    args = cli.parse(["local", "status"])
    assert args.state_dir == tmp_path / "state" and args.controllers == "source-controller,kustomize-controller"


def test_status_down_and_env_take_what_the_platform_was_started_with_unless_told(monkeypatch, tmp_path):
    from strata_components.local.platform import LocalPlatform, PlatformConfig

    state = tmp_path / "state"
    state.mkdir()
    LocalPlatform(PlatformConfig(state_dir=state, host_controllers=(), real_nodes=2, profile="cluster"))._record_shape()
    for action in ("status", "down", "env"):
        args = cli.parse(["local", action, "--state-dir", str(state)])
        assert (args.profile, args.controllers, args.real_nodes) == ("cluster", "", 2), action
        assert cli._platform(args).config.host_controllers == ()
    assert cli.parse(["local", "status", "--state-dir", str(state), "--profile", "dev"]).profile == "dev"
    assert cli.parse(["local", "up", "--state-dir", str(state)]).profile == "dev"  # up: as told, or the defaults
    monkeypatch.setenv("STRATA_STATE_DIR", str(state))
    assert cli.parse(["local", "status"]).profile == "cluster"


@pytest.mark.parametrize("argv", [["dev", "--home", "/h", "down", "--force"], ["dev", "down", "--force", "--home", "/h"]])
def test_dev_options_work_before_or_after_the_action(argv):
    args = cli.parse(argv)
    assert (args.handler, args.home, args.force) == (cli._dev_down, Path("/h"), True)
    assert args.project == Path.cwd()


def test_operator_run_passes_every_option_to_the_operator():
    args = cli.parse(["operator", "run", "--kubeconfig", "k", "-n", "a", "--help"])
    assert args.handler is cli._operator_run and args.rest == ["--kubeconfig", "k", "-n", "a", "--help"]


def test_an_unknown_option_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        cli.parse(["local", "up", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_toolchain_keeps_its_own_options():
    args = cli.parse(["local", "toolchain", "kwok", "--rebuild", "kwok"])
    assert (args.names, args.rebuild) == (["kwok"], ["kwok"])


@pytest.mark.parametrize("argv", [["get", "-A", "-o", "json", "stacks"], ["get", "stacks", "-A", "-o", "json"],
                                  ["get", "stack", "--all-namespaces", "--output", "json"]])
def test_get_stacks_options_work_before_or_after_the_kind(argv):
    args = cli.parse(argv)
    assert (args.handler, args.all_namespaces, args.output, args.namespace) == (cli._get_stacks, True, "json", None)


@pytest.mark.parametrize("argv", [["reconcile", "-n", "apps", "--context", "c", "stack", "web"],
                                  ["reconcile", "stack", "web", "--context", "c", "-n", "apps"]])
def test_reconcile_stack_takes_kubectl_options_and_defaults_to_five_minutes(argv):
    args = cli.parse(argv)
    assert (args.handler, args.name, args.namespace, args.context, args.kubeconfig, args.timeout) == \
        (cli._reconcile_stack, "web", "apps", "c", None, "5m")


@pytest.mark.parametrize("argv, handler", [(["suspend", "stack", "web", "-n", "apps"], cli._suspend_stack),
                                           (["resume", "-n", "apps", "stack", "web"], cli._resume_stack),
                                           (["approve", "stack", "web", "-n", "apps"], cli._approve_stack)])
def test_suspend_resume_and_approve_take_kubectl_options(argv, handler):
    args = cli.parse(argv)
    assert (args.handler, args.name, args.namespace, args.output, args.timeout) == (handler, "web", "apps", "table",
                                                                                    "5m")


def test_logs_stack_takes_the_operator_state_dir():
    args = cli.parse(["logs", "stack", "web", "--operator-state-dir", "/s", "--kubeconfig", "/k"])
    assert (args.handler, args.operator_state_dir, args.kubeconfig, args.output) == \
        (cli._logs_stack, Path("/s"), "/k", "table")


def test_a_bad_timeout_fails_before_any_cluster_is_touched(capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    assert cli.main(["reconcile", "stack", "web", "--timeout", "5 minutes"]) == 1
    assert "--timeout '5 minutes' is not a duration" in capsys.readouterr().err


def test_a_missing_kubeconfig_is_one_line_naming_the_fix(capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/config")
    assert cli.main(["get", "stacks"]) == 1
    assert capsys.readouterr().err == ("error: no kubeconfig at /nonexistent/config: set KUBECONFIG or pass "
                                       "--kubeconfig (for the local platform: eval \"$(strata local env)\")\n")


def test_console_takes_a_port_and_kubectl_options():
    args = cli.parse(["console", "--port", "0", "--kubeconfig", "k", "--context", "c",
                      "--operator-state-dir", "/s"])
    assert (args.handler, args.port, args.kubeconfig, args.context, args.operator_state_dir) == (
        cli._console, 0, "k", "c", Path("/s"))
    assert cli.parse(["console"]).port == 0  # a free port, printed with the URL: never a fixed one that may be taken


def test_console_on_a_busy_port_is_one_line_naming_the_fix(capsys, monkeypatch, tmp_path):
    import socket

    from strata_components import stackctl

    monkeypatch.setattr(stackctl.Cluster, "connect", classmethod(lambda cls, *a: stackctl.Cluster(None, "default", "s")))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["console", "--port", str(port)]) == 1
    error = capsys.readouterr().err
    assert f"--port {port}: cannot listen" in error and "0 for a free one" in error


def test_without_the_operator_extra_the_command_names_it_and_the_library_still_imports():
    """`pip install strata` is the component library; the command says which extra it lacks, in one line."""
    blocked = "import sys; sys.modules['cryptography'] = sys.modules['kopf'] = None; "
    command = subprocess.run([sys.executable, "-c", blocked + "from strata_components import cli"],
                             capture_output=True, text=True, check=False)
    assert command.returncode == 1
    assert command.stderr.strip() == ("strata: the local platform and the `strata` command need the operator extra "
                                      "(kopf, cryptography not installed); fix: pip install 'strata[operator]' (this "
                                      "installation has the component library only)")
    library = subprocess.run([sys.executable, "-c", blocked + "import strata_components.layers, strata_components.team"],
                             capture_output=True, text=True, check=False)
    assert library.returncode == 0, library.stderr
