"""The address a running update's state backend is probed at, and the probe itself: in full for the
platform's Stacks (the operator's own namespace), limited for a team's, whose backend address is its own to
choose while the probe connects from the operator's network."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from strata_operator.api.status import RECONCILING_BACKEND_UNREACHABLE
from strata_operator.controllers import stack_update
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.engine.pod.executor import PodEngine, WorkspaceSettings
from strata_operator.engine.port import SerializedEngine
from strata_operator.engine.process.executor import EngineSettings
from strata_operator.main import build_parser
from strata_operator.services.backend_probe import (UNSAID, ProbeScope, backend_address, forbidden_address,
                                                    unreachable)

PLATFORM = ProbeScope(platform=True, shares_loopback=True)
TEAM_PROCESS = ProbeScope(platform=False, shares_loopback=True)  # its updates run in the operator's network
TEAM_POD = ProbeScope(platform=False, shares_loopback=False)  # its updates run in workspace pods


@pytest.mark.parametrize("backend, address", [
    ("s3://state?endpoint=http://10.88.0.1:9000&use_path_style=true&region=us-east-1", ("10.88.0.1", 9000)),
    ("s3://state?endpoint=minio.storage:9000", ("minio.storage", 9000)),
    ("s3://state?endpoint=https://store.example.com", ("store.example.com", 443)),
    ("s3://state?region=eu-west-1", ("s3.eu-west-1.amazonaws.com", 443)),
    ("s3://state", ("s3.amazonaws.com", 443)),
    ("gs://state", ("storage.googleapis.com", 443)),
    ("https://api.pulumi.com", ("api.pulumi.com", 443)),
    ("http://pulumi.internal:8080", ("pulumi.internal", 8080)),
    ("file:///var/state", None),
    ("azblob://state", None),
    ("", None),
])
def test_the_address_of_a_backend_url(backend, address):
    assert backend_address(backend) == address


def test_the_probe_says_why_an_address_takes_no_connection_and_nothing_when_it_does():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert asyncio.run(unreachable(("127.0.0.1", port), PLATFORM)) == ""
    assert asyncio.run(unreachable(("127.0.0.1", port), PLATFORM)) == "Connection refused"


@pytest.mark.parametrize("ip", ["169.254.169.254", "169.254.0.1", "fe80::1", "fe80::1%eth0", "::ffff:169.254.169.254",
                                "fd00:ec2::254", "100.100.100.200", "168.63.129.16", "0.0.0.0", "::", "224.0.0.1",
                                "ff02::1", "240.0.0.1"])
def test_a_teams_stack_never_has_metadata_link_local_or_unroutable_addresses_probed(ip):
    assert forbidden_address(ip, TEAM_PROCESS) and forbidden_address(ip, TEAM_POD)
    assert not forbidden_address(ip, PLATFORM)


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.8.0.1", "::1", "::ffff:127.0.0.1"])
def test_loopback_is_probed_for_a_teams_stack_only_where_its_updates_reach_that_loopback_themselves(ip):
    assert forbidden_address(ip, TEAM_POD)  # the operator's own loopback: its ports, the host's services
    assert not forbidden_address(ip, TEAM_PROCESS) and not forbidden_address(ip, PLATFORM)


@pytest.mark.parametrize("ip", ["10.88.0.1", "192.168.1.20", "172.16.5.5", "fd12:3456::1", "52.216.8.1",
                                "2600:1f18::1"])
def test_object_stores_addresses_are_probed_for_everyone(ip):
    assert not any(forbidden_address(ip, scope) for scope in (PLATFORM, TEAM_PROCESS, TEAM_POD))


@contextlib.contextmanager
def listening_port():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(0.2)
        yield listening, listening.getsockname()[1]


def _connected(listening: socket.socket) -> bool:
    try:
        listening.accept()[0].close()
    except TimeoutError:
        return False
    return True


def test_a_forbidden_address_is_never_connected_to_even_by_a_name_that_resolves_to_it():
    with listening_port() as (listening, port):
        for host in ("127.0.0.1", "localhost"):  # checked as resolved, not as written
            assert asyncio.run(unreachable((host, port), TEAM_POD)) == ""  # nothing said
            assert not _connected(listening)
        assert asyncio.run(unreachable(("localhost", port), TEAM_PROCESS)) == ""
        assert _connected(listening)


def test_a_teams_stack_is_told_no_cause_and_no_sooner_for_a_refusal_than_for_a_timeout():
    with listening_port() as (_, port):
        pass  # closed: refused at once
    for host in ("127.0.0.1", "no-such-store.invalid"):
        started = time.monotonic()
        assert asyncio.run(unreachable((host, port), TEAM_PROCESS, timeout=0.5)) == UNSAID
        assert time.monotonic() - started >= 0.5
    assert asyncio.run(unreachable(("127.0.0.1", port), PLATFORM, timeout=0.5)) == "Connection refused"


class RecordingKube:
    async def patch_stack_status(self, namespace, name, status):
        pass


def _session(namespace: str, engine) -> StackSession:
    ctx = Context(kube=RecordingKube(), engine=engine, settings=OperatorSettings(own_namespace="strata-system"))
    return StackSession(ctx, {"metadata": {"namespace": namespace, "name": "s", "generation": 1}, "status": {}},
                        logger=None)


def test_the_scope_of_a_stack_is_its_namespaces_and_its_executors(tmp_path):
    process, pod = SerializedEngine(concurrency=1), PodEngine(EngineSettings(state_dir=tmp_path),
                                                              WorkspaceSettings(image="strata:1"), kube=None)
    assert stack_update.probe_scope(_session("strata-system", pod)) == ProbeScope(platform=True, shares_loopback=False)
    assert stack_update.probe_scope(_session("team-alpha", process)) == TEAM_PROCESS
    assert stack_update.probe_scope(_session("team-alpha", pod)) == TEAM_POD


def test_a_teams_stack_waiting_on_its_backend_is_told_only_that_it_does_not_answer(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: events.append(message))
    with listening_port() as (_, port):
        pass
    backend = f"s3://state?endpoint=http://127.0.0.1:{port}"
    team = _session("team-alpha", SerializedEngine(concurrency=1))
    assert asyncio.run(stack_update.backend_still_away(team, backend, probe=True)) == 10.0
    said = f"the state backend at 127.0.0.1:{port} does not answer ({UNSAID}): the Stack runs again once it answers"
    reconciling = {c["type"]: c for c in team.status["conditions"]}["Reconciling"]
    assert (reconciling["reason"], reconciling["message"]) == (RECONCILING_BACKEND_UNREACHABLE, said)
    assert events == [said]
    # Its updates in workspace pods: the operator's loopback is not theirs to have probed; nothing is said.
    pod = _session("team-alpha", PodEngine(EngineSettings(state_dir=tmp_path), WorkspaceSettings(image="strata:1"),
                                           kube=None))
    assert asyncio.run(stack_update.backend_still_away(pod, backend, probe=True)) is None
    assert "conditions" not in pod.status and events == [said]


def test_the_probe_period_is_a_flag_and_zero_turns_it_off():
    assert build_parser().parse_args([]).backend_probe_seconds == 10.0
    assert build_parser().parse_args(["--backend-probe-seconds", "0"]).backend_probe_seconds == 0.0
