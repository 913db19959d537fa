"""A run that failed while its backend did not answer may have left its lock there (the CLI could not
release it): the Stack's next run clears it first, as after a run interrupted with the operator, instead of
finding it and stalling as a conflict; while it cannot be cleared yet, the Stack says so and tries again.
The engine and the apiserver are replaced by recorders."""

import asyncio
import socket

from strata_operator.api.status import EVENT_BACKEND_REACHABLE, EVENT_BACKEND_UNREACHABLE, RECONCILING_RETRY
from strata_operator.controllers import stack_update
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.controllers.stack_update import clear_lost_lock
from strata_operator.engine.port import UpdateRequest, UpdateResult


class RecordingKube:
    def __init__(self):
        self.patches = []

    async def patch_stack_status(self, namespace, name, status):
        self.patches.append(status)


class RecoveringEngine:
    def __init__(self, result: UpdateResult):
        self.result, self.recovered = result, []

    async def recover(self, request: UpdateRequest) -> UpdateResult:
        self.recovered.append(request)
        return self.result


class Logger:
    def info(self, *args):
        pass


def session(result: UpdateResult) -> StackSession:
    ctx = Context(kube=RecordingKube(), engine=RecoveringEngine(result), settings=OperatorSettings())
    return StackSession(ctx, {"metadata": {"namespace": "ns", "name": "s", "generation": 1}, "status": {}},
                        logger=Logger())


REQUEST = UpdateRequest(stack_key="ns/s", stack_name="dev", project_dir="/tmp/p")


def test_a_stack_with_no_lost_lock_runs_without_a_recovery():
    s = session(UpdateResult("succeeded"))
    assert asyncio.run(clear_lost_lock(s, REQUEST)) is True
    assert s.ctx.engine.recovered == [] and s.ctx.kube.patches == []


def test_the_lock_a_run_left_when_its_backend_was_away_is_cleared_before_the_next_run():
    s = session(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    s.ctx.lost_locks["ns/s"] = ("strata-operator-0", 1700000000.0)
    assert asyncio.run(clear_lost_lock(s, REQUEST)) is True
    [recovery] = s.ctx.engine.recovered
    assert (recovery.interrupted_host, recovery.interrupted_since) == ("strata-operator-0", 1700000000.0)
    assert recovery.stack_name == "dev"
    assert s.ctx.lost_locks == {}


def test_a_lock_that_cannot_be_cleared_yet_is_said_and_kept_for_the_next_try():
    s = session(UpdateResult("failed", "could not list bucket: connection refused"))
    s.ctx.lost_locks["ns/s"] = ("strata-operator-0", 1700000000.0)
    assert asyncio.run(clear_lost_lock(s, REQUEST)) is False
    assert s.ctx.lost_locks == {"ns/s": ("strata-operator-0", 1700000000.0)}
    [patch] = s.ctx.kube.patches
    reconciling = next(c for c in patch["conditions"] if c["type"] == "Reconciling")
    assert reconciling["reason"] == RECONCILING_RETRY
    assert "could not list bucket: connection refused" in reconciling["message"]


def test_a_watch_remembers_its_backend_went_away_after_it_came_back(monkeypatch):
    events = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: events.append(reason))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        port = listening.getsockname()[1]  # bound, never listening: refused
    s = session(UpdateResult("succeeded"))
    watch = stack_update.BackendWatch(s, ("127.0.0.1", port), "the up s-1")

    async def probe_a_while():
        task = asyncio.create_task(watch.run(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(probe_a_while())
    assert watch.down and watch.seen_down
    watch.reachable()
    assert not watch.down and watch.seen_down
    assert events == [EVENT_BACKEND_UNREACHABLE, EVENT_BACKEND_REACHABLE]
