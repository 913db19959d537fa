"""The pod executor on the real node: two teams' Stacks run at once, each in its own workspace pod, and
neither team can reach the other's environment, passphrase, workdir, state or identity, nor the operator's.

The operator runs as a host process with `--executor pod` (its workspace pods land on the real node).
What a team's program can do is what any process in its workspace container can do (same container,
user, environment, mounts and token), so the probes run there with `kubectl exec`'s API.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import signal
import ssl
import subprocess
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.stream import stream

from strata_components.local import processes, realnode
from strata_components.local.kube import http_ok
from strata_components.local.operator_host import operator_host, serve_namespace
from strata_components.local.platform import subprocess_ok
from strata_components.local.images import ImageArchive, build_image_config, load_image, write_oci_archive
from strata_components.team import POD_SECURITY_LABELS
from strata_operator.engine.pod.workspace_pod import AGENT_PORT, CONTAINER, RUN_AS

from .node_processes import pod_process

TEAMS = ("alpha", "beta")
STATE_ROOT = Path("/var/lib/strata-test-workspaces")
STASH_COUNT = 300  # enough resources that an update lasts a few seconds: long enough to interrupt


def _program(team: str, count: int = 1) -> dict:
    resources = {f"r{i}": {"type": "pulumi:index:Stash", "properties": {"input": f"{team}-{i}"}} for i in range(count)}
    return {"resources": resources, "outputs": {"team": "${r0.input}"}}


def _stack_spec(passphrase_secret: str = "pulumi") -> dict:
    return {
        "stack": "dev", "programRef": {"name": "app"}, "backend": "file:///state",
        "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": passphrase_secret,
                                                                               "key": "passphrase"}},
                    "TEAM_CANARY": {"type": "Secret", "secret": {"name": "pulumi", "key": "canary"}}},
        "workspaceTemplate": {"spec": {"podTemplate": {"spec": {
            "containers": [{"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"}]}],
            "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}]}}}},
    }


def _create_team(platform, core: client.CoreV1Api, custom: client.CustomObjectsApi, namespace: str, team: str) -> dict:
    """A team's namespace as the platform makes it (Pod Security restricted enforced, served by the operator)
    with its passphrase and canary, its state volume (a PersistentVolume on the node, as a platform admin
    would provision it), its Program and its Stack."""
    secrets = {"passphrase": f"{team}-passphrase-{uuid.uuid4().hex}", "canary": f"{team}-canary-{uuid.uuid4().hex}"}
    core.create_namespace({"metadata": {"name": namespace, "labels": POD_SECURITY_LABELS}})
    serve_namespace(platform.kubeconfig_path, namespace, ("pod",))
    core.create_namespaced_secret(namespace, {"metadata": {"name": "pulumi"}, "stringData": secrets})
    state = STATE_ROOT / namespace
    state.mkdir(parents=True, mode=0o700)
    os.chown(state, RUN_AS, RUN_AS)
    core.create_persistent_volume({
        "metadata": {"name": f"{namespace}-state"},
        "spec": {"capacity": {"storage": "100Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(state), "type": "Directory"},
                 "claimRef": {"namespace": namespace, "name": "state"}}})
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "state"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"{namespace}-state",
                 "resources": {"requests": {"storage": "100Mi"}}}})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", {
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "app"},
        "program": _program(team)})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "app"}, "spec": _stack_spec()})
    return {"namespace": namespace, "state": state, **secrets}


@pytest.fixture(scope="module")
def teams(platform, toolchain, kube_client, operator_image, tmp_path_factory) -> Iterator[dict]:
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    suffix = uuid.uuid4().hex[:5]
    namespaces = {team: f"pods-{team}-{suffix}" for team in TEAMS}
    toleration = realnode.TOLERATION
    host = operator_host(platform, toolchain, tmp_path_factory.mktemp("pod-operator"), executor="pod", extra_args=(
        "--executor", "pod", "--workspace-image", operator_image.name, "--workspace-image-pull-policy", "Never",
        *(arg for key, value in realnode.NODE_LABEL.items() for arg in ("--workspace-node-selector", f"{key}={value}")),
        "--workspace-toleration", f"{toleration['key']}={toleration['value']}:{toleration['effect']}",
        "--no-leader-election", "--min-resync-seconds", "3",
        *(arg for namespace in namespaces.values() for arg in ("--namespace", namespace))))
    created = {}
    try:
        for team, namespace in namespaces.items():
            created[team] = _create_team(platform, core, custom, namespace, team)
        host.start()
        yield {"host": host, **created}
    finally:
        host.stop()
        for team in created.values():
            core.delete_namespace(team["namespace"])
            core.delete_persistent_volume(f"{team['namespace']}-state")
            subprocess.run(["rm", "-rf", str(team["state"])], check=False)


def _stack(custom: client.CustomObjectsApi, namespace: str, name: str = "app") -> dict:
    return custom.get_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", name)


def _ready(stack: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (stack.get("status") or {}).get("conditions") or [])


def _wait(custom: client.CustomObjectsApi, namespace: str, check, what: str, timeout: float = 240,
          name: str = "app") -> dict:
    last = {}

    def probe():
        last["stack"] = _stack(custom, namespace, name)
        return last["stack"] if check(last["stack"]) else None

    try:
        return processes.wait_until(probe, timeout, what, interval=0.5)
    except processes.ProcessError:
        raise AssertionError(f"{what}: {json.dumps((last.get('stack') or {}).get('status'), indent=1)}") from None


def _exec(core: client.CoreV1Api, namespace: str, script: str) -> str:
    """Run `script` with python in the Stack's workspace container, as its program would run."""
    return stream(core.connect_get_namespaced_pod_exec, "app-workspace", namespace, container=CONTAINER,
                  command=["python", "-c", script], stderr=True, stdin=False, stdout=True, tty=False)


