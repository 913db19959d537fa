"""The engine port: the one interface between the operator and Pulumi (`Engine`), the request and result
of one operation, and what both executors share (`SerializedEngine`: one operation per Stack at a
time, at most `concurrency` at once, the slots shared fairly between namespaces).

Controllers call only this. The executors are process/ (a forked worker per operation on the
operator's host) and pod/ (a workspace pod per Stack, whose agent runs the process executor inside).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from ..services.fair_slots import FairSlots
from ..services.redaction import Redactor, redactor_for

Operation = Literal["preview", "up", "refresh", "destroy", "outputs", "remove", "recover"]
# "blocked": failed in a way that retrying cannot fix (a plugin missing everywhere, a backend directory
# that cannot be created); the Stack waits for a change instead of retrying.
Outcome = Literal["succeeded", "failed", "conflict", "cancelled", "blocked"]


@dataclasses.dataclass(frozen=True)
class UpdateRequest:
    """Everything one operation needs; `secret_config` values and the `env` entries named in `secret_env`
    are secret (the worker redacts those, and only those, from what it reports)."""

    stack_key: str  # <namespace>/<name> of the Stack object: the unit of mutual exclusion
    stack_name: str  # spec.stack
    project_dir: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    secret_config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secrets_provider: str = ""
    create: bool = True
    refresh: bool = False
    expect_no_refresh_changes: bool = False
    targets: tuple[str, ...] = ()
    target_dependents: bool = False
    environments: tuple[str, ...] = ()
    message: str = ""
    run_program: bool = False  # destroy: run the program too (spec.runProgram)
    # up: read the outputs' real values (one `stack output --show-secrets` when some are secret), for
    # spec.outputsSecret and for the digests of secret outputs that dependents compare.
    real_outputs: bool = False
    # Manual approval: preview saves its plan here; up applies exactly the plan found here.
    plan_file: str = ""
    # Drift detection: refresh only previews (what changed outside Pulumi), writing nothing.
    preview_only: bool = False
    # For `recover`: the interrupted run's host, start time (seconds since the epoch) and, for an `up`, its
    # name (whose update, if it finished, the backend's history holds: status.update_message).
    interrupted_host: str = ""
    interrupted_since: float = 0.0
    interrupted_run: str = ""
    # PKO v2's Update options (auto.pulumi.com): fail on any change (preview, up, refresh), go on past
    # resource errors (up, destroy), resources to replace (preview, up), at most this many resource
    # operations at once (0: the CLI's default).
    expect_no_changes: bool = False
    continue_on_error: bool = False
    replace: tuple[str, ...] = ()
    parallel: int = 0
    # The pod executor's: where the workspace pod goes and what it runs as (the process executor ignores them).
    service_account: str = ""  # spec.serviceAccountName; empty: a per-Stack one with no rights
    workspace_template: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # spec.workspaceTemplate
    reclaim_workspace: bool = False  # spec.workspaceReclaimPolicy Delete: no pod kept between updates
    # The references the workspace resolves itself (workspace.MountedRefs.to_json()); the process
    # executor's requests carry their values in env and secret_config instead.
    mounted: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source_root: str = ""  # the materialised source holding project_dir (sent whole to a workspace pod)
    local_dir: str = ""  # the program is this directory of the workspace pod (nothing is uploaded)
    # A PKO v2 Workspace stack's config items (api.workspace_values.ConfigItem.to_json()), resolved by the
    # workspace pod's agent: their valueFrom.env is the pod's own environment, which the operator never reads.
    env_config: tuple[Mapping[str, Any], ...] = ()
    # The process executor's: the directory the platform gave the Stack's namespace for file:// state (the
    # namespace's FILE_BACKEND_ANNOTATION), bound into its sandbox; "" when it has none.
    file_backend_root: str = ""

    def to_json(self, operation: Operation) -> str:
        body = dataclasses.asdict(self)
        body["operation"] = operation
        return json.dumps(body)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "UpdateRequest":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return cls(**{name: tuple(value) if isinstance(value, list) else value
                      for name, value in body.items() if name in fields})


# How an interrupted run's message ends (reason UpdateInterrupted): what follows, unless the run's update
# turns out to have finished before it was lost.
RUNS_AGAIN = "; it is run again"


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    outcome: Outcome
    message: str = ""
    outputs: dict[str, tuple[Any, bool]] = dataclasses.field(default_factory=dict)
    permalink: str = ""
    summary: dict[str, int] = dataclasses.field(default_factory=dict)
    duration: float = 0.0
    reason: str = ""  # a failure's PKO reason when more specific than the outcome's (WorkspaceFailed)
    # up with real_outputs: every output's real value, secret ones included. Never in repr, and each secret
    # one is registered with the Stack's namespace's redactor as soon as the engine returns it.
    real_outputs: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    outputs_error: str = ""  # why real_outputs could not be read
    output_digests: dict[str, str] = dataclasses.field(default_factory=dict)
    outputs_digest: str = ""
    # recover: the interrupted run had finished its update, and succeeded; the result is that update's
    # (summary, outputs), read back from the backend.
    finished: bool = False
    # A CLI run of the operation could not delete its lock from the backend: cleared before the Stack's
    # next operation (the operation's own outcome stands).
    lock_left: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    def to_json(self) -> str:
        """The worker's result line, which `from_json` reads (the workspace agent sends it on)."""
        return json.dumps({
            "outcome": self.outcome, "message": self.message, "permalink": self.permalink, "summary": self.summary,
            "outputs": {k: {"value": v, "secret": secret} for k, (v, secret) in self.outputs.items()},
            "reason": self.reason, "real_outputs": self.real_outputs, "outputs_error": self.outputs_error,
            "output_digests": self.output_digests, "outputs_digest": self.outputs_digest, "finished": self.finished,
            "lock_left": self.lock_left})

    @classmethod
    def from_json(cls, text: str, duration: float) -> "UpdateResult":
        body = json.loads(text)
        outputs = {k: (v["value"], bool(v["secret"])) for k, v in body.get("outputs", {}).items()}
        return cls(body["outcome"], body.get("message", ""), outputs, body.get("permalink", ""),
                   body.get("summary", {}), duration, body.get("reason", ""), body.get("real_outputs"),
                   body.get("outputs_error", ""), dict(body.get("output_digests") or {}),
                   body.get("outputs_digest", ""), bool(body.get("finished")), bool(body.get("lock_left")))


