"""Cluster: local (dynamic provider), existing, GKE and EKS graphs; the kubeconfig is always secret."""

from __future__ import annotations

import pytest
import yaml

from strata_components.cluster import (Cluster, EKS_CLUSTER_POLICIES, EKS_NODE_POLICIES,
                                       build_eks_kubeconfig, build_gke_kubeconfig, plan_change, validate_cluster_args)

from strata_mocks import FAKE_CA, admin_kubeconfig


def test_local_cluster_runs_the_platform_as_a_dynamic_resource_and_hides_its_kubeconfig(harness):
    def program():
        cluster = Cluster("dev", {"mode": "local", "local": {"state_dir": "/tmp/strata-state", "nodes": 2}})
        return {"kubeconfig": cluster.kubeconfig, "server": cluster.server, "name": cluster.name}

    out = harness.run(program)
    assert out["kubeconfig"].secret and yaml.safe_load(out["kubeconfig"].value)["kind"] == "Config"
    assert out["server"].value == "https://127.0.0.1:6443" and not out["server"].secret
    assert out["name"].value == "dev"

    component = harness.one("strata:index:Cluster", "dev")
    platform = harness.one("pulumi-python:dynamic:Resource", "dev-platform")
    provider = harness.one("pulumi:providers:kubernetes", "dev-k8s")
    assert platform.parent == component.urn and provider.parent == component.urn
    assert platform.inputs["state_dir"] == "/tmp/strata-state"
    assert platform.inputs["nodes"] == 2
    assert platform.inputs["host_controllers"] == ["source-controller", "kustomize-controller"]
    assert "kubeconfig" in platform.additional_secret_outputs
    # The provider is built from the platform's kubeconfig, so it waits for the platform.
    assert platform.urn in provider.dependencies
    # Adopts the namespace and Flux CRDs the platform installs for its host controllers.
    assert provider.inputs["upsertExistingObjects"] == "true"


def test_existing_cluster_reads_a_kubeconfig_path_and_marks_it_secret(harness, tmp_path):
    path = tmp_path / "config"
    path.write_text(admin_kubeconfig("https://10.0.0.1:443"))

    def program():
        cluster = Cluster("prod", {"mode": "existing", "existing": {"kubeconfig_path": str(path), "context": "admin"}})
        return {"kubeconfig": cluster.kubeconfig, "server": cluster.server}

    out = harness.run(program)
    assert out["kubeconfig"].secret and out["kubeconfig"].value == path.read_text()
    assert out["server"].value == "https://10.0.0.1:443"
    provider = harness.one("pulumi:providers:kubernetes", "prod-k8s")
    assert provider.inputs["context"] == "admin"
    assert provider.parent == harness.one("strata:index:Cluster").urn
    assert not harness.all("pulumi-python:dynamic:Resource")