def test_each_team_runs_in_its_own_workspace_pod_under_its_own_identity(teams, kube_client):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    for team in TEAMS:
        namespace = teams[team]["namespace"]
        stack = _wait(custom, namespace, _ready, f"{team}'s Stack Ready")
        assert stack["status"]["outputs"] == {"team": f"{team}-0"}
        pod = core.read_namespaced_pod("app-workspace", namespace)
        assert pod.spec.node_name == "real-0"
        assert pod.spec.service_account_name == "app-workspace"
        assert pod.metadata.owner_references[0].kind == "Stack"
        assert pod.metadata.labels["auto.pulumi.com/workspace-name"] == "app"
        # The Secret's values reach the pod from the kubelet, by reference.
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["STRATA_ENV__PULUMI_CONFIG_PASSPHRASE"].value_from.secret_key_ref.name == "pulumi"
        assert env["STRATA_ENV__PULUMI_CONFIG_PASSPHRASE"].value is None
        # The state is on the team's own volume.
        assert list((teams[team]["state"] / ".pulumi" / "stacks").rglob("dev.json"))


PROBE = r"""
import glob, json, os, sys
other = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
environ = "".join(open(p, errors="replace").read() for p in glob.glob("/proc/[0-9]*/environ") if os.access(p, os.R_OK))
cmdlines = " ".join(open(p, errors="replace").read() for p in glob.glob("/proc/[0-9]*/cmdline"))
print(json.dumps({
    "uid": os.getuid(),
    "environ": environ,
    "cmdlines": cmdlines,
    "state": sorted(os.listdir("/state/.pulumi/stacks")) if os.path.isdir("/state/.pulumi/stacks") else [],
    "paths": {p: os.path.exists(p) for p in other.get("paths", [])},
    "token": open("/var/run/secrets/kubernetes.io/serviceaccount/token").read(),
}))
"""


def _probe(core: client.CoreV1Api, namespace: str, paths: list[str]) -> dict:
    script = PROBE.replace("sys.argv[1]) if len(sys.argv) > 1 else {}", repr(json.dumps({"paths": paths})) + ")")
    return json.loads(_exec(core, namespace, script).strip().splitlines()[-1])


