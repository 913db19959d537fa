"""Whether a Stack's state backend answers: a TCP connect to the address its URL names, nothing signed
(the operator need not hold the Stack's credentials; under the pod executor it never does).

An update whose backend goes away does not fail at once: the engine retries its checkpoint writes and
the update waits. Without a probe the Stack only says "stack is being processed" for as long as the
outage lasts."""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.parse

DEFAULT_PORTS = {"http": 80, "https": 443}


def backend_address(backend: str) -> tuple[str, int] | None:
    """(host, port) of the service keeping a backend URL's state, or None where there is none to probe
    (file://, a backend in the environment) or its address is not in the URL (azblob://)."""
    url = urllib.parse.urlsplit(backend)
    if url.scheme == "s3":
        query = urllib.parse.parse_qs(url.query)
        endpoint = (query.get("endpoint") or [""])[0]
        if endpoint:  # an S3-compatible store: http(s)://host:port, or host:port
            return _host_port(endpoint if "://" in endpoint else f"https://{endpoint}")
        region = (query.get("region") or [""])[0]
        return (f"s3.{region}.amazonaws.com" if region else "s3.amazonaws.com"), 443
    if url.scheme == "gs":
        return "storage.googleapis.com", 443
    if url.scheme in DEFAULT_PORTS:  # Pulumi Cloud, or a self-hosted service
        return _host_port(backend)
    return None


def _host_port(url: str) -> tuple[str, int] | None:
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme, 443)


async def unreachable(address: tuple[str, int], timeout: float = 5.0) -> str:
    """Why the address does not take a connection, or "" when it does."""
    host, port = address
    try:
        # Not asyncio.wait_for: on Python 3.11 it returns the connection when it is cancelled just as the
        # connection comes (or fails), swallowing the cancel; a backend watch cancelled then probed forever.
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except socket.gaierror as err:
        return f"{host} does not resolve ({err.strerror})"
    except OSError as err:
        return os.strerror(err.errno) if err.errno else str(err) or type(err).__name__
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return ""
