"""Shards (Flux's convention) splitting one fleet: who ran what, and what a Stack costs.

    sudo .venv/bin/python benchmarks/shards.py [--stacks 200] [--json benchmarks/results/shards-200.json]

A main operator (`--watch-label-selector '!sharding.fluxcd.io/key'`) and two shards
(`sharding.fluxcd.io/key=shard1|shard2`), each leading on its own Lease, on one scratch local platform
with the process executor. N Stacks of one small YAML Program are created at once, labelled
round-robin shard1, shard2 and (every tenth) none, for the main operator. Reported: time until all
are Ready; per operator the Stacks it holds (by finalizer) and ran (by its state directory: every
operator logs every Stack's wake-ups, only the one that runs it keeps its state), which must be exactly
its label's, none by two, none by none; engine runs per Stack from the backend's update history
(must be exactly 1); per operator its CPU, its process tree's CPU (workers and pulumi CLIs included,
from a cpuacct cgroup of its own: cgroups v1, root) and its RSS before and after, and from those the
per-Stack costs the README's Scaling section extrapolates from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import Counter
from pathlib import Path

from kubernetes import client

from harness import (GROUP, NAMESPACE, VERSION, cpu_seconds, engine_runs, is_ready, platform_with_operator,
                     rss_tree_mb, stash_program)
from strata_components.local.operator_host import operator_host
from strata_components.local.processes import descendants
from strata_components.local.toolchain import installed
from strata_operator.api.sharding import MAIN_SELECTOR, SHARD_KEY, Shard

CGROUPS = Path("/sys/fs/cgroup/cpuacct")
SHARDS = ("shard1", "shard2")


def cgroup_of(name: str, pid: int) -> Path:
    """A cpuacct cgroup holding `pid` and its descendants (whatever they fork later joins it too)."""
    group = CGROUPS / f"strata-bench-{name}"
    group.mkdir(exist_ok=True)
    for member in [pid, *descendants(pid)]:
        (group / "cgroup.procs").write_text(str(member))
    return group


def remove_cgroup(group: Path) -> None:
    """Back to the root cgroup with whatever of the tree outlived its operator (a plugin still exiting),
    then gone."""
    for member in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError, OSError):
            (CGROUPS / "cgroup.procs").write_text(member)
    group.rmdir()


def cgroup_cpu_seconds(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


def owner_of(index: int) -> str | None:
    return None if index % 10 == 9 else SHARDS[index % 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=200)
    parser.add_argument("--resources", type=int, default=3, help="Stash resources per program")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: each operator's process tree is measured in a cpuacct cgroup of its own")
    with platform_with_operator(("--watch-label-selector", MAIN_SELECTOR)) as bench:
        operators = {None: bench.operator}
        for shard in SHARDS:
            operators[shard] = operator_host(bench.platform, installed(), bench.scratch / f"operator-{shard}",
                                             name=f"strata-operator-{shard}",
                                             extra_args=("--watch-label-selector", f"{SHARD_KEY}={shard}"))
            operators[shard].start()
        pids = {shard: operator.pid() for shard, operator in operators.items()}
        groups = {shard: cgroup_of(shard or "main", pid) for shard, pid in pids.items()}
        time.sleep(3)  # every operator has listed the (empty) fleet and settled
        rss_before = {shard: rss_tree_mb(pid)[0] for shard, pid in pids.items()}
        cpu_before = {shard: (cpu_seconds(pid), cgroup_cpu_seconds(groups[shard])) for shard, pid in pids.items()}

        bench.create_program("fleet", stash_program(args.resources))
        started = time.monotonic()
        for index in range(args.stacks):
            owner = owner_of(index)
            spec = {"stack": f"s{index:04d}", "backend": bench.backend("fleet"), "programRef": {"name": "fleet"},
                    "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pulumi",
                                                                                           "key": "passphrase"}}}}
            bench.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack",
                "metadata": {"name": f"s{index:04d}", "labels": {SHARD_KEY: owner} if owner else {}}, "spec": spec})
        deadline = started + 120 + 5 * args.stacks
        said = 0.0
        while True:
            fleet = bench.stacks()
            ready = sum(map(is_ready, fleet))
            if ready == args.stacks:
                break
            if time.monotonic() - said >= 10:
                print(f"  {time.monotonic() - started:5.0f} s: {ready}/{args.stacks} Ready", flush=True)
                said = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {ready}/{args.stacks} Stacks Ready")
            time.sleep(1)
        all_ready = time.monotonic() - started
        time.sleep(3)  # the last status writes and Events
        rss_after = {shard: rss_tree_mb(pid)[0] for shard, pid in pids.items()}
        cpu_after = {shard: (cpu_seconds(pid), cgroup_cpu_seconds(groups[shard])) for shard, pid in pids.items()}

        finalizers = {shard: Shard.of(MAIN_SELECTOR if shard is None else f"{SHARD_KEY}={shard}").finalizer
                      for shard in operators}
        events = client.CoreV1Api(bench.api).list_namespaced_event(NAMESPACE).items
        runs = engine_runs(bench.scratch / "backends" / "fleet")
        wrong_holder, by_two, by_none = [], [], []
        for stack in fleet:
            name = stack["metadata"]["name"]
            owner = owner_of(int(name[1:]))
            held = [shard for shard, finalizer in finalizers.items()
                    if finalizer in (stack["metadata"].get("finalizers") or [])]
            ran = [shard for shard, operator in operators.items()
                   if (operator.state_dir / "stacks" / NAMESPACE / name).is_dir()]
            if held != [owner] or ran != [owner]:
                wrong_holder.append(name)
            by_two += [name] if len(ran) > 1 else []
            by_none += [name] if not ran else []
        duplicates = sum(count - 1 for count in runs.values() if count > 1)
        detected = Counter(event.involved_object.name for event in events if event.reason == "StackUpdateDetected")
        for name in sorted(name for name, count in detected.items() if count != runs[name])[:3]:
            said = [f"{event.reason}: {event.message}" for event in events if event.involved_object.name == name]
            print(f"  {name}: {detected[name]} StackUpdateDetected Events for {runs[name]} runs: {said}")
        for name in sorted(name for name, count in runs.items() if count > 1)[:5]:
            said = [f"{event.reason}: {event.message}" for event in events if event.involved_object.name == name]
            print(f"  {name} ran {runs[name]} times; its Events: {said}")
        print(f"{args.stacks} Stacks over the main operator and {len(SHARDS)} shards: all Ready in {all_ready:.1f} s")
        print(f"ownership: {len(wrong_holder)} held or run by the wrong operator, {len(by_two)} by two, "
              f"{len(by_none)} by none (all must be 0); engine runs {sum(runs.values())} for {args.stacks} Stacks, "
              f"{duplicates} duplicates (must be 0)")
        figures = {"stacks": args.stacks, "resources": args.resources, "all_ready_seconds": round(all_ready, 1),
                   "wrong_owner": len(wrong_holder), "run_by_two": len(by_two), "run_by_none": len(by_none),
                   "engine_runs": sum(runs.values()), "duplicate_runs": duplicates, "operators": {}, "cpus": os.cpu_count()}
        for shard in operators:
            owned = sum(owner_of(index) == shard for index in range(args.stacks))
            updates = sum(count for name, count in runs.items() if owner_of(int(name[1:])) == shard)
            operator_cpu = cpu_after[shard][0] - cpu_before[shard][0]
            tree_cpu = cpu_after[shard][1] - cpu_before[shard][1]
            grown = rss_after[shard] - rss_before[shard]
            label = shard or "main"
            per_update = tree_cpu / max(updates, 1)
            print(f"  {label:6s}: {owned:4d} Stacks; operator process {operator_cpu:6.1f} CPU-s, its tree (workers, "
                  f"pulumi CLIs) {tree_cpu:6.1f} CPU-s = {per_update:.2f} CPU-s per update ({updates} updates); RSS "
                  f"{rss_before[shard]:.0f} -> {rss_after[shard]:.0f} MB ({1024 * grown / owned:.0f} KB per Stack)")
            figures["operators"][label] = {
                "stacks": owned, "operator_cpu_s": round(operator_cpu, 2), "tree_cpu_s": round(tree_cpu, 2),
                "updates": updates, "tree_cpu_s_per_update": round(per_update, 3),
                "rss_before_mb": round(rss_before[shard], 1),
                "rss_after_mb": round(rss_after[shard], 1), "rss_kb_per_stack": round(1024 * grown / owned)}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(figures, indent=1))
        for operator in operators.values():
            operator.stop()
        for group in groups.values():
            remove_cgroup(group)


if __name__ == "__main__":
    main()
