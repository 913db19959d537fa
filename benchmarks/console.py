"""How fast `strata console` answers with a large fleet: every page's response time and how long a
Stack's change takes to reach an open overview's event stream.

A scratch local platform (no operator: the Stacks' statuses are written as the operator writes them,
through the status subresource) holds `--stacks` Stacks in `--namespaces` namespaces: most Ready,
some failed, stalled or suspended, some awaiting approval with a saved plan, chains of prerequisites
and Programs rolled out in waves. The console runs as `strata console` does, as a subprocess, and
each page is fetched `--rounds` times after one warm-up.

    .venv/bin/python benchmarks/console.py --stacks 1000 --json benchmarks/results/console-1000.json
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.cookiejar
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from strata_components.local.kube import api_client
from strata_components.local.operator_host import install_operator_api
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import installed

GROUP, VERSION = "pulumi.com", "v1"
NOW = "2026-01-01T00:00:00Z"


def plan_bytes(name: str) -> bytes:
    return json.dumps({"resourcePlans": {f"urn:pulumi:dev::{name}::pulumi:index:Stash::note{i}": {
        "goal": {"type": "pulumi:index:Stash", "name": f"note{i}", "inputDiff": {"adds": {"input": f"value {i}"}}},
        "steps": ["create"]} for i in range(3)}}).encode()


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": NOW,
            "observedGeneration": 1}


def stack_status(index: int, name: str) -> dict[str, Any]:
    """Ready mostly; every 50th failed and retrying, every 97th stalled, every 61st awaiting approval."""
    last = {"name": f"{name}-1", "type": "up", "state": "succeeded", "generation": 1, "lastResyncTime": NOW,
            "lastSuccessfulCommit": "fleet/1", "lastAttemptedCommit": "fleet/1", "message": "", "failures": 0}
    status: dict[str, Any] = {"observedGeneration": 1, "lastUpdate": last,
                              "outputs": {"url": f"https://{name}.example", "token": "[secret]"}}
    if index % 50 == 7:
        status["lastUpdate"] = {**last, "state": "failed", "reason": "UpdateFailed", "message": "exit 1: boom"}
        status["conditions"] = [condition("Ready", "False", "UpdateFailed", "boom"),
                                condition("Reconciling", "True", "RetryingAfterFailure", "retrying in 30s")]
    elif index % 97 == 3:
        status["conditions"] = [condition("Ready", "False", "SpecInvalid"),
                                condition("Stalled", "True", "SpecInvalid", "spec.stack is required")]
    elif index % 61 == 5:
        digest = "sha256:" + hashlib.sha256(plan_bytes(name)).hexdigest()
        status["plan"] = {"digest": digest, "generation": 1, "revision": "fleet/2", "reconcileRequest": "",
                          "changes": {"create": 3}, "secrets": 1, "createdAt": NOW}
        status["conditions"] = [condition("Ready", "False", "AwaitingApproval"),
                                condition("Reconciling", "True", "AwaitingApproval", f"plan {digest} awaits approval")]
    else:
        status["conditions"] = [condition("Ready", "True", "ProcessingCompleted")]
    return status


def populate(api: client.ApiClient, stacks: int, namespaces: int) -> list[tuple[str, str]]:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    names = [f"fleet-{n}" for n in range(namespaces)]
    for namespace in names:
        core.create_namespace({"metadata": {"name": namespace}})
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": "fleet"},
            "rollout": {"waves": [{"count": 2}, {"count": 10}]},
            "program": {"resources": {"n": {"type": "pulumi:index:Stash", "properties": {"input": "x"}}}}})
    created = []

    def one(index: int) -> tuple[str, str]:
        namespace, name = names[index % namespaces], f"stack-{index:04d}"
        spec: dict[str, Any] = {"stack": f"organization/fleet/{name}", "programRef": {"name": "fleet"},
                                "suspend": index % 89 == 11}
        if index >= namespaces and index % 4 == 0:
            spec["prerequisites"] = [{"name": f"stack-{index - namespaces:04d}"}]
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name}, "spec": spec})
        status = stack_status(index, name)
        if status.get("plan"):
            core.create_namespaced_secret(namespace, {"metadata": {"name": f"{name}-plan-0"}, "data": {
                "plan": base64.b64encode(plan_bytes(name)).decode()}})
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "stacks", name, {"status": status})
        return namespace, name

    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(one, range(stacks)))
    return created


class Console:
    def __init__(self, kubeconfig: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "strata_components.cli", "console", "--port", "0",
                                         "--kubeconfig", str(kubeconfig)], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line).group(0)
        self.base = url.split("/?")[0]
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.opener.open(url).read()

    def fetch(self, path: str) -> tuple[float, int]:
        start = time.perf_counter()
        with self.opener.open(self.base + path) as response:
            body = response.read()
        return time.perf_counter() - start, len(body)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def stream_latency(console: Console, api: client.ApiClient, targets: list[tuple[str, str]]) -> list[float]:
    """Open the overview's event stream, then make each target fail; seconds from the status write's
    answer to its row arriving on the stream."""
    custom = client.CustomObjectsApi(api)
    arrived: dict[str, float] = {}
    request = urllib.request.Request(console.base + "/events/overview")
    response = console.opener.open(request)

    def read() -> None:
        try:
            for raw in response:
                line = raw.decode(errors="replace")
                for row_id in re.findall(r'id="(row-Stack--[^"]+)"', line):
                    arrived.setdefault(row_id, time.perf_counter())
        except (AttributeError, OSError, ValueError):
            pass  # the stream was closed at the end

    threading.Thread(target=read, daemon=True).start()
    time.sleep(1)
    found = []
    for namespace, name in targets:
        row = f"row-Stack--{namespace}--{name}"
        arrived.pop(row, None)
        status = {"conditions": [condition("Ready", "False", "UpdateFailed", "benchmark failure"),
                                 condition("Reconciling", "True", "RetryingAfterFailure", "retrying")],
                  "lastUpdate": {"type": "up", "state": "failed", "reason": "UpdateFailed", "message": "benchmark",
                                 "lastResyncTime": NOW}}
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "stacks", name, {"status": status})
        written = time.perf_counter()
        deadline = written + 10
        while row not in arrived and time.perf_counter() < deadline:
            time.sleep(0.005)
        found.append(arrived[row] - written if row in arrived else float("inf"))
        time.sleep(0.3)
    response.close()
    return found


def summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median_ms": round(1000 * statistics.median(ordered), 1),
            "p95_ms": round(1000 * ordered[max(0, round(0.95 * len(ordered)) - 1)], 1),
            "max_ms": round(1000 * ordered[-1], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    toolchain = installed(["kubernetes", "etcd", "kwok"])  # the API server is all it needs: no Flux, no operator
    with tempfile.TemporaryDirectory(prefix="strata-bench-console-") as tmp:
        platform = LocalPlatform(PlatformConfig(state_dir=Path(tmp) / "platform", host_controllers=()),
                                 toolchain=toolchain)
        try:
            platform.up(say=lambda _: None)
            install_operator_api(platform.kubeconfig_path)
            with api_client(platform.kubeconfig_path) as api:
                start = time.perf_counter()
                created = populate(api, args.stacks, args.namespaces)
                print(f"{args.stacks} Stacks in {args.namespaces} namespaces written in "
                      f"{time.perf_counter() - start:.1f}s", flush=True)
                console = Console(platform.kubeconfig_path)
                try:
                    plan = next((ns, n) for i, (ns, n) in enumerate(created) if i % 61 == 5)
                    pages = {"overview": "/", "overview, one namespace": "/?namespace=fleet-3",
                             "overview, failing only": "/?state=Failed",
                             "stack": f"/stacks/{created[500 % len(created)][0]}/{created[500 % len(created)][1]}",
                             "approvals": "/approvals", "plan": f"/approvals/{plan[0]}/{plan[1]}",
                             "layers": "/layers", "layers, one namespace": "/layers?namespace=fleet-3",
                             "rollouts": "/rollouts", "rollout": "/rollout/fleet-3/fleet"}
                    results: dict[str, Any] = {"stacks": args.stacks, "namespaces": args.namespaces, "pages": {}}
                    for label, path in pages.items():
                        console.fetch(path)  # warm-up (the first also waits for the store's lists)
                        timings = [console.fetch(path) for _ in range(args.rounds)]
                        results["pages"][label] = {**summary([t for t, _ in timings]), "bytes": timings[0][1]}
                        print(f"{label:28} median {results['pages'][label]['median_ms']:6.1f} ms  "
                              f"p95 {results['pages'][label]['p95_ms']:6.1f} ms  max "
                              f"{results['pages'][label]['max_ms']:6.1f} ms  {timings[0][1] // 1024} KiB", flush=True)
                    lags = stream_latency(console, api, created[1:len(created):max(1, len(created) // 10)][:10])
                    results["change_to_stream"] = summary(lags)
                    print(f"a Stack's change on the overview's stream: median {results['change_to_stream']['median_ms']}"
                          f" ms, max {results['change_to_stream']['max_ms']} ms over {len(lags)} changes")
                finally:
                    console.stop()
        finally:
            platform.down(say=lambda _: None)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    worst = max(page["max_ms"] for page in results["pages"].values())
    print(f"slowest page answer: {worst} ms (goal: 300 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
