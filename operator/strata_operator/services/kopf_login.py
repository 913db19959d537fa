"""Kopf's connection to the API server, with a bound on how many connections it opens.

Kopf's own client has no limit on its connections (its aiohttp connector is made with `limit=0`), so it
opens as many TLS connections as it has requests in flight. 1000 Stacks created at once send about as
many requests together (finalizers, Events), hence hundreds of connections, each with asyncio's SSL
buffers: the operator's RSS jumped by 93 MB in the first 35 s of a 1000-Stack fill, and with the heap
fragmented afterwards it stayed there. This login gives Kopf the same credentials as its default one
(`kopf.login_via_client`: in-cluster, else the kubeconfig) in a session whose connector opens at most
`connection_limit()` connections; further requests wait for a free one. Each of its requests' outcome
goes to api_health, so a sick API server shows in the log and the metrics even while no handler calls it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kopf

from . import api_health

REQUEST_CONNECTIONS = 32
# Each watch stream holds a connection for as long as it runs: Stacks, Programs and the Flux kinds, per
# watched namespace (one set when cluster-wide), with room to spare.
WATCHES_PER_NAMESPACE = 8


def connection_limit(namespaces: int) -> int:
    return REQUEST_CONNECTIONS + WATCHES_PER_NAMESPACE * max(1, namespaces)


def api_health_trace() -> aiohttp.TraceConfig:
    """Report every request's outcome (its status, or the exception that left it without one)."""

    async def answered(_session: Any, _context: Any, params: aiohttp.TraceRequestEndParams) -> None:
        api_health.record(params.response.status)

    async def unanswered(_session: Any, _context: Any, params: aiohttp.TraceRequestExceptionParams) -> None:
        api_health.record(None, params.exception)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(answered)
    trace.on_request_exception.append(unanswered)
    return trace


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.AiohttpSession | None:
    info = kopf.login_via_client(**kwargs)
    if info is None:
        return None
    limit = connection_limit(int(memo.get("watched_namespaces", 0)))
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env,
        trace_configs=[api_health_trace()])
    return kopf.AiohttpSession(aiohttp_session=session, server=info.server, priority=info.priority,
                               default_namespace=info.default_namespace, expiration=info.expiration)
