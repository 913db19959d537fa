"""`strata operator run` started by hand as the README shows: after `eval "$(strata local env)"`, with
the admin kubeconfig, no --pulumi and no --plugin-dir, on a cluster without the Lease's namespace.
It finds the CLI and the YAML host on that PATH, says so, creates the namespace and runs Stacks."""

import sys
import uuid

from kubernetes import client

from strata_components.local import processes

from .conftest import Operator, stash_program
from .test_leader_election import _wait_holder, _wait_log


def test_started_by_hand_it_uses_the_shells_path_and_creates_the_lease_namespace(
        stacks, operator, platform, kube_client, namespace, plugin_cache, tmp_path):
    lease_namespace = f"strata-fresh-{uuid.uuid4().hex[:6]}"
    metrics_port, health_port = processes.free_ports(2)
    by_hand = Operator(
        platform=platform, state_dir=tmp_path / "state",
        health_url=f"http://127.0.0.1:{health_port}/healthz", metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        process=processes.HostProcess("strata-operator-by-hand", [
            sys.executable, "-m", "strata_operator", "--kubeconfig", str(platform.kubeconfig_path),
            "--namespace", namespace, "--leader-election-namespace", lease_namespace,
            "--plugin-cache", str(plugin_cache), "--state-dir", str(tmp_path / "state"),
            "--metrics-port", str(metrics_port), "--health-port", str(health_port)], env=platform.shell_env()))
    operator.stop()  # the session's operator would run this namespace's Stacks too
    try:
        by_hand.start()
        said = _wait_log(by_hand, 0, "updates use the pulumi CLI")
        yaml_host = platform.toolchain.dir("pulumi-yaml") / "bin"
        assert f"{platform.toolchain.dir('pulumi') / 'bin' / 'pulumi'};" in said and f"yaml ({yaml_host})" in said
        _wait_log(by_hand, 0, f"created the namespace {lease_namespace} for the leader Lease")
        _wait_log(by_hand, 0, "leading: created the Lease")

        stacks.program("hello", stash_program(greeting="by hand"))
        stacks.create("hello", stacks.spec(programRef={"name": "hello"}))
        assert stacks.wait_ready("hello", 120)["status"]["outputs"] == {"greeting": "by hand"}
        assert "no language plugin" not in by_hand.log_text()
    finally:
        by_hand.stop()
        client.CoreV1Api(kube_client).delete_namespace(lease_namespace)
        operator.start()
        _wait_holder(kube_client, operator, 60, "the session's operator leads again")
