"""TeamEnvironment: one team's namespace, identity and least-privilege access, plus a kubeconfig for it.

The team's ServiceAccount may manage the usual workload objects in its own namespace and only read
the rest of what it needs (pods, events, its Stacks and Flux sources); it gets read-only access to
other namespaces only when they are listed in `read_namespaces`, and never to their Secrets. Its
kubeconfig carries the token of a `kubernetes.io/service-account-token` Secret, which the token
controller fills (pulumi-kubernetes waits for that) and revokes when the Secret is deleted.
"""

import re
from collections.abc import Sequence
from typing import Any, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from typing_extensions import NotRequired

from .kube_objects import build_token_secret, create_object, object_key, token_from_secret_data
from .kubeconfig import build_token_kubeconfig
from .stack import Stack, StackSpec

READ = ["get", "list", "watch"]
WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]
FLUX_SOURCE_API = "source.toolkit.fluxcd.io/v1"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class TeamSourceArgs(TypedDict):
    url: str
    """Git repository holding the team's Pulumi program."""
    branch: NotRequired[str]
    """Branch to follow (default main)."""
    interval: NotRequired[str]
    """How often Flux fetches it (default 1m)."""
    secret_name: NotRequired[str]
    """Secret in the team namespace with git credentials."""


class TeamStackArgs(TypedDict):
    stack: str
    """Fully qualified stack name of the team's program."""
    dir: NotRequired[str]
    """Directory of the program inside the repository."""
    backend: NotRequired[str]
    """State backend URL."""
    secrets_provider: NotRequired[str]
    """Secrets provider of the stack."""
    config: NotRequired[dict[str, str]]
    """Plain stack configuration."""
    extra: NotRequired[StackSpec]
    """Any further Stack fields (refresh, env_refs, secrets_ref, ...)."""


class TeamEnvironmentArgs(TypedDict):
    provider: k8s.Provider
    """Provider of the cluster, with rights to create namespaces and RBAC."""
    team: str
    """Team name (a DNS label)."""
    server: pulumi.Input[str]
    """API server URL written into the team's kubeconfig."""
    namespace: NotRequired[str]
    """Namespace of the team (default team-<team>)."""
    read_namespaces: NotRequired[Sequence[str]]
    """Other namespaces the team may view (no Secrets, no writes)."""
    cluster_name: NotRequired[str]
    """Name of the cluster entry in the kubeconfig (default strata)."""
    source: NotRequired[TeamSourceArgs]
    """Flux GitRepository for the team's program."""
    stack: NotRequired[TeamStackArgs]
    """A Stack running the team's program from `source` under the team's ServiceAccount (needs `source`)."""


def build_team_rules() -> list[dict[str, Any]]:
    """What a team may do inside its own namespace: run workloads, never touch RBAC or quotas."""
    return [
        {"apiGroups": [""], "resources": ["configmaps", "secrets", "services", "serviceaccounts",
                                          "persistentvolumeclaims"], "verbs": WRITE},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "endpoints"], "verbs": READ},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": WRITE},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": READ},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": WRITE},
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": WRITE},
        {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": WRITE},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": READ},
        {"apiGroups": ["pulumi.com"], "resources": ["stacks", "programs"], "verbs": READ},
        {"apiGroups": ["source.toolkit.fluxcd.io"], "resources": ["gitrepositories"], "verbs": READ},
    ]


def build_viewer_rules() -> list[dict[str, Any]]:
    """What a team may see in a namespace it was granted read access to (never Secrets)."""
    return [
        {"apiGroups": [""], "resources": ["configmaps", "services", "pods", "events", "endpoints"], "verbs": READ},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"], "verbs": READ},
    ]


def team_names(team: str, namespace: str | None = None) -> dict[str, str]:
    """Object names of a team environment."""
    if not DNS_LABEL.match(team) or len(team) > 50:
        raise ValueError(f"team name {team!r} must be a DNS label of at most 50 characters (a-z, 0-9, -)")
    return {"namespace": namespace or f"team-{team}", "service_account": f"team-{team}",
            "token_secret": f"team-{team}-token", "role": f"team-{team}", "viewer_role": f"team-{team}-viewer"}


