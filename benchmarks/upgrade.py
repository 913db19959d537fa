"""In-place upgrade of the operator on the host, version N to N+1, with a fleet Ready and part of it mid-update.

    sudo flock /tmp/strata-heavy.lock .venv/bin/python benchmarks/upgrade.py [--stacks 200] [--mid-update 20]
        [--during-upgrade 10] [--json benchmarks/results/upgrade-200-host.json]

One scratch local platform, the operator on the host with the process executor (version N: its default
flags). N Stacks of one YAML Program (builtin Stash resources) on one file:// backend are filled to
Ready. Then --mid-update of them get a spec change (a config value), and once the operator has started
all of their updates (status.currentUpdate names their new generation; at most --concurrency run a CLI
at once, the others hold their update waiting for a slot) the upgrade strikes, as the bootstrap's
`pulumi up` after a version bump does it on the host:
- N+1's CRDs: the packaged ones with one optional field (`spec.upgradeNote`, added in memory) in the
  Stack schema, server-side applied with the local operator's installer (install_operator_api's);
  the new field is served once a dry-run Stack carrying it keeps it;
- operator N stopped with SIGTERM and the bootstrap's grace (OPERATOR_STOP_GRACE_SECONDS): it starts
  no new update and lets the running ones finish; half of --during-upgrade other Stacks get a spec
  change while it drains, the other half once it is gone;
- operator N+1 started on the same state directory with a changed default: --min-resync-seconds 120
  (N has the default, 60).
Reported: the old operator's drain until it exited; N+1's start; seconds until every Stack is Ready
with its latest generation (from the SIGTERM and from N+1's start); engine runs since the spec changes,
per Stack, from the backend's update history (not the operator's log): each changed Stack must have
exactly one (duplicates and lost updates counted, must be 0), and which operator ran it (the history's
start time against N+1's start: the Stacks changed during the upgrade must all run under N+1); runs of
the Stacks that needed nothing (must be 0); locks left in the backend (must be 0); Stacks not Ready at
the end (must be 0), all of them written by N and read by N+1 with no manual step; N+1's log lines at
ERROR level. Progress is printed every 10 s.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness import (GROUP, VERSION, Bench, is_ready, locks_left, platform_with_operator, runs_since_change,
                     stack_updates, start_times, stash_program, write_json)
from strata_components.local.operator_host import apply_crds, operator_host
from strata_components.local.processes import descendants, wait_until
from strata_components.local.toolchain import installed
from strata_components.operator import OPERATOR_STOP_GRACE_SECONDS, load_packaged_manifests

PROGRAM = "upgrade"
NEW_FIELD = "upgradeNote"
NEXT_ARGS = ("--min-resync-seconds", "120")


def with_next_schema(crds: list[dict]) -> list[dict]:
    """CRDs (a copy) with N+1's schema change: one optional string field in every version's Stack spec."""
    crds = copy.deepcopy(crds)
    stacks = next(crd for crd in crds if crd["metadata"]["name"] == f"stacks.{GROUP}")
    for version in stacks["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][NEW_FIELD] = {
            "type": "string", "description": "Added by version N+1 (benchmarks/upgrade.py)."}
    return crds


def next_crds() -> list[dict]:
    """The packaged CRDs with N+1's schema change."""
    return with_next_schema(load_packaged_manifests("crds"))


def new_field_served(custom: client.CustomObjectsApi, namespace: str) -> bool:
    """Whether the apiserver keeps spec.upgradeNote on a Stack (a dry-run create: nothing is stored)."""
    probe = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": "schema-probe"},
             "spec": {"stack": "schema-probe", "programRef": {"name": PROGRAM}, NEW_FIELD: "n+1"}}
    try:
        created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", probe, dry_run="All")
    except ApiException as error:
        if error.status in (400, 422):  # a strict server refuses the unknown field
            return False
        raise
    return NEW_FIELD in created["spec"]


