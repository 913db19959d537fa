"""Layer 2 (app team): the team's app in its own namespace, with a provider built from the team's
kubeconfig (read by reference from the team's hand-off stack, which this stack's passphrase, the
team's own, decrypts), so it can touch nothing else.

Config: team, handoffStack (fully qualified; default organization/strata-team-handoff/<team>),
image (default nginxinc/nginx-unprivileged:1.27: it serves on 8080 as a user other than root, as the
team's namespace requires, Pod Security `restricted`), replicas (default 2), outsideNamespace (default
default: where the `outsideAccess` output shows the API server refusing this team).
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from strata_components.kube_objects import SERVICE_OF_AN_AWAITED_DEPLOYMENT
from strata_components.layers import TeamAccess, handoff_stack, list_status, read_team_access

DEFAULT_IMAGE = "nginxinc/nginx-unprivileged:1.27"
APP_PORT = 8080


@dataclasses.dataclass(frozen=True)
class AppSettings:
    """This layer's config, read, and the team's access from its hand-off stack."""

    team: str
    access: TeamAccess
    image: str
    replicas: int
    outside: str
    """Where the `outsideAccess` output shows the API server refusing this team."""


def read_settings(config: pulumi.Config) -> AppSettings:
    """Every config value this layer reads, and the team's hand-off stack by reference (the engine tier
    runs this function on the real engine; the resources below need the kubernetes plugin)."""
    team = config.require("team")
    return AppSettings(team=team, access=read_team_access(config.get("handoffStack") or handoff_stack(team)),
                       image=config.get("image") or DEFAULT_IMAGE, replicas=config.get_int("replicas") or 2,
                       outside=config.get("outsideNamespace") or "default")


def main() -> None:
    settings = read_settings(pulumi.Config())
    access, team = settings.access, settings.team
    namespace = access.namespace
    provider = k8s.Provider("team", kubeconfig=access.kubeconfig, namespace=namespace)
    labels = {"app.kubernetes.io/name": "app", "strata.dev/team": team}
    opts = pulumi.ResourceOptions(provider=provider)
    deployment = k8s.apps.v1.Deployment(
        "app", metadata={"namespace": namespace, "labels": labels},
        spec={"replicas": settings.replicas, "selector": {"matchLabels": labels},
              "template": {"metadata": {"labels": labels},
                           # Pod Security `restricted`, which the team's namespace enforces.
                           "spec": {"securityContext": {"runAsNonRoot": True,
                                                        "seccompProfile": {"type": "RuntimeDefault"}},
                                    "containers": [{"name": "app", "image": settings.image,
                                                    "ports": [{"name": "http", "containerPort": APP_PORT}],
                                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                                        "capabilities": {"drop": ["ALL"]}}}]}}},
        opts=opts)
    service = k8s.core.v1.Service(
        "app", metadata={"namespace": namespace, "labels": labels, "annotations": SERVICE_OF_AN_AWAITED_DEPLOYMENT},
        spec={"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}, opts=opts)

    # The boundary, as the API server enforces it: this identity may not even list another namespace's objects.
    outside = settings.outside
    # The answer holds no secret, though it is computed from the (secret) kubeconfig.
    pulumi.export("outsideAccess", pulumi.Output.unsecret(access.kubeconfig.apply(
        lambda kubeconfig: f"list configmaps in {outside}: {list_status(kubeconfig, outside)}")))
    pulumi.export("namespace", namespace)
    pulumi.export("deployment", deployment.metadata.name)
    pulumi.export("service", service.metadata.name)


# The Python host runs this file as __main__; the engine tier imports it to call read_settings.
if __name__ == "__main__":
    main()
