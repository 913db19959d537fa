"""Stack Events in Flux's event format, POSTed to Flux's notification-controller (`--flux-events-address`).

Flux controllers send every Kubernetes Event they record also as JSON to the notification-controller's
event server (fluxcd/pkg runtime/events.Recorder, the `eventv1beta1.Event` of fluxcd/pkg
apis/event): `involvedObject` (an ObjectReference), `severity` (`info` for Normal, `error` for
Warning), `timestamp`, `message`, `reason`, `metadata` (keys prefixed with the involved object's API
group: `pulumi.com/revision` here, plus the object's own `event.toolkit.fluxcd.io/*` annotations),
`reportingController` and `reportingInstance`. Alerts then route them to Providers like any Flux
object's events.

`build_flux_event` is the pure formatting; `FluxEventSink` delivers asynchronously: a bounded queue
drained by one task, a short timeout per POST, never blocking or failing a reconcile. A full queue
drops the event; a failed POST is logged once per run of failures (and once when delivery recovers).
Messages arrive here already redacted, as the Kubernetes Event's are; both are masked again on the way
out, with the Stack's namespace's secrets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from .redaction import LOG_REDACTOR, redactor_for

REPORTING_CONTROLLER = "strata-operator"
FLUX_EVENT_ANNOTATION_PREFIX = "event.toolkit.fluxcd.io/"
QUEUE_SIZE = 1000
POST_TIMEOUT_SECONDS = 5.0
MAX_MESSAGE = 1024

log = logging.getLogger(__name__)


def _timestamp(now: datetime) -> str:
    """metav1.Time's JSON form: RFC 3339 in UTC, whole seconds."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_flux_event(body: Mapping[str, Any], reason: str, message: str, *, warning: bool = False,
                     revision: str = "", now: datetime, instance: str,
                     controller: str = REPORTING_CONTROLLER) -> dict[str, Any] | None:
    """The JSON body Flux's notification-controller accepts for one Event about `body` (a Stack).

    None when the object lacks what the event server needs to route it (kind, name, namespace),
    as Flux's recorder refuses those too.
    """
    meta = body.get("metadata") or {}
    api_version = body.get("apiVersion") or ""
    kind, name, namespace = body.get("kind") or "", meta.get("name") or "", meta.get("namespace") or ""
    if not (kind and name and namespace):
        return None
    involved = {"kind": kind, "namespace": namespace, "name": name, "uid": meta.get("uid") or "",
                "apiVersion": api_version, "resourceVersion": meta.get("resourceVersion") or ""}
    involved = {k: v for k, v in involved.items() if v}
    group = api_version.split("/")[0] if "/" in api_version else ""
    redactor = redactor_for(namespace)
    metadata = {key: redactor.redact(str(value)) for key, value in (meta.get("annotations") or {}).items()
                if key.startswith(FLUX_EVENT_ANNOTATION_PREFIX)}
    if revision and group:
        metadata[f"{group}/revision"] = revision
    event: dict[str, Any] = {
        "involvedObject": involved,
        "severity": "error" if warning else "info",
        "timestamp": _timestamp(now),
        "message": redactor.redact(message)[:MAX_MESSAGE],
        "reason": reason,
        "reportingController": controller,
        "reportingInstance": instance,
    }
    if metadata:
        event["metadata"] = metadata
    return event


Post = Callable[[str, dict[str, Any]], Any]  # async (url, event) -> HTTP status


async def _aiohttp_post(url: str, event: dict[str, Any]) -> int:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url, json=event) as response:
            return response.status


class FluxEventSink:
    """Delivers events to one address in the background; `publish` never blocks and never raises."""

    def __init__(self, address: str, post: Post | None = None, queue_size: int = QUEUE_SIZE):
        self.address = address
        self._post = post or _aiohttp_post
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task | None = None
        self._failing = False
        self._dropping = False
        self.delivered = 0
        self.failed = 0
        self.dropped = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flux-events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def publish(self, event: dict[str, Any] | None) -> None:
        if event is None:
            return
        try:
            self._queue.put_nowait(event)
            self._dropping = False
        except asyncio.QueueFull:
            self.dropped += 1
            if not self._dropping:
                self._dropping = True
                log.warning("Flux events: queue full (%d waiting for %s); dropping events until it drains",
                            self._queue.qsize(), self.address)

    async def drain(self) -> None:
        """Wait until every queued event was tried (for tests and shutdown)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._deliver(event)
            finally:
                self._queue.task_done()

    async def _deliver(self, event: dict[str, Any]) -> None:
        try:
            status = await asyncio.wait_for(self._post(self.address, event), timeout=POST_TIMEOUT_SECONDS + 1)
            problem = None if (200 <= status < 300 or status == 429) else f"HTTP {status}"
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - delivery is best effort, whatever the cause
            problem = LOG_REDACTOR.redact(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
        if problem is None:
            # 429 is the event server's rate limit on duplicates: the same event already arrived.
            self.delivered += 1
            if self._failing:
                self._failing = False
                log.info("Flux events: delivering to %s again", self.address)
            return
        self.failed += 1
        if not self._failing:
            self._failing = True
            log.warning("Flux events: cannot deliver to %s (%s); dropping events until it answers "
                        "(logged once)", self.address, problem)


def check_address(address: str) -> str:
    """The address as given, or ValueError naming what is wrong with it ("" means off)."""
    from urllib.parse import urlsplit

    if not address:
        return ""
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--flux-events-address {address!r}: give the notification-controller's event server "
                         "as an http(s) URL, e.g. http://notification-controller.flux-system.svc.cluster.local./")
    return address
