"""Every `pulumi.com/v1` Stack and Program PKO v2.9.0 ships (examples/, operator/e2e/testdata/) applies here
unchanged, server-side with strict field validation, and then says in its status what it does here.

The manifests are PKO's own (pko_v2.9.0/, Apache-2.0). Each original namespace becomes a fresh test
namespace; beside the Stacks and Programs, the Secrets, ConfigMaps and ServiceAccounts of the same files
are applied (cluster-scoped objects, PersistentVolumeClaims, NetworkPolicies, Flux sources and PKO's own
Workspace kind are not: nothing here uses them). Where a manifest cannot run as PKO documents it, the
status names why: the expectations below are per Stack, each with the reason and the words that say it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import serve_namespace

from .conftest import GROUP, condition

DATA = Path(__file__).parent / "pko_v2.9.0"
SUPPORTING = {("v1", "Secret"), ("v1", "ConfigMap"), ("v1", "ServiceAccount")}
PLURALS = {"Stack": "stacks", "Program": "programs"}
WAITING_FOR_API_SECRET = ("Reconciling", "RetryingAfterFailure", "Secret 'pulumi-api-secret' not found")
STATE_VOLUME = ("Stalled", "SpecInvalid",
                "spec.envRefs.PULUMI_BACKEND_URL: the file:// backend 'file:///state/' is inside the volume 'state'")

# (file, Stack) -> (condition that is True, its reason, words of its message). The examples' Stacks use
# Pulumi Cloud with the Secret pulumi-api-secret their README has the user create (not created here);
# PKO's e2e Stacks keep their state on a volume of PKO's workspace pod.
EXPECTED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("examples/custom-source/stack.yaml", "custom-source"):
        # Its program is a directory of its workspace image: the pod executor's, not this (process) operator's.
        ("Stalled", "SpecInvalid", "spec.workspaceTemplate.spec.local.dir: the program is the directory "
                                   "'/home/pulumi/examples/stack-readme-py' of a workspace pod"),
    ("examples/flux-source/stack.yaml", "random-yaml-flux"): WAITING_FOR_API_SECRET,
    ("examples/git-source/stack.yaml", "random-yaml-git"): WAITING_FOR_API_SECRET,
    ("examples/preview-demo/stack.yaml", "nginx-current"): WAITING_FOR_API_SECRET,
    ("examples/preview-demo/stack.yaml", "nginx-next"): WAITING_FOR_API_SECRET,
    ("examples/program-source/stack.yaml", "random-yaml-program"): WAITING_FOR_API_SECRET,
    # `stack: <your-org>/aws-ts-s3-folder/dev` is a placeholder for the reader's organisation.
    ("examples/structured-config/configmap-config.yaml", "structured-config-configmap"):
        ("Stalled", "SpecInvalid", "spec.stack: '<your-org>/aws-ts-s3-folder/dev' is not a stack name"),
    ("examples/structured-config/inline-config.yaml", "structured-config-inline"):
        ("Stalled", "SpecInvalid", "spec.stack: '<your-org>/aws-ts-s3-folder/dev' is not a stack name"),
    ("operator/e2e/testdata/git-auth-nonroot/manifests.yaml", "git-auth-nonroot"): STATE_VOLUME,
    ("operator/e2e/testdata/issue-937/manifests.yaml", "issue-937"): STATE_VOLUME,
    # Its workspace pod mounts nothing at /state, so the backend is the operator's own; its Flux
    # GitRepository (github.com) is not applied here.
    ("operator/e2e/testdata/random-yaml-auth-error/manifests.yaml", "random-yaml-auth-error"):
        ("Stalled", "SourceUnavailable", "GitRepository 'pulumi-examples' not found"),
    ("operator/e2e/testdata/random-yaml-nonroot/manifests.yaml", "random-yaml-nonroot"): STATE_VOLUME,
    ("operator/e2e/testdata/structured-config-version/manifests.yaml", "structured-config-version"): STATE_VOLUME,
    ("operator/e2e/testdata/structured-config-version/step2/manifests.yaml", "structured-config-version"):
        STATE_VOLUME,
    ("operator/e2e/testdata/structured-config/manifests.yaml", "structured-config"): STATE_VOLUME,
    ("operator/e2e/testdata/targets/manifests.yaml", "targets"): STATE_VOLUME,
}


def pko_files() -> list[str]:
    return sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.yaml"))


def documents(file: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DATA / file).read_text()) if d]


def apply_strict(api: client.ApiClient, obj: dict[str, Any]) -> None:
    """`kubectl apply --server-side --validate=strict`: unknown or duplicate fields are errors."""
    group_version, kind = obj["apiVersion"], obj["kind"]
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    base = (f"/apis/{group_version}/namespaces/{namespace}/{PLURALS[kind]}" if "/" in group_version
            else f"/api/{group_version}/namespaces/{namespace}/{kind.lower()}s")
    request = api.param_serialize(
        "PATCH", f"{base}/{name}", query_params=[("fieldManager", "pko-manifests"), ("fieldValidation", "Strict"),
                                                 ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=json.dumps(obj), auth_settings=["BearerToken"])
    response = api.call_api(*request)
    response.read()
    api.response_deserialize(response, {"200": "object", "201": "object"})  # raises ApiException otherwise


@pytest.fixture
def pko_namespaces(kube_client, local_platform):
    """A fresh namespace for each namespace the manifests name (the examples all use `default`), served by the
    operator as a PKO user's namespaces would be (the Operator component's `served_namespaces`)."""
    core = client.CoreV1Api(kube_client)
    names: dict[str, str] = {}

    def namespace_for(original: str) -> str:
        if original not in names:
            names[original] = f"pko-{original[:40]}-{uuid.uuid4().hex[:5]}"
            core.create_namespace({"metadata": {"name": names[original]}})
            serve_namespace(local_platform.kubeconfig_path, names[original])
        return names[original]

    yield namespace_for
    for name in names.values():
        core.delete_namespace(name)


@pytest.mark.common_word_secret  # their passphrase is the Literal "test"
def test_every_pko_stack_and_program_applies_and_says_what_it_does_here(kube_client, operator, pko_namespaces):
    custom = client.CustomObjectsApi(kube_client)
    files = pko_files()
    applied: list[tuple[str, str, str, str]] = []  # (file, kind, namespace, name)
    refused = []
    for file in files:  # in path order, so each step2/ applies over its step 1
        for doc in documents(file):
            ours = doc["apiVersion"] == f"{GROUP}/v1" and doc["kind"] in PLURALS
            if not ours and (doc["apiVersion"], doc["kind"]) not in SUPPORTING:
                continue
            doc["metadata"]["namespace"] = pko_namespaces(doc["metadata"].get("namespace", "default"))
            try:
                apply_strict(kube_client, doc)
            except client.ApiException as error:
                refused.append(f"{file} {doc['kind']}/{doc['metadata']['name']}: {error.status} {error.body}")
                continue
            if ours:
                applied.append((file, doc["kind"], doc["metadata"]["namespace"], doc["metadata"]["name"]))
    assert not refused, "\n".join(refused)
    stacks = [(f, ns, name) for f, kind, ns, name in applied if kind == "Stack"]
    programs = [(ns, name) for _, kind, ns, name in applied if kind == "Program"]
    assert {(f, name) for f, _, name in stacks} == set(EXPECTED), "a PKO manifest without an expectation here"
    assert len(programs) == 5

    def get(kind: str, namespace: str, name: str) -> dict[str, Any]:
        return custom.get_namespaced_custom_object(GROUP, "v1", namespace, PLURALS[kind], name)

    # Each Stack settles on the expected condition (a later step of the same Stack supersedes its first).
    latest = {(ns, name): f for f, ns, name in stacks}
    wrong: list[str] = []

    def settled() -> bool:
        wrong.clear()
        for (namespace, name), file in latest.items():
            ctype, reason, words = EXPECTED[(file, name)]
            obj = get("Stack", namespace, name)
            found = condition(obj, ctype)
            if not (found and found["status"] == "True" and found["reason"] == reason and words in found["message"]
                    and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]):
                wrong.append(f"{file} {name}: want {ctype}/{reason} saying {words!r}; has "
                             f"{(obj.get('status') or {}).get('conditions')}")
        return not wrong

    try:
        processes.wait_until(settled, 90, "every PKO Stack reports what it does here", interval=1)
    except processes.ProcessError:
        raise AssertionError("\n".join(wrong)) from None

    for (namespace, name), file in latest.items():
        obj = get("Stack", namespace, name)
        assert not obj["status"].get("lastUpdate"), f"{file} {name}: an engine run was recorded"
        if EXPECTED[(file, name)][1] != "SpecInvalid" or "PULUMI_BACKEND_URL" in EXPECTED[(file, name)][2]:
            # Parsed: v2's pod settings are listed as not applicable (SpecInvalid at parse stops before).
            assert "workspaceTemplate" in obj["status"].get("ignoredFields", []), f"{file} {name}"
    # Programs: PKO v2's status (observedGeneration, the artifact Stacks run).
    def program_with_artifact(namespace: str, name: str) -> dict[str, Any] | None:
        program = get("Program", namespace, name)
        return program if (program.get("status") or {}).get("artifact") else None

    for namespace, name in programs:
        program = processes.wait_until(lambda ns=namespace, n=name: program_with_artifact(ns, n), 30,
                                       f"Program {name} status")
        generation, status = program["metadata"]["generation"], program["status"]
        assert status["observedGeneration"] == generation
        assert status["artifact"]["revision"] == str(generation)
        assert status["artifact"]["digest"].startswith("sha256:")
    print(f"\n{len(stacks)} PKO Stack manifests ({len(latest)} Stacks) and {len(programs)} Programs from "
          f"{len(files)} files applied; every Stack reports the expected state")


def test_a_v1alpha1_stack_is_served_as_v1(kube_client, operator, namespace):
    """Both PKO versions still serve the deprecated v1alpha1 Stack: the same object, stored as v1."""
    custom = client.CustomObjectsApi(kube_client)
    custom.create_namespaced_custom_object(GROUP, "v1alpha1", namespace, "stacks", {
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "Stack", "metadata": {"name": "old"},
        "spec": {"stack": "dev", "programRef": {"name": "missing"}}})
    def stalled_as_v1() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(GROUP, "v1", namespace, "stacks", "old")
        return obj if condition(obj, "Stalled") else None

    as_v1 = processes.wait_until(stalled_as_v1, 60, "handled as v1")
    assert as_v1["apiVersion"] == f"{GROUP}/v1"
    assert condition(as_v1, "Stalled")["reason"] == "SourceUnavailable"
    assert "program 'missing'" in condition(as_v1, "Stalled")["message"]
