"""The operator in-cluster, from its own image, as the Operator component renders it: two replicas on the
real node, probes answering, one leader, a takeover within the Lease time when the leader's pod is
deleted, and Stacks run to Ready from inside the pod under the operator's ServiceAccount.

Its process executor cannot sandbox a program inside its container (the runtime's default seccomp profile
refuses user namespaces), so it runs the programs of trusted namespaces only: the Stacks here live in one the
Operator component names in `trusted_namespaces`, and a team's namespace is refused."""

from __future__ import annotations

import base64
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.local import processes, realnode
from strata_components.local.kube import server_side_apply
from strata_components.local.operator_host import OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, install_operator_api
from strata_components.operator import LABELS, PROCESS_NAME, build_operator_objects, load_packaged_manifests

from .node_processes import pod_process

LEASE = "strata-operator-leader"
PASSPHRASE = "realnode-passphrase-0b7e"
SELECTOR = f"app.kubernetes.io/name={LABELS['app.kubernetes.io/name']}"
STASH_PROJECT = """name: {name}
runtime: yaml
resources:
  greeting: {{type: "pulumi:index:Stash", properties: {{input: "{value}"}}}}
outputs:
  greeting: ${{greeting.input}}
"""


def _operator_pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return [pod for pod in core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items
            if pod.metadata.deletion_timestamp is None]


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _holder(kube_client) -> str:
    try:
        lease = client.CoordinationV1Api(kube_client).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    except client.ApiException as error:
        if error.status == 404:
            return ""
        raise
    return lease.spec.holder_identity or ""


@pytest.fixture(scope="module")
def trusted(kube_client) -> Iterator[str]:
    """A namespace whose Stacks the in-cluster operator serves and trusts (the Operator component's
    `served_namespaces` and `trusted_namespaces`), as a single-team operator would."""
    name = f"trusted-{uuid.uuid4().hex[:5]}"
    client.CoreV1Api(kube_client).create_namespace({"metadata": {"name": name}})
    yield name
    client.CoreV1Api(kube_client).delete_namespace(name)


@pytest.fixture(scope="module")
def deployed(platform, kube_client, operator_image, trusted) -> Iterator[dict]:
    """Everything the Operator component creates in in-cluster mode, server-side applied; waits for 2 Ready pods."""
    install_operator_api(platform.kubeconfig_path)
    objects = build_operator_objects({
        "provider": None, "mode": "in-cluster", "image": operator_image.name, "image_pull_policy": "Never",
        "replicas": 2, "node_selector": realnode.NODE_LABEL, "tolerations": [realnode.TOLERATION],
        "args": ["--min-resync-seconds=3"], "served_namespaces": [trusted], "trusted_namespaces": [trusted],
    }, load_packaged_manifests("rbac"))
    started = time.monotonic()
    server_side_apply(platform.kubeconfig_path, objects)
    core = client.CoreV1Api(kube_client)

    def two_ready():
        pods = _operator_pods(core)
        return pods if len(pods) == 2 and all(_ready(p) for p in pods) else None

    try:
        processes.wait_until(two_ready, 120, "two operator pods Ready")
    except processes.ProcessError:
        seen = [(p.metadata.name, p.status.phase, p.status.container_statuses) for p in _operator_pods(core)]
        raise AssertionError(f"operator pods: {seen}") from None
    yield {"apply_to_ready_seconds": time.monotonic() - started}
    client.AppsV1Api(kube_client).delete_namespaced_deployment(PROCESS_NAME, OPERATOR_NAMESPACE,
                                                               propagation_policy="Foreground")
    # Gone, not only deleted: a replica still terminating handles every namespace's Stacks, and the next
    # module's operator must be the only one (a clean-clone run saw this one stall the pod executor's Stack).
    deleted = time.monotonic()

    def gone() -> bool:
        return not core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items

    try:
        processes.wait_until(gone, 180, "the in-cluster operator's pods gone")
    except processes.ProcessError as error:
        # Seen once in a clean-clone run, never reproduced (1-6 s otherwise): say what the pods were doing,
        # loudly, then make sure they are gone; cleaning up is this teardown's job, not a test of its own.
        warnings.warn(f"{error}; force-deleted: {_describe_pods(core)}", stacklevel=1)
        for pod in core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items:
            core.delete_namespaced_pod(pod.metadata.name, OPERATOR_NAMESPACE, grace_period_seconds=0)
        processes.wait_until(gone, 60, "the in-cluster operator's pods gone, force-deleted")
    print(f"operator pods gone {time.monotonic() - deleted:.1f}s after the Deployment's deletion")


