"""e2e: `make up STACK=cluster` and `make down STACK=cluster` as typed, with a throw-away home (issue #27, item 3).

Nothing of Strata on the host: with the cluster stack up, the host runs only the stand-in's "cloud" parts
(control plane, kubelets, containerd, kube-proxy, registry, object store, git server, the node gateway and
the Flux bundle's file server); Flux's controllers, the operator and every update run in pods from the
registry's images; each Stack's state, and the bootstrap's, is in the object store. Needs what e2e needs
(a Pulumi install with the Python host and the plugins, which the operator image carries) and what the
cluster profile needs (root, containerd, the image tools); reported skipped naming what is missing.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from kubernetes import client, config
from requirements import missing_e2e_requirements
from hostile_team import (assert_nothing_reached, assert_refused_beyond_its_own, commit_under_alpha, hostile_stack,
                          run_hostile_stack, secret_values, wait_ready, wait_stack)
from test_dev_stack import make, platform_pids, survivors

from strata_components import s3
from strata_components.local import objectstore, realnode
from strata_components.local.gitserver import GitRepos
from strata_components.local.platform import LocalPlatform, PlatformConfig

ROOT = Path(__file__).resolve().parents[2]


def _missing_realnode() -> list[str]:
    spec = importlib.util.spec_from_file_location("realnode_requirements", ROOT / "tests" / "realnode" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.missing_realnode_requirements()


MISSING = [*missing_e2e_requirements(), *_missing_realnode()]
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"the cluster stack needs: {'; '.join(MISSING)}"),
              pytest.mark.timeout(3600)]
# The stand-in's parts: what a cloud runs for a cluster (and the git server and Flux bundle, as a git host
# and a release download would be).
CLOUD_PARTS = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "git-server",
               "flux-bundle-server", "kube-proxy", "registry", "object-store", "node-gateway"}
STRATA_IN_PODS = ("strata_operator", "source-controller", "kustomize-controller")


@pytest.fixture
def home():
    """A throw-away home, short: a real node's kubelet sockets live under it and a unix socket's path has at most
    107 bytes (pytest's tmp_path is too long). Whatever happens, the stand-in is stopped and the host's changes undone."""
    base = Path(tempfile.mkdtemp(prefix="strata-e2e-"))
    try:
        yield base
    finally:
        state = base / "platform-cluster"
        if state.exists():
            LocalPlatform(PlatformConfig(state_dir=state, profile="cluster", host_controllers=())).down(say=print)
        shutil.rmtree(base, ignore_errors=True)


def host_processes_naming(words: tuple[str, ...]) -> list[str]:
    """Processes outside every pod (not in a real node's cgroup) whose command line names one of `words`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if any(word in command for word in words) and "/strata-real-" not in cgroup and "pytest" not in command:
            found.append(f"{proc.name}: {command[:200]}")
    return found


def test_make_up_cluster_runs_everything_of_strata_in_pods_with_state_in_the_object_store(home):
    committed = (ROOT / "Pulumi.cluster.yaml").read_text()
    up = make("up", home, "STACK=cluster")
    print(up.stdout[-8000:])
    assert up.returncode == 0, up.stdout[-8000:]
    assert (ROOT / "Pulumi.cluster.yaml").read_text() == committed
    assert "==> the cluster stack is up in" in up.stdout and "make down STACK=cluster" in up.stdout

    state = home / "platform-cluster"
    platform = LocalPlatform(PlatformConfig(state_dir=state, profile="cluster", host_controllers=()))
    # On the host: the stand-in's parts, nothing else of Strata's.
    running = {name for name, up_ in platform.status().items() if up_}
    assert {name for name in running if not name.startswith(("containerd-", "kubelet-"))} <= CLOUD_PARTS, running
    assert host_processes_naming(STRATA_IN_PODS) == []

    api = config.new_client_from_config(config_file=str(state / "kubeconfig"))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom, coordination = client.CustomObjectsApi(api), client.CoordinationV1Api(api)
    registry_host = platform.registry_host()

    # Flux's controllers and the operator run in pods on the real nodes, from the registry's images.
    for namespace, name, replicas in (("flux-system", "source-controller", 1), ("flux-system", "kustomize-controller", 1),
                                      ("strata-system", "strata-operator", 2)):
        deployment = apps.read_namespaced_deployment(name, namespace)
        assert deployment.status.ready_replicas == replicas, (name, deployment.status)
        image = deployment.spec.template.spec.containers[0].image
        assert image.startswith(f"{registry_host}/"), image
    operator_pods = {pod.metadata.name for pod in core.list_namespaced_pod(
        "strata-system", label_selector="app.kubernetes.io/name=strata-operator").items}
    # One of them leads: the Lease's holder is <hostname>_<pid>, a pod's hostname its name.
    holder = coordination.read_namespaced_lease("strata-operator-leader", "strata-system").spec.holder_identity
    assert holder.rsplit("_", 1)[0] in operator_pods, (holder, operator_pods)

    # Every Stack: Ready, its state in the object store, its updates in a workspace pod of its own from the registry.
    stacks = custom.list_cluster_custom_object("pulumi.com", "v1", "stacks")["items"]
    assert stacks
    for stack in stacks:
        name, namespace = stack["metadata"]["name"], stack["metadata"]["namespace"]
        assert {c["type"]: c["status"] for c in stack["status"]["conditions"]}["Ready"] == "True", stack["status"]
        assert stack["spec"]["backend"].startswith("s3://"), stack["spec"]["backend"]
        pod = core.read_namespaced_pod(f"{name}-workspace", namespace)
        assert pod.spec.node_name.startswith("real-")
        assert pod.spec.containers[0].image.startswith(f"{registry_host}/")
    # The bootstrap's own state is there too.
    credentials = objectstore.read_credentials(platform.object_store_credentials)
    assert objectstore.object_exists(platform.object_store_port(), objectstore.DEFAULT_BUCKET,
                                     ".pulumi/stacks/strata/cluster.json", credentials)

    # Each team's Stacks (its hand-off, alpha's app through Flux) keep state in the team's own bucket...
    team_stacks = {}
    for stack in stacks:
        metadata = stack["metadata"]
        team = (metadata.get("labels") or {}).get("strata.dev/team") or (
            metadata["namespace"].removeprefix("team-") if metadata["namespace"].startswith("team-") else None)
        if team:
            team_stacks[metadata["name"]] = team
            assert s3.backend_bucket(stack["spec"]["backend"]) == f"{objectstore.DEFAULT_BUCKET}-team-{team}", stack["spec"]
    assert team_stacks == {"team-alpha-handoff": "alpha", "team-beta-handoff": "beta", "app": "alpha"}, team_stacks
    # ...with credentials that reach it alone: alpha's, read from alpha's Secret, are refused on beta's and the platform's.
    data = core.read_namespaced_secret("strata-state-credentials", "team-alpha").data
    alpha = s3.Credentials(*(base64.b64decode(data[key]).decode() for key in s3.CREDENTIAL_ENV))
    store = objectstore.endpoint(platform.object_store_port())
    assert alpha.access_key_id != credentials[0]
    assert s3.request(store, "HEAD", f"/{objectstore.DEFAULT_BUCKET}-team-alpha/.pulumi/stacks/strata-app-team/alpha.json",
                      alpha)[0] == 200
    for bucket in (f"{objectstore.DEFAULT_BUCKET}-team-beta", objectstore.DEFAULT_BUCKET):
        assert s3.request(store, "GET", f"/{bucket}", alpha)[0] == 403, bucket
        assert s3.request(store, "HEAD", f"/{bucket}/.pulumi/meta.yaml", alpha)[0] == 403, bucket

    hostile_team_is_contained(state, platform, custom, core)

    pids = platform_pids(state)
    down = make("down", home, "STACK=cluster")
    print(down.stdout[-4000:])
    assert down.returncode == 0, down.stdout[-4000:]
    assert survivors(pids) == []
    assert not state.exists()
    # The host's changes undone: the pod bridge is gone.
    assert subprocess.run(["ip", "link", "show", "strata0"], capture_output=True).returncode != 0


# What made a team node root beside the operator's pod, asked of its workspace pod's template.
NODE_ROOT_TEMPLATE = {"spec": {"podTemplate": {"spec": {
    "hostPID": True, "hostNetwork": True,
    "containers": [{"name": "pulumi", "securityContext": {"privileged": True, "runAsUser": 0},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}}}


def hostile_team_is_contained(state: Path, platform: LocalPlatform, custom: client.CustomObjectsApi,
                              core: client.CoreV1Api) -> None:
    """On the cluster stack alpha's programs run in its own workspace pods (the pod executor). A commit under
    its path adds a Stack whose template asks for the node (refused before any pod, naming the fields), and
    one whose Python program looks around its pod for the stand-in's and the operator's files, etcd, a push
    into the platform's program and beta's Secrets: it gets none of them."""
    ports = platform.info().ports
    node = realnode.NODE_ADDRESS
    targets = {
        "files": {"admin kubeconfig": str(state / "kubeconfig"),
                  "operator kubeconfig": str(state / "kubeconfigs" / "strata-operator.kubeconfig"),
                  "git push credential": str(state / "git-push.credentials"), "CA key": str(state / "pki" / "ca.key"),
                  "the node's kubelet": "/var/lib/kubelet/config.yaml"},
        "directories": {"the node": "/host", "the node's pods": "/var/log/pods"}, "writable": {},
        "etcd": f"{node}:{ports['etcd_client']}", "git": f"http://{node}:{ports['git']}/strata.git",
        "apiserver": "https://kubernetes.default.svc", "otherNamespace": "team-beta"}
    repos = GitRepos(state / "git", f"http://127.0.0.1:{ports['git']}")
    commit_under_alpha(custom, repos, "clusters/dev", hostile_stack({}, "node-root", NODE_ROOT_TEMPLATE))
    refused = wait_stack(custom, "team-alpha", "node-root", lambda status: any(
        c["type"] == "Stalled" and c["status"] == "True" for c in status.get("conditions") or []), "Stalled")
    condition = next(c for c in refused["status"]["conditions"] if c["type"] == "Stalled")
    assert condition["reason"] == "WorkspaceTemplateForbidden", condition
    for field in ("hostPID", "hostNetwork", "containers[0].securityContext.privileged", "volumes[0].hostPath"):
        assert f"spec.workspaceTemplate.spec.podTemplate.spec.{field}" in condition["message"], condition
    assert not core.list_namespaced_pod("team-alpha", field_selector="metadata.name=node-root-workspace").items

    status = run_hostile_stack(custom, repos, "clusters/dev", hostile_stack(targets))
    probes = status["outputs"]["probes"]
    for name in targets["files"]:
        assert probes[f"read {name}"].startswith("denied: FileNotFoundError"), (name, probes[f"read {name}"])
    for name in targets["directories"]:
        assert probes[f"list {name}"].startswith("denied: FileNotFoundError"), (name, probes[f"list {name}"])
    # Its pod's processes only: the agent, the CLI, the language host, itself.
    for process in ("kubelet", "containerd", "-m strata_operator ", "source-controller"):
        assert process not in probes["processes"], (process, probes["processes"])
    assert_refused_beyond_its_own(probes)
    assert_nothing_reached(core, status, secret_values(state, targets["files"].values()))
    wait_ready(custom, "team-alpha", "app")
