"""`strata console`: the web console, on loopback, acting with the user's own kubeconfig.

Pages are rendered on the server (Starlette, Jinja2) from the watch-fed Store; htmx (from npm, served
from this package's `web/node_modules`, never a CDN) swaps fragments: the overview's rows as its
event stream sends them, and each action's answer. Every action is one of `strata`'s own commands'
API calls (stackctl), made as the user: what RBAC refuses is shown with the API server's message.

Only whoever holds the URL printed at start may use it: other users of this host reach loopback
too, and the console acts with your credentials. The URL's token becomes a cookie (HttpOnly,
SameSite=Strict) named for the console's port, as Jupyter names its own: a browser keeps cookies per host,
not per port, so under one name the consoles on 127.0.0.1 (another user's, or your other platform's)
overwrote each other's session and each read the other's token. The browser still sends it to any port of
127.0.0.1 it is pointed at: open only the URL `strata console` printed for you. Actions also need htmx's
`HX-Request` header, which a cross-site form cannot send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import sys
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import stackctl
from . import models
from .store import Store

HERE = Path(__file__).parent
VENDOR = HERE / "web" / "node_modules"
VENDOR_FILES = {"htmx.min.js": VENDOR / "htmx.org" / "dist" / "htmx.min.js",
                "sse.min.js": VENDOR / "htmx-ext-sse" / "dist" / "sse.min.js"}
COOKIE_PREFIX = "strata_console_"
# Changes arriving within this window go out as one event (a fleet's burst of status writes).
BATCH_SECONDS = 0.05


class ConsoleError(Exception):
    """The console cannot start; the message says why and what to do."""


def missing_assets() -> list[str]:
    return [str(path) for path in VENDOR_FILES.values() if not path.is_file()]


def cookie_name(port: int) -> str:
    """The session cookie of the console on `port`: a host's cookies go to all its ports, so under one name
    for every console each would overwrite and read the others'."""
    return f"{COOKIE_PREFIX}{port}"


def same_token(given: str, token: str) -> bool:
    """Whether `given` is the session's token, in time that does not tell how much of it matched
    (as bytes: compare_digest refuses str with non-ASCII characters, which anyone may send)."""
    return hmac.compare_digest(given.encode(), token.encode())


