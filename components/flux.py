"""Flux: installed from the manifests the Pulumi Flux provider renders, applied with pulumi-kubernetes.

`pulumi_flux.get_flux_install` renders the install for a version and a set of controllers (from
`<baseurl>/download/<version>/manifests.tar.gz` when `baseurl` is given, e.g. a loopback server
with an offline bundle). The CRDs go in one ConfigGroup and everything else in a second that
depends on it, so no custom resource or controller comes before its CRD. Controllers that the local
platform runs as host processes keep their RBAC but lose their Deployment (kwok nodes would only
pretend to run them) and the Services selecting its pods: such a Service never gets an endpoint,
and pulumi-kubernetes waits for one (10 minutes, then fails the install). The host controllers
advertise their loopback addresses instead (source-controller's `--storage-adv-addr`).
"""

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import pulumi
import pulumi_flux as flux
import pulumi_kubernetes as k8s
import yaml
from typing_extensions import NotRequired

from .flux_tenancy import CLUSTER_SYNC_SERVICE_ACCOUNT, LOCKDOWN_FLAGS
from .kube_objects import SERVICE_OF_AN_AWAITED_DEPLOYMENT

DEFAULT_COMPONENTS = ("source-controller", "kustomize-controller", "helm-controller", "notification-controller")
VERSION_PATTERN = re.compile(r"^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
REGISTRY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:\d+)?(/[a-z0-9][a-z0-9._-]*)*$")


class FluxSyncArgs(TypedDict):
    url: pulumi.Input[str]
    """Git repository URL Flux syncs from (http(s):// or ssh://)."""
    branch: NotRequired[str]
    """Branch to follow (default main)."""
    path: NotRequired[str]
    """Directory inside the repository the Kustomization applies (default ./)."""
    interval_minutes: NotRequired[int]
    """How often Flux fetches the repository (default 1)."""
    secret_name: NotRequired[str]
    """Name of an existing Secret in the Flux namespace with the git credentials."""
    substitute: NotRequired[Mapping[str, pulumi.Input[str]]]
    """Variables the Kustomization fills into the synced manifests (`${NAME}`, Flux's postBuild
    substitution): what differs per cluster (git server URL, state backend) stays out of git."""
    timeout: NotRequired[str]
    """How long the Kustomization waits for what it applied to be healthy, and on deletion for what it
    pruned to be gone (default 5m)."""


class FluxSyncComponentArgs(FluxSyncArgs):
    provider: k8s.Provider
    """Provider of the cluster Flux runs on."""
    namespace: NotRequired[str]
    """Namespace of Flux and of the GitRepository and Kustomization (default flux-system)."""


class FluxArgs(TypedDict):
    provider: k8s.Provider
    """Provider of the cluster Flux is installed on."""
    version: str
    """Flux release, starting with "v" (e.g. v2.9.5)."""
    components: NotRequired[Sequence[str]]
    """Controllers to install (default source, kustomize, helm and notification controllers)."""
    baseurl: NotRequired[pulumi.Input[str]]
    """Where the install bundle is downloaded from (`<baseurl>/download/<version>/manifests.tar.gz`);
    GitHub releases when absent."""
    namespace: NotRequired[str]
    """Namespace of the Flux controllers (default flux-system)."""
    registry: NotRequired[str]
    """Where the controller images come from, as in Flux's air-gapped install (`flux install
    --registry`): `<registry>/<controller>:<version>`, e.g. `registry.internal:5000/fluxcd` (default
    ghcr.io/fluxcd). A host[:port]/path, without a scheme."""
    image_pull_secret: NotRequired[str]
    """Name of a docker-registry Secret in the Flux namespace the controllers' pods pull with (`flux
    install --image-pull-secret`); create it before, or beside, the install."""
    network_policy: NotRequired[bool]
    """Install Flux's NetworkPolicies (default true)."""
    host_controllers: NotRequired[Sequence[str]]
    """Controllers run as host processes by the local platform: their Deployments, and the Services
    selecting their pods, are not applied. When set, every installed controller must be one of them."""
    sync: NotRequired[FluxSyncArgs]
    """Make Flux sync a git repository (GitRepository + Kustomization from `get_flux_sync`)."""
    node_selector: NotRequired[Mapping[str, str]]
    """Labels of the nodes the controllers' pods may run on (default: any node), e.g. a system pool's."""
    tolerations: NotRequired[Sequence[Mapping[str, str]]]
    """Taints the controllers' pods tolerate (default: none), e.g. a dedicated system pool's."""
    multi_tenancy: NotRequired[bool]
    """Flux's multi-tenancy lockdown (default true): a Kustomization or HelmRelease is applied as its
    `serviceAccountName`, or as its namespace's `default` ServiceAccount when it names none; no
    cross-namespace references, no remote bases. The local platform's host controllers always run so."""