def _api(platform, token: str, path: str, body: bytes | None = None) -> int:
    """The apiserver's answer to `token` alone (no client certificate)."""
    context = ssl.create_default_context(cafile=str(platform.pki / "ca.crt"))
    request = urllib.request.Request(f"{platform.info().server}{path}", data=body, method="POST" if body else "GET",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_team_cannot_read_the_other_teams_secrets_state_or_identity_nor_the_operators(teams, kube_client, platform):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    for team in TEAMS:
        _wait(custom, teams[team]["namespace"], _ready, f"{team}'s Stack Ready")
    operator_state = str(teams["host"].state_dir)
    for team, other in (("alpha", "beta"), ("beta", "alpha")):
        mine, theirs = teams[team], teams[other]
        seen = _probe(core, mine["namespace"], [str(theirs["state"]), f"/state/../{theirs['namespace']}",
                                                operator_state, str(STATE_ROOT)])
        assert seen["uid"] == RUN_AS
        # Its own passphrase and canary are there (the program needs them)...
        assert mine["passphrase"] in seen["environ"] and mine["canary"] in seen["environ"]
        # ...the other team's are nowhere in any process it can see, nor the operator's process.
        assert theirs["passphrase"] not in seen["environ"] and theirs["canary"] not in seen["environ"]
        # The operator is no process it can see (its argv has these flags); the agent is.
        assert "--kubeconfig" not in seen["cmdlines"] and "--state-dir" not in seen["cmdlines"]
        assert "strata_operator.engine.pod.agent" in seen["cmdlines"]
        # Only its own state; the other team's volume, the host's state root and the operator's state
        # directory do not exist in its filesystem.
        assert seen["state"] and all(path is False for path in seen["paths"].values()), seen["paths"]
        # Its token is its own ServiceAccount's, with no rights: not to its own Secrets, not to the other's.
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        token = seen["token"]
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        assert claims["sub"] == f"system:serviceaccount:{mine['namespace']}:app-workspace", claims["sub"]
        assert _api(platform, token, "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                    json.dumps(review).encode()) == 201
        assert _api(platform, token, f"/api/v1/namespaces/{theirs['namespace']}/secrets/pulumi") == 403
        assert _api(platform, token, f"/api/v1/namespaces/{mine['namespace']}/secrets/pulumi") == 403


def test_a_workspace_agent_refuses_anyone_without_its_own_token(teams, kube_client):
    core = client.CoreV1Api(kube_client)
    alpha, beta = teams["alpha"], teams["beta"]
    beta_ip = core.read_namespaced_pod("app-workspace", beta["namespace"]).status.pod_ip
    alpha_token = base64.b64decode(core.read_namespaced_secret("app-workspace-agent", alpha["namespace"]).data["token"])
    context = ssl._create_unverified_context()  # noqa: S323 - what is refused is the caller, checked below
    for headers in ({}, {"Authorization": f"Bearer {alpha_token.decode()}"}):
        request = urllib.request.Request(f"https://{beta_ip}:{AGENT_PORT}/run", data=b"{}", method="POST",
                                         headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=10)
        assert refused.value.code == 401
    # From inside alpha's pod too: the other team's agent is reachable on the network, and refuses.
    out = _exec(core, alpha["namespace"], f"""
import ssl, urllib.request, urllib.error
try:
    urllib.request.urlopen(urllib.request.Request("https://{beta_ip}:{AGENT_PORT}/run", data=b"{{}}", method="POST",
        headers={{"Authorization": "Bearer " + open("/var/run/strata/agent/token").read()}}),
        context=ssl._create_unverified_context(), timeout=10)
    print("ANSWERED")
except urllib.error.HTTPError as e:
    print("STATUS", e.code)
""")
    assert "STATUS 401" in out, out


def test_secret_values_never_pass_through_the_operator(teams, kube_client):
    custom = client.CustomObjectsApi(kube_client)
    for team in TEAMS:
        _wait(custom, teams[team]["namespace"], _ready, f"{team}'s Stack Ready")
    host = teams["host"]
    texts = [host.log.read_text(errors="replace")]
    texts += [p.read_text(errors="replace") for p in Path(host.state_dir).rglob("*") if p.is_file()]
    for team in TEAMS:
        for value in (teams[team]["passphrase"], teams[team]["canary"]):
            assert not any(value in text for text in texts), f"{team}'s secret reached the operator"


def _current_update(stack: dict) -> bool:
    return bool((stack.get("status") or {}).get("currentUpdate"))


def _start_slow_update(custom: client.CustomObjectsApi, namespace: str, team: str) -> str:
    """From Ready, a new program revision with many resources, whose update lasts long enough to interrupt;
    returns once it runs, with the marker output it will have."""
    _wait(custom, namespace, _ready, f"{team} Ready")
    marker = f"m-{uuid.uuid4().hex[:8]}"  # never a number to YAML
    program = _program(team, STASH_COUNT)
    program["outputs"]["marker"] = marker
    custom.patch_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", "app", {"program": program})
    _wait(custom, namespace, _current_update, "the slow update running", timeout=120)
    return marker


def test_a_workspace_pod_deleted_mid_update_is_reported_and_the_stack_converges(teams, kube_client):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["alpha"]["namespace"]
    marker = _start_slow_update(custom, namespace, "alpha")
    old = core.read_namespaced_pod("app-workspace", namespace).metadata.uid
    core.delete_namespaced_pod("app-workspace", namespace, grace_period_seconds=0)
    stack = _wait(custom, namespace, lambda s: _ready(s) and (s["status"].get("outputs") or {}).get("marker") == marker,
                  "alpha Ready with the new revision after its pod was deleted", timeout=300)
    assert core.read_namespaced_pod("app-workspace", namespace).metadata.uid != old
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=app").items
    interrupted = [e.message for e in events if "was deleted during the up" in (e.message or "")]
    assert interrupted, [e.message for e in events]
    assert stack["status"]["lastUpdate"]["state"] == "succeeded"
    # No lock is left behind in the team's backend.
    assert not _locks(teams["alpha"]["state"])


def test_the_operator_killed_mid_update_leaves_the_update_to_finish_and_its_successor_records_it(teams, kube_client):
    custom = client.CustomObjectsApi(kube_client)
    namespace, host = teams["beta"]["namespace"], teams["host"]
    marker = _start_slow_update(custom, namespace, "beta")
    run = custom.get_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", "app")["status"]["currentUpdate"]
    # Mid-update: the engine in the pod holds the stack's lock. currentUpdate alone is written before the
    # operator hands the run to the pod, and a run killed before that is rightly run again, under a new name.
    _wait_running_in_pod(teams["beta"]["state"])
    pid = host.pid()
    for victim in [pid, *processes.descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    processes.wait_until(lambda: host.pid() is None, 10, "the operator gone after kill -9")
    host.stop()  # forget its pid file
    host.start()
    stack = _wait(custom, namespace, lambda s: _ready(s) and (s["status"].get("outputs") or {}).get("marker") == marker,
                  "beta Ready with the new revision after the operator was killed", timeout=300)
    # The workspace pod finished the update the killed operator had started; its successor found that run's
    # update in the backend's history and recorded it, rather than running the same revision again.
    assert stack["status"]["lastUpdate"]["state"] == "succeeded"
    assert stack["status"]["lastUpdate"]["name"] == run["name"]
    events = client.CoreV1Api(kube_client).list_namespaced_event(namespace, field_selector="involvedObject.name=app")
    assert not any("was interrupted (operator restart)" in (e.message or "") for e in events.items), \
        [e.message for e in events.items]
    assert not _locks(teams["beta"]["state"])


def test_a_workspace_pod_lost_after_its_update_finished_has_that_update_recorded_not_run_again(teams, kube_client):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace, state = teams["beta"]["namespace"], teams["beta"]["state"]
    marker = _start_slow_update(custom, namespace, "beta")
    run = _stack(custom, namespace)["status"]["currentUpdate"]["name"]
    _wait_running_in_pod(state)
    # The agent frozen, the update finishes in its worker but is never answered; then the pod goes.
    pod = core.read_namespaced_pod("app-workspace", namespace).metadata.uid
    agent = pod_process(pod, "strata_operator.engine.pod.agent")
    os.kill(agent, signal.SIGSTOP)
    try:
        processes.wait_until(lambda: not _locks(state), 120, "the update finished in the frozen pod (its lock "
                             "gone)", interval=0.1)
        updates = _updates(state)
        assert _stack(custom, namespace)["status"]["currentUpdate"]["name"] == run
        core.delete_namespaced_pod("app-workspace", namespace, grace_period_seconds=0)
        # Killed frozen: resumed before the kubelet kills it, the agent would still answer.
        processes.wait_until(lambda: not Path(f"/proc/{agent}").exists(), 60, "the frozen agent killed with its pod")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGCONT)
    stack = _wait(custom, namespace, lambda s: _ready(s) and (s["status"].get("outputs") or {}).get("marker") == marker,
                  "beta Ready with the new revision after its pod was lost", timeout=300)
    # The run the pod finished is recorded, from the backend's history: no second update of the same change.
    assert (stack["status"]["lastUpdate"]["state"], stack["status"]["lastUpdate"]["name"]) == ("succeeded", run)
    assert _updates(state) == updates
    events = [(e.reason, e.message) for e in core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=app").items]
    assert ("StackUpdateRecovered", "the workspace pod app-workspace was deleted during the up, after its update "
            "had finished: that update is recorded, not run again") in events, events
    assert not _locks(state)


def test_the_node_restarted_mid_update_is_reported_and_the_stack_converges(teams, kube_client, platform, node,
                                                                           toolchain):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["alpha"]["namespace"]
    marker = _start_slow_update(custom, namespace, "alpha")
    before = _interruptions(core, namespace)
    # A reboot before the operator hands the run to the pod interrupts nothing: the run is retried as "does not
    # answer", rightly not reported as lost.
    _wait_running_in_pod(teams["alpha"]["state"])
    # A reboot: the node's kubelet and containerd stop, everything in its pods dies, then both start again.
    kubelet, containerd = realnode.kubelet_process(node, toolchain.bin("kubelet")), realnode.containerd_process(node)
    platform.stop_controller(kubelet.name)
    realnode.kill_containers(node)
    platform.stop_controller(containerd.name)
    platform.start_controller(containerd, timeout=90, ready=lambda: subprocess_ok(
        ["ctr", "--address", str(node.containerd_socket), "version"]))
    platform.start_controller(kubelet, timeout=90, ready=lambda: http_ok(f"http://127.0.0.1:{node.healthz_port}/healthz"))
    stack = _wait(custom, namespace, lambda s: _ready(s) and (s["status"].get("outputs") or {}).get("marker") == marker,
                  "alpha Ready with the new revision after its node restarted", timeout=400)
    assert stack["status"]["lastUpdate"]["state"] == "succeeded"
    assert _interruptions(core, namespace) > before, [e.message for e in core.list_namespaced_event(namespace).items]
    assert not _locks(teams["alpha"]["state"])


def _locks(state: Path) -> list[Path]:
    """The lock files in a `file://` backend: one while an update holds its stack."""
    return list((state / ".pulumi" / "locks").rglob("*.json"))


def _wait_running_in_pod(state: Path) -> None:
    """Mid-update: the engine in the workspace pod holds the stack's lock. currentUpdate alone is written
    before the operator hands the run to the pod."""
    processes.wait_until(lambda: _locks(state), 120, "the update running in the workspace pod (its lock in the "
                         "backend)", interval=0.1)


def _updates(state: Path) -> list[str]:
    """The updates a `file://` backend's history holds, oldest first."""
    return sorted(path.name for path in (state / ".pulumi" / "history").rglob("*.history.json"))


def _interruptions(core: client.CoreV1Api, namespace: str) -> int:
    """Occurrences of the Event that reports an update lost with its workspace pod."""
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=app").items
    return sum(e.count or 1 for e in events if "during the up; it is run again" in (e.message or ""))


LOCAL_PROJECT = """name: from-volume
runtime: yaml
resources:
  greeting: {type: "pulumi:index:Stash", properties: {input: "from a volume"}}
outputs:
  greeting: ${greeting.input}
"""


def _create_stack_from_volume(core: client.CoreV1Api, custom: client.CustomObjectsApi, namespace: str, name: str,
                              project: str, **spec_fields) -> None:
    """A Stack whose program is a ConfigMap mounted at /program in its workspace pod (local.dir), its state
    in the team's volume at /state/<name>."""
    core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"Pulumi.yaml": project}})
    spec = _stack_spec()
    del spec["programRef"]
    spec["backend"] = f"file:///state/{name}"
    workspace = spec["workspaceTemplate"]["spec"]
    workspace["local"] = {"dir": "/program"}
    workspace["podTemplate"]["spec"]["volumes"].append({"name": "program", "configMap": {"name": name}})
    workspace["podTemplate"]["spec"]["containers"][0]["volumeMounts"].append({"name": "program",
                                                                              "mountPath": "/program"})
    for key, value in spec_fields.items():
        (workspace if key == "resources" else spec)[key] = value
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec})


