"""Faults on the production topology (#27 item 4): the operator in-cluster from the registry's image (two
replicas, leader election, `executor: pod`), each Stack's updates in its own workspace pod, its state in
the object store. Each fault strikes while every Stack's update holds its lock in the bucket:
- the leader pod deleted (the default grace): the standby leads, the old leader's updates end;
- the kubelet of the node running a workspace pod stopped for 30 s: shorter than Kubernetes's node
  grace period, so the Node stays Ready and the pods run on; nothing fails, so nothing is reported;
- the object store stopped for 30 s: each Stack says Reconciling `BackendUnreachable` with a Warning
  Event naming the address while it lasts, and `BackendReachable` once it is back.
Each ends with every Stack Ready with the new revision, one succeeded engine run per Stack since the
change (the bucket's update history: none lost, none twice), and no lock left in the bucket.
`benchmarks/cluster_faults.py` measures the same faults on more Stacks, with timings.
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client

from strata_components import s3
from strata_components.local import objectstore, processes, realnode
from strata_components.local.kube import server_side_apply
from strata_components.local.operator_host import OPERATOR_NAMESPACE, install_operator_api, serve_namespace
from strata_components.local.platform import LocalPlatform
from strata_components.operator import LABELS, PROCESS_NAME, build_operator_objects, load_packaged_manifests
from strata_components.team import POD_SECURITY_LABELS

from .conftest import object_store_env_refs

GROUP, VERSION = "pulumi.com", "v1"
STACKS = ("faults-a", "faults-b")
PROGRAM = "faults"
RESOURCES = 50  # enough checkpoint writes that every update is still running when the fault strikes
OUTAGE_SECONDS = 30
LEASE = "strata-operator-leader"
OPERATOR_PODS = f"app.kubernetes.io/name={LABELS['app.kubernetes.io/name']}"


def stash_program(revision: str) -> dict:
    """A YAML Program of Stash resources; a new `revision` changes every input, so an update steps through all."""
    return {"resources": {f"note{i}": {"type": "pulumi:index:Stash", "properties": {"input": f"{i} {revision}"}}
                          for i in range(RESOURCES)}}


@dataclass
class Fleet:
    platform: LocalPlatform
    namespace: str
    bucket: str
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    coordination: client.CoordinationV1Api

    def _store(self, method: str, path: str, query: dict | None = None) -> str:
        credentials = s3.Credentials(*objectstore.read_credentials(self.platform.object_store_credentials))
        status, body = s3.request(objectstore.endpoint(self.platform.object_store_port()), method, path, credentials,
                                  query=query)
        assert status == 200, f"{method} {path}: HTTP {status} ({s3.error_code(body)})"
        return body

    def keys(self, prefix: str) -> list[str]:
        body = self._store("GET", f"/{self.bucket}", {"list-type": "2", "prefix": prefix})
        return [part.split("</Key>")[0] for part in body.split("<Key>")[1:]]

    def locks(self) -> list[str]:
        return [key for key in self.keys(".pulumi/locks/") if key.endswith(".json")]

    def runs_since(self, since: float) -> dict[str, list[str]]:
        """Each stack's engine runs started at or after `since`, by result, from the bucket's update history."""
        runs: dict[str, list[str]] = {}
        for key in self.keys(".pulumi/history/"):
            if key.endswith(".history.json"):
                update = json.loads(self._store("GET", f"/{self.bucket}/{key}"))
                if update.get("startTime", 0) >= int(since):  # the history's times are whole seconds
                    runs.setdefault(key.split("/")[-2], []).append(update.get("result"))
        return runs

    def stacks(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks")["items"]

    def leader(self) -> str:
        """The operator pod holding the Lease (its holder is <hostname>_<pid>, a pod's hostname its name)."""
        lease = self.coordination.read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
        return (lease.spec.holder_identity or "").rsplit("_", 1)[0]

    def change_program(self, revision: str) -> tuple[str, float]:
        """The Program changed: every Stack re-runs all of it. Returns the revision its Stacks record, and when."""
        changed = time.time()
        program = self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "programs", PROGRAM,
                                                             {"program": stash_program(revision)})
        return f"{PROGRAM}/{program['metadata']['generation']}", changed

    def wait_updates_holding_their_locks(self) -> None:
        processes.wait_until(lambda: len(self.locks()) == len(STACKS), 120, "every Stack's update holding its lock",
                             interval=0.3)

    def wait_done(self, revision: str, timeout: float = 300) -> None:
        def done(stack: dict) -> bool:
            status = stack.get("status") or {}
            last = status.get("lastUpdate") or {}
            return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []) \
                and last.get("state") == "succeeded" and last.get("lastSuccessfulCommit") == revision

        try:
            processes.wait_until(lambda: all(done(s) for s in self.stacks()), timeout,
                                 f"every Stack Ready with {revision}", interval=1)
        except processes.ProcessError:
            raise AssertionError(self.describe()) from None

    def describe(self) -> str:
        """What a failed check shows: each Stack's status and Events, and the leader's last log lines."""
        events = [(e.involved_object.name, e.type, e.reason, e.message) for e in self.stack_events()]
        try:
            log = self.core.read_namespaced_pod_log(self.leader(), OPERATOR_NAMESPACE, tail_lines=80)
        except client.ApiException as error:
            log = f"(no leader's log: {error.reason})"
        return (json.dumps({s["metadata"]["name"]: s.get("status") for s in self.stacks()}, indent=1)
                + "\nEvents:\n" + "\n".join(map(str, events)) + f"\nthe leader's log:\n{log}")

    def stack_events(self, reason: str | None = None, since: float = 0) -> list[client.CoreV1Event]:
        after = datetime.datetime.fromtimestamp(int(since), datetime.UTC)
        return [event for event in self.core.list_namespaced_event(
                    self.namespace, field_selector="involvedObject.kind=Stack").items
                if (reason is None or event.reason == reason)
                and (event.last_timestamp or event.event_time or event.metadata.creation_timestamp) >= after]

    def assert_each_stack_ran_once_and_left_no_lock(self, since: float) -> None:
        runs = self.runs_since(since)
        assert sorted(runs) == sorted(STACKS), f"{runs}\n{self.describe()}"
        assert all(results.count("succeeded") == 1 for results in runs.values()), f"{runs}\n{self.describe()}"
        assert self.locks() == []


