"""A fleet of Stacks on the real engine: time to all Ready, reconcile latency, memory, idle silence.

    .venv/bin/python benchmarks/fleet.py [--stacks 50] [--backends 1] [--idle 300] [--trusted] [--json benchmarks/results/fleet-50.json]
    .venv/bin/python benchmarks/fleet.py --executor pod [--rounds 5] ...   # as root: a real node, a pod per Stack

N Stacks of one small YAML Program (builtin Stash resources) are created at once, spread round-robin
over --backends file:// backends. Reported: time until all are Ready, per-Stack create->Ready latency
p50/p95, peak RSS of the operator process and of all its children (workers and pulumi CLIs), the
operator process's CPU seconds during the fill and during the idle window, and, while idle for --idle
seconds after that, engine runs (must be 0) and the writes the operator makes to Stacks, counted from a
watch (every write is one MODIFIED event; a changed status is a status patch), per minute (must be 0,
or at least flat). The same run first measures the floor: the same N first updates as bare `pulumi stack
init` + `pulumi up` CLI runs (the CLI, PATH and PULUMI_HOME plugins the operator's workers get, each in a
project directory of its own on fresh file:// backends spread like --backends), as many at once as the
operator runs them (its --concurrency; with --executor pod one workspace pod per Stack, all at once),
timed to all done; the operator's all-Ready time over it is the floor ratio (issue #30's goal for the
process executor: at most 1.15; --no-floor skips it). The fill's CPU is broken down per Stack by process
name (sampled from /proc: the pulumi CLI, language hosts, Python, kubelet, API server...) and, with pods,
the pods' exact total from the node's cgroup. The operator's CPU is utime+stime of the operator process
itself from /proc/<pid>/stat: its workers and pulumi CLIs are children of its fork server, reaped there
rather than by the operator, so their CPU is not in the operator's cutime/cstime and is not counted.
With --json, the figures and the raw series (every latency, memory sampled every half second) go to
that file for benchmarks/charts.py. The peer, PKO v1.16 on this machine kind: 50 Stacks in 80 s,
children peaking at 1.25 GB, 0 runs idle. With --executor pod the Stacks' updates run in workspace pods
on one real node (their children are the pods' processes, not the operator's: the pods' own RSS is
reported), and then --rounds updates of the same Stacks are timed under each executor, interleaved,
against a second operator (process executor) on another namespace of the same platform.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from harness import (GROUP, NAMESPACE, PASSPHRASE, VERSION, CpuByProcess, StackWatch, cpu_model, cpu_seconds,
                     is_ready, node_pods_cpu_seconds, platform_with_operator, process_operator_beside, pss_tree_mb,
                     rss_tree_mb, stash_program, workspace_agents)
from strata_operator.api.program import program_project
from strata_operator.engine.pod.executor import DEFAULT_POD_CONCURRENCY
from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import DEFAULT_CONCURRENCY, AutomationEngine, EngineSettings
from strata_operator.engine.process.plugins import cached_plugins, default_plugin_cache, link_plugins


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, float]:
    """The machine's CPU seconds so far by kind (the first line of /proc/stat), all cores together."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(CPU_FIELDS)]
    return {kind: int(value) / os.sysconf("SC_CLK_TCK") for kind, value in zip(CPU_FIELDS, fields)}


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    now = cpu_times()
    return {kind: round(now[kind] - before[kind], 1) for kind in CPU_FIELDS}


