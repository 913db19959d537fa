"""A sick API server: for a minute every request the operator makes answers 500 (its watches cut). The
operator stays up, says so once in its log and in `api_server_failing`, and afterwards runs each Stack
whose spec changed meanwhile exactly once, without a burst of requests (issue #29 item 4).

Run with --no-leader-election: a leader that cannot renew its Lease for 10 s exits by design (README,
leader election), so a leading replica is not expected to ride out a minute of 500s in-process."""

from __future__ import annotations

import sys
import time
import urllib.request

import pytest

from strata_components.local import processes
from strata_components.local.kube import write_private
from strata_components.local.operator_host import OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT

from .conftest import PASSPHRASE, Operator, Stacks, eventually_constant, stash_program
from .sick_api_server import SickApiServer
from .test_leader_election import _wait_holder, _wait_log

OUTAGE = 60.0
STACKS = 4


def _metric(operator: Operator, name: str) -> float:
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def sick(platform):
    server = SickApiServer(platform.info().server, platform.pki)
    server.start()
    yield server
    server.stop()


def test_a_minute_of_500s_the_operator_stays_up_says_so_and_catches_up_once(
        operator, platform, kube_client, namespace, plugin_cache, sick, tmp_path):
    kubeconfig = platform.token_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, 3600).replace(
        platform.info().server, f"https://127.0.0.1:{sick.port}")
    path = write_private(tmp_path / "kubeconfig", kubeconfig)
    metrics_port, health_port = processes.free_ports(2)
    behind = Operator(
        platform=platform, state_dir=tmp_path / "state",
        health_url=f"http://127.0.0.1:{health_port}/healthz", metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        process=processes.HostProcess("strata-operator-sick-api", [
            sys.executable, "-m", "strata_operator", "--kubeconfig", str(path), "--namespace", namespace,
            "--no-leader-election", "--plugin-cache", str(plugin_cache), "--state-dir", str(tmp_path / "state"),
            "--pulumi", str(platform.toolchain.dir("pulumi") / "bin" / "pulumi"),
            "--plugin-dir", str(platform.toolchain.dir("pulumi-yaml") / "bin"),
            "--metrics-port", str(metrics_port), "--health-port", str(health_port)], env={"KUBECONFIG": str(path)}))
    operator.stop()  # the session's operator would run this namespace's Stacks too
    backend = tmp_path / "backend"
    backend.mkdir()
    stacks = Stacks(kube_client, namespace, backend.as_uri(), behind)
    stacks.secret("pulumi", {"passphrase": PASSPHRASE})
    names = [f"s{i}" for i in range(STACKS)]
    try:
        behind.start()
        pid = behind.pid()
        stacks.program("p", stash_program(a="1"))
        for name in names:
            stacks.create(name, stacks.spec(programRef={"name": "p"}, stack=name, config={"round": "1"}))
        for name in names:
            stacks.wait_ready(name, 180)
        log_start = len(behind.log_text())
        steady = time.monotonic()
        time.sleep(10)
        sick.make_sick()
        began = time.monotonic()
        _wait_log(behind, log_start, "the API server is failing (HTTP 500)", timeout=OUTAGE)
        assert _metric(behind, "api_server_failing") == 1
        for name in names:  # written meanwhile straight to the real apiserver: the operator cannot see it yet
            stacks.patch(name, {"spec": {"config": {"round": "2"}}})
        while time.monotonic() - began < OUTAGE:
            assert behind.pid() == pid, "the operator did not stay up"
            time.sleep(2)
        sick.heal()
        healed = time.monotonic()
        _wait_log(behind, log_start, "the API server answers again after", timeout=120)
        for name in names:
            stacks.wait(name, lambda o: o["status"].get("observedGeneration") == o["metadata"]["generation"]
                        and any(c["type"] == "Ready" and c["status"] == "True" for c in o["status"]["conditions"]),
                        180, "round 2 run")
        caught_up = time.monotonic()
        assert behind.pid() == pid
        assert _metric(behind, "api_server_failing") == 0
        assert _metric(behind, "api_server_errors_total") > 0
        # Exactly one more run each: nothing lost, nothing run twice.
        assert eventually_constant(lambda: [stacks.runs(name) for name in names], 5) == [2] * STACKS
        said = behind.log_text()[log_start:]
        assert said.count("the API server is failing") == 1 and said.count("answers again") == 1
        rates = {"steady": sick.rate(steady, began), "outage": sick.rate(began, healed),
                 "catch-up": sick.rate(healed, caught_up)}
        print(f"requests/s through the sick server: {rates}; caught up in {caught_up - healed:.1f} s")
        # No hot loop against a failing server, and no burst after it: each within a few times the steady rate.
        assert rates["outage"] <= 5 * max(rates["steady"], 1) and rates["catch-up"] <= 10 * max(rates["steady"], 1)
    finally:
        behind.stop()
        operator.start()
        _wait_holder(kube_client, operator, 60, "the session's operator leads again")
