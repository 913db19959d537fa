"""What the realnode tier needs beyond the other tiers: root, containerd and friends, kubelet, image tools."""

from __future__ import annotations

import shutil

from strata_components.local import realnode
from strata_components.local.toolchain import ToolchainError, installed


def missing_realnode_requirements() -> list[str]:
    try:
        kubelet = installed(["kubernetes"]).bin("kubelet")
    except ToolchainError:
        kubelet = None
    missing = realnode.missing_requirements(kubelet)
    tools = [tool for tool in ("mmdebstrap", "gcc") if shutil.which(tool) is None]
    if tools:
        missing.append(f"image tools {', '.join(tools)}: apt-get install -y {' '.join(tools)}")
    return missing
