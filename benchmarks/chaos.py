"""Recovery at fleet scale: faults during a fleet's first fill and during a Program change that re-runs it.

    sudo flock /tmp/strata-heavy.lock .venv/bin/python benchmarks/chaos.py [--stacks 200] [--faults kill,apiserver,etcd]
        [--executor process|pod] [--workspace-reclaim Retain|Delete] [--resources 3] [--seed 1]
        [--json benchmarks/results/chaos-200.json]

One scratch local platform, the operator on the host with the process executor. Each fault gets a round
of its own: N new Stacks of a new YAML Program (builtin Stash resources) on a file:// backend of their
own, created at once (the fill), then, once all are done, the Program changed so that every one of
them runs again (the change). In each of the two phases the fault strikes at random moments (when a
random share, 5-85%, of the round's Stacks is done):
- kill: the operator's process tree killed with SIGKILL three times (a container's processes all die
  with it: its workers and pulumi CLIs too), each time started again at once as the platform starts it;
- apiserver: kube-apiserver stopped for 20 s, then started again by the platform's `up`;
- etcd: the same for etcd;
- node (with --executor pod: every update in a workspace pod on the platform's real node): the node's
  kubelet and containerd stopped for 30 s (the containers they started keep running), then started
  again by the platform's `up`. With the Stacks' default workspace reclaim policy, Retain, every Stack keeps
  its workspace pod (about 88 MB of RSS idle, 128Mi of memory requested by this template): 200 would hold
  about 18 GB of RSS and request 25 GiB on the one node, more than this 24 GB host, and its kubelet admits
  at most 110 pods (realnode.py sets no maxPods: the kubelet's default). `--workspace-reclaim Delete`
  deletes each Stack's pod after its successful update, so at most the pod executor's concurrency (50)
  run at once: the node fault at 200 Stacks needs it.
A Stack is done in a phase when it is Ready with that phase's Program revision applied. Reported per
round and phase: seconds until every Stack is done, from the phase's start and from the last fault's
end; engine runs per Stack from the backend's update history (a Stack has one generation and revision
to run per phase, so a second run is a duplicate and none a lost update), and runs of the earlier
rounds' Stacks, which needed nothing (must be 0); locks left in every backend (must be 0); during each
outage, the status writes a watch saw and the operator's CPU seconds and log lines (no hot loop); the
operator's restarts (the kills, and any exit of its own: it is started again and counted). At the end,
every Stack of every round that is not Ready (must be 0). Progress is printed every 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from harness import (GROUP, VERSION, Bench, StackWatch, cpu_seconds, engine_runs, is_ready, locks_left,
                     platform_with_operator, stack_updates, stash_program, write_json)
from strata_components.local import realnode
from strata_components.local.processes import descendants, wait_until

FAULTS = ("kill", "apiserver", "etcd", "node")
KILLS = 3
OUTAGE_SECONDS = 20
NODE_OUTAGE_SECONDS = 30
ROUND_LABEL = "chaos.strata.dev/round"


@dataclasses.dataclass
class Strike:
    """One fault: `stop` takes something away, `start` brings it back `hold` seconds later."""

    what: str
    stop: Callable[[], None]
    start: Callable[[], None]
    hold: float


@dataclasses.dataclass
class Outage:
    """What one strike cost while it lasted."""

    what: str
    at_share: float
    started: float  # monotonic
    held: float = 0.0  # seconds until it was started again
    ended: float = 0.0  # when it was back (the operator healthy; the platform's `up` done)
    status_writes: int = 0
    operator_cpu_s: float | None = None  # None: the operator was the thing killed
    operator_log_lines: int | None = None

    def figures(self, phase_started: float) -> dict:
        return {"what": self.what, "at_share_done": round(self.at_share, 2),
                "at_seconds": round(self.started - phase_started, 1), "held_seconds": round(self.held, 1),
                "seconds": round(self.ended - self.started, 1),
                "status_writes": self.status_writes, "operator_cpu_s": self.operator_cpu_s,
                "operator_log_lines": self.operator_log_lines}


class Operator:
    """The operator host process, restarted as the platform starts it, its restarts counted."""

    def __init__(self, bench: Bench) -> None:
        self.host, self.restarts, self.own_exits = bench.operator, 0, 0

    def kill(self) -> None:
        """SIGKILL to the whole tree at once, as to a container's: stopped first, until none of it is left
        running to fork another (a CLI forked while the tree was being listed would outlive it)."""
        pid = self.host.pid()
        frozen: set[int] = set()
        while fresh := {pid, *descendants(pid)} - frozen:
            signal_all(fresh, signal.SIGSTOP)
            frozen |= fresh
        signal_all(frozen, signal.SIGKILL)
        wait_until(lambda: self.host.pid() is None, 10, "the operator gone after kill -9")

    def start(self) -> None:
        self.host.stop()  # forget its pid file
        self.host.start()
        self.restarts += 1

    def restart_if_gone(self) -> bool:
        """An operator that exited on its own (no kill of ours) is started again, as the platform would."""
        if self.host.pid() is not None:
            return False
        self.own_exits += 1
        print(f"  the operator exited on its own; last log lines: {log_tail(self.host.log, 5)}", flush=True)
        self.start()
        return True

    def leadership_losses(self) -> int:
        """Restarts in place: the operator that cannot renew its Lease kills its workers and stands by."""
        return self.host.log.read_text(errors="replace").count("lost leadership")

    def log_lines(self) -> int:
        with open(self.host.log, "rb") as log:
            return sum(1 for _ in log)


def signal_all(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def log_tail(path: Path, lines: int) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:]


def strikes(fault: str, bench: Bench, operator: Operator) -> list[Strike]:
    if fault == "kill":
        return [Strike("operator kill -9", operator.kill, operator.start, 0) for _ in range(KILLS)]
    def start_again() -> None:  # what ends every outage: the platform's `up` starts whatever is not running
        bench.platform.up(say=lambda _: None)

    if fault == "node":
        node = realnode.load_node(realnode.node_dirs(bench.platform.state)[0]).name

        def stop_node() -> None:
            for daemon in ("kubelet", "containerd"):
                bench.platform.stop_controller(f"{daemon}-{node}")

        return [Strike(f"{node}'s kubelet and containerd stopped", stop_node, start_again, NODE_OUTAGE_SECONDS)]
    component = {"apiserver": "kube-apiserver", "etcd": "etcd"}[fault]
    return [Strike(f"{component} stopped", lambda: bench.platform.stop_controller(component), start_again,
                   OUTAGE_SECONDS)]


def done(stack: dict, revision: str) -> bool:
    """Ready with `revision` of its Program applied by a successful update."""
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return is_ready(stack) and last.get("state") == "succeeded" and last.get("lastSuccessfulCommit") == revision


def round_stacks(bench: Bench, fault: str) -> list[dict] | None:
    """The round's Stacks, or None while the apiserver cannot list them."""
    try:
        return bench.custom.list_namespaced_custom_object(GROUP, VERSION, bench.namespace, "stacks",
                                                          label_selector=f"{ROUND_LABEL}={fault}",
                                                          _request_timeout=5)["items"]  # without etcd it would hang
    except Exception:  # noqa: BLE001 - the outage this benchmark makes: any failure to list is "unknown"
        return None


