"""The per-team hand-off, run by the real operator: the objects `strata_components.handoff` renders
(Program, Secrets, Stacks) applied to the apiserver, and a team's stack reading its hand-off by
StackReference under its own passphrase, where another team's hand-off stays closed to it: the engine
elides the secrets it cannot decrypt, so the team's state holds its own kubeconfig and nobody else's."""

import json
import subprocess

from strata_components.handoff import build_handoff_program, build_handoff_stack_spec, handoff_names
from strata_components.layers import HANDOFF_PROJECT, derive_team_passphrase, handoff_stack
from strata_components.stack import build_stack_spec

from .conftest import PASSPHRASE

TEAMS = ("alpha", "beta")


def _reader(handoff: str) -> dict:
    """A team program that reads a hand-off stack by reference, as programs/app-team does."""
    return {"resources": {"handoff": {"type": "pulumi:pulumi:StackReference", "properties": {"name": handoff}}},
            "outputs": {"namespace": '${handoff.outputs["namespace"]}',
                        "kubeconfig": '${handoff.outputs["kubeconfig"]}'}}


def test_a_team_reads_its_own_handoff_and_not_another_teams(stacks, toolchain, pulumi_env, tmp_path):
    passphrases = {team: derive_team_passphrase(PASSPHRASE, team) for team in TEAMS}
    stacks.program(HANDOFF_PROJECT, build_handoff_program())
    for team in TEAMS:
        stacks.secret(handoff_names(team)["secret"], {"kubeconfig": f"kubeconfig-of-{team}-canary",
                                                      "passphrase": passphrases[team]})
        stacks.create(handoff_names(team)["stack"],
                      build_stack_spec(build_handoff_stack_spec(team, f"team-{team}", stacks.backend)))
    for team in TEAMS:
        handed = stacks.wait_ready(handoff_names(team)["stack"], 120)
        assert handed["status"]["outputs"] == {"kubeconfig": "[secret]", "namespace": f"team-{team}"}

    # Team alpha's own stacks run with alpha's passphrase only.
    stacks.secret("alpha-passphrase", {"passphrase": passphrases["alpha"]})
    alpha_env = {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                              "secret": {"name": "alpha-passphrase", "key": "passphrase"}}}
    for name, handoff in (("alpha-own", handoff_stack("alpha")), ("alpha-other", handoff_stack("beta"))):
        stacks.program(name, _reader(handoff))
        stacks.create(name, stacks.spec(stack=f"organization/{name}/dev", programRef={"name": name},
                                        envRefs=alpha_env))

    for name in ("alpha-own", "alpha-other"):
        stacks.wait_ready(name, 120)
    # What alpha's stacks hold, read as team alpha can: with alpha's passphrase.
    alpha_cli = {**pulumi_env, "PULUMI_BACKEND_URL": stacks.backend, "PULUMI_CONFIG_PASSPHRASE": passphrases["alpha"]}

    def outputs(name: str) -> dict:
        done = subprocess.run([str(toolchain.dir("pulumi") / "bin" / "pulumi"), "stack", "output", "--json",
                               "--show-secrets", "--non-interactive", "--stack", f"organization/{name}/dev"],
                              env=alpha_cli, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert outputs("alpha-own") == {"namespace": "team-alpha", "kubeconfig": "kubeconfig-of-alpha-canary"}
    other = outputs("alpha-other")
    # The engine elides what alpha's passphrase cannot decrypt: beta's namespace (plain) but not its kubeconfig.
    assert other["namespace"] == "team-beta" and other.get("kubeconfig") != "kubeconfig-of-beta-canary"
    assert "kubeconfig-of-beta-canary" not in json.dumps(other)
    for team in TEAMS:
        assert f"kubeconfig-of-{team}-canary" not in stacks.operator.log_text()
        assert passphrases[team] not in stacks.operator.log_text()
