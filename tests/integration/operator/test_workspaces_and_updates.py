"""PKO v2's Workspace and Update (auto.pulumi.com/v1alpha1) on the real operator and engine: a Workspace
from the platform's git server, Updates of each kind, the outputs Secret, ttlAfterCompleted, a missing
Workspace, a failing program with continueOnError, restarts that run nothing again, and PKO v2.9.0's own
Workspace manifests under strict field validation."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from strata_components.local import processes

from .conftest import condition, unique
from .test_pko_manifests import DATA, documents

AUTO = ("auto.pulumi.com", "v1alpha1")
TOKEN = "s3cr3t-output-5e0b7"


def project(colour_default: str = "red") -> str:
    return yaml.safe_dump({
        "name": "wsprog", "runtime": "yaml",
        "config": {"colour": {"type": "string", "default": colour_default}},
        "resources": {"note": {"type": "pulumi:index:Stash", "properties": {"input": "${colour}"}}},
        "outputs": {"colour": "${note.input}", "token": {"fn::secret": TOKEN}}}, sort_keys=False)


class Auto:
    def __init__(self, stacks):
        self.stacks, self.namespace = stacks, stacks.namespace
        self.custom = stacks.custom

    def workspace(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(*AUTO, self.namespace, "workspaces", {
            "apiVersion": "/".join(AUTO), "kind": "Workspace", "metadata": {"name": name}, "spec": spec})

    def env(self) -> list[dict[str, Any]]:
        return [{"name": "PULUMI_BACKEND_URL", "value": self.stacks.backend},
                {"name": "PULUMI_CONFIG_PASSPHRASE",
                 "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "passphrase"}}}]

    def update(self, workspace: str, kind: str, **spec: Any) -> str:
        name = unique(kind)
        self.custom.create_namespaced_custom_object(*AUTO, self.namespace, "updates", {
            "apiVersion": "/".join(AUTO), "kind": "Update", "metadata": {"name": name},
            "spec": {"workspaceName": workspace, "stackName": "dev", "type": kind, **spec}})
        return name

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(*AUTO, self.namespace, plural, name)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def wait(self, plural: str, name: str, predicate, timeout: float = 90, what: str = "") -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check():
            last["obj"] = self.get(plural, name)
            return last["obj"] if last["obj"] is not None and predicate(last["obj"]) else None

        try:
            return processes.wait_until(check, timeout, f"{plural} {name}: {what}", interval=0.3,
                                        log=self.stacks.operator.log)
        except processes.ProcessError as error:
            raise AssertionError(f"{error}; last status: {(last.get('obj') or {}).get('status')}") from None

    def ready(self, name: str, timeout: float = 90) -> dict[str, Any]:
        return self.wait("workspaces", name, lambda o: _true(o, "Ready") and
                         o["status"].get("observedGeneration") == o["metadata"]["generation"], timeout, "Ready")

    def complete(self, name: str, timeout: float = 120) -> dict[str, Any]:
        return self.wait("updates", name, lambda o: _true(o, "Complete"), timeout, "Complete")

    def events(self, kind: str, name: str, reason: str | None = None) -> list[client.CoreV1Event]:
        found = self.stacks.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name},involvedObject.kind={kind}")
        return [e for e in found.items if reason is None or e.reason == reason]


def _true(obj: dict[str, Any], ctype: str) -> bool:
    return (condition(obj, ctype) or {}).get("status") == "True"


def _reasons(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["status"]["conditions"]}


@pytest.fixture
def auto(stacks) -> Auto:
    return Auto(stacks)


def _git_workspace(auto: Auto, local_platform, name: str, **extra: Any) -> str:
    repo = f"{auto.namespace}-{name}"
    url = local_platform.git.create(repo, {"README.md": "x\n", "infra/Pulumi.yaml": project()})
    auto.workspace(name, {"git": {"url": url, "ref": "main", "dir": "infra"}, "env": auto.env(),
                          "stacks": [{"name": "dev", "config": [{"key": "colour", "value": "blue"}]}], **extra})
    return url


def test_workspace_from_git_and_updates_of_each_kind(auto, local_platform):
    _git_workspace(auto, local_platform, "ws", image="pulumi/pulumi:3.202.0-nonroot",
                   resources={"requests": {"memory": "512Mi"}})
    ws = auto.ready("ws")
    assert condition(ws, "Ready")["reason"] == "Succeeded"
    assert ws["status"]["ignoredFields"] == ["spec.image", "spec.resources"]
    assert ws["spec"]["securityProfile"] == "restricted" and ws["spec"]["serviceAccountName"] == "default"
    assert ws["status"]["pulumiVersion"].startswith("3.")
    processes.wait_until(lambda: auto.events("Workspace", "ws", "NotApplicable"), 15, "NotApplicable Event")
    assert len(auto.events("Workspace", "ws", "NotApplicable")) == 1

    # up: outputs in the Update's own immutable Secret, the secret one marked as PKO marks it.
    up = auto.update("ws", "up", message="first up")
    done = auto.complete(up)
    assert _reasons(done) == {"Progressing": ("False", "Complete"), "Failed": ("False", "UpdateSucceeded"),
                              "Complete": ("True", "Updated")}
    status = done["status"]
    assert status["outputs"] == f"{up}-stack-outputs" and status["message"] == "first up"
    assert status["observedGeneration"] == 1 and status["startTime"] <= status["endTime"]
    assert status["projectInfo"] == {"name": "wsprog", "runtime": "yaml"}
    secret = auto.stacks.core.read_namespaced_secret(f"{up}-stack-outputs", auto.namespace)
    assert {k: base64.b64decode(v).decode() for k, v in secret.data.items()} == {
        "colour": '"blue"', "token": f'"{TOKEN}"'}
    assert secret.immutable is True
    assert json.loads(secret.metadata.annotations["pulumi.com/secrets"]) == ["token"]
    assert secret.metadata.labels == {"auto.pulumi.com/component": "update", "auto.pulumi.com/update-name": up}
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.owner_references] == [
        ("Update", up, done["metadata"]["uid"])]
    processes.wait_until(lambda: auto.events("Update", up, "UpdateSucceeded"), 15, "UpdateSucceeded Event")
    assert [e.message for e in auto.events("Update", up, "UpdateSucceeded")] == ["Updated stack 'dev'"]
    assert TOKEN not in json.dumps(done) + auto.stacks.operator.log_text()

    # preview expecting no changes: none.
    preview = auto.complete(auto.update("ws", "preview", expectNoChanges=True))
    assert _reasons(preview)["Failed"] == ("False", "UpdateSucceeded")
    assert "outputs" not in preview["status"]

    # A new generation of the Workspace (another colour): fetched again; now the same preview fails.
    auto.custom.patch_namespaced_custom_object(*AUTO, auto.namespace, "workspaces", "ws", {"spec": {"stacks": [
        {"name": "dev", "config": [{"key": "colour", "value": "green"}]}]}})
    auto.wait("workspaces", "ws", lambda o: o["status"].get("observedGeneration") == 2 and _true(o, "Ready"), 90,
              "generation 2 Ready")
    changed = auto.complete(auto.update("ws", "preview", expectNoChanges=True))
    assert _reasons(changed)["Failed"] == ("True", "Unknown")
    assert changed["status"]["message"].startswith("preview failed:"), changed["status"]

    refresh = auto.complete(auto.update("ws", "refresh"))
    assert _reasons(refresh)["Failed"] == ("False", "UpdateSucceeded")
    destroy = auto.update("ws", "destroy")
    assert _reasons(auto.complete(destroy))["Failed"] == ("False", "UpdateSucceeded")
    processes.wait_until(lambda: auto.events("Update", destroy, "UpdateSucceeded"), 15, "UpdateSucceeded Event")
    assert [e.message for e in auto.events("Update", destroy, "UpdateSucceeded")] == ["Destroyed stack 'dev'"]
    # Nothing left in the stack: a preview expecting no changes would now create the Stash again.
    again = auto.complete(auto.update("ws", "up", expectNoChanges=True))
    assert _reasons(again)["Failed"] == ("True", "Unknown")


def test_ttl_after_completed_deletes_the_update_and_its_outputs(auto, local_platform):
    _git_workspace(auto, local_platform, "ttl")
    auto.ready("ttl")
    name = auto.update("ttl", "up", ttlAfterCompleted="3s")
    done = auto.complete(name)
    assert done["status"]["outputs"] == f"{name}-stack-outputs"
    processes.wait_until(lambda: auto.get("updates", name) is None, 30, "Update deleted after its ttl")
    expired = processes.wait_until(lambda: auto.events("Update", name, "UpdateExpired"), 30, "UpdateExpired Event")
    assert expired[0].message == "ttl expired and was deleted"

    def secret_gone() -> bool:
        try:
            auto.stacks.core.read_namespaced_secret(f"{name}-stack-outputs", auto.namespace)
        except client.ApiException as error:
            return error.status == 404
        return False

    processes.wait_until(secret_gone, 60, "outputs Secret collected with its Update")


def test_update_naming_a_missing_workspace_waits_for_it(auto, local_platform):
    name = auto.update("later", "up")
    waiting = auto.wait("updates", name, lambda o: (condition(o, "Progressing") or {}).get("reason")
                        == "WorkspaceNotFound", 30, "WorkspaceNotFound")
    assert _reasons(waiting) == {"Progressing": ("False", "WorkspaceNotFound"), "Failed": ("False", "Progressing"),
                                 "Complete": ("False", "Progressing")}
    rv = waiting["metadata"]["resourceVersion"]
    time.sleep(3)
    assert auto.get("updates", name)["metadata"]["resourceVersion"] == rv, "no status writes while it waits"
    _git_workspace(auto, local_platform, "later")
    assert _reasons(auto.complete(name))["Failed"] == ("False", "UpdateSucceeded")


def test_invalid_workspaces_name_the_field_and_the_fix(auto):
    auto.workspace("nosource", {"env": auto.env()})
    auto.workspace("pathcfg", {"local": {"dir": "/nowhere"}, "stacks": [
        {"name": "dev", "config": [{"key": "token", "valueFrom": {"path": "/var/run/secrets/pulumi/token"}}]}]})
    for name, words in (("nosource", "spec: no program source (fix: give one of spec.git, spec.flux or spec.local)"),
                        ("pathcfg", "spec.stacks[0].config[0].valueFrom.path: '/var/run/secrets/pulumi/token'")):
        obj = auto.wait("workspaces", name, lambda o: _true(o, "Stalled"), 30, "Stalled")
        assert condition(obj, "Ready")["status"] == "False"
        assert condition(obj, "Stalled")["reason"] == "SpecInvalid" and words in condition(obj, "Stalled")["message"]
    update = auto.update("nosource", "up")
    assert (condition(auto.wait("updates", update, lambda o: condition(o, "Progressing") and
                                condition(o, "Progressing")["status"] == "False", 30), "Progressing")["reason"]
            == "WorkspaceNotReady")
    bad = auto.update("nosource", "deploy")
    failed = auto.complete(bad, 30)
    assert _reasons(failed)["Failed"] == ("True", "SpecInvalid")
    assert "spec.type: 'deploy' is not an operation" in failed["status"]["message"]


def test_failing_program_with_continue_on_error(auto, local_platform):
    repo = f"{auto.namespace}-broken"
    url = local_platform.git.create(repo, {"Pulumi.yaml": yaml.safe_dump({
        "name": "broken", "runtime": "yaml",
        "resources": {"missing": {"type": "pulumi:pulumi:StackReference",
                                  "properties": {"name": "organization/nothing/here"}},
                      "kept": {"type": "pulumi:index:Stash", "properties": {"input": "independent"}}}})})
    auto.workspace("broken", {"git": {"url": url, "ref": "main"}, "env": auto.env()})
    auto.ready("broken")
    name = auto.update("broken", "up", continueOnError=True)
    done = auto.complete(name)
    assert _reasons(done) == {"Progressing": ("False", "Complete"), "Failed": ("True", "Unknown"),
                              "Complete": ("True", "Updated")}
    assert done["status"]["message"].startswith("up failed:") and "unknown stack" in done["status"]["message"]
    assert "outputs" not in done["status"]
    failed = processes.wait_until(lambda: auto.events("Update", name, "UpdateFailed"), 15, "UpdateFailed Event")
    assert "Failed to update stack 'dev'" in failed[0].message
    # The resource that does not depend on the failed one was still created.
    state = Path(auto.stacks.backend.removeprefix("file://")) / ".pulumi" / "stacks" / "broken" / "dev.json"
    assert "pulumi:index:Stash::kept" in state.read_text()


def test_restart_runs_no_completed_update_again_and_aborts_an_interrupted_one(auto, local_platform, operator):
    _git_workspace(auto, local_platform, "rs")
    auto.ready("rs")
    done = auto.complete(auto.update("rs", "up"))
    name = done["metadata"]["name"]
    operator.stop()
    try:
        # An Update its operator died running: Progressing=True with nobody running it.
        interrupted = auto.update("rs", "up")
        auto.custom.patch_namespaced_custom_object_status(*AUTO, auto.namespace, "updates", interrupted, {"status": {
            "conditions": [{"type": "Progressing", "status": "True", "reason": "Progressing", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    finally:
        operator.start()
    aborted = auto.complete(interrupted, 60)
    assert _reasons(aborted) == {"Progressing": ("False", "Failed"), "Failed": ("True", "Aborted"),
                                 "Complete": ("True", "Failed")}
    time.sleep(3)
    after = auto.get("updates", name)
    assert after["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"]
    assert len(auto.events("Update", name, "UpdateSucceeded")) == 1
    assert not auto.events("Update", interrupted, "UpdateSucceeded")


def _apply_strict(api: client.ApiClient, obj: dict[str, Any], plural: str) -> None:
    group_version, namespace, name = obj["apiVersion"], obj["metadata"]["namespace"], obj["metadata"]["name"]
    base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    request = api.param_serialize(
        "PATCH", f"{base}/namespaces/{namespace}/{plural}/{name}",
        query_params=[("fieldManager", "pko-manifests"), ("fieldValidation", "Strict"), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=json.dumps(obj), auth_settings=["BearerToken"])
    response = api.call_api(*request)
    response.read()
    api.response_deserialize(response, {"200": "object", "201": "object"})


@pytest.mark.common_word_secret  # issue-801's passphrase is the literal "test"
def test_pko_workspace_manifests_apply_strictly_and_say_what_applies(auto, kube_client):
    files = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.yaml")
                   if "kind: Workspace" in p.read_text())
    assert files == ["examples/custom-workspace/workspace.yaml", "operator/e2e/testdata/issue-801/manifests.yaml",
                     "operator/e2e/testdata/issue-801/step2/manifests.yaml"]
    outcomes = {}
    for file in files:
        for doc in documents(file):
            if (doc["apiVersion"], doc["kind"]) not in (("/".join(AUTO), "Workspace"), ("v1", "Secret")):
                continue
            doc["metadata"]["namespace"] = auto.namespace
            try:
                _apply_strict(kube_client, doc, "workspaces" if doc["kind"] == "Workspace" else "secrets")
                outcomes[file] = "applied"
            except client.ApiException as error:
                outcomes[file] = f"{error.status} {json.loads(error.body)['message']}"
    # PKO's own example names spec.git.revision, a field PKO's schema does not have: its CRD refuses it too.
    assert ".spec.git.revision: field not declared in schema" in outcomes["examples/custom-workspace/workspace.yaml"]
    assert outcomes["operator/e2e/testdata/issue-801/manifests.yaml"] == "applied"
    assert outcomes["operator/e2e/testdata/issue-801/step2/manifests.yaml"] == "applied"
    # Its state lives on a volume of PKO's pod: named, never run on the operator's host.
    ws = auto.wait("workspaces", "issue-801", lambda o: _true(o, "Stalled") and
                   o["status"].get("observedGeneration") == o["metadata"]["generation"], 30, "Stalled")
    assert condition(ws, "Stalled")["reason"] == "SpecInvalid"
    assert "file:// backend 'file:///state/' is inside the volume 'state'" in condition(ws, "Stalled")["message"]
    assert ws["status"]["ignoredFields"] == ["spec.image", "spec.podTemplate"]
