"""The StackReference hand-off between layers, run by the real engine:
bootstrap -> platform -> per-team hand-off -> app team.

Each layer reads the one below with the functions the programs use (strata_components.layers);
the credentials stay secret in every layer's outputs and never reach any state file in plaintext.
The bootstrap and platform stacks share one passphrase; each team's hand-off stack is the Pulumi
YAML program the operator runs (materialised as the operator does), encrypted with the team's own
passphrase, which is all the team's app stack has: it reads its hand-off stack and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from strata_components.handoff import build_handoff_program
from strata_components.layers import HANDOFF_PROJECT, derive_team_passphrase, handoff_stack
from strata_components.stack import build_program_body
from strata_operator.sources import write_program_project
from tests.engine.workspace import inline_stack, state_text, workspace_options

ADMIN_TOKEN = "admin-token-5c1d9e-must-stay-encrypted"
SERVER = "https://127.0.0.1:6443"
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIengine\n-----END CERTIFICATE-----\n").decode()
BOOTSTRAP = "organization/strata/bootstrap"
PLATFORM = "organization/strata-platform/dev"
TEAMS = ("alpha", "beta")
SECRET_SIGNATURE_KEY = "4dabf18193072939515e22adb298388d"  # marks a secret value in Pulumi state


def team_token(admin_token: str, team: str) -> str:
    """Stands for the token the platform layer gets for a team (derived, so it is as secret as its source)."""
    return hashlib.sha256(f"{admin_token}/{team}".encode()).hexdigest()


def bootstrap_program():
    import pulumi

    from strata_components.kubeconfig import build_token_kubeconfig

    token = pulumi.Config().require_secret("adminToken")
    pulumi.export("kubeconfig", token.apply(lambda value: build_token_kubeconfig(
        cluster="strata", server=SERVER, ca_data=CA_DATA, user="admin", token=value)))
    pulumi.export("server", SERVER)


def platform_program():
    import pulumi

    from strata_components.kubeconfig import build_token_kubeconfig, kubeconfig_cluster
    from strata_components.layers import read_cluster_access, team_passphrase

    config = pulumi.Config()
    cluster = read_cluster_access(config.require("bootstrapStack"))
    shared = config.require_secret("statePassphrase")

    def team_kubeconfig(admin: str, team: str) -> str:
        server, ca_data = kubeconfig_cluster(admin)
        admin_token = yaml.safe_load(admin)["users"][0]["user"]["token"]
        return build_token_kubeconfig(cluster="strata", server=server, ca_data=ca_data, user=f"team-{team}",
                                      token=team_token(admin_token, team), namespace=f"team-{team}")

    pulumi.export("teamKubeconfigs", cluster.kubeconfig.apply(
        lambda admin: {team: team_kubeconfig(admin, team) for team in TEAMS}))
    pulumi.export("teamPassphrases", pulumi.Output.secret({team: team_passphrase(shared, team) for team in TEAMS}))
    pulumi.export("teamNamespaces", {team: f"team-{team}" for team in TEAMS})
    pulumi.export("server", cluster.server)


def app_team_program():
    import pulumi

    from strata_components.layers import read_team_access

    access = read_team_access(pulumi.Config().require("handoffStack"))
    pulumi.export("kubeconfig", access.kubeconfig)
    pulumi.export("namespace", access.namespace)


def platform_reader_program():
    """What a team's program did before hand-off stacks: its kubeconfig from the platform stack's map."""
    import pulumi

    reference = pulumi.StackReference(PLATFORM)
    pulumi.export("kubeconfig", pulumi.Output.secret(reference.require_output("teamKubeconfigs").apply(
        lambda kubeconfigs: kubeconfigs["alpha"])))


class Layers:
    """The stacks of the layers on one file backend, each with the passphrase its Stack object gets."""

    def __init__(self, toolchain, pulumi_env, file_backend, tmp_path: Path):
        self.toolchain, self.env, self.backend, self.tmp = toolchain, pulumi_env, file_backend, tmp_path
        self.shared = pulumi_env["PULUMI_CONFIG_PASSPHRASE"]

    def env_with(self, passphrase: str) -> dict[str, str]:
        return {**self.env, "PULUMI_CONFIG_PASSPHRASE": passphrase}

    def inline(self, project: str, name: str, program, config: dict[str, auto.ConfigValue],
               passphrase: str | None = None) -> auto.Stack:
        created = inline_stack(self.toolchain, self.env_with(passphrase or self.shared), self.backend, project, name,
                               program)
        created.set_all_config(config)
        return created

    def up_bootstrap_and_platform(self) -> dict[str, auto.OutputValue]:
        self.inline("strata", "bootstrap", bootstrap_program,
                    {"adminToken": auto.ConfigValue(ADMIN_TOKEN, secret=True)}).up()
        return self.inline("strata-platform", "dev", platform_program,
                           {"bootstrapStack": auto.ConfigValue(BOOTSTRAP),
                            "statePassphrase": auto.ConfigValue(self.shared, secret=True)}).up().outputs

    def up_handoff(self, team: str, kubeconfig: str, passphrase: str) -> auto.UpResult:
        """The team's hand-off stack as the operator runs it: the Program written as a YAML project,
        `kubeconfig` secret config (secretsRef), `namespace` plain config, the team passphrase."""
        project = self.tmp / f"handoff-{team}"
        write_program_project({"metadata": {"name": HANDOFF_PROJECT},
                               "program": build_program_body(build_handoff_program())}, project)
        stack = auto.create_stack(handoff_stack(team), work_dir=str(project),
                                  opts=workspace_options(self.toolchain, self.env_with(passphrase), self.backend,
                                                         project))
        stack.set_all_config({"kubeconfig": auto.ConfigValue(kubeconfig, secret=True),
                              "namespace": auto.ConfigValue(f"team-{team}")})
        return stack.up()


def test_credentials_stay_secret_through_every_layer(toolchain, pulumi_env, file_backend, tmp_path):
    layers = Layers(toolchain, pulumi_env, file_backend, tmp_path)
    platform = layers.up_bootstrap_and_platform()
    assert platform["teamKubeconfigs"].secret and platform["teamPassphrases"].secret
    assert not platform["server"].secret and platform["server"].value == SERVER
    assert not platform["teamNamespaces"].secret
    passphrases = platform["teamPassphrases"].value
    assert passphrases == {team: derive_team_passphrase(layers.shared, team) for team in TEAMS}
    assert len({layers.shared, *passphrases.values()}) == 3

    for team in TEAMS:
        handoff = layers.up_handoff(team, platform["teamKubeconfigs"].value[team], passphrases[team]).outputs
        assert handoff["kubeconfig"].secret and not handoff["namespace"].secret
    app = layers.inline("strata-app-team", "alpha", app_team_program,
                        {"handoffStack": auto.ConfigValue(handoff_stack("alpha"))}, passphrases["alpha"])
    third = app.up().outputs
    assert third["kubeconfig"].secret and not third["namespace"].secret
    assert third["namespace"].value == "team-alpha"

    team = yaml.safe_load(third["kubeconfig"].value)
    assert team["users"][0]["user"]["token"] == team_token(ADMIN_TOKEN, "alpha")
    assert team["clusters"][0]["cluster"] == {"server": SERVER, "certificate-authority-data": CA_DATA}
    state = state_text(file_backend)
    for plaintext in (ADMIN_TOKEN, *(team_token(ADMIN_TOKEN, t) for t in TEAMS), layers.shared,
                      *passphrases.values()):
        assert plaintext not in state
    # On disk each layer's output is ciphertext of its stack's passphrase secrets manager.
    root = Path(file_backend.removeprefix("file://"))
    for path in ("strata-app-team/alpha.json", f"{HANDOFF_PROJECT}/alpha.json"):
        checkpoint = json.loads(next(root.rglob(path)).read_text())
        stack_outputs = next(r for r in checkpoint["checkpoint"]["latest"]["resources"]
                             if r["type"] == "pulumi:pulumi:Stack")["outputs"]
        assert set(stack_outputs["kubeconfig"]) == {SECRET_SIGNATURE_KEY, "ciphertext"}
        assert stack_outputs["namespace"] == "team-alpha"


@pytest.mark.parametrize("program, config", [
    (platform_reader_program, {}),
    (app_team_program, {"handoffStack": auto.ConfigValue(handoff_stack("beta"))}),
], ids=["platform", "other-team"])
def test_the_team_passphrase_opens_no_stack_but_the_teams_own(toolchain, pulumi_env, file_backend, tmp_path,
                                                              program, config):
    layers = Layers(toolchain, pulumi_env, file_backend, tmp_path)
    platform = layers.up_bootstrap_and_platform()
    passphrases = platform["teamPassphrases"].value
    for team in TEAMS:
        layers.up_handoff(team, platform["teamKubeconfigs"].value[team], passphrases[team])
    # With alpha's passphrase its own hand-off stack reads fine...
    own = layers.inline("strata-app-team", "alpha", app_team_program,
                        {"handoffStack": auto.ConfigValue(handoff_stack("alpha"))}, passphrases["alpha"]).up().outputs
    assert own["kubeconfig"].secret and team_token(ADMIN_TOKEN, "alpha") in own["kubeconfig"].value
    # ...but the platform stack and another team's hand-off stack do not decrypt with it: the engine
    # elides their secrets and the reading program fails.
    thief = layers.inline("strata-app-team", "thief", program, config, passphrases["alpha"])
    with pytest.raises(auto.errors.CommandError, match="eliding undecryptable secrets") as failed:
        thief.up()
    if program is app_team_program:
        assert f"cannot decrypt output 'kubeconfig' of stack {handoff_stack('beta')}" in str(failed.value)
    else:
        assert "KeyError: 'alpha'" in str(failed.value)
    for team in TEAMS:
        assert team_token(ADMIN_TOKEN, team) not in str(failed.value)
        assert team_token(ADMIN_TOKEN, team) not in state_text(file_backend)


def test_an_app_stack_without_its_handoff_stack_fails_naming_it(toolchain, pulumi_env, file_backend, tmp_path):
    layers = Layers(toolchain, pulumi_env, file_backend, tmp_path)
    platform = layers.up_bootstrap_and_platform()
    app = layers.inline("strata-app-team", "gamma", app_team_program,
                        {"handoffStack": auto.ConfigValue(handoff_stack("gamma"))},
                        derive_team_passphrase(layers.shared, "gamma"))
    assert "gamma" not in platform["teamNamespaces"].value
    with pytest.raises(auto.errors.CommandError, match=r"strata-team-handoff/gamma"):
        app.up()
    assert ADMIN_TOKEN not in state_text(file_backend)
