"""Fixtures shared by the tiers: the toolchain, one local platform per session, a namespace per test,
an environment for the real pulumi CLI (file:// backend, passphrase secrets), and MinIO on loopback."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata_components.local.platform import LocalPlatform, PlatformConfig, PlatformInfo
from strata_components.local.toolchain import Toolchain, installed

TEST_PASSPHRASE = "strata-test-passphrase"
# The platform's bucket in the `object_store` fixture's MinIO.
OBJECT_STORE_BUCKET = "pulumi-state"


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    """The built toolchain; `make test` builds it first, so a missing entry is a failure, not a skip."""
    return installed()


@pytest.fixture(scope="session")
def platform(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    """A started local platform with Flux's source- and kustomize-controller as host processes."""
    state_dir = tmp_path_factory.mktemp("platform")
    local = LocalPlatform(PlatformConfig(state_dir=state_dir, host_controllers=("source-controller",
                                                                                   "kustomize-controller")),
                          toolchain=toolchain)
    try:
        local.up(say=print)
        yield local
    finally:
        local.down(say=print)


@pytest.fixture(scope="session")
def local_platform(platform: LocalPlatform) -> PlatformInfo:
    return platform.info()


@pytest.fixture(scope="session")
def kube_client(local_platform: PlatformInfo):
    """An admin kubernetes ApiClient for the session's platform."""
    from strata_components.local.kube import api_client

    with api_client(local_platform.kubeconfig_path) as client:
        yield client


def served_namespace(local_platform: PlatformInfo, kube_client, name: str, file_root: Path) -> Iterator[str]:
    """Namespace `name`, created and served by the operator as a team's is: the operator's Roles bound there
    (either executor's), and file:// state allowed under `file_root` (the platform's annotation, which the
    process executor's sandbox binds); deleted afterwards (without waiting for it to go)."""
    from kubernetes import client

    from strata_components.local.operator_host import serve_namespace
    from strata_operator.api import FILE_BACKEND_ANNOTATION

    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": name, "annotations": {FILE_BACKEND_ANNOTATION: str(file_root)}}})
    serve_namespace(local_platform.kubeconfig_path, name)
    yield name
    try:
        core.delete_namespace(name)
    except client.ApiException as error:
        if error.status not in (404, 409):  # the test deleted it itself: gone, or still terminating
            raise


@pytest.fixture
def namespace(local_platform: PlatformInfo, kube_client, request: pytest.FixtureRequest,
              tmp_path: Path) -> Iterator[str]:
    """A fresh namespace for one test (`served_namespace`), its file:// state in the test's own directory."""
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    yield from served_namespace(local_platform, kube_client, "".join(c for c in name if c.isalnum() or c == "-"),
                                tmp_path)


@pytest.fixture(scope="session")
def pulumi_env(toolchain: Toolchain) -> Iterator[dict[str, str]]:
    """Environment for the toolchain's pulumi CLI: its own PULUMI_HOME, a passphrase, no update checks."""
    home = Path(tempfile.mkdtemp(prefix="strata-pulumi-home-"))
    bins = [str(toolchain.dir("pulumi") / "bin"), str(toolchain.dir("pulumi-yaml") / "bin")]
    env = {
        "PATH": os.pathsep.join([*bins, os.environ.get("PATH", "")]),
        "PULUMI_HOME": str(home),
        "PULUMI_CONFIG_PASSPHRASE": TEST_PASSPHRASE,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    }
    yield env
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def file_backend(tmp_path: Path) -> str:
    """A fresh file:// state backend."""
    state = tmp_path / "state"
    state.mkdir()
    return f"file://{state}"


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """MinIO from the toolchain as the cluster profile runs it (root credentials in its environment), on
    127.0.0.1 with the bucket OBJECT_STORE_BUCKET: its endpoint URL and root credentials. MinIO belongs to
    the cluster profile's toolchain, which `make setup` does not build: built here on first use, never skipped."""
    from strata_components import s3
    from strata_components.local import objectstore, processes
    from strata_components.local import toolchain as toolchains
    from strata_components.local.kube import http_ok

    minio = toolchains.ensure(["minio"], say=print).bin("minio")
    directory = tmp_path_factory.mktemp("objectstore")
    port = processes.free_ports(1)[0]
    root = s3.Credentials(f"strata-{secrets.token_hex(6)}", secrets.token_urlsafe(30))
    store = objectstore.object_store_process(minio, directory, port, (root.access_key_id, root.secret_access_key),
                                             address="127.0.0.1")
    endpoint = f"http://127.0.0.1:{port}"
    processes.start(store, directory / "run", directory / "logs")
    try:
        processes.wait_until(lambda: http_ok(f"{endpoint}/minio/health/ready"), 60, "MinIO on loopback",
                             log=directory / "logs" / f"{store.name}.log")
        s3.ensure_bucket(endpoint, OBJECT_STORE_BUCKET, root)
        yield endpoint, root
    finally:
        processes.stop(directory / "run", store.name)
