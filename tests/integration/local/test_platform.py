"""The local platform for real: readiness, workloads on kwok nodes, idempotence, least-privilege tokens, clean stop."""

import os
import socket
import time

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.kube import api_client, https_ok, write_private
from strata_components.local.platform import LocalPlatform, PlatformConfig, PlatformError


def test_readyz_answers_with_the_admin_kubeconfig(local_platform):
    assert https_ok(f"{local_platform.server}/readyz", local_platform.state_dir / "pki")
    with api_client(local_platform.kubeconfig_path) as api:
        version = client.VersionApi(api).get_code()
    assert version.git_version == "v1.34.4"  # the stamped build, which pulumi-kubernetes accepts


def test_a_deployment_becomes_available_on_kwok_nodes(kube_client, namespace):
    apps = client.AppsV1Api(kube_client)
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}},
    })

    def available():
        status = apps.read_namespaced_deployment_status("web", namespace).status
        return status.available_replicas == 2

    processes.wait_until(available, 60, "deployment web")
    pods = client.CoreV1Api(kube_client).list_namespaced_pod(namespace).items
    assert len(pods) == 2
    assert all(pod.spec.node_name.startswith("strata-node-") for pod in pods)


def test_up_twice_is_one_platform(platform):
    before = {name: processes.running_pid(platform.run_dir, name) for name in platform.status()}
    platform.up(say=lambda _: None)
    after = {name: processes.running_pid(platform.run_dir, name) for name in platform.status()}
    assert before == after
    assert all(after.values())


def test_service_account_token_kubeconfig_has_only_that_identity(platform, kube_client, namespace, tmp_path):
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "robot"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "hidden"}, "stringData": {"k": "v"}})
    kubeconfig = write_private(tmp_path / "robot.kubeconfig", platform.token_kubeconfig(namespace, "robot", 600))
    with api_client(kubeconfig) as robot:
        review = client.AuthenticationV1Api(robot).create_self_subject_review({}).status.user_info
        assert review.username == f"system:serviceaccount:{namespace}:robot"
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(robot).read_namespaced_secret("hidden", namespace)
        assert denied.value.status == 403


def test_busy_port_is_one_clear_error_and_down_leaves_no_process(toolchain, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        blocked = LocalPlatform(PlatformConfig(state_dir=tmp_path / "blocked", host_controllers=(),
                                               apiserver_port=port), toolchain=toolchain)
        with pytest.raises(PlatformError) as error:
            blocked.up(say=lambda _: None)
    message = str(error.value)
    assert f"port {port} (kube-apiserver) is already in use" in message and "fix:" in message
    assert "\n" not in message
    assert not any(blocked.status().values())


def test_a_second_platform_starts_stops_and_restarts_cleanly(toolchain, tmp_path):
    """Acceptance: up, up again harmless, down leaves no process, and state survives a restart."""
    second = LocalPlatform(PlatformConfig(state_dir=tmp_path / "second", host_controllers=()), toolchain=toolchain)
    started = time.monotonic()
    info = second.up(say=lambda _: None)
    first_start = time.monotonic() - started
    with api_client(info.kubeconfig_path) as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "survivor"}})
    pids = {name: processes.running_pid(second.run_dir, name) for name in second.status()}
    assert all(pids.values())
    stopped = second.down(say=lambda _: None)
    assert set(stopped) == set(pids)
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or not processes._group_alive(pid)
    assert not any(second.status().values())
    second.up(say=lambda _: None)
    try:
        with api_client(info.kubeconfig_path) as api:
            assert client.CoreV1Api(api).read_namespace("survivor").metadata.name == "survivor"
    finally:
        second.down(say=lambda _: None)
    print(f"second platform first start: {first_start:.1f}s")
