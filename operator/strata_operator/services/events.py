"""Events on the objects the operator runs, redacted; with `--flux-events-address`, every Stack Event
also goes to Flux's notification-controller in Flux's own format (flux_events.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from datetime import datetime, timezone
from typing import Any

import kopf

from . import flux_events
from .redaction import redactor_for

HOST = socket.gethostname()

# Set at startup when --flux-events-address is given: every Stack Event also goes to Flux, in its format.
FLUX_EVENTS: flux_events.FluxEventSink | None = None


def post_event(body: Any, reason: str, message: str, warning: bool = False, revision: str = "",
               to_flux: bool = True) -> None:
    """A Kubernetes Event on `body`, its message masked with its namespace's secrets and cut to 1024
    characters; also sent to Flux unless `to_flux` is false (PKO v2's Workspaces and Updates)."""
    message = redactor_for(body["metadata"]["namespace"]).redact(message)[:1024]
    kopf.event(body, type="Warning" if warning else "Normal", reason=reason, message=message)
    if FLUX_EVENTS is not None and to_flux:
        FLUX_EVENTS.publish(flux_events.build_flux_event(body, reason, message, warning=warning, revision=revision,
                                                         now=datetime.now(timezone.utc), instance=HOST))


def start_flux_events(address: str) -> None:
    global FLUX_EVENTS
    FLUX_EVENTS = flux_events.FluxEventSink(address)
    FLUX_EVENTS.start()


async def stop_flux_events() -> None:
    global FLUX_EVENTS
    sink, FLUX_EVENTS = FLUX_EVENTS, None
    if sink is not None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(sink.drain(), timeout=3)  # the last events (e.g. a failure) still go out
        await sink.stop()
