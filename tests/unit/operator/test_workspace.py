"""The pod executor's pure parts: the workspace pod, references left to the pod, its source archive, flags."""

from __future__ import annotations

import asyncio
import hashlib
import tarfile
from pathlib import Path

import pytest

from strata_operator.engine.pod.agent import agent_engine_settings
from strata_operator.engine.pod.bundle import BUNDLE_DIR, BUNDLE_ENV, launcher
from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import IMAGE_PULUMI_VERSION, AutomationEngine, EngineSettings
from strata_operator.main import build_parser, workspace_settings
from strata_operator.engine.pod import executor as pod_executor
from strata_operator.engine.pod.executor import PodEngine, Workspace, WorkspaceSettings, source_archive
from strata_operator.sources.references import resolve_stack
from strata_operator.api.stack import parse_stack_spec
from strata_operator.api.workspace_values import MountedRefs
from strata_operator.engine.pod.workspace_pod import (CONTAINER, WORKSPACE_LABEL, RefUnavailable, WorkspaceNames,
                                                      WorkspacePodArgs, agent_started, build_service_account,
                                                      build_workspace_pod, pod_problem, resolve_in_workspace, spec_hash)

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
    args = {"names": WorkspaceNames.of("team/app"), "owner": OWNER, "image": "strata:1",
            "service_account": "app-workspace", **overrides}
    return build_workspace_pod(WorkspacePodArgs(**args))


def test_the_workspace_pod_runs_the_agent_hardened_under_the_stacks_service_account():
    pod = _pod(node_selector={"type": "real"}, tolerations=({"key": "k", "operator": "Exists", "effect": "NoSchedule"},))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert pod["metadata"]["name"] == "app-workspace" and pod["metadata"]["ownerReferences"] == [OWNER]
    assert pod["metadata"]["labels"] == {"auto.pulumi.com/component": "workspace",
                                         "auto.pulumi.com/workspace-name": "app"}
    assert spec["serviceAccountName"] == "app-workspace" and spec["nodeSelector"] == {"type": "real"}
    assert container["command"] == ["python", "-m", "strata_operator.engine.pod.agent"]
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert {"name": "agent", "secret": {"secretName": "app-workspace-agent", "defaultMode": 0o440}} in spec["volumes"]


def test_while_its_owner_is_being_deleted_a_workspace_pod_and_its_identity_are_nobodys():
    """So that a foreground delete's garbage collection leaves them to the finalizer's destroy."""
    names = WorkspaceNames.of("team/app")
    assert "ownerReferences" not in _pod(owner=None)["metadata"]
    assert "ownerReferences" not in build_service_account(names, None)["metadata"]
    assert build_service_account(names, OWNER)["metadata"]["ownerReferences"] == [OWNER]


def test_pko_workspace_template_merges_into_the_pod():
    pod = _pod(template=PKO_STATE_TEMPLATE)
    spec = pod["spec"]
    container = spec["containers"][0]
    assert [c["name"] for c in spec["containers"]] == ["pulumi", "sidecar"]
    assert {"name": "state", "mountPath": "/state"} in container["volumeMounts"]
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "state"}} in spec["volumes"]
    assert {"name": "LOG", "value": "debug"} in container["env"]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}}
    assert spec["nodeSelector"] == {"pool": "updates"}
    assert pod["metadata"]["labels"]["team"] == "alpha" and pod["metadata"]["annotations"]["note"] == "x"


def test_an_image_of_the_template_runs_the_updates_with_the_agent_brought_in_by_an_init_container():
    """PKO's workspace image holds `pulumi`, not Strata's agent: the operator image's bootstrap copies the
    agent's runtime into a volume, and the image runs it through that runtime's own loader."""
    pod = _pod(template={"spec": {"image": "team/pulumi:3", "imagePullPolicy": "Always"}})
    spec = pod["spec"]
    (bootstrap,) = spec["initContainers"]
    container = spec["containers"][0]
    assert (bootstrap["name"], bootstrap["image"]) == ("bootstrap", "strata:1")
    assert bootstrap["command"] == ["python", "-m", "strata_operator.engine.pod.bundle", BUNDLE_DIR]
    assert bootstrap["securityContext"] == container["securityContext"]
    assert (container["image"], container["imagePullPolicy"]) == ("team/pulumi:3", "Always")
    assert container["command"] == [*launcher(Path(BUNDLE_DIR)), "-m", "strata_operator.engine.pod.agent"]
    assert container["command"][0].startswith(BUNDLE_DIR + "/lib/ld-linux")
    assert {"name": BUNDLE_ENV, "value": BUNDLE_DIR} in container["env"]
    assert {"name": "runtime", "mountPath": BUNDLE_DIR, "readOnly": True} in container["volumeMounts"]
    assert {"name": "runtime", "emptyDir": {"sizeLimit": "512Mi"}} in spec["volumes"]
    # The operator's own image needs none of it.
    for same in (_pod(), _pod(template={"spec": {"image": "strata:1"}})):
        assert "initContainers" not in same["spec"] and same["spec"]["containers"][0]["command"][0] == "python"