def test_a_program_in_a_volume_of_the_workspace_pod_runs_from_local_dir(teams, kube_client):
    """PKO v2's workspaceTemplate.spec.local.dir: the program is a directory of the pod (here a ConfigMap
    volume, read-only), nothing is uploaded."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["alpha"]["namespace"]
    _create_stack_from_volume(core, custom, namespace, "from-volume", LOCAL_PROJECT)
    stack = _wait(custom, namespace, _ready, "the local.dir Stack Ready", name="from-volume")
    assert stack["status"]["outputs"] == {"greeting": "from a volume"}
    assert stack["status"]["lastUpdate"]["lastSuccessfulCommit"] == "local:/program"
    assert "ignoredFields" not in stack["status"]


@pytest.fixture(scope="module")
def team_image(toolchain, node, tmp_path_factory) -> dict:
    """A team's workspace image as PKO's are (`pulumi` and its YAML host on PATH), built FROM scratch: no
    shell, no Python, no C library. Only its marker file tells it apart."""
    work = tmp_path_factory.mktemp("team-image")
    marker = f"team-image-{uuid.uuid4().hex[:8]}"
    layer = work / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        for name in ("pulumi", "pulumi-language-yaml"):
            tar.add(toolchain.bin(name), arcname=f"usr/local/bin/{name}")
        for name, text in (("etc/team-image", marker), ("etc/passwd", f"team:x:{RUN_AS}:{RUN_AS}::/tmp:/none\n"),
                           ("etc/group", f"team:x:{RUN_AS}:\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o644
            tar.addfile(info, io.BytesIO(text.encode()))
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
    name = f"strata.local/team-pulumi:{marker.removeprefix('team-image-')}"
    config = build_image_config(entrypoint=["/usr/local/bin/pulumi"], env={"PATH": "/usr/local/bin"},
                                user=str(RUN_AS), workdir="/tmp", layer_digests=[f"sha256:{_sha256(layer)}"])
    write_oci_archive([layer], config, name, work / "image.tar")
    load_image(ImageArchive(name, work / "image.tar"), node.containerd_socket)
    return {"name": name, "marker": marker}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


WORKSPACE_PROJECT = """name: team-workspace
runtime: yaml
config:
  greeting: {type: string}
