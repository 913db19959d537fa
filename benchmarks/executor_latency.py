"""One update's latency, pod executor against process executor in one run; memory per node and workspace pod.

#27 item 5.

    sudo flock /tmp/strata-heavy.lock .venv/bin/python benchmarks/executor_latency.py [--changes 5]
        [--resources 10] [--json benchmarks/results/executor-latency.json]

A scratch platform of the cluster profile (2 real nodes, the registry, the object store) and two operators on
the host, each scoped to its own namespace: one with the process executor (forked workers on the host), one
with the pod executor (a workspace pod per Stack on the real nodes, the operator image pushed to the
registry and pulled by the node, as the cluster stack runs it). Each namespace gets the same YAML Program of
Stash resources and one Stack of it, both with their state in one s3:// bucket of the object store.

Each Stack's first update is timed alone (cold: for the pod executor the workspace pod is created and its
image pulled), then --changes changes of the Program, one at a time, alternating between the executors so
that the shared machine's noise falls on both alike; each change gives every resource a new input. Reported
per executor: seconds from the change to the Stack Ready with that revision (median, p95), the executor's
run of the engine as the operator timed it (its stack_update_duration_seconds), the engine's own seconds per
update from the bucket's history (endTime - startTime, whole seconds only), and the ratio pod/process.
Then the working set of each pod on every real node and of all the node's pods together, from the kubelets'
summary API (the workspace pod's among them; a node's own figure is the host's, which every node shares), and,
for comparison, the RSS of the process executor's workers on the host.
Progress at least every 10 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from cluster_faults import done
from fleet import percentile
from harness import (GROUP, VERSION, Heartbeat, S3Bucket, cluster_platform, object_store_secret, pod_executor_args,
                     pss_tree_mb, rss_tree_mb, stash_program, write_json)
from make_up import node_memory, say_memory
from strata_components import s3
from strata_components.local import objectstore
from strata_components.local.images import build_operator_image, user_pulumi_install
from strata_components.local.kube import api_client
from strata_components.local.operator_host import OperatorHost, operator_host, serve_namespace

EXECUTORS = ("process", "pod")  # the process one's operator first: its RBAC, then the pod executor's beside it
BUCKET = "executor-latency"
PROGRAM = "latency"
UPDATE_TIMEOUT = 600


def namespace(executor: str) -> str:
    return f"latency-{executor}"


def start_operators(platform, toolchain, scratch: Path, hb: Heartbeat) -> tuple[dict[str, OperatorHost], str]:
    """The two host operators, each on its namespace; the pod executor's workspace image from the registry."""
    hb.phase("building the operator image (a cache hit when nothing changed) and pushing it to the registry")
    image = build_operator_image(toolchain, user_pulumi_install(), say=hb.say)
    reference = platform.push_image(image, "strata-operator", image.name.rsplit(":", 1)[1])
    operators = {}
    for executor in EXECUTORS:
        hb.phase(f"starting the {executor} executor's operator on the host, namespace {namespace(executor)}")
        args = (pod_executor_args(reference, "IfNotPresent", namespace(executor)) if executor == "pod"
                else ("--no-leader-election", "--namespace", namespace(executor)))
        operators[executor] = operator_host(platform, toolchain, scratch / f"operator-{executor}", executor=executor,
                                            extra_args=args, name=f"strata-operator-{executor}")
        operators[executor].start()
    return operators, reference


def create_stack(platform, core: client.CoreV1Api, custom: client.CustomObjectsApi, executor: str,
                 resources: int) -> None:
    """The executor's namespace, its object-store Secret, the Program and one Stack (named after the executor,
    which is also its stack in the shared bucket)."""
    team = namespace(executor)
    core.create_namespace({"metadata": {"name": team}})
    serve_namespace(platform.kubeconfig_path, team)  # as a team environment does
    env_refs, _ = object_store_secret(platform, core, team)
    custom.create_namespaced_custom_object(GROUP, VERSION, team, "programs", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": PROGRAM},
        "program": stash_program(resources, "first")})
    custom.create_namespaced_custom_object(GROUP, VERSION, team, "stacks", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": executor},
        "spec": {"stack": executor, "backend": platform.s3_backend_url(BUCKET), "programRef": {"name": PROGRAM},
                 "envRefs": env_refs}})


