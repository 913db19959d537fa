"""Leader election's thin layer over the Lease API, against an in-memory apiserver with resourceVersions."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from kubernetes.client.rest import ApiException

from strata_operator.controllers import leadership
from strata_operator.controllers.leadership import (ElectionSettings, Elector, StandbyHealth, acquire, check_settings,
                                                    describe_api_error, discover_namespace, keep, missing_namespace)
from strata_operator.main import build_parser


def run(coro):
    """Like asyncio.run, but leaves the thread's event loop setting alone (Pulumi's mocks need it)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class FakeLeases:
    """One namespace's Leases with the apiserver's optimistic concurrency; `fail` makes calls raise."""

    def __init__(self, namespace_exists: bool = True, may_create_namespaces: bool = True) -> None:
        self.leases: dict[str, dict] = {}
        self.version = 0
        self.fail: Exception | None = None
        self.namespace_exists, self.may_create_namespaces = namespace_exists, may_create_namespaces
        self.namespace_labels: dict[str, str] = {}

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def get_lease(self, namespace: str, name: str) -> dict | None:
        self._check()
        found = self.leases.get(name)
        return copy.deepcopy(found) if found else None

    def _store(self, name: str, body: dict) -> dict:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = body
        return copy.deepcopy(body)

    async def create_lease(self, namespace: str, body: dict) -> dict:
        self._check()
        if not self.namespace_exists:
            raise _not_found_namespace(namespace)
        if body["metadata"]["name"] in self.leases:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body["metadata"]["name"], body)

    async def replace_lease(self, namespace: str, name: str, body: dict) -> dict:
        self._check()
        if self.leases[name]["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise ApiException(status=409, reason="Conflict")
        return self._store(name, body)

    async def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        if not self.may_create_namespaces:
            raise ApiException(status=403, reason="Forbidden")
        if self.namespace_exists:
            raise ApiException(status=409, reason="AlreadyExists")
        self.namespace_exists, self.namespace_labels = True, labels

    def holder(self, name: str = "leader") -> str:
        return self.leases[name]["spec"].get("holderIdentity", "")


def _not_found_namespace(namespace: str) -> ApiException:
    """What the apiserver answers to creating an object in a namespace that does not exist."""
    err = ApiException(status=404, reason="NotFound")
    err.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                           "message": f'namespaces "{namespace}" not found',
                           "details": {"name": namespace, "kind": "namespaces"}})
    return err


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(leadership, "RETRY_PERIOD_SECONDS", 0.01)
    monkeypatch.setattr(leadership, "RENEW_PERIOD_SECONDS", 0.02)
    monkeypatch.setattr(leadership, "RENEW_DEADLINE_SECONDS", 0.3)


@pytest.fixture
def stops(monkeypatch):
    """stop_handling records its reason instead of exiting the test process."""
    reasons: list[str] = []

    class Stopped(BaseException):
        pass

    def fake(elector, reason):
        reasons.append(reason)
        elector.leading = False
        raise Stopped(reason)

    monkeypatch.setattr(leadership, "stop_handling", fake)
    return reasons, Stopped


def test_first_candidate_creates_the_lease_the_second_waits_and_takes_it_once_released():
    async def scenario():
        api = FakeLeases()
        first, second = Elector(api, "ns", "leader", "a_1"), Elector(api, "ns", "leader", "b_2")
        assert (await first.step()).action == "create"
        waited = await second.step()
        assert waited.action == "wait" and waited.holder == "a_1"
        assert (await first.step()).action == "renew"
        assert await second.release() is False  # not the holder: nothing to hand back
        assert api.holder() == "a_1"
        assert await first.release() is True
        assert api.leases["leader"]["spec"]["leaseDurationSeconds"] == 1
        assert (await second.step()).action == "acquire"
        assert api.holder() == "b_2" and api.leases["leader"]["spec"]["leaseTransitions"] == 1

    run(scenario())


