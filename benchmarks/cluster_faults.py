"""Faults on the production topology (#27 item 4): the in-cluster operator, workspace pods, s3:// state.

    sudo flock /tmp/strata-heavy.lock .venv/bin/python benchmarks/cluster_faults.py [--stacks 6]
        [--resources 120] [--faults leader,node,objectstore] [--json benchmarks/results/cluster-faults.json]

A scratch platform of the cluster profile (2 real nodes, the registry, MinIO); the operator image pushed
to the registry and run as the Operator component renders it in-cluster (build_operator_objects: 2
replicas, leader election, `executor: pod`); N Stacks in a team namespace, one YAML Program of Stash
resources, state in an s3:// bucket of the object store whose keys a Secret holds and the Stacks'
envRefs name; each Stack's updates in its workspace pod. After the fill, each fault gets a round: the
Program changed (every resource's input, so every Stack re-runs all of it), and once every Stack's
update is running, the fault strikes:
- leader: the operator's leader pod deleted (a normal delete, the default grace);
- objectstore: MinIO stopped for 30 s, then started again by the platform's `up`;
- node: the kubelet of the node hosting most workspace pods stopped for 30 s, started again by `up`.
Reported per round: seconds until every Stack is Ready with the new revision, after the fault ended;
engine runs per Stack since the change, from the bucket's update history (.pulumi/history/, read with
the repository's SigV4 signer; every run counted, failed ones and duplicates too); locks left
(.pulumi/locks/, must be 0); Stacks not Ready at the end (must be 0); and what a user saw: the distinct
Stack conditions and Events during the outage and until all were done, with those not already seen
during the normal update before the strike. Progress is printed at least every 10 s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

from kubernetes import client

from harness import (GROUP, VERSION, Heartbeat, S3Bucket, cluster_platform, is_ready, object_store_secret,
                     stash_program, write_json)
from strata_components import s3
from strata_components.local import objectstore, realnode
from strata_components.local.images import build_operator_image, user_pulumi_install
from strata_components.local.kube import api_client, server_side_apply
from strata_components.local.operator_host import OPERATOR_NAMESPACE, install_operator_api, serve_namespace
from strata_components.local.platform import LocalPlatform
from strata_components.operator import LABELS, build_operator_objects, load_packaged_manifests

# The object store last: a lock its outage left in the backend would hold every later round's updates.
FAULTS = ("leader", "node", "objectstore")
TEAM = "team-faults"
BUCKET = "cluster-faults"
PROGRAM = "faults"
LEASE = "strata-operator-leader"
OPERATOR_PODS = f"app.kubernetes.io/name={LABELS['app.kubernetes.io/name']}"
OUTAGE_SECONDS = 30
STRIKE_DELAY = 5  # seconds after every Stack's update started: mid-update, past the engine's start
EVENT_NAMESPACES = (TEAM, OPERATOR_NAMESPACE, "default")  # Stacks and workspace pods; the operator; Nodes


class Redactor:
    """The object store's keys never reach the output or the JSON, whatever a message quotes."""

    def __init__(self, *secrets: str) -> None:
        self.secrets = [s for s in secrets if s]

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text[:400]


