"""Cluster: the Kubernetes cluster everything else lands on, and a provider for it.

Modes: `local` (the local platform, started and stopped by a Python dynamic provider), `existing`
(a kubeconfig), `gke` (pulumi-gcp) and `eks` (pulumi-aws). pulumi_gcp / pulumi_aws are imported
only in their own code paths: they are optional extras of several hundred MB each.
"""

import json
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

import pulumi
import pulumi.dynamic
import pulumi_kubernetes as k8s
from typing_extensions import NotRequired

from .kubeconfig import build_exec_kubeconfig, kubeconfig_cluster


class ClusterMode(str, Enum):
    """Where the cluster comes from. Plain strings ("local", ...) are accepted wherever a mode is."""

    LOCAL = "local"
    """The local platform: a control plane on loopback with kwok nodes."""
    EXISTING = "existing"
    """A cluster you already have, through its kubeconfig."""
    GKE = "gke"
    """A new GKE cluster (needs the `gke` extra)."""
    EKS = "eks"
    """A new EKS cluster (needs the `eks` extra)."""


MODES: tuple[str, ...] = tuple(mode.value for mode in ClusterMode)


def mode_value(mode: Any) -> Any:
    """A mode as its plain string: the component provider passes enum members, Python callers strings,
    and messages should read `'local'`, not `<ClusterMode.LOCAL: 'local'>`."""
    return mode.value if isinstance(mode, Enum) else mode


class LocalClusterArgs(TypedDict):
    state_dir: str
    """Directory holding the platform's state (PKI, etcd data, logs, kubeconfig); one platform per directory."""
    nodes: NotRequired[int]
    """Number of kwok fake nodes (default 1)."""
    real_nodes: NotRequired[int]
    """Nodes where pods really run: kubelet on containerd (default 0; needs root and Debian's containerd)."""
    host_controllers: NotRequired[Sequence[str]]
    """Flux controllers the platform runs as host processes (default source- and kustomize-controller)."""


class ExistingClusterArgs(TypedDict):
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig content; give this or `kubeconfig_path`."""
    kubeconfig_path: NotRequired[str]
    """Path of a kubeconfig file, read once when the program runs."""
    context: NotRequired[str]
    """Context to use instead of the kubeconfig's current-context."""


class GkeClusterArgs(TypedDict):
    project: str
    """GCP project id."""
    region: str
    """Region of the (regional) cluster, e.g. europe-west1."""
    node_count: NotRequired[int]
    """Nodes per zone in the node pool (default 1)."""
    machine_type: NotRequired[str]
    """Node machine type (default e2-standard-2)."""
    kubernetes_version: NotRequired[str]
    """Minimum control-plane version; GKE's default when absent."""
    subnet_cidr: NotRequired[str]
    """Primary range of the created subnetwork (default 10.10.0.0/20)."""


class EksClusterArgs(TypedDict):
    region: str
    """AWS region, e.g. eu-west-1."""
    subnet_ids: NotRequired[Sequence[pulumi.Input[str]]]
    """Existing subnets (two or more AZs); when absent a VPC with two public subnets is created."""
    vpc_cidr: NotRequired[str]
    """CIDR of the created VPC (default 10.20.0.0/16)."""
    kubernetes_version: NotRequired[str]
    """EKS control-plane version; AWS's default when absent."""
    instance_types: NotRequired[Sequence[str]]
    """Node group instance types (default t3.medium)."""
    node_count: NotRequired[int]
    """Desired node count (default 2; min 1, max twice this)."""


class ClusterArgs(TypedDict):
    mode: ClusterMode
    """Where the cluster comes from: local | existing | gke | eks."""
    local: NotRequired[LocalClusterArgs]
    """Settings of mode `local`."""
    existing: NotRequired[ExistingClusterArgs]
    """Settings of mode `existing`."""
    gke: NotRequired[GkeClusterArgs]
    """Settings of mode `gke`."""
    eks: NotRequired[EksClusterArgs]
    """Settings of mode `eks`."""


DEFAULT_HOST_CONTROLLERS = ("source-controller", "kustomize-controller")


