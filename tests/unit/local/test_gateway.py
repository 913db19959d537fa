"""The node gateway copies bytes both ways between an address pods reach and a loopback service."""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from strata_components.local import gateway


def test_forward_specs_parse_and_bad_ones_name_the_expected_form():
    assert gateway.parse_forward("10.96.0.1:443=127.0.0.1:6443") == (("10.96.0.1", 443), ("127.0.0.1", 6443))
    with pytest.raises(argparse.ArgumentTypeError, match="LISTEN_HOST:PORT=TARGET_HOST:PORT"):
        gateway.parse_forward("10.96.0.1:443")


def test_bytes_flow_both_ways_through_the_gateway():
    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    async def scenario() -> bytes:
        async def echo(reader, writer):
            writer.write(b"echo:" + await reader.readline())
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        target_port = upstream.sockets[0].getsockname()[1]
        listen_port = free_port()
        serving = asyncio.create_task(gateway._serve([(("127.0.0.1", listen_port), ("127.0.0.1", target_port))]))
        for _ in range(50):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", listen_port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        writer.write(b"ping\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        serving.cancel()
        upstream.close()
        return answer

    assert asyncio.run(scenario()) == b"echo:ping\n"
