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
