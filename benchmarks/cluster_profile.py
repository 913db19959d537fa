"""The cluster profile's figures: platform start with 2 real nodes + kube-proxy + CoreDNS + registry + object
store, cold and warm, and the memory of each process it adds.

    .venv/bin/python benchmarks/cluster_profile.py      # as root, with `make setup`'s Debian packages

One run on a scratch state directory (one real-node platform per host):
- cold: a new state directory (new nodes, empty containerd, an empty registry: CoreDNS's and Flux's
  images built if not cached and pushed, CoreDNS pulled by both nodes); the profile's tools must be
  built already (`strata local toolchain kube-proxy coredns registry minio`), a build is not a start;
- warm: `down` then `up` on the same state (images kept in the registry and the nodes);
- RSS of every process the profile adds, idle after the warm start.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from strata_components.local import cluster_addons, objectstore, processes, realnode, registry
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import installed, profile_tools

from harness import rss_tree_mb


def _quiet(_line: str) -> None:
    pass


def main() -> int:
    toolchain = installed(profile_tools("cluster"))
    missing = realnode.missing_requirements(toolchain.bin("kubelet"))
    if missing:
        print("real nodes cannot start here: " + "; ".join(missing))
        return 2
    with tempfile.TemporaryDirectory(prefix="strata-bench-cluster-") as scratch:
        platform = LocalPlatform(PlatformConfig(state_dir=Path(scratch) / "cluster", profile="cluster"), toolchain)
        try:
            started = time.monotonic()
            platform.up(say=_quiet)
            cold = time.monotonic() - started
            platform.down(say=_quiet)
            started = time.monotonic()
            platform.up(say=_quiet)
            warm = time.monotonic() - started
            print("== cluster profile start to all Ready (2 real nodes, kube-proxy, CoreDNS, registry, object store)")
            print(f"  cold (new state)          {cold:6.1f}s")
            print(f"  warm (down, then up)      {warm:6.1f}s")
            print("== RSS (MB) of each process the profile adds, idle")
            names = [f"{kind}-{node.name}" for node in map(realnode.load_node, realnode.node_dirs(platform.state))
                     for kind in ("containerd", "kubelet")]
            for name in (*names, cluster_addons.KUBE_PROXY_PROCESS, registry.PROCESS, objectstore.PROCESS,
                         realnode.GATEWAY_PROCESS):
                print(f"  {name:24} {rss_tree_mb(processes.running_pid(platform.run_dir, name) or 0)[0]:6.0f}")
            coredns = processes_of("coredns")
            print(f"  {'coredns (pods, total)':24} {sum(rss for _, rss in coredns):6.0f}   ({len(coredns)} replicas)")
        finally:
            platform.down(say=_quiet)
    return 0


def processes_of(binary: str) -> list[tuple[int, float]]:
    """(pid, RSS MB) of every process running `binary` (CoreDNS runs in pods, not as a host process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(f"/proc/{entry.name}/exe").resolve().name == binary:
                    found.append((int(entry.name), rss_tree_mb(int(entry.name))[0]))
            except OSError:
                continue
    return found


if __name__ == "__main__":
    sys.exit(main())
