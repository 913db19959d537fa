"""Small Kubernetes helpers for the local platform: private files, probes, server-side apply."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import yaml


def write_private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)
    return path


def https_ok(url: str, pki: Path, timeout: float = 2.0, verify_server: bool = True, client: str = "admin") -> bool:
    """GET `url` with the client certificate `client` of `pki` (the admin's by default); True on HTTP 200.

    kube-controller-manager and kube-scheduler serve self-signed certificates: their loopback
    health checks pass verify_server=False (liveness only, no credentials sent in the request).
    """
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if not verify_server:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def api_client(kubeconfig: Path):
    """A kubernetes ApiClient for a kubeconfig file (imported lazily: the client is slow to import)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def server_side_apply(kubeconfig: Path, objects: Iterable[dict], field_manager: str = "strata") -> None:
    """Server-side apply each object, forcing conflicts: the platform owns what it applies."""
    from kubernetes.dynamic import DynamicClient

    with api_client(kubeconfig) as client:
        dynamic = DynamicClient(client)
        for obj in objects:
            resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            namespace = obj["metadata"].get("namespace")
            resource.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=namespace,
                                       field_manager=field_manager, force_conflicts=True)


def load_documents(paths: Iterable[Path]) -> list[dict]:
    documents: list[dict] = []
    for path in paths:
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents
