"""What approval and drift detection cost, measured on the real operator and engine in one run.

    sudo .venv/bin/python benchmarks/features.py [--approval 5] [--drift-stacks 50] [--drift-seconds 120]

Approval: Stacks with `approval: {mode: Manual}` beside the same number without, all on one small
Program: create -> plan awaiting approval, approve -> Ready, against create -> Ready without approval.
Drift: N Ready Stacks; the CPU the operator and everything it starts (workers, pulumi CLIs) uses over
a window with nothing to do, then over a window of the same length with drift detection on every
Stack; the difference per check, and what that makes per hour at the default interval (1h) and at
10 minutes. CPU is read from a cpuacct cgroup holding the operator's process tree (cgroups v1, root),
so the short-lived CLIs are counted and nothing else on the machine is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path

from harness import NAMESPACE, GROUP, VERSION, Bench, is_ready, platform_with_operator, stash_program
from strata_components.local.processes import descendants

CGROUP = Path("/sys/fs/cgroup/cpuacct/strata-bench-features")


def wait_for(read, predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = read()
        if predicate(value):
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:g}s waiting for {what}")


def condition_reason(stack: dict, ctype: str) -> str:
    for found in (stack.get("status") or {}).get("conditions") or []:
        if found["type"] == ctype and found["status"] == "True":
            return found["reason"]
    return ""


def stack_body(name: str, backend: str, **extra) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name},
            "spec": {"stack": name, "backend": backend, "programRef": {"name": "bench"},
                     "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {
                         "type": "Secret", "secret": {"name": "pulumi", "key": "passphrase"}}}, **extra}}


def approval_figures(bench: Bench, count: int) -> dict:
    plain, preview, applied = [], [], []
    for index in range(count):
        name = f"plain-{index}"
        started = time.monotonic()
        bench.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks",
                                                     stack_body(name, bench.backend(name)))
        wait_for(lambda: bench.get_stack(name), is_ready, 120, f"{name} Ready")
        plain.append(time.monotonic() - started)

        name = f"gated-{index}"
        started = time.monotonic()
        bench.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", stack_body(
            name, bench.backend(name), approval={"mode": "Manual"}))
        waiting = wait_for(lambda: bench.get_stack(name), lambda s: condition_reason(s, "Reconciling") ==
                           "AwaitingApproval", 120, f"{name} awaiting approval")
        preview.append(time.monotonic() - started)
        started = time.monotonic()
        bench.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", name, {
            "metadata": {"annotations": {"strata.dev/approve": waiting["status"]["plan"]["digest"]}}})
        wait_for(lambda: bench.get_stack(name), is_ready, 120, f"{name} Ready after approval")
        applied.append(time.monotonic() - started)
    figures = {"stacks": count, "plain_create_to_ready_s": statistics.median(plain),
               "gated_create_to_awaiting_s": statistics.median(preview),
               "gated_approve_to_ready_s": statistics.median(applied)}
    print(f"== approval ({count} Stacks each, medians)")
    print(f"  without approval: create -> Ready              {figures['plain_create_to_ready_s']:6.2f} s")
    print(f"  with approval:    create -> plan awaiting      {figures['gated_create_to_awaiting_s']:6.2f} s")
    print(f"                    approve -> Ready              {figures['gated_approve_to_ready_s']:6.2f} s")
    total = figures["gated_create_to_awaiting_s"] + figures["gated_approve_to_ready_s"]
    print(f"  engine time of a gated Stack against a plain one: {total / figures['plain_create_to_ready_s']:.2f}x "
          "(a preview that saves the plan, then the update)")
    return figures


def cgroup_cpu_seconds() -> float:
    return int((CGROUP / "cpuacct.usage").read_text()) / 1e9


def drift_checks(bench: Bench) -> float:
    with urllib.request.urlopen(bench.operator.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("drift_checks_total{"))


def drift_figures(bench: Bench, count: int, window: float, interval: int) -> dict:
    for index in range(count):
        name = f"drift-{index}"
        bench.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks",
                                                     stack_body(name, bench.backend(name)))
    for index in range(count):
        wait_for(lambda: bench.get_stack(f"drift-{index}"), is_ready, 600, f"drift-{index} Ready")
    CGROUP.mkdir(exist_ok=True)
    for pid in [bench.operator.pid(), *descendants(bench.operator.pid())]:
        (CGROUP / "cgroup.procs").write_text(str(pid))
    time.sleep(5)  # let the last status writes settle

    before = cgroup_cpu_seconds()
    time.sleep(window)
    idle = cgroup_cpu_seconds() - before

    for index in range(count):
        bench.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", f"drift-{index}", {
            "spec": {"driftDetection": {"interval": f"{interval}s"}}})
    time.sleep(interval)  # the spec change itself runs one update per Stack: not a drift check
    wait_for(lambda: [bench.get_stack(f"drift-{i}") for i in range(count)], lambda stacks: all(map(is_ready, stacks)),
             600, "every Stack Ready after the spec change")
    checks_before, before = drift_checks(bench), cgroup_cpu_seconds()
    time.sleep(window)
    checking = cgroup_cpu_seconds() - before
    checks = drift_checks(bench) - checks_before
    per_check = (checking - idle) / checks if checks else float("nan")
    figures = {"stacks": count, "window_s": window, "idle_cpu_s": idle, "checking_cpu_s": checking,
               "checks": checks, "cpu_s_per_check": per_check,
               "cpu_s_per_hour_at_1h": per_check * count, "cpu_s_per_hour_at_10m": per_check * count * 6}
    print(f"== drift detection ({count} Stacks, windows of {window:g} s, interval {interval} s)")
    print(f"  CPU of the operator's tree, nothing to do:      {idle:7.2f} s")
    print(f"  CPU with drift checks ({checks:g} checks):      {checking:7.2f} s")
    print(f"  per check: {per_check:.3f} CPU-s; for {count} Stacks: {figures['cpu_s_per_hour_at_1h']:.1f} CPU-s per hour "
          f"at the default 1h interval ({figures['cpu_s_per_hour_at_1h'] / 36:.2f}% of one core), "
          f"{figures['cpu_s_per_hour_at_10m']:.1f} CPU-s per hour at 10m")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--approval", type=int, default=5, help="Stacks with and without approval")
    parser.add_argument("--drift-stacks", type=int, default=50)
    parser.add_argument("--drift-seconds", type=float, default=120, help="length of each CPU window")
    parser.add_argument("--drift-interval", type=int, default=20, help="drift check interval during the window (s)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the drift figures read a cpuacct cgroup of the operator's process tree")
    with platform_with_operator(("--min-resync-seconds", "10")) as bench:
        bench.create_program("bench", stash_program(3))
        figures = {"approval": approval_figures(bench, args.approval),
                   "drift": drift_figures(bench, args.drift_stacks, args.drift_seconds, args.drift_interval),
                   "loadavg": os.getloadavg()}
    if CGROUP.exists():
        CGROUP.rmdir()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
