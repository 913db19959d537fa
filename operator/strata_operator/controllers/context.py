"""What every controller of the operator shares: its settings, the engine and Kubernetes client on the
memo (`Context`), the registry of live Stacks and what wakes each one, and the clock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import datetime, timezone
from typing import Any

import kopf

from ..api.sharding import Shard
from ..api.stack import MIN_RESYNC_SECONDS
from ..api.workspace_template import ReservedPlacement
from ..decisions.approval import APPROVE_ANNOTATION
from ..decisions.planning import DEFAULT_STALL_AFTER_FAILURES, Requests
from ..engine.pod.executor import WorkspaceSettings
from ..engine.port import Engine
from ..engine.process.executor import EngineSettings
from ..services.fair_slots import FairSlots
from ..services.kube import Kube, NamespaceNotServed
from ..services.metrics import MetricsServing
from ..sources.archive import DEFAULT_MAX_SOURCE_BYTES
from ..sources.work import SourceWork

RETRY_REFS_SECONDS = 30.0


def passes_in_flight(concurrency: int) -> int:
    """How many Stacks' reconcile passes run at once: the engine's slots and three times as many more
    (passes that need no run go through while updates queue). The rest wait before reading anything,
    holding nothing for their pass; the passes are shared fairly between namespaces, as the engine's
    slots are (a pass holds its own while its run waits for one of those)."""
    return max(32, 4 * concurrency)


@dataclasses.dataclass
class OperatorSettings:
    engine: EngineSettings = dataclasses.field(default_factory=EngineSettings)
    stall_after_failures: int = DEFAULT_STALL_AFTER_FAILURES
    min_resync_seconds: int = MIN_RESYNC_SECONDS
    allow_operator_refs: bool = False  # PKO v1's Env/FS refs read the operator's env/files
    # How often a running update's backend is probed (services/backend_probe.py); 0: never (an operator
    # whose egress may not reach the backends its workspace pods reach would report outages that are not).
    backend_probe_seconds: float = 10.0
    # The operator's own namespace (its pod's, else its kubeconfig context's): its Stacks are the platform's,
    # the backend probe's limits for a team's Stack (services/backend_probe.py) do not hold for them.
    own_namespace: str = ""
    metrics: MetricsServing = dataclasses.field(default_factory=MetricsServing)
    kubeconfig: str | None = None
    flux_events_address: str = ""  # Flux notification-controller event server; "" is off
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES  # --max-source-bytes: see sources.archive.SizeCap
    workspace: WorkspaceSettings | None = None  # the pod executor's settings; None: the process executor
    shard: Shard = dataclasses.field(default_factory=Shard)  # the objects this operator owns (all by default)

    @property
    def reserved_placement(self) -> ReservedPlacement:
        """What of a workspace pod's placement no template may set (none without workspace pods)."""
        return self.workspace.reserved if self.workspace is not None else ReservedPlacement()


@dataclasses.dataclass
class Watched:
    """What a live Stack depends on, so changes to those objects wake its daemon."""

    wakeup: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    program: str = ""
    flux: tuple[str, str] = ("", "")
    prerequisites: tuple[str, ...] = ()
    branch_head: tuple[str, float] = ("", 0.0)  # (sha, monotonic time of ls-remote)
    branch_key: tuple[Any, ...] = ()
    # Status fields this process wrote that the watch has not shown yet: a wakeup from another object
    # can arrive before our own patch's event, and planning on the stale status would re-run the update.
    pending: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What of the Stack's own object the last pass planned on (see `intent`): an event that changes
    # none of it (our own status writes) needs no pass.
    seen: tuple[Any, ...] = ()
    # Waiting for earlier waves of its Program's rollout: woken whenever a Stack of that Program changes.
    rollout_waiting: bool = False
    # The state backend (host:port) whose outage this Stack said (BackendUnreachable) and has not yet said
    # is over: a run that failed while it was away leaves it to the Stack's next run to say BackendReachable.
    backend_down: str = ""
    # The run (status.currentUpdate) that failed with its backend's outage: its recovery counts no failure.
    outage_run: str = ""


def intent(body: Any) -> tuple[Any, ...]:
    """What of a Stack object can call for a run: its spec (generation), the reconcile requests and an
    approval."""
    meta = body.get("metadata", {})
    annotations = meta.get("annotations") or {}
    return meta.get("generation"), Requests.of(annotations, None), annotations.get(APPROVE_ANNOTATION, "")


class Registry:
    def __init__(self) -> None:
        self.stacks: dict[tuple[str, str], Watched] = {}

    def wake(self, namespace: str, name: str, body: Any) -> None:
        watched = self.stacks.get((namespace, name))
        if watched is not None and intent(body) != watched.seen:
            watched.wakeup.set()

    def wake_where(self, namespace: str, predicate) -> None:
        for (ns, name), watched in self.stacks.items():
            if ns == namespace and predicate(watched):
                watched.wakeup.set()


@dataclasses.dataclass
class Context:
    kube: Kube
    engine: Engine
    settings: OperatorSettings
    registry: Registry = dataclasses.field(default_factory=Registry)
    # Every Stack's daemon starts a pass as soon as the Stack exists: unbounded, 1000 new Stacks are 1000
    # passes holding their spec, refs, Program and request for as long as the engine's queue takes.
    passes: FairSlots = dataclasses.field(default_factory=lambda: FairSlots(passes_in_flight(1)))
    sources: SourceWork = dataclasses.field(default_factory=SourceWork)  # git, artifacts: off the API's threads


def in_shard(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> bool:
    """Kopf's `when=` filter of the handlers that act on an object (run its updates, hold its finalizer,
    write its status): is it this operator's, by its shard's label selector? Handlers that only wake
    this operator's Stacks (a prerequisite in another shard changed) stay unfiltered."""
    settings: OperatorSettings | None = memo.get("operator_settings")
    return settings is None or settings.shard.owns(labels)


def owned(ctx: "Context", body: Any) -> bool:
    """The same question inside a handler that sees every object."""
    return ctx.settings.shard.owns((body.get("metadata") or {}).get("labels"))


async def woken(wakeup: asyncio.Event, seconds: float) -> None:
    """Wait until `wakeup` is set or `seconds` have passed. Not `asyncio.wait_for`: on Python 3.11 it can
    swallow the cancel that stops a loop waiting here, and the loop then runs on."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wakeup.wait()


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def stack_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


async def release(ctx: Context, namespace: str, key: str) -> None:
    """What the executor kept for an object beyond its owner's life (a workspace pod, its Secret), removed; in a
    terminating namespace, whose deletion takes the operator's Roles there, that deletion removes them itself."""
    try:
        await ctx.engine.release(key)
    except NamespaceNotServed:
        if not await ctx.kube.namespace_terminating(namespace):
            raise