def validate_cluster_args(args: ClusterArgs) -> None:
    """Reject bad input up front, naming the field and the fix."""
    mode = mode_value(args.get("mode"))
    if mode not in MODES:
        raise ValueError(f"cluster mode {mode!r} is not supported; set mode to one of {', '.join(MODES)}")
    if mode not in args:
        raise ValueError(f"cluster mode {mode!r} needs its settings under `{mode}`")
    if mode == "existing":
        existing = args["existing"]
        if ("kubeconfig" in existing) == ("kubeconfig_path" in existing):
            raise ValueError("existing cluster: give exactly one of `kubeconfig` (content) or `kubeconfig_path`")
    if mode == "local" and args["local"].get("nodes", 1) < 1:
        raise ValueError("local cluster: `nodes` must be at least 1")
    if mode == "local" and not 0 <= args["local"].get("real_nodes", 0) <= 8:
        raise ValueError("local cluster: `real_nodes` must be between 0 and 8 (each gets a /24 of 10.88.0.0/16)")


# -- local mode: the platform as a dynamic resource ------------------------------------------------

def plan_change(olds: dict[str, Any], news: dict[str, Any], *, replace_on: Sequence[str],
                update_on: Sequence[str], running: bool) -> pulumi.dynamic.DiffResult:
    """Diff of a resource backed by host processes: a changed `replace_on` key is another instance
    (replace, old one first: they would share ports and files); a changed `update_on` key or a
    process that is no longer running is an update, which the idempotent start converges."""
    replaces = [key for key in replace_on if olds.get(key) != news.get(key)]
    changed = bool(replaces) or any(olds.get(key) != news.get(key) for key in update_on) or not running
    return pulumi.dynamic.DiffResult(changes=changed, replaces=replaces, delete_before_replace=True)


def _platform(props: dict[str, Any]):
    # Imported here: the provider runs in its own process, and mocks-only tests never start a platform.
    from strata_components.local.platform import LocalPlatform, PlatformConfig

    return LocalPlatform(PlatformConfig(state_dir=Path(props["state_dir"]), nodes=int(props["nodes"]),
                                        real_nodes=int(props.get("real_nodes", 0)),
                                        host_controllers=tuple(props["host_controllers"])))


def _quiet(_line: str) -> None:
    """The engine shows provider stderr as noise; failures still raise with a full message."""


class LocalPlatformProvider(pulumi.dynamic.ResourceProvider):
    """Starts the local platform on create/update, stops every process it started on delete."""

    def _outputs(self, props: dict[str, Any]) -> dict[str, Any]:
        info = _platform(props).up(say=_quiet)
        return {**props, "kubeconfig": info.kubeconfig, "server": info.server,
                "kubeconfig_path": str(info.kubeconfig_path), "flux_bundle_url": info.flux_bundle_url,
                "git_url": info.git.base_url}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_=str(Path(props["state_dir"]).resolve()), outs=self._outputs(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        return plan_change(olds, news, replace_on=("state_dir",),
                           update_on=("nodes", "real_nodes", "host_controllers"),
                           running=all(_platform(olds).status().values()))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=self._outputs(news))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _platform(props).down(say=_quiet)


class LocalPlatformResource(pulumi.dynamic.Resource):
    """The local platform as one resource; its admin kubeconfig is a secret output. Its ports are
    picked free on first start, so the URLs of its servers are outputs too."""

    kubeconfig: pulumi.Output[str]
    server: pulumi.Output[str]
    kubeconfig_path: pulumi.Output[str]
    flux_bundle_url: pulumi.Output[str]
    """pulumi-flux's `baseurl` for the offline Flux install bundle the platform serves."""
    git_url: pulumi.Output[str]
    """Base URL of the platform's git server (a repository is `<git_url>/<name>.git`)."""

    def __init__(self, name: str, args: LocalClusterArgs, opts: pulumi.ResourceOptions | None = None):
        props = {
            "state_dir": str(Path(args["state_dir"]).expanduser()),
            "nodes": args.get("nodes", 1),
            "host_controllers": list(args.get("host_controllers", DEFAULT_HOST_CONTROLLERS)),
            "kubeconfig": None, "server": None, "kubeconfig_path": None, "flux_bundle_url": None, "git_url": None,
        }
        if args.get("real_nodes"):  # only when asked: platforms made before real nodes existed see no change
            props["real_nodes"] = args["real_nodes"]
        super().__init__(LocalPlatformProvider(), name, props,
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                             additional_secret_outputs=["kubeconfig"])))


# -- cloud kubeconfigs ------------------------------------------------------------------------------

