"""Flux's source- and kustomize-controller as host processes against the loopback git server."""

import hashlib
import urllib.request

from kubernetes import client

from strata_components.local import processes


def _custom(kube_client):
    return client.CustomObjectsApi(kube_client)


def _ready(obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def test_git_repository_becomes_ready_with_a_verified_artifact(local_platform, kube_client, namespace):
    url = local_platform.git.create(f"{namespace}-src", {"Pulumi.yaml": "name: demo\nruntime: yaml\n"})
    custom = _custom(kube_client)
    custom.create_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", namespace, "gitrepositories", {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "demo"},
        "spec": {"url": url, "interval": "1m", "ref": {"branch": "main"}},
    })

    def ready_repo():
        obj = custom.get_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", namespace, "gitrepositories",
                                                  "demo")
        return obj if _ready(obj) else None

    repo = processes.wait_until(ready_repo, 60, "GitRepository demo")
    artifact = repo["status"]["artifact"]
    assert artifact["url"].startswith(local_platform.flux_storage_url)
    with urllib.request.urlopen(artifact["url"]) as response:
        payload = response.read()
    algorithm, _, digest = artifact["digest"].partition(":")
    assert algorithm == "sha256"
    assert hashlib.sha256(payload).hexdigest() == digest


def test_kustomization_applies_manifests_from_git_as_its_service_account_only(local_platform, kube_client, namespace):
    """Flux runs locked down (multi-tenancy): a Kustomization naming no ServiceAccount is applied as its
    namespace's `default`, which may do nothing; one naming a ServiceAccount bound to `edit` there applies."""
    configmap = (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-git\n  namespace: {namespace}\n"
                 "data:\n  answer: '42'\n")
    url = local_platform.git.create(f"{namespace}-deploy", {"deploy/configmap.yaml": configmap})
    custom = _custom(kube_client)
    custom.create_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", namespace, "gitrepositories", {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": "deploy"},
        "spec": {"url": url, "interval": "1m", "ref": {"branch": "main"}},
    })
    custom.create_namespaced_custom_object("kustomize.toolkit.fluxcd.io", "v1", namespace, "kustomizations", {
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": {"name": "deploy"},
        "spec": {"interval": "1m", "path": "./deploy", "prune": True,
                 "sourceRef": {"kind": "GitRepository", "name": "deploy"}},
    })
    core = client.CoreV1Api(kube_client)

    def refused():
        obj = custom.get_namespaced_custom_object("kustomize.toolkit.fluxcd.io", "v1", namespace, "kustomizations",
                                                  "deploy")
        ready = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)
        return ready if ready and ready["status"] == "False" and "forbidden" in ready["message"] else None

    message = processes.wait_until(refused, 90, "Kustomization deploy refused as `default`")["message"]
    assert f"system:serviceaccount:{namespace}:default" in message, message

    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    client.RbacAuthorizationV1Api(kube_client).create_namespaced_role_binding(namespace, {
        "metadata": {"name": "deployer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]})
    custom.patch_namespaced_custom_object("kustomize.toolkit.fluxcd.io", "v1", namespace, "kustomizations", "deploy",
                                          {"spec": {"serviceAccountName": "deployer"},
                                           "metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "now"}}})

    def applied():
        try:
            return core.read_namespaced_config_map("from-git", namespace)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    configmap_obj = processes.wait_until(applied, 90, "ConfigMap from-git applied by kustomize-controller")
    assert configmap_obj.data == {"answer": "42"}