def _describe_pods(core: client.CoreV1Api) -> str:
    """Each operator pod still there: its phase, deletion, containers' states and log tail, and Events."""
    described = []
    for pod in core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=SELECTOR).items:
        try:
            log = core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NAMESPACE, tail_lines=40)
        except client.ApiException as error:
            log = f"(no log: {error.status} {error.reason})"
        events = core.list_namespaced_event(OPERATOR_NAMESPACE, field_selector=f"involvedObject.name={pod.metadata.name}")
        described.append(f"\n--- {pod.metadata.name}: {pod.status.phase}, deleted {pod.metadata.deletion_timestamp}, "
                         f"containers {pod.status.container_statuses}\nEvents: {[e.message for e in events.items]}"
                         f"\nlog:\n{log}")
    return "".join(described)


def test_two_replicas_ready_with_probes_answering_and_one_leader(deployed, kube_client):
    core = client.CoreV1Api(kube_client)
    pods = _operator_pods(core)
    for pod in pods:
        container = pod.spec.containers[0]
        assert container.liveness_probe.http_get.path == "/healthz"
        assert container.readiness_probe.http_get.path == "/healthz"
        assert pod.spec.service_account_name == OPERATOR_SERVICE_ACCOUNT
        assert pod.status.container_statuses[0].restart_count == 0
        # What kubelet's probes ask, asked from the host over the pods' bridge.
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8384/healthz", timeout=5) as response:
            assert response.status == 200
    names = {pod.metadata.name for pod in pods}
    holder = processes.wait_until(lambda: _holder(kube_client), 30, "a leader")
    assert holder.rsplit("_", 1)[0] in names, (holder, names)


def _stack(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict:
    return custom.get_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", name)


def _wait_ready(custom: client.CustomObjectsApi, namespace: str, name: str, timeout: float = 120) -> dict:
    last = {}

    def ready():
        last["stack"] = _stack(custom, namespace, name)
        conditions = (last["stack"].get("status") or {}).get("conditions") or []
        return last["stack"] if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    try:
        return processes.wait_until(ready, timeout, f"Stack {name} Ready")
    except processes.ProcessError:
        raise AssertionError(f"Stack {name} not Ready: {(last.get('stack') or {}).get('status')}") from None


def _stack_base(core: client.CoreV1Api, namespace: str) -> dict:
    """The spec every Stack here shares: a file backend inside the operator's pod, a passphrase Secret (made once
    per namespace: the trusted one is the module's)."""
    try:
        core.create_namespaced_secret(namespace, {"metadata": {"name": "pulumi"}, "data": {
            "passphrase": base64.b64encode(PASSPHRASE.encode()).decode()}})
    except client.ApiException as error:
        if error.status != 409:
            raise
    return {"stack": "dev", "backend": f"file:///home/strata/state/backends/{namespace}",
            "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi",
                                                                                 "key": "passphrase"}}}}


def test_program_and_git_stacks_run_to_ready_inside_the_operator_pod(deployed, platform, kube_client, trusted):
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = trusted
    base = _stack_base(core, namespace)
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", {
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "hello"},
        "program": {"resources": {"greeting": {"type": "pulumi:index:Stash", "properties": {"input": "from a Program"}}},
                    "outputs": {"greeting": "${greeting.input}"}}})
    repo = f"realnode-{uuid.uuid4().hex[:6]}"
    platform.info().git.create(repo, {"Pulumi.yaml": STASH_PROJECT.format(name=repo, value="from git")})
    # The git server listens on loopback; pods reach it through the node gateway on the bridge.
    repo_url = f"http://{realnode.NODE_ADDRESS}:{platform.info().ports['git']}/{repo}.git"
    for name, source in (("from-program", {"programRef": {"name": "hello"}}),
                         ("from-git", {"projectRepo": repo_url, "branch": "main"})):
        custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
            "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": {**base, **source}})
    assert _wait_ready(custom, namespace, "from-program")["status"]["outputs"] == {"greeting": "from a Program"}
    assert _wait_ready(custom, namespace, "from-git")["status"]["outputs"] == {"greeting": "from git"}

    leader = _holder(kube_client).rsplit("_", 1)[0]
    log = core.read_namespaced_pod_log(leader, OPERATOR_NAMESPACE)
    assert f"[{namespace}/from-program]" in log and f"[{namespace}/from-git]" in log
    for pod in _operator_pods(core):
        if pod.metadata.name != leader:  # the standby ran nothing
            assert f"[{namespace}/" not in core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NAMESPACE)