def test_gke_cluster_graph(harness):
    def program():
        cluster = Cluster("gke", {"mode": "gke", "gke": {"project": "acme", "region": "europe-west1", "node_count": 2}})
        return {"kubeconfig": cluster.kubeconfig, "name": cluster.name, "server": cluster.server}

    out = harness.run(program)
    component = harness.one("strata:index:Cluster")
    network = harness.one("gcp:compute/network:Network")
    subnet = harness.one("gcp:compute/subnetwork:Subnetwork")
    cluster = harness.one("gcp:container/cluster:Cluster")
    pool = harness.one("gcp:container/nodePool:NodePool")
    for child in (network, subnet, cluster, pool):
        assert child.parent == component.urn
        assert child.inputs["project"] == "acme"
    assert network.inputs["autoCreateSubnetworks"] is False
    assert network.urn in subnet.dependencies and subnet.urn in cluster.dependencies
    assert cluster.inputs["removeDefaultNodePool"] is True and cluster.inputs["location"] == "europe-west1"
    assert cluster.urn in pool.dependencies and pool.inputs["nodeCount"] == 2
    kubeconfig = yaml.safe_load(out["kubeconfig"].value)
    assert out["kubeconfig"].secret
    assert kubeconfig["clusters"][0]["cluster"] == {"server": "https://34.1.2.3", "certificate-authority-data": FAKE_CA}
    assert kubeconfig["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert out["server"].value == "https://34.1.2.3"


def test_eks_cluster_creates_network_roles_cluster_and_nodes(harness):
    def program():
        cluster = Cluster("eks", {"mode": "eks", "eks": {"region": "eu-west-1", "node_count": 3}})
        return {"kubeconfig": cluster.kubeconfig}

    out = harness.run(program)
    component = harness.one("strata:index:Cluster")
    subnets = sorted(harness.all("aws:ec2/subnet:Subnet"), key=lambda s: s.name)  # registered concurrently
    assert [s.inputs["availabilityZone"] for s in subnets] == ["eu-west-1a", "eu-west-1b"]
    assert len({s.inputs["cidrBlock"] for s in subnets}) == 2
    roles = {r.name: r for r in harness.all("aws:iam/role:Role")}
    assert '"eks.amazonaws.com"' in roles["eks-cluster-role"].inputs["assumeRolePolicy"]
    assert '"ec2.amazonaws.com"' in roles["eks-node-role"].inputs["assumeRolePolicy"]
    attachments = harness.all("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert sorted(a.inputs["policyArn"] for a in attachments) == sorted(EKS_CLUSTER_POLICIES + EKS_NODE_POLICIES)
    cluster = harness.one("aws:eks/cluster:Cluster")
    group = harness.one("aws:eks/nodeGroup:NodeGroup")
    cluster_attachment_urns = {a.urn for a in attachments if a.name.startswith("eks-cluster-policy")}
    node_attachment_urns = {a.urn for a in attachments if a.name.startswith("eks-node-policy")}
    assert cluster_attachment_urns <= set(cluster.dependencies)
    assert node_attachment_urns <= set(group.dependencies) and cluster.urn in group.dependencies
    assert group.inputs["scalingConfig"] == {"desiredSize": 3, "minSize": 1, "maxSize": 6}
    assert {s.urn for s in subnets} <= set(cluster.dependencies)
    for registration in harness.registrations:
        if registration is not component and not registration.type.startswith("pulumi:"):
            assert registration.parent == component.urn, registration.name
    kubeconfig = yaml.safe_load(out["kubeconfig"].value)
    assert out["kubeconfig"].secret
    exec_ = kubeconfig["users"][0]["user"]["exec"]
    assert exec_["command"] == "aws" and exec_["args"][:2] == ["eks", "get-token"]
    assert exec_["args"][exec_["args"].index("--region") + 1] == "eu-west-1"


def test_eks_with_given_subnets_creates_no_network(harness):
    harness.run(lambda: {"k": Cluster("eks", {"mode": "eks", "eks": {"region": "eu-west-1",
                                                                     "subnet_ids": ["subnet-1", "subnet-2"]}}).kubeconfig})
    assert not harness.all("aws:ec2/vpc:Vpc") and not harness.all("aws:ec2/subnet:Subnet")
    assert harness.one("aws:eks/cluster:Cluster").inputs["vpcConfig"]["subnetIds"] == ["subnet-1", "subnet-2"]


@pytest.mark.parametrize("args, field", [
    ({"mode": "kind"}, "mode"),
    ({"mode": "gke"}, "`gke`"),
    ({"mode": "existing", "existing": {}}, "kubeconfig_path"),
    ({"mode": "existing", "existing": {"kubeconfig": "x", "kubeconfig_path": "y"}}, "exactly one"),
    ({"mode": "local", "local": {"state_dir": "/x", "nodes": 0}}, "nodes"),
])
def test_bad_cluster_args_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        validate_cluster_args(args)


def test_cloud_kubeconfigs_use_exec_credentials_not_static_secrets():
    gke = yaml.safe_load(build_gke_kubeconfig("c", "1.2.3.4", FAKE_CA))
    eks = yaml.safe_load(build_eks_kubeconfig("c", "https://x", FAKE_CA, "us-east-1"))
    for config in (gke, eks):
        user = config["users"][0]["user"]
        assert set(user) == {"exec"}
        assert user["exec"]["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert eks["users"][0]["user"]["exec"]["args"] == ["eks", "get-token", "--cluster-name", "c", "--region",
                                                       "us-east-1", "--output", "json"]


def test_plan_change_for_host_process_resources():
    olds = {"state_dir": "/a", "nodes": 1, "host_controllers": ["source-controller"]}
    same = plan_change(olds, dict(olds), replace_on=("state_dir",), update_on=("nodes",), running=True)
    assert not same.changes and not same.replaces
    stopped = plan_change(olds, dict(olds), replace_on=("state_dir",), update_on=("nodes",), running=False)
    assert stopped.changes and not stopped.replaces
    grown = plan_change(olds, {**olds, "nodes": 3}, replace_on=("state_dir",), update_on=("nodes",), running=True)
    assert grown.changes and not grown.replaces
    moved = plan_change(olds, {**olds, "state_dir": "/b"}, replace_on=("state_dir",), update_on=("nodes",),
                        running=True)
    assert moved.changes and moved.replaces == ["state_dir"] and moved.delete_before_replace