variables:
  image:
    fn::readFile: /etc/team-image
resources:
  note: {type: "pulumi:index:Stash", properties: {input: "${greeting}"}}
outputs:
  image: ${image}
  greeting: ${note.input}
"""


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _wait_auto(custom: client.CustomObjectsApi, namespace: str, plural: str, name: str, check, what: str,
               timeout: float = 300) -> dict:
    last = {}

    def probe():
        last["obj"] = custom.get_namespaced_custom_object("auto.pulumi.com", "v1alpha1", namespace, plural, name)
        return last["obj"] if check(last["obj"]) else None

    try:
        return processes.wait_until(probe, timeout, what, interval=1)
    except processes.ProcessError:
        raise AssertionError(f"{what}: {json.dumps((last.get('obj') or {}).get('status'), indent=1)}") from None


def test_a_pko_workspace_runs_its_updates_in_its_own_pod_from_the_image_it_names(teams, kube_client, team_image):
    """PKO v2's Workspace under the pod executor: its pod (`<name>-workspace-0`, as PKO's StatefulSet names
    it) runs the Workspace's image, which has no Python, with the agent brought in by the operator
    image's init container; it runs as the Workspace's ServiceAccount, reads its Secrets itself (env and
    a stack config value from env), and an Update runs `up` in it."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["alpha"]["namespace"]
    greeting = f"hello-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_secret(namespace, {"metadata": {"name": "greeting"}, "stringData": {"text": greeting}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "ws-program"},
                                                  "data": {"Pulumi.yaml": WORKSPACE_PROJECT}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
    custom.create_namespaced_custom_object("auto.pulumi.com", "v1alpha1", namespace, "workspaces", {
        "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "ws"},
        "spec": {
            "serviceAccountName": "deployer", "image": team_image["name"], "imagePullPolicy": "Never",
            "local": {"dir": "/program"},
            "env": [{"name": "PULUMI_BACKEND_URL", "value": "file:///state/ws"},
                    {"name": "PULUMI_CONFIG_PASSPHRASE",
                     "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "passphrase"}}},
                    {"name": "GREETING", "valueFrom": {"secretKeyRef": {"name": "greeting", "key": "text"}}}],
            "stacks": [{"name": "dev", "config": [{"key": "greeting", "valueFrom": {"env": "GREETING"}}]}],
            "podTemplate": {"spec": {
                "containers": [{"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"},
                                                                   {"name": "program", "mountPath": "/program"}]}],
                "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}},
                            {"name": "program", "configMap": {"name": "ws-program"}}]}}}})
    _wait_auto(custom, namespace, "workspaces", "ws", lambda w: _condition(w, "Ready").get("status") == "True",
               "the Workspace Ready with its pod")
    pod = core.read_namespaced_pod("ws-workspace-0", namespace)
    assert pod.spec.service_account_name == "deployer"
    assert [(o.kind, o.name) for o in pod.metadata.owner_references] == [("Workspace", "ws")]
    assert pod.spec.containers[0].image == team_image["name"]
    assert [c.name for c in pod.spec.init_containers] == ["bootstrap"]
    copied = core.read_namespaced_pod_log("ws-workspace-0", namespace, container="bootstrap")
    assert copied.startswith("agent runtime: "), copied
    print(copied.strip())
    custom.create_namespaced_custom_object("auto.pulumi.com", "v1alpha1", namespace, "updates", {
        "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update", "metadata": {"name": "ws-up"},
        "spec": {"workspaceName": "ws", "stackName": "dev", "type": "up"}})
    update = _wait_auto(custom, namespace, "updates", "ws-up", lambda u: _condition(u, "Complete").get("status") == "True",
                        "the Update complete")
    assert _condition(update, "Failed")["status"] == "False", update["status"]
    outputs = core.read_namespaced_secret("ws-up-stack-outputs", namespace).data
    assert json.loads(base64.b64decode(outputs["image"])) == team_image["marker"]  # read in the team's image
    assert json.loads(base64.b64decode(outputs["greeting"])) == greeting  # from the pod's own Secret env
    # The operator never read the Workspace's Secrets: it saw the greeting only as the output it wrote.
    host = teams["host"]
    assert teams["alpha"]["passphrase"] not in host.log.read_text(errors="replace")
    assert greeting not in host.log.read_text(errors="replace")


