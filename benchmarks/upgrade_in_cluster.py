"""In-place upgrade of the in-cluster operator, version N to N+1, by `pulumi up` of a program that uses the
Operator component, with a fleet Ready and part of it mid-update (#29 item 2, the in-cluster half).

    sudo flock /tmp/strata-heavy.lock .venv/bin/python benchmarks/upgrade_in_cluster.py [--stacks 200]
        [--mid-update 20] [--mid-update-resources 200] [--during-upgrade 10]
        [--json benchmarks/results/upgrade-in-cluster.json]

The two versions are two source trees of this repository's HEAD, unpacked by `git archive` into the scratch
directory: N as committed, and N+1 the same with one optional field (`spec.upgradeNote`,
upgrade.with_next_schema) written into the Stack CRD's YAML (operator/strata_operator/api/crds/). Each
tree's operator image is built from that tree (build_operator_image run by a Python importing it: two
different images, since their sources differ) and pushed to the registry of a scratch cluster-profile
platform (2 real nodes, the registry, MinIO). A small Pulumi Python program, written into the scratch
directory, deploys the operator with the Operator component (pulumi-kubernetes' CustomResourceDefinitions,
RBAC and Deployment): in-cluster, 2 replicas, executor "process" (updates run in the leader pod: 200
workspace pods would not fit this host), on the real nodes, a 2 GiB memory limit (the leader runs up to 4
pulumi CLIs). The user's pulumi CLI runs it with this virtualenv's Python and the tree on PYTHONPATH; its
state is a file:// backend of the scratch directory, with a passphrase.

Version N: the program from tree N, image N, default flags. --stacks Stacks of a 3-resource Stash YAML
Program, state in an s3:// bucket of MinIO (keys in a Secret the Stacks' envRefs name), are filled to Ready;
the first --mid-update of them have a Program of their own, --mid-update-resources Stash resources whose
inputs name the Stack's config `round`. Those get a spec change (config round 2: every input changes, so each
update steps through all of its resources; N's leader runs 4 at a time), long enough that some still run when
N's leader is told to stop, about 70 s into the rollout. Once the operator has started each of their updates
the upgrade strikes: `pulumi up` of the program from tree N+1, image N+1 and a changed default
(--min-resync-seconds 120; N's is 60). It updates the Stack CRD (the new field) and then the Deployment, which
the component rolls (RollingUpdate, one pod more at a time, none unavailable): each N+1 pod starts, as a
standby, before an N pod is told to stop; that pod drains (the leader finishes the updates it has started,
running or waiting for one of its 4 slots, for up to 300 s of the 330 s grace) and hands the Lease over.
Half of --during-upgrade other Stacks get a spec change once the first N pod is told to stop, the other half
once both are gone.
Reported: the rollout (pulumi up's start until both N+1 pods are Ready and one leads), pulumi up's own
duration, each N pod's drain (deletion to gone) and the mid-update Stacks' state (in progress, done) when it
was told to stop, when N+1 took the Lease, when the new field was served; seconds until every Stack is Ready
with its latest generation; engine runs per changed Stack from the bucket's update history (.pulumi/history/,
not the operator's log; must be 1 each: duplicates and lost updates counted), which version ran them (the
history's start time against N+1's taking the Lease: N's leader leads until it has drained) and where they
stood at N's leader's SIGTERM (finished, running a CLI, started by N while it drained, started by N+1); runs
of the Stacks that needed nothing (must be 0; each such run and any second run is listed with its start and its
message, which names why the operator ran it); locks left in the bucket (must be 0); Stacks not Ready (must be
0); the N+1 pods' log lines at ERROR level. Progress is printed at least every 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import yaml
from kubernetes import client

from cluster_faults import Cluster, create_team
from harness import Heartbeat, cluster_platform, runs_since_change, start_times, stash_program, write_json
from strata_components.local import realnode
from strata_components.local.images import ImageArchive
from strata_components.local.kube import api_client
from strata_components.local.operator_host import OPERATOR_NAMESPACE
from strata_components.local.preflight import find_pulumi_with_python_host, missing_dev_stack_requirements
from strata_components.operator import PROCESS_NAME
from upgrade import (NEXT_ARGS, all_done, change_spec, done, first_figures, fleet_figures, in_progress,
                     new_field_served, parse_fleet_args, say_runs, split_fleet, wait_for_fleet, with_next_schema)

REPOSITORY = Path(__file__).resolve().parents[1]
STACK_CRD = Path("operator/strata_operator/api/crds/pulumi.com_stacks.yaml")
TEAM = "team-upgrade"
BUCKET = "upgrade"
PROGRAM = "upgrade"
LONG_PROGRAM = "upgrade-long"  # the mid-update Stacks': their change steps through all its resources
# The leader runs the updates' pulumi CLIs in its own pod (the default limit is 1 GiB).
OPERATOR_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
DEPLOY_PROJECT = "strata-upgrade-deploy"
DEPLOY_STACK = "bench"
DEPLOY_PROGRAM = '''\
"""The operator in-cluster, as a bootstrap deploys it: the Operator component of the source tree on PYTHONPATH."""
import pulumi
import pulumi_kubernetes as k8s
from strata_components.operator import Operator

config = pulumi.Config()
cluster = k8s.Provider("cluster", kubeconfig=config.require("kubeconfig"))
Operator("strata", {"provider": cluster, **config.require_object("operator")})
'''
# Run by a Python whose PYTHONPATH is one source tree: the image build reads the tree its module is in.
BUILD_IMAGE = """\
import json
from strata_components.local.images import build_operator_image, user_pulumi_install
from strata_components.local.toolchain import installed, profile_tools
image = build_operator_image(installed(profile_tools("cluster")), user_pulumi_install(),
                             say=lambda line: print(line, flush=True))
