"""What PKO accepts and Strata used to refuse, through the real operator: a Flux source kind the operator does
not watch (ExternalArtifact), several sources, GitHub App auth, a failing preview, runProgram on destroy."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import tarfile
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from strata_components.local import processes

from .conftest import MIN_RESYNC_SECONDS, condition, has_condition, stash_program, stash_project

FLUX = ("source.toolkit.fluxcd.io", "v1")


@pytest.fixture
def artifact_server(tmp_path: Path):
    """A plain HTTP server for artifacts, as a third-party controller behind an ExternalArtifact would run."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def publish(root: Path, base_url: str, name: str, files: dict[str, str]) -> dict[str, str]:
    """A tar.gz artifact of `files` under `root`; returns its Flux `status.artifact`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (root / name).write_bytes(buffer.getvalue())
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    return {"path": name, "url": f"{base_url}/{name}", "revision": f"sha256:{digest}", "digest": f"sha256:{digest}",
            "lastUpdateTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def set_artifact(stacks, name: str, artifact: dict[str, str]) -> None:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stacks.custom.patch_namespaced_custom_object_status(*FLUX, stacks.namespace, "externalartifacts", name, {
        "status": {"artifact": artifact, "conditions": [{
            "type": "Ready", "status": "True", "reason": "Succeeded", "message": "published",
            "lastTransitionTime": now, "observedGeneration": 1}]}})


def test_an_external_artifact_source_runs_and_is_polled_for_new_revisions(stacks, artifact_server):
    """PKO takes any Flux source kind with an artifact; ExternalArtifact is one the operator does not watch."""
    root, base_url = artifact_server
    stacks.custom.create_namespaced_custom_object(*FLUX, stacks.namespace, "externalartifacts", {
        "apiVersion": "/".join(FLUX), "kind": "ExternalArtifact", "metadata": {"name": "app"}, "spec": {}})
    first = publish(root, base_url, "v1.tar.gz", {"deploy/Pulumi.yaml": stash_project("external", colour="blue")})
    set_artifact(stacks, "app", first)
    stacks.create("external", stacks.spec(resyncFrequencySeconds=MIN_RESYNC_SECONDS, fluxSource={
        "sourceRef": {"apiVersion": "/".join(FLUX), "kind": "ExternalArtifact", "name": "app"}, "dir": "/deploy"}))
    obj = stacks.wait_ready("external", 90)
    assert obj["status"]["outputs"] == {"colour": "blue"}
    assert obj["status"]["lastUpdate"]["lastSuccessfulCommit"] == first["revision"]

    second = publish(root, base_url, "v2.tar.gz", {"deploy/Pulumi.yaml": stash_project("external", colour="red")})
    set_artifact(stacks, "app", second)
    # No watch event reaches the Stack for this kind: the resync poll finds the new revision.
    obj = stacks.wait("external", lambda o: ((o.get("status") or {}).get("lastUpdate") or {}).get(
        "lastSuccessfulCommit") == second["revision"], 60, "the new ExternalArtifact revision deployed")
    assert obj["status"]["outputs"] == {"colour": "red"}


def test_several_sources_use_pkos_order_and_say_which(stacks):
    """PKO prefers git, then Flux, then a Program: here the Flux source is used (and missing), the Program not."""
    stacks.program("ignored", stash_program(greeting="hello"))
    stacks.create("both", stacks.spec(programRef={"name": "ignored"}, fluxSource={
        "sourceRef": {"apiVersion": "/".join(FLUX), "kind": "GitRepository", "name": "absent"}}))
    obj = stacks.wait_stalled("both", "SourceUnavailable")
    assert "GitRepository 'absent' not found" in condition(obj, "Stalled")["message"]
    assert obj["status"]["ignoredFields"] == ["programRef"]
    assert stacks.runs("both") == 0
    messages = [e.message for e in stacks.events("both", "StackConfigInvalid")]
    assert any("spec.fluxSource is used (PKO's order: git, Flux, Program); ignored: spec.programRef" in m
               for m in messages), messages


def test_github_app_auth_is_tried_and_its_failure_names_the_field_never_the_key(stacks, local_platform):
    """The App's credentials are exchanged at api.github.com for an installation token: refused (or, here,
    unreachable), the Stack stalls naming spec.gitAuth.githubApp; the private key appears nowhere."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    stacks.secret("github-app", {"appID": "12345", "installationID": "67890", "privateKey": pem})
    ref = {"type": "Secret", "secret": {"name": "github-app"}}
    url = local_platform.git.create(f"{stacks.namespace}-app", {"Pulumi.yaml": stash_project("app", colour="blue")})
    stacks.create("app", stacks.spec(projectRepo=url, branch="main", gitAuth={"githubApp": {
        "appID": {**ref, "secret": {"name": "github-app", "key": "appID"}},
        "installationID": {**ref, "secret": {"name": "github-app", "key": "installationID"}},
        "privateKey": {**ref, "secret": {"name": "github-app", "key": "privateKey"}}}}))
    obj = stacks.wait_stalled("app", "SourceUnavailable", 90)
    message = condition(obj, "Stalled")["message"]
    assert message.startswith("spec.gitAuth.githubApp: "), message
    assert "api.github.com" in message and "fix:" in message
    body = pem.splitlines()[1]
    events = " ".join(e.message for e in stacks.events("app"))
    assert body not in str(obj) and body not in events and body not in stacks.operator.log_text()
    assert base64.b64encode(pem.encode()).decode()[:40] not in str(obj)
    assert stacks.runs("app") == 0