def done(stack: dict) -> bool:
    """Ready with its latest generation applied by a successful update."""
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return (is_ready(stack) and last.get("state") == "succeeded"
            and last.get("generation") == stack["metadata"]["generation"])


def in_progress(stack: dict) -> bool:
    """The operator has started an update of the Stack's latest generation (status.currentUpdate)."""
    current = (stack.get("status") or {}).get("currentUpdate") or {}
    return current.get("generation") == stack["metadata"]["generation"]


def change_spec(custom: client.CustomObjectsApi, namespace: str, names: list[str]) -> None:
    for name in names:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", name,
                                              {"spec": {"config": {"round": "2"}}})


def engine_clis(pid: int | None) -> int:
    """pulumi CLIs running under the operator's process tree."""
    count = 0
    for child in descendants(pid) if pid else []:
        try:
            count += os.path.basename(os.readlink(f"/proc/{child}/exe")) == "pulumi"
        except OSError:
            continue
    return count


def host_operator(bench: Bench) -> str:
    pid = bench.operator.pid()
    return f"operator pid {pid}" if pid else "no operator running (between N and N+1)"


def print_line(line: str) -> None:
    print(line, flush=True)


def wait_for_fleet(list_stacks: Callable[[], list[dict] | None], what: str, finished: Callable[[list[dict]], bool],
                   timeout: float, watched: list[str] | None = None, interval: float = 1.0,
                   operator: Callable[[], str] = lambda: "", say: Callable[[str], None] = print_line,
                   ) -> tuple[list[dict], float]:
    """List the Stacks every `interval` seconds until `finished(fleet)` (a None listing, the apiserver not
    answering, is skipped); says how many are done and in progress every 10 s (of `watched` only, if given)
    and `operator()`, where the operator stands. Returns the last listing and the seconds it took."""
    started, said, fleet = time.monotonic(), 0.0, []
    while True:
        listed = list_stacks()
        now = time.monotonic()
        if listed is not None:
            fleet = listed
            if finished(fleet):
                return fleet, now - started
        if now - said >= 10:
            shown = [s for s in fleet if watched is None or s["metadata"]["name"] in watched]
            say(f"  {what}, {now - started:5.0f} s: {sum(map(done, shown))}/{len(shown)} done, "
                f"{sum(map(in_progress, shown))} in progress, {operator()}")
            said = now
        if now - started > timeout:
            stuck = [s["metadata"]["name"] for s in fleet if not done(s) and (watched is None
                                                                                or s["metadata"]["name"] in watched)]
            raise TimeoutError(f"{what}: not finished after {timeout:.0f} s; not done: {stuck[:10]}")
        time.sleep(interval)


def all_done(count: int) -> Callable[[list[dict]], bool]:
    return lambda fleet: len(fleet) == count and all(map(done, fleet))


def run_figures(starts: dict[str, list[int]], names: list[str], next_started: int) -> dict:
    """Engine runs of Stacks that each had one new generation to run: duplicates, lost, and whose they were."""
    runs = {name: starts.get(name, []) for name in names}
    return {"stacks": len(names), "engine_runs": sum(map(len, runs.values())),
            "duplicate_runs": sum(len(times) - 1 for times in runs.values() if len(times) > 1),
            "lost_updates": sum(not times for times in runs.values()),
            "stacks_run_twice_or_more": sorted(name for name, times in runs.items() if len(times) > 1),
            "runs_under_n": sum(at < next_started for times in runs.values() for at in times),
            "runs_under_n_plus_1": sum(at >= next_started for times in runs.values() for at in times)}


def error_lines(log: Path, offset: int) -> list[str]:
    with open(log, "rb") as file:
        file.seek(offset)
        return [line for line in file.read().decode(errors="replace").splitlines() if "ERROR" in line]


