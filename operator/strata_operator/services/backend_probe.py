"""Whether a Stack's state backend answers: a TCP connect to the address its URL names, nothing signed
(the operator need not hold the Stack's credentials; under the pod executor it never does).

An update whose backend goes away does not fail at once: the engine retries its checkpoint writes and
the update waits. Without a probe the Stack only says "stack is being processed" for as long as the
outage lasts.

The address is the team's to choose, and the probe connects from the operator's network, which may reach
what the team's own pods do not: unlimited, it would be a port scanner into that network. So, for a Stack
outside the operator's own namespace (a team's; the operator's namespace holds the platform's):

- the probe connects only to the addresses the backend's host resolves to, checked first, and never when one
  of them is link-local (169.254.0.0/16, where clouds serve instance metadata and credentials; fe80::/10),
  another known metadata address, unspecified, multicast or reserved; nor loopback unless the Stack's updates
  run in the operator's own network (the process executor), where they reach that same loopback themselves.
  Such a backend is never probed and nothing is said of it, as with the probe off;
- the Stack is told only that its backend does not answer, never why (refused, timed out, not resolved),
  and a quick refusal is said no sooner than a timeout, so neither the words nor their timing tell a closed
  port from a filtered one.

The probe only runs for the Stack's own backend, while its own run lasts or waits on that backend; the
engine's own error, from where the update runs, says the cause to the team.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import socket
import urllib.parse

DEFAULT_PORTS = {"http": 80, "https": 443}
# Metadata services outside the link-local range: AWS's over IPv6, Alibaba's, Azure's wire server.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "168.63.129.16"))
# What a team's Stack is told instead of the cause.
UNSAID = "no connection"


@dataclasses.dataclass(frozen=True)
class ProbeScope:
    """What the probe may do for one Stack."""

    platform: bool
    """The Stack is in the operator's own namespace: any address, and the cause said."""
    shares_loopback: bool
    """The Stack's updates run in the operator's own network (the process executor)."""


def forbidden_address(ip: str, scope: ProbeScope) -> bool:
    """Whether the probe may not connect to `ip` for a Stack of `scope`."""
    if scope.platform:
        return False
    address = ipaddress.ip_address(ip.split("%", 1)[0])  # an IPv6 scope id (fe80::1%eth0) names no other address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return not scope.shares_loopback
    return (address.is_link_local or address.is_unspecified or address.is_multicast or address.is_reserved
            or address in METADATA_ADDRESSES)


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


async def unreachable(address: tuple[str, int], scope: ProbeScope, timeout: float = 5.0) -> str:
    """Why the address does not take a connection (for a team's Stack only UNSAID), or "" when it does or
    when it may not be probed for a Stack of `scope` (nothing is then said of it)."""
    host, port = address
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        # Not asyncio.wait_for: on Python 3.11 it returns the connection when it is cancelled just as the
        # connection comes (or fails), swallowing the cancel; a backend watch cancelled then probed forever.
        async with asyncio.timeout(timeout):
            found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            # Connected to as resolved and checked here: a second lookup could answer another address.
            ips = list(dict.fromkeys(str(info[4][0]) for info in found))
            if any(forbidden_address(ip, scope) for ip in ips):
                return ""
            writer = await _connect(ips, port)
    except TimeoutError:
        problem = f"no answer within {timeout:g}s"
    except socket.gaierror as err:
        problem = f"{host} does not resolve ({err.strerror})"
    except OSError as err:
        problem = os.strerror(err.errno) if err.errno else str(err) or type(err).__name__
    else:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return ""
    if scope.platform:
        return problem
    await asyncio.sleep(max(0.0, deadline - loop.time()))  # a refusal takes as long as a timeout
    return UNSAID


async def _connect(ips: list[str], port: int) -> asyncio.StreamWriter:
    """A connection to the first of `ips` that takes one; the last refusal if none does."""
    for ip in ips[:-1]:
        try:
            return (await asyncio.open_connection(ip, port))[1]
        except OSError:
            continue
    return (await asyncio.open_connection(ips[-1], port))[1]
