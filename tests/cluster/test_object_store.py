"""The object store: a Stack with an s3:// backend runs from the host and from a workspace pod; its
credentials stay out of argv and logs; wrong credentials and a missing bucket are named as such."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.local import objectstore

from .conftest import object_store_env_refs, wait_stack_ready

PROJECT = "name: {name}\nruntime: yaml\nresources:\n  note:\n    type: pulumi:index:Stash\n    properties:\n" \
          "      input: {where}\noutputs:\n  where: ${{note.input}}\n"


def _pulumi(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["pulumi", *args, "--non-interactive"], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def _s3_env(pulumi_env: dict, platform, credentials_file: Path, bucket: str = objectstore.DEFAULT_BUCKET) -> dict:
    return {**pulumi_env, "PULUMI_BACKEND_URL": platform.s3_backend_url(bucket),
            "AWS_SHARED_CREDENTIALS_FILE": str(credentials_file), "AWS_REGION": objectstore.REGION}


def _project(tmp_path: Path, where: str) -> tuple[Path, str]:
    name = f"s3-{where}-{uuid.uuid4().hex[:6]}"
    (tmp_path / "Pulumi.yaml").write_text(PROJECT.format(name=name, where=where))
    return tmp_path, name


def test_a_stack_with_an_s3_backend_runs_from_the_host(platform, pulumi_env, tmp_path):
    env = _s3_env(pulumi_env, platform, platform.object_store_credentials)
    cwd, name = _project(tmp_path, "host")
    for args in (("stack", "init", "dev"), ("up", "--yes", "--skip-preview")):
        result = _pulumi(env, cwd, *args)
        assert result.returncode == 0, result.stdout + result.stderr
    assert _pulumi(env, cwd, "stack", "output", "where").stdout.strip() == "host"
    credentials = objectstore.read_credentials(platform.object_store_credentials)
    assert objectstore.object_exists(platform.object_store_port(), objectstore.DEFAULT_BUCKET,
                                     f".pulumi/stacks/{name}/dev.json", credentials)


def test_the_credentials_stay_out_of_process_listings_and_logs(platform):
    access_key, secret_key = objectstore.read_credentials(platform.object_store_credentials)
    # ww: whole command lines (ps cuts them at 80 columns otherwise, before MinIO's long path ends).
    listing = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=True).stdout
    assert "minio server" in listing and secret_key not in listing and access_key not in listing
    for log in platform.log_dir.glob("*.log"):
        assert secret_key not in log.read_text(errors="replace"), log


def test_wrong_credentials_and_a_missing_bucket_are_named(platform, pulumi_env, tmp_path):
    wrong = tmp_path / "wrong-credentials"
    access_key, _ = objectstore.read_credentials(platform.object_store_credentials)
    wrong.write_text(f"[default]\naws_access_key_id = {access_key}\naws_secret_access_key = not-the-secret\n")
    with pytest.raises(objectstore.ObjectStoreError, match=r"refused the credentials for bucket 'pulumi-state' "
                                                          r"\(.*\); fix: use the platform's credentials"):
        objectstore.check_bucket(platform.object_store_port(), objectstore.DEFAULT_BUCKET,
                                 objectstore.read_credentials(wrong), wrong)
    (tmp_path / "p").mkdir()
    cwd, _ = _project(tmp_path / "p", "nowhere")
    refused = _pulumi(_s3_env(pulumi_env, platform, wrong), cwd, "stack", "init", "dev")
    # Pulumi checks the bucket with HeadBucket, whose answer has no body: the status is all it can say.
    assert refused.returncode != 0 and any(word in refused.stderr for word in ("SignatureDoesNotMatch", "Forbidden",
                                                                                "403")), refused.stderr

    with pytest.raises(objectstore.ObjectStoreError, match=r"bucket 'no-such-bucket' does not exist .*fix: create it "
                                                          r"\(strata local bucket no-such-bucket\)"):
        objectstore.check_bucket(platform.object_store_port(), "no-such-bucket",
                                 objectstore.read_credentials(platform.object_store_credentials))
    missing = _pulumi(_s3_env(pulumi_env, platform, platform.object_store_credentials, "no-such-bucket"), cwd,
                      "stack", "init", "dev")
    assert missing.returncode != 0 and any(word in missing.stderr for word in ("NoSuchBucket", "NotFound", "404")), \
        missing.stderr


def test_a_stack_with_an_s3_backend_runs_from_a_workspace_pod(platform, kube_client, pod_operator):
    namespace = pod_operator
    stacks = platform.state / "objectstore" / "data" / objectstore.DEFAULT_BUCKET / ".pulumi" / "stacks"
    before = set(stacks.rglob("dev.json"))  # MinIO keeps each object as a directory of that name
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    env_refs = object_store_env_refs(core, platform, namespace)
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", {
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "app"},
        "program": {"resources": {"note": {"type": "pulumi:index:Stash", "properties": {"input": "pod"}}},
                    "outputs": {"where": "${note.input}"}}})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"},
        "spec": {"stack": "dev", "programRef": {"name": "app"}, "backend": platform.s3_backend_url(),
                 "envRefs": env_refs}})

    stack = wait_stack_ready(custom, namespace, "app", 300, "the s3-backed Stack Ready")
    assert stack["status"]["outputs"]["where"] == "pod"
    pod = core.read_namespaced_pod("app-workspace", namespace)
    assert pod.spec.node_name.startswith("real-")
    assert len(set(stacks.rglob("dev.json")) - before) == 1  # its state, in the object store
