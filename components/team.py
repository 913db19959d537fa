"""TeamEnvironment: one team's namespace, identity and least-privilege access, plus a kubeconfig for it.

The team's ServiceAccount may manage the usual workload objects, its Stacks, Programs and Flux sources
in its own namespace and only read the rest of what it needs (pods, events, its sync); it gets read-only
access to other namespaces only when they are listed in `read_namespaces`, and never to their Secrets.
With `sync`, Flux applies the team's directory of git as that ServiceAccount: the team's GitOps can
reach nothing the team could not. Its kubeconfig carries the token of a
`kubernetes.io/service-account-token` Secret, which the token controller fills (pulumi-kubernetes
waits for that) and revokes when the Secret is deleted.
"""

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from strata_operator.api import FILE_BACKEND_ANNOTATION
from typing_extensions import NotRequired

from .kube_objects import build_token_secret, create_object, object_key, token_from_secret_data
from .kubeconfig import build_token_kubeconfig
from .layers import PASSPHRASE_SECRET, this_stack
from .operator import (DEFAULT_OPERATOR_NAMESPACE, DEFAULT_OPERATOR_SERVICE_ACCOUNT, build_served_namespace_rbac,
                       load_packaged_manifests)
from .stack import Stack, StackSpec
from .team_entries import CREATED_BY_STACK, team_names
from .team_state import DEFAULT_LIFETIME_SECONDS, STATE_CREDENTIALS_SECRET, TeamStateCredentials

READ = ["get", "list", "watch"]
WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]
FLUX_SOURCE_API = "source.toolkit.fluxcd.io/v1"
FLUX_KUSTOMIZE_API = "kustomize.toolkit.fluxcd.io/v1"
# Pod Security admission on every team namespace: the `restricted` standard, enforced (a pod asking for more
# is refused at creation, whoever creates it: the team, its Deployments, the operator's workspace pods),
# warned about and audited, at the API server's latest version of the standard.
POD_SECURITY_LABELS = {f"pod-security.kubernetes.io/{mode}{suffix}": value
                       for mode in ("enforce", "warn", "audit")
                       for suffix, value in (("", "restricted"), ("-version", "latest"))}


class TeamSourceArgs(TypedDict):
    url: str
    """Git repository holding the team's Pulumi program."""
    branch: NotRequired[str]
    """Branch to follow (default main)."""
    interval: NotRequired[str]
    """How often Flux fetches it (default 1m)."""
    secret_name: NotRequired[str]
    """Secret in the team namespace with git credentials."""


class TeamSyncArgs(TypedDict):
    path: str
    """Directory of the team's `source` repository that the team owns: Flux applies it as the team."""
    substitute: NotRequired[Mapping[str, pulumi.Input[str]]]
    """Variables Flux fills into the team's manifests (`${NAME}`, postBuild substitution), e.g. the
    team's state backend."""
    timeout: NotRequired[str]
    """How long the team's Kustomization waits for what it applied to be healthy (default 5m)."""


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


class TeamStateArgs(TypedDict):
    endpoint: str
    """S3 endpoint of the object store holding the team's state (http:// or https://)."""
    bucket: str
    """The team's own state bucket there (created if missing)."""
    store_credentials: pulumi.Input[Mapping[str, str]]
    """The object store's credentials, {access_key_id, secret_access_key} (secret): they create the bucket and
    mint the team's; the team never gets them."""
    lifetime_seconds: NotRequired[int]
    """How long the team's credentials are valid (default 30 days); re-minted once half of it has passed."""


class TeamOperatorArgs(TypedDict):
    namespace: NotRequired[str]
    """The operator's namespace (default strata-system)."""
    service_account: NotRequired[str]
    """The operator's ServiceAccount (default strata-operator)."""
    executor: NotRequired[str]
    """The operator's executor, "process" or "pod" (default process): what it needs in the team's namespace."""


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
    sync: NotRequired[TeamSyncArgs]
    """The team's own GitOps: a Flux Kustomization in the team's namespace applying `sync.path` of
    `source` as the team's ServiceAccount (impersonated), so a commit there reaches only what the team
    may touch (needs `source`)."""
    passphrase: NotRequired[pulumi.Input[str]]
    """The team's state passphrase, as the Secret `strata-pulumi-passphrase` in its namespace, which its
    Stacks decrypt their state with (secret). Its sync and Stack come down before it, so their destroys
    still have it."""
    state: NotRequired[TeamStateArgs]
    """State of the team's own in an object store: its bucket, and credentials reaching only that bucket
    as the Secret `strata-state-credentials` in its namespace (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN), which its Stacks name in their envRefs."""
    operator: NotRequired[TeamOperatorArgs]
    """The operator serving the team's Stacks: it gets, in the team's namespace only, the Roles it needs there
    (the Secrets its Stacks name, and ServiceAccount tokens or workspace pods), and nothing anywhere else."""
    file_backend: NotRequired[str]
    """The team's file:// state directory (its backend's URL), on the operator's host: under the process executor
    the only one of the host's directories its programs may write (the namespace's annotation
    strata.dev/file-backend, which the operator's sandbox binds)."""