def build_team_objects(team: str, namespace: str | None = None,
                       read_namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, its token Secret, and the Roles/RoleBindings of one team, in apply order."""
    names = team_names(team, namespace)
    ns, sa = names["namespace"], names["service_account"]
    labels = {"strata.dev/team": team}
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns, "labels": labels},
         # The team's pods get their own identity; this one is for deploying.
         "automountServiceAccountToken": False},
        build_token_secret(ns, sa, names["token_secret"], labels),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": names["role"], "namespace": ns, "labels": labels}, "rules": build_team_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": names["role"], "namespace": ns, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names["role"]},
         "subjects": subject},
    ]
    for other in read_namespaces:
        if other == ns:
            raise ValueError(f"team {team}: read_namespaces lists its own namespace {ns}; remove it")
        objects += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": names["viewer_role"], "namespace": other, "labels": labels},
             "rules": build_viewer_rules()},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": names["viewer_role"], "namespace": other, "labels": labels},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names["viewer_role"]},
             "subjects": subject},
        ]
    return objects


def build_team_source(team: str, namespace: str, source: TeamSourceArgs) -> dict[str, Any]:
    """The Flux GitRepository holding the team's program."""
    spec: dict[str, Any] = {"url": source["url"], "interval": source.get("interval", "1m"),
                            "ref": {"branch": source.get("branch", "main")}}
    if "secret_name" in source:
        spec["secretRef"] = {"name": source["secret_name"]}
    return {"apiVersion": FLUX_SOURCE_API, "kind": "GitRepository",
            "metadata": {"name": f"team-{team}", "namespace": namespace, "labels": {"strata.dev/team": team}},
            "spec": spec}


def build_team_stack_spec(team: str, service_account: str, stack: TeamStackArgs) -> StackSpec:
    """The Stack spec running the team's program from its GitRepository under the team's identity."""
    spec: StackSpec = {**stack.get("extra", {}), "stack": stack["stack"],
                       "flux_source": {"source_ref": {"api_version": FLUX_SOURCE_API, "kind": "GitRepository",
                                                      "name": f"team-{team}"},
                                       "dir": stack.get("dir", ".")},
                       "service_account_name": service_account}
    for key in ("backend", "secrets_provider", "config"):
        if key in stack:
            spec[key] = stack[key]
    return spec


class TeamEnvironment(pulumi.ComponentResource):
    """A team's namespace, ServiceAccount and RBAC, a kubeconfig for that ServiceAccount, and
    optionally the Flux source and Stack of the team's program."""

    namespace: pulumi.Output[str]
    """The team's namespace."""
    service_account: pulumi.Output[str]
    """The team's ServiceAccount."""
    kubeconfig: pulumi.Output[str]
    """Kubeconfig of the team's ServiceAccount (secret)."""
    token: pulumi.Output[str]
    """The ServiceAccount's bearer token (secret)."""

    def __init__(self, name: str, args: TeamEnvironmentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:TeamEnvironment", name, {}, opts)
        team = args["team"]
        names = team_names(team, args.get("namespace"))
        if "stack" in args and "source" not in args:
            raise ValueError(f"team {team}: `stack` runs the program from `source`; add `source` (a git URL)")
        child = pulumi.ResourceOptions(parent=self, provider=args["provider"])
        created: dict[str, pulumi.CustomResource] = {}
        for manifest in build_team_objects(team, args.get("namespace"), args.get("read_namespaces", ())):
            # Everything namespaced waits for the team namespace; bindings wait for their subject.
            after = [created[key] for key in created if key.startswith(("namespace-", "serviceaccount-"))]
            created[object_key(manifest)] = create_object(
                f"{name}-{object_key(manifest)}", manifest,
                pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))
        token_secret = created[f"secret-{names['namespace']}-{names['token_secret']}"]
        namespace_resource = created[f"namespace-{names['namespace']}"]

        self.token = pulumi.Output.secret(token_secret.data.apply(token_from_secret_data))
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(args["server"], token_secret.data, self.token).apply(
            lambda values: build_token_kubeconfig(
                cluster=args.get("cluster_name", "strata"), server=values[0], ca_data=values[1].get("ca.crt", ""),
                user=names["service_account"], token=values[2], namespace=names["namespace"])))
        if "source" in args:
            source = create_object(f"{name}-source", build_team_source(team, names["namespace"], args["source"]),
                                   pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                                       depends_on=[namespace_resource])))
            if "stack" in args:
                Stack(f"{name}-stack", {"namespace": names["namespace"], "name": f"team-{team}",
                                        "spec": build_team_stack_spec(team, names["service_account"], args["stack"])},
                      pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                          depends_on=[source, *created.values()])))
        self.namespace = namespace_resource.metadata.name
        self.service_account = pulumi.Output.from_input(names["service_account"])
        self.register_outputs({"namespace": self.namespace, "service_account": self.service_account,
                               "kubeconfig": self.kubeconfig, "token": self.token})
