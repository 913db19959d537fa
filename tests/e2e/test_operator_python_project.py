"""e2e (the operator): a git-sourced Python project that creates Kubernetes objects with
pulumi-kubernetes, run by a Stack with `serviceAccountName`, and by one without (which has no cluster).

Needs what cannot be built here: a pulumi CLI with the Python language host and the kubernetes
provider plugin (tests/e2e/requirements.py names what is missing; tests/run.py then reports the
tier NOT RUN). The program's dependencies come from PyPI into the Stack's own virtualenv; its only
Kubernetes identity is the ServiceAccount's token, so it can write in its namespace and nowhere else.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from kubernetes import client
from requirements import missing_e2e_requirements

from strata_components.local.processes import wait_until

MISSING = missing_e2e_requirements()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"e2e needs: {'; '.join(MISSING)}")
GROUP, VERSION = "pulumi.com", "v1"
PASSPHRASE = "e2e-operator-passphrase"

PROGRAM = textwrap.dedent("""\
    import pulumi
    import pulumi_kubernetes as k8s

    config = pulumi.Config()
    # No explicit provider: the default one reads KUBECONFIG, which the operator points at a
    # TokenRequest kubeconfig of the Stack's serviceAccountName.
    configmap = k8s.core.v1.ConfigMap("app", metadata={"name": config.require("name"),
                                                       "namespace": config.require("namespace")},
                                      data={"written-by": "strata-e2e"})
    pulumi.export("configmap", configmap.metadata.name)
""")


def _stack(custom, namespace: str, name: str, url: str, backend: Path, target_namespace: str,
           service_account: str | None = "deployer") -> None:
    identity = {"serviceAccountName": service_account} if service_account else {}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name},
        "spec": {"stack": name, "projectRepo": url, "branch": "main", **identity,
                 "backend": backend.as_uri(),
                 "config": {"e2e-app:name": name, "e2e-app:namespace": target_namespace},
                 "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                                          "secret": {"name": "pulumi", "key": "passphrase"}}},
                 "destroyOnFinalize": True}})


def test_python_project_from_git_runs_as_the_stacks_service_account(python_operator, local_platform, kube_client,
                                                                     namespace, tmp_path):
    core, rbac = client.CoreV1Api(kube_client), client.RbacAuthorizationV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "pulumi"}, "stringData": {"passphrase": PASSPHRASE}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "configmaps"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update",
                                                                   "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "deployer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]})
    url = local_platform.git.create(f"{namespace}-py", {
        "Pulumi.yaml": "name: e2e-app\nruntime: python\n",
        "requirements.txt": "pulumi==3.259.0\npulumi-kubernetes==4.34.2\n",
        "__main__.py": PROGRAM,
    })
    backend = tmp_path / "backend"
    backend.mkdir()

    def status(name: str) -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", name).get("status") or {}

    def ready(name: str) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in status(name).get("conditions", []))

    _stack(custom, namespace, "inside", url, backend, namespace)
    wait_until(lambda: ready("inside"), 900, "Stack inside Ready (first run installs its virtualenv)",
               log=python_operator.log, interval=2)
    configmap = core.read_namespaced_config_map("inside", namespace)
    assert configmap.data == {"written-by": "strata-e2e"}
    assert status("inside")["outputs"]["configmap"] == "inside"

    # The same program aimed outside its namespace fails: the ServiceAccount is all it has.
    _stack(custom, namespace, "outside", url, backend, "default")
    failed = wait_until(lambda: (status("outside").get("lastUpdate") or {}).get("state") == "failed"
                        and status("outside"), 600, "Stack outside failed", log=python_operator.log, interval=2)
    assert "forbidden" in failed["lastUpdate"]["message"].lower()
    with pytest.raises(client.ApiException) as absent:
        core.read_namespaced_config_map("outside", "default")
    assert absent.value.status == 404

    # With no serviceAccountName the update has no cluster at all (the operator lends it none of its own
    # identity): the Stack stalls at once naming the field, instead of retrying for ever. Given a
    # ServiceAccount bound to `edit`, as the README's notes for PKO v1 users say, the same program deploys.
    _stack(custom, namespace, "anonymous", url, backend, namespace, service_account=None)

    def stalled() -> dict | None:
        found = [c for c in status("anonymous").get("conditions", [])
                 if c["type"] == "Stalled" and c["status"] == "True"]
        return found[0] if found and found[0]["reason"] == "ServiceAccountRequired" else None

    condition = wait_until(stalled, 600, "Stack anonymous Stalled/ServiceAccountRequired", log=python_operator.log,
                           interval=2)
    assert "spec.serviceAccountName" in condition["message"] and "`edit`" in condition["message"]
    assert "unable to load Kubernetes client configuration" in condition["message"]
    failures = status("anonymous")["lastUpdate"]["failures"]
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "editor"}})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": namespace}]})
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", "anonymous",
                                          {"spec": {"serviceAccountName": "editor"}})
    wait_until(lambda: ready("anonymous"), 600, "Stack anonymous Ready as editor", log=python_operator.log,
               interval=2)
    assert failures == 1, "retried before its spec changed"
    assert core.read_namespaced_config_map("anonymous", namespace).data == {"written-by": "strata-e2e"}

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", "anonymous")
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", "inside")
    wait_until(lambda: not core.list_namespaced_config_map(namespace, field_selector="metadata.name=inside").items,
               300, "destroyOnFinalize removed the ConfigMap", log=python_operator.log, interval=2)

    # A Stack whose update failed still finalizes (nothing was created), so its namespace can go.
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", "outside")
    wait_until(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "stacks")["items"],
               300, "every Stack finalized and gone", log=python_operator.log, interval=2)
