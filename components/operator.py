"""Operator: the Strata operator's CRDs, namespace, identity and least-privilege RBAC, and the operator itself.

In-cluster it is a Deployment with probes and a metrics Service (for authorized scrapers). In local
mode (kwok nodes run nothing) it is a host process of the local platform, authenticated with the token
of exactly the same ServiceAccount, so the RBAC it runs under is the RBAC that ships. CRDs and RBAC rules come
from the `strata_operator.api` package (crds/*.yaml, rbac/*.yaml), never from copies.
"""

import hashlib
import importlib.resources
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

import pulumi
import pulumi.dynamic
import pulumi_kubernetes as k8s
import strata_operator
import yaml
from strata_operator.api import RESOURCES_FIELD_ENV, SHUTDOWN_DRAIN_SECONDS
from strata_operator.api.sharding import MAIN_SELECTOR, SHARD_KEY
from typing_extensions import NotRequired

from .cluster import plan_change
from .kube_objects import (SERVICE_OF_AN_AWAITED_DEPLOYMENT, build_token_secret, create_object, object_key,
                           token_from_secret_data)
from .kubeconfig import build_token_kubeconfig

# The operator's API room: its CRDs (crds/*.yaml) and RBAC (rbac/*.yaml) are package data there.
OPERATOR_API_PACKAGE = "strata_operator.api"
PROCESS_NAME = "strata-operator"
DEFAULT_OPERATOR_NAMESPACE = "strata-system"
DEFAULT_OPERATOR_SERVICE_ACCOUNT = "strata-operator"
LABELS = {"app.kubernetes.io/name": "strata-operator", "app.kubernetes.io/part-of": "strata"}
# From SIGTERM to SIGKILL: the operator's drain of its running updates, and Kopf's cancellation after it.
OPERATOR_STOP_GRACE_SECONDS = SHUTDOWN_DRAIN_SECONDS + 30


class OperatorMode(str, Enum):
    """How the operator runs. Plain strings ("local", "in-cluster") are accepted wherever a mode is."""

    IN_CLUSTER = "in-cluster"
    """A Deployment in the cluster (needs `image`)."""
    LOCAL = "local"
    """A host process of the local platform (needs `local`)."""


class OperatorLocalArgs(TypedDict):
    state_dir: str
    """State directory of the local platform that supervises the operator process."""
    server: pulumi.Input[str]
    """API server URL for the operator's kubeconfig."""
    command: Sequence[str]
    """argv of the operator process without the port and state flags, e.g. [<venv>/bin/python, -m,
    strata_operator] (plus `--pulumi`/`--plugin-dir` for the Pulumi install its updates use)."""


