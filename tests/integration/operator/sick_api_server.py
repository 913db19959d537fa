"""A loopback HTTPS proxy in front of the platform's kube-apiserver that a test makes sick: every request
answered 500 (open watches cut), then healthy again. It serves the apiserver's own certificate (valid
for 127.0.0.1) and forwards each request with its own Authorization header, so a kubeconfig only changes
its server's port. It counts the requests it sees, by second."""

from __future__ import annotations

import asyncio
import collections
import ssl
import threading
import time
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
SICK = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "the test made this server sick",
        "reason": "InternalError", "code": 500}


class SickApiServer:
    def __init__(self, upstream: str, pki: Path):
        self.upstream, self.pki = upstream.rstrip("/"), pki
        self.sick = False
        self.requests: collections.Counter[int] = collections.Counter()  # monotonic second -> requests
        self.loop = asyncio.new_event_loop()
        self.streams: set[asyncio.Task] = set()
        self.port = 0

    def start(self) -> int:
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True, name="sick-api-server").start()
        ready.wait(10)
        return self.port

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        ready.set()
        self.loop.run_forever()

    async def _serve(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream_tls),
                                             timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        served_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served_tls.load_cert_chain(self.pki / "apiserver.crt", self.pki / "apiserver.key")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=served_tls)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests[int(time.monotonic())] += 1
        if self.sick:
            return web.json_response(SICK, status=500)
        task = asyncio.current_task()
        self.streams.add(task)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            body = await request.read()  # none for a GET: aiohttp would give b"" a Content-Type, refused (415)
            async with self.session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                            data=body or None) as answer:
                response = web.StreamResponse(status=answer.status, headers={
                    k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS})
                await response.prepare(request)
                async for chunk in answer.content.iter_any():  # watches stream until the server gets sick
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            self.streams.discard(task)

    def make_sick(self) -> None:
        """Answer 500 from now on, and cut every stream open now (its client reconnects into the 500s)."""
        def cut() -> None:
            self.sick = True
            for task in list(self.streams):
                task.cancel()

        self.loop.call_soon_threadsafe(cut)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "sick", False)

    def rate(self, start: float, end: float) -> float:
        """Requests per second seen in [start, end) (monotonic seconds)."""
        seconds = range(int(start), int(end))
        return sum(self.requests[s] for s in seconds) / max(1, len(seconds))

    def stop(self) -> None:
        async def close() -> None:
            for task in list(self.streams):  # watches forwarded from the apiserver outlive their client
                task.cancel()
            await self.runner.cleanup()
            await self.session.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