def test_a_concurrent_writer_makes_the_slower_candidate_fail_not_overwrite():
    async def scenario():
        api = FakeLeases()
        first, second = Elector(api, "ns", "leader", "a_1"), Elector(api, "ns", "leader", "b_2")
        await first.step()
        await first.release()
        read = await api.get_lease("ns", "leader")
        await second.step()  # takes it
        body = leadership.lease_object("ns", "leader", {"holderIdentity": "a_1"}, read)
        with pytest.raises(ApiException) as raised:
            await api.replace_lease("ns", "leader", body)
        assert raised.value.status == 409 and api.holder() == "b_2"

    run(scenario())


def test_a_standby_says_who_holds_the_lease_then_takes_over_when_it_is_released(fast, caplog):
    async def scenario():
        api = FakeLeases()
        leader, standby = Elector(api, "ns", "leader", "a_1"), Elector(api, "ns", "leader", "b_2")
        await leader.step()
        waiting = asyncio.create_task(acquire(standby))
        await asyncio.sleep(0.1)
        assert not waiting.done() and not standby.leading
        await leader.release()
        await asyncio.wait_for(waiting, 2)
        assert standby.leading and api.holder() == "b_2"

    with caplog.at_level(logging.INFO, logger="strata_operator.controllers.leadership"):
        run(scenario())
    standing = [r.getMessage() for r in caplog.records if "standing by" in r.getMessage()]
    assert len(standing) == 1 and "held by a_1" in standing[0] and "(b_2)" in standing[0]
    assert any("leading: took the Lease ns/leader as b_2" in r.getMessage() for r in caplog.records)


def test_a_standby_keeps_retrying_through_api_errors_and_names_the_fix_once(fast, caplog):
    async def scenario():
        api = FakeLeases()
        api.fail = ApiException(status=403, reason="Forbidden")
        elector = Elector(api, "ns", "leader", "b_2")
        waiting = asyncio.create_task(acquire(elector))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        api.fail = None
        await asyncio.wait_for(waiting, 2)
        assert elector.leading

    with caplog.at_level(logging.INFO, logger="strata_operator.controllers.leadership"):
        run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "--leader-election-namespace" in errors[0] and "leader-election.yaml" in errors[0]


def test_a_missing_lease_namespace_is_created_and_the_lease_taken(fast, caplog):
    async def scenario():
        api = FakeLeases(namespace_exists=False)
        elector = Elector(api, "strata-system", "leader", "a_1")
        await asyncio.wait_for(acquire(elector), 2)
        assert elector.leading and api.holder() == "a_1"
        assert api.namespace_labels["app.kubernetes.io/part-of"] == "strata"

    with caplog.at_level(logging.INFO, logger="strata_operator.controllers.leadership"):
        run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("created the namespace strata-system for the leader Lease" in m for m in messages)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_lease_namespace_that_may_not_be_created_is_named_with_the_fixes_once(fast, caplog):
    async def scenario():
        api = FakeLeases(namespace_exists=False, may_create_namespaces=False)
        elector = Elector(api, "strata-system", "leader", "a_1")
        waiting = asyncio.create_task(acquire(elector))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        api.namespace_exists = True  # an administrator created it
        await asyncio.wait_for(waiting, 2)
        assert elector.leading

    with caplog.at_level(logging.INFO, logger="strata_operator.controllers.leadership"):
        run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "namespace strata-system does not exist and this operator may not create it" in errors[0]
    assert "kubectl create namespace strata-system" in errors[0] and "--leader-election-namespace" in errors[0]


def test_only_a_namespace_not_found_names_a_missing_namespace():
    assert missing_namespace(_not_found_namespace("ops")) == "ops"
    lease_gone = ApiException(status=404, reason="NotFound")
    lease_gone.body = json.dumps({"details": {"name": "leader", "group": "coordination.k8s.io", "kind": "leases"}})
    assert missing_namespace(lease_gone) == ""
    assert missing_namespace(ApiException(status=403, reason="Forbidden")) == ""