class Cluster:
    """The scratch cluster's handles, shared by the rounds: the team namespace of the Stacks and the
    bucket of their state."""

    def __init__(self, platform: LocalPlatform, api: client.ApiClient, hb: Heartbeat, team: str = TEAM,
                 bucket: str = BUCKET) -> None:
        self.platform, self.api, self.hb, self.team = platform, api, hb, team
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        keys = objectstore.read_credentials(platform.object_store_credentials)
        self.redact = Redactor(*keys)
        self.bucket = S3Bucket(objectstore.endpoint(platform.object_store_port()), bucket, s3.Credentials(*keys))

    def stacks(self) -> list[dict] | None:
        """The team's Stacks, or None when the apiserver does not answer in 5 s."""
        try:
            return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.team, "stacks",
                                                             _request_timeout=5)["items"]
        except Exception:  # noqa: BLE001 - unknown this poll; the next one asks again
            return None

    def leader(self) -> str:
        """The operator pod holding the Lease ('' when none does)."""
        return self.lease()[0]

    def lease(self) -> tuple[str, float | None]:
        """The operator pod holding the Lease ('' when none does) and when it acquired it (epoch seconds)."""
        try:
            spec = client.CoordinationV1Api(self.api).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE).spec
        except client.ApiException as error:
            if error.status == 404:
                return "", None
            raise
        acquired = spec.acquire_time.timestamp() if spec.acquire_time else None
        return (spec.holder_identity or "").rsplit("_", 1)[0], acquired

    def operator_pods(self) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(OPERATOR_NAMESPACE, label_selector=OPERATOR_PODS).items

    def operators_ready(self, replicas: int = 2, image: str = "") -> bool:
        """`replicas` operator pods (of `image`, if given) Ready, not being deleted, and one of them leading."""
        pods = [p for p in self.operator_pods() if p.metadata.deletion_timestamp is None
                and (not image or p.spec.containers[0].image == image)]
        ready = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return len(ready) == replicas and self.leader() in {p.metadata.name for p in ready}

    def wait(self, check: Callable[[], object], timeout: float, what: str) -> object:
        """Poll `check` every second until truthy, saying so (the heartbeat covers the silence)."""
        before, self.hb.doing = self.hb.doing, f"waiting for {what}"
        deadline = time.monotonic() + timeout
        try:
            while not (result := check()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: not after {timeout:.0f} s")
                time.sleep(1)
        finally:
            self.hb.doing = before  # a wait in the fault's thread must not leave the heartbeat saying it
        return result


def start_operator(cluster: Cluster, toolchain) -> str:
    """The operator image pushed to the registry and the Operator component's in-cluster objects applied;
    returns the image once both replicas are Ready and one leads."""
    hb, platform = cluster.hb, cluster.platform
    hb.phase("building the operator image (a cache hit when nothing changed) and pushing it to the registry")
    image = build_operator_image(toolchain, user_pulumi_install(), say=hb.say)
    reference = platform.push_image(image, "strata-operator", image.name.rsplit(":", 1)[1])
    hb.phase(f"applying the operator in-cluster: {reference}, 2 replicas, executor pod")
    install_operator_api(platform.kubeconfig_path, executor="pod")
    placement = {"node_selector": dict(realnode.NODE_LABEL), "tolerations": [dict(realnode.TOLERATION)]}
    server_side_apply(platform.kubeconfig_path, build_operator_objects({
        "provider": None, "mode": "in-cluster", "image": reference, "image_pull_policy": "IfNotPresent",
        "replicas": 2, "executor": "pod", **placement,
        "workspace_node_selector": placement["node_selector"], "workspace_tolerations": placement["tolerations"],
    }, load_packaged_manifests("rbac")))
    cluster.wait(cluster.operators_ready, 300, "both operator pods Ready and one leading")
    hb.say(f"operator Ready: leader {cluster.leader()}, pods on "
           f"{sorted(p.spec.node_name for p in cluster.operator_pods())}")
    return reference


def create_team(cluster: Cluster, count: int, resources: int, program: str = PROGRAM,
                first: tuple[int, str, dict] | None = None) -> list[str]:
    """The team namespace, its Secret (the object store's keys and a passphrase), the Program and the
    Stacks (named <program>-<index>, returned), their state in the cluster's bucket. `first` (how many,
    a Program name, its body): the first Stacks use that Program instead, created too."""
    cluster.platform.create_bucket(cluster.bucket.bucket)
    cluster.core.create_namespace({"metadata": {"name": cluster.team}})
    serve_namespace(cluster.platform.kubeconfig_path, cluster.team, ("pod",))  # as a team environment does
    env_refs, passphrase = object_store_secret(cluster.platform, cluster.core, cluster.team)
    cluster.redact.secrets.append(passphrase)
    first_count, first_name, first_body = first or (0, "", {})
    programs = {program: stash_program(resources, "fill"), **({first_name: first_body} if first_count else {})}
    for name, body in programs.items():
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.team, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": name}, "program": body})
    # The endpoint and bucket only: no credential in it.
    backend = cluster.platform.s3_backend_url(cluster.bucket.bucket)
    names = [f"{program}-{index:02d}" for index in range(count)]
    for index, name in enumerate(names):
        ref = first_name if index < first_count else program
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.team, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name},
            "spec": {"stack": name, "backend": backend, "programRef": {"name": ref}, "envRefs": env_refs}})
    return names


