"""Watch the dev stack's Stacks (and Flux's Kustomizations) until they are all Ready (`make up`) or
gone (`make down`).

The pure part reads an object into a `StackState` and compares two snapshots, so each change is one
progress line and the verdict (done, failed, still waiting) is a function of what was seen; `watch`
polls the API server and prints those lines. The objects' own kstatus conditions decide: Ready=True
is done, Stalled=True is a failure that needs a person, anything else is progress. Stacks are keyed
`namespace/name`, other kinds `kind namespace/name`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from .progress import Say, format_seconds, stderr_say

# Two LISTs of a local API server a poll: cheap, and `make up` ends within half a second of the last Ready.
POLL_SECONDS = 0.5
# An API server that does not answer for this long is said so (a restart, or the end of `make down`, is quiet).
API_PATIENCE = 10.0
STACKS = ("pulumi.com", "v1", "stacks")
KUSTOMIZATIONS = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations")
GIT_REPOSITORIES = ("source.toolkit.fluxcd.io", "v1", "gitrepositories")
# A Stack whose destroy failed (its finalizer is kept): a person must decide.
DESTROY_BLOCKED = "DestroyBlocked"

State = Literal["Missing", "Pending", "Reconciling", "NotReady", "Ready", "Stalled", "Deleting"]


@dataclasses.dataclass(frozen=True)
class StackState:
    """What one Stack shows: its state, the reason and message of the condition that says so."""

    key: str  # namespace/name
    state: State
    reason: str = ""
    message: str = ""

    def line(self) -> str:
        detail = f" ({self.reason})" if self.reason else ""
        text = f"  {self.key}: {self.state}{detail}"
        if self.message and self.state in ("Stalled", "Reconciling", "NotReady", "Deleting", "Pending"):
            text += f": {_shorten(self.message)}"
        return text


def _shorten(message: str, limit: int = 240) -> str:
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def stack_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    kind = obj.get("kind", "Stack")
    return where if kind == "Stack" else f"{kind.lower()} {where}"


# The Stalled reasons the operator's finalizer writes (strata_operator.api.status): the destroy cannot go on.
DESTROY_STALLS = frozenset({"DestroyBlocked", "NamespaceTerminating"})


def stack_state(obj: Mapping[str, Any]) -> StackState:
    """The state an object shows, from its kstatus conditions (and deletionTimestamp)."""
    key = stack_key(obj)
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
    deletion = obj.get("metadata", {}).get("deletionTimestamp") or ""
    deleting = bool(deletion)
    for kind in ("Stalled", "Reconciling"):
        condition = conditions.get(kind)
        if condition and condition.get("status") == "True":
            # A deleting Stack's stall is about its destroy only when the finalizer wrote it (its reasons);
            # any other (its Flux source pruned first, seen by a pass that began before the deletion,
            # possibly written a moment after it) is about the live Stack: the destroy has yet to say how it goes.
            stale = kind == "Stalled" and deleting and (condition.get("reason") not in DESTROY_STALLS
                                                        or (condition.get("lastTransitionTime") or "") < deletion)
            state: State = "Deleting" if deleting and (kind == "Reconciling" or stale) else kind  # type: ignore
            return StackState(key, state, condition.get("reason", ""), condition.get("message", ""))
    if deleting:
        return StackState(key, "Deleting", "", "waiting for its controller to finalize it")
    ready = conditions.get("Ready")
    if ready and ready.get("status") == "True":
        return StackState(key, "Ready", ready.get("reason", ""))
    if ready:
        return StackState(key, "NotReady", ready.get("reason", ""), ready.get("message", ""))
    return StackState(key, "Pending", "", PENDING)


def snapshot(objects: Iterable[Mapping[str, Any]], expected: Iterable[str] = ()) -> dict[str, StackState]:
    """Every Stack seen, plus each expected one that does not exist (yet)."""
    states = {state.key: state for state in map(stack_state, objects)}
    for key in expected:
        states.setdefault(key, StackState(key, "Missing", "", "not created yet"))
    return states


PENDING = "not yet picked up by its controller"


@dataclasses.dataclass(frozen=True)
class OperatorView:
    """What says whether the local operator handles Stacks now: its process and the leader Lease."""

    pid: int | None
    """The operator's process, None when it does not run."""
    last_line: str
    """Its log's last line (what it said before it stopped)."""
    log: str
    lease: str
    """namespace/name of the leader Lease."""
    holder: str = ""
    renewed_seconds_ago: float | None = None
    """Since the Lease's renewTime; None when there is no Lease."""
    duration_seconds: float = 15.0


