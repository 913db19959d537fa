"""Nodes like a cluster's: pods on either real node find Services by name (CoreDNS) and reach them across
nodes (kube-proxy), the `kubernetes` Service included, and names outside the cluster (CoreDNS forwards to
the host's resolver, the pods' egress masqueraded)."""

from __future__ import annotations

import json
import socket

import pytest
from kubernetes import client

from strata_components.local import cluster_addons, processes, realnode

from .conftest import on_node, wait_phase

# Resolves names through the pod's resolv.conf (the cluster DNS), then calls the Service by its short name
# and the apiserver by its Service name with TLS verified against that name. A refused call, or a lookup
# that fails for now (EAI_AGAIN: no answer yet), is tried again for up to 20 s, as any client would:
# kube-proxy rejects a Service's traffic until it has written the rules for its new endpoint, a moment
# after the EndpointSlice says so. A lookup still failing says which name, and the pod's resolv.conf.
CLIENT = """
import json, os, socket, ssl, time, urllib.error, urllib.request
names = ["kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "web"]
def lookup(name, deadline=time.monotonic() + 20):
    while True:
        try:
            return socket.gethostbyname(name)
        except socket.gaierror as error:
            if error.errno != socket.EAI_AGAIN or time.monotonic() > deadline:
                raise SystemExit(f"{name}: {error}; resolv.conf: {open('/etc/resolv.conf').read()!r}")
            time.sleep(0.5)
resolved = {name: lookup(name) for name in names}
deadline = time.monotonic() + 20
while True:
    try:
        body = urllib.request.urlopen("http://web:8080/who", timeout=10).read().decode()
        break
    except urllib.error.URLError as error:
        if not isinstance(error.reason, ConnectionRefusedError) or time.monotonic() > deadline:
            raise
        time.sleep(0.5)
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
    core, discovery = client.CoreV1Api(kube_client), client.DiscoveryV1Api(kube_client)
    service = core.read_namespaced_service("kube-dns", cluster_addons.DNS_NAMESPACE)
    assert service.spec.cluster_ip == realnode.CLUSTER_DNS

    def serving() -> tuple[list, list, set]:
        """The CoreDNS pods, which of them are Ready, and the addresses kube-dns's EndpointSlices hold."""
        pods = core.list_namespaced_pod(cluster_addons.DNS_NAMESPACE, label_selector="k8s-app=kube-dns").items
        ready = [pod for pod in pods if any(c.type == "Ready" and c.status == "True"
                                            for c in pod.status.conditions or [])]
        slices = discovery.list_namespaced_endpoint_slice(
            cluster_addons.DNS_NAMESPACE, label_selector="kubernetes.io/service-name=kube-dns").items
        return pods, ready, {address for s in slices for endpoint in s.endpoints or [] for address in endpoint.addresses}

    def every_node_served() -> bool:
        pods, ready, addresses = serving()
        return sorted(pod.spec.node_name for pod in pods) == sorted(node.name for node in nodes) \
            and len(ready) == len(pods) and addresses == {pod.status.pod_ip for pod in pods}

    # The tier's earlier faults (a node's kubelet stopped, the machine loaded by fleets) may leave a replica
    # not Ready for a moment, as on any cluster: what must hold is that every node's is back, behind kube-dns.
    try:
        processes.wait_until(every_node_served, 90, "a Ready CoreDNS pod on every real node behind kube-dns",
                             interval=1)
    except processes.ProcessError as error:
        pods, _, addresses = serving()
        raise AssertionError(f"{error}: kube-dns's addresses {sorted(addresses)}; pods: " + "; ".join(
            f"{pod.metadata.name} on {pod.spec.node_name} ({pod.status.pod_ip}): {pod.status.conditions} "
            f"{pod.status.container_statuses} log: "
            f"{core.read_namespaced_pod_log(pod.metadata.name, cluster_addons.DNS_NAMESPACE, tail_lines=20)}"
            for pod in pods)) from None


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
    web_ip = core.read_namespaced_pod("web", namespace).status.pod_ip
    discovery = client.DiscoveryV1Api(kube_client)
    processes.wait_until(lambda: any(
        web_ip in endpoint.addresses and endpoint.conditions.ready
        for s in discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web").items
        for endpoint in s.endpoints or []), 60, "web's EndpointSlice ready")

    for node in nodes:  # the same node as the backend and the other one
        name = f"client-{node.name}"
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": on_node(
            node.name, restartPolicy="Never", containers=[{
                "name": "main", "image": python_image,
                "command": ["python3", "-c", CLIENT]}])})
        pod = wait_phase(core, namespace, name, {"Succeeded", "Failed"})
        log = core.read_namespaced_pod_log(name, namespace)
        assert pod.status.phase == "Succeeded", f"{name} (on {node.name}): {log}"
        assert pod.spec.node_name == node.name
        result = json.loads(log.split("RESULT ", 1)[1])
        assert result["resolved"] == {"kubernetes.default.svc": realnode.SERVICE_ADDRESS,
                                      "kubernetes.default.svc.cluster.local": realnode.SERVICE_ADDRESS,
                                      "web": service.spec.cluster_ip}
        assert result["body"] == server_node
        assert result["version"].startswith("v1.34")
        assert f"nameserver {realnode.CLUSTER_DNS}" in result["resolv"]
        assert f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local" in result["resolv"]


# Where `make setup`'s host packages come from: a name outside the cluster that the host resolves.
OUTSIDE_NAME = "deb.debian.org"


def test_a_pod_on_either_node_resolves_a_name_outside_the_cluster_through_the_hosts_resolver(
        kube_client, namespace, nodes, python_image):
    try:
        socket.getaddrinfo(OUTSIDE_NAME, None, socket.AF_INET)
    except OSError as error:
        pytest.skip(f"NOT RUN: this host itself does not resolve {OUTSIDE_NAME} ({error})")
    core = client.CoreV1Api(kube_client)
    for node in nodes:
        name = f"outside-{node.name}"
        script = (f"import json, socket; print('RESULT ' + json.dumps(sorted({{a[4][0] for a in "
                  f"socket.getaddrinfo({OUTSIDE_NAME!r}, None, socket.AF_INET)}})))")
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": on_node(
            node.name, restartPolicy="Never", containers=[{"name": "main", "image": python_image,
                                                           "command": ["python3", "-c", script]}])})
        pod = wait_phase(core, namespace, name, {"Succeeded", "Failed"})
        log = core.read_namespaced_pod_log(name, namespace)
        assert pod.status.phase == "Succeeded", log  # socket.gaierror: the name did not resolve
        assert json.loads(log.split("RESULT ", 1)[1]), log