def build_team_rules() -> list[dict[str, Any]]:
    """What a team may do inside its own namespace: run workloads and write the Stacks, Programs and Flux
    sources its GitOps syncs; never touch RBAC, quotas or its own sync."""
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
        # The team's GitOps, applied as the team: its Stacks and Programs and the sources they name.
        {"apiGroups": ["pulumi.com"], "resources": ["stacks", "programs"], "verbs": WRITE},
        {"apiGroups": ["source.toolkit.fluxcd.io"], "resources": ["gitrepositories", "ocirepositories", "buckets"],
         "verbs": WRITE},
        {"apiGroups": ["kustomize.toolkit.fluxcd.io"], "resources": ["kustomizations"], "verbs": READ},
    ]


def build_viewer_rules() -> list[dict[str, Any]]:
    """What a team may see in a namespace it was granted read access to (never Secrets)."""
    return [
        {"apiGroups": [""], "resources": ["configmaps", "services", "pods", "events", "endpoints"], "verbs": READ},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"], "verbs": READ},
    ]


def build_team_objects(team: str, namespace: str | None = None, read_namespaces: Sequence[str] = (),
                       operator: TeamOperatorArgs | None = None, file_backend: str = "") -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, its token Secret, the Roles/RoleBindings of one team, and the operator's
    rights in its namespace, in apply order."""
    names = team_names(team, namespace)
    ns, sa = names["namespace"], names["service_account"]
    labels = {"strata.dev/team": team}
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    metadata: dict[str, Any] = {"name": ns, "labels": {**labels, **POD_SECURITY_LABELS}}
    if file_backend:
        metadata["annotations"] = {FILE_BACKEND_ANNOTATION: file_backend}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata},
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
    operator = operator or {}
    served = build_served_namespace_rbac(ns, operator.get("namespace", DEFAULT_OPERATOR_NAMESPACE),
                                         operator.get("service_account", DEFAULT_OPERATOR_SERVICE_ACCOUNT),
                                         load_packaged_manifests("rbac"), operator.get("executor", "process"))
    return [*objects, *served]


def build_sync_metadata(team: str, namespace: str, created_by: str | None) -> dict[str, Any]:
    """The metadata of the team's GitRepository and Kustomization; `created_by`: the fully qualified name
    of the stack creating them, which they carry for whoever draws the layers (`strata console`)."""
    metadata: dict[str, Any] = {"name": f"team-{team}", "namespace": namespace, "labels": {"strata.dev/team": team}}
    if created_by:
        metadata["annotations"] = {CREATED_BY_STACK: created_by}
    return metadata


def build_team_source(team: str, namespace: str, source: TeamSourceArgs,
                      created_by: str | None = None) -> dict[str, Any]:
    """The Flux GitRepository holding the team's program."""
    spec: dict[str, Any] = {"url": source["url"], "interval": source.get("interval", "1m"),
                            "ref": {"branch": source.get("branch", "main")}}
    if "secret_name" in source:
        spec["secretRef"] = {"name": source["secret_name"]}
    return {"apiVersion": FLUX_SOURCE_API, "kind": "GitRepository",
            "metadata": build_sync_metadata(team, namespace, created_by), "spec": spec}


