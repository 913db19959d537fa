"""The pushed operator image runs the layers in the cluster: it carries the Python language host and the
provider plugins the layers use (from the user's Pulumi install), since nothing in a cluster can download
them. A pod from it lists them; a Python program with the kubernetes provider runs in a workspace pod."""

from __future__ import annotations

import json

from kubernetes import client

from strata_components.local.preflight import PLUGINS

from .conftest import object_store_env_refs, on_node, wait_phase, wait_stack_ready

# As a workspace pod runs: user 65532, a read-only root, nothing writable but /tmp.
LIST_INSTALL = """set -e
for host in pulumi-language-python pulumi-language-python-exec; do command -v "$host"; done
ls "$PULUMI_HOME/plugins"
echo PLUGINS
pulumi plugin ls --json
"""

PROGRAM = '''import os
import pulumi
import pulumi_kubernetes as kubernetes

greeting = kubernetes.core.v1.ConfigMap("greeting", metadata={"namespace": os.environ["POD_NAMESPACE"]},
                                        data={"from": "a python program in a workspace pod"})
pulumi.export("configmap", greeting.metadata.name)
'''


def test_a_pod_of_the_pushed_image_lists_the_python_host_and_the_layers_plugins(kube_client, namespace, nodes,
                                                                              python_image):
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "install"}, "spec": on_node(
        nodes[0].name, restartPolicy="Never",
        securityContext={"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
        containers=[{"name": "main", "image": python_image, "command": ["sh", "-c", LIST_INSTALL],
                     "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                     "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
        volumes=[{"name": "tmp", "emptyDir": {}}])})
    pod = wait_phase(core, namespace, "install", {"Succeeded", "Failed"})
    log = core.read_namespaced_pod_log("install", namespace)
    assert pod.status.phase == "Succeeded", log
    found, listing = log.split("PLUGINS\n", 1)
    hosts = ["/usr/local/bin/pulumi-language-python", "/usr/local/bin/pulumi-language-python-exec"]
    assert found.split() == [*hosts, *(f"resource-{name}-v{version}" for name, version in sorted(PLUGINS.items()))]
    plugins = {(p["name"], p["kind"], p["version"]) for p in json.loads(listing)}
    assert {(name, "resource", version) for name, version in PLUGINS.items()} <= plugins, listing


def test_a_python_program_with_the_kubernetes_provider_runs_in_a_workspace_pod(platform, kube_client, pod_operator):
    """Its state in the object store; its identity a ServiceAccount that may write ConfigMaps in its namespace."""
    namespace = pod_operator
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    env_refs = object_store_env_refs(core, platform, namespace)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    rbac = client.RbacAuthorizationV1Api(kube_client)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "configmaps"}, "rules": [{
        "apiGroups": [""], "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "deployer"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                      "name": "configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]})
    # No requirements: the image's own environment (/opt/strata, first python3 on PATH) has the SDKs.
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "program"}, "data": {
        "Pulumi.yaml": "name: python-in-a-pod\nruntime: python\n", "__main__.py": PROGRAM}})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"},
        "spec": {"stack": f"python-{namespace}", "backend": platform.s3_backend_url(), "envRefs": env_refs,
                 "serviceAccountName": "deployer",
                 "workspaceTemplate": {"spec": {"local": {"dir": "/program"}, "podTemplate": {"spec": {
                     "containers": [{"name": "pulumi", "volumeMounts": [{"name": "program",
                                                                         "mountPath": "/program"}]}],
                     "volumes": [{"name": "program", "configMap": {"name": "program"}}]}}}}}})

    stack = wait_stack_ready(custom, namespace, "app", 420, "the Python Stack Ready")
    made = stack["status"]["outputs"]["configmap"]
    assert core.read_namespaced_config_map(made, namespace).data == {"from": "a python program in a workspace pod"}
    assert core.read_namespaced_pod("app-workspace", namespace).spec.node_name.startswith("real-")