def test_a_failing_preview_is_reconciling_preview_failed(stacks):
    """PKO v2: a preview Stack whose preview fails says PreviewFailed while it retries."""
    program = stash_program(greeting="hello")
    program["outputs"]["missing"] = "${nosuch.output}"  # an undefined resource: the preview fails
    stacks.program("broken", program)
    stacks.create("preview", stacks.spec(programRef={"name": "broken"}, preview=True))
    obj = stacks.wait("preview", lambda o: has_condition(o, "Reconciling", "PreviewFailed"), 90, "PreviewFailed")
    assert condition(obj, "Reconciling")["message"].startswith("preview failed (1 attempt(s)): ")
    assert obj["status"]["lastUpdate"]["type"] == "preview" and obj["status"]["lastUpdate"]["state"] == "failed"


def test_run_program_makes_the_destroy_run_the_program(stacks):
    """spec.runProgram (pulumi destroy --run-program): with it the destroy runs the program, so a program that
    no longer loads blocks it; without it the same destroy works from the state alone."""
    broken = stash_program(greeting="hello")
    broken["outputs"]["missing"] = "${nosuch.output}"  # an undefined resource: the program does not load
    for name, run_program in (("without", False), ("with", True)):
        stacks.program(name, stash_program(greeting="hello"))
        stacks.create(name, stacks.spec(programRef={"name": name}, destroyOnFinalize=True, runProgram=run_program))
    for name in ("without", "with"):
        stacks.wait_ready(name, 90)
        stacks.replace_program(name, broken)
        stacks.wait(name, lambda o: ((o.get("status") or {}).get("lastUpdate") or {}).get("state") == "failed", 90,
                    "the broken program's update failed")
        stacks.delete(name)
    processes.wait_until(lambda: stacks.get("without") is None, 90, "Stack without finalized")
    blocked = stacks.wait("with", lambda o: "destroy failed" in (condition(o, "Reconciling") or {}).get("message", ""),
                          90, "destroy with runProgram fails on the broken program")
    assert blocked["metadata"].get("deletionTimestamp")
    stacks.replace_program("with", stash_program(greeting="hello"))  # fixed: the retried destroy goes through
    processes.wait_until(lambda: stacks.get("with") is None, 120, "Stack with finalized once the program loads")


def test_a_destroy_that_cannot_run_in_a_terminating_namespace_says_so(stacks):
    """PKO v2's NamespaceTerminating: the namespace is going and the destroy's Secret already went with it;
    the Stack keeps its finalizer (no silent orphaning) and says how to release it."""
    stacks.secret("app", {"token": "kept-for-destroy"})
    stacks.program("doomed", stash_program(greeting="hello"))
    stacks.create("doomed", stacks.spec(programRef={"name": "doomed"}, destroyOnFinalize=True, envRefs={
        **stacks.spec()["envRefs"], "APP_TOKEN": {"type": "Secret", "secret": {"name": "app", "key": "token"}}}))
    stacks.wait_ready("doomed", 90)
    stacks.core.delete_namespaced_secret("app", stacks.namespace)
    stacks.core.delete_namespace(stacks.namespace)
    obj = stacks.wait_stalled("doomed", "NamespaceTerminating", 60)
    message = condition(obj, "Stalled")["message"]
    # What the destroy could not read: the Secret that went, or every one, once the namespace's deletion took the
    # operator's Roles there (it holds Secret rights only in the namespaces it serves).
    assert f"namespace {stacks.namespace!r} is terminating" in message
    assert "spec.envRefs.APP_TOKEN" in message or "only in the namespaces it serves" in message, message
    assert f"kubectl patch stack doomed -n {stacks.namespace}" in message
    assert "finalizer.stack.pulumi.com" in obj["metadata"]["finalizers"]
    stacks.patch("doomed", {"metadata": {"finalizers": []}})  # released as the message says
    processes.wait_until(lambda: stacks.get("doomed") is None, 30, "Stack released")
