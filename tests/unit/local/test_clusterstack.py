"""The cluster stack's pure parts: this machine's values filled into the committed config, and each check of
bad input naming the field and the fix."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import yaml

from strata_components.local.clusterstack import (Machine, backend_endpoint, bucket_problem, context_problem,
                                                  fill_cluster_config, flux_images, image_problem, registry_problem,
                                                  service_kubeconfig)

ROOT = Path(__file__).resolve().parents[3]
MACHINE = Machine(kubeconfig="/home/k/cluster.kubeconfig", context="strata-cluster", registry="10.88.0.1:41000",
                  flux_bundle_url="http://127.0.0.1:42000", backend="s3://pulumi-state?endpoint=http://10.88.0.1:43000",
                  repo="http://10.88.0.1:44000/strata.git", operator_image="10.88.0.1:41000/strata-operator:abc")
BACKEND = "s3://pulumi-state?endpoint=http://10.88.0.1:43000&use_path_style=true&region=us-east-1"


def committed() -> dict:
    return yaml.safe_load((ROOT / "Pulumi.cluster.yaml").read_text())["config"]


def test_the_committed_template_is_the_production_shape():
    """Existing cluster by kubeconfig and context; Flux from a registry; the operator a Deployment of 2 with the
    pod executor; the platform's state in an object store with its credentials' Secret."""
    config = committed()
    assert config["strata:cluster"]["mode"] == "existing"
    assert {"kubeconfigPath", "context"} <= set(config["strata:cluster"]["existing"])
    assert "registry" in config["strata:flux"]
    operator = config["strata:operator"]
    assert (operator["mode"], operator["replicas"], operator["executor"]) == ("in-cluster", 2, "pod")
    assert config["strata:platform"]["backend"].startswith("s3://")
    assert config["strata:platform"]["backendSecret"]


def test_this_machines_values_replace_the_placeholders_and_nothing_else():
    config = committed()
    filled = fill_cluster_config(config, MACHINE)
    assert filled["strata:cluster"]["existing"] == {"kubeconfigPath": MACHINE.kubeconfig, "context": "strata-cluster"}
    assert filled["strata:flux"]["registry"] == "10.88.0.1:41000/fluxcd"
    assert filled["strata:flux"]["baseurl"] == MACHINE.flux_bundle_url
    assert filled["strata:operator"]["image"] == MACHINE.operator_image
    assert (filled["strata:platform"]["backend"], filled["strata:platform"]["repo"]) == (MACHINE.backend, MACHINE.repo)
    # Everything else as committed, and the committed data itself untouched.
    assert filled["strata:operator"]["replicas"] == 2 and filled["strata:flux"]["sync"] == config["strata:flux"]["sync"]
    assert config == committed()


def test_the_stand_ins_kubeconfig_names_one_context_and_the_service_address():
    admin = yaml.safe_dump({"apiVersion": "v1", "kind": "Config",
                            "clusters": [{"name": "strata", "cluster": {"server": "https://127.0.0.1:6443",
                                                                        "certificate-authority-data": "Q0E="}}],
                            "users": [{"name": "admin", "user": {"client-certificate-data": "Yw==",
                                                                 "client-key-data": "aw=="}}],
                            "contexts": [{"name": "strata", "context": {"cluster": "strata", "user": "admin"}}],
                            "current-context": "strata"})
    written = yaml.safe_load(service_kubeconfig(admin, "strata-cluster", "https://10.96.0.1:443"))
    assert written["current-context"] == "strata-cluster"
    assert written["clusters"][0]["cluster"] == {"server": "https://10.96.0.1:443", "certificate-authority-data": "Q0E="}
    assert written["users"][0]["user"]["client-key-data"] == "aw=="
    assert context_problem("f", "/k", service_kubeconfig(admin), "strata-cluster") is None


def test_a_kubeconfig_context_that_does_not_exist_is_named_with_the_ones_that_do():
    kubeconfig = yaml.safe_dump({"contexts": [{"name": "gke_prod"}, {"name": "kind-dev"}]})
    problem = context_problem("strata:cluster.existing.context", "/home/k/.kube/config", kubeconfig, "my-cluster")
    assert problem.startswith("strata:cluster.existing.context: context 'my-cluster' is not in /home/k/.kube/config")
    assert "gke_prod, kind-dev" in problem and "fix:" in problem
    assert context_problem("strata:cluster.existing.context", "/k", kubeconfig, "kind-dev") is None
    assert context_problem("strata:cluster.existing.context", "/k", kubeconfig, None) is None
    missing = context_problem("strata:cluster.existing.kubeconfigPath", "/nowhere", None, "kind-dev")
    assert missing.startswith("strata:cluster.existing.kubeconfigPath: the kubeconfig /nowhere does not exist")


def test_a_registry_that_cannot_be_reached_is_named_with_the_field():
    assert registry_problem("strata:flux.registry", "10.88.0.1:5000", 200) is None
    assert registry_problem("strata:flux.registry", "10.88.0.1:5000", 401) is None  # answers: asks for credentials
    refused = registry_problem("strata:flux.registry", "10.88.0.1:5000", "[Errno 111] Connection refused")
    assert refused == ("strata:flux.registry: the registry 10.88.0.1:5000 cannot be reached ([Errno 111] Connection "
                       "refused); fix: start it, or name a registry this machine and the cluster's nodes reach")
    assert "answered HTTP 404 to /v2/" in registry_problem("strata:operator.image", "example.com", 404)


def test_an_image_missing_from_the_registry_is_named_with_the_field_and_how_to_push_it():
    assert image_problem("strata:operator.image", "r:1/strata-operator:x", True) is None
    problem = image_problem("strata:operator.image", "r:1/strata-operator:x", False)
    assert problem.startswith("strata:operator.image: the image r:1/strata-operator:x is not in its registry; fix: push")
    assert "strata image build --push" in problem


def test_a_bucket_or_credential_that_is_wrong_is_named_and_the_secret_never_shown():
    assert bucket_problem("strata:platform.backend", BACKEND, 200, "$AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY") is None
    missing = bucket_problem("strata:platform.backend", BACKEND, 404, "the file")
    assert missing.startswith("strata:platform.backend: bucket 'pulumi-state' does not exist in http://10.88.0.1:43000")
    assert "strata local bucket pulumi-state" in missing
    refused = bucket_problem("strata:platform.backend", BACKEND, 403, "$AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY")
    assert refused.startswith("strata:platform.backend: the object store http://10.88.0.1:43000 refused the "
                              "credentials from $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY")
    down = bucket_problem("strata:platform.backend", BACKEND, "connection refused", "x")
    assert "cannot be reached (connection refused)" in down
    assert backend_endpoint("s3://b?region=us-east-1") == "https://s3.amazonaws.com"


def test_the_flux_images_checked_are_the_install_bundles_own_from_the_registry(tmp_path):
    deployment = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"name": "manager", "image": "fluxcd/source-controller:v1.9.6"}]}}}}
    helm = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"name": "manager", "image": "fluxcd/helm-controller:v1.6.4"}]}}}}
    archive = tmp_path / "download" / "v2.9.5" / "manifests.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, documents in (("source-controller.yaml", [{"kind": "CustomResourceDefinition"}, deployment]),
                                ("helm-controller.yaml", [helm])):
            data = yaml.safe_dump_all(documents).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert flux_images(tmp_path, "v2.9.5", ["source-controller"], "10.88.0.1:41000/fluxcd") == [
        "10.88.0.1:41000/fluxcd/source-controller:v1.9.6"]


def test_pending_stacks_say_why_the_in_cluster_operator_handles_none():
    from strata_components.local.clusterstack import in_cluster_operator_blocker

    def pod(name, ready, waiting=None):
        status = {"phase": "Running" if ready else "Pending",
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        if waiting:
            status["containerStatuses"] = [{"state": {"waiting": waiting}}]
        return {"metadata": {"name": name}, "status": status}

    lease = "strata-system/strata-operator-leader"
    assert in_cluster_operator_blocker([], "", lease) == "no operator pod exists yet"
    pulling = pod("op-a", False, {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"r/op:x\""})
    assert in_cluster_operator_blocker([pulling], "", lease) == (
        'no operator pod is Ready: op-a Pending (ImagePullBackOff: Back-off pulling image "r/op:x")')
    assert in_cluster_operator_blocker([pod("op-a", True), pod("op-b", True)], "op-b_1", lease) == ""
    assert in_cluster_operator_blocker([pod("op-a", True)], "gone-pod_1", lease) == (
        "the operator's pods (op-a) have not taken the Lease strata-system/strata-operator-leader yet")