def test_a_workspace_whose_image_cannot_start_says_why_and_recovers_once_fixed(teams, kube_client, team_image):
    """PKO's e2e issue-801: a Workspace naming an image that does not exist is not Ready, saying why; fixing
    the image replaces the pod and it turns Ready."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["beta"]["namespace"]
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "issue-801"},
                                                  "data": {"Pulumi.yaml": LOCAL_PROJECT}})
    custom.create_namespaced_custom_object("auto.pulumi.com", "v1alpha1", namespace, "workspaces", {
        "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace", "metadata": {"name": "issue-801"},
        "spec": {"image": "strata.local/no-such-image:1", "imagePullPolicy": "Never", "local": {"dir": "/program"},
                 "env": [{"name": "PULUMI_BACKEND_URL", "value": "file:///state/"},
                         {"name": "PULUMI_CONFIG_PASSPHRASE", "value": "test"}],
                 "podTemplate": {"spec": {
                     "containers": [{"name": "pulumi", "volumeMounts": [
                         {"name": "state", "mountPath": "/state"}, {"name": "program", "mountPath": "/program"}]}],
                     "volumes": [{"name": "state", "emptyDir": {}},
                                 {"name": "program", "configMap": {"name": "issue-801"}}]}}}})
    failing = _wait_auto(custom, namespace, "workspaces", "issue-801",
                         lambda w: _condition(w, "Ready").get("reason") == "WorkspaceFailed", "the Workspace failing")
    assert "ErrImageNeverPull" in _condition(failing, "Ready")["message"], failing["status"]
    custom.patch_namespaced_custom_object("auto.pulumi.com", "v1alpha1", namespace, "workspaces", "issue-801",
                                          {"spec": {"image": team_image["name"]}})
    _wait_auto(custom, namespace, "workspaces", "issue-801",
               lambda w: _condition(w, "Ready").get("status") == "True", "the fixed Workspace Ready")
    assert core.read_namespaced_pod("issue-801-workspace-0", namespace).spec.containers[0].image == team_image["name"]


READER_PROJECT = """name: reader
runtime: yaml
config:
  path: {type: string}
