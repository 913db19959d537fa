"""The operator's metrics with --metrics-auth kubernetes (how the Operator component runs it in a pod): a
request without a bearer token is answered 401, one with the token of a user the cluster does not let get
/metrics 403, and once that user is bound to the ClusterRole strata-metrics-reader the metrics. The real
API server reviews the tokens (TokenReview, SubjectAccessReview) under the operator's own RBAC."""

from __future__ import annotations

import urllib.error
import urllib.request

import yaml
from kubernetes import client

from strata_components.local.kube import server_side_apply
from strata_components.local.operator_host import operator_host
from strata_components.operator import build_reader_roles, load_packaged_manifests


def _get(url: str, token: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _token(platform, namespace: str, service_account: str) -> str:
    return yaml.safe_load(platform.token_kubeconfig(namespace, service_account, 600))["users"][0]["user"]["token"]


def test_metrics_with_kubernetes_auth_answer_401_without_a_token_403_unprivileged_and_200_to_a_reader(
        platform, toolchain, kube_client, namespace, tmp_path):
    core, rbac = client.CoreV1Api(kube_client), client.RbacAuthorizationV1Api(kube_client)
    for name in ("scraper", "nobody"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    # Watching only this test's (empty) namespace, with no Lease: it handles nothing but its metrics.
    operator = operator_host(platform, toolchain, tmp_path, name="strata-operator-metrics-auth", extra_args=(
        "--metrics-auth", "kubernetes", "--namespace", namespace, "--no-leader-election"))
    binding = f"strata-metrics-reader-{namespace}"
    operator.start()
    try:
        status, body = _get(operator.metrics_url)
        assert status == 401 and "stacks_active" not in body, body
        status, body = _get(operator.metrics_url, "not-a-token")
        assert status == 401 and "stacks_active" not in body, body
        nobody = _token(platform, namespace, "nobody")
        status, body = _get(operator.metrics_url, nobody)
        assert status == 403 and f"system:serviceaccount:{namespace}:nobody may not get /metrics" in body, body

        server_side_apply(platform.kubeconfig_path, build_reader_roles(load_packaged_manifests("rbac")))
        rbac.create_cluster_role_binding({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "strata-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}]})
        status, body = _get(operator.metrics_url, _token(platform, namespace, "scraper"))
        assert status == 200 and "stacks_active" in body, body
        assert _get(operator.metrics_url, nobody)[0] == 403
        log = operator.log.read_text(errors="replace")
        assert nobody not in log and "metrics at http://127.0.0.1:" in log
    finally:
        operator.stop()
        try:
            rbac.delete_cluster_role_binding(binding)
        except client.ApiException as err:
            if err.status != 404:
                raise