def wait_done(custom: client.CustomObjectsApi, executor: str, revision: str, started: float, hb: Heartbeat) -> float:
    """Seconds from `started` until the executor's Stack is Ready with `revision` (polled every 0.1 s)."""
    said = started
    while True:
        stack = custom.get_namespaced_custom_object(GROUP, VERSION, namespace(executor), "stacks", executor)
        if done(stack, revision):
            return time.monotonic() - started
        last = (stack.get("status") or {}).get("lastUpdate") or {}
        if last.get("state") == "failed" and last.get("lastAttemptedCommit") == revision:
            raise RuntimeError(f"{executor}: the update of {revision} failed: {str(last.get('message'))[:300]}")
        now = time.monotonic()
        if now - started > UPDATE_TIMEOUT:
            raise TimeoutError(f"{executor}: not Ready with {revision} after {UPDATE_TIMEOUT} s: {last}")
        if now - said >= 10:
            hb.say(f"  {executor}: waiting {now - started:.0f} s for Ready with {revision} (last update: "
                   f"{last.get('state', 'none')})")
            said = now
        time.sleep(0.1)


def change_program(custom: client.CustomObjectsApi, executor: str, resources: int, revision: str) -> str:
    """A new input for every resource of the executor's Program; returns the revision its Stack records."""
    program = custom.patch_namespaced_custom_object(GROUP, VERSION, namespace(executor), "programs", PROGRAM,
                                                    {"program": stash_program(resources, revision)})
    return f"{PROGRAM}/{program['metadata']['generation']}"


