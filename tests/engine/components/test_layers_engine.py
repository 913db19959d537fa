"""The StackReference hand-off between layers, run by the real engine: bootstrap -> platform -> app team.

Each layer reads the one below with the functions the programs use (strata_components.layers);
the credentials stay secret in every layer's outputs and never reach any state file in plaintext.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from tests.engine.workspace import inline_stack, state_text

ADMIN_TOKEN = "admin-token-5c1d9e-must-stay-encrypted"
SERVER = "https://127.0.0.1:6443"
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIengine\n-----END CERTIFICATE-----\n").decode()
BOOTSTRAP = "organization/strata/bootstrap"
PLATFORM = "organization/strata-platform/dev"
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
    from strata_components.layers import read_cluster_access

    cluster = read_cluster_access(pulumi.Config().require("bootstrapStack"))

    def team_kubeconfig(admin: str) -> str:
        server, ca_data = kubeconfig_cluster(admin)
        admin_token = yaml.safe_load(admin)["users"][0]["user"]["token"]
        return build_token_kubeconfig(cluster="strata", server=server, ca_data=ca_data, user="team-alpha",
                                      token=team_token(admin_token, "alpha"), namespace="team-alpha")

    pulumi.export("teamKubeconfigs", cluster.kubeconfig.apply(lambda admin: {"alpha": team_kubeconfig(admin)}))
    pulumi.export("teamNamespaces", {"alpha": "team-alpha"})
    pulumi.export("server", cluster.server)


def app_team_program():
    import pulumi

    from strata_components.layers import read_team_access

    config = pulumi.Config()
    access = read_team_access(config.require("platformStack"), config.require("team"))
    pulumi.export("kubeconfig", access.kubeconfig)
    pulumi.export("namespace", access.namespace)


def test_credentials_stay_secret_through_every_layer(toolchain, pulumi_env, file_backend):
    def stack(project: str, name: str, program, config: dict[str, auto.ConfigValue]) -> auto.Stack:
        created = inline_stack(toolchain, pulumi_env, file_backend, project, name, program)
        created.set_all_config(config)
        return created

    bootstrap = stack("strata", "bootstrap", bootstrap_program,
                      {"adminToken": auto.ConfigValue(ADMIN_TOKEN, secret=True)})
    platform = stack("strata-platform", "dev", platform_program, {"bootstrapStack": auto.ConfigValue(BOOTSTRAP)})
    app = stack("strata-app-team", "alpha", app_team_program,
                {"platformStack": auto.ConfigValue(PLATFORM), "team": auto.ConfigValue("alpha")})

    first = bootstrap.up().outputs
    assert first["kubeconfig"].secret and not first["server"].secret
    second = platform.up().outputs
    assert second["teamKubeconfigs"].secret
    assert not second["server"].secret and second["server"].value == SERVER
    assert not second["teamNamespaces"].secret
    third = app.up().outputs
    assert third["kubeconfig"].secret and not third["namespace"].secret
    assert third["namespace"].value == "team-alpha"

    team = yaml.safe_load(third["kubeconfig"].value)
    assert team["users"][0]["user"]["token"] == team_token(ADMIN_TOKEN, "alpha")
    assert team["clusters"][0]["cluster"] == {"server": SERVER, "certificate-authority-data": CA_DATA}
    state = state_text(file_backend)
    for plaintext in (ADMIN_TOKEN, team_token(ADMIN_TOKEN, "alpha")):
        assert plaintext not in state
    # On disk the layer's output is ciphertext of the stack's passphrase secrets manager.
    checkpoint = json.loads(next(Path(file_backend.removeprefix("file://")).rglob("strata-app-team/alpha.json"))
                            .read_text())
    stack_outputs = next(r for r in checkpoint["checkpoint"]["latest"]["resources"]
                         if r["type"] == "pulumi:pulumi:Stack")["outputs"]
    assert set(stack_outputs["kubeconfig"]) == {SECRET_SIGNATURE_KEY, "ciphertext"}
    assert stack_outputs["namespace"] == "team-alpha"

def test_a_team_the_platform_does_not_know_fails_naming_the_teams(toolchain, pulumi_env, file_backend):
    bootstrap = inline_stack(toolchain, pulumi_env, file_backend, "strata", "bootstrap", bootstrap_program)
    bootstrap.set_config("adminToken", auto.ConfigValue(ADMIN_TOKEN, secret=True))
    bootstrap.up()
    platform = inline_stack(toolchain, pulumi_env, file_backend, "strata-platform", "dev", platform_program)
    platform.set_config("bootstrapStack", auto.ConfigValue(BOOTSTRAP))
    platform.up()
    app = inline_stack(toolchain, pulumi_env, file_backend, "strata-app-team", "gamma", app_team_program)
    app.set_all_config({"platformStack": auto.ConfigValue(PLATFORM), "team": auto.ConfigValue("gamma")})
    # The kubeconfig and the namespace are looked up concurrently: either may fail first.
    with pytest.raises(auto.errors.CommandError,
                       match=r"no (kubeconfig|namespace) for team 'gamma'; teams: \['alpha'\]"):
        app.up()
    assert ADMIN_TOKEN not in state_text(file_backend)
