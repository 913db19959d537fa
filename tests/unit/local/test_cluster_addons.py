"""The cluster profile's Service networking and DNS: what kube-proxy and CoreDNS are configured with."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from strata_components.local import cluster_addons, realnode


def test_kube_proxy_masquerades_service_traffic_and_leaves_the_hosts_other_settings_alone(tmp_path):
    config = cluster_addons.build_kube_proxy_config(kubeconfig=tmp_path / "kp.kubeconfig", hostname="real-0",
                                                    health_port=41001, metrics_port=41002)
    assert config["mode"] == "iptables" and config["iptables"]["masqueradeAll"] is True
    # No route_localnet sysctl, no NodePorts on the host's other interfaces, no conntrack sysctls.
    assert config["iptables"]["localhostNodePorts"] is False
    assert config["nodePortAddresses"] == [f"{realnode.NODE_ADDRESS}/32"]
    assert config["conntrack"]["maxPerCore"] == 0 and config["conntrack"]["tcpEstablishedTimeout"] == "0s"
    assert config["healthzBindAddress"] == "127.0.0.1:41001" and config["metricsBindAddress"] == "127.0.0.1:41002"
    assert ipaddress.ip_address(realnode.NODE_ADDRESS) in ipaddress.ip_network(config["clusterCIDR"])
    assert config["clientConnection"]["kubeconfig"] == str(tmp_path / "kp.kubeconfig")


def test_the_kubernetes_service_leads_to_the_gateway_on_the_bridge():
    slice_ = cluster_addons.build_apiserver_endpoints(6443)
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"
    # Not the apiserver's own manager name: nothing else may think it owns this slice.
    assert slice_["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == cluster_addons.ENDPOINTS_MANAGER
    assert slice_["endpoints"][0]["addresses"] == [realnode.NODE_ADDRESS]
    assert slice_["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objects}


def test_coredns_runs_non_root_on_the_real_nodes_behind_the_kube_dns_address():
    objects = _by_kind(cluster_addons.build_coredns_objects("registry.local/coredns:v1.15.0", replicas=2))
    service, deployment = objects["Service"], objects["Deployment"]
    assert service["metadata"]["name"] == "kube-dns" and service["spec"]["clusterIP"] == realnode.CLUSTER_DNS
    assert {(p["port"], p["protocol"]) for p in service["spec"]["ports"]} >= {(53, "UDP"), (53, "TCP")}
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["nodeSelector"] == realnode.NODE_LABEL and pod["tolerations"] == [realnode.TOLERATION]
    # Its upstream lookups use the node's resolv.conf, not itself.
    assert pod["dnsPolicy"] == "Default"
    # Non-root binding :53 without a file capability: a safe, namespaced sysctl of the pod.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert {"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"} in pod["securityContext"]["sysctls"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.local/coredns:v1.15.0"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    rules = objects["ClusterRole"]["rules"]
    assert {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]} in rules
    assert all(set(rule["verbs"]) <= {"list", "watch"} for rule in rules)


def test_the_corefile_serves_the_cluster_domain_and_the_config_map_holds_it():
    objects = _by_kind(cluster_addons.build_coredns_objects("x:1", replicas=1))
    corefile = objects["ConfigMap"]["data"]["Corefile"]
    assert f"kubernetes {realnode.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa" in corefile
    assert "ready" in corefile and "health" in corefile
    assert corefile.count("{") == corefile.count("}")


def test_kubelet_points_pods_at_the_cluster_dns_only_in_the_cluster_profile(tmp_path):
    node = realnode.RealNode(name="real-1", index=1, directory=tmp_path, kubelet_port=1, healthz_port=2)
    assert "clusterDNS" not in realnode.build_kubelet_config(node, Path("/ca.crt"))
    config = realnode.build_kubelet_config(node, Path("/ca.crt"), realnode.CLUSTER_DNS)
    assert config["clusterDNS"] == ["10.96.0.10"] and config["clusterDomain"] == "cluster.local"


def test_every_label_value_is_one_the_apiserver_accepts():
    import re

    valid = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
    objects = [cluster_addons.build_apiserver_endpoints(6443), *cluster_addons.build_coredns_objects("x:1", 2)]
    values = [v for obj in objects for v in obj["metadata"].get("labels", {}).values()]
    assert values and all(len(v) <= 63 and valid.fullmatch(v) for v in values), values