def test_pkos_pod_variables_are_set_on_every_workspace_pod():
    env = {e["name"]: e for e in _pod()["spec"]["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_SA_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}


def test_a_stacks_and_a_pko_workspaces_pods_have_names_of_their_own():
    stack, workspace = WorkspaceNames.of("team/app"), WorkspaceNames.of("team/app@workspace")
    assert (stack.pod, stack.agent_secret, stack.service_account) == \
        ("app-workspace", "app-workspace-agent", "app-workspace")
    # PKO's StatefulSet pod name; its ServiceAccount is the Workspace's own (PKO's default: default).
    assert (workspace.pod, workspace.agent_secret, workspace.service_account) == \
        ("app-workspace-0", "app-workspace-0-agent", "")
    assert workspace.is_workspace_object and not stack.is_workspace_object
    assert stack.server_name == "app-workspace.team.workspace.strata"
    pod = _pod(names=workspace, service_account="default")
    assert pod["metadata"]["name"] == "app-workspace-0" and pod["metadata"]["labels"][WORKSPACE_LABEL] == "app"


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
    first, second = (source_archive(tmp_path / copy, tmp_path / f"{copy}.tar.gz") for copy in ("a", "b"))
    assert first == second == hashlib.sha256((tmp_path / "a.tar.gz").read_bytes()).hexdigest()
    names = tarfile.open(tmp_path / "a.tar.gz").getnames()
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
    from strata_operator.api.stack import local_source_issue
    from strata_operator.api.validation import SpecInvalid

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


def test_updates_in_a_workspace_pod_run_in_the_pods_own_environment(tmp_path):
    """As PKO's agent runs them: the image's PATH and ENV and the template's env reach the update; the
    agent's own variables do not; the bundle's bin (the operator's CLI, a fallback) comes last."""
    bin_dir = tmp_path / "image-bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text("#!/bin/sh\n")
    (bin_dir / "pulumi").chmod(0o755)
    environ = {"PATH": f"{bin_dir}:/usr/bin", "TEAM_SETTING": "on", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
               "STRATA_AGENT_DIR": "/var/run/strata/agent", "STRATA_ENV__TOKEN": "from-a-secret",
               BUNDLE_ENV: BUNDLE_DIR}
    settings = agent_engine_settings(environ, tmp_path / "workspace")
    assert settings.pulumi_cli() == bin_dir / "pulumi"  # the image's own CLI first
    assert settings.python_command == tuple(launcher(Path(BUNDLE_DIR)))
    engine = AutomationEngine(settings)
    env = engine.worker_env(UpdateRequest(stack_key="team/app", stack_name="dev", project_dir="/p",
                                          env={"STACK_VAR": "1"}))
    assert (env["TEAM_SETTING"], env["KUBERNETES_SERVICE_HOST"], env["STACK_VAR"]) == ("on", "10.0.0.1", "1")
    assert not any(name.startswith("STRATA_") for name in env)
    path = env["PATH"].split(":")
    assert path[:3] == [str(bin_dir), "/usr/bin", f"{BUNDLE_DIR}/bin"]
    assert env["HOME"].startswith(str(tmp_path / "workspace"))
    # A Python program's environment is built with uv's cache on the workspace volume, the one writable place.
    assert settings.python_cache == tmp_path / "workspace" / "uv"
    # The operator image's own agent: no bundle, its own python; the plugins its PULUMI_HOME carries.
    own = agent_engine_settings({"PATH": str(bin_dir), "PULUMI_HOME": "/opt/pulumi",
                                 IMAGE_PULUMI_VERSION: "v3.259.0"}, tmp_path / "w")
    assert own.python_command == ()
    assert own.plugin_cache == Path("/opt/pulumi/plugins")
    # Its CLI's version is what the image records; a foreign image's is asked of the CLI.
    assert (own.pulumi_version, settings.pulumi_version) == ("v3.259.0", "")



class _PodReader:
    """Answers get_pod with one pod's state as the API server reports it (the only call `_lost` makes)."""

    def __init__(self, pod: dict):
        self.pod = pod

    async def get_pod(self, namespace: str, name: str) -> dict:
        return self.pod


def _lost_pod(reason: str, restarts: int) -> dict:
    return {"metadata": {"uid": "pod-1"}, "status": {"containerStatuses": [{
        "name": CONTAINER, "restartCount": restarts,
        "lastState": {"terminated": {"reason": reason, "exitCode": 137}}}]}}


@pytest.mark.parametrize("key, field", [("team/app", "spec.workspaceTemplate.spec.resources.limits.memory"),
                                        ("team/ws@workspace", "spec.resources.limits.memory")])
def test_a_workspace_container_oom_killed_mid_update_fails_with_backoff_not_rerun_at_once(tmp_path, key, field):
    """Under cgroup v2 the kernel kills the whole container (memory.oom.group): run again at once, it
    would be killed again, so it is OutOfMemory (backoff) rather than UpdateInterrupted; the lost run's
    lock is still cleared before the next operation."""
    settings = EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true")
    request = UpdateRequest(stack_key=key, stack_name="dev", project_dir="/p")
    names = WorkspaceNames.of(key)
    lost = Workspace(pod=names.pod, uid="pod-1", address="https://10.0.0.9:8443", server_name=names.server_name,
                     tls=None, token="t", restarts=0)  # type: ignore[arg-type]
    engine = PodEngine(settings, WorkspaceSettings(image="strata:1"), _PodReader(_lost_pod("OOMKilled", 1)))
    result = asyncio.run(engine._lost(request, "up", lost, ConnectionResetError("reset"), 0.0, 1000.0))
    assert result.reason == "OutOfMemory" and f"raise {field}" in result.message
    assert "restarted (OOMKilled (exit code 137))" in result.message
    assert engine._lost_runs[key] == (names.pod, 1000.0)
    engine = PodEngine(settings, WorkspaceSettings(image="strata:1"), _PodReader(_lost_pod("Error", 1)))
    result = asyncio.run(engine._lost(request, "up", lost, ConnectionResetError("reset"), 0.0, 1000.0))
    assert result.reason == "UpdateInterrupted" and result.message.endswith("it is run again")


def test_a_deleted_objects_lock_is_forgotten_unless_an_operation_holds_it(tmp_path):
    engine = AutomationEngine(EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true"))

    async def scenario() -> tuple[bool, bool]:
        held = engine._locks.setdefault("team/busy", asyncio.Lock())
        engine._locks.setdefault("team/idle", asyncio.Lock())
        async with held:
            engine.forget("team/busy")
            engine.forget("team/idle")
            engine.forget("team/never-seen")
            return "team/busy" in engine._locks, "team/idle" in engine._locks

    assert asyncio.run(scenario()) == (True, False)


def _starting_pod(ip: str = "10.0.0.9", running: bool = True, sidecar_ready: bool | None = None) -> dict:
    containers = [{"name": CONTAINER, "ready": False, "state": {"running": {}} if running else {"waiting": {}}}]
    if sidecar_ready is not None:
        containers.append({"name": "sidecar", "ready": sidecar_ready, "state": {"running": {}}})
    return {"metadata": {"name": "app-workspace", "uid": "pod-1"},
            "status": {"phase": "Running" if running else "Pending", "podIP": ip, "containerStatuses": containers}}


def test_a_starting_pods_agent_is_asked_directly_once_its_container_runs():
    assert agent_started(_starting_pod())
    assert not agent_started(_starting_pod(ip=""))
    assert not agent_started(_starting_pod(running=False))
    assert not agent_started(_starting_pod(sidecar_ready=False))  # the pod is Ready only with its sidecars
    assert agent_started(_starting_pod(sidecar_ready=True))


def test_the_wait_for_a_new_pod_ends_when_its_agent_answers_before_the_kubelet_says_ready(tmp_path, monkeypatch):
    """The kubelet's readiness probe runs every 10 s and its status write comes after: the operator asks the
    agent itself (backing off from PROBE_SECONDS) once the container runs, and reads the pod meanwhile only to see it fail."""
    monkeypatch.setattr(pod_executor, "PROBE_SECONDS", 0.001)
    monkeypatch.setattr(pod_executor, "POLL_SECONDS", 0.001)
    monkeypatch.setattr(pod_executor, "PROBE_READ_SECONDS", 0)  # one probe between two reads of the pod
    pending, started = _starting_pod(running=False), _starting_pod()
    reads = iter([started, started, started])
    asked: list[str] = []

    class Reader:
        async def get_pod(self, namespace: str, name: str) -> dict:
            return next(reads)

    async def answers(pod: dict) -> bool:
        asked.append(pod["status"]["podIP"])
        return len(asked) >= 3

    engine = PodEngine(EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true"), WorkspaceSettings(image="strata:1"),
                       Reader())  # type: ignore[arg-type]
    ready = asyncio.run(engine._wait_ready("team", pending, MountedRefs(), answers))
    assert ready is started and asked == ["10.0.0.9"] * 3
