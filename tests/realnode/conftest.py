"""The realnode tier: a local platform with one real node (kubelet on containerd), where pods really run.

Every test here runs on that node: the operator image built without a registry and loaded into the
node's containerd, the operator's Deployment as the Operator component renders it, pods reaching the
apiserver through the `kubernetes` Service. tests/run.py reports the tier NOT RUN (never passed)
where a real node cannot start (requirements.py says why).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata_components.local import realnode
from strata_components.local.images import ImageArchive, ambient_python_host, build_operator_image, load_image
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import Toolchain

pytestmark = pytest.mark.realnode


@pytest.fixture(scope="session")
def platform(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    """This tier's platform: the shared one's settings plus one real node (one real-node platform per host)."""
    local = LocalPlatform(PlatformConfig(state_dir=tmp_path_factory.mktemp("platform"), real_nodes=1),
                          toolchain=toolchain)
    try:
        local.up(say=print)
        yield local
    finally:
        local.down(say=print)


@pytest.fixture(scope="session")
def node(platform: LocalPlatform) -> realnode.RealNode:
    return realnode.load_node(realnode.node_dirs(platform.state)[0])


@pytest.fixture(scope="session")
def operator_image(toolchain: Toolchain, node: realnode.RealNode) -> ImageArchive:
    """The operator image (cached by content; about 45 s when the sources changed), loaded into the node."""
    image = build_operator_image(toolchain, python_host=ambient_python_host(), say=print)
    load_image(image, node.containerd_socket)
    return image


def real_node_pod_spec(**spec) -> dict:
    """A pod spec that lands on the real node (its label and its taint's toleration)."""
    return {"nodeSelector": dict(realnode.NODE_LABEL), "tolerations": [dict(realnode.TOLERATION)], **spec}


def wait_phase(core, namespace: str, name: str, phases: set[str], timeout: float = 120):
    """The pod once it reached one of `phases`, else an assertion naming where it stands."""
    from strata_components.local import processes

    def phase():
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in phases else None

    try:
        return processes.wait_until(phase, timeout, f"pod {name} in {sorted(phases)}")
    except processes.ProcessError:
        pod = core.read_namespaced_pod(name, namespace)
        raise AssertionError(f"pod {name}: phase {pod.status.phase}, {pod.status.container_statuses}") from None