def run_phase(bench: Bench, operator: Operator, watch: StackWatch, fault: str, revision: str, count: int,
              rng: random.Random, wall_started: float) -> dict:
    """Wait until the round's `count` Stacks are done with `revision`, striking at random shares of done;
    `wall_started` is when the phase's change was made (its engine runs are those started since)."""
    pending = strikes(fault, bench, operator)
    shares = sorted(rng.uniform(0.05, 0.85) for _ in pending)
    started = time.monotonic()
    deadline = started + 300 + 5 * count
    outages: list[Outage] = []
    active: tuple[Strike, Outage, int | None, float, int] | None = None  # the strike, its outage, the operator then
    restarting: Future | None = None
    done_count, said, last_ended = 0, 0.0, started
    starter = ThreadPoolExecutor(1)
    while True:
        now = time.monotonic()
        fleet = round_stacks(bench, fault)
        if fleet is not None:
            done_count = sum(done(stack, revision) for stack in fleet)
        if active is None and not pending and done_count == count:
            break
        if restarting is not None and restarting.done():
            restarting.result()  # its failure, if any, is the benchmark's
            outage = active[1]
            outage.ended = time.monotonic()
            outages.append(outage)
            active, restarting, last_ended = None, None, outage.ended
            print(f"  {outage.ended - started:5.0f} s: back {outage.ended - outage.started:.1f} s after the fault",
                  flush=True)
        elif active is not None and restarting is None and now - active[1].started >= active[0].hold:
            strike, outage, pid, cpu_before, lines_before = active
            outage.held = now - outage.started
            outage.status_writes = sum(outage.started - watch.started <= at <= now - watch.started
                                       for at in watch.status_writes)
            if fault != "kill" and pid is not None and operator.host.pid() == pid:  # the same operator throughout
                outage.operator_cpu_s = round(cpu_seconds(pid) - cpu_before, 2)
                outage.operator_log_lines = operator.log_lines() - lines_before
            print(f"  {now - started:5.0f} s: {strike.what}: starting it again; {outage.status_writes} status writes "
                  f"meanwhile", flush=True)
            restarting = starter.submit(strike.start)  # in the background: progress goes on being said
        elif active is None and pending and (done_count >= shares[0] * count or done_count == count) \
                and now - last_ended >= 5:
            strike = pending.pop(0)
            shares.pop(0)
            pid = operator.host.pid()
            cpu_before, lines_before = (cpu_seconds(pid), operator.log_lines()) if pid else (0.0, 0)
            print(f"  {now - started:5.0f} s: {done_count}/{count} done: {strike.what}", flush=True)
            strike.stop()
            active = (strike, Outage(strike.what, done_count / count, now), pid, cpu_before, lines_before)
        elif active is None and operator.restart_if_gone():
            last_ended = time.monotonic()
        if now - said >= 10:
            ready = "apiserver unreachable" if fleet is None else f"{sum(map(is_ready, fleet))} Ready"
            print(f"  {now - started:5.0f} s: {done_count}/{count} done ({ready}), operator restarts "
                  f"{operator.restarts}, status writes so far {len(watch.status_writes)}", flush=True)
            said = now
        if now > deadline:
            stuck = [s["metadata"]["name"] for s in fleet or [] if not done(s, revision)]
            raise TimeoutError(f"{fault} {revision}: only {done_count}/{count} done; not done: {stuck[:10]}")
        time.sleep(1)
    finished = time.monotonic()
    starter.shutdown()
    return {"seconds": round(finished - started, 1), "recovery_seconds": round(finished - last_ended, 1),
            "outages": [outage.figures(started) for outage in outages], "wall_started": wall_started}