print(json.dumps([image.name, str(image.path)]))
"""


def run_said(argv: list[str], env: dict[str, str], say: Callable[[str], None], cwd: Path | None = None) -> list[str]:
    """Run `argv`, saying each output line as it comes; its lines, or RuntimeError on a non-zero exit."""
    lines: list[str] = []
    with subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            say(f"  | {lines[-1]}")
        code = process.wait()
    if code != 0:
        raise RuntimeError(f"{Path(argv[0]).name} {' '.join(argv[1:3])} exited {code}: its output is above")
    return lines


def source_tree(directory: Path, commit: str, next_version: bool) -> Path:
    """This repository at `commit` in `directory` (git archive), with N+1's Stack CRD if `next_version`.
    Returns the directory to put on PYTHONPATH: strata_components and strata_operator of that tree."""
    directory.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    if next_version:
        crd = directory / STACK_CRD
        documents = [document for document in yaml.safe_load_all(crd.read_text()) if document]
        crd.write_text(yaml.safe_dump_all(with_next_schema(documents), sort_keys=False))
    path = directory.with_name(f"{directory.name}-pythonpath")
    path.mkdir()
    (path / "strata_components").symlink_to(directory / "components")
    (path / "strata_operator").symlink_to(directory / "operator" / "strata_operator")
    return path


def build_image(pythonpath: Path, say: Callable[[str], None]) -> ImageArchive:
    """The operator image of the source tree on `pythonpath` (a cache hit when it was built before)."""
    lines = run_said([sys.executable, "-c", BUILD_IMAGE], {**os.environ, "PYTHONPATH": str(pythonpath)}, say)
    name, archive = json.loads(lines[-1])
    return ImageArchive(name, Path(archive))


class DeployProgram:
    """The small Pulumi program deploying the operator with the Operator component, run by the user's pulumi
    CLI with this virtualenv's Python; its stack's state in a file:// backend of `directory`."""

    def __init__(self, directory: Path, kubeconfig: Path, say: Callable[[str], None]) -> None:
        cli = find_pulumi_with_python_host()
        if cli is None:
            raise SystemExit("; ".join(missing_dev_stack_requirements()))
        self.directory, self.kubeconfig, self.say = directory / "program", kubeconfig, say
        self.directory.mkdir(parents=True)
        (directory / "state").mkdir()
        (self.directory / "Pulumi.yaml").write_text(yaml.safe_dump({
            "name": DEPLOY_PROJECT, "runtime": {"name": "python", "options": {"virtualenv": sys.prefix}}}))
        (self.directory / "__main__.py").write_text(DEPLOY_PROGRAM)
        self.cli = cli
        self.env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true",
                    "PULUMI_BACKEND_URL": (directory / "state").as_uri(), "PULUMI_CONFIG_PASSPHRASE": uuid.uuid4().hex,
                    "PATH": os.pathsep.join([str(cli.parent), os.environ.get("PATH", "")])}
        run_said([str(cli), "stack", "init", DEPLOY_STACK, "--secrets-provider", "passphrase", "--non-interactive"],
                 self.env, say, self.directory)

    def up(self, pythonpath: Path, operator: dict) -> float:
        """`pulumi up` of the program from the source tree on `pythonpath`; returns its seconds."""
        started = time.monotonic()
        run_said([str(self.cli), "up", "--stack", DEPLOY_STACK, "--yes", "--skip-preview", "--non-interactive",
                  "--config", f"{DEPLOY_PROJECT}:kubeconfig={self.kubeconfig}",
                  "--config", f"{DEPLOY_PROJECT}:operator={json.dumps(operator)}"],
                 {**self.env, "PYTHONPATH": str(pythonpath)}, self.say, self.directory)
        return round(time.monotonic() - started, 1)