@pytest.fixture(scope="module")
def fleet(platform: LocalPlatform, kube_client, python_image: str) -> Iterator[Fleet]:
    """The operator in-cluster as the Operator component renders it, limited to a namespace of its own,
    and two Stacks of one Program with their state in a bucket of the object store, Ready."""
    core = client.CoreV1Api(kube_client)
    suffix = uuid.uuid4().hex[:5]
    namespace, bucket = f"faults-{suffix}", f"faults-{suffix}"
    core.create_namespace({"metadata": {"name": namespace, "labels": POD_SECURITY_LABELS}})
    install_operator_api(platform.kubeconfig_path, executor="pod")
    serve_namespace(platform.kubeconfig_path, namespace, ("pod",))  # as a team environment does
    placement = {"node_selector": dict(realnode.NODE_LABEL), "tolerations": [dict(realnode.TOLERATION)]}
    server_side_apply(platform.kubeconfig_path, build_operator_objects({
        "provider": None, "mode": "in-cluster", "image": python_image, "image_pull_policy": "IfNotPresent",
        "replicas": 2, "executor": "pod", "args": ["--namespace", namespace, "--min-resync-seconds=3"], **placement,
        "workspace_node_selector": placement["node_selector"], "workspace_tolerations": placement["tolerations"],
    }, load_packaged_manifests("rbac")))
    fleet = Fleet(platform, namespace, bucket, core, client.CustomObjectsApi(kube_client),
                  client.CoordinationV1Api(kube_client))

    def two_ready_and_a_leader() -> bool:
        pods = [p for p in core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=OPERATOR_PODS).items
                if p.metadata.deletion_timestamp is None]
        ready = {p.metadata.name for p in pods
                 if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])}
        try:
            return len(ready) == 2 and fleet.leader() in ready
        except client.ApiException:
            return False  # no Lease yet

    try:
        processes.wait_until(two_ready_and_a_leader, 300, "both operator pods Ready and one leading", interval=1)
        platform.create_bucket(bucket)
        env_refs = object_store_env_refs(core, platform, namespace)
        fleet.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": PROGRAM},
            "program": stash_program("fill")})
        for name in STACKS:
            fleet.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name},
                "spec": {"stack": name, "backend": platform.s3_backend_url(bucket), "programRef": {"name": PROGRAM},
                         "envRefs": env_refs}})
        fleet.wait_done(f"{PROGRAM}/1")
        yield fleet
    finally:
        # The Stacks go while their operator runs (their finalizers need it), then the operator: gone, not
        # only deleted, as the next module's operator must be the only one.
        core.delete_namespace(namespace)
        try:
            processes.wait_until(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
                                 300, f"namespace {namespace} gone")
        except processes.ProcessError:
            finalizers = {s["metadata"]["name"]: s["metadata"].get("finalizers") for s in fleet.stacks()}
            raise AssertionError(f"{core.read_namespace(namespace).status}\nfinalizers: {finalizers}\n"
                                 f"{fleet.describe()}") from None
        client.AppsV1Api(kube_client).delete_namespaced_deployment(PROCESS_NAME, OPERATOR_NAMESPACE,
                                                                   propagation_policy="Foreground")
        processes.wait_until(lambda: not core.list_namespaced_pod(OPERATOR_NAMESPACE,
                                                                  label_selector=OPERATOR_PODS).items,
                             180, "the in-cluster operator's pods gone")