def operator_blocker(view: OperatorView, hostname: str) -> str:
    """Why the operator handles no Stacks now, or "" when it leads (its identity is hostname_pid)."""
    if view.pid is None:
        # Its last words last: the progress line is cut at its end, never the log's path.
        said = f"; it last said: {_shorten(view.last_line, 160)}" if view.last_line else ""
        return f"the operator is not running (log: {view.log}; `make up` starts it again){said}"
    if view.holder == f"{hostname}_{view.pid}":
        return ""
    if view.holder and view.renewed_seconds_ago is not None and view.renewed_seconds_ago < view.duration_seconds:
        return (f"the operator (pid {view.pid}) is standing by: the Lease {view.lease} is held by {view.holder}, "
                f"renewed {view.renewed_seconds_ago:.0f} s ago (log: {view.log})")
    return f"the operator (pid {view.pid}) has not taken the Lease {view.lease} yet (log: {view.log})"


def explain_pending(states: Mapping[str, StackState], why: str) -> dict[str, StackState]:
    """Pending Stacks say `why` (the operator's state) instead of the generic message; others stay."""
    if not why:
        return dict(states)
    return {key: dataclasses.replace(state, message=why) if state.state == "Pending" and " " not in key else state
            for key, state in states.items()}


def changes(before: Mapping[str, StackState], after: Mapping[str, StackState]) -> list[str]:
    """One line per Stack whose state, reason or message changed, and one per Stack that went away."""
    lines = [state.line() for key, state in sorted(after.items()) if before.get(key) != state]
    lines += [f"  {key}: gone" for key in sorted(before) if key not in after]
    return lines


@dataclasses.dataclass(frozen=True)
class Verdict:
    done: bool
    failed: list[StackState] = dataclasses.field(default_factory=list)


def ready_verdict(states: Mapping[str, StackState]) -> Verdict:
    """Done when every Stack is Ready; failed when one is Stalled (it waits for a person)."""
    stalled = [s for s in states.values() if s.state == "Stalled"]
    if stalled:
        return Verdict(False, stalled)
    return Verdict(bool(states) and all(s.state == "Ready" for s in states.values()))


def gone_verdict(states: Mapping[str, StackState]) -> Verdict:
    """Done when no Stack is left; failed when one being deleted is Stalled (its destroy failed)."""
    blocked = [s for s in states.values() if s.state == "Stalled"]
    return Verdict(not states, blocked)