def parse_fleet_args(description: str, more: Callable[[argparse.ArgumentParser], None] = lambda _: None
                     ) -> argparse.Namespace:
    """The fleet's options, shared by the host and the in-cluster upgrade (`more` adds a benchmark's own)."""
    parser = argparse.ArgumentParser(description=description)
    more(parser)
    parser.add_argument("--stacks", type=int, default=200)
    parser.add_argument("--mid-update", type=int, default=20, help="Stacks changed just before the upgrade")
    parser.add_argument("--during-upgrade", type=int, default=10,
                        help="Stacks changed during it (half while the old operator drains, half once it is gone)")
    parser.add_argument("--resources", type=int, default=3, help="Stash resources of the Program")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.mid_update + args.during_upgrade > args.stacks:
        parser.error("--mid-update and --during-upgrade are Stacks of --stacks")
    if os.geteuid() != 0:
        raise SystemExit("run as root, as the other platform benchmarks")
    return args


def split_fleet(names: list[str], args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """The Stacks changed just before the upgrade, those changed during it, and those that need nothing."""
    during_end = args.mid_update + args.during_upgrade
    return names[:args.mid_update], names[args.mid_update:during_end], names[during_end:]


def first_figures(args: argparse.Namespace) -> dict:
    return {"stacks": args.stacks, "resources": args.resources, "cpus": os.cpu_count(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "n_plus_1": {"crd_field_added": f"spec.{NEW_FIELD}", "flags": list(NEXT_ARGS)}}


def fleet_figures(starts: dict[str, list[int]], fleet: list[dict], groups: tuple[list[str], list[str], list[str]],
                  next_started: float) -> dict:
    """What the backend's history and the last listing say of the three groups (see split_fleet)."""
    mid, during, idle = groups
    return {"mid_update": run_figures(starts, mid, int(next_started)),
            "changed_during_upgrade": run_figures(starts, during, int(next_started)),
            "idle_stacks": len(idle), "idle_engine_runs": sum(len(starts.get(name, [])) for name in idle),
            "stacks_not_ready": sorted(s["metadata"]["name"] for s in fleet if not done(s)),
            "read_by_n_plus_1_without_manual_step": bool(fleet) and all(map(done, fleet)),
            "load_average_1m": round(os.getloadavg()[0], 1)}


def say_runs(figures: dict, say: Callable[[str], None] = print_line) -> None:
    for group in ("mid_update", "changed_during_upgrade"):
        runs = figures[group]
        say(f"{group}: {runs['stacks']} Stacks, {runs['engine_runs']} engine runs ({runs['runs_under_n']} under N, "
            f"{runs['runs_under_n_plus_1']} under N+1), duplicates {runs['duplicate_runs']}, lost "
            f"{runs['lost_updates']}")


def main() -> None:
    args = parse_fleet_args(__doc__.splitlines()[0])
    names = [f"upgrade-{index:04d}" for index in range(args.stacks)]
    mid, during, idle = split_fleet(names, args)
    figures = first_figures(args)
    pool = ThreadPoolExecutor(1)
    with platform_with_operator() as bench:
        backend_uri = bench.backend(PROGRAM)
        backend = Path(backend_uri.removeprefix("file://"))
        bench.create_program(PROGRAM, stash_program(args.resources))
        for name in names:
            bench.create_stack(name, PROGRAM, backend_uri)
        print(f"{args.stacks} Stacks created: the fill", flush=True)
        def fleet_wait(*wait_args, **options) -> tuple[list[dict], float]:
            return wait_for_fleet(bench.stacks, *wait_args, operator=lambda: host_operator(bench), **options)

        _, fill = fleet_wait("fill", all_done(args.stacks), 300 + 5 * args.stacks)
        figures["fill_seconds"] = round(fill, 1)
        print(f"fill: all {args.stacks} Ready in {figures['fill_seconds']:.0f} s", flush=True)

        # N+1's process, described (its identity and RBAC applied: unchanged) on N's state directory.
        successor = operator_host(bench.platform, installed(), bench.scratch / "operator", extra_args=NEXT_ARGS)
        figures["n_plus_1"]["field_served_before"] = new_field_served(bench.custom, bench.namespace)

        changed, filled = time.time(), stack_updates(backend)
        change_spec(bench.custom, bench.namespace, mid)
        print(f"{len(mid)} Stacks changed; waiting until the operator has started all of their updates", flush=True)
        try:
            fleet_wait("mid-update", lambda fleet: all(in_progress(s) for s in fleet
                                                                  if s["metadata"]["name"] in mid), 120, mid, 0.2)
        except TimeoutError as error:
            print(f"  {error}: upgrading anyway", flush=True)

        started = time.monotonic()
        apply_crds(bench.platform.kubeconfig_path, next_crds())
        wait_until(lambda: new_field_served(bench.custom, bench.namespace), 30, f"spec.{NEW_FIELD} served")
        figures["n_plus_1"]["crd_seconds"] = round(time.monotonic() - started, 1)

        fleet = bench.stacks()
        pid = bench.operator.pid()
        figures["at_sigterm"] = {"mid_update_in_progress": sum(in_progress(s) for s in fleet
                                                               if s["metadata"]["name"] in mid),
                                 "mid_update_done_under_n": sum(done(s) for s in fleet if s["metadata"]["name"] in mid),
                                 "engine_clis_running": engine_clis(pid)}
        print(f"upgrade: CRD applied in {figures['n_plus_1']['crd_seconds']} s; SIGTERM to operator N ({pid}) with "
              f"{figures['at_sigterm']}", flush=True)
        log_offset = bench.operator.log.stat().st_size
        stop_started = time.monotonic()
        stopping = pool.submit(bench.operator.stop, OPERATOR_STOP_GRACE_SECONDS)
        wait_until(lambda: b"Operator is stopping" in bench.operator.log.read_bytes()[log_offset:], 10,
                   "operator N saying it is stopping")
        change_spec(bench.custom, bench.namespace, during[:len(during) // 2])
        fleet_wait("drain", lambda _: stopping.done(), OPERATOR_STOP_GRACE_SECONDS + 30, mid)
        stopping.result()
        figures["drain_seconds"] = round(time.monotonic() - stop_started, 1)
        change_spec(bench.custom, bench.namespace, during[len(during) // 2:])
        print(f"operator N exited {figures['drain_seconds']} s after SIGTERM; {len(during)} Stacks changed during "
              f"the upgrade; starting N+1", flush=True)

        log_offset = bench.operator.log.stat().st_size
        next_started = time.time()
        started = time.monotonic()
        successor.start()
        figures["n_plus_1"]["start_seconds"] = round(time.monotonic() - started, 1)
        _, catch_up = fleet_wait("after the upgrade", all_done(args.stacks), 300 + 5 * args.stacks)
        figures["all_ready_seconds_after_n_plus_1_start"] = round(catch_up + figures["n_plus_1"]["start_seconds"], 1)
        figures["all_ready_seconds_after_sigterm"] = round(time.monotonic() - stop_started, 1)
        time.sleep(10)  # a late duplicate would show now

        fleet = bench.stacks()
        starts = start_times(runs_since_change(stack_updates(backend, int(changed)), filled))
        figures.update(fleet_figures(starts, fleet, (mid, during, idle), next_started))
        figures.update({"locks_left": locks_left([backend]),
                        "n_plus_1_error_log_lines": error_lines(successor.log, log_offset)})
    pool.shutdown()
    say_runs(figures)
    print(f"drain {figures['drain_seconds']} s; N+1 healthy in {figures['n_plus_1']['start_seconds']} s; all "
          f"{args.stacks} Ready with their latest generation {figures['all_ready_seconds_after_sigterm']} s after "
          f"SIGTERM ({figures['all_ready_seconds_after_n_plus_1_start']} s after N+1's start); idle Stacks' runs "
          f"{figures['idle_engine_runs']} of {len(idle)}; locks left {figures['locks_left']}; not Ready "
          f"{len(figures['stacks_not_ready'])}; N+1 ERROR lines {len(figures['n_plus_1_error_log_lines'])}; "
          f"1-min load {figures['load_average_1m']}", flush=True)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
