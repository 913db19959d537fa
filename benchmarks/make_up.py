"""`make up` as a user types it, from a fresh home with the toolchain and package caches warm: every layer
Ready, and where the time went (the bootstrap's `pulumi up`, each Stack's environment and update).

    .venv/bin/python benchmarks/make_up.py [--rounds 2] [--json benchmarks/results/make-up.json]
    .venv/bin/python benchmarks/make_up.py --stack cluster --cold [--json ...]   # as root: `make up STACK=cluster`

A first, unmeasured round warms the caches (uv's, the plugin cache; the toolchain is warm after `make
setup`) unless --no-warm-up. Each round runs `make up` with a new STRATA_HOME, reads the times of its
progress lines as they come, each Stack's last-update.json from the operator's state directory (the
worker records the environment's seconds and the run's), and ends with `make down`. Needs what `make
up` needs (the Pulumi install with the Python language host and the kubernetes/flux plugins).

With `--stack cluster` (#27 item 5) the stand-in's start and the images' build and push are phases too,
and each round reads, before its `make down`, the memory of every real node and pod from the kubelets'
summary API. `--cold` measures one more round first, with the operator image's archive moved aside: it
is built and pushed again, as after any change to the project (the archive is put back if that fails).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `make up`'s progress lines: where the bootstrap's pulumi up starts and ends, and a Stack turning Ready;
# for the cluster stack also where the stand-in is ready and the images are built and pushed.
BOOTSTRAP_END = "==> waiting until every Stack and Kustomization is Ready"
READY_LINE = re.compile(r"^\s*((?:kustomization )?\S+/[^\s:]+): Ready\b")
STANDIN_READY = "local platform ready in"
IMAGES_DONE = "==> checking the cluster stack's"


def make(target: str, home: Path, timeout: float, stack: str = "dev") -> tuple[int, list[tuple[float, str]]]:
    """Run `make <target>` as the README says, with this home; its output lines with their times."""
    env = {**os.environ, "STRATA_HOME": str(home)}
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    variables = [] if stack == "dev" else [f"STACK={stack}"]
    process = subprocess.Popen(["make", target, *variables], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
        print(f"  [{lines[-1][0]:6.1f}s] {lines[-1][1]}", flush=True)
    return process.wait(timeout=timeout), lines


def at(lines: list[tuple[float, str]], prefix: str) -> float | None:
    return next((when for when, line in lines if line.startswith(prefix)), None)


def stack_runs(home: Path) -> dict[str, dict[str, float]]:
    """Each Stack's last run, as its worker recorded it: namespace/name -> seconds (environment, total)."""
    found = {}
    for log in sorted((home / "platform" / "operator" / "stacks").glob("*/*/last-update.json")):
        record = json.loads(log.read_text())
        found[f"{log.parent.parent.name}/{log.parent.name}"] = record.get("seconds") or {}
    return found


def node_memory(kubeconfig: Path) -> dict:
    """Working-set MB of every real node and of each pod on it, from the kubelets' summary API. A real node's
    own figure is its root cgroup's, which on this stand-in is the whole host's (every node runs on it); what
    the node's pods take together is the `pods` system container (its kubepods cgroup)."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    core = client.CoreV1Api(api)
    found = {}
    try:
        for node in core.list_node().items:
            try:
                # Raw: the client would turn the JSON into a dict's repr for a `str` return type.
                summary = json.loads(core.connect_get_node_proxy_with_path(node.metadata.name, "stats/summary",
                                                                           _preload_content=False).data)
            except (client.ApiException, ValueError):
                continue  # a kwok node: no kubelet behind it
            pods_cgroup = next((c for c in summary["node"].get("systemContainers", []) if c.get("name") == "pods"), {})
            pods_working_set = (pods_cgroup.get("memory") or {}).get("workingSetBytes")
            found[node.metadata.name] = {
                "node_mb": round(summary["node"]["memory"]["workingSetBytes"] / 2**20, 1),
                "pods_cgroup_mb": round(pods_working_set / 2**20, 1) if pods_working_set is not None else None,
                "pods_mb": {f"{pod['podRef']['namespace']}/{pod['podRef']['name']}":
                            round(pod["memory"]["workingSetBytes"] / 2**20, 1) for pod in summary.get("pods", [])
                            if (pod.get("memory") or {}).get("workingSetBytes") is not None}}
    finally:
        api.close()
    return found


def measure(home: Path, timeout: float, stack: str = "dev") -> dict:
    code, lines = make("up", home, timeout, stack)
    if code != 0:
        raise SystemExit(f"make up failed (exit {code}); its output is above")
    ready: dict[str, float] = {}
    for when, line in lines:
        match = READY_LINE.match(line)
        if match and match.group(1) not in ready:
            ready[match.group(1)] = when
    # The machine is shared: how busy it was as the round ended, beside its figures.
    result = {"total_seconds": at(lines, f"==> the {stack} stack is up in"), "bootstrap_up_seconds": None,
              "ready_at": ready, "stack_runs": stack_runs(home), "load_average_1m": round(os.getloadavg()[0], 2)}
    start, end = at(lines, f"==> pulumi up of the {stack} stack"), at(lines, BOOTSTRAP_END)
    if start is not None and end is not None:
        result["bootstrap_up_seconds"] = round(end - start, 1)
    if stack == "cluster":
        standin, images = at(lines, STANDIN_READY), at(lines, IMAGES_DONE)
        result["standin_ready_at"] = standin
        result["images_seconds"] = round(images - standin, 1) if images is not None and standin is not None else None
        result["memory"] = node_memory(home / "platform-cluster" / "kubeconfig")
    started = time.monotonic()
    code, _ = make("down", home, timeout, stack)
    if code != 0:
        raise SystemExit(f"make down failed (exit {code}); its output is above")
    result["down_seconds"] = round(time.monotonic() - started, 1)
    return result


def cold_round(home: Path, timeout: float, stack: str) -> dict:
    """A round with the operator image's archive moved aside (built and pushed again)."""
    from strata_components.local.images import images_dir

    with tempfile.TemporaryDirectory(prefix="strata-cold-image-", dir=images_dir()) as aside:
        moved = [Path(shutil.move(str(archive), aside)) for archive in images_dir().glob("strata-operator-*.oci.tar")]
        try:
            return measure(home, timeout, stack)
        finally:
            for archive in moved:
                if not (images_dir() / archive.name).exists():
                    shutil.move(str(archive), images_dir())


