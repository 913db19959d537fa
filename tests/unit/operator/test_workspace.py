"""The pod executor's pure parts: the workspace pod, references left to the pod, its source archive, flags."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest

from strata_operator.main import build_parser, workspace_settings
from strata_operator.podengine import source_archive
from strata_operator.resolve import resolve_stack
from strata_operator.spec import parse_stack_spec
from strata_operator.workspace import (MountedRefs, RefUnavailable, WorkspacePodArgs, build_workspace_pod,
                                       pod_problem, resolve_in_workspace, spec_hash)

OWNER = {"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": "app", "uid": "u-1", "controller": True}
PKO_STATE_TEMPLATE = {"spec": {
    "env": [{"name": "LOG", "value": "debug"}],
    "resources": {"limits": {"memory": "512Mi"}},
    "podTemplate": {"metadata": {"labels": {"team": "alpha"}, "annotations": {"note": "x"}},
                    "spec": {"containers": [{"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"}]},
                                            {"name": "sidecar", "image": "busybox"}],
                             "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}],
                             "nodeSelector": {"pool": "updates"}}}}}


def _pod(**overrides) -> dict:
    args = {"namespace": "team", "stack": "app", "owner": OWNER, "image": "strata:1", "service_account": "app-workspace",
            **overrides}
    return build_workspace_pod(WorkspacePodArgs(**args))


def test_the_workspace_pod_runs_the_agent_hardened_under_the_stacks_service_account():
    pod = _pod(node_selector={"type": "real"}, tolerations=({"key": "k", "operator": "Exists", "effect": "NoSchedule"},))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert pod["metadata"]["name"] == "app-workspace" and pod["metadata"]["ownerReferences"] == [OWNER]
    assert pod["metadata"]["labels"] == {"auto.pulumi.com/component": "workspace",
                                         "auto.pulumi.com/workspace-name": "app"}
    assert spec["serviceAccountName"] == "app-workspace" and spec["nodeSelector"] == {"type": "real"}
    assert container["command"] == ["python", "-m", "strata_operator.agent"]
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert {"name": "agent", "secret": {"secretName": "app-workspace-agent", "defaultMode": 0o440}} in spec["volumes"]


def test_pko_workspace_template_merges_into_the_pod():
    pod = _pod(template=PKO_STATE_TEMPLATE)
    spec = pod["spec"]
    container = spec["containers"][0]
    assert [c["name"] for c in spec["containers"]] == ["pulumi", "sidecar"]
    assert {"name": "state", "mountPath": "/state"} in container["volumeMounts"]
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "state"}} in spec["volumes"]
    assert {"name": "LOG", "value": "debug"} in container["env"]
    assert container["resources"] == {"limits": {"memory": "512Mi"}}
    assert spec["nodeSelector"] == {"pool": "updates"}
    assert pod["metadata"]["labels"]["team"] == "alpha" and pod["metadata"]["annotations"]["note"] == "x"


def test_the_spec_hash_changes_with_what_the_pod_runs_and_only_then():
    assert spec_hash(_pod()) == spec_hash(_pod())
    assert spec_hash(_pod()) != spec_hash(_pod(template=PKO_STATE_TEMPLATE))
    assert spec_hash(_pod()) != spec_hash(_pod(mounted=MountedRefs(env={"A": {"secret": {"name": "s", "key": "a"}}})))


def _resolve(raw: dict, mount: bool):
    secrets = {"pulumi": {"passphrase": "p4ss", "token": "t0k"}, "team-env": {"X": "1"}}

    async def read_secret(namespace, name):
        if mount:
            raise AssertionError(f"the operator read Secret {name!r}")
        return secrets.get(name)

    async def read_configmap(namespace, name):
        return {"REGION": "eu"} if name == "settings" else None

    return asyncio.run(resolve_stack(parse_stack_spec(raw, "team"), "team", read_secret, read_configmap,
                                     mount_secrets=mount))


STACK_WITH_REFS = {
    "stack": "dev", "programRef": {"name": "p"}, "backend": "file:///state", "envs": ["settings"],
    "envSecrets": ["team-env"],
    "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi", "key": "passphrase"}},
                "FROM_POD": {"type": "Env", "env": {"name": "NODE_REGION"}},
                "PLAIN": {"type": "Literal", "literal": {"value": "v"}}},
    "secretsRef": {"app:token": {"type": "Secret", "secret": {"name": "pulumi", "key": "token"}}},
}


def test_with_the_pod_executor_the_operator_reads_no_secret_and_the_pod_resolves_them(monkeypatch):
    resolved = _resolve(STACK_WITH_REFS, mount=True)
    assert resolved.env == {"REGION": "eu", "PLAIN": "v", "PULUMI_BACKEND_URL": "file:///state"}
    assert resolved.secret_config == {}
    mounted = resolved.mounted
    assert mounted.env_from == ("team-env",)
    assert mounted.env == {"PULUMI_CONFIG_PASSPHRASE": {"secret": {"name": "pulumi", "key": "passphrase"}},
                           "FROM_POD": {"env": "NODE_REGION"}}
    pod = _pod(mounted=mounted)
    container = pod["spec"]["containers"][0]
    assert {"name": "STRATA_ENV__PULUMI_CONFIG_PASSPHRASE",
            "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "passphrase"}}} in container["env"]
    assert {"name": "STRATA_CONFIG__0", "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "token"}}} \
        in container["env"]
    assert container["envFrom"] == [{"prefix": "STRATA_ENVFROM_0__", "secretRef": {"name": "team-env"}}]
    # What the kubelet gives the pod, as the agent reads it: the same values the process executor gets.
    environ = {"STRATA_ENV__PULUMI_CONFIG_PASSPHRASE": "p4ss", "STRATA_CONFIG__0": "t0k", "STRATA_ENVFROM_0__X": "1",
               "NODE_REGION": "eu-west"}
    env, config, secret = resolve_in_workspace(mounted, environ, resolved.env)
    # PKO v2: an Env ref reads the workspace's environment, as the process executor reads the operator's.
    monkeypatch.setenv("NODE_REGION", "eu-west")
    process = _resolve(STACK_WITH_REFS, mount=False)
    assert config == process.secret_config == {"app:token": "t0k"}
    assert env == process.env and env["FROM_POD"] == "eu-west"
    assert {"PULUMI_CONFIG_PASSPHRASE", "X"} <= secret and "PLAIN" not in secret


def test_a_ref_the_workspace_cannot_resolve_names_the_field():
    mounted = MountedRefs(env={"FROM_POD": {"env": "MISSING"}}, secret_config={"app:k": {"file": "/nope"}})
    with pytest.raises(RefUnavailable, match=r"spec\.envRefs\.FROM_POD\.env\.name"):
        resolve_in_workspace(mounted, {}, {})


def test_a_missing_secret_names_the_stack_field_that_refers_to_it():
    mounted = MountedRefs(env={"PULUMI_CONFIG_PASSPHRASE": {"secret": {"name": "pulumi", "key": "passphrase"}}})
    pod = {"status": {"containerStatuses": [{"name": "pulumi", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "pulumi" not found'}}}]}}
    problem = pod_problem(pod, mounted)
    assert "CreateContainerConfigError" in problem and "spec.envRefs.PULUMI_CONFIG_PASSPHRASE" in problem
    assert pod_problem({"status": {"phase": "Pending"}}, mounted) == ""


def test_the_source_archive_depends_on_content_only(tmp_path: Path):
    for copy in ("a", "b"):
        root = tmp_path / copy
        (root / "sub").mkdir(parents=True)
        (root / "Pulumi.yaml").write_text("name: x\nruntime: yaml\n")
        (root / "sub" / "data.txt").write_text("data")
        (root / ".git").mkdir()
        (root / ".git" / "HEAD").write_text(copy)
    first, second = source_archive(tmp_path / "a"), source_archive(tmp_path / "b")
    assert first[1] == second[1]
    names = tarfile.open(fileobj=io.BytesIO(first[0])).getnames()
    assert "Pulumi.yaml" in names and "sub/data.txt" in names and not any(".git" in n for n in names)


def test_executor_flags():
    assert workspace_settings(build_parser().parse_args([])) is None
    with pytest.raises(SystemExit, match="--workspace-image"):
        workspace_settings(build_parser().parse_args(["--executor", "pod"]))
    settings = workspace_settings(build_parser().parse_args([
        "--executor", "pod", "--workspace-image", "img", "--workspace-node-selector", "type=real",
        "--workspace-toleration", "dedicated=updates:NoSchedule", "--workspace-toleration", "spot:NoExecute"]))
    assert settings.node_selector == {"type": "real"}
    assert settings.tolerations == ({"key": "dedicated", "operator": "Equal", "value": "updates", "effect": "NoSchedule"},
                                    {"key": "spot", "operator": "Exists", "effect": "NoExecute"})
    with pytest.raises(SystemExit, match="KEY=VALUE:EFFECT"):
        workspace_settings(build_parser().parse_args(["--executor", "pod", "--workspace-image", "i",
                                                      "--workspace-toleration", "bad"]))


def test_a_directory_of_the_workspace_pod_is_a_source_for_the_pod_executor_only():
    from strata_operator.spec import SpecInvalid, local_source_issue

    template = {"spec": {"local": {"dir": "/program"}}}
    spec = parse_stack_spec({"stack": "dev", "workspaceTemplate": template}, "team")
    assert spec.source_kind == "local" and spec.local_dir == "/program"
    assert local_source_issue(spec, in_workspace_pods=True) is None
    issue = local_source_issue(spec, in_workspace_pods=False)
    assert issue.path == "spec.workspaceTemplate.spec.local.dir" and "--executor pod" in issue.fix
    # Named sources come first (PKO's order), the local directory last.
    with_program = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "workspaceTemplate": template}, "t")
    assert with_program.source_kind == "program"
    with pytest.raises(SpecInvalid, match=r"spec.workspaceTemplate.spec.local.dir: 'program' is not an absolute path"):
        parse_stack_spec({"stack": "dev", "workspaceTemplate": {"spec": {"local": {"dir": "program"}}}}, "team")
