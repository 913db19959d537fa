"""Flux-native events: with --flux-events-address the operator's Stack Events also reach Flux's real
notification-controller (v1.9.3, a host process of the platform) in Flux's event format, and its Alerts
and Providers route them like any Flux object's.

Flux v2.9.5's Alert CRD lists the kinds an Alert may select (`eventSources[].kind` is an enum of
Flux's own kinds), so the apiserver refuses `kind: Stack` until the CRD gets the JSON patch Flux
documents for third-party controllers ("enable notifications for third party controllers"); with it,
an Alert on Stacks forwards their events to a `generic` Provider: here a loopback HTTP server this
test runs. A Flux events address that does not answer never holds back a reconcile.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import operator_host
from strata_components.local.platform import LocalPlatform

from .conftest import MIN_RESYNC_SECONDS, STALL_AFTER_FAILURES, Operator, stash_program
from .test_leader_election import _wait_holder, _wait_log

NOTIFICATION = ("notification.toolkit.fluxcd.io", "v1beta3")
ALERTS_CRD = "alerts.notification.toolkit.fluxcd.io"
KIND_ENUM = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/eventSources/items/properties/kind/enum"


class Receiver:
    """A loopback HTTP server keeping every JSON POST it gets: (path, headers, body)."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, path: str, stack: str, reason: str) -> list[tuple[dict, dict]]:
        return [(headers, body) for got, headers, body in list(self.received)
                if got == path and body["involvedObject"]["name"] == stack and body["reason"] == reason]

    def wait(self, path: str, stack: str, reason: str, timeout: float = 30) -> tuple[dict, dict]:
        try:
            return processes.wait_until(lambda: next(iter(self.events(path, stack, reason)), None), timeout,
                                        f"{reason} of Stack {stack} forwarded to {path}")
        except processes.ProcessError as error:
            got = [(path, body.get("reason"), body.get("involvedObject", {}).get("name"))
                   for path, _, body in self.received]
            raise AssertionError(f"{error}; received: {got}") from None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def notification_controller(platform: LocalPlatform, toolchain) -> str:
    """Flux's notification-controller started on the session's platform (its CRDs applied); its events URL."""
    config = dataclasses.replace(platform.config, host_controllers=(*platform.config.host_controllers,
                                                                    "notification-controller"))
    info = LocalPlatform(config, toolchain=toolchain).up(say=print)
    return info.flux_events_url


def dedicated_operator(operator: Operator, platform, toolchain, plugin_cache, directory, namespace: str,
                       events_address: str) -> Operator:
    """An operator like the session's, for one namespace, sending Flux events to `events_address`."""
    host = operator_host(platform, toolchain, directory, extra_args=(
        "--stall-after-failures", str(STALL_AFTER_FAILURES), "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
        "--plugin-cache", str(plugin_cache), "--namespace", namespace, "--no-leader-election",
        "--flux-events-address", events_address, "--verbose"))
    fields = {field.name: getattr(host, field.name) for field in dataclasses.fields(host)}
    fields["process"] = dataclasses.replace(host.process, name="strata-operator-flux-events")
    return Operator(**fields)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def session_operator_paused(operator: Operator, kube_client) -> Iterator[None]:
    operator.stop()  # the session's operator would run this namespace's Stacks too
    yield
    operator.start()
    _wait_holder(kube_client, operator, 60, "the session's operator leads again")


def _custom(kube_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_client)


def _alert(namespace: str, name: str, provider: str, severity: str) -> dict:
    return {"apiVersion": "/".join(NOTIFICATION), "kind": "Alert", "metadata": {"name": name},
            "spec": {"providerRef": {"name": provider}, "eventSeverity": severity,
                     "eventSources": [{"kind": "Stack", "name": "*", "namespace": namespace}],
                     "eventMetadata": {"cluster": "strata-local"}}}


def _provider(name: str, address: str) -> dict:
    return {"apiVersion": "/".join(NOTIFICATION), "kind": "Provider", "metadata": {"name": name},
            "spec": {"type": "generic", "address": address}}


def _patch_alert_kinds(kube_client, patch: list[dict]) -> None:
    client.ApiextensionsV1Api(kube_client).patch_custom_resource_definition(ALERTS_CRD, patch)


def test_stack_events_reach_notification_controller_and_alerts_route_them_to_a_generic_provider(
        stacks, operator, platform, toolchain, kube_client, namespace, plugin_cache, tmp_path,
        notification_controller, receiver, session_operator_paused):
    custom = _custom(kube_client)
    flux_log = platform.log_dir / "notification-controller.log"

    # Flux's Alert CRD refuses an Alert on Stacks as it ships.
    custom.create_namespaced_custom_object(*NOTIFICATION, namespace, "providers",
                                           _provider("hook", f"{receiver.url}/all"))
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object(*NOTIFICATION, namespace, "alerts", _alert(namespace, "all", "hook",
                                                                                        "info"))
    assert refused.value.status == 422
    assert 'spec.eventSources[0].kind: Unsupported value: "Stack"' in json.loads(refused.value.body)["message"]

    events_operator = dedicated_operator(operator, platform, toolchain, plugin_cache, tmp_path / "op", namespace,
                                         notification_controller)
    events_operator.start()
    try:
        _wait_log(events_operator, 0, f"Stack Events also go to Flux's notification-controller at "
                                      f"{notification_controller}")
        # Without an Alert, notification-controller still gets and parses the event, then discards it.
        stacks.program("early", stash_program(greeting="early"))
        stacks.create("early", stacks.spec(programRef={"name": "early"}))
        stacks.wait_ready("early", 120)
        processes.wait_until(
            lambda: any("discarding event, no alerts found for the involved object" in line and "Stack" in line
                        and '"name":"early"' in line.replace(" ", "")
                        for line in flux_log.read_text(errors="replace").splitlines()), 20,
            "notification-controller logs the Stack event it had no Alert for", log=flux_log)
    finally:
        events_operator.stop()

    with _third_party_kinds(kube_client):
        custom.create_namespaced_custom_object(*NOTIFICATION, namespace, "alerts", _alert(namespace, "all", "hook",
                                                                                        "info"))
        custom.create_namespaced_custom_object(*NOTIFICATION, namespace, "providers",
                                               _provider("pager", f"{receiver.url}/errors"))
        custom.create_namespaced_custom_object(*NOTIFICATION, namespace, "alerts", _alert(namespace, "errors",
                                                                                        "pager", "error"))
        events_operator.start()
        try:
            stacks.program("good", stash_program(greeting="hello"))
            stacks.create("good", stacks.spec(programRef={"name": "good"}),
                          annotations={"event.toolkit.fluxcd.io/team": "payments"})
            ready = stacks.wait_ready("good", 120)
            commit = ready["status"]["lastUpdate"]["lastSuccessfulCommit"]
            headers, event = receiver.wait("/all", "good", "StackCreated")
            assert headers["gotk-component"] == "strata-operator"  # the generic Provider names the sender
            assert set(event) == {"involvedObject", "severity", "timestamp", "message", "reason", "metadata",
                                  "reportingController", "reportingInstance"}
            assert event["involvedObject"] == {
                "kind": "Stack", "namespace": namespace, "name": "good", "uid": ready["metadata"]["uid"],
                "apiVersion": "pulumi.com/v1", "resourceVersion": event["involvedObject"]["resourceVersion"]}
            assert event["severity"] == "info" and event["message"].startswith("Successfully updated stack (")
            assert event["reportingController"] == "strata-operator" and event["reportingInstance"]
            # notification-controller strips the pulumi.com/ and event.toolkit.fluxcd.io/ prefixes and adds the
            # Alert's eventMetadata (Flux RFC 0008).
            assert event["metadata"] == {"revision": commit, "team": "payments", "cluster": "strata-local"}
            assert receiver.wait("/all", "good", "StackUpdateDetected")[1]["severity"] == "info"
            assert not receiver.events("/errors", "good", "StackCreated")  # an error Alert: not sent

            # A failing Stack: its failures go out as error events, to both Alerts.
            stacks.program("bad", stash_program(greeting="${who}"))  # config `who` is never set
            stacks.create("bad", stacks.spec(programRef={"name": "bad"}))
            _, failure = receiver.wait("/errors", "bad", "StackUpdateFailure", 90)
            assert failure["severity"] == "error" and failure["message"].startswith("Failed to update stack:")
            assert "who" in failure["message"]
            assert receiver.wait("/all", "bad", "StackUpdateFailure")[1]["severity"] == "error"
            assert not receiver.events("/errors", "bad", "StackUpdateDetected")
            # The Kubernetes Events are unchanged: the same reasons and messages.
            kube_failure = stacks.wait_events("bad", "StackUpdateFailure")[0]
            assert kube_failure.type == "Warning" and kube_failure.message == failure["message"]
            stacks.wait_stalled("bad", "UpdateFailed", 90)
            # The passphrase the Stacks use never leaves the operator.
            assert "operator-it-passphrase" not in json.dumps([body for _, _, body in receiver.received])
            assert "cannot deliver" not in events_operator.log_text()
        finally:
            events_operator.stop()
            for name in ("all", "errors"):
                custom.delete_namespaced_custom_object(*NOTIFICATION, namespace, "alerts", name)


