"""The offline Flux install bundle: what pulumi-flux would download, checked against the real apiserver."""

import gzip
import io
import tarfile
import urllib.request

import yaml
from kubernetes.dynamic import DynamicClient

from strata_components.local.fluxbundle import bundle_settings


def test_bundle_is_served_and_every_object_passes_a_server_side_dry_run(local_platform, kube_client):
    version = bundle_settings()["version"]
    with urllib.request.urlopen(f"{local_platform.flux_bundle_url}/download/{version}/manifests.tar.gz") as response:
        payload = response.read()
    documents = []
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(payload))) as archive:
        names = sorted(archive.getnames())
        for name in names:
            documents += [doc for doc in yaml.safe_load_all(archive.extractfile(name)) if doc]
    assert names == ["helm-controller.yaml", "kustomize-controller.yaml", "notification-controller.yaml",
                     "policies.yaml", "rbac.yaml", "source-controller.yaml"]
    kinds = [doc["kind"] for doc in documents]
    assert kinds.count("CustomResourceDefinition") == 11 and kinds.count("Deployment") == 4

    dynamic = DynamicClient(kube_client)
    for doc in documents:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = "flux-system" if resource.namespaced else None
        if namespace:
            doc["metadata"]["namespace"] = namespace
        resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=namespace,
                                   field_manager="strata-bundle-check", force_conflicts=True, dry_run="All")
    # pulumi-flux rewrites Deployment args by position: upstream's args must be kept whole.
    source = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "source-controller")
    assert len(source["spec"]["template"]["spec"]["containers"][0]["args"]) >= 7
