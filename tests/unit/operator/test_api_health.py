"""A sick API server is said once when the operator's calls start failing and once when it answers again,
with a metric to alert on; a refusal (4xx) is an answer."""

import asyncio
import logging

import aiohttp
import pytest
import urllib3
from kubernetes.client.rest import ApiException

from strata_operator.services import api_health, metrics
from strata_operator.services.api_health import ApiHealth, failure_cause
from strata_operator.services.kube import Kube


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or None) or 0.0


def test_only_5xx_429_and_no_answer_are_the_servers_failures():
    assert failure_cause(500) == "HTTP 500" and failure_cause(429) == "HTTP 429"
    assert failure_cause(403) is None and failure_cause(404) is None and failure_cause(None) is None
    assert failure_cause(None, urllib3.exceptions.ReadTimeoutError(None, "/", "timed out")) == "ReadTimeoutError"


def test_an_outage_is_one_line_at_its_start_and_one_at_its_end_and_a_metric_meanwhile():
    health = ApiHealth()
    errors = _value("api_server_errors_total", cause="HTTP 500")
    first = health.failed("HTTP 500", now=100.0)
    assert first.startswith("the API server is failing (HTTP 500): Stacks wait, nothing is lost")
    assert _value("api_server_failing") == 1
    assert [health.failed("HTTP 500", now=100.0 + i) for i in range(1, 30)] == [None] * 29
    assert _value("api_server_errors_total", cause="HTTP 500") == errors + 30
    assert health.answered(now=161.0) == "the API server answers again after 61 s (30 failed call(s))"
    assert _value("api_server_failing") == 0
    assert health.answered(now=162.0) is None


class _Broken:
    """Stands for the Kubernetes client's call as a sick server makes it fail."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)

    def __call__(self):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_every_call_through_kube_reports_its_outcome(monkeypatch, caplog):
    monkeypatch.setattr(api_health, "API_HEALTH", ApiHealth())
    kube = Kube(api=None)  # the calls below never touch the client
    call = _Broken([ApiException(status=503), urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"),
                    ApiException(status=404), {"kind": "Lease"}])
    caplog.set_level(logging.INFO, logger="strata_operator.services.api_health")
    for expected in (ApiException, urllib3.exceptions.ReadTimeoutError, ApiException):
        with pytest.raises(expected):
            asyncio.run(kube._call(call))
    assert asyncio.run(kube._call(call)) == {"kind": "Lease"}
    said = [record.getMessage() for record in caplog.records]
    # The 404 answered: that ended the outage (the server is up, it refused).
    assert len(said) == 2 and said[0].startswith("the API server is failing (HTTP 503)")
    assert said[1].startswith("the API server answers again after") and "(2 failed call(s))" in said[1]


def test_kopfs_own_requests_report_their_outcome_too(monkeypatch, caplog):
    """Kopf's watches and patches go through its own aiohttp session: a real one against a loopback server
    that answers 500, then 200."""
    from aiohttp import web

    from strata_operator.services.kopf_login import api_health_trace

    monkeypatch.setattr(api_health, "API_HEALTH", ApiHealth())
    caplog.set_level(logging.INFO, logger="strata_operator.services.api_health")
    answers = [500, 500, 200]

    async def scenario() -> None:
        async def handle(_request):
            return web.Response(status=answers.pop(0))

        app = web.Application()
        app.router.add_get("/", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession(trace_configs=[api_health_trace()]) as session:
            for _ in range(3):
                async with session.get(f"http://127.0.0.1:{port}/") as response:
                    await response.read()
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get("http://127.0.0.1:1/")  # nothing listens: no answer at all
        await runner.cleanup()

    asyncio.run(scenario())
    said = [record.getMessage() for record in caplog.records]
    assert said[0].startswith("the API server is failing (HTTP 500)")
    assert said[1].startswith("the API server answers again after") and "(2 failed call(s))" in said[1]
    assert said[2].startswith("the API server is failing (ClientConnectorError)")