@dataclasses.dataclass(frozen=True)
class FluxManifests:
    """The rendered install, split in apply order."""

    crds: list[dict[str, Any]]
    resources: list[dict[str, Any]]
    host_run: list[str]
    """Deployments left out because their controller runs on the host."""
    host_services: list[str] = dataclasses.field(default_factory=list)
    """Services left out because they select only the pods of those Deployments."""


def validate_flux_args(args: FluxArgs) -> None:
    version = args.get("version", "")
    if not VERSION_PATTERN.match(version):
        raise ValueError(f"flux version {version!r} must look like v2.9.5 (with the leading v); "
                         "the Flux provider asks for `latest` otherwise")
    components = list(args.get("components", DEFAULT_COMPONENTS))
    unknown = sorted(set(components) - set(DEFAULT_COMPONENTS))
    if unknown:
        raise ValueError(f"flux components {unknown} are unknown; choose from {list(DEFAULT_COMPONENTS)}")
    registry = args.get("registry")
    if registry is not None and not REGISTRY_PATTERN.match(registry):
        raise ValueError(f"flux registry {registry!r} must be a host[:port]/path without a scheme or a trailing "
                         "slash, e.g. registry.internal:5000/fluxcd (Flux adds /<controller>:<version>)")
    host = args.get("host_controllers")
    if host and not args.get("multi_tenancy", True):
        raise ValueError("flux multi_tenancy: false cannot apply to the local platform's host controllers, which "
                         "always run locked down (each sync as its own ServiceAccount); remove it")
    if host:
        elsewhere = [component for component in components if component not in host]
        if elsewhere:
            raise ValueError(f"flux components {elsewhere} would be scheduled on kwok nodes where nothing runs; "
                             f"remove them from `components` or run them on the host (`host_controllers`)")


def build_sync_manifests(content: str, substitute: Mapping[str, str] | None = None,
                         timeout: str = "5m", secret_name: str | None = None) -> list[dict[str, Any]]:
    """`get_flux_sync`'s GitRepository and Kustomization. The GitRepository uses git credentials only
    with `secret_name` (the provider names a Secret `flux-system` whether or not one exists). The
    Kustomization prunes what leaves git, waits for what it applies to be healthy (kstatus), fills
    `substitute` in as postBuild variables, and, when deleted, waits until what it pruned is gone
    (`WaitForTermination`): a Stack it synced is destroyed by the operator before whatever comes
    down after the sync."""
    documents = [document for document in yaml.safe_load_all(content) if document]
    for document in documents:
        if document.get("kind") == "GitRepository" and not secret_name:
            document.get("spec", {}).pop("secretRef", None)
        if document.get("kind") == "Kustomization":
            spec = document.setdefault("spec", {})
            # Applied as kustomize-controller's own ServiceAccount, as Flux's lockdown has it: under the
            # lockdown a sync naming none would run as `default`, with no rights.
            spec["serviceAccountName"] = CLUSTER_SYNC_SERVICE_ACCOUNT
            # A failed health check (a synced Stack still running its first update) is retried soon,
            # not at the next interval.
            spec.update(prune=True, wait=True, timeout=timeout, retryInterval="30s",
                        deletionPolicy="WaitForTermination")
            if substitute:
                spec.setdefault("postBuild", {})["substitute"] = dict(substitute)
    return documents


def _selects(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def lock_down(deployment: dict[str, Any]) -> None:
    """Add Flux's multi-tenancy lockdown flags to a controller's Deployment (its `manager` container)."""
    flags = LOCKDOWN_FLAGS.get(deployment["metadata"]["name"], ())
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "manager":
            container["args"] = [*container.get("args", []), *flags]


def place(deployment: dict[str, Any], node_selector: Mapping[str, str],
          tolerations: Sequence[Mapping[str, str]]) -> None:
    """Pin a controller's pods to the nodes `node_selector` selects, tolerating `tolerations` (as the
    patches `flux bootstrap` documents for a dedicated node pool)."""
    pod = deployment["spec"]["template"]["spec"]
    if node_selector:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **node_selector}
    if tolerations:
        pod["tolerations"] = [*(pod.get("tolerations") or []), *(dict(t) for t in tolerations)]


