"""The node gateway: forwards addresses pods can reach to services listening on the host's loopback.

The local control plane listens on 127.0.0.1 only, which a pod's network namespace cannot reach, and
there is no kube-proxy to route the `kubernetes` Service. On real nodes this process listens on the
Service's ClusterIP (10.96.0.1:443, held by the pods' bridge) and on the bridge gateway for the git
server, and copies bytes both ways: TLS stays end to end between the client and the apiserver.

    python -m strata_components.local.gateway --forward 10.96.0.1:443=127.0.0.1:6443 [...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

log = logging.getLogger("strata.gateway")


def parse_forward(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """`LISTEN_HOST:PORT=TARGET_HOST:PORT` -> ((host, port), (host, port))."""
    try:
        listen, target = text.split("=", 1)
        (listen_host, listen_port), (target_host, target_port) = (part.rsplit(":", 1) for part in (listen, target))
        return (listen_host, int(listen_port)), (target_host, int(target_port))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--forward {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT") from None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(forwards: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    servers = []
    for (listen_host, listen_port), (target_host, target_port) in forwards:
        async def handle(reader, writer, target=(target_host, target_port)):
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*target)
            except OSError as error:
                log.warning("cannot reach %s:%s: %s", *target, error)
                writer.close()
                return
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

        servers.append(await asyncio.start_server(handle, listen_host, listen_port))
        log.info("forwarding %s:%s -> %s:%s", listen_host, listen_port, target_host, target_port)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward", type=parse_forward, action="append", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    asyncio.run(_serve(args.forward))


if __name__ == "__main__":
    main()
