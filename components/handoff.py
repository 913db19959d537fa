"""TeamHandoff: the stack that hands one team its kubeconfig, encrypted with that team's passphrase only.

The platform stack's state is encrypted with the operator's shared passphrase, so a team must never
reference it. Instead the platform creates, per team, in its own namespace (which teams cannot
read): a Secret with the team's kubeconfig and team passphrase, and a Stack running the shared
hand-off Program (Pulumi YAML, `build_handoff_program`) with that kubeconfig as secret config and
the team passphrase as PULUMI_CONFIG_PASSPHRASE. Its outputs `kubeconfig` (secret) and `namespace`
are what the team's app stack reads by StackReference with the same team passphrase.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import pulumi
import pulumi_kubernetes as k8s
from typing_extensions import NotRequired

from .layers import HANDOFF_PROJECT, handoff_stack
from .stack import Program, ProgramBody, Stack, StackSpec
from .team_state import credential_env_refs


class TeamHandoffArgs(TypedDict):
    provider: k8s.Provider
    """Provider of the cluster, with rights to create Secrets and Stacks in `namespace`."""
    team: str
    """Team name."""
    namespace: str
    """The platform's namespace, where the operator runs the hand-off Stack (teams cannot read it)."""
    team_namespace: str
    """The team's namespace, handed over as the plain output `namespace`."""
    kubeconfig: pulumi.Input[str]
    """Kubeconfig of the team's ServiceAccount (secret)."""
    passphrase: pulumi.Input[str]
    """The team's state passphrase (secret), which encrypts the hand-off stack."""
    program: Program
    """The hand-off Program (`build_handoff_program`), named HANDOFF_PROJECT, in `namespace`."""
    backend: NotRequired[str]
    """State backend URL shared with the team's app stack."""
    state_credentials: NotRequired[pulumi.Input[Mapping[str, str]]]
    """The team's own credentials for that backend, as environment variables (secret): kept in the hand-off
    Secret beside the passphrase, and handed to the hand-off Stack's updates through envRefs."""


def build_handoff_program() -> ProgramBody:
    """The hand-off program: its config, exported as is (`kubeconfig` as a secret output)."""
    return {"configuration": {"kubeconfig": {"type": "String"}, "namespace": {"type": "String"}},
            "resources": {},
            "outputs": {"kubeconfig": {"fn::secret": "${kubeconfig}"}, "namespace": "${namespace}"}}


def handoff_names(team: str) -> dict[str, str]:
    """Object names of a team's hand-off in the platform's namespace."""
    return {"secret": f"team-{team}-handoff", "stack": f"team-{team}-handoff"}


def build_handoff_stack_spec(team: str, team_namespace: str, backend: str | None = None,
                             state_credentials: bool = False) -> StackSpec:
    """The Stack spec of a team's hand-off stack: the Program, the kubeconfig from the hand-off Secret as
    secret config, and the team passphrase from it as the stack's passphrase; with `state_credentials`,
    the team's backend credentials from it too."""
    secret = handoff_names(team)["secret"]
    spec: StackSpec = {
        "stack": handoff_stack(team),
        "program_ref": {"name": HANDOFF_PROJECT},
        "config": {"namespace": team_namespace},
        "secrets_ref": {"kubeconfig": {"type": "Secret", "secret": {"name": secret, "key": "kubeconfig"}}},
        "env_refs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": secret, "key": "passphrase"}}},
        "destroy_on_finalize": True,
    }
    if backend:
        spec["backend"] = backend
        spec["secrets_provider"] = "passphrase"
    if state_credentials:
        spec["env_refs"].update(credential_env_refs(secret))
    return spec


class TeamHandoff(pulumi.ComponentResource):
    """One team's hand-off: a Secret (kubeconfig, team passphrase) and a Stack running the hand-off
    Program under the team passphrase, both in the platform's namespace."""

    stack: pulumi.Output[str]
    """Fully qualified name of the hand-off stack (what the team's app stack references)."""
    secret: pulumi.Output[str]
    """Name of the Secret holding the team's kubeconfig and passphrase (platform namespace)."""

    def __init__(self, name: str, args: TeamHandoffArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:TeamHandoff", name, {}, opts)
        team = args["team"]
        names = handoff_names(team)
        child = pulumi.ResourceOptions(parent=self, provider=args["provider"])
        secret = k8s.core.v1.Secret(
            f"{name}-secret",
            metadata={"name": names["secret"], "namespace": args["namespace"], "labels": {"strata.dev/team": team}},
            string_data=pulumi.Output.secret(pulumi.Output.all(
                args["kubeconfig"], args["passphrase"], args.get("state_credentials", {})).apply(
                lambda values: {"kubeconfig": values[0], "passphrase": values[1], **values[2]})),
            opts=child)
        Stack(f"{name}-stack", {"namespace": args["namespace"], "name": names["stack"],
                                "labels": {"strata.dev/team": team},
                                "spec": build_handoff_stack_spec(team, args["team_namespace"], args.get("backend"),
                                                                 "state_credentials" in args)},
              pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[secret, args["program"]])))
        self.stack = pulumi.Output.from_input(handoff_stack(team))
        self.secret = secret.metadata.name
        self.register_outputs({"stack": self.stack, "secret": self.secret})
