"""The hand-off between layers: bootstrap -> platform -> app team, through StackReferences only.

Each layer reads just what it needs from the layer below; secret outputs stay secret (a
StackReference returns them as secret Outputs) and nothing is copied by hand.
"""

from __future__ import annotations

import dataclasses

import pulumi

# The Secret (in the namespace of each Stack that needs it) holding the shared file backend's passphrase.
PASSPHRASE_SECRET = "strata-pulumi-passphrase"
# The organization of every stack on a file:// (DIY) backend.
DIY_ORGANIZATION = "organization"


def this_stack() -> str:
    """Fully qualified name of the running stack, as other layers reference it."""
    return f"{pulumi.get_organization() or DIY_ORGANIZATION}/{pulumi.get_project()}/{pulumi.get_stack()}"


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """What the bootstrap stack hands the platform layer."""

    kubeconfig: pulumi.Output[str]
    """Admin kubeconfig (secret)."""
    server: pulumi.Output[str]
    """API server URL."""


@dataclasses.dataclass(frozen=True)
class TeamAccess:
    """What the platform stack hands one team's layer."""

    kubeconfig: pulumi.Output[str]
    """Kubeconfig of the team's ServiceAccount (secret)."""
    namespace: pulumi.Output[str]
    """The team's namespace."""


def read_cluster_access(bootstrap_stack: str, opts: pulumi.ResourceOptions | None = None) -> ClusterAccess:
    """The bootstrap stack's `kubeconfig` (kept secret) and `server` outputs."""
    reference = pulumi.StackReference(bootstrap_stack, opts=opts)
    return ClusterAccess(kubeconfig=pulumi.Output.secret(reference.require_output("kubeconfig")),
                         server=reference.require_output("server"))


def _pick(outputs: dict, team: str, what: str):
    if team not in outputs:
        raise ValueError(f"the platform stack has no {what} for team {team!r}; teams: {sorted(outputs)}")
    return outputs[team]


def read_team_access(platform_stack: str, team: str, opts: pulumi.ResourceOptions | None = None) -> TeamAccess:
    """One team's kubeconfig (kept secret) and namespace from the platform stack's per-team maps."""
    reference = pulumi.StackReference(platform_stack, opts=opts)
    kubeconfig = reference.require_output("teamKubeconfigs").apply(lambda m: _pick(m, team, "kubeconfig"))
    namespace = reference.require_output("teamNamespaces").apply(lambda m: _pick(m, team, "namespace"))
    return TeamAccess(kubeconfig=pulumi.Output.secret(kubeconfig), namespace=namespace)