def phase_figures(phase: dict, backends: dict[str, Path], fault: str, count: int, revision: str,
                  resources: int) -> dict:
    """Engine runs of the phase (from the backends' history): the round's per Stack (those that applied the
    phase's revision), and the other rounds' since the phase started."""
    since = int(phase.pop("wall_started"))  # the history's startTime is in whole seconds
    runs = Counter(name for name, updates in stack_updates(backends[fault]).items() for update in updates
                   if run_revision(update, fault, resources) == revision)
    others = sum(sum(engine_runs(backend, since).values()) for name, backend in backends.items() if name != fault)
    return {**phase, "engine_runs": sum(runs.values()), "duplicate_runs": sum(n - 1 for n in runs.values() if n > 1),
            "stacks_run_twice_or_more": sorted(name for name, n in runs.items() if n > 1),
            "stacks_not_run": count - len(runs), "most_runs_of_one_stack": max(runs.values(), default=0),
            "other_rounds_engine_runs": others, "locks_left": locks_left(list(backends.values()))}


def run_revision(update: dict, fault: str, resources: int) -> str:
    """The round's Program revision a run applied, by the resources its stack holds after it: the stack
    and `resources` Stashes after the fill's, one more after the change's. (By time, a fill run that ends in
    the second the Program changes counts in the change too: startTime is in whole seconds; by message, a
    resumed run's names no revision.)"""
    changes = update.get("resourceChanges") or {}
    held = sum(changes.get(op, 0) for op in ("create", "same", "update", "replace"))
    return f"{fault}/2" if held > resources + 1 else f"{fault}/1"


def say_phase(fault: str, phase_name: str, figures: dict) -> None:
    outages = "; ".join(f"{o['what']} at {o['at_seconds']} s ({100 * o['at_share_done']:.0f}% done) for "
                        f"{o['seconds']} s: {o['status_writes']} status writes"
                        + (f", operator {o['operator_cpu_s']} CPU-s, {o['operator_log_lines']} log lines"
                           if o["operator_cpu_s"] is not None else "") for o in figures["outages"])
    print(f"{fault} / {phase_name}: all done in {figures['seconds']} s, {figures['recovery_seconds']} s after the last "
          f"fault ended; engine runs {figures['engine_runs']}, duplicates {figures['duplicate_runs']}, Stacks not "
          f"run {figures['stacks_not_run']}, other rounds' runs {figures['other_rounds_engine_runs']}, locks left "
          f"{figures['locks_left']}\n  {outages}", flush=True)