def build_team_sync(team: str, namespace: str, service_account: str, sync: TeamSyncArgs,
                    created_by: str | None = None) -> dict[str, Any]:
    """The team's Flux Kustomization: `sync.path` of the team's GitRepository, applied as the team's
    ServiceAccount. It prunes what leaves git and, when deleted, waits until what it pruned is gone (the
    operator destroys a Stack before its namespace goes)."""
    spec: dict[str, Any] = {
        "interval": "10m", "retryInterval": "30s", "timeout": sync.get("timeout", "5m"),
        "sourceRef": {"kind": "GitRepository", "name": f"team-{team}"}, "path": sync["path"],
        "serviceAccountName": service_account, "prune": True, "wait": True, "deletionPolicy": "WaitForTermination"}
    if sync.get("substitute"):
        spec["postBuild"] = {"substitute": dict(sync["substitute"])}
    return {"apiVersion": FLUX_KUSTOMIZE_API, "kind": "Kustomization",
            "metadata": build_sync_metadata(team, namespace, created_by), "spec": spec}


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
    state_credentials: pulumi.Output[dict[str, str]] | None
    """With `state`: the team's state credentials as environment variables (secret), for its hand-off Stack."""

    def __init__(self, name: str, args: TeamEnvironmentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:TeamEnvironment", name, {}, opts)
        team = args["team"]
        names = team_names(team, args.get("namespace"))
        for needs_source in ("stack", "sync"):
            if needs_source in args and "source" not in args:
                raise ValueError(f"team {team}: `{needs_source}` reads the team's `source`; add `source` (a git URL)")
        child = pulumi.ResourceOptions(parent=self, provider=args["provider"])
        created: dict[str, pulumi.CustomResource] = {}
        for manifest in build_team_objects(team, args.get("namespace"), args.get("read_namespaces", ()),
                                           args.get("operator"), args.get("file_backend", "")):
            # Everything namespaced waits for the team namespace; bindings wait for their subject.
            after = [created[key] for key in created if key.startswith(("namespace-", "serviceaccount-"))]
            created[object_key(manifest)] = create_object(
                f"{name}-{object_key(manifest)}", manifest,
                pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))
        token_secret = created[f"secret-{names['namespace']}-{names['token_secret']}"]
        namespace_resource = created[f"namespace-{names['namespace']}"]
        if "passphrase" in args:
            created["passphrase"] = k8s.core.v1.Secret(
                f"{name}-passphrase", metadata={"name": PASSPHRASE_SECRET, "namespace": names["namespace"]},
                string_data={"passphrase": args["passphrase"]},
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace_resource])))
        self.state_credentials = None
        if "state" in args:
            state = args["state"]
            credentials = TeamStateCredentials(
                f"{name}-state", endpoint=state["endpoint"], bucket=state["bucket"],
                store_credentials=state["store_credentials"],
                lifetime_seconds=state.get("lifetime_seconds", DEFAULT_LIFETIME_SECONDS),
                opts=pulumi.ResourceOptions(parent=self))
            self.state_credentials = credentials.environment()
            # Rotated credentials replace the Secret's data; the expiration shows without reading it.
            created["state-credentials"] = k8s.core.v1.Secret(
                f"{name}-state-credentials",
                metadata={"name": STATE_CREDENTIALS_SECRET, "namespace": names["namespace"],
                          "labels": {"strata.dev/team": team},
                          "annotations": {"strata.dev/expires": credentials.expiration}},
                string_data=self.state_credentials,
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace_resource])))

        self.token = pulumi.Output.secret(token_secret.data.apply(token_from_secret_data))
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(args["server"], token_secret.data, self.token).apply(
            lambda values: build_token_kubeconfig(
                cluster=args.get("cluster_name", "strata"), server=values[0], ca_data=values[1].get("ca.crt", ""),
                user=names["service_account"], token=values[2], namespace=names["namespace"])))
        if "source" in args:
            source = create_object(f"{name}-source",
                                   build_team_source(team, names["namespace"], args["source"], this_stack()),
                                   pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                                       depends_on=[namespace_resource])))
            if "stack" in args:
                Stack(f"{name}-stack", {"namespace": names["namespace"], "name": f"team-{team}",
                                        "spec": build_team_stack_spec(team, names["service_account"], args["stack"])},
                      pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                          depends_on=[source, *created.values()])))
            if "sync" in args:
                create_object(f"{name}-sync", build_team_sync(team, names["namespace"], names["service_account"],
                                                              args["sync"], this_stack()),
                              pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                                  depends_on=[source, *created.values()])))
        self.namespace = namespace_resource.metadata.name
        self.service_account = pulumi.Output.from_input(names["service_account"])
        self.register_outputs({"namespace": self.namespace, "service_account": self.service_account,
                               "kubeconfig": self.kubeconfig, "token": self.token,
                               "state_credentials": self.state_credentials})