class Console:
    """The app's state: the user's cluster, the store, the templates, the token and the cookie that carries it."""

    def __init__(self, cluster: stackctl.Cluster, state_dirs: list[Path], port: int, token: str | None = None) -> None:
        self.cluster = cluster
        self.state_dirs = state_dirs
        self.token = token or secrets.token_urlsafe(24)
        self.cookie = cookie_name(port)
        self.store: Store | None = None
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
        self.templates.globals["dom_id"] = models.dom_id

    # -- rendering ----------------------------------------------------------------------------------

    def render(self, name: str, request: Request | None = None, status_code: int = 200, **context: Any) -> HTMLResponse:
        page = self.templates.get_template(name).render(server=self.cluster.server, store=self.store,
                                                        path=request.url.path if request else "", **context)
        return HTMLResponse(page, status_code=status_code)

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    async def objects(self) -> dict[str, list[dict[str, Any]]]:
        assert self.store is not None
        await asyncio.to_thread(self.store.ready.wait, 30)
        return self.store.snapshot()

    # -- pages --------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        filters = _filters(request)
        view = models.overview(await self.objects(), filters, self.now())
        return self.render("overview.html", request, view=view, filters=filters, states=models.STATES,
                           kinds=[k.kind for k in models.KINDS])

    async def overview_events(self, request: Request) -> Response:
        """Server-sent events: the rows of the objects that changed (htmx out-of-band swaps), and the counts."""
        filters = _filters(request)
        assert self.store is not None
        queue: asyncio.Queue[set[str]] = asyncio.Queue()
        self.store.listeners.add(queue.put_nowait)

        async def stream():
            try:
                yield ": connected\n\n"
                while True:
                    try:
                        changed = await asyncio.wait_for(queue.get(), 15)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    await asyncio.sleep(BATCH_SECONDS)
                    while not queue.empty():
                        changed |= queue.get_nowait()
                    fragment = self.changed_rows(changed, filters)
                    yield "event: rows\n" + "".join(f"data: {line}\n" for line in fragment.splitlines()) + "\n"
            finally:
                self.store.listeners.discard(queue.put_nowait)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def changed_rows(self, changed: set[str], filters: models.Filters) -> str:
        assert self.store is not None
        objects = self.store.snapshot()
        view = models.overview(objects, filters, self.now())
        shown = {row.key: row for row in view.rows}
        return self.templates.get_template("rows_update.html").render(
            rows=[shown[k] for k in sorted(changed) if k in shown],
            gone=[models.dom_id(k) for k in sorted(changed) if k not in shown], view=view, states=models.STATES)

    async def stack(self, request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        try:
            stack = await asyncio.to_thread(self.cluster.get_stack, namespace, name)
        except stackctl.StackCtlError as error:
            return self.render("error.html", request, title=f"Stack {namespace}/{name}", message=str(error),
                               status_code=404)
        try:
            events, events_error = await asyncio.to_thread(self.cluster.stack_events, namespace, name), ""
        except stackctl.StackCtlError as error:
            events, events_error = [], str(error)
        try:
            log, log_error = await asyncio.to_thread(stackctl.read_update_log, self.cluster, namespace, name,
                                                     self.state_dirs), ""
        except stackctl.StackCtlError as error:
            log, log_error = {}, str(error)
        page = models.stack_page(stack, events, self.now())
        return self.render("stack.html", request, page=page, log=log, log_error=log_error, events_error=events_error)

    async def approvals(self, request: Request) -> Response:
        plans = models.pending_plans((await self.objects())["Stack"])
        return self.render("approvals.html", request, plans=plans)

    async def plan(self, request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        try:
            stack = await asyncio.to_thread(self.cluster.get_stack, namespace, name)
        except stackctl.StackCtlError as error:
            return self.render("error.html", request, status_code=404, title=f"Stack {namespace}/{name}",
                               message=str(error))
        pending = models.pending_plans([stack])
        changes, problem = [], ""
        if pending:
            try:
                changes = models.plan_changes(await asyncio.to_thread(self.saved_plan, stack))
            except stackctl.StackCtlError as error:
                problem = str(error)
        return self.render("plan.html", request, stack=stack, pending=pending[0] if pending else None,
                           changes=changes, problem=problem)

    def saved_plan(self, stack: dict[str, Any]) -> bytes:
        """The plan bytes from the Stack's plan Secrets (read as the user), checked against its digest."""
        from strata_operator.decisions.approval import plan_digest, plan_secret_name

        meta, saved = stack["metadata"], stack["status"]["plan"]
        parts = [self.cluster.secret_data(meta["namespace"], plan_secret_name(meta["name"], index))
                 for index in range(int(saved.get("secrets") or 1))]
        plan = b"".join(part.get("plan", b"") for part in parts)
        if plan_digest(plan) != saved["digest"]:
            raise stackctl.StackCtlError(f"the plan Secrets of Stack {meta['namespace']}/{meta['name']} do not hold "
                                         f"plan {saved['digest']} (replaced or tampered with): the operator will "
                                         "preview a new one; approving this digest applies nothing")
        return plan

    async def layers(self, request: Request) -> Response:
        namespace = request.query_params.get("namespace", "")
        objects = await self.objects()
        graph = models.layers(objects, namespace)
        return self.render("layers.html", request, graph=graph, namespace=namespace,
                           namespaces=sorted({s["metadata"]["namespace"] for s in objects["Stack"]}))

    async def rollouts(self, request: Request) -> Response:
        objects = await self.objects()
        rollouts = [models.rollout(program, objects["Stack"]) for program in objects["Program"]
                    if program.get("rollout")]
        return self.render("rollouts.html", request, rollouts=sorted(rollouts, key=lambda r: (r.namespace, r.name)))

    async def rollout(self, request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        objects = await self.objects()
        program = self.store.get("Program", namespace, name) if self.store else None
        if program is None:
            return self.render("error.html", request, status_code=404, title=f"Program {namespace}/{name}",
                               message=f"Program {namespace}/{name} not found, or not visible to you")
        return self.render("rollout.html", request, rollout=models.rollout(program, objects["Stack"]))

    # -- actions: the CLI's own calls -------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        if request.headers.get("HX-Request") != "true":
            return PlainTextResponse("actions are sent by the console's page", status_code=400)
        namespace, name, action = (request.path_params[k] for k in ("namespace", "name", "action"))
        # htmx posts the form urlencoded; read here (Starlette's form parser needs python-multipart).
        digest = urllib.parse.parse_qs((await request.body()).decode()).get("digest", [""])[0]
        if action == "approve" and not digest:
            return PlainTextResponse("approve needs the digest of the plan on screen", status_code=400)
        calls = {
            "suspend": lambda: stackctl.request_suspend(self.cluster, namespace, name) and "suspended",
            "resume": lambda: f"resumed (generation {stackctl.request_resume(self.cluster, namespace, name)})",
            "reconcile": lambda: f"reconcile requested ({stackctl.request_reconcile(self.cluster, namespace, name)})",
            "approve": lambda: "approved plan " + stackctl.approve_plan(
                self.cluster, namespace, name, digest)["digest"] + ": the operator applies it now",
        }
        if action not in calls:
            return PlainTextResponse(f"unknown action {action}", status_code=404)
        try:
            said = await asyncio.to_thread(calls[action])
        except stackctl.StackCtlError as error:
            return self.render("action_result.html", request, ok=False, message=str(error))
        return self.render("action_result.html", request, ok=True, message=f"Stack {namespace}/{name}: {said}")

    async def asset(self, request: Request) -> Response:
        path = VENDOR_FILES.get(request.path_params["file"])
        if path is None or not path.is_file():
            return PlainTextResponse("not found", status_code=404)
        return Response(path.read_bytes(), media_type="text/javascript",
                        headers={"Cache-Control": "max-age=3600"})


def _filters(request: Request) -> models.Filters:
    query = request.query_params
    state = query.get("state", "")
    return models.Filters(namespace=query.get("namespace", ""), state=state if state in models.STATES else "",
                          kind=query.get("kind", ""))


class TokenGate(BaseHTTPMiddleware):
    """The printed URL's token, once, becomes the session cookie; nothing is served without it."""

    def __init__(self, app: Any, console: Console) -> None:
        super().__init__(app)
        self.console = console

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        token = request.query_params.get("token")
        if token is not None and same_token(token, self.console.token):
            query = "&".join(f"{k}={v}" for k, v in request.query_params.multi_items() if k != "token")
            response = RedirectResponse(request.url.path + (f"?{query}" if query else ""), status_code=303)
            response.set_cookie(self.console.cookie, self.console.token, path="/", httponly=True, samesite="strict")
            return response
        if not same_token(request.cookies.get(self.console.cookie, ""), self.console.token):
            return PlainTextResponse("Open the URL `strata console` printed (it carries this session's token).",
                                     status_code=403)
        return await call_next(request)


def build_app(console: Console) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        console.store = Store(console.cluster, asyncio.get_running_loop())
        console.store.start()
        try:
            yield
        finally:
            console.store.stop()

    routes = [
        Route("/", console.overview),
        Route("/events/overview", console.overview_events),
        Route("/stacks/{namespace}/{name}", console.stack),
        Route("/stacks/{namespace}/{name}/{action}", console.act, methods=["POST"]),
        Route("/approvals", console.approvals),
        Route("/approvals/{namespace}/{name}", console.plan),
        Route("/layers", console.layers),
        Route("/rollouts", console.rollouts),
        Route("/rollout/{namespace}/{name}", console.rollout),
        Route("/vendor/{file}", console.asset),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TokenGate, console=console)],
                     lifespan=lifespan)


def serve(cluster: stackctl.Cluster, port: int, state_dirs: list[Path], say=print) -> None:
    """Serve on 127.0.0.1:`port` (0: a free one) until interrupted; print the URL once listening."""
    import socket

    import uvicorn

    missing = missing_assets()
    if missing:
        raise ConsoleError(f"the console's client library is not installed ({', '.join(missing)}): run `make setup` "
                           f"(it runs `npm ci --prefix {HERE / 'web'}`)")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as error:
        raise ConsoleError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({error.strerror}); pick another "
                           "port, or 0 for a free one") from None
    listener.listen(128)  # a browser opening the printed URL at once waits in the backlog until uvicorn accepts
    bound = listener.getsockname()[1]
    console = Console(cluster, state_dirs, bound)
    # No access log: the first request's URL carries the token.
    config = uvicorn.Config(build_app(console), log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2)  # open event streams never end by themselves
    server = uvicorn.Server(config)
    say(f"Strata console for {cluster.server} (as your kubeconfig's user): "
        f"http://127.0.0.1:{bound}/?token={console.token}")
    sys.stdout.flush()
    server.run(sockets=[listener])