def build_flux_manifests(content: str, host_controllers: Sequence[str] = (), multi_tenancy: bool = True,
                         node_selector: Mapping[str, str] | None = None,
                         tolerations: Sequence[Mapping[str, str]] = ()) -> FluxManifests:
    """Split `get_flux_install`'s multi-document YAML into CRDs and the rest, dropping the
    Deployments of host-run controllers and the Services that select only their pods, locking
    the controllers down for multi-tenancy unless told not to and placing their pods on the nodes
    `node_selector` and `tolerations` allow."""
    crds, kept, host_run, host_pods = [], [], [], []
    for document in yaml.safe_load_all(content):
        if not document:
            continue
        if document.get("kind") == "CustomResourceDefinition":
            crds.append(document)
        elif document.get("kind") == "Deployment" and document["metadata"]["name"] in host_controllers:
            host_run.append(document["metadata"]["name"])
            host_pods.append((document["metadata"].get("namespace"),
                              document["spec"]["template"]["metadata"].get("labels") or {}))
        else:
            if document.get("kind") == "Deployment":
                if multi_tenancy:
                    lock_down(document)
                place(document, node_selector or {}, tolerations)
            kept.append(document)
    if not crds:
        raise ValueError("the Flux install has no CustomResourceDefinitions; check `version` and `baseurl`")
    resources, host_services = [], []
    for document in kept:
        if document.get("kind") == "Service" and any(
                namespace == document["metadata"].get("namespace")
                and _selects((document.get("spec") or {}).get("selector"), labels)
                for namespace, labels in host_pods):
            host_services.append(document["metadata"]["name"])
        else:
            if document.get("kind") == "Service":  # its controller's Deployment is in the same group, awaited
                annotations = document["metadata"].setdefault("annotations", {})
                annotations.update(SERVICE_OF_AN_AWAITED_DEPLOYMENT)
            resources.append(document)
    return FluxManifests(crds=crds, resources=resources, host_run=host_run, host_services=host_services)


class Flux(pulumi.ComponentResource):
    """Flux controllers, CRDs first, and optionally a git sync."""

    namespace: pulumi.Output[str]
    """Namespace of the Flux controllers and sources."""
    version: pulumi.Output[str]
    """Installed Flux release."""
    host_run: pulumi.Output[list[str]]
    """Controllers whose Deployment was left out because they run on the host."""

    def __init__(self, name: str, args: FluxArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:Flux", name, {}, opts)
        validate_flux_args(args)
        namespace = args.get("namespace", "flux-system")
        host_controllers = list(args.get("host_controllers", ()))
        child = pulumi.ResourceOptions(parent=self, provider=args["provider"])
        install = flux.get_flux_install_output(
            target_path="strata", version=args["version"], namespace=namespace,
            components=list(args.get("components", DEFAULT_COMPONENTS)), baseurl=args.get("baseurl"),
            network_policy=args.get("network_policy", True), registry=args.get("registry"),
            image_pull_secrets=args.get("image_pull_secret"), opts=pulumi.InvokeOptions(parent=self))
        manifests = install.content.apply(
            lambda content: build_flux_manifests(content, host_controllers, args.get("multi_tenancy", True),
                                                 args.get("node_selector"), args.get("tolerations", ())))
        crds = k8s.yaml.v2.ConfigGroup(f"{name}-crds", objs=manifests.apply(lambda m: m.crds), opts=child)
        controllers = k8s.yaml.v2.ConfigGroup(
            f"{name}-install", objs=manifests.apply(lambda m: m.resources),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[crds])))
        if "sync" in args:
            FluxSync(f"{name}-sync", {**args["sync"], "provider": args["provider"], "namespace": namespace},
                     pulumi.ResourceOptions(parent=self, depends_on=[controllers]))
        # Not an output (a resource, for Python programs): the CRDs alone, what a watcher of Flux's objects
        # (the operator's `start_after`) needs before it starts, long before the controllers are up.
        self.crds = crds
        self.namespace = pulumi.Output.from_input(namespace)
        self.version = pulumi.Output.from_input(args["version"])
        self.host_run = manifests.apply(lambda m: m.host_run)
        self.register_outputs({"namespace": self.namespace, "version": self.version, "host_run": self.host_run})


class FluxSync(pulumi.ComponentResource):
    """Flux syncing a directory of a git repository: a GitRepository and a Kustomization named after
    the Flux namespace, as `flux bootstrap` makes them. Created apart from `Flux` where it must come
    down first (see `build_sync_manifests`): give it `depends_on` what it must outlive."""

    kustomization: pulumi.Output[str]
    """namespace/name of the Kustomization."""

    def __init__(self, name: str, args: FluxSyncComponentArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:FluxSync", name, {}, opts)
        namespace = args.get("namespace", "flux-system")
        rendered = flux.get_flux_sync_output(
            target_path=args.get("path", "./"), url=args["url"], branch=args.get("branch", "main"),
            name=namespace, namespace=namespace, interval=args.get("interval_minutes", 1),
            secret=args.get("secret_name"), opts=pulumi.InvokeOptions(parent=self))
        documents = pulumi.Output.all(rendered.content, args.get("substitute") or {}).apply(
            lambda values: build_sync_manifests(values[0], values[1], args.get("timeout", "5m"),
                                                args.get("secret_name")))
        k8s.yaml.v2.ConfigGroup(name, objs=documents, opts=pulumi.ResourceOptions(parent=self,
                                                                                   provider=args["provider"]))
        self.kustomization = pulumi.Output.from_input(f"{namespace}/{namespace}")
        self.register_outputs({"kustomization": self.kustomization})