def register_secret_outputs(result: UpdateResult, redactor: Redactor) -> None:
    """Add the real values of the result's secret outputs to `redactor` (idempotent)."""
    for name, (_, secret) in result.outputs.items():
        if secret and result.real_outputs is not None and name in result.real_outputs:
            redactor.add(*_secret_strings(result.real_outputs[name]))


def masked(result: UpdateResult, redactor: Redactor) -> UpdateResult:
    """The result as the Stack may show it: its secret outputs' real values registered with `redactor`
    (the Stack's namespace's), then its messages masked with it."""
    register_secret_outputs(result, redactor)
    return dataclasses.replace(result, message=redactor.redact(result.message),
                               outputs_error=redactor.redact(result.outputs_error))


def _secret_strings(value: Any) -> list[str]:
    """A secret output's value as text (as written to a Secret) and each string inside it."""
    found = [value if isinstance(value, str) else json.dumps(value, sort_keys=True)]
    if isinstance(value, dict):
        for item in value.values():
            found += _secret_strings(item)
    elif isinstance(value, list):
        for item in value:
            found += _secret_strings(item)
    elif not isinstance(value, str) and value is not None:
        found.append(str(value))
    return found


class Engine(Protocol):
    """The operator's only way to run Pulumi."""

    in_workspace_pods: bool
    """Updates run in a pod per Stack under its ServiceAccount, which resolves the Stack's Secret, Env and
    FS refs itself (requests carry them in `mounted`); otherwise in processes the operator forks, which
    get every value in the request."""

    async def preview(self, request: UpdateRequest) -> UpdateResult: ...

    async def up(self, request: UpdateRequest) -> UpdateResult: ...

    async def refresh(self, request: UpdateRequest) -> UpdateResult: ...

    async def destroy(self, request: UpdateRequest) -> UpdateResult: ...

    async def outputs(self, request: UpdateRequest) -> UpdateResult: ...

    async def remove_stack(self, request: UpdateRequest) -> UpdateResult: ...

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        """Clear what a run killed mid-update left behind (its lock, a truncated checkpoint)."""

    def lost_run(self, stack_key: str, host: str, started_at: float) -> None:
        """The Stack's last run (started on `host` at `started_at`) may have left its lock in the backend: it
        is recovered before the Stack's next operation."""

    async def cancel(self, stack_key: str) -> bool:
        """Interrupt the Stack's running operation, if any; True if one was running."""

    async def release(self, stack_key: str) -> None:
        """The Stack's finalizer is done: remove what its executor kept for it beyond its owner's life."""

    def busy(self, stack_key: str) -> bool: ...

    def confinement(self, namespace: str, backend_url: str, file_backend_root: str) -> tuple[str, str] | None:
        """(Stalled reason, message) when a Stack of `namespace` with this backend may not run under this
        executor, because its program could not be kept from the operator's and other namespaces' files."""