def operator_args(image: str, flags: tuple[str, ...] = ()) -> dict:
    """The Operator component's arguments (but the provider): in-cluster, 2 replicas, the process executor,
    on the real nodes."""
    return {"mode": "in-cluster", "image": image, "image_pull_policy": "IfNotPresent", "replicas": 2,
            "executor": "process", "node_selector": dict(realnode.NODE_LABEL),
            "tolerations": [dict(realnode.TOLERATION)], "resources": OPERATOR_RESOURCES, "args": list(flags)}


def long_program(count: int) -> dict:
    """A YAML Program of `count` Stash resources whose inputs name the Stack's config `round`: the change every
    changed Stack gets (round 2) changes each of them, so the update steps through all `count`."""
    body = stash_program(count)
    body["configuration"] = {"round": {"type": "String", "default": "1"}}
    for index, resource in enumerate(body["resources"].values()):
        resource["properties"]["input"] = f"value {index} round ${{round}}"
    return body


def drain_figures(updates: dict[str, list[dict]], names: list[str], stop: float, handover: float) -> dict:
    """Where the Stacks' engine runs (the bucket's history, whole seconds) stood at N's leader's SIGTERM
    (`stop`) and N+1's taking the Lease (`handover`), both epoch seconds: a run that started in the second of
    the SIGTERM counts as running at it."""
    runs = [u for name in names for u in updates.get(name, [])]
    stop, handover = int(stop), int(handover)
    return {"finished_before_sigterm": sum(u["endTime"] < stop for u in runs),
            "running_a_cli_at_sigterm": sum(u["startTime"] <= stop <= u["endTime"] for u in runs),
            "started_by_n_while_draining": sum(stop < u["startTime"] < handover for u in runs),
            "started_by_n_plus_1": sum(u["startTime"] >= handover for u in runs),
            "last_run_ended_after_sigterm_s": round(max((u["endTime"] for u in runs), default=stop) - stop, 1)}


def runs_named(updates: dict[str, list[dict]], names: list[str], started: float,
               redact: Callable[[str], str]) -> list[dict]:
    """The Stacks' engine runs from the history, to tell why each ran: start and end in seconds from `started`
    (pulumi up's start, epoch), and the update's message (the plan's words and `[strata run <name>]`)."""
    return [{"stack": name, "start_s": round(u["startTime"] - started, 1), "end_s": round(u["endTime"] - started, 1),
             "message": redact(u.get("message", ""))} for name in names for u in updates.get(name, [])]


def pod_image(pod: client.V1Pod) -> str:
    return pod.spec.containers[0].image


def counts(fleet: list[dict] | None, names: list[str]) -> dict:
    shown = [s for s in fleet or [] if s["metadata"]["name"] in names]
    return {"in_progress": sum(map(in_progress, shown)), "done": sum(map(done, shown))}