def build_gke_kubeconfig(name: str, endpoint: str, ca_data: str) -> str:
    """GKE kubeconfig: credentials from gke-gcloud-auth-plugin (gcloud's current login)."""
    return build_exec_kubeconfig(cluster=name, server=f"https://{endpoint}", ca_data=ca_data,
                                 command="gke-gcloud-auth-plugin", args=[])


def build_eks_kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """EKS kubeconfig: credentials from `aws eks get-token` (the AWS CLI's current identity)."""
    return build_exec_kubeconfig(cluster=name, server=endpoint, ca_data=ca_data, command="aws",
                                 args=["eks", "get-token", "--cluster-name", name, "--region", region,
                                       "--output", "json"])


def build_assume_role_policy(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


EKS_CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
EKS_NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
)


class Cluster(pulumi.ComponentResource):
    """A Kubernetes cluster and a pulumi-kubernetes provider bound to it."""

    kubeconfig: pulumi.Output[str]
    """Admin kubeconfig (secret)."""
    provider: k8s.Provider
    """Provider for every Kubernetes resource on this cluster."""
    name: pulumi.Output[str]
    """Cluster name."""
    server: pulumi.Output[str]
    """API server URL."""
    flux_bundle_url: pulumi.Output[str] | None
    """Mode `local`: the `baseurl` of the offline Flux install bundle the platform serves; else None."""
    git_url: pulumi.Output[str] | None
    """Mode `local`: base URL of the platform's git server (a repository is `<git_url>/<name>.git`); else None."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("strata:index:Cluster", name, {}, opts)
        validate_cluster_args(args)
        mode = mode_value(args["mode"])
        child = pulumi.ResourceOptions(parent=self)
        provider_settings: dict[str, Any] = {}
        self.flux_bundle_url = self.git_url = None
        if mode == "local":
            platform = LocalPlatformResource(f"{name}-platform", args["local"], child)
            self.flux_bundle_url, self.git_url = platform.flux_bundle_url, platform.git_url
            kubeconfig, cluster_name = platform.kubeconfig, pulumi.Output.from_input(name)
            # The platform pre-installs flux-system and the Flux CRDs its host controllers need, so
            # the Flux install must adopt them instead of failing with AlreadyExists.
            provider_settings["upsert_existing_objects"] = True
        elif mode == "existing":
            existing = args["existing"]
            content = existing.get("kubeconfig")
            if content is None:
                content = Path(existing["kubeconfig_path"]).expanduser().read_text()
            kubeconfig, cluster_name = pulumi.Output.from_input(content), pulumi.Output.from_input(name)
            if "context" in existing:
                provider_settings["context"] = existing["context"]
        elif mode == "gke":
            kubeconfig, cluster_name = self._gke(name, args["gke"], child)
        else:
            kubeconfig, cluster_name = self._eks(name, args["eks"], child)

        self.kubeconfig = pulumi.Output.secret(kubeconfig)
        self.name = cluster_name
        self.server = pulumi.Output.unsecret(self.kubeconfig.apply(lambda text: kubeconfig_cluster(text)[0]))
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig, opts=child, **provider_settings)
        outputs = {"kubeconfig": self.kubeconfig, "name": self.name, "server": self.server}
        if self.git_url is not None:
            outputs.update(flux_bundle_url=self.flux_bundle_url, git_url=self.git_url)
        self.register_outputs(outputs)

    def _gke(self, name: str, args: GkeClusterArgs, child: pulumi.ResourceOptions):
        import pulumi_gcp as gcp

        project, region = args["project"], args["region"]
        network = gcp.compute.Network(f"{name}-network", project=project, auto_create_subnetworks=False, opts=child)
        subnet = gcp.compute.Subnetwork(
            f"{name}-subnet", project=project, region=region, network=network.id,
            ip_cidr_range=args.get("subnet_cidr", "10.10.0.0/20"),
            secondary_ip_ranges=[{"range_name": "pods", "ip_cidr_range": "10.100.0.0/16"},
                                 {"range_name": "services", "ip_cidr_range": "10.101.0.0/20"}],
            opts=child)
        cluster = gcp.container.Cluster(
            f"{name}-cluster", project=project, location=region, network=network.name,
            subnetwork=subnet.name, min_master_version=args.get("kubernetes_version"),
            # The default pool cannot be configured independently; a separate pool can be replaced.
            remove_default_node_pool=True, initial_node_count=1, deletion_protection=False,
            ip_allocation_policy={"cluster_secondary_range_name": "pods",
                                  "services_secondary_range_name": "services"},
            opts=child)
        gcp.container.NodePool(
            f"{name}-nodes", project=project, location=region, cluster=cluster.name,
            node_count=args.get("node_count", 1),
            node_config={"machine_type": args.get("machine_type", "e2-standard-2"),
                         "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"]},
            opts=child)
        kubeconfig = pulumi.Output.all(cluster.name, cluster.endpoint, cluster.master_auth).apply(
            lambda values: build_gke_kubeconfig(values[0], values[1], values[2]["cluster_ca_certificate"]))
        return kubeconfig, cluster.name

    def _eks(self, name: str, args: EksClusterArgs, child: pulumi.ResourceOptions):
        import pulumi_aws as aws

        region = args["region"]
        subnet_ids = args.get("subnet_ids") or self._eks_network(name, args, child)
        cluster_role, cluster_attachments = self._aws_role(f"{name}-cluster", "eks.amazonaws.com",
                                                           EKS_CLUSTER_POLICIES, child)
        node_role, node_attachments = self._aws_role(f"{name}-node", "ec2.amazonaws.com", EKS_NODE_POLICIES, child)
        cluster = aws.eks.Cluster(
            f"{name}-cluster", region=region, role_arn=cluster_role.arn, version=args.get("kubernetes_version"),
            vpc_config={"subnet_ids": subnet_ids}, access_config={"authentication_mode": "API_AND_CONFIG_MAP"},
            # Without its policy the control plane cannot create its network interfaces.
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=cluster_attachments)))
        desired = args.get("node_count", 2)
        aws.eks.NodeGroup(
            f"{name}-nodes", region=region, cluster_name=cluster.name, node_role_arn=node_role.arn,
            subnet_ids=subnet_ids, instance_types=list(args.get("instance_types", ["t3.medium"])),
            scaling_config={"desired_size": desired, "min_size": 1, "max_size": max(desired * 2, 1)},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=node_attachments)))
        kubeconfig = pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority).apply(
            lambda values: build_eks_kubeconfig(values[0], values[1], values[2]["data"], region))
        return kubeconfig, cluster.name

    @staticmethod
    def _aws_role(prefix: str, service: str, policies: Sequence[str], child: pulumi.ResourceOptions):
        """An IAM role `service` may assume, with `policies` attached; returns it and the attachments to wait for."""
        import pulumi_aws as aws

        role = aws.iam.Role(f"{prefix}-role", assume_role_policy=build_assume_role_policy(service), opts=child)
        attachments = [aws.iam.RolePolicyAttachment(f"{prefix}-policy-{index}", role=role.name, policy_arn=arn,
                                                    opts=child)
                       for index, arn in enumerate(policies)]
        return role, attachments

    def _eks_network(self, name: str, args: EksClusterArgs, child: pulumi.ResourceOptions) -> list[pulumi.Output[str]]:
        import ipaddress

        import pulumi_aws as aws

        region = args["region"]
        vpc_cidr = ipaddress.ip_network(args.get("vpc_cidr", "10.20.0.0/16"))
        subnet_cidrs = list(vpc_cidr.subnets(new_prefix=min(vpc_cidr.prefixlen + 4, 28)))[:2]
        zones = aws.get_availability_zones_output(region=region, state="available",
                                                  opts=pulumi.InvokeOptions(parent=self))
        vpc = aws.ec2.Vpc(f"{name}-vpc", region=region, cidr_block=str(vpc_cidr), enable_dns_hostnames=True,
                          enable_dns_support=True, tags={"Name": f"{name}-vpc"}, opts=child)
        gateway = aws.ec2.InternetGateway(f"{name}-igw", region=region, vpc_id=vpc.id, opts=child)
        routes = aws.ec2.RouteTable(f"{name}-public", region=region, vpc_id=vpc.id,
                                    routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}], opts=child)
        subnet_ids = []
        for index, cidr in enumerate(subnet_cidrs):
            subnet = aws.ec2.Subnet(
                f"{name}-public-{index}", region=region, vpc_id=vpc.id, cidr_block=str(cidr),
                availability_zone=zones.names[index], map_public_ip_on_launch=True,
                tags={"Name": f"{name}-public-{index}", "kubernetes.io/role/elb": "1"}, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{index}", region=region, subnet_id=subnet.id,
                                          route_table_id=routes.id, opts=child)
            subnet_ids.append(subnet.id)
        return subnet_ids
