"""Local platform figures: toolchain cold/warm per entry, start to /readyz, first Deployment Available, RSS.

    .venv/bin/python benchmarks/local_platform.py            # recorded cold build times, measured warm path
    .venv/bin/python benchmarks/local_platform.py --cold kwok   # also rebuild entries cold in a scratch cache

Cold times come from each entry's manifest (recorded when it was built) unless --cold rebuilds it
in a scratch STRATA_CACHE and GOCACHE, which takes as long as it says.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client

from harness import rss_tree_mb
from strata_components.local import processes, toolchain
from strata_components.local.kube import api_client
from strata_components.local.platform import LocalPlatform, PlatformConfig


def toolchain_figures(cold: list[str]) -> None:
    print("== toolchain (cold = built from Go modules; warm = cache check)")
    specs = toolchain.load_specs()
    for name, spec in specs.items():
        entry = toolchain.cache_root() / "toolchain" / spec.key
        manifest = json.loads((entry / toolchain.MANIFEST).read_text()) if (entry / toolchain.MANIFEST).exists() else {}
        started = time.monotonic()
        reason = toolchain.check_entry(entry, spec)
        warm = time.monotonic() - started
        recorded = manifest.get("build_seconds")
        cold_text = f"{recorded:7.1f}s" if recorded else "not recorded"
        print(f"  {spec.key:32} cold {cold_text:>12}   warm {warm * 1000:7.1f} ms   {reason or 'cache hit'}")
        if manifest.get("phases"):
            print(f"  {'':32} {toolchain.format_phases('', manifest['phases']).strip().removeprefix(': ')}")
    for name in cold:
        with tempfile.TemporaryDirectory(prefix="strata-cold-") as scratch:
            env = {**os.environ, "STRATA_CACHE": scratch, "GOCACHE": f"{scratch}/go-build"}
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "strata_components.cli", "local", "toolchain", name], env=env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"  {name:32} cold rebuild now {time.monotonic() - started:7.1f}s (empty GOCACHE, warm module cache)")


def platform_figures(controllers: tuple[str, ...]) -> None:
    print("== control plane")
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as state:
        platform = LocalPlatform(PlatformConfig(state_dir=Path(state), host_controllers=controllers))
        try:
            started = time.monotonic()
            info = platform.up(say=lambda _: None)
            first = time.monotonic() - started
            print(f"  start from empty state to every component ready: {first:5.1f}s")
            with api_client(info.kubeconfig_path) as api:
                apps = client.AppsV1Api(api)
                client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
                started = time.monotonic()
                apps.create_namespaced_deployment("bench", {
                    "metadata": {"name": "web"},
                    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                             "template": {"metadata": {"labels": {"app": "web"}},
                                          "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
                processes.wait_until(
                    lambda: apps.read_namespaced_deployment_status("web", "bench").status.available_replicas == 2,
                    120, "deployment")
                print(f"  2-replica Deployment apply -> Available:        {time.monotonic() - started:5.1f}s")
            print("  RSS per component (MB):")
            total = 0.0
            for name in platform.status():
                pid = processes.running_pid(platform.run_dir, name)
                size = sum(rss_tree_mb(pid)) if pid else 0.0
                total += size
                print(f"    {name:26} {size:7.1f}")
            print(f"    {'total':26} {total:7.1f}")
            platform.down(say=lambda _: None)
            started = time.monotonic()
            platform.up(say=lambda _: None)
            print(f"  restart with existing state to ready:           {time.monotonic() - started:5.1f}s")
        finally:
            platform.down(say=lambda _: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="append", default=[], help="rebuild this entry cold in a scratch cache")
    parser.add_argument("--controllers", default="source-controller,kustomize-controller")
    args = parser.parse_args()
    toolchain_figures(args.cold)
    platform_figures(tuple(filter(None, args.controllers.split(","))))


if __name__ == "__main__":
    main()