class OperatorArgs(TypedDict):
    provider: k8s.Provider
    """Provider of the cluster the operator manages."""
    mode: OperatorMode
    """Run as a Deployment, or as a host process of the local platform."""
    namespace: NotRequired[str]
    """Namespace of the operator (default strata-system)."""
    service_account: NotRequired[str]
    """ServiceAccount the operator runs as (default strata-operator)."""
    image: NotRequired[str]
    """Container image (in-cluster mode, required)."""
    image_pull_policy: NotRequired[str]
    """IfNotPresent (default), Always or Never."""
    replicas: NotRequired[int]
    """Operator pods (in-cluster mode, default 1): one leads through a Lease and runs updates, the others
    stand by to take over."""
    resources: NotRequired[Mapping[str, Mapping[str, str]]]
    """Container requests/limits (default 100m/256Mi requested, 1Gi memory limit)."""
    metrics_port: NotRequired[int]
    """Port of the Prometheus metrics (default in-cluster 8383; in local mode one the platform picks free
    once and keeps, shown by `strata local status`). In-cluster they answer only a bearer token whose user
    may get /metrics (bind the ClusterRole strata-metrics-reader to Prometheus); in local mode they are on
    127.0.0.1 only."""
    health_port: NotRequired[int]
    """Port of /healthz (default in-cluster 8384; in local mode as metrics_port); in local mode the start
    waits until it answers."""
    flux_events_address: NotRequired[str]
    """URL of Flux's notification-controller event server (e.g.
    http://notification-controller.flux-system.svc.cluster.local./): every Stack Event also goes there in
    Flux's event format (`--flux-events-address`); default: off."""
    args: NotRequired[Sequence[str]]
    """Extra operator flags (e.g. --concurrency=20, --namespace=apps)."""
    env: NotRequired[Mapping[str, str]]
    """Extra environment variables of the operator."""
    node_selector: NotRequired[Mapping[str, str]]
    """In-cluster mode: labels of the nodes the operator pods may run on."""
    tolerations: NotRequired[Sequence[Mapping[str, str]]]
    """In-cluster mode: taints the operator pods tolerate (e.g. a dedicated node pool's)."""
    local: NotRequired[OperatorLocalArgs]
    """Settings of local mode."""
    executor: NotRequired[str]
    """Where updates run: "process" (default), forked by the operator as its own user; or "pod", a workspace
    pod per Stack in the Stack's namespace under its serviceAccountName (see the README's executors)."""
    workspace_image: NotRequired[str]
    """The pod executor's image: the operator's own (default: `image`; required in local mode)."""
    workspace_node_selector: NotRequired[Mapping[str, str]]
    """The pod executor: node labels every workspace pod requires (e.g. a pool for updates)."""
    workspace_tolerations: NotRequired[Sequence[Mapping[str, str]]]
    """The pod executor: taints every workspace pod tolerates."""
    served_namespaces: NotRequired[Sequence[str]]
    """Namespaces whose Stacks the operator serves besides its own and the teams' (each team's environment grants
    it there): it gets its Roles in each (the Secrets its Stacks name, and ServiceAccount tokens or workspace
    pods), never cluster-wide. Elsewhere a Stack stalls as NamespaceNotServed."""
    trusted_namespaces: NotRequired[Sequence[str]]
    """The process executor: namespaces whose programs run unsandboxed, as the operator's own user, besides its
    own (`--trusted-namespace`; "*": all). Only where whoever writes a Stack may act as the operator."""
    shards: NotRequired[Sequence[str]]
    """In-cluster mode: shard names (e.g. ["shard1", "shard2"]), Flux's sharding convention. Each shard is
    a Deployment `strata-operator-<shard>` of its own (same image, flags, replicas and leader election,
    a Lease of its own) owning the objects labelled `sharding.fluxcd.io/key: <shard>`; the main
    Deployment then owns only the unlabelled ones. Default: none, one operator owns every object."""