def test_a_team_namespaces_program_is_refused_not_run_where_no_sandbox_can_run(deployed, kube_client, namespace):
    """A team's namespace, served but not trusted: inside the operator's container bubblewrap cannot make a
    sandbox, so the Stack stalls at once, naming the executor and the fixes; nothing of it runs."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    base = _stack_base(core, namespace)
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", {
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "token"},
        "program": _reader_program("/var/run/secrets/kubernetes.io/serviceaccount/token")})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "token"},
        "spec": {**base, "programRef": {"name": "token"}}})

    def stalled():
        status = _stack(custom, namespace, "token").get("status") or {}
        found = next((c for c in status.get("conditions") or []
                      if c["type"] == "Stalled" and c["status"] == "True"), None)
        return (found, status) if found else None

    condition, status = processes.wait_until(stalled, 120, "the team's Stack stalled")
    assert condition["reason"] == "ExecutorCannotIsolate", condition
    assert "--executor pod" in condition["message"] and "--trusted-namespace" in condition["message"]
    assert not status.get("lastUpdate") and not status.get("outputs"), "something of it ran"


def _reader_program(path: str) -> dict:
    return {"variables": {"content": {"fn::readFile": path}}, "outputs": {"content": "${content}"}}


def _create_reader(core: client.CoreV1Api, custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """A Stack of a Program that reads /dev/zero: its YAML host grows until the kernel kills a process."""
    base = _stack_base(core, namespace)
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", {
        "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name},
        "program": _reader_program("/dev/zero")})
    custom.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
        "spec": {**base, "programRef": {"name": name}}})


def _fixed_reader_output(custom: client.CustomObjectsApi, namespace: str, name: str) -> str:
    """The Program fixed to read /etc/hostname: what the Stack, Ready, read (the operator pod's name)."""
    custom.patch_namespaced_custom_object("pulumi.com", "v1", namespace, "programs", name,
                                          {"program": _reader_program("/etc/hostname")})
    return _wait_ready(custom, namespace, name, 240)["status"]["outputs"]["content"].strip()


def test_an_update_that_runs_the_operator_container_out_of_memory_says_so_and_the_operator_lives_on(
        deployed, kube_client, trusted):
    """Reading /dev/zero grows the update's YAML host until the kernel kills it at the operator container's
    memory limit (the Operator component's default, 1Gi). The Stack says so and names the field that raises
    it; the operator is not restarted, and the fixed program updates."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = trusted
    _create_reader(core, custom, namespace, "reader")

    def out_of_memory():
        last = (_stack(custom, namespace, "reader").get("status") or {}).get("lastUpdate") or {}
        return last if last.get("reason") == "OutOfMemory" else None

    message = processes.wait_until(out_of_memory, 180, "the update reported out of memory")["message"]
    assert message.startswith("the operator's container ran out of memory"), message
    assert "limit of 1024 MiB" in message and "raise the Operator component's resources.limits.memory" in message
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=reader").items
    assert any("ran out of memory" in (e.message or "") for e in events), [e.message for e in events]
    leader = _holder(kube_client).rsplit("_", 1)[0]
    assert _fixed_reader_output(custom, namespace, "reader") == leader  # read inside the leader's container
    # The kernel killed the update's language host, not the operator.
    assert all(p.status.container_statuses[0].restart_count == 0 for p in _operator_pods(core))


def test_the_standby_takes_over_within_the_lease_time_when_the_leader_pod_is_deleted(deployed, kube_client):
    core = client.CoreV1Api(kube_client)
    lease = client.CoordinationV1Api(kube_client).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    leader = lease.spec.holder_identity.rsplit("_", 1)[0]
    standby = next(p.metadata.name for p in _operator_pods(core) if p.metadata.name != leader)
    deleted = time.monotonic()
    # Even without a grace period kubelet stops the container with SIGTERM first: the leader releases
    # the Lease on its way out (a leader killed outright is tested on the host: test_leader_election.py).
    core.delete_namespaced_pod(leader, OPERATOR_NAMESPACE, grace_period_seconds=0)
    new_holder = processes.wait_until(lambda: (h := _holder(kube_client)) and not h.startswith(leader) and h,
                                      lease.spec.lease_duration_seconds * 3, "a new leader")
    took = time.monotonic() - deleted
    print(f"takeover after the leader pod was deleted: {took:.1f}s (Lease {lease.spec.lease_duration_seconds}s)")
    # The standby, or the Deployment's replacement pod if it came up and won the race: never the dead one.
    assert new_holder.rsplit("_", 1)[0] in {p.metadata.name for p in _operator_pods(core)} - {leader}, new_holder
    print(f"new leader: {'the standby' if new_holder.startswith(standby) else 'the replacement pod'}")
    assert took < lease.spec.lease_duration_seconds, took


GUARANTEED = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def _guaranteed_leader(core: client.CoreV1Api, kube_client) -> client.V1Pod:
    """The one operator pod left once the Deployment runs a single replica of Guaranteed QoS, leading."""
    def rolled_out():
        pods = _operator_pods(core)
        if len(pods) != 1 or not _ready(pods[0]) or pods[0].status.qos_class != "Guaranteed":
            return None
        return pods[0] if _holder(kube_client).startswith(f"{pods[0].metadata.name}_") else None

    return processes.wait_until(rolled_out, 240, "one Guaranteed operator pod leading")


def test_an_update_whose_oom_kill_takes_the_operator_container_fails_with_backoff_not_a_crash_loop(
        deployed, kube_client, trusted):
    """On cgroup v2 nodes the kernel kills a container whole at its limit, the operator with the update's
    language host; run again at once, as an interrupted update is, it would kill the operator again and
    again. This node is cgroup v1, where the kernel kills one process: it is made to choose the operator
    (a Guaranteed pod's processes rank last for the OOM killer, and the operator's own rank is raised to
    the top). The kubelet says OOMKilled; the restarted operator reads that from the pod that ran the
    update, and the update is a failure of its Stack, with backoff, naming the limit and the field.
    Last in the module: the Deployment is left with one replica."""
    core, custom = client.CoreV1Api(kube_client), client.CustomObjectsApi(kube_client)
    namespace = trusted
    client.AppsV1Api(kube_client).patch_namespaced_deployment(PROCESS_NAME, OPERATOR_NAMESPACE, {"spec": {
        "replicas": 1, "template": {"spec": {"containers": [{"name": "operator", "resources": GUARANTEED}]}}}})
    leader = _guaranteed_leader(core, kube_client)
    operator = pod_process(leader.metadata.uid, "strata_operator")
    Path(f"/proc/{operator}/oom_score_adj").write_text("1000")
    _create_reader(core, custom, namespace, "hog")

    def said_oom_killed():
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=hog").items
        return next((e.message for e in events if "the kernel killed the operator's container" in (e.message or "")),
                    None)

    message = processes.wait_until(said_oom_killed, 240, "the recovered update said the operator was OOM-killed")
    status = core.read_namespaced_pod(leader.metadata.name, OPERATOR_NAMESPACE).status.container_statuses[0]
    assert status.restart_count >= 1 and status.last_state.terminated.reason == "OOMKilled", status
    assert message.startswith("update hog-"), message
    assert (f"(pod {leader.metadata.name}) for out of memory at its memory limit of 1Gi, most likely for this "
            "update; raise the Operator component's resources.limits.memory") in message, message
    last = _stack(custom, namespace, "hog")["status"]["lastUpdate"]
    assert last["reason"] == "OutOfMemory" and last["state"] == "failed", last  # its retry's too, if it ran yet
    assert _fixed_reader_output(custom, namespace, "hog") == leader.metadata.name
