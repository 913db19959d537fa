"""The StackReference hand-off between layers, run by the real engine:
bootstrap -> platform -> per-team hand-off -> app team.

What runs is the layers' own code wherever this tier can run it. The platform and app-team layers
are inline programs that call the real programs' `read_settings` (programs/platform/__main__.py,
programs/app-team/__main__.py): every config key they read, set exactly as the layer above sets it
(the platform Stack's config from the bootstrap's real `platform_stack_spec`, an app Stack's from
the platform's real `team_args`), and the StackReferences they make. Each team's hand-off stack is
the Pulumi YAML program the operator runs (materialised as the operator does), encrypted with the
team's own passphrase, which is all the team's app stack has: it reads its hand-off stack and nothing else.

What cannot run here, and stands in: this tier has the pulumi CLI and the YAML host but no kubernetes
provider plugin and no Python language host (inline programs run in this process instead). So the
programs' resources, all kubernetes ones (the platform's TeamEnvironment, TeamHandoff and Program,
the app's Deployment and Service), and the bootstrap layer, whose outputs come from the Cluster
component (the local platform), are not run: the bootstrap stack is a stand-in exporting the same
outputs (a secret admin kubeconfig, the server), and each team's kubeconfig, which a TeamEnvironment
reads from its ServiceAccount's token Secret, is derived from the admin token. The e2e tier runs
the whole programs under the Python host on a cluster.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from pulumi import automation as auto

from strata_components.bootstrap_config import platform_stack_spec
from strata_components.handoff import build_handoff_program
from strata_components.layers import HANDOFF_PROJECT, derive_team_passphrase, handoff_stack
from strata_components.stack import build_program_body
from strata_operator.sources.project import write_program_project
from tests.engine.workspace import inline_stack, state_text, workspace_options

ROOT = Path(__file__).resolve().parents[3]
ADMIN_TOKEN = "admin-token-5c1d9e-must-stay-encrypted"
SERVER = "https://127.0.0.1:6443"
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIengine\n-----END CERTIFICATE-----\n").decode()
BOOTSTRAP = "organization/strata/bootstrap"
PLATFORM = "organization/strata-platform/dev"
PROJECT_REPO = "http://127.0.0.1:9/strata.git"
# As in Pulumi.dev.yaml's strata:teams: alpha runs the app-team program from this project's repository.
TEAM_SETTINGS = [{"name": "alpha", "dir": "programs/app-team"}, {"name": "beta"}]
TEAMS = tuple(team["name"] for team in TEAM_SETTINGS)
SECRET_SIGNATURE_KEY = "4dabf18193072939515e22adb298388d"  # marks a secret value in Pulumi state


def load_program(layer: str) -> ModuleType:
    """A layer's real __main__.py, imported rather than run as __main__: its functions, without the
    kubernetes resources its main() declares."""
    spec = importlib.util.spec_from_file_location(f"strata_program_{layer.replace('-', '_')}",
                                                  ROOT / "programs" / layer / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is being executed
    spec.loader.exec_module(module)
    return module


PLATFORM_PROGRAM = load_program("platform")
APP_TEAM_PROGRAM = load_program("app-team")


def team_token(admin_token: str, team: str) -> str:
    """Stands for the token the platform layer gets for a team (derived, so it is as secret as its source)."""
    return hashlib.sha256(f"{admin_token}/{team}".encode()).hexdigest()


def bootstrap_program():
    """Stands for the top-level __main__.py, whose outputs come from the Cluster component."""
    import pulumi

    from strata_components.kubeconfig import build_token_kubeconfig

    token = pulumi.Config().require_secret("adminToken")
    pulumi.export("kubeconfig", token.apply(lambda value: build_token_kubeconfig(
        cluster="strata", server=SERVER, ca_data=CA_DATA, user="admin", token=value)))
    pulumi.export("server", SERVER)


def platform_config(shared_passphrase: str) -> dict[str, auto.ConfigValue]:
    """The platform stack's config as the bootstrap's platform Stack sets it (__main__.py's
    platform_stack_spec), its secretsRef resolved as the operator resolves it."""
    spec = platform_stack_spec({"repo": PROJECT_REPO}, BOOTSTRAP, TEAM_SETTINGS, namespace="strata-system")
    assert list(spec["secrets_ref"]) == ["strata-platform:statePassphrase"]
    return {**{key: auto.ConfigValue(value) for key, value in spec["config"].items()},
            "strata-platform:statePassphrase": auto.ConfigValue(shared_passphrase, secret=True)}


def platform_program():
    import pulumi

    from strata_components.kubeconfig import build_token_kubeconfig, kubeconfig_cluster
    from strata_components.layers import team_passphrase
    from strata_components.team import team_names

    settings = PLATFORM_PROGRAM.read_settings(pulumi.Config())
    teams = [team["name"] for team in settings.teams]

    def team_kubeconfig(admin: str, team: str) -> str:
        # Stands for TeamEnvironment's kubeconfig (its ServiceAccount token needs the kubernetes plugin).
        server, ca_data = kubeconfig_cluster(admin)
        admin_token = yaml.safe_load(admin)["users"][0]["user"]["token"]
        return build_token_kubeconfig(cluster="strata", server=server, ca_data=ca_data, user=f"team-{team}",
                                      token=team_token(admin_token, team), namespace=team_names(team)["namespace"])

    pulumi.export("teamKubeconfigs", settings.cluster.kubeconfig.apply(
        lambda admin: {team: team_kubeconfig(admin, team) for team in teams}))
    # As main() exports them.
    pulumi.export("teamPassphrases", pulumi.Output.secret(
        {team: team_passphrase(settings.shared_passphrase, team) for team in teams}))
    pulumi.export("teamNamespaces", {team: team_names(team)["namespace"] for team in teams})
    pulumi.export("server", settings.cluster.server)
    pulumi.export("namespace", settings.namespace)
    # The app Stacks' config, as main() hands it to each team's TeamEnvironment (no provider: unused here).
    handed = {team["name"]: PLATFORM_PROGRAM.team_args(team, None, settings.cluster.server, settings.backend,
                                                       settings.project_repo) for team in settings.teams}
    pulumi.export("appStackConfig", {name: args["stack"]["config"] for name, args in handed.items()
                                     if "stack" in args})


def app_team_program():
    import pulumi

    settings = APP_TEAM_PROGRAM.read_settings(pulumi.Config())
    pulumi.export("kubeconfig", settings.access.kubeconfig)
    pulumi.export("namespace", settings.access.namespace)
    pulumi.export("team", settings.team)


def app_config(config: dict[str, str]) -> dict[str, auto.ConfigValue]:
    return {key: auto.ConfigValue(value) for key, value in config.items()}


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
        return self.inline("strata-platform", "dev", platform_program, platform_config(self.shared)).up().outputs

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
    # The teams arrived as the JSON string the bootstrap's Stack sets, and the namespace beside them.
    assert platform["teamNamespaces"].value == {team: f"team-{team}" for team in TEAMS}
    assert platform["namespace"].value == "strata-system"
    # Only alpha runs an app (from this project's repository); its Stack's config names its hand-off stack.
    app_config_of = platform["appStackConfig"].value
    assert app_config_of == {"alpha": {"strata-app-team:handoffStack": handoff_stack("alpha"),
                                       "strata-app-team:team": "alpha"}}

    for team in TEAMS:
        handoff = layers.up_handoff(team, platform["teamKubeconfigs"].value[team], passphrases[team]).outputs
        assert handoff["kubeconfig"].secret and not handoff["namespace"].secret
    app = layers.inline("strata-app-team", "alpha", app_team_program, app_config(app_config_of["alpha"]),
                        passphrases["alpha"])
    third = app.up().outputs
    assert third["kubeconfig"].secret and not third["namespace"].secret
    assert third["namespace"].value == "team-alpha" and third["team"].value == "alpha"

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


def test_the_team_passphrase_opens_no_stack_but_the_teams_own(toolchain, pulumi_env, file_backend, tmp_path):
    layers = Layers(toolchain, pulumi_env, file_backend, tmp_path)
    platform = layers.up_bootstrap_and_platform()
    passphrases = platform["teamPassphrases"].value
    for team in TEAMS:
        layers.up_handoff(team, platform["teamKubeconfigs"].value[team], passphrases[team])
    # With alpha's passphrase its own hand-off stack reads fine...
    own = layers.inline("strata-app-team", "alpha", app_team_program, app_config({"team": "alpha"}),
                        passphrases["alpha"]).up().outputs
    assert own["kubeconfig"].secret and team_token(ADMIN_TOKEN, "alpha") in own["kubeconfig"].value
    # ...but the platform stack and another team's hand-off stack do not decrypt with it: the engine
    # elides their secrets and the reading program fails.
    thieves = {"platform": (platform_reader_program, {}, "KeyError: 'alpha'"),
               "other-team": (app_team_program, app_config({"team": "alpha", "handoffStack": handoff_stack("beta")}),
                              f"cannot decrypt output 'kubeconfig' of stack {handoff_stack('beta')}")}
    for name, (program, config, reason) in thieves.items():
        thief = layers.inline("strata-app-team", f"thief-{name}", program, config, passphrases["alpha"])
        with pytest.raises(auto.errors.CommandError, match="eliding undecryptable secrets") as failed:
            thief.up()
        assert reason in str(failed.value), name
        for team in TEAMS:
            assert team_token(ADMIN_TOKEN, team) not in str(failed.value)
    for team in TEAMS:
        assert team_token(ADMIN_TOKEN, team) not in state_text(file_backend)


def test_an_app_stack_without_its_handoff_stack_fails_naming_it(toolchain, pulumi_env, file_backend, tmp_path):
    layers = Layers(toolchain, pulumi_env, file_backend, tmp_path)
    platform = layers.up_bootstrap_and_platform()
    # No handoffStack config: the program's default, the team's hand-off stack by name.
    app = layers.inline("strata-app-team", "gamma", app_team_program, app_config({"team": "gamma"}),
                        derive_team_passphrase(layers.shared, "gamma"))
    assert "gamma" not in platform["teamNamespaces"].value
    with pytest.raises(auto.errors.CommandError, match=r"strata-team-handoff/gamma"):
        app.up()
    assert ADMIN_TOKEN not in state_text(file_backend)