class _third_party_kinds:
    """Stack among the Alert CRD's event source kinds (Flux's third-party recipe) while inside; restored after."""

    def __init__(self, kube_client) -> None:
        self.kube_client = kube_client
        self.count = 0

    def __enter__(self) -> None:
        raw = client.ApiextensionsV1Api(self.kube_client).read_custom_resource_definition(ALERTS_CRD,
                                                                                         _preload_content=False)
        schema = json.loads(raw.data)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        kinds = schema["properties"]["spec"]["properties"]["eventSources"]["items"]["properties"]["kind"]["enum"]
        assert "Stack" not in kinds and "Kustomization" in kinds
        self.count = len(kinds)
        _patch_alert_kinds(self.kube_client, [{"op": "add", "path": f"{KIND_ENUM}/-", "value": "Stack"}])
        # The apiserver validates new objects against the patched schema once the CRD is re-established.
        processes.wait_until(lambda: _accepts_stack(self.kube_client), 20, "the Alert CRD accepts kind: Stack")

    def __exit__(self, *_: Any) -> None:
        _patch_alert_kinds(self.kube_client, [
            {"op": "test", "path": f"{KIND_ENUM}/{self.count}", "value": "Stack"},
            {"op": "remove", "path": f"{KIND_ENUM}/{self.count}"}])


def _accepts_stack(kube_client) -> bool:
    try:
        _custom(kube_client).create_namespaced_custom_object(
            *NOTIFICATION, "default", "alerts", _alert("default", "probe", "none", "info"), dry_run="All")
        return True
    except client.ApiException as error:
        if error.status == 422:
            return False
        raise


def test_an_events_address_that_does_not_answer_never_holds_back_a_stack(
        stacks, operator, platform, toolchain, namespace, plugin_cache, tmp_path, session_operator_paused):
    closed = f"http://127.0.0.1:{processes.free_ports(1)[0]}/"
    events_operator = dedicated_operator(operator, platform, toolchain, plugin_cache, tmp_path / "op", namespace,
                                         closed)
    events_operator.start()
    try:
        for name in ("one", "two"):
            stacks.program(name, stash_program(greeting=name))
            stacks.create(name, stacks.spec(programRef={"name": name}))
        for name in ("one", "two"):
            assert stacks.wait_ready(name, 120)["status"]["outputs"] == {"greeting": name}
            stacks.wait_events(name, "StackCreated")
        # Several events failed to go out (at least a detected and a successful per Stack): said once.
        failures = [line for line in events_operator.log_text().splitlines() if "Flux events: cannot deliver" in line]
        assert len(failures) == 1 and closed in failures[0] and "logged once" in failures[0]
    finally:
        events_operator.stop()