def watch_rollout(cluster: Cluster, image: str, deploying: Future, mid: list[str], during: list[str],
                  started: float) -> dict:
    """Watch the operator pods while N+1's `pulumi up` runs (`deploying`), until it has finished and both N+1
    pods are Ready with one leading and N's are gone; change the first half of `during` once an N pod is told
    to stop (a deletion timestamp), the rest once they are gone. Times are seconds from `started` (pulumi up's
    start); each N pod's SIGTERM (its deletion's request: the deletion timestamp less the grace period) and
    N+1's taking the Lease (the Lease's acquireTime) are kept in epoch seconds too, to place the history's runs."""
    hb = cluster.hb
    epoch = time.time() - (time.monotonic() - started)
    leader = cluster.leader()
    old = {p.metadata.name: {"node": p.spec.node_name, "leader": p.metadata.name == leader, "image": pod_image(p)}
           for p in cluster.operator_pods()}
    figures: dict = {"n_pods": old}
    said = 0.0
    while True:
        now = time.monotonic() - started
        pods = {p.metadata.name: p for p in cluster.operator_pods()}
        for name, entry in old.items():
            pod = pods.get(name)
            if pod is not None and pod.metadata.deletion_timestamp and "told_to_stop_at_s" not in entry:
                entry["told_to_stop_at_s"] = round(now, 1)
                entry["told_to_stop_epoch"] = (pod.metadata.deletion_timestamp.timestamp()
                                               - (pod.metadata.deletion_grace_period_seconds or 0))
                entry["mid_update_at_told_to_stop"] = counts(cluster.stacks(), mid)
                hb.say(f"rollout {now:.1f} s: N's {'leader' if entry['leader'] else 'standby'} {name} told to stop; "
                       f"mid-update Stacks {entry['mid_update_at_told_to_stop']}")
            if pod is None and "gone_at_s" not in entry:
                entry["gone_at_s"] = round(now, 1)
                told = entry.get("told_to_stop_at_s")  # None: gone between two looks
                entry["drain_s"] = round(now - told, 1) if told is not None else None
        if "crd_field_served_at_s" not in figures and new_field_served(cluster.custom, cluster.team):
            figures["crd_field_served_at_s"] = round(now, 1)
        if "n_told_to_stop_at_s" not in figures and any("told_to_stop_at_s" in e for e in old.values()):
            figures["n_told_to_stop_at_s"] = round(now, 1)
            change_spec(cluster.custom, cluster.team, during[:len(during) // 2])
            hb.say(f"rollout {now:.1f} s: an N pod told to stop; {len(during) // 2} Stacks changed")
        if "n_gone_at_s" not in figures and all("gone_at_s" in e for e in old.values()):
            figures["n_gone_at_s"] = round(now, 1)
            change_spec(cluster.custom, cluster.team, during[len(during) // 2:])
            hb.say(f"rollout {now:.1f} s: N's pods gone; {len(during) - len(during) // 2} Stacks changed")
        new = [p for p in pods.values() if pod_image(p) == image]
        if new and "n_plus_1_first_pod_created" not in figures:
            figures["n_plus_1_first_pod_created"] = min(p.metadata.creation_timestamp for p in new).timestamp()
        if new and "n_plus_1_led_at_s" not in figures:
            holder, acquired = cluster.lease()
            if holder in {p.metadata.name for p in new}:
                figures["n_plus_1_lease_acquired_epoch"] = acquired or time.time()
                figures["n_plus_1_led_at_s"] = round(figures["n_plus_1_lease_acquired_epoch"] - epoch, 1)
                hb.say(f"rollout {now:.1f} s: N+1's {holder} leads (Lease acquired at "
                       f"{figures['n_plus_1_led_at_s']} s); mid-update Stacks {counts(cluster.stacks(), mid)}")
        if deploying.done() and "pulumi_up_s" not in figures:
            figures["pulumi_up_s"] = deploying.result()  # raises what the up raised
        if "rollout_s" not in figures and "n_plus_1_led_at_s" in figures and cluster.operators_ready(2, image):
            figures["rollout_s"] = round(now, 1)
            figures["n_plus_1_leader"] = cluster.leader()
            figures["n_plus_1_pods"] = {p.metadata.name: p.spec.node_name for p in new}
        # Rolling, N's last pod may still drain after N+1 leads: the rest of `during` changes once it is gone.
        if "pulumi_up_s" in figures and "rollout_s" in figures and "n_gone_at_s" in figures:
            return figures
        if now - said >= 10:
            states = ", ".join(f"{name}: " + ("gone" if "gone_at_s" in e else "stopping" if "told_to_stop_at_s" in e
                                                else "up") for name, e in old.items())
            ready = sum(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in new)
            hb.say(f"rollout {now:.0f} s: N pods [{states}]; N+1 pods {len(new)} ({ready} Ready), leader "
                   f"{cluster.leader() or 'none'}; new field served: {'crd_field_served_at_s' in figures}; "
                   f"mid-update Stacks {counts(cluster.stacks(), mid)}; pulumi up "
                   f"{'finished' if deploying.done() else 'running'}")
            said = now
        if now > 1200:
            raise TimeoutError(f"the rollout: not finished after {now:.0f} s: {figures}")
        time.sleep(0.5)


def pod_error_lines(cluster: Cluster, pods: list[str]) -> list[str]:
    """The pods' log lines at ERROR level (redacted)."""
    return [cluster.redact(f"{pod}: {line}") for pod in pods
            for line in cluster.core.read_namespaced_pod_log(pod, OPERATOR_NAMESPACE).splitlines() if "ERROR" in line]


def main() -> int:
    args = parse_fleet_args(__doc__.splitlines()[0], lambda parser: parser.add_argument(
        "--mid-update-resources", type=int, default=200,
        help="Stash resources of the mid-update Stacks' Program, all changed by their update (200: some of "
             "the 20 updates still run when N's leader is told to stop, about 70 s into the rollout, and the "
             "rest finish well within its 300 s drain)"))
    hb = Heartbeat()
    figures = first_figures(args)
    commit = subprocess.run(["git", "-C", str(REPOSITORY), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    figures.update({"commit": commit, "executor": "process", "replicas": 2,
                    "mid_update_resources": args.mid_update_resources})
    with cluster_platform(hb, "strata-bench-upgrade-") as (platform, _, scratch), \
            api_client(platform.kubeconfig_path) as api:
        cluster = Cluster(platform, api, hb, TEAM, BUCKET)
        references = {}
        trees = {}
        for version in ("n", "n_plus_1"):
            hb.phase(f"source tree {version} ({commit[:12]}{' + the CRD field' if version == 'n_plus_1' else ''}): "
                     "its operator image built (a cache hit when built before) and pushed")
            trees[version] = source_tree(scratch / f"source-{version}", commit, version == "n_plus_1")
            image = build_image(trees[version], hb.say)
            references[version] = platform.push_image(image, "strata-operator", image.name.rsplit(":", 1)[1])
            figures.setdefault(version, {})["image"] = references[version]
        deploy = DeployProgram(scratch / "deploy", platform.kubeconfig_path, hb.say)

        hb.phase(f"version N: pulumi up of the Operator program from tree N, {references['n']}")
        figures["n"]["pulumi_up_s"] = deploy.up(trees["n"], operator_args(references["n"]))
        cluster.wait(lambda: cluster.operators_ready(2, references["n"]), 300, "both N pods Ready and one leading")
        hb.say(f"N Ready in {figures['n']['pulumi_up_s']} s of pulumi up: leader {cluster.leader()}")

        names = create_team(cluster, args.stacks, args.resources, PROGRAM,
                            (args.mid_update, LONG_PROGRAM, long_program(args.mid_update_resources)))
        mid, during, idle = split_fleet(names, args)
        hb.phase(f"the fill: {args.stacks} Stacks of {args.resources} Stash resources ({args.mid_update} of "
                 f"{args.mid_update_resources}), state in s3://{BUCKET}")

        def fleet_wait(*wait_args, **options) -> tuple[list[dict], float]:
            return wait_for_fleet(cluster.stacks, *wait_args, say=hb.say,
                                  operator=lambda: f"leader {cluster.leader() or 'none'}", **options)

        _, fill = fleet_wait("fill", all_done(args.stacks), 300 + 5 * args.stacks)
        figures["fill_seconds"] = round(fill, 1)
        figures["n_plus_1"]["field_served_before"] = new_field_served(cluster.custom, TEAM)

        changed, filled = time.time(), cluster.bucket.updates()
        change_spec(cluster.custom, TEAM, mid)
        hb.phase(f"{len(mid)} Stacks changed; waiting until the operator has started each of their updates")
        try:
            fleet_wait("mid-update", lambda fleet: all(in_progress(s) or done(s) for s in fleet
                                                       if s["metadata"]["name"] in mid), 120, mid, 0.2)
        except TimeoutError as error:
            hb.say(f"  {error}: upgrading anyway")
        figures["mid_update_at_pulumi_up_start"] = counts(cluster.stacks(), mid)

        hb.phase(f"version N+1: pulumi up of the Operator program from tree N+1, {references['n_plus_1']}, "
                 f"args {' '.join(NEXT_ARGS)}; mid-update Stacks {figures['mid_update_at_pulumi_up_start']}")
        started, started_epoch = time.monotonic(), time.time()
        with ThreadPoolExecutor(1) as pool:
            deploying = pool.submit(deploy.up, trees["n_plus_1"], operator_args(references["n_plus_1"], NEXT_ARGS))
            figures["n_plus_1"].update(watch_rollout(cluster, references["n_plus_1"], deploying, mid, during, started))
        rollout = figures["n_plus_1"]
        hb.say(f"rollout: both N+1 pods Ready and {rollout['n_plus_1_leader']} leading {rollout['rollout_s']} s after "
               f"pulumi up's start (pulumi up {rollout['pulumi_up_s']} s); N pods "
               f"{json.dumps(rollout['n_pods'])}")

        hb.phase("waiting until every Stack is Ready with its latest generation")
        fleet_wait("after the upgrade", all_done(args.stacks), 300 + 5 * args.stacks)
        figures["all_ready_seconds_after_pulumi_up_start"] = round(time.monotonic() - started, 1)
        figures["all_ready_seconds_after_n_plus_1_ready"] = round(
            figures["all_ready_seconds_after_pulumi_up_start"] - rollout["rollout_s"], 1)
        hb.phase("all done: 10 s for a late run before counting")
        time.sleep(10)

        fleet = cluster.stacks() or []
        updates = runs_since_change(cluster.bucket.updates(int(changed)), filled)
        starts = start_times(updates)
        # Whose runs: before N+1 took the Lease, N's (N's leader leads until it has drained, rolling).
        figures.update(fleet_figures(starts, fleet, (mid, during, idle), rollout["n_plus_1_lease_acquired_epoch"]))
        n_leader = next(e for e in rollout["n_pods"].values() if e["leader"])
        for group, group_names in (("mid_update", mid), ("changed_during_upgrade", during)):
            if "told_to_stop_epoch" in n_leader:  # else gone between two looks: no SIGTERM time to place runs by
                figures[group]["at_n_leader_sigterm"] = drain_figures(
                    updates, group_names, n_leader["told_to_stop_epoch"], rollout["n_plus_1_lease_acquired_epoch"])
        # Runs that should not be (an idle Stack's, a second one of a changed Stack's), with the plan's words.
        twice = figures["mid_update"]["stacks_run_twice_or_more"] + figures["changed_during_upgrade"][
            "stacks_run_twice_or_more"]
        figures["unexpected_runs"] = runs_named(updates, [n for n in idle if n in updates] + twice, started_epoch,
                                                cluster.redact)
        deployment = client.AppsV1Api(api).read_namespaced_deployment(PROCESS_NAME, OPERATOR_NAMESPACE)
        figures.update({
            "engine_runs_not_succeeded": sum(u.get("result") != "succeeded" for runs in updates.values() for u in runs),
            "locks_left": cluster.bucket.locks(),
            "new_field_served": new_field_served(cluster.custom, TEAM),
            "deployment_strategy": deployment.spec.strategy.type,
            "n_plus_1_container_args": deployment.spec.template.spec.containers[0].args,
            "n_plus_1_error_log_lines": pod_error_lines(cluster, sorted(rollout["n_plus_1_pods"])),
            "n_plus_1_restarts": sum(c.restart_count for p in cluster.operator_pods()
                                     for c in p.status.container_statuses or [])})
    say_runs(figures, hb.say)
    for run in figures["unexpected_runs"]:
        hb.say(f"unexpected run: {run}")
    for e in rollout["n_pods"].values():
        hb.say(f"N's {'leader' if e['leader'] else 'standby'}: told to stop at {e.get('told_to_stop_at_s')} s with "
               f"mid-update Stacks {e.get('mid_update_at_told_to_stop')}, gone at {e.get('gone_at_s')} s "
               f"(drain {e.get('drain_s')} s)")
    hb.say(f"mid-update runs at N's leader's SIGTERM: {figures['mid_update'].get('at_n_leader_sigterm')}; N+1 led at "
           f"{rollout['n_plus_1_led_at_s']} s")
    hb.say(f"rollout {rollout['rollout_s']} s (pulumi up {rollout['pulumi_up_s']} s, N told to stop at "
           f"{rollout.get('n_told_to_stop_at_s')} s, gone at {rollout.get('n_gone_at_s')} s, drains "
           f"{[e.get('drain_s') for e in rollout['n_pods'].values()]} s); all {args.stacks} Ready with their latest "
           f"generation {figures['all_ready_seconds_after_pulumi_up_start']} s after pulumi up's start "
           f"({figures['all_ready_seconds_after_n_plus_1_ready']} s after N+1 was Ready); idle Stacks' runs "
           f"{figures['idle_engine_runs']} of {len(idle)}; locks left {len(figures['locks_left'])}; not Ready "
           f"{len(figures['stacks_not_ready'])}; new field served {figures['new_field_served']}; N+1 ERROR lines "
           f"{len(figures['n_plus_1_error_log_lines'])}; 1-min load {figures['load_average_1m']}")
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
