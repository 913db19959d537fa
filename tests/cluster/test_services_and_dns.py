"""Nodes like a cluster's: pods on either real node find Services by name (CoreDNS) and reach them across
nodes (kube-proxy), the `kubernetes` Service included."""

from __future__ import annotations

import json

from kubernetes import client

from strata_components.local import cluster_addons, processes, realnode

from .conftest import on_node, wait_phase

# Resolves names through the pod's resolv.conf (the cluster DNS), then calls the Service by its short name
# and the apiserver by its Service name with TLS verified against that name.
CLIENT = """
import json, os, socket, ssl, urllib.request
names = ["kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "web"]
resolved = {name: socket.gethostbyname(name) for name in names}
body = urllib.request.urlopen("http://web:8080/who", timeout=10).read().decode()
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
request = urllib.request.Request("https://kubernetes.default.svc/version",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
version = json.load(urllib.request.urlopen(request, context=context, timeout=10))["gitVersion"]
print("RESULT " + json.dumps({"resolved": resolved, "body": body, "version": version,
                              "resolv": open("/etc/resolv.conf").read()}))
"""
SERVER = "import os, http.server; os.makedirs('/tmp/s', exist_ok=True); open('/tmp/s/who', 'w').write(os.environ['NODE']); os.chdir('/tmp/s'); http.server.test(http.server.SimpleHTTPRequestHandler, port=8080, bind='0.0.0.0')"


def test_coredns_runs_on_every_real_node_behind_kube_dns(kube_client, nodes):
    core = client.CoreV1Api(kube_client)
    pods = core.list_namespaced_pod(cluster_addons.DNS_NAMESPACE, label_selector="k8s-app=kube-dns").items
    assert sorted(pod.spec.node_name for pod in pods) == sorted(node.name for node in nodes)
    assert all(any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions) for pod in pods)
    service = core.read_namespaced_service("kube-dns", cluster_addons.DNS_NAMESPACE)
    assert service.spec.cluster_ip == realnode.CLUSTER_DNS
    slices = client.DiscoveryV1Api(kube_client).list_namespaced_endpoint_slice(
        cluster_addons.DNS_NAMESPACE, label_selector="kubernetes.io/service-name=kube-dns").items
    addresses = {address for s in slices for endpoint in s.endpoints for address in endpoint.addresses}
    assert addresses == {pod.status.pod_ip for pod in pods}


def test_a_pod_on_either_node_resolves_names_and_reaches_a_service_backed_on_the_other(
        kube_client, namespace, nodes, python_image):
    core = client.CoreV1Api(kube_client)
    server_node = nodes[-1].name
    core.create_namespaced_pod(namespace, {"metadata": {"name": "web", "labels": {"app": "web"}},
                                           "spec": on_node(server_node, containers=[{
        "name": "main", "image": python_image,
        "command": ["python3", "-c", SERVER], "env": [{"name": "NODE", "value": server_node}],
        "readinessProbe": {"httpGet": {"path": "/who", "port": 8080}, "periodSeconds": 1}}])})
    service = core.create_namespaced_service(namespace, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": 8080}]}})
    wait_phase(core, namespace, "web", {"Running"})
    processes.wait_until(lambda: all(c.ready for c in core.read_namespaced_pod("web", namespace).status
                                     .container_statuses or []), 60, "web ready")

    for node in nodes:  # the same node as the backend and the other one
        name = f"client-{node.name}"
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": on_node(
            node.name, restartPolicy="Never", containers=[{
                "name": "main", "image": python_image,
                "command": ["python3", "-c", CLIENT]}])})
        pod = wait_phase(core, namespace, name, {"Succeeded", "Failed"})
        log = core.read_namespaced_pod_log(name, namespace)
        assert pod.status.phase == "Succeeded", log
        assert pod.spec.node_name == node.name
        result = json.loads(log.split("RESULT ", 1)[1])
        assert result["resolved"] == {"kubernetes.default.svc": realnode.SERVICE_ADDRESS,
                                      "kubernetes.default.svc.cluster.local": realnode.SERVICE_ADDRESS,
                                      "web": service.spec.cluster_ip}
        assert result["body"] == server_node
        assert result["version"].startswith("v1.34")
        assert f"nameserver {realnode.CLUSTER_DNS}" in result["resolv"]
        assert f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local" in result["resolv"]