def test_the_leader_pod_deleted_mid_update_hands_over_and_every_update_ends_once(fleet: Fleet):
    revision, changed = fleet.change_program("leader")
    fleet.wait_updates_holding_their_locks()
    leader = fleet.leader()
    fleet.core.delete_namespaced_pod(leader, OPERATOR_NAMESPACE)  # the default grace: the leader drains
    # What the user sees: the Lease held by another pod (`kubectl get lease -n strata-system`).
    successor = processes.wait_until(lambda: (holder := fleet.leader()) != leader and holder, 180, "a new leader",
                                     interval=1)
    print(f"{leader} deleted mid-update; {successor} leads")

    fleet.wait_done(revision)
    fleet.assert_each_stack_ran_once_and_left_no_lock(changed)
    assert [e.message for e in fleet.stack_events(since=changed) if e.type == "Warning"] == []


def test_a_workspace_pods_kubelet_stopped_for_30_s_mid_update_lets_every_update_end_once(fleet: Fleet):
    revision, changed = fleet.change_program("kubelet")
    fleet.wait_updates_holding_their_locks()
    node = fleet.core.read_namespaced_pod(f"{STACKS[0]}-workspace", fleet.namespace).spec.node_name
    assert fleet.platform.stop_controller(f"kubelet-{node}")
    try:
        time.sleep(OUTAGE_SECONDS)
        ready = next(c for c in fleet.core.read_node(node).status.conditions if c.type == "Ready")
        print(f"{node}'s kubelet stopped for {OUTAGE_SECONDS} s; its Node said Ready={ready.status} ({ready.reason})")
    finally:
        fleet.platform.up(say=print)  # starts what is not running and waits until it is ready

    fleet.wait_done(revision)
    fleet.assert_each_stack_ran_once_and_left_no_lock(changed)
    assert [e.message for e in fleet.stack_events(since=changed) if e.type == "Warning"] == []


def test_the_object_store_stopped_for_30_s_mid_update_is_said_while_it_lasts_and_every_update_ends_once(
        fleet: Fleet):
    revision, changed = fleet.change_program("objectstore")
    fleet.wait_updates_holding_their_locks()
    address = objectstore.endpoint(fleet.platform.object_store_port()).removeprefix("http://")
    assert fleet.platform.stop_controller(objectstore.PROCESS)
    stopped = time.monotonic()
    try:
        def every_stack_says_so() -> bool:
            return all(any(c["type"] == "Reconciling" and c.get("reason") == "BackendUnreachable"
                           and address in c.get("message", "")
                           for c in (s.get("status") or {}).get("conditions") or []) for s in fleet.stacks())

        try:
            processes.wait_until(every_stack_says_so, OUTAGE_SECONDS - 5,
                                 "Reconciling/BackendUnreachable on every Stack", interval=0.5)
        except processes.ProcessError as error:
            raise AssertionError(f"{error}: {fleet.describe()}") from None
        warnings = fleet.stack_events("BackendUnreachable", since=changed)
        assert {e.involved_object.name for e in warnings} == set(STACKS), fleet.describe()
        assert all(e.type == "Warning" and address in e.message for e in warnings), fleet.describe()
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
    finally:
        fleet.platform.up(say=print)

    fleet.wait_done(revision)
    assert {e.involved_object.name for e in fleet.stack_events("BackendReachable", since=changed)} == set(STACKS), \
        fleet.describe()
    fleet.assert_each_stack_ran_once_and_left_no_lock(changed)
