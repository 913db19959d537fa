"""TeamHandoff and the team passphrase: a team's kubeconfig handed over under that team's passphrase only."""

from __future__ import annotations

import hashlib
import hmac

import pulumi
import pulumi_kubernetes as k8s
from strata_mocks import secret_value

from strata_components.handoff import TeamHandoff, build_handoff_program, build_handoff_stack_spec
from strata_components.layers import derive_team_passphrase, handoff_stack, team_passphrase
from strata_components.stack import Program, build_program_body, build_stack_spec


def test_team_passphrases_are_hmacs_of_the_shared_one_per_team():
    alpha = derive_team_passphrase("shared", "alpha")
    assert alpha == hmac.new(b"shared", b"team:alpha", hashlib.sha256).hexdigest()
    assert len({"shared", alpha, derive_team_passphrase("shared", "beta"),
                derive_team_passphrase("other", "alpha")}) == 4


def test_team_passphrase_stays_secret_even_from_a_plain_input(harness):
    out = harness.run(lambda: {"secret": team_passphrase(pulumi.Output.secret("shared"), "alpha"),
                               "plain": team_passphrase("shared", "alpha")})
    for resolved in out.values():
        assert resolved.secret and resolved.value == derive_team_passphrase("shared", "alpha")


def test_handoff_program_and_stack_spec_are_valid_operator_objects():
    body = build_program_body(build_handoff_program())
    assert body["outputs"]["kubeconfig"] == {"fn::secret": "${kubeconfig}"}
    spec = build_stack_spec(build_handoff_stack_spec("alpha", "team-alpha", "file:///state"))
    assert spec["stack"] == handoff_stack("alpha") == "organization/strata-team-handoff/alpha"
    assert spec["programRef"] == {"name": "strata-team-handoff"}
    assert "backend" not in build_stack_spec(build_handoff_stack_spec("alpha", "team-alpha"))


def test_team_handoff_puts_secret_and_stack_under_itself(harness):
    def program():
        provider = k8s.Provider("cluster", kubeconfig="admin")
        handoff_program = Program("handoff", {"namespace": "strata-system", "name": "strata-team-handoff",
                                              "program": build_handoff_program()})
        handoff = TeamHandoff("alpha", {"provider": provider, "team": "alpha", "namespace": "strata-system",
                                        "team_namespace": "team-alpha",
                                        "kubeconfig": pulumi.Output.secret("alpha-kubeconfig"),
                                        "passphrase": "alpha-pp", "program": handoff_program})
        return {"stack": handoff.stack, "secret": handoff.secret}

    out = harness.run(program)
    assert out["stack"].value == "organization/strata-team-handoff/alpha"
    assert out["secret"].value == "team-alpha-handoff"
    component = harness.one("strata:index:TeamHandoff")
    secret = harness.one("kubernetes:core/v1:Secret")
    stack = harness.one("kubernetes:pulumi.com/v1:Stack")
    assert secret.parent == stack.parent == component.urn
    assert harness.provider_urn(stack.provider) == harness.one("pulumi:providers:kubernetes").urn
    # Even a passphrase given as a plain string goes over the wire as a secret.
    assert secret_value(secret.inputs["stringData"]) == {"kubeconfig": "alpha-kubeconfig", "passphrase": "alpha-pp"}
    assert {secret.urn, harness.one("kubernetes:pulumi.com/v1:Program").urn} <= set(stack.dependencies)
