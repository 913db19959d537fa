"""Stack Events in Flux's event format: the pure formatting and the best-effort background delivery."""

import asyncio
import json
import logging
from datetime import datetime, timedelta, timezone

import pytest

from strata_operator.services.flux_events import FluxEventSink, build_flux_event, check_address
from strata_operator.main import build_parser, run as run_operator
from strata_operator.services.redaction import redactor_for

NOW = datetime(2026, 11, 24, 9, 30, 5, 123456, tzinfo=timezone.utc)
STACK = {
    "apiVersion": "pulumi.com/v1", "kind": "Stack",
    "metadata": {"name": "web", "namespace": "apps", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                 "annotations": {"event.toolkit.fluxcd.io/cluster": "prod-eu",
                                 "pulumi.com/reconciliation-request": "x",
                                 "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
    "spec": {"stack": "dev", "envRefs": {"TOKEN": {"type": "Literal", "literal": {"value": "hunter2-secret"}}}},
    "status": {"outputs": {"password": "[secret]"}},
}


def run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def test_a_success_event_is_a_flux_info_event_about_the_stack():
    event = build_flux_event(STACK, "StackCreated", "Successfully updated stack", revision="main@sha1:abc",
                             now=NOW, instance="host-1")
    assert event == {
        # reference.GetReference's fields, as Flux's recorder sends them.
        "involvedObject": {"kind": "Stack", "namespace": "apps", "name": "web", "uid": "u-1",
                           "apiVersion": "pulumi.com/v1", "resourceVersion": "42"},
        "severity": "info",
        "timestamp": "2026-11-24T09:30:05Z",  # metav1.Time: RFC 3339, whole seconds, UTC
        "message": "Successfully updated stack",
        "reason": "StackCreated",
        # Keys prefixed with the involved object's API group (the event server keeps only those and
        # event.toolkit.fluxcd.io/ ones), and the object's event.toolkit.fluxcd.io/* annotations.
        "metadata": {"pulumi.com/revision": "main@sha1:abc", "event.toolkit.fluxcd.io/cluster": "prod-eu"},
        "reportingController": "strata-operator",
        "reportingInstance": "host-1",
    }
    json.dumps(event)  # what is POSTed


def test_a_warning_is_an_error_event_and_nothing_of_the_spec_or_status_travels():
    event = build_flux_event(STACK, "StackUpdateFailure", "Failed to update stack: boom", warning=True,
                             now=NOW.astimezone(timezone(timedelta(hours=2))), instance="h")
    assert event["severity"] == "error" and event["reason"] == "StackUpdateFailure"
    assert event["timestamp"] == "2026-11-24T09:30:05Z"
    assert event["metadata"] == {"event.toolkit.fluxcd.io/cluster": "prod-eu"}  # no revision given: none sent
    text = json.dumps(event)
    assert "hunter2" not in text and "envRefs" not in text and "outputs" not in text
    assert "last-applied" not in text and "reconciliation-request" not in text


def test_messages_and_annotation_values_are_redacted_and_bounded():
    redactor_for(STACK["metadata"]["namespace"]).add("s3cr3t-value-for-flux")
    stack = {**STACK, "metadata": {**STACK["metadata"],
                                   "annotations": {"event.toolkit.fluxcd.io/note": "has s3cr3t-value-for-flux"}}}
    event = build_flux_event(stack, "StackUpdateFailure", "token s3cr3t-value-for-flux leaked" + "x" * 2000,
                             warning=True, now=NOW, instance="h")
    assert "s3cr3t-value-for-flux" not in json.dumps(event)
    assert event["message"].startswith("token [secret] leaked") and len(event["message"]) == 1024
    assert event["metadata"] == {"event.toolkit.fluxcd.io/note": "has [secret]"}


def test_objects_the_event_server_cannot_route_are_not_sent():
    for broken in ({**STACK, "kind": ""}, {**STACK, "metadata": {"name": "web"}},
                   {**STACK, "metadata": {"namespace": "apps"}}):
        assert build_flux_event(broken, "R", "m", now=NOW, instance="h") is None
    minimal = build_flux_event({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                                "metadata": {"name": "a", "namespace": "b"}}, "R", "m", now=NOW, instance="h")
    assert minimal["involvedObject"] == {"kind": "Stack", "namespace": "b", "name": "a", "apiVersion": "pulumi.com/v1"}
    assert "metadata" not in minimal


def test_the_address_must_be_an_http_url_and_empty_is_off():
    assert check_address("") == ""
    assert check_address("http://127.0.0.1:9090/") == "http://127.0.0.1:9090/"
    assert check_address("https://nc.flux-system.svc./") == "https://nc.flux-system.svc./"
    for bad in ("127.0.0.1:9090", "ftp://x/", "http://"):
        with pytest.raises(ValueError, match="--flux-events-address"):
            check_address(bad)
    assert build_parser().parse_args([]).flux_events_address == ""
    assert build_parser().parse_args(["--flux-events-address", "http://a/"]).flux_events_address == "http://a/"
    with pytest.raises(SystemExit, match="--flux-events-address 'nc:9090'"):
        run_operator(["--flux-events-address", "nc:9090"])


def test_delivery_goes_in_order_and_treats_the_rate_limit_as_delivered():
    sent, statuses = [], iter([202, 429, 200])

    async def post(url, event):
        sent.append((url, event["message"]))
        return next(statuses)

    async def scenario():
        sink = FluxEventSink("http://nc/", post=post)
        sink.start()
        for index in range(3):
            sink.publish({"message": str(index)})
        sink.publish(None)  # an unroutable object's event: nothing
        await sink.drain()
        await sink.stop()
        return sink

    sink = run(scenario())
    assert sent == [("http://nc/", "0"), ("http://nc/", "1"), ("http://nc/", "2")]
    assert (sink.delivered, sink.failed, sink.dropped) == (3, 0, 0)


def test_failures_are_logged_once_per_outage_and_never_reach_the_caller(caplog):
    outcomes = iter([ConnectionRefusedError("refused"), 500, asyncio.TimeoutError(), 202, 503])

    async def post(url, event):
        outcome = next(outcomes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def scenario():
        sink = FluxEventSink("http://nc/", post=post)
        sink.start()
        for index in range(5):
            sink.publish({"message": str(index)})
        await sink.drain()
        await sink.stop()
        return sink

    with caplog.at_level(logging.INFO, logger="strata_operator.services.flux_events"):
        sink = run(scenario())
    assert (sink.delivered, sink.failed) == (1, 4)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Flux events: cannot deliver to http://nc/ (ConnectionRefusedError: refused); dropping events "
                     "until it answers (logged once)",
                     "Flux events: delivering to http://nc/ again",
                     "Flux events: cannot deliver to http://nc/ (HTTP 503); dropping events until it answers "
                     "(logged once)"]


def test_a_full_queue_drops_without_blocking_the_publisher(caplog):
    release = None

    async def post(url, event):
        await release.wait()
        return 202

    async def scenario():
        nonlocal release
        release = asyncio.Event()
        sink = FluxEventSink("http://nc/", post=post, queue_size=2)
        sink.start()
        await asyncio.sleep(0)
        for index in range(6):  # one in flight once the task runs, two queued, the rest dropped
            sink.publish({"message": str(index)})
        await asyncio.sleep(0)
        dropped_while_stuck = sink.dropped
        release.set()
        await sink.drain()
        await sink.stop()
        return sink, dropped_while_stuck

    with caplog.at_level(logging.WARNING, logger="strata_operator.services.flux_events"):
        sink, dropped = run(scenario())
    assert dropped == 4 and sink.delivered == 2
    assert [r.getMessage() for r in caplog.records] == [
        "Flux events: queue full (2 waiting for http://nc/); dropping events until it drains"]