def run_seconds_so_far(operator: OperatorHost) -> float:
    """The operator's own timing of its succeeded `up` runs, summed (stack_update_duration_seconds): the
    executor's run of the engine, from the request to its result, to the millisecond."""
    return sum(sample.value for family in text_string_to_metric_families(operator.metrics())
               for sample in family.samples if sample.name == "stack_update_duration_seconds_sum"
               and sample.labels == {"operation": "up", "outcome": "succeeded"})


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "p95": round(percentile(values, 0.95), 2),
            "all": [round(value, 2) for value in values]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=5, help="Program changes timed per executor")
    parser.add_argument("--resources", type=int, default=10, help="Stash resources in the Program")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    hb = Heartbeat()
    figures: dict = {"changes": args.changes, "resources": args.resources, "cpus": os.cpu_count(),
                     "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with cluster_platform(hb, "strata-bench-latency-") as (platform, toolchain, scratch), \
            api_client(platform.kubeconfig_path) as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        operators, figures["workspace_image"] = start_operators(platform, toolchain, scratch, hb)
        platform.create_bucket(BUCKET)
        since = time.time()
        cold = {}
        for executor in EXECUTORS:  # one at a time: neither's first update competes with the other's
            hb.phase(f"{executor} executor: the Stack created, its first update (cold)")
            started = time.monotonic()
            create_stack(platform, core, custom, executor, args.resources)
            cold[executor] = round(wait_done(custom, executor, f"{PROGRAM}/1", started, hb), 2)
            hb.say(f"{executor} executor: created -> Ready in {cold[executor]} s")
        latency: dict[str, list[float]] = {executor: [] for executor in EXECUTORS}
        executor_runs: dict[str, list[float]] = {executor: [] for executor in EXECUTORS}
        for index in range(args.changes):
            for executor in EXECUTORS if index % 2 == 0 else reversed(EXECUTORS):  # neither always goes first
                run_seconds_before = run_seconds_so_far(operators[executor])
                started = time.monotonic()
                revision = change_program(custom, executor, args.resources, f"change {index + 1}")
                latency[executor].append(wait_done(custom, executor, revision, started, hb))
                executor_runs[executor].append(run_seconds_so_far(operators[executor]) - run_seconds_before)
                hb.say(f"change {index + 1}/{args.changes}, {executor} executor: change -> Ready with {revision} "
                       f"in {latency[executor][-1]:.2f} s (the executor's run {executor_runs[executor][-1]:.2f} s)")
        keys = objectstore.read_credentials(platform.object_store_credentials)
        history = S3Bucket(objectstore.endpoint(platform.object_store_port()), BUCKET,
                           s3.Credentials(*keys)).updates(since)
        engine = {executor: [update["endTime"] - update["startTime"] for update in history.get(executor, [])]
                  for executor in EXECUTORS}
        hb.phase("reading the memory of every real node and pod from the kubelets' summary API")
        memory = node_memory(platform.kubeconfig_path)
        workspace_pods = {pod: mb for node in memory.values() for pod, mb in node["pods_mb"].items()
                          if pod.startswith(namespace("pod") + "/")}
        workers_rss = rss_tree_mb(operators["process"].pid())
        figures.update({
            "cold_first_update_seconds": cold,
            "change_to_ready_seconds": {executor: summary(values) for executor, values in latency.items()},
            # The first run is the cold one; the rest are the changes'.
            "engine_update_seconds": {executor: {"first": values[0] if values else None, "changes": summary(values[1:])}
                                      for executor, values in engine.items()},
            "executor_run_seconds": {executor: summary(values) for executor, values in executor_runs.items()},
            "engine_runs": {executor: len(values) for executor, values in engine.items()},
            "memory": memory, "workspace_pods_mb": workspace_pods,
            "process_executor_host_mb": {"operator_rss": round(workers_rss[0], 1),
                                         "workers_rss": round(workers_rss[1], 1),
                                         "workers_pss": round(pss_tree_mb(operators["process"].pid()), 1)},
            "load_average_1m": round(os.getloadavg()[0], 1)})
        ratio = {key: round(figures["change_to_ready_seconds"]["pod"][key]
                            / figures["change_to_ready_seconds"]["process"][key], 2) for key in ("median", "p95")}
        figures["pod_over_process"] = ratio
        write_json(args.json, figures)

    print(f"\n== one update ({args.resources} Stash resources changed, state in s3://), {args.changes} changes per "
          f"executor, alternating; {os.cpu_count()} cores, load {figures['load_average_1m']}")
    for executor in EXECUTORS:
        seen, run = figures["change_to_ready_seconds"][executor], figures["engine_update_seconds"][executor]
        engine_changes = run["changes"] or {"median": None, "p95": None}
        print(f"  {executor:8} cold first update {cold[executor]:6.2f} s (engine {run['first']} s); change -> Ready "
              f"median {seen['median']:5.2f} s, p95 {seen['p95']:5.2f} s; engine's own update median "
              f"{engine_changes['median']} s, p95 {engine_changes['p95']} s ({figures['engine_runs'][executor]} engine runs)")
        runs = figures["executor_run_seconds"][executor]
        print(f"  {'':8} the executor's run of the engine (request to result, the operator's own timing): median "
              f"{runs['median']:5.2f} s, p95 {runs['p95']:5.2f} s")
    print(f"  pod / process, change -> Ready: median x{ratio['median']}, p95 x{ratio['p95']}")
    say_memory(memory)
    print(f"  workspace pods (MB): {workspace_pods}; the process executor on the host: operator "
          f"{figures['process_executor_host_mb']['operator_rss']} MB RSS, its workers "
          f"{figures['process_executor_host_mb']['workers_rss']} MB RSS ({figures['process_executor_host_mb']['workers_pss']} MB PSS)")
    if args.json:
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
