"""A fleet of Stacks on the real engine: time to all Ready, reconcile latency, memory, idle silence.

    .venv/bin/python benchmarks/fleet.py [--stacks 50] [--idle 300] [--json benchmarks/results/fleet-50.json]

N Stacks of one small YAML Program (builtin Stash resources, file:// backend) are created at once.
Reported: time until all are Ready, per-Stack create->Ready latency p50/p95, peak RSS of the operator
process and of all its children (workers and pulumi CLIs), and engine runs while idle for --idle
seconds after that (must be 0). With --json, the figures and the raw series (every latency, memory
sampled every half second) go to that file for benchmarks/charts.py. The peer, PKO v1.16 on this machine kind: 50 Stacks in 80 s,
children peaking at 1.25 GB, 0 runs idle.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from pathlib import Path

from kubernetes import client

from harness import NAMESPACE, is_ready, platform_with_operator, pss_tree_mb, rss_tree_mb, stash_program


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=50)
    parser.add_argument("--idle", type=float, default=300, help="seconds to watch for engine runs when idle")
    parser.add_argument("--resources", type=int, default=3, help="Stash resources per program")
    parser.add_argument("--concurrency", type=int, help="the operator's --concurrency (default: its own)")
    parser.add_argument("--json", type=Path, help="write figures and series here (for benchmarks/charts.py)")
    args = parser.parse_args()
    operator_args = ("--concurrency", str(args.concurrency)) if args.concurrency else ()
    with platform_with_operator(operator_args) as bench:
        bench.create_program("fleet", stash_program(args.resources))
        pid = bench.operator.pid()
        peak = {"operator": 0.0, "children": 0.0, "children_pss": 0.0}
        memory: list[tuple[float, float, float]] = []  # (seconds since the fleet started, operator, children) MB
        sampling = threading.Event()
        started = time.monotonic()

        def sample() -> None:
            while not sampling.wait(0.5):
                own, children = rss_tree_mb(pid)
                memory.append((round(time.monotonic() - started, 2), round(own, 1), round(children, 1)))
                peak["operator"] = max(peak["operator"], own)
                peak["children"] = max(peak["children"], children)
                peak["children_pss"] = max(peak["children_pss"], pss_tree_mb(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        backend = bench.backend("fleet")  # one backend, N stacks: the common layout
        created: dict[str, float] = {}
        operator_cpu_before = cpu_seconds(pid)
        for index in range(args.stacks):
            name = f"s{index:03d}"
            bench.create_stack(name, "fleet", backend)
            created[name] = time.monotonic()
        ready_at: dict[str, float] = {}
        deadline = started + 60 + 10 * args.stacks
        while len(ready_at) < args.stacks:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(ready_at)}/{args.stacks} Stacks Ready")
            now = time.monotonic()
            for stack in bench.stacks():
                name = stack["metadata"]["name"]
                if name not in ready_at and is_ready(stack):
                    ready_at[name] = now
            time.sleep(0.25)
        all_ready = max(ready_at.values()) - started
        operator_cpu = cpu_seconds(pid) - operator_cpu_before
        latencies = [ready_at[name] - created[name] for name in created]
        print(f"{args.stacks} Stacks all Ready in {all_ready:6.1f}s   (PKO v1.16: 50 in 80 s; goal <= 35 s)")
        print(f"create->Ready latency  p50 {percentile(latencies, 0.5):6.1f}s   p95 {percentile(latencies, 0.95):6.1f}s")
        print(f"CPU of the operator process (Kopf, handlers, API calls): {operator_cpu:5.1f} s")
        print(f"peak RSS  operator {peak['operator']:7.1f} MB   children {peak['children']:7.1f} MB "
              f"(PSS {peak['children_pss']:6.1f} MB; PKO v1.16 children: 1250 MB RSS)")

        snapshot = {s["metadata"]["name"]: s["status"].get("lastUpdate") for s in bench.stacks()}
        quiet_since = time.monotonic()
        events_before = {e.metadata.uid for e in client.CoreV1Api(bench.api).list_namespaced_event(NAMESPACE).items
                         if e.reason == "StackUpdateDetected"}
        time.sleep(args.idle)
        sampling.set()
        changed = [s["metadata"]["name"] for s in bench.stacks() if s["status"].get("lastUpdate") != snapshot.get(
            s["metadata"]["name"])]
        new_runs = [e for e in client.CoreV1Api(bench.api).list_namespaced_event(NAMESPACE).items
                    if e.reason == "StackUpdateDetected" and e.metadata.uid not in events_before]
        idle_seconds = time.monotonic() - quiet_since
        print(f"idle {idle_seconds:5.0f}s: {len(new_runs)} engine runs, {len(changed)} Stacks with a new "
              f"lastUpdate (must be 0; PKO v1.16: 0)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "stacks": args.stacks, "resources": args.resources, "all_ready_seconds": round(all_ready, 2),
                "latency_seconds": sorted(round(value, 2) for value in latencies),
                "operator_cpu_seconds": round(operator_cpu, 2), "peak_mb": {k: round(v, 1) for k, v in peak.items()},
                "memory_mb": memory, "idle_seconds": round(idle_seconds), "idle_engine_runs": len(new_runs),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                # This machine is shared: the load says how quiet it was (2 cores here).
                "load_average_1m": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
            }, indent=1))
            print(f"figures and series written to {args.json}")


if __name__ == "__main__":
    main()
