"""GitOps latency: a change pushed through Flux vs the same change by `kubectl apply`, vs Flux's poll alone.

    .venv/bin/python benchmarks/gitops.py [--rounds 10] [--poll-rounds 3] [--poll-interval 60]

A scratch local platform with Flux's source- and kustomize-controller as host processes and the real
operator (harness.platform_with_operator). Three Program + Stack pairs, each running the same YAML
program (one builtin Stash whose input is exported as `greeting`); a round changes the greeting:
- push: a GitRepository (interval 10m, so any speed is the notification) and Kustomization sync the
  pair from a repository on the platform's git server; the change is committed in a clone and sent
  with `git push` over HTTP, which makes the git server annotate the GitRepository with
  `reconcile.fluxcd.io/requestedAt`. Timed from the start of `git push` to the Stack Ready with the
  new output, with the stages in between: push returned, source fetched (artifact at the new commit),
  Kustomization applied (the Program in the cluster has the new greeting), Stack Ready, and the
  Kustomization Ready at the new revision (its health check; may come before or after the Stack).
- kubectl: the same two manifests applied with the toolchain's `kubectl apply -f`, timed from the start
  of kubectl to the Stack Ready with the new output.
- poll only: a second repository whose GitRepository polls every --poll-interval seconds; the change is
  committed straight into its bare repository (`GitRepos.commit`: no HTTP, so no notification), at a
  random moment of the poll cycle, and timed from then to the Stack Ready with the new output; each
  round also says how long after the source's previous poll (source-controller's log) the commit came.
Push and kubectl rounds alternate (their order swapping every round) and the poll rounds are spread
between them, so machine noise hits every path alike; one unmeasured warm-up round of push and kubectl
comes first. Every wait is on a watch, not polling the API server. Goal (issue 16): push -> Ready
within 2 s of the kubectl path.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import watch

from harness import GROUP, NAMESPACE, VERSION, Bench, platform_with_operator
from strata_components.flux import build_sync_manifests
from strata_components.local import processes
from strata_components.local.gitserver import GitRepos
from strata_components.local.kube import server_side_apply
from strata_components.team import build_team_objects
from strata_components.team_entries import team_names

RESOURCES = {
    "GitRepository": ("source.toolkit.fluxcd.io", "v1", "gitrepositories"),
    "Kustomization": ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations"),
    "Program": (GROUP, VERSION, "programs"),
    "Stack": (GROUP, VERSION, "stacks"),
}
SYNC_DIR = "clusters/bench"
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
GOAL_SECONDS = 2.0
TEAM = "bench"


# --- manifests ---------------------------------------------------------------------------------


def manifests(name: str, greeting: str, backend: str) -> str:
    """The Program and the Stack running it, as plain manifests (Flux's or kubectl's input alike)."""
    program = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Program",
               # Pulumi YAML's ${...} is not for Flux's postBuild substitution.
               "metadata": {"name": name, "namespace": NAMESPACE,
                            "annotations": {"kustomize.toolkit.fluxcd.io/substitute": "disabled"}},
               "program": {"resources": {"note": {"type": "pulumi:index:Stash", "properties": {"input": greeting}}},
                           "outputs": {"greeting": "${note.input}"}}}
    stack = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name, "namespace": NAMESPACE},
             "spec": {"stack": name, "programRef": {"name": name}, "backend": backend,
                      "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                                               "secret": {"name": "pulumi", "key": "passphrase"}}},
                      "destroyOnFinalize": True}}
    return yaml.safe_dump_all([program, stack], sort_keys=False)


def sync(name: str, url: str, interval: str, backend: str) -> list[dict[str, Any]]:
    """A GitRepository polling every `interval` and a Kustomization of SYNC_DIR, as the Flux component
    renders a sync (prune, wait for health, postBuild substitution), applied as a team's ServiceAccount
    (Flux runs locked down: see `team_identity`)."""
    repository, kustomization = build_sync_manifests(yaml.safe_dump_all([
        {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
         "metadata": {"name": name, "namespace": NAMESPACE},
         "spec": {"url": url, "interval": interval, "ref": {"branch": "main"}}},
        {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
         "metadata": {"name": name, "namespace": NAMESPACE},
         "spec": {"interval": "10m", "path": f"./{SYNC_DIR}", "sourceRef": {"kind": "GitRepository", "name": name}}},
    ]), {"STRATA_BACKEND": backend}, timeout="2m")
    kustomization["spec"]["serviceAccountName"] = team_names(TEAM, NAMESPACE)["service_account"]
    return [repository, kustomization]


# --- what is awaited ---------------------------------------------------------------------------


def condition_true(obj: dict[str, Any], ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or [])


def fetched(sha: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: ((obj.get("status") or {}).get("artifact") or {}).get("revision", "").endswith(sha)


def kustomization_ready(sha: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: condition_true(obj, "Ready") and (obj.get("status") or {}).get(
        "lastAppliedRevision", "").endswith(sha)


def program_says(greeting: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: ((((obj.get("program") or {}).get("resources") or {}).get("note") or {}).get(
        "properties") or {}).get("input") == greeting


def stack_says(greeting: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: condition_true(obj, "Ready") and (obj.get("status") or {}).get("outputs") == {
        "greeting": greeting}


class Stage(threading.Thread):
    """Watches one object of the bench namespace and records when it first satisfies `done`."""

    def __init__(self, bench: Bench, kind: str, name: str, done: Callable[[dict[str, Any]], bool], label: str):
        super().__init__(daemon=True)
        self.bench, self.kind, self.name, self.done, self.label = bench, kind, name, done, label
        self.at: float | None = None
        self.last: dict[str, Any] | None = None
        self.listening = threading.Event()  # the watch has reported the object once: no change can slip by
        self.stop = threading.Event()

    def run(self) -> None:
        group, version, plural = RESOURCES[self.kind]
        while not self.stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self.bench.custom.list_namespaced_custom_object, group, version, NAMESPACE,
                                           plural, field_selector=f"metadata.name={self.name}", timeout_seconds=30):
                    now = time.monotonic()
                    self.listening.set()
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.last = event["object"]
                        if self.done(event["object"]):
                            self.at = now
                            return
                    if self.stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - a dropped watch is opened again; the deadline still holds
                time.sleep(0.2)
            finally:
                stream.stop()

    def describe(self) -> str:
        status = (self.last or {}).get("status")
        return f"{self.kind} {self.name} never reached '{self.label}'; last status: {status}"


def timed(action: Callable[[], Any], stages: list[Stage], timeout: float) -> dict[str, float]:
    """Start watching every stage, then run `action`; returns, per stage label, the seconds from the start
    of `action` (and under 'action', when it returned)."""
    for stage in stages:
        stage.start()
    for stage in stages:
        if not stage.listening.wait(30):
            raise TimeoutError(f"no watch of {stage.kind} {stage.name} after 30 s")
    started = time.monotonic()
    action()
    returned = time.monotonic()
    deadline = started + timeout
    for stage in stages:
        stage.join(max(0.0, deadline - time.monotonic()))
    for stage in stages:
        stage.stop.set()
    missing = [stage.describe() for stage in stages if stage.at is None]
    if missing:
        raise TimeoutError(f"after {timeout:.0f}s: " + "; ".join(missing))
    return {"action": returned - started, **{s.label: s.at - started for s in stages}}


# --- the three paths ---------------------------------------------------------------------------


class Paths:
    def __init__(self, bench: Bench, poll_interval: int):
        self.bench = bench
        self.git: GitRepos = bench.platform.info().git
        self.kubectl = str(bench.platform.toolchain.bin("kubectl"))
        self.poll_interval = poll_interval
        self.backends = {name: bench.backend(name) for name in ("push", "poll", "direct")}
        self.clone = bench.scratch / "push-clone"

    def set_up(self) -> None:
        """The push and poll syncs and the kubectl pair, each first deployed with greeting v0."""
        custom = self.bench.custom
        # The syncs' identity, as the platform layer makes a team's: its Stacks and Programs, in this namespace.
        server_side_apply(self.bench.platform.kubeconfig_path,
                          [obj for obj in build_team_objects(TEAM, NAMESPACE) if obj["kind"] != "Namespace"])
        for name, interval in (("push", "10m"), ("poll", f"{self.poll_interval}s")):
            url = self.git.create(name, {f"{SYNC_DIR}/{name}.yaml": manifests(name, "v0", "${STRATA_BACKEND}")})
            for document in sync(name, url, interval, self.backends[name]):
                group, version, plural = RESOURCES[document["kind"]]
                custom.create_namespaced_custom_object(group, version, NAMESPACE, plural, document)
        subprocess.run([*GIT, "clone", "-q", self.git.push_url("push"), str(self.clone)], check=True,
                       capture_output=True)
        self.kubectl_apply("v0")
        stages = [Stage(self.bench, "Stack", name, stack_says("v0"), "ready") for name in ("push", "poll", "direct")]
        stages += [Stage(self.bench, "Kustomization", name, kustomization_ready(self.git.head(name)), "kustomization")
                   for name in ("push", "poll")]
        timed(lambda: None, stages, 300)

    def kubectl_apply(self, greeting: str) -> None:
        path = self.bench.scratch / "direct.yaml"
        path.write_text(manifests("direct", greeting, self.backends["direct"]))
        subprocess.run([self.kubectl, "apply", "-f", str(path)], check=True, capture_output=True,
                       env={**os.environ, "KUBECONFIG": str(self.bench.platform.kubeconfig_path)})

    def push(self, greeting: str) -> dict[str, float]:
        (self.clone / SYNC_DIR / "push.yaml").write_text(manifests("push", greeting, "${STRATA_BACKEND}"))
        subprocess.run([*GIT, "commit", "-qam", f"greeting {greeting}"], cwd=self.clone, check=True)
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=self.clone, check=True, capture_output=True,
                             text=True).stdout.strip()
        seconds = timed(lambda: subprocess.run([*GIT, "push", "-q", "origin", "main"], cwd=self.clone, check=True,
                                               capture_output=True), [
            Stage(self.bench, "GitRepository", "push", fetched(sha), "fetched"),
            Stage(self.bench, "Program", "push", program_says(greeting), "applied"),
            Stage(self.bench, "Stack", "push", stack_says(greeting), "ready"),
            Stage(self.bench, "Kustomization", "push", kustomization_ready(sha), "kustomization"),
        ], 120)
        return seconds

    def apply(self, greeting: str) -> dict[str, float]:
        seconds = timed(lambda: self.kubectl_apply(greeting), [
            Stage(self.bench, "Stack", "direct", stack_says(greeting), "ready"),
        ], 120)
        return seconds

    def poll(self, greeting: str) -> dict[str, float]:
        """The commit lands in the bare repository at a random moment of the poll cycle, so the wait
        for the next poll is what an arbitrary commit gets (half the interval on average). Also returns,
        under 'since_poll', how long after the source's previous poll the commit came (from
        source-controller's log), so each figure can be checked against the interval."""
        time.sleep(random.uniform(0, self.poll_interval))
        committed: dict[str, float] = {}

        def commit() -> None:
            self.git.commit("poll", {f"{SYNC_DIR}/poll.yaml": manifests("poll", greeting, "${STRATA_BACKEND}")},
                            message=f"greeting {greeting}")
            committed["at"] = time.time()

        # The sha is known only once committed: watch the source for any revision but the current one.
        before = self.git.head("poll")
        source = Stage(self.bench, "GitRepository", "poll", lambda obj: bool(
            ((obj.get("status") or {}).get("artifact") or {}).get("revision")) and not fetched(before)(obj), "fetched")
        seconds = timed(commit, [
            source,
            Stage(self.bench, "Program", "poll", program_says(greeting), "applied"),
            Stage(self.bench, "Stack", "poll", stack_says(greeting), "ready"),
        ], self.poll_interval * 1.1 + 120)
        # Measured from the commit being in the repository, not from the start of the commit helper.
        result = {label: value - seconds["action"] for label, value in seconds.items() if label != "action"}
        previous = [at for at in self.source_polls("poll") if at <= committed["at"]]
        if previous:
            result["since_poll"] = committed["at"] - previous[-1]
        return result

    def source_polls(self, name: str) -> list[float]:
        """When source-controller reconciled the GitRepository `name` (wall clock), from its log."""
        log = self.bench.platform.log_dir / "source-controller.log"
        marker = f'"GitRepository": {{"name":"{name}","namespace":"{NAMESPACE}"}}'
        polls = []
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if marker in line and ("no changes since last reconciliation" in line or "stored artifact" in line):
                try:
                    polls.append(datetime.fromisoformat(line.split("\t", 1)[0].replace("Z", "+00:00")).timestamp())
                except ValueError:
                    continue
        return polls