def wait_quiet(busy_limit: float, timeout: float) -> dict:
    """Wait until the machine is quiet: at most `busy_limit` of its CPU busy at normal priority (or taken
    by the hypervisor, steal) over 2 s. Niced work (other sessions' tests) is left out: it yields to ours,
    though it raises the load average. Gives up after `timeout` seconds, saying so. Returns what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        before = cpu_times()
        time.sleep(2)
        spent = cpu_since(before)
        total = sum(spent.values()) or 1
        busy = (spent["user"] + spent["system"] + spent["irq"] + spent["softirq"] + spent["steal"]) / total
        if busy <= busy_limit or time.monotonic() > deadline:
            quiet = {"cpu_busy_before": round(busy, 2), "niced_before": round(spent["nice"] / total, 2),
                     "quiet": busy <= busy_limit, "load_average_1m_start": round(os.getloadavg()[0], 1)}
            if not quiet["quiet"]:
                print(f"the machine is still busy ({busy:.0%} of its CPU at normal priority) after {timeout:g}s: "
                      "measuring anyway")
            return quiet
        time.sleep(3)


def phase_machine(quiet: dict, before: dict[str, float]) -> dict:
    """What the machine did during a phase: the quiet check before it, then its CPU seconds by kind
    (ours included), steal and niced work (others') among them, and the load at its end."""
    return {**quiet, "cpu_seconds": cpu_since(before), "load_average_1m_end": round(os.getloadavg()[0], 1)}


def operator_cli(argv: list[str]) -> tuple[str, tuple[str, ...]]:
    """The pulumi CLI and the --plugin-dir directories the operator was started with (operator_host's argv)."""
    pulumi = argv[argv.index("--pulumi") + 1]
    return pulumi, tuple(argv[i + 1] for i, arg in enumerate(argv) if arg == "--plugin-dir")


def floor_run(bench, program: dict, stacks: int, backends: int, concurrency: int, quiet: tuple[float, float]) -> dict:
    """The floor: the fleet's N first updates as bare CLI runs, `concurrency` at once, timed to all done.

    Each is what the operator's worker runs for a YAML Program's first update (engine/process/worker.py:
    `pulumi stack init`, the config written into the stack file (none here), then one `pulumi up --yes
    --skip-preview`, no preview, no refresh), in a project directory of its own holding the Pulumi.yaml
    the operator renders from the Program, with the environment a worker gets (executor.worker_env: its
    own HOME and PULUMI_HOME, the PATH of the CLI and the language hosts, the passphrase) and the operator's
    plugins linked into that PULUMI_HOME as the worker links them. Directories and links are made before
    the clock starts; what is timed is the two CLI runs per stack. The operator's extras (the event log,
    the update message, a worker forked per update) are its overhead, so the floor leaves them out."""
    pulumi, plugin_dirs = operator_cli(bench.operator.process.argv)
    root = bench.scratch / "floor"
    # The worker's environment and PULUMI_HOME come from the engine itself (worker_env, pulumi_home).
    engine = AutomationEngine(EngineSettings(state_dir=root, pulumi_command=pulumi, plugin_dirs=plugin_dirs))
    plugins = cached_plugins(default_plugin_cache(), plugin_dirs)
    backend_urls = []
    for index in range(backends):
        directory = root / "backends" / f"floor-{index}"
        directory.mkdir(parents=True, exist_ok=True)
        backend_urls.append(directory.as_uri())
    project_text = program_project({"metadata": {"name": "fleet"}, "program": program})
    jobs = []
    for index in range(stacks):
        name = f"s{index:04d}"
        project = root / "projects" / name
        project.mkdir(parents=True)
        (project / "Pulumi.yaml").write_text(project_text)
        request = UpdateRequest(stack_key=f"floor/{name}", stack_name=name, project_dir=str(project),
                                env={"PULUMI_BACKEND_URL": backend_urls[index % backends],
                                     "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE})
        link_plugins(plugins, engine.pulumi_home(request.stack_key) / "plugins")
        env = engine.worker_env(request)
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)  # as the worker makes it
        jobs.append((name, project, env))

    def update(job: tuple[str, Path, dict]) -> tuple[float, float]:
        name, project, env = job
        began = time.monotonic()
        for args in (["stack", "init", name], ["up", "--yes", "--skip-preview", "--stack", name]):
            done = subprocess.run([pulumi, "--non-interactive", *args], cwd=project, env=env, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise RuntimeError(f"floor {name}: pulumi {' '.join(args)} exited {done.returncode}: "
                                   f"{(done.stdout + done.stderr)[-800:]}")
        return began, time.monotonic()

    calm = wait_quiet(*quiet)
    cpu_before = cpu_times()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        spans = list(pool.map(update, jobs))
    seconds = time.monotonic() - started
    machine = phase_machine(calm, cpu_before)
    durations = sorted(end - began for began, end in spans)
    print(f"floor: {stacks} first updates as bare `pulumi stack init` + `pulumi up`, {concurrency} at once: all done "
          f"in {seconds:6.1f}s (one update p50 {percentile(durations, 0.5):5.2f}s; {describe(machine)})")
    return {"floor_seconds": round(seconds, 2), "floor_concurrency": concurrency,
            "floor_update_seconds": [round(value, 2) for value in durations],
            "floor_finished_seconds": sorted(round(end - started, 2) for _, end in spans), "floor_machine": machine}


def print_cpu_per_stack(machine: dict, stacks: int) -> None:
    """Where the fill's CPU went, per Stack: the machine's total, the top process names, the pods' own."""
    cpu = machine["cpu_seconds"]
    names = ", ".join(f"{name} {seconds / stacks:.2f}"
                      for name, seconds in list(machine["cpu_seconds_by_process"].items())[:10])
    pods = machine.get("workspace_pods_cpu_seconds")
    print(f"CPU seconds per Stack during the fill: {(cpu['user'] + cpu['system']) / stacks:.2f} on the machine"
          + (f", {pods / stacks:.2f} in its workspace pod (cgroup)" if pods is not None else "")
          + f"; by process name (sampled): {names}")


def describe(machine: dict) -> str:
    cpu = machine["cpu_seconds"]
    return (f"before it {machine['cpu_busy_before']:.0%} of the CPU busy at normal priority; 1-minute load "
            f"{machine['load_average_1m_start']} -> {machine['load_average_1m_end']}; CPU seconds during it: "
            f"{cpu['user'] + cpu['system']:.0f} normal, {cpu['nice']:.0f} niced, {cpu['steal']:.0f} stolen")


def timed_update(bench, name: str) -> float:
    """Seconds from a spec change of a Ready Stack (one config value) to Ready with that generation applied."""
    generation = bench.get_stack(name)["metadata"]["generation"] + 1
    started = time.monotonic()
    bench.custom.patch_namespaced_custom_object(GROUP, VERSION, bench.namespace, "stacks", name,
                                                {"spec": {"config": {"bench:round": uuid.uuid4().hex}}})
    while True:
        last = (bench.get_stack(name).get("status") or {}).get("lastUpdate") or {}
        if last.get("generation") == generation and last.get("state") in ("succeeded", "failed"):
            if last["state"] != "succeeded":
                raise RuntimeError(f"{name}: {last.get('message')}")
            return time.monotonic() - started
        time.sleep(0.1)


def pod_executor_figures(bench, rounds: int, resources: int) -> dict:
    """The workspace pods' memory, and the same updates timed under both executors, one after the other."""
    agents = workspace_agents()
    pod_mb = sorted(sum(rss_tree_mb(pid)) for pid in agents)
    print(f"workspace pods: {len(agents)}, idle RSS per pod (agent and its fork server) median "
          f"{percentile(pod_mb, 0.5):5.1f} MB, max {max(pod_mb, default=0):5.1f} MB, all {sum(pod_mb):7.1f} MB")
    pod_stacks = sorted(s["metadata"]["name"] for s in bench.stacks())[:rounds]
    with process_operator_beside(bench, "bench-process") as beside:
        beside.create_program("fleet", stash_program(resources))
        backend = beside.backend("overhead")
        for name in pod_stacks:
            beside.create_stack(name, "fleet", backend)
        deadline = time.monotonic() + 300
        while not all(is_ready(s) for s in beside.stacks()) or len(beside.stacks()) < len(pod_stacks):
            if time.monotonic() > deadline:
                raise TimeoutError("the process executor's Stacks did not get Ready")
            time.sleep(0.5)
        timings = {"pod": [], "process": []}
        for name in pod_stacks:  # interleaved, so that the machine's noise falls on both alike
            timings["pod"].append(timed_update(bench, name))
            timings["process"].append(timed_update(beside, name))
    pod, process = percentile(timings["pod"], 0.5), percentile(timings["process"], 0.5)
    print(f"one update, change to Ready, median of {len(pod_stacks)}: pod executor {pod:5.2f}s, process executor "
          f"{process:5.2f}s: {pod - process:+5.2f}s per update with a warm workspace pod (goal: under +1 s)")
    return {"workspace_pods": len(agents), "workspace_pod_idle_mb": [round(v, 1) for v in pod_mb],
            "update_seconds": {k: [round(v, 2) for v in vs] for k, vs in timings.items()},
            "pod_overhead_seconds": round(pod - process, 2)}


def worker_seconds(bench, names: list[str]) -> list[float]:
    """Each Stack's last worker run, start to result (the `seconds.total` of the update log the worker writes
    beside the Stack's HOME in the operator's state directory, which `strata logs stack` shows)."""
    found = []
    for name in names:
        try:
            record = json.loads((bench.operator.state_dir / "stacks" / bench.namespace / name / "last-update.json")
                                .read_text())
        except (OSError, ValueError):
            continue
        if record.get("operation") == "up" and "total" in (record.get("seconds") or {}):
            found.append(round(record["seconds"]["total"], 2))
    return found


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=50)
    parser.add_argument("--backends", type=int, default=1, help="file:// backends, Stacks spread round-robin")
    parser.add_argument("--idle", type=float, default=300, help="seconds to watch for engine runs when idle")
    parser.add_argument("--resources", type=int, default=3, help="Stash resources per program")
    parser.add_argument("--concurrency", type=int, help="the operator's --concurrency (default: its own)")
    parser.add_argument("--json", type=Path, help="write figures and series here (for benchmarks/charts.py)")
    parser.add_argument("--executor", choices=("process", "pod"), default="process",
                        help="pod: updates in a workspace pod per Stack on one real node (root, `make setup`'s Debian "
                             "packages), then the per-update overhead against the process executor in the same run")
    parser.add_argument("--rounds", type=int, default=5, help="--executor pod: updates timed per executor")
    parser.add_argument("--quiet-busy", type=float, default=0.25,
                        help="before the floor and before the fleet, wait until at most this fraction of the CPU is "
                             "busy at normal priority (the machine is shared)")
    parser.add_argument("--quiet-timeout", type=float, default=300, help="... for at most this many seconds")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="skip the floor (the same first updates as bare `pulumi up` runs, before the fleet)")
    parser.add_argument("--trusted", action="store_true",
                        help="--executor process: the Stacks' namespace trusted (--trusted-namespace), its programs "
                             "run unsandboxed as the operator's user; what the sandbox costs, against a run without")
    args = parser.parse_args()
    operator_args = ("--concurrency", str(args.concurrency)) if args.concurrency else ()
    if args.trusted:
        operator_args += ("--trusted-namespace", NAMESPACE)
    with platform_with_operator(operator_args, executor=args.executor) as bench:
        program = stash_program(args.resources)
        floor: dict = {}
        if args.floor:
            # Before the fleet, on the same platform with the operator started and idle: each phase starts
            # once the shared machine is quiet, and what it did meanwhile is recorded (floor_machine, fill_machine).
            default = DEFAULT_POD_CONCURRENCY if args.executor == "pod" else DEFAULT_CONCURRENCY
            floor = floor_run(bench, program, args.stacks, args.backends, args.concurrency or default,
                              (args.quiet_busy, args.quiet_timeout))
        bench.create_program("fleet", program)
        pid = bench.operator.pid()
        peak = {"operator": 0.0, "children": 0.0, "children_pss": 0.0}
        memory: list[tuple[float, float, float]] = []  # (seconds since the fleet started, operator, children) MB
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.5):
                own, children = rss_tree_mb(pid)
                memory.append((round(time.monotonic() - started, 2), round(own, 1), round(children, 1)))
                peak["operator"] = max(peak["operator"], own)
                peak["children"] = max(peak["children"], children)
                peak["children_pss"] = max(peak["children_pss"], pss_tree_mb(pid))

        calm = wait_quiet(args.quiet_busy, args.quiet_timeout)
        fill_cpu_before = cpu_times()
        by_process = CpuByProcess({pid: "operator", os.getpid(): "benchmark"})
        by_process.start()
        pods_cpu_before = node_pods_cpu_seconds(bench.platform) if args.executor == "pod" else 0.0
        started = time.monotonic()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        backends = [bench.backend(f"fleet-{index}") for index in range(args.backends)]
        stack_watch = StackWatch(bench, started)
        stack_watch.start()
        created: dict[str, float] = {}
        operator_cpu_before = cpu_seconds(pid)
        for index in range(args.stacks):
            name = f"s{index:04d}"
            bench.create_stack(name, "fleet", backends[index % len(backends)])
            created[name] = time.monotonic()
        ready_at = stack_watch.ready_at  # from the watch, not a list per poll: 1000 Stacks are a big list
        deadline = started + 60 + 10 * args.stacks
        while len(ready_at) < args.stacks:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(ready_at)}/{args.stacks} Stacks Ready")
            if not stack_watch.is_alive():
                raise RuntimeError("the Stack watch stopped")
            time.sleep(0.5)
        all_ready = max(ready_at.values()) - started
        fill_machine = phase_machine(calm, fill_cpu_before)
        fill_machine["cpu_seconds_by_process"] = by_process.seconds()
        if args.executor == "pod":
            fill_machine["workspace_pods_cpu_seconds"] = round(node_pods_cpu_seconds(bench.platform) - pods_cpu_before, 1)
        operator_cpu = cpu_seconds(pid) - operator_cpu_before
        latencies = [ready_at[name] - created[name] for name in created]
        print(f"{args.stacks} Stacks all Ready in {all_ready:6.1f}s   (PKO v1.16: 50 in 80 s; goal <= 35 s; "
              f"{describe(fill_machine)})")
        if floor:
            floor["floor_ratio"] = round(all_ready / floor["floor_seconds"], 3)
            goal = "goal: all Ready <= 45 s" if args.executor == "pod" else "goal <= 1.15"
            print(f"floor: bare CLI runs {floor['floor_seconds']:6.1f}s, the operator's all Ready {all_ready:6.1f}s: "
                  f"ratio {floor['floor_ratio']:.2f} ({goal})")
            # Where the difference is: inside the worker (its CLI runs and its own steps), or around it.
            worker = worker_seconds(bench, list(created))
            if worker:
                floor["operator_worker_seconds"] = sorted(worker)
                print(f"one update, p50: the operator's worker {percentile(worker, 0.5):5.2f}s (sum {sum(worker):6.1f}s), "
                      f"the floor's CLI runs {percentile(floor['floor_update_seconds'], 0.5):5.2f}s "
                      f"(sum {sum(floor['floor_update_seconds']):6.1f}s)")
        print_cpu_per_stack(fill_machine, args.stacks)
        print(f"create->Ready latency  p50 {percentile(latencies, 0.5):6.1f}s   p95 {percentile(latencies, 0.95):6.1f}s")
        fill_writes = len(stack_watch.status_writes), len(stack_watch.other_writes)
        print(f"CPU of the operator process (Kopf, handlers, API calls): {operator_cpu:5.1f} s during the fill")
        print(f"writes to Stacks during the fill: {fill_writes[0]} status, {fill_writes[1]} other "
              f"({fill_writes[0] / args.stacks:.1f} status writes per Stack)")
        print(f"peak RSS  operator {peak['operator']:7.1f} MB   children {peak['children']:7.1f} MB "
              f"(PSS {peak['children_pss']:6.1f} MB; PKO v1.16 children: 1250 MB RSS)")

        load_fill_end = round(os.getloadavg()[0], 1)
        fill_figures = {**floor, "fill_machine": fill_machine,
            "stacks": args.stacks, "backends": args.backends, "resources": args.resources, "trusted": args.trusted,
            "all_ready_seconds": round(all_ready, 2), "latency_seconds": sorted(round(value, 2) for value in latencies),
            "operator_cpu_seconds": round(operator_cpu, 2), "peak_mb": {k: round(v, 1) for k, v in peak.items()},
            "fill_status_writes": fill_writes[0], "fill_other_writes": fill_writes[1],
            "load_average_1m_fill_end": load_fill_end, "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        }
        if args.json:  # the fill's figures now, so that a run stopped while idle still leaves them
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**fill_figures, "memory_mb": memory, "idle_complete": False}, indent=1))

        snapshot = {s["metadata"]["name"]: s["status"].get("lastUpdate") for s in bench.stacks()}
        quiet_since = time.monotonic()
        events_before = {e.metadata.uid for e in client.CoreV1Api(bench.api).list_namespaced_event(NAMESPACE).items
                         if e.reason == "StackUpdateDetected"}
        idle_cpu_before = cpu_seconds(pid)
        time.sleep(args.idle)
        idle_cpu = cpu_seconds(pid) - idle_cpu_before
        idle_operator_rss = rss_tree_mb(pid)[0]
        sampling.set()
        stack_watch.stopping.set()
        changed = [s["metadata"]["name"] for s in bench.stacks() if s["status"].get("lastUpdate") != snapshot.get(
            s["metadata"]["name"])]
        new_runs = [e for e in client.CoreV1Api(bench.api).list_namespaced_event(NAMESPACE).items
                    if e.reason == "StackUpdateDetected" and e.metadata.uid not in events_before]
        idle_seconds = time.monotonic() - quiet_since
        idle_start, idle_end = quiet_since - started, quiet_since - started + idle_seconds
        status_per_minute = stack_watch.per_minute(stack_watch.status_writes, idle_start, idle_end)
        other_per_minute = stack_watch.per_minute(stack_watch.other_writes, idle_start, idle_end)
        print(f"idle {idle_seconds:5.0f}s: {len(new_runs)} engine runs, {len(changed)} Stacks with a new "
              f"lastUpdate (must be 0; PKO v1.16: 0)")
        print(f"idle: operator CPU {idle_cpu:5.2f} s ({100 * idle_cpu / idle_seconds:.2f}% of a core), "
              f"operator RSS at the end {idle_operator_rss:6.1f} MB")
        print(f"idle: status writes per minute {status_per_minute}, other writes per minute {other_per_minute}")
        pod_figures = pod_executor_figures(bench, args.rounds, args.resources) if args.executor == "pod" else {}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                **fill_figures, **pod_figures, "executor": args.executor, "peak_mb": {k: round(v, 1) for k, v in peak.items()},
                "memory_mb": memory, "idle_complete": True, "idle_seconds": round(idle_seconds), "idle_engine_runs": len(new_runs),
                "idle_stacks_with_new_last_update": len(changed),
                "operator_cpu_idle_seconds": round(idle_cpu, 2), "operator_rss_end_of_idle_mb": round(idle_operator_rss, 1),
                "operator_rss_peak_idle_mb": max((own for at, own, _ in memory if at >= idle_start), default=None),
                "idle_status_writes_per_minute": status_per_minute, "idle_other_writes_per_minute": other_per_minute,
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                # This machine is shared: the load says how quiet it was (2 cores here).
                "load_average_1m": round(os.getloadavg()[0], 1),
            }, indent=1))
            print(f"figures and series written to {args.json}")


if __name__ == "__main__":
    main()
