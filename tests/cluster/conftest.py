"""The cluster tier: a local platform of the cluster profile (two real nodes, kube-proxy, CoreDNS, an OCI
registry), the stand-in for a team's own cluster. A session of its own (tests/run.py): one real-node
platform per host. Images reach the nodes as users ship them: pushed to the registry, pulled by the nodes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from strata_components.local import objectstore, processes, realnode
from strata_components.local.images import build_operator_image, user_pulumi_install
from strata_components.local.operator_host import operator_host, serve_namespace
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import Toolchain
from strata_components.team import POD_SECURITY_LABELS

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
    """The operator image (cached by content; python3, the Python language host and the layers' provider
    plugins), pushed to the platform's registry as `strata image build --push` pushes it."""
    image = build_operator_image(toolchain, user_pulumi_install(), say=print)
    return platform.push_image(image, "strata-operator", image.name.rsplit(":", 1)[1])


def on_node(name: str, **spec) -> dict:
    """A pod spec pinned to one real node."""
    return {"nodeSelector": {**realnode.NODE_LABEL, "kubernetes.io/hostname": name},
            "tolerations": [dict(realnode.TOLERATION)], **spec}


@pytest.fixture
def pod_operator(platform, toolchain, kube_client, python_image, tmp_path_factory) -> Iterator[str]:
    """The operator on the host with `--executor pod`, its workspace image pulled from the registry."""
    namespace = f"s3-pod-{uuid.uuid4().hex[:5]}"
    # As the platform makes a team's: Pod Security restricted, served by the operator.
    client.CoreV1Api(kube_client).create_namespace({"metadata": {"name": namespace, "labels": POD_SECURITY_LABELS}})
    serve_namespace(platform.kubeconfig_path, namespace, ("pod",))
    toleration = realnode.TOLERATION
    host = operator_host(platform, toolchain, tmp_path_factory.mktemp("s3-operator"), executor="pod", extra_args=(
        "--executor", "pod", "--workspace-image", python_image, "--workspace-image-pull-policy", "IfNotPresent",
        *(arg for key, value in realnode.NODE_LABEL.items() for arg in ("--workspace-node-selector", f"{key}={value}")),
        "--workspace-toleration", f"{toleration['key']}={toleration['value']}:{toleration['effect']}",
        "--no-leader-election", "--min-resync-seconds", "3", "--namespace", namespace))
    try:
        host.start()
        yield namespace
    finally:
        host.stop()
        client.CoreV1Api(kube_client).delete_namespace(namespace)


def object_store_env_refs(core: client.CoreV1Api, platform: LocalPlatform, namespace: str) -> dict:
    """A Secret `object-store` in `namespace` with the platform's object-store credentials and a new
    passphrase; the Stack `envRefs` that pass them to its updates."""
    access_key, secret_key = objectstore.read_credentials(platform.object_store_credentials)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "object-store"}, "stringData": {
        "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key,
        "PULUMI_CONFIG_PASSPHRASE": uuid.uuid4().hex}})
    return {key: {"type": "Secret", "secret": {"name": "object-store", "key": key}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PULUMI_CONFIG_PASSPHRASE")}


def wait_stack_ready(custom: client.CustomObjectsApi, namespace: str, name: str, timeout: float, what: str) -> dict:
    """The Stack once Ready; else fails with its status."""
    def ready():
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", name)
        conditions = (stack.get("status") or {}).get("conditions") or []
        return stack if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    try:
        return processes.wait_until(ready, timeout, what, interval=1)
    except processes.ProcessError:
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", name)
        raise AssertionError(json.dumps(stack.get("status"), indent=1)) from None
