"""After bootstrap Flux runs the show: a Kustomization as the Flux component renders it syncs a
Program and a Stack from the platform's git server, on the real source- and kustomize-controller and
the real operator. A `git push` reaches the Stack without any poll (the git server announces it), and
deleting the sync destroys the Stack's resources before the sync is gone."""

from __future__ import annotations

import subprocess
import time

import yaml

from strata_components.flux import build_sync_manifests
from strata_components.local import processes

from .conftest import has_condition, stash_program, team_identity, unique

FLUX_SOURCE = ("source.toolkit.fluxcd.io", "v1", "gitrepositories")
KUSTOMIZE = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations")


def manifests(namespace: str, greeting: str) -> dict[str, str]:
    # Pulumi YAML interpolates ${...} too: Flux's own substitution must leave a Program alone.
    program = {"apiVersion": "pulumi.com/v1", "kind": "Program",
               "metadata": {"name": "hello", "namespace": namespace,
                            "annotations": {"kustomize.toolkit.fluxcd.io/substitute": "disabled"}},
               "program": stash_program(greeting=greeting)}
    stack = {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "hello", "namespace": namespace},
             "spec": {"stack": "gitops", "programRef": {"name": "hello"}, "backend": "${STRATA_BACKEND}",
                      "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                                               "secret": {"name": "pulumi", "key": "passphrase"}}},
                      "destroyOnFinalize": True}}
    return {"clusters/test/program.yaml": yaml.safe_dump(program),
            "clusters/test/stack.yaml": yaml.safe_dump(stack)}


def sync(namespace: str, url: str, backend: str, service_account: str) -> list[dict]:
    """The GitRepository and Kustomization, with the options the Flux component gives its sync, applied as
    `service_account` (Flux runs locked down: the cluster's own sync is kustomize-controller, a tenant's
    its own identity). The source polls only every 10 minutes: anything faster is the push notification."""
    rendered = yaml.safe_dump_all([
        {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
         "metadata": {"name": "fleet", "namespace": namespace},
         "spec": {"url": url, "interval": "10m", "ref": {"branch": "main"}}},
        {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
         "metadata": {"name": "fleet", "namespace": namespace},
         "spec": {"interval": "10m", "path": "./clusters/test", "sourceRef": {"kind": "GitRepository", "name": "fleet"}}},
    ])
    repository, kustomization = build_sync_manifests(rendered, {"STRATA_BACKEND": backend}, timeout="2m")
    kustomization["spec"]["serviceAccountName"] = service_account
    return [repository, kustomization]


def test_a_push_reaches_the_synced_stack_without_a_poll_and_the_sync_comes_down_stacks_first(
        stacks, local_platform, tmp_path):
    namespace, custom = stacks.namespace, stacks.custom
    name = unique("fleet")
    url = local_platform.git.create(name, manifests(namespace, "v1"))
    repository, kustomization = sync(namespace, url, stacks.backend,
                                     team_identity(local_platform, namespace, "fleet"))
    custom.create_namespaced_custom_object(*FLUX_SOURCE[:2], namespace, FLUX_SOURCE[2], repository)
    custom.create_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2], kustomization)

    def kustomization_ready():
        obj = custom.get_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2], "fleet")
        return obj if has_condition(obj, "Ready") else None

    # Ready once what it applied is healthy: the Stack has run.
    try:
        processes.wait_until(kustomization_ready, 120, "Kustomization fleet Ready")
    except processes.ProcessError as error:
        obj = custom.get_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2], "fleet")
        raise AssertionError(f"{error}: {obj.get('status')}; Stack: {stacks.get('hello')}") from None
    assert stacks.wait_ready("hello")["status"]["outputs"] == {"greeting": "v1"}

    clone = tmp_path / "clone"
    git = ["git", "-c", "user.name=alpha", "-c", "user.email=alpha@localhost"]
    subprocess.run([*git, "clone", "-q", local_platform.git.push_url(name), str(clone)], check=True)
    (clone / "clusters/test/program.yaml").write_text(manifests(namespace, "v2")["clusters/test/program.yaml"])
    subprocess.run([*git, "commit", "-qam", "greeting v2"], cwd=clone, check=True)
    pushed = time.monotonic()
    subprocess.run([*git, "push", "-q", "origin", "main"], cwd=clone, check=True)
    stacks.wait("hello", lambda o: (o.get("status") or {}).get("outputs") == {"greeting": "v2"} and
                has_condition(o, "Ready"), 60, "the pushed greeting in the Stack's outputs")
    print(f"push -> Stack Ready with the new output: {time.monotonic() - pushed:.1f}s")
    source = custom.get_namespaced_custom_object(*FLUX_SOURCE[:2], namespace, FLUX_SOURCE[2], "fleet")
    assert "reconcile.fluxcd.io/requestedAt" in source["metadata"]["annotations"]

    # Deleting the sync prunes the Stack and waits for it: the operator destroys its resources first.
    custom.delete_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2], "fleet")

    def gone():
        remaining = custom.list_namespaced_custom_object(*KUSTOMIZE[:2], namespace, KUSTOMIZE[2])["items"]
        return not remaining

    processes.wait_until(gone, 120, "Kustomization fleet gone")
    assert stacks.get("hello") is None, "the Kustomization went before the Stack it synced"