def test_the_leader_renews_until_cancelled(fast, stops):
    reasons, _ = stops

    async def scenario():
        api = FakeLeases()
        elector = Elector(api, "ns", "leader", "a_1")
        await acquire(elector)
        first_renew = api.leases["leader"]["spec"]["renewTime"]
        renewing = asyncio.create_task(keep(elector))
        await asyncio.sleep(0.2)
        renewing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await renewing
        assert api.leases["leader"]["spec"]["renewTime"] != first_renew

    run(scenario())
    assert reasons == []


def test_a_cancel_that_races_a_finished_renewal_still_stops_the_loop(fast, stops):
    """Python 3.11's wait_for returns the inner result when the cancel arrives as it finishes; the renew
    loop must not lose that cancel (the cleanup waiting for it would hang, as a CI run once did)."""
    reasons, _ = stops

    async def scenario():
        elector = Elector(FakeLeases(), "ns", "leader", "a_1")
        await acquire(elector)
        renew = elector.step

        async def step_then_cancelled():
            decision = await renew()
            renewing.cancel()  # the cleanup's cancel, landing just as the renewal completes
            return decision

        elector.step = step_then_cancelled
        renewing = asyncio.create_task(keep(elector))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(renewing), 2)

    run(scenario())
    assert reasons == []


def test_the_leader_stops_once_another_holds_the_lease(fast, stops):
    reasons, Stopped = stops

    async def scenario():
        api = FakeLeases()
        elector = Elector(api, "ns", "leader", "a_1")
        await acquire(elector)
        api.leases["leader"]["spec"]["holderIdentity"] = "b_2"  # e.g. it lapsed while we were frozen
        with pytest.raises(Stopped):
            await asyncio.wait_for(keep(elector), 2)

    run(scenario())
    assert "now held by b_2" in reasons[0]


def test_the_leader_stops_when_it_cannot_renew_before_the_deadline(fast, stops):
    reasons, Stopped = stops

    async def scenario():
        api = FakeLeases()
        elector = Elector(api, "ns", "leader", "a_1")
        await acquire(elector)
        api.fail = ConnectionRefusedError("apiserver down")
        with pytest.raises(Stopped):
            await asyncio.wait_for(keep(elector), 5)

    run(scenario())
    assert "could not be renewed" in reasons[0]


def test_the_leader_stops_when_a_renewal_hangs_past_the_deadline(fast, stops):
    reasons, Stopped = stops

    class Hanging(FakeLeases):
        hang = False

        async def get_lease(self, namespace, name):
            if self.hang:
                await asyncio.sleep(60)
            return await super().get_lease(namespace, name)

    async def scenario():
        api = Hanging()
        elector = Elector(api, "ns", "leader", "a_1")
        await acquire(elector)
        api.hang = True
        with pytest.raises(Stopped):
            await asyncio.wait_for(keep(elector), 5)

    run(scenario())
    assert "could not be renewed" in reasons[0]


def test_standby_health_answers_with_the_election_state():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario():
        elector = Elector(FakeLeases(), "ns", "leader", "b_2")
        health = StandbyHealth(f"http://127.0.0.1:{port}/healthz", elector)
        await health.start()
        try:
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
        finally:
            await health.stop()
        return json.loads(body)

    assert run(scenario()) == {"leader": {"leading": False, "identity": "b_2", "lease": "ns/leader",
                                                  "holder": ""}}


def test_api_errors_name_the_fix_and_never_the_headers():
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps({"message": 'leases.coordination.k8s.io "l" is forbidden'})
    forbidden.headers = {"Audit-Id": "secret-ish"}
    text = describe_api_error(forbidden, "ops", "l")
    assert "is forbidden" in text and "get, create and update" in text and "--no-leader-election" in text
    assert "Audit-Id" not in text
    missing = ApiException(status=404, reason="NotFound")
    assert "Create namespace ops" in describe_api_error(missing, "ops", "l")


def test_settings_errors_name_the_flag():
    check_settings(ElectionSettings())
    with pytest.raises(SystemExit, match="--leader-election-lease"):
        check_settings(ElectionSettings(lease_name="Not_Valid"))
    with pytest.raises(SystemExit, match="--leader-election-namespace"):
        check_settings(ElectionSettings(namespace="a.b"))


