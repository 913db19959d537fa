"""The cluster profile's add-ons: Service networking (kube-proxy) and DNS (CoreDNS), as every cluster has.

`strata local up --profile cluster` starts real nodes (at least two) with what a team's GKE, EKS or own
cluster gives its pods: ClusterIP Services routed by kube-proxy, and names resolved by CoreDNS at
10.96.0.10. Every real node shares the host's network namespace (one bridge), so one kube-proxy
(iptables mode) serves them all: a cluster has one per node because each node is its own network.
- kube-proxy runs as a host process with a client certificate of the platform's CA
  (`system:kube-proxy`, which the `system:node-proxier` binding lets read Services and EndpointSlices).
  `masqueradeAll`: Service traffic is SNATed to the bridge address, so a reply from a pod on the same
  bridge goes back through the host's conntrack (no br_netfilter needed). It changes
  net.ipv4.ip_forward (recorded and restored like kubelet's sysctls) and adds iptables and ip6tables
  chains (removed by `down`).
- the `kubernetes` Service has no endpoints here (the apiserver listens on loopback with
  `--endpoint-reconciler-type=none`): an EndpointSlice sends it to the node gateway on the bridge,
  which forwards to the apiserver (TLS end to end; the certificate names 10.96.0.1).
- CoreDNS runs as pods (a Deployment, one replica per real node) from an image holding the
  toolchain's static binary, as upstream ships it: non-root (65532), binding :53 thanks to the pod's
  `net.ipv4.ip_unprivileged_port_start` sysctl instead of a file capability.
"""

from __future__ import annotations

from pathlib import Path

from .realnode import CLUSTER_DNS, CLUSTER_DOMAIN, NODE_ADDRESS, NODE_LABEL, POD_PREFIX_LENGTH, TOLERATION

KUBE_PROXY_PROCESS = "kube-proxy"
DNS_NAMESPACE = "kube-system"
DNS_NAME = "coredns"
DNS_USER = 65532
ENDPOINTS_MANAGER = "strata-local-platform"  # a label value: no slash


def build_kube_proxy_config(*, kubeconfig: Path, hostname: str, health_port: int, metrics_port: int) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": hostname, "bindAddress": NODE_ADDRESS,
        "clusterCIDR": f"10.88.0.0/{POD_PREFIX_LENGTH}", "mode": "iptables",
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s",
                     "minSyncPeriod": "0s"},
        # NodePorts on the bridge address only, never on the host's other interfaces.
        "nodePortAddresses": [f"{NODE_ADDRESS}/32"],
        # 0: leave the host's conntrack sysctls alone (kube-proxy would raise nf_conntrack_max and timeouts).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "healthzBindAddress": f"127.0.0.1:{health_port}", "metricsBindAddress": f"127.0.0.1:{metrics_port}",
    }


def build_apiserver_endpoints(gateway_port: int) -> dict:
    """Where the `kubernetes` Service leads: the node gateway's bridge address, forwarding to the apiserver."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes",
                                "endpointslice.kubernetes.io/managed-by": ENDPOINTS_MANAGER}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_ADDRESS], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": gateway_port, "protocol": "TCP"}],
    }


COREFILE = f"""\
.:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}}
"""


def build_coredns_objects(image: str, replicas: int, pull_policy: str = "IfNotPresent") -> list[dict]:
    """CoreDNS as the DNS add-on, as kubeadm installs it: RBAC, Corefile, Deployment, the `kube-dns` Service."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": DNS_NAME, "namespace": DNS_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"system:{DNS_NAME}"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"system:{DNS_NAME}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"system:{DNS_NAME}"},
         "subjects": [{"kind": "ServiceAccount", **meta}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": labels},
         "spec": {
             "replicas": replicas, "selector": {"matchLabels": labels},
             "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "serviceAccountName": DNS_NAME, "priorityClassName": "system-cluster-critical",
                 "dnsPolicy": "Default", "nodeSelector": dict(NODE_LABEL), "tolerations": [dict(TOLERATION)],
                 # One per node, as upstream spreads them.
                 "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                "whenUnsatisfiable": "DoNotSchedule",
                                                "labelSelector": {"matchLabels": labels}}],
                 "securityContext": {"runAsNonRoot": True, "runAsUser": DNS_USER, "runAsGroup": DNS_USER,
                                     "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}]},
                 "volumes": [{"name": "config", "configMap": {"name": DNS_NAME}}],
                 "containers": [{
                     "name": "coredns", "image": image, "imagePullPolicy": pull_policy,
                     "args": ["-conf", "/etc/coredns/Corefile"],
                     "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                               {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                               {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
                     "resources": {"requests": {"cpu": "50m", "memory": "40Mi"}, "limits": {"memory": "170Mi"}},
                     "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}},
                     "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 10,
                                       "periodSeconds": 10, "failureThreshold": 5},
                     "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
                 }],
             }},
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": DNS_NAMESPACE, "labels": labels},
         "spec": {"selector": labels, "clusterIP": CLUSTER_DNS,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                            {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}]}},
    ]
