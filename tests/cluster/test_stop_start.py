"""The platform's added processes stop and start with it: `down` undoes what Service networking changed on
the host (the pods' masquerade too), and after `up` the registry still serves what was pushed before."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kubernetes import client

from strata_components.local import cluster_addons, realnode, registry
from strata_components.local.platform import LocalPlatform

from .conftest import on_node, wait_phase


def _host_view() -> dict:
    return {
        "sysctls": {name: realnode._read_sysctl(name) for name in realnode.RECORDED_SYSCTLS},
        "bridge": Path(f"/sys/class/net/{realnode.BRIDGE}").exists(),
        **{binary: realnode._iptables_chains(binary) for binary in realnode.IPTABLES},
        "netns": realnode.pod_network_namespaces(),
        "processes": subprocess.run(["pgrep", "-f", "kube-proxy|kubelet|/run/strata/"], capture_output=True,
                                    text=True, check=False).stdout.split(),
    }


def test_down_undoes_the_hosts_changes_and_up_brings_back_the_registry_with_its_images(
        platform: LocalPlatform, python_image, kube_client, namespace, nodes):
    record = json.loads(realnode.HOST_RECORD.read_text())
    running = _host_view()
    assert running["sysctls"][realnode.FORWARDING_SYSCTL] == "1"
    assert {"KUBE-SERVICES", cluster_addons.POD_EGRESS_CHAIN} <= set(running["iptables"]["nat"]), running["iptables"]

    platform.down(say=print)
    try:
        assert _host_view() == {"sysctls": record["sysctls"], "bridge": False, "iptables": record["iptables"],
                                "ip6tables": record["ip6tables"], "netns": record["netns"], "processes": []}
        assert not realnode.HOST_RECORD.exists()
        assert not platform.status()[registry.PROCESS]
    finally:
        platform.up(say=print)  # the session's platform, for whatever runs after
    assert all(platform.status().values()), platform.status()
    assert registry.manifest_exists(python_image)
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "after-restart"}, "spec": on_node(
        nodes[0].name, restartPolicy="Never", containers=[{
            "name": "main", "image": python_image, "imagePullPolicy": "Always",
            "command": ["python3", "-c", "print('pulled again')"]}])})
    pod = wait_phase(core, namespace, "after-restart", {"Succeeded", "Failed"})
    assert pod.status.phase == "Succeeded" and "pulled again" in core.read_namespaced_pod_log("after-restart", namespace)