variables:
  content:
    fn::readFile: ${path}
outputs:
  content: ${content}
"""


def test_an_update_that_runs_out_of_memory_says_so_and_converges_once_fixed(teams, kube_client):
    """Reading /dev/zero grows the YAML host until the kernel kills it at the pod's memory limit: the
    Stack's status and an Event say so and name the field that raises it; nothing is left locked, and
    the fixed spec updates at once."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["beta"]["namespace"]
    _create_stack_from_volume(core, custom, namespace, "reader", READER_PROJECT, config={"path": "/dev/zero"},
                              resources={"requests": {"cpu": "100m", "memory": "192Mi"},
                                         "limits": {"memory": "512Mi"}})
    stack = _wait(custom, namespace, lambda s: ((s.get("status") or {}).get("lastUpdate") or {}).get("reason")
                  == "OutOfMemory", "the update reported out of memory", name="reader")
    message = stack["status"]["lastUpdate"]["message"]
    assert "ran out of memory" in message and "limit of 512 MiB" in message, message
    assert "raise spec.workspaceTemplate.spec.resources.limits.memory" in message, message
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=reader").items
    assert any("ran out of memory" in (e.message or "") for e in events), [e.message for e in events]
    custom.patch_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", "reader",
                                          {"spec": {"config": {"path": "/etc/hostname"}}})
    stack = _wait(custom, namespace, lambda s: _ready(s) and (s["status"].get("outputs") or {}).get("content"),
                  "the fixed Stack Ready", name="reader")
    assert stack["status"]["outputs"]["content"].strip() == "reader-workspace"  # the pod's hostname
    assert not _locks(teams["beta"]["state"] / "reader")