class StackReader:
    """Lists the Stacks of a cluster (or of one namespace) with an admin kubeconfig."""

    def __init__(self, kubeconfig: Path, namespace: str | None = None):
        from kubernetes import client, config

        self._api = config.new_client_from_config(config_file=str(kubeconfig))
        self.custom = client.CustomObjectsApi(self._api)
        self.namespace = namespace

    def _list(self, resource: tuple[str, str, str]) -> list[dict[str, Any]]:
        from kubernetes import client

        group, version, plural = resource
        try:
            if self.namespace:
                found = self.custom.list_namespaced_custom_object(group, version, self.namespace, plural)
            else:
                found = self.custom.list_cluster_custom_object(group, version, plural)
        except client.ApiException as error:
            if error.status == 404:  # that API is not installed (yet)
                return []
            raise
        kind = found.get("kind", "").removesuffix("List")
        return [{"kind": kind, **item} for item in found["items"]]

    def list(self) -> list[dict[str, Any]]:
        """The Stacks."""
        return self._list(STACKS)

    def list_with_flux(self) -> list[dict[str, Any]]:
        """The Stacks and Flux's Kustomizations."""
        return [*self._list(STACKS), *self._list(KUSTOMIZATIONS)]

    def flux_sources_and_kustomizations(self) -> list[dict[str, Any]]:
        return [*self._list(GIT_REPOSITORIES), *self._list(KUSTOMIZATIONS)]

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A coordination.k8s.io Lease's spec, None if there is none."""
        from kubernetes import client

        try:
            found = client.CoordinationV1Api(self._api).read_namespaced_lease(name, namespace, _request_timeout=5)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return self._api.sanitize_for_serialization(found).get("spec") or {}

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods of a namespace that `label_selector` selects, as plain data."""
        from kubernetes import client

        found = client.CoreV1Api(self._api).list_namespaced_pod(namespace, label_selector=label_selector,
                                                                 _request_timeout=5)
        return self._api.sanitize_for_serialization(found).get("items") or []

    def get(self, key: str) -> dict[str, Any]:
        namespace, name = key.split("/", 1)
        return self.custom.get_namespaced_custom_object(*STACKS[:2], namespace, STACKS[2], name)

    def remove_finalizers(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        self.custom.patch_namespaced_custom_object(*STACKS[:2], namespace, STACKS[2], name,
                                                   {"metadata": {"finalizers": None}})

    def close(self) -> None:
        self._api.close()


def watch(list_stacks: Callable[[], list[dict[str, Any]]], verdict_of: Callable[[Mapping[str, StackState]], Verdict],
          *, expected: Iterable[str] = (), timeout: float, say: Say = stderr_say, heartbeat: float = 60.0,
          stop: Callable[[], bool] = lambda: False,
          blocker: Callable[[], str] = lambda: "") -> tuple[Verdict, dict[str, StackState]]:
    """Poll until the verdict is done or failed, `stop()` says so, or `timeout` passes; a line for each
    change and a reminder of who is still waiting every `heartbeat` seconds. Returns the last verdict.
    `blocker()` says why no controller picks Stacks up (see operator_blocker); Pending ones say it."""
    expected = list(expected)
    started = last_said = time.monotonic()
    seen: dict[str, StackState] = {}
    failing_since: float | None = None
    while True:
        try:
            current = snapshot(list_stacks(), expected)
            failing_since = None
            if any(state.state == "Pending" for state in current.values()):
                current = explain_pending(current, _blocker(blocker))
        except Exception as error:  # noqa: BLE001 - an API hiccup is retried, and reported once it lasts
            now = time.monotonic()
            failing_since = failing_since if failing_since is not None else now
            if now - failing_since >= API_PATIENCE and now - last_said >= API_PATIENCE:
                say(f"  (cannot list Stacks for {format_seconds(now - failing_since)}: {_shorten(str(error), 160)}; "
                    "retrying)")
                last_said = now
            current = seen
        for line in changes(seen, current):
            say(line)
            last_said = time.monotonic()
        seen = current
        verdict = verdict_of(current)
        if verdict.done or verdict.failed or stop():
            return verdict, current
        now = time.monotonic()
        if now - started >= timeout:
            return verdict, current
        if now - last_said >= heartbeat:
            waiting = [key for key, state in sorted(current.items()) if state.state != "Ready"]
            say(f"  ... still waiting ({format_seconds(now - started)}) for: {', '.join(waiting)}")
            last_said = now
        time.sleep(POLL_SECONDS)


def _blocker(blocker: Callable[[], str]) -> str:
    try:
        return blocker()
    except Exception:  # noqa: BLE001 - the Lease unreadable for a moment: the Stacks' own state still shows
        return ""


def flux_lines(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """`flux get`-style lines: kind namespace/name, revision, ready, message."""
    lines = []
    for obj in objects:
        status = obj.get("status") or {}
        revision = (status.get("artifact") or {}).get("revision") or status.get("lastAppliedRevision") or "-"
        state = stack_state(obj)
        ready = {"Ready": "True", "NotReady": "False"}.get(state.state, "Unknown")
        ready_condition = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        lines.append(f"  {state.key:45} {revision:52} {ready:7} {_shorten(ready_condition.get('message', ''), 80)}")
    return lines