def program_revision(cluster: Cluster) -> str:
    program = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, TEAM, "programs", PROGRAM)
    return f"{PROGRAM}/{program['metadata']['generation']}"  # what a Program's Stack records as its commit


def done(stack: dict, revision: str) -> bool:
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return is_ready(stack) and last.get("state") == "succeeded" and last.get("lastSuccessfulCommit") == revision


def running(stack: dict, revision: str) -> bool:
    return ((stack.get("status") or {}).get("currentUpdate") or {}).get("commit") == revision


class Fault:
    """One fault: `strike` takes something away and returns what it struck; `end` (in a thread) brings it
    back after `hold` seconds, or waits until the cluster has recovered it by itself."""

    def __init__(self, name: str, cluster: Cluster, hold: float) -> None:
        self.name, self.cluster, self.hold = name, cluster, hold
        self.target = ""

    def strike(self) -> str:
        platform = self.cluster.platform
        if self.name == "leader":
            self.target = self.cluster.leader()
            self.cluster.core.delete_namespaced_pod(self.target, OPERATOR_NAMESPACE)  # default grace
            return f"the leader pod {self.target} deleted (default grace)"
        if self.name == "objectstore":
            platform.stop_controller(objectstore.PROCESS)
            return f"the object store ({objectstore.PROCESS}) stopped for {self.hold:.0f} s"
        self.target = busiest_node(self.cluster) or realnode.load_node(
            realnode.node_dirs(platform.state)[0]).name
        platform.stop_controller(f"kubelet-{self.target}")
        return f"{self.target}'s kubelet stopped for {self.hold:.0f} s"

    def end(self) -> str:
        if self.name == "leader":  # the fault ends when another pod leads
            self.cluster.wait(lambda: (leader := self.cluster.leader()) and leader != self.target, 600,
                              "a new leader")
            return f"{self.cluster.leader()} leads"
        time.sleep(self.hold)
        self.cluster.platform.up(say=lambda _: None)  # starts what is not running, waits until it is ready
        return "started again by the platform's up"


def busiest_node(cluster: Cluster) -> str:
    """The real node running most of the team's workspace pods."""
    counts: dict[str, int] = {}
    for pod in cluster.core.list_namespaced_pod(TEAM).items:
        if pod.spec.node_name and pod.metadata.name.endswith("-workspace"):
            counts[pod.spec.node_name] = counts.get(pod.spec.node_name, 0) + 1
    return max(sorted(counts), key=lambda node: counts[node]) if counts else ""