def say_events(bench: Bench, names: list[str]) -> None:
    """The Events of a few Stacks that ran twice: what the operator said it did, for the report."""
    for name in names[:3]:
        events = sorted(client.CoreV1Api(bench.api).list_namespaced_event(
            bench.namespace, field_selector=f"involvedObject.name={name}").items, key=lambda e: e.last_timestamp)
        print(f"  {name} ran more than once; its Events: "
              f"{[f'{e.last_timestamp:%H:%M:%S} {e.reason}: {e.message}' for e in events]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=200, help="Stacks per fault's round")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"some of {','.join(FAULTS)}, in that order")
    parser.add_argument("--resources", type=int, default=3, help="Stash resources per program")
    parser.add_argument("--executor", choices=("process", "pod"), default="process",
                        help="pod: every update in a workspace pod on one real node (the node fault needs it)")
    parser.add_argument("--workspace-reclaim", choices=("Retain", "Delete"), default="Retain",
                        help="the Stacks' spec.workspaceReclaimPolicy with --executor pod (Delete: no pod kept "
                             "after an update; the node fault at 200 Stacks needs it)")
    parser.add_argument("--seed", type=int, default=1, help="for the random moments of the faults")
    parser.add_argument("--json", type=Path, help="write the figures here (after every phase)")
    args = parser.parse_args()
    faults = args.faults.split(",")
    if set(faults) - set(FAULTS):
        parser.error(f"--faults: choose from {FAULTS}")
    if "node" in faults and args.executor != "pod":
        parser.error("--faults node: the node's outage matters to updates in its pods; add --executor pod")
    if args.workspace_reclaim != "Retain" and args.executor != "pod":
        parser.error("--workspace-reclaim: only workspace pods are reclaimed; add --executor pod")
    if os.geteuid() != 0:
        raise SystemExit("run as root, as the other platform benchmarks")
    rng = random.Random(args.seed)
    figures: dict = {"stacks": args.stacks, "resources": args.resources, "seed": args.seed, "rounds": {},
                     "executor": args.executor, "workspace_reclaim": args.workspace_reclaim,
                     "cpus": os.cpu_count(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with platform_with_operator(executor=args.executor) as bench:
        if args.workspace_reclaim != "Retain":  # Retain: the Stacks' spec as before, the field unset
            bench.workspace_reclaim_policy = args.workspace_reclaim
        operator = Operator(bench)
        watch = StackWatch(bench, time.monotonic())
        watch.start()
        backends: dict[str, Path] = {}
        for fault in faults:
            backend = bench.backend(f"chaos-{fault}")
            backends[fault] = bench.backend_dir(f"chaos-{fault}")
            bench.create_program(fault, stash_program(args.resources))
            changed = time.time()  # the first Stacks start running while the others are being created
            for index in range(args.stacks):
                bench.create_stack(f"{fault}-{index:04d}", fault, backend, labels={ROUND_LABEL: fault})
            print(f"{fault}: {args.stacks} Stacks created, the fill", flush=True)
            rounds = figures["rounds"][fault] = {}
            fill = run_phase(bench, operator, watch, fault, f"{fault}/1", args.stacks, rng, changed)
            rounds["fill"] = phase_figures(fill, backends, fault, args.stacks, f"{fault}/1", args.resources)
            say_phase(fault, "fill", rounds["fill"])
            say_events(bench, rounds["fill"]["stacks_run_twice_or_more"])
            write_json(args.json, figures)
            changed = time.time()
            bench.custom.patch_namespaced_custom_object(GROUP, VERSION, bench.namespace, "programs", fault,
                                                        {"program": stash_program(args.resources + 1)})
            print(f"{fault}: the Program changed, every Stack re-runs", flush=True)
            change = run_phase(bench, operator, watch, fault, f"{fault}/2", args.stacks, rng, changed)
            rounds["change"] = phase_figures(change, backends, fault, args.stacks, f"{fault}/2",
                                             args.resources)
            say_phase(fault, "change", rounds["change"])
            say_events(bench, rounds["change"]["stacks_run_twice_or_more"])
            write_json(args.json, figures)
        time.sleep(10)  # a late duplicate or a Stack falling back would show now
        watch.stopping.set()
        stacks = bench.stacks()
        totals = {fault: sum(engine_runs(backend).values()) for fault, backend in backends.items()}
        figures.update({
            "stacks_not_ready": sorted(s["metadata"]["name"] for s in stacks if not is_ready(s)),
            "engine_runs_per_round": totals, "locks_left": locks_left(list(backends.values())),
            "operator_restarts": operator.restarts, "operator_own_exits": operator.own_exits,
            "operator_restarts_in_place": operator.leadership_losses(),
            "status_writes": len(watch.status_writes), "other_writes": len(watch.other_writes),
            "load_average_1m": round(os.getloadavg()[0], 1)})
        print(f"end: {len(stacks)} Stacks, {len(figures['stacks_not_ready'])} not Ready (must be 0); engine runs per "
              f"round {totals} (expected {2 * args.stacks} each); locks left {figures['locks_left']}; operator "
              f"restarts {operator.restarts} ({operator.own_exits} on its own), in place (leadership lost) "
              f"{figures['operator_restarts_in_place']}; 1-min load "
              f"{figures['load_average_1m']}", flush=True)
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
