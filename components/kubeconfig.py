"""Pure kubeconfig rendering and parsing, for the components and the local platform (no Pulumi, no cluster)."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import yaml


def _document(cluster: str, server: str, ca_data: str, user: str, credentials: dict,
              namespace: str | None) -> str:
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": cluster, "context": context}],
        "current-context": cluster,
    }, sort_keys=False)


def build_token_kubeconfig(*, cluster: str, server: str, ca_data: str, user: str, token: str,
                           namespace: str | None = None) -> str:
    """A one-context kubeconfig authenticating with a bearer token (e.g. a ServiceAccount's).

    `ca_data` is the base64 PEM bundle, as found in kubeconfigs and in a token Secret's `ca.crt`.
    """
    if not token:
        raise ValueError(f"kubeconfig for {user!r}: the token is empty; wait until the token Secret is populated")
    return _document(cluster, server, ca_data, user, {"token": token}, namespace)


def build_client_certificate_kubeconfig(*, cluster: str, server: str, ca_data: str, user: str,
                                        certificate_data: str, key_data: str, namespace: str | None = None) -> str:
    """A one-context kubeconfig authenticating with a client certificate (all data base64 PEM)."""
    return _document(cluster, server, ca_data, user,
                     {"client-certificate-data": certificate_data, "client-key-data": key_data}, namespace)


def pem_data(pem: str) -> str:
    """A PEM document as the base64 `*-data` fields of a kubeconfig carry it."""
    return base64.b64encode(pem.encode()).decode()


def build_exec_kubeconfig(*, cluster: str, server: str, ca_data: str, command: str, args: Sequence[str],
                          env: dict[str, str] | None = None, namespace: str | None = None) -> str:
    """A kubeconfig whose credentials come from an exec plugin (gke-gcloud-auth-plugin, aws eks get-token)."""
    plugin: dict = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": command, "args": list(args),
                    "interactiveMode": "Never", "provideClusterInfo": False}
    if env:
        plugin["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    return _document(cluster, server, ca_data, cluster, {"exec": plugin}, namespace)


def _current_context(kubeconfig: str) -> tuple[dict, dict]:
    """(cluster, user) entries of a kubeconfig document's current context."""
    try:
        config = yaml.safe_load(kubeconfig)
        current = config.get("current-context")
        contexts = {item["name"]: item["context"] for item in config.get("contexts") or []}
        clusters = {item["name"]: item["cluster"] for item in config.get("clusters") or []}
        users = {item["name"]: item.get("user") or {} for item in config.get("users") or []}
        if current:
            return clusters[contexts[current]["cluster"]], users.get(contexts[current].get("user"), {})
        return next(iter(clusters.values())), next(iter(users.values()), {})
    except (yaml.YAMLError, AttributeError, KeyError, StopIteration, TypeError):
        raise ValueError("the kubeconfig has no usable current-context cluster "
                         "(expected clusters[].cluster.server and a current-context naming it)") from None


def kubeconfig_cluster(kubeconfig: str) -> tuple[str, str]:
    """(server URL, base64 CA data) of the current context's cluster of a kubeconfig document."""
    cluster, _ = _current_context(kubeconfig)
    ca_data = cluster.get("certificate-authority-data")
    if ca_data is None and cluster.get("certificate-authority"):
        with open(cluster["certificate-authority"], "rb") as handle:
            ca_data = base64.b64encode(handle.read()).decode()
    return cluster["server"], ca_data or ""


def kubeconfig_user(kubeconfig: str) -> dict:
    """The credentials (`users[].user`) of a kubeconfig document's current context."""
    return _current_context(kubeconfig)[1]