def report(title: str, figures: dict) -> None:
    extra = (f"; stand-in ready at {figures['standin_ready_at']:.1f} s, images built and pushed in "
             f"{figures['images_seconds']} s" if "standin_ready_at" in figures else "")
    print(f"{title}: every layer Ready in {figures['total_seconds']:.1f} s (bootstrap pulumi up "
          f"{figures['bootstrap_up_seconds']} s{extra}; make down {figures['down_seconds']} s; "
          f"load {figures['load_average_1m']})")
    for key, when in sorted(figures["ready_at"].items(), key=lambda item: item[1]):
        run = figures["stack_runs"].get(key, {})
        detail = (f"   environment {run['environment']:.1f} s, run {run['total']:.1f} s" if "total" in run
                  and "environment" in run else f"   run {run['total']:.1f} s" if "total" in run else "")
        print(f"  {key:45} Ready at {when:6.1f} s{detail}")
    say_memory(figures.get("memory", {}))


def say_memory(memory: dict) -> None:
    """node_memory's reading, a line per node."""
    for node, reading in sorted(memory.items()):
        pods = ", ".join(f"{pod} {mb}" for pod, mb in sorted(reading["pods_mb"].items()))
        print(f"  node {node}: {reading['node_mb']} MB working set (the host's), its pods together "
              f"{reading.get('pods_cgroup_mb')} MB; each pod (MB): {pods}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="dev", choices=("dev", "cluster"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-warm-up", action="store_true", help="measure the first round too (caches as they are)")
    parser.add_argument("--cold", action="store_true", help="first a measured round with the operator image rebuilt")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    goal = 45 if args.stack == "dev" else 180
    rounds, cold = [], None
    with tempfile.TemporaryDirectory(prefix="strata-make-up-") as scratch:
        if args.cold:
            print("== cold round: the operator image built and pushed again", flush=True)
            cold = cold_round(Path(scratch) / "cold", args.timeout, args.stack)
        elif not args.no_warm_up:
            print("== warm-up round (not measured)", flush=True)
            measure(Path(scratch) / "warm-up", args.timeout, args.stack)
        for index in range(args.rounds):
            print(f"== round {index + 1} of {args.rounds}: make up from a fresh home", flush=True)
            rounds.append(measure(Path(scratch) / f"round-{index}", args.timeout, args.stack))
    print(f"\n== make up{'' if args.stack == 'dev' else ' STACK=' + args.stack}, fresh home")
    if cold is not None:
        report("cold (operator image rebuilt)", cold)
    for index, figures in enumerate(rounds, 1):
        report(f"warm round {index}", figures)
    totals = [figures["total_seconds"] for figures in rounds]
    print(f"warm median {statistics.median(totals):.1f} s over {len(totals)} round(s); goal {goal} s: "
          f"{'met' if statistics.median(totals) <= goal else 'missed'}; machine: {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"stack": args.stack, "cold": cold, "rounds": rounds,
                                         "cores": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