# --- report ------------------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


def stages_line(seconds: dict[str, float], labels: list[tuple[str, str]]) -> str:
    return " ".join(f"{name} {seconds[label]:5.2f}" for label, name in labels)


PUSH_STAGES = [("action", "pushed"), ("fetched", "fetched"), ("applied", "applied"), ("ready", "Ready"),
               ("kustomization", "| Kustomization Ready")]
POLL_STAGES = [("fetched", "fetched"), ("applied", "applied"), ("ready", "Ready")]


def other_apiservers(own: int | None) -> int:
    """kube-apiserver processes on this host besides ours: another platform (an e2e `make up`, a dev
    stack) sharing the CPU."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        count += command.endswith(b"/kube-apiserver")
    return count


def machine_line(bench: Bench) -> str:
    own = processes.running_pid(bench.platform.run_dir, "kube-apiserver")
    others = other_apiservers(own)
    sharing = (f"{others} other platform(s) running beside this one (another kube-apiserver, e.g. an e2e make up)"
               if others else "no other platform running")
    return f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {sharing}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="measured push and kubectl rounds (each)")
    parser.add_argument("--poll-rounds", type=int, default=3, help="poll-only rounds (each takes up to the interval)")
    parser.add_argument("--poll-interval", type=int, default=60, help="the poll-only GitRepository's interval, s")
    args = parser.parse_args()
    if args.rounds < 1 or args.poll_rounds < 0:
        parser.error("--rounds must be at least 1 and --poll-rounds at least 0")
    with platform_with_operator(host_controllers=("source-controller", "kustomize-controller")) as bench:
        versions = ", ".join(bench.platform.toolchain.dir(tool).name for tool in
                             ("source-controller", "kustomize-controller", "pulumi", "pulumi-yaml"))
        print(f"GitOps latency on a scratch local platform with the real operator ({versions})")
        print(f"machine at start: {machine_line(bench)}", flush=True)
        paths = Paths(bench, args.poll_interval)
        started = time.monotonic()
        paths.set_up()
        print(f"set up: both syncs and the kubectl pair deployed and Ready in {time.monotonic() - started:.1f}s",
              flush=True)

        warm_push, warm_apply = paths.push("warm-up"), paths.apply("warm-up")
        print(f"  warm-up (not counted): push {warm_push['ready']:5.2f}s   kubectl {warm_apply['ready']:5.2f}s",
              flush=True)
        polls_after = Counter(min(args.rounds - 1, index * args.rounds // args.poll_rounds)
                              for index in range(args.poll_rounds)) if args.poll_rounds else Counter()
        pushes: list[dict[str, float]] = []
        applies: list[dict[str, float]] = []
        polls: list[dict[str, float]] = []
        for index in range(args.rounds):
            order = ("push", "kubectl") if index % 2 == 0 else ("kubectl", "push")
            for path in order:
                if path == "push":
                    pushes.append(paths.push(f"push-{index}"))
                else:
                    applies.append(paths.apply(f"kubectl-{index}"))
            print(f"  round {index + 1:2d}: push {pushes[-1]['ready']:5.2f}s ({stages_line(pushes[-1], PUSH_STAGES)})"
                  f"   kubectl {applies[-1]['ready']:5.2f}s (applied {applies[-1]['action']:4.2f})", flush=True)
            for _ in range(polls_after[index]):
                polls.append(paths.poll(f"poll-{len(polls)}"))
                phase = (f"; committed {polls[-1]['since_poll']:4.1f}s after the source's previous poll"
                         if "since_poll" in polls[-1] else "")
                print(f"  poll-only round {len(polls)}: {polls[-1]['ready']:5.2f}s "
                      f"({stages_line(polls[-1], POLL_STAGES)}{phase})", flush=True)

        push_ready = [r["ready"] for r in pushes]
        apply_ready = [r["ready"] for r in applies]
        push_median, apply_median = statistics.median(push_ready), statistics.median(apply_ready)
        print()
        print(f"push -> Stack Ready      median {push_median:5.2f}s   p95 {p95(push_ready):5.2f}s   "
              f"({len(pushes)} pushes)")
        print("  stage medians from the start of git push: " + ", ".join(
            f"{name.strip('| ')} {statistics.median(r[label] for r in pushes):4.2f}s" for label, name in PUSH_STAGES))
        print(f"kubectl apply -> Ready   median {apply_median:5.2f}s   p95 {p95(apply_ready):5.2f}s   "
              f"({len(applies)} applies; kubectl itself {statistics.median(r['action'] for r in applies):4.2f}s)")
        gap = push_median - apply_median
        print(f"push / kubectl: {push_median / apply_median:4.2f}x, push {gap:+.2f}s median "
              f"({p95(push_ready) - p95(apply_ready):+.2f}s p95)   goal: push within {GOAL_SECONDS:.0f} s of kubectl: "
              f"{'met' if gap <= GOAL_SECONDS else 'MISSED'}")
        if polls:
            poll_ready = [r["ready"] for r in polls]
            print(f"poll only -> Ready       median {statistics.median(poll_ready):5.2f}s   "
                  f"({len(polls)} commits: " + ", ".join(f"{value:.1f}s" for value in poll_ready) +
                  f"; {statistics.median(poll_ready) / push_median:.0f}x the push path)")
            to_ready = statistics.median(r["ready"] - r["fetched"] for r in polls)
            print(f"  GitRepository interval {args.poll_interval}s (source-controller adds up to 5% jitter); each "
                  "commit went straight into the bare repository")
            print(f"  (no push, no notification) at a random point of the poll cycle: it waits "
                  f"{args.poll_interval / 2:.0f}s on average, plus {to_ready:.1f}s from fetch to Ready")
        print(f"machine at end: {machine_line(bench)}")


if __name__ == "__main__":
    main()
