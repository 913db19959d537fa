"""The operator's preflight: answers turned into one line per cause naming the fix; startup handlers that
fail for good instead of Kopf's retry every 60 s."""

import errno
import importlib
import socket

import kopf
from kopf._core.intents.causes import Activity  # Kopf does not export it

from strata_operator.controllers import preflight
from strata_operator.controllers.preflight import (CRDS_FIX, Failure, PortSetting, bind_error, build_credential_failure,
                                                   build_crd_failures, build_lease_failure, build_port_failures)
from strata_operator.main import HANDLER_MODULES

PORTS = (PortSetting("--metrics-port", 8383, "metrics"), PortSetting("--health-port", 8384, "health"))


def test_a_taken_port_is_one_line_naming_the_port_its_flag_and_the_fix():
    (failure,) = build_port_failures(PORTS, lambda address, port: errno.EADDRINUSE if port == 8383 else None)
    assert failure.line() == ("cannot start: the metrics port 8383 (--metrics-port) is already in use on this host; "
                              "fix: stop what listens there, or give --metrics-port a free port (--metrics-port 0 "
                              "turns it off)")
    assert "\n" not in failure.line()


def test_ports_turned_off_are_not_checked_and_other_bind_errors_are_named():
    assert build_port_failures((PortSetting("--metrics-port", 0, "metrics"),),
                               lambda address, port: errno.EADDRINUSE) == []
    (failure,) = build_port_failures(PORTS[1:], lambda address, port: errno.EACCES)
    assert "health port 8384 (--health-port) cannot be bound (EACCES)" in failure.cause


def test_bind_error_sees_a_listening_socket():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert bind_error("0.0.0.0", held.getsockname()[1]) == errno.EADDRINUSE
        assert bind_error("127.0.0.1", held.getsockname()[1]) == errno.EADDRINUSE
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert bind_error("0.0.0.0", port) is None


def test_each_port_is_checked_on_the_address_its_server_binds():
    asked = []
    build_port_failures((PortSetting("--metrics-port", 8383, "metrics", "127.0.0.1"), PORTS[1]),
                        lambda address, port: asked.append((address, port)))
    assert asked == [("127.0.0.1", 8383), ("0.0.0.0", 8384)]


def test_rejected_credentials_are_named_with_the_server_and_the_fix():
    failure = build_credential_failure(401, "Unauthorized", "https://127.0.0.1:6443")
    assert failure is not None and "https://127.0.0.1:6443 does not accept the operator's credentials" in failure.cause
    assert "--kubeconfig" in failure.fix
    assert build_credential_failure(200, "", "https://x") is None


def test_each_api_not_served_is_one_cause_naming_its_resources():
    assert build_crd_failures({"pulumi.com/v1": {"stacks", "programs"},
                               "auto.pulumi.com/v1alpha1": {"workspaces", "updates"}}) == []
    failures = build_crd_failures({"pulumi.com/v1": {"stacks"}, "auto.pulumi.com/v1alpha1": None})
    assert [f.cause for f in failures] == [
        "the API server does not serve pulumi.com/v1 programs.pulumi.com (CRD missing)",
        "the API server does not serve auto.pulumi.com/v1alpha1 workspaces.auto.pulumi.com, updates.auto.pulumi.com "
        "(CRD missing)"]
    assert all(f.fix == CRDS_FIX for f in failures)


def test_a_lease_verb_denied_names_the_verbs_the_lease_and_the_grant():
    assert build_lease_failure({"get": True, "create": True, "update": True}, "strata-system", "leader") is None
    failure = build_lease_failure({"get": True, "create": False, "update": False}, "strata-system", "leader")
    assert failure == Failure(
        "the operator may not create/update its leader Lease strata-system/leader (coordination.k8s.io leases)",
        failure.fix)
    assert "leader-election.yaml" in failure.fix and "--no-leader-election" in failure.fix


def test_every_startup_handler_fails_for_good_instead_of_being_retried():
    # Kopf's default retries a failed startup handler every 60 s forever, each try forking another
    # fork server (seen: 4 idle workers in 5 minutes, and no exit).
    for module in HANDLER_MODULES:
        importlib.import_module(f"strata_operator.{module}")
    startup = kopf.get_default_registry()._activities.get_handlers(activity=Activity.STARTUP)
    assert len(startup) >= 3
    assert {handler.id: handler.errors for handler in startup} == {
        handler.id: kopf.ErrorsMode.PERMANENT for handler in startup}


class _Clock:
    """time for the preflight's waits: sleeping moves it on at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_cause_from_an_api_server_just_started_is_waited_out_and_a_lasting_one_reported(monkeypatch):
    # An apiserver restarted under a waiting operator refused its first check with 403 (its RBAC caches
    # not yet synced), and the operator exited for good: the chaos benchmark's apiserver outage.
    clock = _Clock()
    monkeypatch.setattr(preflight, "time", clock)
    monkeypatch.setattr(preflight, "_Api", lambda kubeconfig: None)
    refused = Failure("the API server https://apiserver refused a check: HTTP 403", "grant")
    answers = iter([[refused], [refused], []])
    monkeypatch.setattr(preflight, "_ask", lambda api, settings: next(answers))
    settings = preflight.PreflightSettings(PORTS, None, ("strata-system", "leader"))
    assert preflight.check(settings, bind=lambda address, port: None) == []
    monkeypatch.setattr(preflight, "_ask", lambda api, settings: [refused])
    started = clock.now
    assert preflight.check(settings, bind=lambda address, port: None) == [refused]
    assert clock.now - started >= preflight.CAUSE_SETTLE_SECONDS