def test_lease_namespace_comes_from_the_pod_then_the_kubeconfig_then_the_default(tmp_path, monkeypatch):
    monkeypatch.setattr(leadership, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: Config
        current-context: op
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
        users: [{name: u, user: {token: t}}]
        contexts: [{name: op, context: {cluster: c, user: u, namespace: ops}}]
    """))
    assert discover_namespace(str(kubeconfig))[0] == "ops"
    assert discover_namespace(str(tmp_path / "missing"))[0] == "strata-system"
    pod = tmp_path / "namespace"
    pod.write_text("in-pod\n")
    monkeypatch.setattr(leadership, "SERVICE_ACCOUNT_NAMESPACE", pod)
    assert discover_namespace(str(kubeconfig))[0] == "in-pod"


def test_flags():
    args = build_parser().parse_args([])
    # No --leader-election-lease: the shard's own Lease (strata-operator-leader for the main operator).
    assert not args.no_leader_election and args.leader_election_lease is None
    assert args.leader_election_namespace == ""
    args = build_parser().parse_args(["--no-leader-election", "--leader-election-lease", "x",
                                      "--leader-election-namespace", "ops"])
    assert args.no_leader_election and args.leader_election_lease == "x" and args.leader_election_namespace == "ops"


def test_kill_workers_kills_every_descendant_forked_workers_included():
    # In a child interpreter, which plays the operator: a "fork server" child whose own child leads
    # its own session (as the engine's workers do), and a plain child with a grandchild in its group.
    script = textwrap.dedent("""\
        import subprocess, sys, time
        from pathlib import Path
        from strata_operator.controllers.leadership import _descendants, kill_workers
        server = subprocess.Popen([sys.executable, "-c",
            "import subprocess, time; subprocess.Popen(['sleep', '60'], start_new_session=True); time.sleep(60)"])
        plain = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
        deadline = time.time() + 10
        while len(_descendants(server.pid)) < 1 or len(_descendants(plain.pid)) < 1:
            assert time.time() < deadline, "children did not start"
            time.sleep(0.05)
        below = _descendants(server.pid) + _descendants(plain.pid)
        print(kill_workers(), server.wait(5), plain.wait(5))
        time.sleep(0.3)
        alive = [p for p in below if Path(f"/proc/{p}/stat").exists()
                 and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        print(alive)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    counts, alive = out.stdout.splitlines()
    assert counts.split() == ["4", "-9", "-9"] and alive == "[]"


def test_losing_leadership_kills_the_workers_and_exits_with_one_clear_line():
    script = textwrap.dedent("""\
        import logging, subprocess, time
        from strata_operator.controllers.leadership import Elector, stop_handling
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
        time.sleep(0.2)
        try:
            stop_handling(Elector(None, "ns", "leader", "a_1"), "the Lease ns/leader is now held by b_2")
        finally:
            print("not reached")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "not reached" not in out.stdout
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("CRITICAL")]
    assert "lost leadership: the Lease ns/leader is now held by b_2" in line and "1 worker process(es) killed" in line


def test_losing_leadership_in_the_operators_run_starts_it_afresh_in_the_same_process(tmp_path):
    # The script plays the operator's main: its second life (the same pid, after exec) says so and stops.
    marker = tmp_path / "lives"
    script = textwrap.dedent(f"""\
        import logging, os, pathlib, subprocess, time
        from strata_operator.controllers.leadership import Elector, stop_handling
        marker = pathlib.Path({str(marker)!r})
        lives = marker.read_text().split() if marker.exists() else []
        marker.write_text(" ".join([*lives, str(os.getpid())]))
        if lives:
            raise SystemExit(0)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        worker = subprocess.Popen(["sleep", "60"], start_new_session=True)
        time.sleep(0.2)
        stop_handling(Elector(None, "ns", "leader", "a_1", restart_in_place=True), "the Lease could not be renewed")
        print("not reached")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "not reached" not in out.stdout, out.stderr
    first, second = marker.read_text().split()
    assert first == second  # the same process, started afresh
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("CRITICAL")]
    assert "1 worker process(es) killed" in line and "restarting in place as a standby" in line
