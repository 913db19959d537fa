"""A real node: pods run in containerd, reach the apiserver with their ServiceAccount token through the
`kubernetes` Service, their logs come back through kubelet; kwok workloads stay on kwok; `down`
leaves the host as it found it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from kubernetes import client

from strata_components.local import processes, realnode
from strata_components.local.platform import LocalPlatform

from .conftest import real_node_pod_spec, wait_phase

# Runs in the operator image: who am I, asked of the apiserver with the pod's own credentials only.
WHOAMI = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
request = urllib.request.Request(f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}', method="POST",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"})
review = json.load(urllib.request.urlopen(request, context=context, timeout=10))
print("WHOAMI", host, port, review["status"]["userInfo"]["username"])
"""


def test_a_pod_runs_and_calls_the_apiserver_as_its_service_account(kube_client, namespace, operator_image):
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "whoami"}, "spec": real_node_pod_spec(
        restartPolicy="Never",
        containers=[{"name": "main", "image": operator_image.name, "imagePullPolicy": "Never",
                     "command": ["python", "-c", WHOAMI]}])})
    pod = wait_phase(core, namespace, "whoami", {"Succeeded", "Failed"}, timeout=90)
    log = core.read_namespaced_pod_log("whoami", namespace)  # apiserver -> kubelet, with its client certificate
    assert pod.status.phase == "Succeeded", log
    assert pod.spec.node_name == "real-0"
    assert pod.status.pod_ip.startswith("10.88.1."), pod.status.pod_ip
    assert f"WHOAMI {realnode.SERVICE_ADDRESS} 443 system:serviceaccount:{namespace}:default" in log


def test_workloads_without_the_toleration_stay_on_kwok(kube_client, namespace):
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "plain"}, "spec": {
        "containers": [{"name": "main", "image": "registry.example/app:1"}]}})
    pod = wait_phase(core, namespace, "plain", {"Running"}, timeout=90)
    assert pod.spec.node_name.startswith("strata-node-"), pod.spec.node_name


def _host_view(node: realnode.RealNode) -> dict:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return {
        "sysctls": {name: realnode._read_sysctl(name) for name in realnode.RECORDED_SYSCTLS},
        "bridge": Path(f"/sys/class/net/{realnode.BRIDGE}").exists(),
        "mounts": [m for m in mounts if m.startswith((str(node.directory), str(node.runtime_dir)))],
        "cgroups": [str(h) for h in Path("/sys/fs/cgroup").iterdir() if (h / node.cgroup_root.lstrip("/")).exists()],
        "host_dirs": [d for d in realnode.HOST_DIRS if Path(d).exists()],
        "iptables_chains": realnode._iptables_chains(),
        "netns": realnode.pod_network_namespaces(),
        "processes": subprocess.run(["pgrep", "-f", f"{node.name}|{node.runtime_dir}"], capture_output=True,
                                    text=True, check=False).stdout.split(),
    }


def _sleeping_pod(core: client.CoreV1Api, namespace: str, name: str, image: str) -> None:
    """A pod Running on the real node: its mounts, cgroups and network namespace are on the host."""
    core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": real_node_pod_spec(
        containers=[{"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}])})
    wait_phase(core, namespace, name, {"Running"}, timeout=90)


def test_down_undoes_what_the_node_changed_on_the_host(platform: LocalPlatform, node, kube_client, namespace,
                                                       operator_image):
    record = json.loads(realnode.HOST_RECORD.read_text())
    _sleeping_pod(client.CoreV1Api(kube_client), namespace, "busy", operator_image.name)
    running = _host_view(node)
    assert running["bridge"] and running["mounts"] and running["cgroups"], running

    platform.down(say=print)
    after = _host_view(node)
    try:
        assert after == {"sysctls": record["sysctls"], "bridge": False, "mounts": [], "cgroups": [],
                         "host_dirs": record["dirs"], "iptables_chains": record["iptables"], "netns": record["netns"],
                         "processes": []}
        assert not realnode.HOST_RECORD.exists()
    finally:
        platform.up(say=print)  # the session's platform, for whatever runs after


def test_a_platform_killed_with_its_node_leaves_nothing_the_next_one_does_not_undo(
        platform: LocalPlatform, node, kube_client, namespace, operator_image, tmp_path):
    """As a machine's session end kills every process: the bridge, kubelet's chains, mounts and the pods'
    network namespaces stay behind, and a later platform's pods would share the bridge with stale ones
    holding their addresses. The next platform to start real nodes undoes them first."""
    record = json.loads(realnode.HOST_RECORD.read_text())
    _sleeping_pod(client.CoreV1Api(kube_client), namespace, "killed", operator_image.name)
    for name in (f"kubelet-{node.name}", f"containerd-{node.name}", realnode.GATEWAY_PROCESS):
        os.kill(processes.running_pid(platform.run_dir, name), signal.SIGKILL)
    realnode.kill_containers(node)
    left = _host_view(node)
    assert left["bridge"] and left["mounts"] and set(left["netns"]) - set(record["netns"]), left

    try:
        realnode.claim_host(tmp_path, tmp_path / "run", print)
        assert _host_view(node) == {
            "sysctls": record["sysctls"], "bridge": False, "mounts": [], "cgroups": [], "host_dirs": record["dirs"],
            "iptables_chains": record["iptables"], "netns": record["netns"], "processes": []}
        assert json.loads(realnode.HOST_RECORD.read_text())["owner"] == str(tmp_path)
        realnode.stop_nodes(tmp_path, tmp_path / "run", print)
        assert not realnode.HOST_RECORD.exists()
    finally:
        platform.up(say=print)  # the session's platform, for whatever runs after