class EngineUnavailable(RuntimeError):
    """The engine cannot run at all (no CLI); the message names the fix."""


class SerializedEngine:
    """What every executor shares: one operation per Stack at a time, at most `concurrency` at once, each
    `Engine` operation one `run` of its name (the executor's `_run_locked`), and a lost run's lock cleared
    before the Stack's next operation.

    A run holds its slot for all of `_run_locked`: a forked worker's whole run, or a workspace pod's start,
    the source's upload and the run in it. The slots go to namespaces fairly (services/fair_slots.py):
    while another namespace's operations wait, each slot freed goes to the namespace holding fewest, so
    one team's many slow Stacks hold at most their share of them; a namespace alone may use them all."""

    in_workspace_pods = False

    def __init__(self, concurrency: int):
        self._slots = FairSlots(concurrency)
        self._locks: dict[str, asyncio.Lock] = {}
        # Stacks whose last run may have left its lock in the backend: (the host it took it on, its start).
        self._lost_runs: dict[str, tuple[str, float]] = {}

    def busy(self, stack_key: str) -> bool:
        lock = self._locks.get(stack_key)
        return lock is not None and lock.locked()

    def confinement(self, namespace: str, backend_url: str, file_backend_root: str) -> tuple[str, str] | None:
        """Nothing to refuse: a workspace pod is its Stack's own sandbox."""
        return None

    async def release(self, stack_key: str) -> None:
        """Nothing outlives the Stack here."""

    def forget(self, stack_key: str) -> None:
        """The object is gone: its lock goes too, unless an operation still holds it (a fleet's churn
        would otherwise keep one per Stack ever seen)."""
        if not self.busy(stack_key):
            self._locks.pop(stack_key, None)
            self._lost_runs.pop(stack_key, None)

    def lost_run(self, stack_key: str, host: str, started_at: float) -> None:
        # A run whose CLI could not release its lock (its backend away, its pod gone): the next run would
        # find that lock and fail as a conflict.
        self._lost_runs[stack_key] = (host, started_at)

    def _lock_host(self, stack_key: str, run_host: str) -> str:
        """The host a run of the Stack started on `run_host` took its backend lock under."""
        return run_host

    async def run(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        """The operation in its turn, its result masked with the Stack's namespace's secrets (its own
        secret config and outputs among them)."""
        redactor = redactor_for(request.stack_key.partition("/")[0])
        redactor.add(*request.secret_config.values())
        return masked(await self._run_in_turn(operation, request), redactor)

    async def _run_in_turn(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        lock = self._locks.setdefault(request.stack_key, asyncio.Lock())
        async with lock, self._slots.held(request.stack_key.partition("/")[0]):
            lost = self._lost_runs.get(request.stack_key)
            if lost is not None and operation == "recover":
                # The recovery of the Stack's last run clears the lost run's lock itself.
                request = dataclasses.replace(request, interrupted_since=min(request.interrupted_since, lost[1]))
            elif lost is not None:
                recovered = await self._run_locked("recover", dataclasses.replace(
                    request, interrupted_host=self._lock_host(request.stack_key, lost[0]),
                    interrupted_since=lost[1], interrupted_run=""))
                if not recovered.ok:  # kept for the next operation
                    return dataclasses.replace(recovered, outcome="failed", message=(
                        f"clearing the lock the last run left in the backend failed: {recovered.message}"))
                del self._lost_runs[request.stack_key]
            started_at = time.time()
            result = await self._run_locked(operation, request)
            if operation == "recover" and result.ok:
                self._lost_runs.pop(request.stack_key, None)
            if result.lock_left:
                self.lost_run(request.stack_key, socket.gethostname(), started_at)
            return result

    async def _run_locked(self, operation: Operation, request: UpdateRequest) -> UpdateResult:
        raise NotImplementedError

    async def preview(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("preview", request)

    async def up(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("up", request)

    async def refresh(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("refresh", request)

    async def destroy(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("destroy", request)

    async def outputs(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("outputs", request)

    async def remove_stack(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("remove", request)

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        return await self.run("recover", dataclasses.replace(
            request, interrupted_host=self._lock_host(request.stack_key, request.interrupted_host)))
