"""The dev stack's home, on the real CLI: `make up`'s stack runs leave the tracked stack file as
committed, work with HOME pointing away from the account's home directory, and name a passphrase that
does not match the existing stack. A YAML project stands in for the bootstrap program (the Python
host is the e2e tier's); the devstack code driving the CLI is the one `make up` runs."""

from __future__ import annotations

import pytest
import yaml

from strata_components.local import devstack

COMMITTED = """# The committed dev config: comments and all, never rewritten.
secretsprovider: passphrase
config:
  devhome:greeting: hello
"""
PROJECT = """name: devhome
runtime: yaml
backend:
  url: file://~/.local/state/strata/pulumi
config:
  greeting: {type: string}
resources:
  note:
    type: pulumi:index:Stash
    properties:
      input: ${greeting}
outputs:
  note: ${note.output}
  hidden:
    fn::secret: ${greeting}
"""


@pytest.fixture
def project(tmp_path, pulumi_env, monkeypatch):
    directory = tmp_path / "project"
    directory.mkdir()
    (directory / "Pulumi.yaml").write_text(PROJECT)
    (directory / "Pulumi.dev.yaml").write_text(COMMITTED)
    # HOME is not the account's home directory (as under sudo -E, in containers and some CI systems);
    # the toolchain stays where it was built.
    from strata_components.local.toolchain import cache_root

    monkeypatch.setenv("STRATA_CACHE", str(cache_root()))
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    for name in ("STRATA_HOME", "XDG_STATE_HOME", "PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PULUMI_HOME", pulumi_env["PULUMI_HOME"])
    monkeypatch.setenv("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "true")
    return directory


def up(project, home, toolchain) -> None:
    run, _config = devstack.prepare(project, home, cli=toolchain.dir("pulumi") / "bin" / "pulumi")
    run("up", "--stack", "dev", "--config-file", str(home.stack_config), "--yes", "--skip-preview",
        "--non-interactive")


def test_the_tracked_stack_file_stays_as_committed_and_the_home_holds_the_rest(project, toolchain, tmp_path):
    home = devstack.dev_home()
    assert home.base == tmp_path / "elsewhere" / ".local" / "state" / "strata"
    up(project, home, toolchain)
    assert (project / "Pulumi.dev.yaml").read_text() == COMMITTED
    assert sorted(p.name for p in project.iterdir()) == ["Pulumi.dev.yaml", "Pulumi.yaml"]
    # The state is where the summary says, under the HOME in force, not the account's home directory.
    checkpoint = devstack.checkpoint_path(home, "devhome")
    assert checkpoint is not None and checkpoint.is_relative_to(home.backend_dir)
    salt = yaml.safe_load(home.stack_config.read_text())["encryptionsalt"]
    assert salt and devstack.checkpoint_salt(checkpoint) == salt
    assert home.passphrase_file.stat().st_mode & 0o077 == 0

    # Again, with the home's config lost: the salt comes back from the state, and the update goes on.
    home.stack_config.unlink()
    up(project, home, toolchain)
    assert yaml.safe_load(home.stack_config.read_text())["encryptionsalt"] == salt
    assert (project / "Pulumi.dev.yaml").read_text() == COMMITTED


def test_a_passphrase_that_does_not_match_the_stack_is_reported_as_such(project, toolchain, monkeypatch):
    home = devstack.dev_home()
    up(project, home, toolchain)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "not-the-one-it-was-made-with")
    with pytest.raises(devstack.DevStackError) as error:
        up(project, home, toolchain)
    message = str(error.value)
    assert "$PULUMI_CONFIG_PASSPHRASE does not match the existing dev stack" in message
    assert home.backend_url in message and "make down" in message and "pulumi stack rm dev" in message
