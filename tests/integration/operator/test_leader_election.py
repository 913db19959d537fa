"""Leader election between two real operator processes on one cluster, under the operator's own
ServiceAccount token: one holds the Lease and handles Stacks, the other stands by; a clean stop hands
the Lease over at once, a kill -9 once it lapses."""

from __future__ import annotations

import dataclasses
import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import OPERATOR_NAMESPACE, operator_host

from .conftest import MIN_RESYNC_SECONDS, STALL_AFTER_FAILURES, Operator, stash_program

LEASE = "strata-operator-leader"


def _holder(kube_client) -> str:
    try:
        lease = client.CoordinationV1Api(kube_client).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    except client.ApiException as error:
        if error.status == 404:
            return ""
        raise
    return lease.spec.holder_identity or ""


def _identity(operator: Operator) -> str:
    pid = operator.pid()
    assert pid is not None, f"{operator.process.name} is not running"
    return f"{socket.gethostname()}_{pid}"


def _wait_holder(kube_client, operator: Operator, timeout: float, what: str) -> str:
    identity = _identity(operator)
    processes.wait_until(lambda: _holder(kube_client) == identity, timeout, what, log=operator.log)
    return identity


def _wait_log(operator: Operator, since: int, text: str, timeout: float = 30) -> str:
    def found() -> str | None:
        tail = operator.log_text()[since:]
        return next((line for line in tail.splitlines() if text in line), None)

    return processes.wait_until(found, timeout, f"{operator.process.name} logs {text!r}", log=operator.log)


def _health(operator: Operator) -> dict:
    with urllib.request.urlopen(operator.health_url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def second(operator: Operator, platform, toolchain, kube_client, plugin_cache, tmp_path) -> Iterator[Operator]:
    """Another operator process like the session's (same flags and ServiceAccount), with its own state."""
    host = operator_host(platform, toolchain, tmp_path / "second", extra_args=(
        "--stall-after-failures", str(STALL_AFTER_FAILURES), "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
        "--plugin-cache", str(plugin_cache), "--verbose"))
    fields = {field.name: getattr(host, field.name) for field in dataclasses.fields(host)}
    fields["process"] = dataclasses.replace(host.process, name="strata-operator-second")
    other = Operator(**fields)
    yield other
    other.stop()
    # Leave the session's operator running and leading for the tests after this one.
    if operator.pid() is None:
        operator.start()
    _wait_holder(kube_client, operator, 60, "the session's operator leads again")


def test_one_leader_runs_stacks_the_standby_takes_over_on_stop_and_on_kill_9(stacks, operator, second,
                                                                             kube_client):
    first_id = _wait_holder(kube_client, operator, 30, "the session's operator holds the Lease")

    # A second operator starts (its health endpoint answers) but stands by, naming the holder.
    second.start()
    standing = _wait_log(second, 0, "standing by")
    assert first_id in standing
    assert _health(second)["leader"] == {"leading": False, "identity": _identity(second),
                                         "lease": f"{OPERATOR_NAMESPACE}/{LEASE}", "holder": first_id}
    assert _holder(kube_client) == first_id

    # A Stack applied now is reconciled by the leader only.
    first_log = len(operator.log_text())
    stacks.program("greeting", stash_program(greeting="hi"))
    stacks.create("one", stacks.spec(programRef={"name": "greeting"}))
    assert stacks.wait_ready("one", 120)["status"]["outputs"] == {"greeting": "hi"}
    assert f"[{stacks.namespace}/one]" in operator.log_text()[first_log:]
    assert stacks.namespace not in second.log_text()
    assert (operator.state_dir / "stacks" / stacks.namespace / "one").is_dir()
    assert not (second.state_dir / "stacks").exists()
    assert _holder(kube_client) == first_id

    # Clean stop: the leader hands the Lease back and the standby takes over without waiting it out.
    first_log = len(operator.log_text())
    second_log = len(second.log_text())
    operator.stop()
    assert "released the Lease" in operator.log_text()[first_log:]
    second_id = _wait_holder(kube_client, second, 30, "the standby took over after a clean stop")
    _wait_log(second, second_log, "leading: took the Lease")

    # The first comes back as a standby; kill -9 of the leader: it takes over once the Lease lapses.
    first_log = len(operator.log_text())
    operator.start()
    assert second_id in _wait_log(operator, first_log, "standing by")
    assert _holder(kube_client) == second_id
    second.kill()
    _wait_holder(kube_client, operator, 60, "the standby took over after the leader's kill -9")
    _wait_log(operator, first_log, "leading: took the Lease")

    # A Stack created afterwards is handled by the new leader.
    stacks.create("two", stacks.spec(programRef={"name": "greeting"}))
    stacks.wait_ready("two", 120)
    assert f"[{stacks.namespace}/two]" in operator.log_text()[first_log:]