def test_a_stack_deleted_in_the_foreground_is_destroyed_at_the_first_try_and_leaves_nothing(teams, kube_client):
    """pulumi-kubernetes deletes with foreground propagation: the garbage collector removes a Stack's
    dependents (its workspace pod, agent Secret and ServiceAccount) before its finalizer's destroy runs
    (PKO #753). The destroy still runs in a workspace pod at the first try, and the pod goes after."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace, state = teams["alpha"]["namespace"], teams["alpha"]["state"]
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "doomed"},
        "spec": {**_stack_spec(), "stack": "doomed", "destroyOnFinalize": True}})
    _wait(custom, namespace, _ready, "the doomed Stack Ready", name="doomed")
    assert list(state.rglob("doomed.json"))

    def events() -> list:
        return core.list_namespaced_event(namespace, field_selector="involvedObject.name=doomed").items

    before = {event.metadata.uid for event in events()}  # a first update's own warnings (its volume unbound, say)
    custom.delete_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", "doomed",
                                           body=client.V1DeleteOptions(propagation_policy="Foreground"))

    def gone() -> bool:
        return not any(s["metadata"]["name"] == "doomed" for s in custom.list_namespaced_custom_object(
            "pulumi.com", "v1", namespace, "stacks")["items"])

    processes.wait_until(gone, 240, "the doomed Stack destroyed and gone", interval=0.5)
    warnings = [(e.reason, e.message) for e in events() if e.type == "Warning" and e.metadata.uid not in before]
    assert not warnings, warnings
    # Destroyed and removed from its backend (`stack rm` refuses a stack that still has resources).
    assert not list(state.rglob("doomed.json"))
    assert not _locks(state)
    leftovers = lambda: [o.metadata.name for o in (  # noqa: E731
        *core.list_namespaced_pod(namespace).items, *core.list_namespaced_secret(namespace).items,
        *core.list_namespaced_service_account(namespace).items) if o.metadata.name.startswith("doomed-workspace")]
    processes.wait_until(lambda: not leftovers(), 60, "the doomed Stack's workspace objects removed", interval=0.5)


HOSTILE_TEMPLATE = {"spec": {"podTemplate": {"spec": {
    "hostPID": True, "nodeName": "real-0",
    "containers": [{"name": "pulumi", "securityContext": {"privileged": True, "runAsUser": 0},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}}}


def test_a_template_asking_for_the_node_gets_no_pod_and_the_namespace_refuses_such_a_pod_from_anyone(
        teams, kube_client):
    """What made a team node root beside the operator's pod: a Stack whose template asks for a privileged
    container as root, the node's processes and its `/`, on a named node. The operator refuses it before any
    pod exists, naming each field as typed; and the team's namespace (Pod Security `restricted`, as the platform
    labels it) refuses such a pod from anyone, the operator's and the team's own Deployments included. Alpha's
    app keeps running."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = teams["alpha"]["namespace"]
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "root"},
        "spec": {**_stack_spec(), "workspaceTemplate": HOSTILE_TEMPLATE}})
    stalled = _wait(custom, namespace, lambda s: any(c["type"] == "Stalled" and c["status"] == "True"
                                                     for c in (s.get("status") or {}).get("conditions") or []),
                    "the hostile template refused", 60, name="root")
    condition = next(c for c in stalled["status"]["conditions"] if c["type"] == "Stalled")
    assert condition["reason"] == "WorkspaceTemplateForbidden", condition
    prefix = "spec.workspaceTemplate.spec.podTemplate.spec"
    for field in ("hostPID", "nodeName", "containers[0].securityContext.privileged",
                  "containers[0].securityContext.runAsUser", "volumes[0].hostPath"):
        assert f"{prefix}.{field}" in condition["message"], (field, condition["message"])
    with pytest.raises(client.ApiException) as missing:
        core.read_namespaced_pod("root-workspace", namespace)
    assert missing.value.status == 404 and not stalled["status"].get("lastUpdate")
    # The namespace itself refuses a privileged pod on the node, even from an admin.
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(namespace, {"metadata": {"name": "node-root"}, "spec": {
            "hostPID": True, "nodeName": "real-0",
            "containers": [{"name": "root", "image": realnode.PAUSE_IMAGE, "securityContext": {"privileged": True}}]}})
    assert refused.value.status == 403 and "violates PodSecurity" in refused.value.body
    assert "restricted:latest" in refused.value.body
    _wait(custom, namespace, _ready, "alpha's app Ready beside it")
    custom.delete_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", "root")


def test_crafted_archives_are_refused_on_the_operator_images_own_python(teams, kube_client, operator_image):
    """The workspace agent unpacks uploads with the image's Python (Debian's 3.11.2, which has no tarfile
    extraction filter): every crafted archive case, run there in a pod of the team's namespace, holds."""
    core = client.CoreV1Api(kube_client)
    namespace = teams["beta"]["namespace"]
    script = (Path(__file__).resolve().parents[1] / "unit" / "operator" / "crafted_archives.py").read_text()
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "crafted-archives"},
                                                  "data": {"crafted_archives.py": script}})
    security = {"runAsNonRoot": True, "runAsUser": RUN_AS, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    core.create_namespaced_pod(namespace, {"metadata": {"name": "crafted-archives"}, "spec": {
        "restartPolicy": "Never", "nodeSelector": dict(realnode.NODE_LABEL), "tolerations": [dict(realnode.TOLERATION)],
        "automountServiceAccountToken": False,
        "containers": [{"name": "check", "image": operator_image.name, "imagePullPolicy": "Never",
                        "command": ["python", "/check/crafted_archives.py"], "securityContext": security,
                        "env": [{"name": "TMPDIR", "value": "/tmp"}],
                        "volumeMounts": [{"name": "check", "mountPath": "/check"},
                                         {"name": "tmp", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "check", "configMap": {"name": "crafted-archives"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]}})

    def finished():
        pod = core.read_namespaced_pod("crafted-archives", namespace)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = processes.wait_until(finished, 180, "the crafted archives checked in the operator image")
    log = core.read_namespaced_pod_log("crafted-archives", namespace)
    print(log[-3000:])
    assert pod.status.phase == "Succeeded", log[-3000:]
    assert "Python 3.11.2, tarfile extraction filter: False" in log and "FAIL" not in log, log[-3000:]
    assert log.count("ok  ") >= 20, log[-3000:]
    core.delete_namespaced_pod("crafted-archives", namespace, grace_period_seconds=0)
