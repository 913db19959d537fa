"""Register plain Kubernetes manifests (dicts from the pure `build_*` functions) as typed Pulumi resources.

The same dicts are what integration tests server-side-apply to a real apiserver, so what Pulumi
creates and what the tests check cannot drift apart.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

RESOURCE_CLASSES: dict[tuple[str, str], type[pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): k8s.apiextensions.v1.CustomResourceDefinition,
}


# pulumi-kubernetes waits for a new Service's endpoints and then sleeps 10 s after every change to them
# ("to settle"): 10 s or more on every Service. Where the Deployment whose pods the Service selects is
# awaited anyway (its rollout: those pods Ready), that sleep proves nothing more, so such a Service waits
# only for its cluster IP (the provider's `pulumi.com/waitFor` replaces its own wait).
SERVICE_OF_AN_AWAITED_DEPLOYMENT = {"pulumi.com/waitFor": "jsonpath={.spec.clusterIP}"}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def create_object(name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """The typed pulumi-kubernetes resource for one manifest; top-level fields become its arguments.
    Kinds without a typed class (custom resources with a `spec`) become apiextensions.CustomResource."""
    key = (manifest["apiVersion"], manifest["kind"])
    resource_class = RESOURCE_CLASSES.get(key)
    if resource_class is None:
        extra = set(manifest) - {"apiVersion", "kind", "metadata", "spec"}
        if extra:
            raise ValueError(f"{name}: {key[0]} {key[1]} has top-level fields {sorted(extra)} that "
                             "apiextensions.CustomResource cannot carry; add a typed class to RESOURCE_CLASSES")
        return k8s.apiextensions.CustomResource(name, api_version=key[0], kind=key[1], metadata=manifest["metadata"],
                                                spec=manifest.get("spec"), opts=opts)
    fields = {_snake(field): value for field, value in manifest.items() if field not in ("apiVersion", "kind")}
    return resource_class(name, opts=opts, **fields)


def object_key(manifest: dict[str, Any]) -> str:
    """A stable resource name for a manifest: kind-namespace-name (lowercase)."""
    metadata = manifest["metadata"]
    parts = [manifest["kind"].lower(), metadata.get("namespace"), metadata["name"]]
    return "-".join(part for part in parts if part)


def build_token_secret(namespace: str, service_account: str, name: str,
                       labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A `kubernetes.io/service-account-token` Secret: the token controller fills in `token` and
    `ca.crt`, and the token dies with the Secret (unlike a TokenRequest token, it does not expire)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "annotations": {"kubernetes.io/service-account.name": service_account}}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token", "metadata": metadata}


def token_from_secret_data(data: dict[str, str] | None) -> str:
    """The bearer token in a service-account-token Secret's `data` (base64)."""
    encoded = (data or {}).get("token")
    if not encoded:
        raise ValueError("the ServiceAccount token Secret has no `token` yet; the token controller fills it")
    return base64.b64decode(encoded).decode()
