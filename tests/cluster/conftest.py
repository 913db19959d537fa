"""The cluster tier: a local platform of the cluster profile (two real nodes, kube-proxy, CoreDNS, an OCI
registry), the stand-in for a team's own cluster. A session of its own (tests/run.py): one real-node
platform per host. Images reach the nodes as users ship them: pushed to the registry, pulled by the nodes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata_components.local import realnode
from strata_components.local.images import ambient_python_host, build_operator_image
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import Toolchain

from ..realnode.conftest import wait_phase  # noqa: F401 - this tier's tests take it from here


@pytest.fixture(scope="session")
def platform(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    local = LocalPlatform(PlatformConfig(state_dir=tmp_path_factory.mktemp("platform"), profile="cluster"),
                          toolchain=toolchain)
    try:
        local.up(say=print)
        yield local
    finally:
        local.down(say=print)


@pytest.fixture(scope="session")
def nodes(platform: LocalPlatform) -> list[realnode.RealNode]:
    return [realnode.load_node(directory) for directory in realnode.node_dirs(platform.state)]


@pytest.fixture(scope="session")
def python_image(toolchain: Toolchain, platform: LocalPlatform) -> str:
    """An image with python3 (the operator image, cached by content), pushed to the platform's registry."""
    image = build_operator_image(toolchain, python_host=ambient_python_host(), say=print)
    return platform.push_image(image, "strata-operator", image.name.rsplit(":", 1)[1])


def on_node(name: str, **spec) -> dict:
    """A pod spec pinned to one real node."""
    return {"nodeSelector": {**realnode.NODE_LABEL, "kubernetes.io/hostname": name},
            "tolerations": [dict(realnode.TOLERATION)], **spec}