def load_packaged_manifests(directory: str) -> list[dict[str, Any]]:
    """Every YAML document in strata_operator/api/<directory>/*.yaml, in file-name order."""
    root = importlib.resources.files(OPERATOR_API_PACKAGE) / directory
    files = sorted((entry for entry in root.iterdir() if entry.name.endswith(".yaml")), key=lambda e: e.name) \
        if root.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no {OPERATOR_API_PACKAGE}/{directory}/*.yaml found; is strata installed completely?")
    return [document for entry in files for document in yaml.safe_load_all(entry.read_text()) if document]


def build_operator_identity(namespace: str, service_account: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": LABELS}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": service_account, "namespace": namespace, "labels": LABELS}},
    ]


EXECUTOR_LABEL = "strata.dev/executor"
# A packaged Role labelled so is the operator's in every namespace it serves (build_served_namespace_rbac).
SCOPE_LABEL, SERVED_NAMESPACE = "strata.dev/scope", "served-namespace"
# A packaged role labelled so is shipped for others to bind (strata-metrics-reader, for Prometheus).
BIND_LABEL, FOR_OTHERS = "strata.dev/bind", "others"


def _for_others(role: Mapping[str, Any]) -> bool:
    return (role["metadata"].get("labels") or {}).get(BIND_LABEL) == FOR_OTHERS


def build_operator_rbac(namespace: str, service_account: str, packaged: Sequence[dict[str, Any]],
                        executor: str = "process") -> list[dict[str, Any]]:
    """The packaged ClusterRoles/Roles (rules as shipped), each bound to this ServiceAccount only; a role
    labelled for one executor only when the operator runs that one, and none shipped for others to bind.
    Roles are made in the operator's own namespace, which it serves like a team's (its platform Stacks run
    there). Bindings and ServiceAccounts in the package are ignored: the subject is decided here."""
    objects: list[dict[str, Any]] = []
    for role in packaged:
        if role.get("kind") not in ("ClusterRole", "Role") or _for_others(role) or not _for_executor(role, executor):
            continue
        objects += _bound(role, namespace, service_account, namespace)
    if not any(item["kind"] == "ClusterRole" for item in objects):
        raise ValueError(f"{OPERATOR_API_PACKAGE}/rbac/*.yaml has no ClusterRole: the operator could not watch Stacks")
    return objects


def build_served_namespace_rbac(namespace: str, operator_namespace: str, service_account: str,
                                packaged: Sequence[dict[str, Any]], executor: str = "process") -> list[dict[str, Any]]:
    """What the operator may do in `namespace`, one it serves (a team's): the packaged Roles scoped to served
    namespaces, for its executor, made there and bound to its ServiceAccount only. Nothing cluster-wide grants
    them: a namespace without these stalls its Stacks as NamespaceNotServed."""
    objects: list[dict[str, Any]] = []
    for role in packaged:
        labels = role["metadata"].get("labels") or {}
        if role.get("kind") == "Role" and labels.get(SCOPE_LABEL) == SERVED_NAMESPACE and _for_executor(role, executor):
            objects += _bound(role, namespace, service_account, operator_namespace)
    return objects


def _for_executor(role: Mapping[str, Any], executor: str) -> bool:
    return (role["metadata"].get("labels") or {}).get(EXECUTOR_LABEL, executor) == executor


def _bound(role: Mapping[str, Any], namespace: str, service_account: str,
           operator_namespace: str) -> list[dict[str, Any]]:
    """The role (a Role made in `namespace`) and its binding to the operator's ServiceAccount."""
    kind, name = role["kind"], role["metadata"]["name"]
    metadata: dict[str, Any] = {"name": name, "labels": LABELS}
    if kind == "Role":
        metadata["namespace"] = namespace
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata, "rules": role["rules"]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding", "metadata": dict(metadata),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": operator_namespace}]}]


def build_reader_roles(packaged: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The packaged ClusterRoles shipped for others to bind (strata-metrics-reader), unbound."""
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role["metadata"]["name"], "labels": LABELS}, "rules": role["rules"]}
            for role in packaged if role.get("kind") == "ClusterRole" and _for_others(role)]


DEFAULT_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


DEFAULT_METRICS_PORT = 8383
DEFAULT_HEALTH_PORT = 8384
CONTAINER_COMMAND = ["python", "-m", "strata_operator"]
OPERATOR_HOME = "/home/strata"  # HOME of the image's user (operator/Dockerfile)


# In a pod the metrics are served on the pod's address (for its Service), to authorized scrapers only; on a
# host the operator's default, loopback, holds.
IN_CLUSTER_METRICS_FLAGS = ["--metrics-bind-address=0.0.0.0", "--metrics-auth=kubernetes"]


def build_operator_flags(metrics_port: int = DEFAULT_METRICS_PORT, health_port: int = DEFAULT_HEALTH_PORT,
                         extra: Sequence[str] = (), flux_events_address: str = "") -> list[str]:
    """Flags of the in-cluster `python -m strata_operator` (see strata_operator.main)."""
    return [*build_port_flags(metrics_port, health_port), *IN_CLUSTER_METRICS_FLAGS,
            *build_flux_events_flags(flux_events_address), *extra]


def build_flux_events_flags(flux_events_address: str) -> list[str]:
    return [f"--flux-events-address={flux_events_address}"] if flux_events_address else []


def build_port_flags(metrics_port: int, health_port: int) -> list[str]:
    return [f"--metrics-port={metrics_port}", f"--health-port={health_port}"]


def build_local_ports(requested: Mapping[str, int | None], kept: Mapping[str, int]) -> dict[str, int]:
    """The local operator's ports: those the component's args give, else the platform's own for it (picked
    free on first use and kept in its platform.json, like every platform process's): never a fixed port
    another operator on the host may hold."""
    # int(): numbers come back from the engine as floats.
    return {"metrics_port": int(requested.get("metrics_port") or kept["operator_metrics"]),
            "health_port": int(requested.get("health_port") or kept["operator_health"])}


def build_executor_flags(args: OperatorArgs) -> list[str]:
    """The flags that choose the executor (none for the default, process) and the namespaces it trusts."""
    trusted = [f"--trusted-namespace={namespace}" for namespace in args.get("trusted_namespaces", ())]
    return [*_executor_flags(args), *trusted]


def _executor_flags(args: OperatorArgs) -> list[str]:
    executor = args.get("executor", "process")
    if executor not in ("process", "pod"):
        raise ValueError(f"operator: `executor` is {executor!r}; use \"process\" or \"pod\"")
    if executor == "process":
        return []
    image = args.get("workspace_image") or (args.get("image", "") if args["mode"] == "in-cluster" else "")
    if not image:
        raise ValueError("operator: executor \"pod\" needs `workspace_image` (the operator's image) in local mode")
    tolerations = [f"{t['key']}={t['value']}:{t['effect']}" if t.get("value") else f"{t['key']}:{t['effect']}"
                   for t in args.get("workspace_tolerations", ())]
    return ["--executor=pod", f"--workspace-image={image}",
            f"--workspace-image-pull-policy={args.get('image_pull_policy', 'IfNotPresent')}",
            *(f"--workspace-node-selector={k}={v}" for k, v in sorted(args.get("workspace_node_selector", {}).items())),
            *(f"--workspace-toleration={t}" for t in tolerations)]


SHARD_POD_NAME = f"{PROCESS_NAME}-shard"  # shard pods' app.kubernetes.io/name: the main selector must not match them
SHARD_LABEL = "strata.dev/shard"


def check_shard_names(shards: Sequence[str]) -> list[str]:
    """The shard names, each usable in a Deployment's name and as a label value; ValueError says which is not."""
    names = list(shards)
    longest = 63 - len(PROCESS_NAME) - len("-metrics") - 1
    for shard in names:
        if not isinstance(shard, str) or not re.fullmatch(rf"[a-z0-9]([-a-z0-9]{{0,{longest - 2}}}[a-z0-9])?", shard):
            raise ValueError(f"operator: shard {shard!r} in `shards` is not a name: use lower-case letters, digits "
                             f"and '-', at most {longest} characters (e.g. shard1)")
    duplicates = sorted({shard for shard in names if names.count(shard) > 1})
    if duplicates:
        raise ValueError(f"operator: `shards` names {', '.join(duplicates)} twice; each shard once")
    return names


def build_shard_flags(shard: str | None) -> list[str]:
    """--watch-label-selector of the main operator (shard None) or of one shard, so that every object has
    exactly one owner: the main one takes the unlabelled objects, a shard its own label value."""
    return [f"--watch-label-selector={MAIN_SELECTOR}" if shard is None else f"--watch-label-selector={SHARD_KEY}={shard}"]


def shard_identity(shard: str | None) -> tuple[str, dict[str, str]]:
    """The Deployment's name and its pods' labels: the main operator's as they always were, a shard's its own."""
    if shard is None:
        return PROCESS_NAME, dict(LABELS)
    return f"{PROCESS_NAME}-{shard}", {**LABELS, "app.kubernetes.io/name": SHARD_POD_NAME, SHARD_LABEL: shard}


def pod_selector(pod_labels: Mapping[str, str]) -> dict[str, str]:
    """What a Deployment and its metrics Service select: the name, and the shard if it is one."""
    return {key: value for key, value in pod_labels.items() if key in ("app.kubernetes.io/name", SHARD_LABEL)}


def build_operator_deployment(namespace: str, service_account: str, image: str, *,
                              metrics_port: int = DEFAULT_METRICS_PORT, health_port: int = DEFAULT_HEALTH_PORT,
                              resources: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                              args: Sequence[str] = (), image_pull_policy: str = "IfNotPresent",
                              replicas: int = 1, node_selector: Mapping[str, str] | None = None,
                              tolerations: Sequence[Mapping[str, str]] = (),
                              flux_events_address: str = "", shard: str | None = None) -> dict[str, Any]:
    """The in-cluster operator: `replicas` pods of which the Lease holder alone handles Stacks (a standby
    answers /healthz too, so probes neither restart it nor hold back a rollout), hardened pod. With
    `shard`, that shard's Deployment: its own name and pod labels, which the main one's selector (immutable
    once created) does not match."""
    if not image:
        raise ValueError("operator: `image` is required in in-cluster mode (e.g. ghcr.io/acme/strata-operator:0.1.0)")
    if replicas < 1:
        raise ValueError(f"operator: `replicas` must be at least 1, not {replicas}")
    probe = {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10}
    name, pod_labels = shard_identity(shard)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels},
        "spec": {
            "replicas": replicas,
            # Leader election keeps one replica active. A rollout starts each new pod (a standby) before it
            # stops an old one, which drains its running updates and hands the Lease over: no time without
            # an operator, however long the new image takes to pull, and `pulumi up` (which waits for the
            # rollout) returns once the new version runs.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "selector": {"matchLabels": pod_selector(pod_labels)},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": service_account,
                    **({"nodeSelector": dict(node_selector)} if node_selector else {}),
                    **({"tolerations": [dict(t) for t in tolerations]} if tolerations else {}),
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    # Running updates finish before the pod goes (an upgrade never cuts one short).
                    "terminationGracePeriodSeconds": OPERATOR_STOP_GRACE_SECONDS,
                    "containers": [{
                        "name": "operator", "image": image, "imagePullPolicy": image_pull_policy,
                        "command": CONTAINER_COMMAND,
                        "args": build_operator_flags(metrics_port, health_port, args, flux_events_address),
                        # An update killed for this container's memory limit says so, naming what raises it.
                        "env": [{"name": RESOURCES_FIELD_ENV, "value": "the Operator component's resources"},
                                *({"name": key, "value": value} for key, value in sorted((env or {}).items()))],
                        "ports": [{"name": "metrics", "containerPort": metrics_port},
                                  {"name": "health", "containerPort": health_port}],
                        "livenessProbe": {**probe, "initialDelaySeconds": 15, "failureThreshold": 6},
                        "readinessProbe": {**probe, "initialDelaySeconds": 5},
                        "resources": dict(resources or DEFAULT_RESOURCES),
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        # The root filesystem is read-only: per-Stack workdirs, PULUMI_HOMEs and virtualenvs
                        # (the image's STRATA_OPERATOR_STATE is under HOME) and temporary files.
                        "volumeMounts": [{"name": "home", "mountPath": OPERATOR_HOME},
                                         {"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def build_operator_metrics_service(namespace: str, metrics_port: int = DEFAULT_METRICS_PORT,
                                   shard: str | None = None) -> dict[str, Any]:
    name, pod_labels = shard_identity(shard)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{name}-metrics", "namespace": namespace, "labels": pod_labels,
                     "annotations": dict(SERVICE_OF_AN_AWAITED_DEPLOYMENT)},
        "spec": {"selector": pod_selector(pod_labels),
                 "ports": [{"name": "metrics", "port": metrics_port, "targetPort": "metrics"}]},
    }


def build_operator_objects(args: OperatorArgs, packaged_rbac: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every non-CRD object of the operator for its mode, in apply order."""
    namespace = args.get("namespace", DEFAULT_OPERATOR_NAMESPACE)
    service_account = args.get("service_account", DEFAULT_OPERATOR_SERVICE_ACCOUNT)
    executor = args.get("executor", "process")
    objects = [*build_operator_identity(namespace, service_account),
               *build_operator_rbac(namespace, service_account, packaged_rbac, executor)]
    for served in args.get("served_namespaces", ()):
        objects += build_served_namespace_rbac(served, namespace, service_account, packaged_rbac, executor)
    shards = check_shard_names(args.get("shards", ()))
    if args["mode"] == "local":
        if shards:
            raise ValueError("operator: `shards` need in-cluster mode (a Deployment per shard); the local platform "
                             "runs one operator process, which owns every object")
        return [*objects, build_token_secret(namespace, service_account, f"{service_account}-token", LABELS)]
    if args["mode"] != "in-cluster":
        raise ValueError(f"operator mode {args['mode']!r} is not supported; use in-cluster or local")
    metrics_port = args.get("metrics_port", DEFAULT_METRICS_PORT)
    operators: list[dict[str, Any]] = []
    # Without shards the main operator owns every object, with no selector: exactly as before shards existed.
    for shard in [None, *shards]:
        selector = build_shard_flags(shard) if shards else []
        operators += [
            build_operator_deployment(namespace, service_account, args.get("image", ""), metrics_port=metrics_port,
                                      health_port=args.get("health_port", DEFAULT_HEALTH_PORT),
                                      resources=args.get("resources"), env=args.get("env"),
                                      args=[*build_executor_flags(args), *selector, *args.get("args", ())],
                                      image_pull_policy=args.get("image_pull_policy", "IfNotPresent"),
                                      replicas=args.get("replicas", 1), node_selector=args.get("node_selector"),
                                      tolerations=args.get("tolerations", ()),
                                      flux_events_address=args.get("flux_events_address", ""), shard=shard),
            build_operator_metrics_service(namespace, metrics_port, shard)]
    return [*objects, *build_reader_roles(packaged_rbac), *operators]


# -- local mode: the operator as a supervised host process ---------------------------------------

def _platform(props: dict[str, Any]):
    from strata_components.local.platform import LocalPlatform, PlatformConfig

    return LocalPlatform(PlatformConfig(state_dir=Path(props["state_dir"])))


def operator_state_dir(platform_state_dir: str) -> Path:
    """Where a local operator keeps its per-Stack state: inside the platform's state directory."""
    return Path(platform_state_dir).expanduser() / "operator"


def _kubeconfig_path(props: dict[str, Any]) -> Path:
    return Path(props["state_dir"]) / "kubeconfigs" / f"{props['name']}.kubeconfig"


def operator_code_digest() -> str:
    """One digest of the operator package's code and manifests as installed here."""
    root = Path(strata_operator.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".yaml") and path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class OperatorProcessProvider(pulumi.dynamic.ResourceProvider):
    """Starts the operator beside the local platform with only its ServiceAccount's kubeconfig."""

    def _start(self, props: dict[str, Any]) -> dict[str, Any]:
        from strata_components.local.kube import http_ok, write_private
        from strata_components.local.processes import HostProcess

        platform = _platform(props)
        ports = build_local_ports(props["requested_ports"], platform.controller_ports(props["name"]))
        path = write_private(_kubeconfig_path(props), props["kubeconfig"])
        argv = [*props["command"], *build_port_flags(ports["metrics_port"], ports["health_port"]), *props["flags"]]
        process = HostProcess(props["name"], argv, env={**props["env"], "KUBECONFIG": str(path)})
        health_url = f"http://127.0.0.1:{ports['health_port']}/healthz"
        platform.start_controller(process, ready=lambda: http_ok(health_url))
        return {**props, **ports, "health_url": health_url}

    def _stop(self, props: dict[str, Any]) -> None:
        # SIGTERM, then as long as the operator may take to let its running updates finish.
        _platform(props).stop_controller(props["name"], grace=OPERATOR_STOP_GRACE_SECONDS)
        _kubeconfig_path(props).unlink(missing_ok=True)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=f"{props['state_dir']}#{props['name']}", outs=self._start(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        from strata_components.local.processes import running_pid

        running = running_pid(_platform(olds).run_dir, olds["name"]) is not None
        return plan_change(olds, news, replace_on=("state_dir", "name"),
                           update_on=("command", "flags", "requested_ports", "env", "kubeconfig", "code"),
                           running=running)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        self._stop(olds)
        return pulumi.dynamic.UpdateResult(outs=self._start(news))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        self._stop(props)


class OperatorProcess(pulumi.dynamic.Resource):
    """The operator as a host process of the local platform."""

    kubeconfig: pulumi.Output[str]
    metrics_port: pulumi.Output[int]
    health_port: pulumi.Output[int]

    def __init__(self, name: str, *, state_dir: str, command: Sequence[str], flags: Sequence[str],
                 requested_ports: Mapping[str, int | None], env: Mapping[str, str], kubeconfig: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None):
        # `code`: a new version of the operator (an upgrade: `git pull && make up`) restarts the process.
        props = {"state_dir": str(Path(state_dir).expanduser()), "name": PROCESS_NAME, "code": operator_code_digest(),
                 "command": list(command),
                 "flags": list(flags), "requested_ports": dict(requested_ports), "env": dict(env),
                 "kubeconfig": kubeconfig, "metrics_port": None, "health_port": None, "health_url": None}
        super().__init__(OperatorProcessProvider(), name, props, pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"])))


class Operator(pulumi.ComponentResource):
    """The Strata operator with its CRDs and least-privilege identity."""

    namespace: pulumi.Output[str]
    """Namespace of the operator."""
    service_account: pulumi.Output[str]
    """ServiceAccount the operator runs as."""
    kubeconfig: pulumi.Output[str] | None
    """Local mode: the operator's ServiceAccount kubeconfig (secret); None in-cluster."""

    def __init__(self, name: str, args: OperatorArgs, opts: pulumi.ResourceOptions | None = None, *,
                 start_after: Sequence[pulumi.Resource] = ()):
        """`start_after`: what the operator's process (local mode) or Deployments wait for beside its own
        CRDs and identity, such as the CRDs of the Flux sources it watches (`Flux.crds`); its other objects
        are created meanwhile. Python programs only (a resource is no package input): elsewhere use
        `depends_on` on the whole component."""
        super().__init__("strata:index:Operator", name, {}, opts)
        if args["mode"] == "local" and "local" not in args:
            raise ValueError("operator mode local needs `local` settings (state_dir, server, command)")
        child = pulumi.ResourceOptions(parent=self, provider=args["provider"])
        crds = [create_object(f"{name}-{object_key(crd)}", crd, child)
                for crd in load_packaged_manifests("crds")]
        created: dict[str, pulumi.CustomResource] = {}
        for manifest in build_operator_objects(args, load_packaged_manifests("rbac")):
            after = list(created.values()) if manifest["kind"] in ("Deployment", "Secret") else \
                [created[key] for key in created if key.startswith(("namespace-", "serviceaccount-"))]
            if manifest["kind"] == "Deployment":
                after += [*crds, *start_after]
            created[object_key(manifest)] = create_object(
                f"{name}-{object_key(manifest)}", manifest,
                pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))

        namespace = args.get("namespace", DEFAULT_OPERATOR_NAMESPACE)
        service_account = args.get("service_account", DEFAULT_OPERATOR_SERVICE_ACCOUNT)
        self.kubeconfig = None
        if args["mode"] == "local":
            local = args["local"]
            token_secret = created[f"secret-{namespace}-{service_account}-token"]
            token = token_secret.data.apply(token_from_secret_data)
            self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(local["server"], token_secret.data, token).apply(
                lambda values: build_token_kubeconfig(cluster="strata", server=values[0],
                                                      ca_data=values[1].get("ca.crt", ""),
                                                      user=f"system:serviceaccount:{namespace}:{service_account}",
                                                      token=values[2], namespace=namespace)))
            if not local.get("command"):
                raise ValueError("operator local mode: `local.command` (argv of the operator process) is required")
            # Per-Stack workdirs, PULUMI_HOMEs and virtualenvs live with the platform they belong to
            # (not in the user's ~/.cache): one platform per state directory, gone with it. `args`
            # come last, so a `--state-dir` there still wins. The ports are the platform's, kept across
            # restarts, unless the args give them (see build_local_ports).
            flags = [f"--state-dir={operator_state_dir(local['state_dir'])}",
                     *build_flux_events_flags(args.get("flux_events_address", "")),
                     *build_executor_flags(args), *args.get("args", ())]
            OperatorProcess(f"{name}-process", state_dir=local["state_dir"], command=local["command"], flags=flags,
                            requested_ports={"metrics_port": args.get("metrics_port"),
                                             "health_port": args.get("health_port")},
                            env=args.get("env", {}), kubeconfig=self.kubeconfig,
                            opts=pulumi.ResourceOptions(parent=self, depends_on=[*crds, *created.values(), *start_after]))
        self.namespace = pulumi.Output.from_input(namespace)
        self.service_account = pulumi.Output.from_input(service_account)
        outputs: dict[str, Any] = {"namespace": self.namespace, "service_account": self.service_account}
        if self.kubeconfig is not None:
            outputs["kubeconfig"] = self.kubeconfig
        self.register_outputs(outputs)
