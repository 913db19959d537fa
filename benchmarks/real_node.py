"""Real-node figures, side by side with kwok in one run: platform start, the operator image, the operator pod.

    .venv/bin/python benchmarks/real_node.py            # as root, with `make setup`'s Debian packages

Measured in one run on scratch state directories (one real-node platform per host, so one at a time):
- platform start to all Ready: kwok only; with one real node cold (new node, empty containerd, pause
  image imported) and warm (stopped and started again: images kept);
- the operator image: build from the cached Debian root filesystem (the first build also runs
  mmdebstrap, about a minute, reported when it happens) and import into the node's containerd;
- the operator Deployment (2 replicas) from apply to both pods Ready;
- RSS of kubelet and containerd, idle and with the operator's pods running.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client

from strata_components.local import images, processes, realnode
from strata_components.local.kube import api_client, server_side_apply
from strata_components.local.operator_host import OPERATOR_NAMESPACE, install_operator_api
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import installed
from strata_components.operator import build_operator_objects, load_packaged_manifests

from harness import rss_tree_mb


def _quiet(_line: str) -> None:
    pass


def timed(action) -> tuple[float, object]:
    started = time.monotonic()
    result = action()
    return time.monotonic() - started, result


def node_rss(platform: LocalPlatform) -> dict[str, float]:
    return {name: rss_tree_mb(processes.running_pid(platform.run_dir, f"{name}-real-0") or 0)[0]
            for name in ("kubelet", "containerd")}


def main() -> int:
    missing = realnode.missing_requirements(installed(["kubernetes"]).bin("kubelet"))
    if missing:
        print("real nodes cannot start here: " + "; ".join(missing))
        return 2
    toolchain = installed()
    with tempfile.TemporaryDirectory(prefix="strata-bench-realnode-") as scratch:
        kwok = LocalPlatform(PlatformConfig(state_dir=Path(scratch) / "kwok"), toolchain)
        kwok_seconds, _ = timed(lambda: kwok.up(say=_quiet))
        kwok.down(say=_quiet)

        real = LocalPlatform(PlatformConfig(state_dir=Path(scratch) / "real", real_nodes=1), toolchain)
        cold_seconds, _ = timed(lambda: real.up(say=_quiet))
        real.down(say=_quiet)
        warm_seconds, _ = timed(lambda: real.up(say=_quiet))
        print("== platform start to all Ready (one run each, scratch state)")
        print(f"  kwok only                 {kwok_seconds:6.1f}s")
        print(f"  + 1 real node, cold       {cold_seconds:6.1f}s   ({cold_seconds / kwok_seconds:.2f}x kwok only)")
        print(f"  + 1 real node, warm       {warm_seconds:6.1f}s   ({warm_seconds / kwok_seconds:.2f}x kwok only)")
        try:
            idle = node_rss(real)
            node = realnode.load_node(realnode.node_dirs(real.state)[0])
            cached = images.images_dir().glob("strata-operator-*.oci.tar")
            for archive in cached:  # the figure is a build, not a cache hit
                archive.unlink()
            build_seconds, image = timed(lambda: images.build_operator_image(
                toolchain, images.user_pulumi_install(), say=_quiet))
            import_seconds, _ = timed(lambda: images.load_image(image, node.containerd_socket))
            print("== operator image")
            print(f"  build (Debian base cached) {build_seconds:6.1f}s   {image.path.stat().st_size / 2**20:.0f} MiB")
            print(f"  import into containerd    {import_seconds:6.1f}s")

            install_operator_api(real.kubeconfig_path)
            objects = build_operator_objects({
                "provider": None, "mode": "in-cluster", "image": image.name, "image_pull_policy": "Never",
                "replicas": 2, "node_selector": realnode.NODE_LABEL, "tolerations": [realnode.TOLERATION],
            }, load_packaged_manifests("rbac"))
            with api_client(real.kubeconfig_path) as api:
                core = client.CoreV1Api(api)

                def both_ready() -> bool:
                    pods = core.list_namespaced_pod(OPERATOR_NAMESPACE).items
                    return len(pods) == 2 and all(any(c.type == "Ready" and c.status == "True"
                                                      for c in p.status.conditions or []) for p in pods)

                ready_seconds, _ = timed(lambda: (server_side_apply(real.kubeconfig_path, objects),
                                                  processes.wait_until(both_ready, 180, "operator pods Ready")))
            print(f"== operator Deployment, 2 replicas: apply to both pods Ready {ready_seconds:6.1f}s")
            busy = node_rss(real)
            print("== RSS (MB)                 idle    with 2 operator pods")
            for name in idle:
                print(f"  {name:24} {idle[name]:6.0f}    {busy[name]:6.0f}")
        finally:
            real.down(say=_quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
