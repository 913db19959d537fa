"""A hostile team on a running stack: a commit under team-alpha's path adding a Stack whose program (hostile/)
looks around where it runs, and what its probes must come back with. Shared by the dev and cluster stacks' tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import yaml
from kubernetes import client

from strata_components.local.gitserver import GitRepos

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).resolve().parent / "hostile" / "__main__.py"
STACKS = ("pulumi.com", "v1", "stacks")


def hostile_stack(targets: dict, name: str = "hostile", template: dict | None = None) -> dict:
    """Alpha's Stack running the hostile program, as alpha would commit it beside its app."""
    spec = {"stack": f"organization/hostile/{name}", "serviceAccountName": "team-alpha",
            "fluxSource": {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                                         "name": "team-alpha"}, "dir": "programs/hostile"},
            "backend": "${STRATA_BACKEND}", "secretsProvider": "passphrase",
            "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {
                "name": "strata-pulumi-passphrase", "key": "passphrase"}}},
            "config": {"hostile:targets": json.dumps(targets)}, "destroyOnFinalize": True}
    if template is not None:
        spec["workspaceTemplate"] = template
    return {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name, "namespace": "team-alpha"},
            "spec": spec}


def commit_under_alpha(custom: client.CustomObjectsApi, repos: GitRepos, sync_root: str, *stacks: dict) -> None:
    """Commit the hostile program and `stacks` under team-alpha's directory of `sync_root` (the dev stack's
    clusters/dev, which the cluster stack's overlay includes), and have Flux fetch it now."""
    directory = f"{sync_root}/team-alpha"
    kustomization = yaml.safe_load((ROOT / directory / "kustomization.yaml").read_text())
    listed = [f"{stack['metadata']['name']}.yaml" for stack in stacks]
    repos.commit("strata", {
        "programs/hostile/Pulumi.yaml": "name: hostile\nruntime: python\n",
        "programs/hostile/requirements.txt": "pulumi>=3.200,<4\n",
        "programs/hostile/__main__.py": HOSTILE.read_text(),
        **{f"{directory}/{name}": yaml.safe_dump(stack) for name, stack in zip(listed, stacks)},
        f"{directory}/kustomization.yaml": yaml.safe_dump({**kustomization,
                                                           "resources": [*kustomization["resources"], *listed]})},
        "alpha: a look around")
    # Fetched now rather than at the source's next poll, as the git server's push notification does.
    custom.patch_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", "team-alpha", "gitrepositories",
                                          "team-alpha", {"metadata": {"annotations": {
                                              "reconcile.fluxcd.io/requestedAt": str(time.time())}}})


def wait_stack(custom: client.CustomObjectsApi, namespace: str, name: str, predicate, what: str,
               timeout: float = 600) -> dict:
    deadline, stack = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            stack = custom.get_namespaced_custom_object(*STACKS[:2], namespace, STACKS[2], name)
        except client.ApiException as error:
            if error.status != 404:
                raise
        if stack and predicate(stack.get("status") or {}):
            return stack
        time.sleep(2)
    raise AssertionError(f"Stack {namespace}/{name}: {what} not within {timeout:.0f}s: {stack.get('status')}")


def wait_ready(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict:
    return wait_stack(custom, namespace, name, lambda status: {c["type"]: c["status"] for c in
                                                               status.get("conditions") or []}.get("Ready") == "True",
                      "Ready")


def run_hostile_stack(custom: client.CustomObjectsApi, repos: GitRepos, sync_root: str, stack: dict,
                      *others: dict) -> dict:
    """Commit the hostile Stack (and `others` beside it) under alpha's path; its status once its first update
    ran (it must succeed: its probes catch what they are refused)."""
    commit_under_alpha(custom, repos, sync_root, stack, *others)
    ran = wait_stack(custom, "team-alpha", stack["metadata"]["name"], lambda status: (
        status.get("lastUpdate") or {}).get("state") in ("succeeded", "failed"), "its first update")
    status = ran["status"]
    assert status["lastUpdate"]["state"] == "succeeded", status
    print(json.dumps(status["outputs"]["probes"], indent=1)[:6000])
    return status


def secret_values(state: Path, files: Iterable[str]) -> list[str]:
    """What the platform's files hold that would open something: tokens, private keys, the CA key, the push
    credential."""
    values = [(state / "git-push.credentials").read_text().strip()]
    for path in files:
        for line in Path(path).read_text().splitlines() if Path(path).is_file() else []:
            key, _, value = line.strip().partition(": ")
            if key in ("token", "client-key-data"):
                values.append(value)
    values += [line for line in (state / "pki" / "ca.key").read_text().splitlines() if not line.startswith("-----")]
    return values


def assert_stalled(custom: client.CustomObjectsApi, name: str, reason: str, *fragments: str) -> None:
    """Alpha's Stack `name` Stalled for `reason`, its message naming each of `fragments`."""
    stack = wait_stack(custom, "team-alpha", name, lambda status: any(
        c["type"] == "Stalled" and c["status"] == "True" for c in status.get("conditions") or []), "Stalled")
    condition = next(c for c in stack["status"]["conditions"] if c["type"] == "Stalled")
    assert condition["reason"] == reason, condition
    for fragment in fragments:
        assert fragment in condition["message"], (fragment, condition)
    assert not (stack["status"].get("lastUpdate") or {}), stack["status"]  # refused before anything ran


def assert_refused_beyond_its_own(probes: dict) -> None:
    """etcd without a certificate of its CA, a push without the platform's credential, another team's Secrets
    with its own identity: each refused."""
    assert probes["etcd"].startswith("denied:"), probes["etcd"]
    assert probes["git push"].startswith("denied: HTTPError: HTTP Error 401"), probes["git push"]
    assert probes["other team's Secrets"].startswith("denied: HTTPError: HTTP Error 403"), probes["other team's Secrets"]


def assert_nothing_reached(core: client.CoreV1Api, status: dict, secrets: list[str]) -> None:
    """None of `secrets` in the hostile Stack's status or alpha's Events."""
    everything = json.dumps(status) + " ".join(e.message or "" for e in core.list_namespaced_event("team-alpha").items)
    assert len(secrets) >= 3
    for secret in secrets:
        assert secret not in everything, "a secret of the platform's or beta's reached alpha's Stack"