class Seen:
    """What a user could see: each Stack condition and Event, by its text, with when it was first seen
    (seconds from the strike) and which objects showed it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.conditions: dict[tuple, dict] = {}
        self.events: dict[tuple, dict] = {}
        self.nodes: dict[tuple, tuple[str, float]] = {}  # (node, Ready status, reason) -> (window, first seen)

    def look(self, stacks: list[dict] | None, window: str, at: float, since: datetime.datetime) -> None:
        redact = self.cluster.redact
        for stack in stacks or []:
            for condition in (stack.get("status") or {}).get("conditions") or []:
                key = (condition["type"], condition["status"], condition.get("reason", ""),
                       redact(condition.get("message", "")))
                entry = self.conditions.setdefault(key, {"window": window, "first_seen_s": round(at, 1),
                                                         "stacks": set()})
                entry["stacks"].add(stack["metadata"]["name"])
        try:
            for node in self.cluster.core.list_node(label_selector="type=real", _request_timeout=5).items:
                ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
                if ready is not None:
                    key = (node.metadata.name, ready.status, ready.reason or "")
                    self.nodes.setdefault(key, (window, round(at, 1)))
            events = self.cluster.core.list_event_for_all_namespaces(_request_timeout=5).items
        except Exception:  # noqa: BLE001 - the apiserver does not answer this poll
            return
        for event in events:
            when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
            if event.metadata.namespace not in EVENT_NAMESPACES or when is None or when < since:
                continue
            involved = event.involved_object
            key = (event.metadata.namespace, involved.kind, event.type, event.reason, redact(event.message or ""))
            entry = self.events.setdefault(key, {"window": window, "first_seen_s": round(at, 1), "objects": set()})
            entry["objects"].add(involved.name)

    def report(self, window: str, baseline: Seen | None = None) -> dict:
        """Those first seen in `window`; `new` leaves out what `baseline` (the normal update) showed."""
        normal_conditions = {key[:3] for key in baseline.conditions} if baseline else set()
        normal_events = {key[:4] for key in baseline.events} if baseline else set()
        conditions = [{"type": k[0], "status": k[1], "reason": k[2], "message": k[3], "first_seen_s": v["first_seen_s"],
                       "stacks": len(v["stacks"]), "new": k[:3] not in normal_conditions}
                      for k, v in self.conditions.items() if v["window"] == window]
        events = [{"namespace": k[0], "kind": k[1], "type": k[2], "reason": k[3], "message": k[4],
                   "first_seen_s": v["first_seen_s"], "objects": sorted(v["objects"])[:6],
                   "new": k[:4] not in normal_events}
                  for k, v in self.events.items() if v["window"] == window]
        return {"nodes_ready": [{"node": k[0], "ready": k[1], "reason": k[2], "first_seen_s": at}
                                for k, (seen_in, at) in self.nodes.items() if seen_in == window],
                "conditions": sorted(conditions, key=lambda c: c["first_seen_s"]),
                "events": sorted(events, key=lambda e: e["first_seen_s"])}


def run_round(cluster: Cluster, name: str, count: int, resources: int, hold: float, patience: float) -> dict:
    """Change the Program, strike `name` mid-update, and wait until every Stack is done again."""
    hb = cluster.hb
    changed_wall = time.time()
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, TEAM, "programs", PROGRAM,
                                                  {"program": stash_program(resources, name)})
    revision = program_revision(cluster)
    hb.phase(f"{name}: the Program changed ({revision}): every Stack re-runs all {resources} resources")
    fault = Fault(name, cluster, hold)
    baseline, seen = Seen(cluster), Seen(cluster)
    started = time.monotonic()
    all_started_at = struck_at = ended_at = all_done_at = None
    done_count = running_count = 0
    ending: threading.Thread | None = None
    end_said: list[str] = []
    what, said, window, at_strike = "", 0.0, "outage", (0, 0)
    deadline = started + 900  # past it, or `patience` after the fault ended, what is not done is stuck
    changed = datetime.datetime.fromtimestamp(int(changed_wall), datetime.UTC)
    struck_wall = changed
    while True:
        now = time.monotonic()
        fleet = cluster.stacks()
        if fleet is not None:
            done_count = sum(done(s, revision) for s in fleet)
            running_count = sum(running(s, revision) for s in fleet)
        if struck_at is None:
            baseline.look(fleet, "normal", now - started, changed)  # what a normal update shows
            if fleet is not None and all_started_at is None and running_count + done_count == count:
                all_started_at = now
            if all_started_at is not None and now - all_started_at >= STRIKE_DELAY or now - started > 120:
                struck_wall = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
                what = fault.strike()
                struck_at, at_strike = time.monotonic(), (running_count, done_count)
                hb.say(f"{name}: {done_count}/{count} done, {running_count} running: STRIKE: {what}")

                def end_it() -> None:
                    end_said.append(fault.end())
                ending = threading.Thread(target=end_it, daemon=True)
                ending.start()
        else:
            if ended_at is None and ending is not None and not ending.is_alive():
                ended_at = time.monotonic()
                window = "recovery"
                hb.say(f"{name}: the fault ended {ended_at - struck_at:.1f} s after the strike: "
                       f"{end_said[0] if end_said else 'its ending failed: see above'}")
            seen.look(fleet, window, now - struck_at, struck_wall)
            if fleet is not None and done_count == count and all_done_at is None:
                all_done_at = now  # may come before the fault ends (a draining leader lets its updates finish)
            elif fleet is not None and done_count < count:
                all_done_at = None
            if ended_at is not None and all_done_at is not None:
                break
        if now - said >= 10:
            state = ("before the strike" if struck_at is None else
                     f"{now - struck_at:.0f} s after the strike" + (", fault ended" if ended_at else ""))
            hb.say(f"{name}: {done_count if fleet is not None else '?'}/{count} done, "
                   f"{running_count if fleet is not None else '?'} running ({state})")
            said = now
        if now > deadline or ended_at is not None and now - ended_at > patience:
            stuck = [s["metadata"]["name"] for s in fleet or [] if not done(s, revision)]
            hb.say(f"{name}: STUCK: not done {now - started:.0f} s after the change: {stuck}")
            break
        time.sleep(1)
    hb.phase(f"{name}: all done; 10 s for a late run or a Stack falling back before counting")
    time.sleep(10)
    return {"revision": revision, "struck": what, "target": fault.target, "running_at_strike": at_strike[0],
            "done_at_strike": at_strike[1], "stuck": all_done_at is None,
            "struck_at_s": round(struck_at - started, 1) if struck_at else None,
            "all_updates_started_at_s": round(all_started_at - started, 1) if all_started_at else None,
            "fault_ended_after_s": round(ended_at - struck_at, 1) if ended_at and struck_at else None,
            # Negative: every Stack was done before the fault ended.
            "all_done_after_strike_s": round(all_done_at - struck_at, 1) if all_done_at and struck_at else None,
            "all_done_after_fault_ended_s": round(all_done_at - ended_at, 1) if all_done_at and ended_at else None,
            "changed_wall": changed_wall,
            "seen_during_outage": seen.report("outage", baseline),
            "seen_during_recovery": seen.report("recovery", baseline)}


def backend_figures(cluster: Cluster, since: float, count: int) -> dict:
    """Engine runs per Stack since `since` and locks left, from the bucket."""
    updates = cluster.bucket.updates(int(since))  # the history's startTime is in whole seconds
    runs = {stack: [{"result": u.get("result"), "seconds": u.get("endTime", 0) - u.get("startTime", 0),
                     "run": run_name(u.get("message") or "")}
                    for u in history] for stack, history in sorted(updates.items())}
    durations = [r["seconds"] for history in runs.values() for r in history if r["result"] == "succeeded"]
    succeeded = {stack: sum(r["result"] == "succeeded" for r in history) for stack, history in runs.items()}
    return {"engine_runs": sum(len(h) for h in runs.values()), "runs_per_stack": runs,
            "stacks_not_run": count - len(runs),
            "stacks_succeeded_more_than_once": sorted(s for s, n in succeeded.items() if n > 1),
            "same_run_recorded_twice": sorted(s for s, h in runs.items() if len({r["run"] for r in h}) < len(h)),
            "update_seconds_median": median(durations) if durations else None,
            "locks_left": cluster.bucket.locks()}


def not_done(cluster: Cluster, stack: dict) -> dict:
    """Where a Stack that did not get done stands, as `kubectl get stack -o yaml` shows it (redacted)."""
    status = stack.get("status") or {}
    last = status.get("lastUpdate") or {}
    return {"conditions": [f"{c['type']}={c['status']} {c.get('reason', '')}: {cluster.redact(c.get('message', ''))}"
                           for c in status.get("conditions") or []],
            "last_update": {k: cluster.redact(str(v)) for k, v in last.items()},
            "current_update": bool(status.get("currentUpdate"))}


def run_name(message: str) -> str:
    """The operator's run name, which each update's message ends with (`[strata run <name>]`)."""
    return message.rpartition("[strata run ")[2].rstrip("]") if "[strata run " in message else ""


def say_round(hb: Heartbeat, name: str, figures: dict) -> None:
    runs = ", ".join(f"{stack}: {'+'.join(r['result'] or '?' for r in history)}"
                     for stack, history in figures["runs_per_stack"].items())
    hb.say(f"== {name}: {figures['struck']}; fault ended {figures['fault_ended_after_s']} s after the strike; all "
           f"Ready with {figures['revision']} {figures['all_done_after_fault_ended_s']} s after it ended "
           f"({figures['all_done_after_strike_s']} s after the strike); engine runs {figures['engine_runs']} "
           f"[{runs}]; locks left {len(figures['locks_left'])}; not Ready {len(figures['stacks_not_ready'])}; "
           f"median update {figures['update_seconds_median']} s")
    for window in ("seen_during_outage", "seen_during_recovery"):
        seen = figures[window]
        new = [c for c in seen["conditions"] if c["new"]] + [e for e in seen["events"] if e["new"]]
        hb.say(f"  {window.replace('_', ' ')}: {len(seen['conditions'])} distinct Stack conditions, "
               f"{len(seen['events'])} Events; not seen in a normal update: "
               + ("NOTHING" if not new else ""))
        for item in new:
            where = f"Stack condition {item['type']}={item['status']}" if "type" in item and "kind" not in item \
                else f"Event {item['namespace']}/{item['kind']} {item['type']}"
            hb.say(f"    +{item['first_seen_s']} s {where} {item['reason']}: {item['message'][:200]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=6)
    parser.add_argument("--resources", type=int, default=120,
                        help="Stash resources per Program (120: a 20-40 s update of 6 Stacks on 2 cores)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"some of {','.join(FAULTS)}, in that order")
    parser.add_argument("--hold", type=float, default=OUTAGE_SECONDS, help="seconds the object store/kubelet stay down")
    parser.add_argument("--patience", type=float, default=300,
                        help="seconds after a fault ended before the Stacks not done are reported stuck")
    parser.add_argument("--json", type=Path, help="write the figures here (after every round)")
    args = parser.parse_args()
    faults = args.faults.split(",")
    if set(faults) - set(FAULTS):
        parser.error(f"--faults: choose from {FAULTS}")
    hb = Heartbeat()
    figures: dict = {"stacks": args.stacks, "resources": args.resources, "hold_seconds": args.hold, "rounds": {},
                     "cpus": os.cpu_count(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with cluster_platform(hb, "strata-bench-faults-") as (platform, toolchain, _), \
            api_client(platform.kubeconfig_path) as api:
        cluster = Cluster(platform, api, hb)
        figures["operator_image"] = start_operator(cluster, toolchain)
        fill_wall = time.time()
        create_team(cluster, args.stacks, args.resources)
        revision = program_revision(cluster)
        hb.phase(f"the fill: {args.stacks} Stacks of {args.resources} Stash resources, state in s3://{BUCKET}")
        fill_started = time.monotonic()

        def filled() -> bool:
            fleet = cluster.stacks() or []
            hb.doing = f"the fill: {sum(done(s, revision) for s in fleet)}/{args.stacks} done"
            return len(fleet) == args.stacks and all(done(s, revision) for s in fleet)
        cluster.wait(filled, 900, f"every Stack Ready with {revision}")
        fill = backend_figures(cluster, fill_wall, args.stacks)
        figures["fill"] = {"seconds": round(time.monotonic() - fill_started, 1),
                           "update_seconds_median": fill["update_seconds_median"],
                           "engine_runs": fill["engine_runs"], "locks_left": len(fill["locks_left"])}
        hb.say(f"fill: all Ready in {figures['fill']['seconds']} s, median update "
               f"{fill['update_seconds_median']} s, engine runs {fill['engine_runs']}")
        for name in faults:
            result = run_round(cluster, name, args.stacks, args.resources, args.hold, args.patience)
            result.update(backend_figures(cluster, result.pop("changed_wall"), args.stacks))
            fleet = cluster.stacks() or []
            result["stacks_not_ready"] = sorted(s["metadata"]["name"] for s in fleet if not is_ready(s))
            result["not_done"] = {s["metadata"]["name"]: not_done(cluster, s) for s in fleet
                                  if not done(s, result["revision"])}
            result["operator_pods"] = {p.metadata.name: {"node": p.spec.node_name, "restarts": sum(
                c.restart_count for c in p.status.container_statuses or [])} for p in cluster.operator_pods()}
            result["leader"] = cluster.leader()
            figures["rounds"][name] = result
            say_round(hb, name, result)
            write_json(args.json, figures)
        hb.phase("the end: 10 s for a late run or a Stack falling back")
        time.sleep(10)
        stacks = cluster.stacks() or []
        figures["end"] = {"stacks_not_ready": sorted(s["metadata"]["name"] for s in stacks if not is_ready(s)),
                          "locks_left": cluster.bucket.locks(),
                          "load_average_1m": round(os.getloadavg()[0], 1)}
        hb.say(f"end: {len(stacks)} Stacks, not Ready {figures['end']['stacks_not_ready']}, locks left "
               f"{figures['end']['locks_left']}, 1-min load {figures['end']['load_average_1m']}")
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
