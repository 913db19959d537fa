"""A run may leave its lock in the backend when its CLI cannot release it: its backend stopped answering
(the controller sees that), or its workspace pod was lost (the pod executor sees that). Either way the engine
clears that lock before the Stack's next operation, as after a run interrupted with the operator, instead of
the next run finding it and failing as a conflict. The executor's own runs and the apiserver are recorders."""

import asyncio
import socket

from strata_operator.api.status import (EVENT_BACKEND_REACHABLE, EVENT_BACKEND_UNREACHABLE,
                                       RECONCILING_BACKEND_UNREACHABLE)
from strata_operator.controllers import stack_update
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession
from strata_operator.engine.pod.executor import PodEngine, WorkspaceSettings
from strata_operator.engine.pod.workspace_pod import WorkspaceNames
from strata_operator.engine.port import SerializedEngine, UpdateRequest, UpdateResult
from strata_operator.engine.process.executor import EngineSettings

REQUEST = UpdateRequest(stack_key="ns/s", stack_name="dev", project_dir="/tmp/p")


class RecordingEngine(SerializedEngine):
    """Each operation recorded; a recovery answers with the next of `recoveries`."""

    def __init__(self, *recoveries: UpdateResult):
        super().__init__(concurrency=2)
        self.recoveries, self.ran = list(recoveries), []

    async def _run_locked(self, operation, request):
        self.ran.append((operation, request))
        return self.recoveries.pop(0) if operation == "recover" else UpdateResult("succeeded")


def test_a_stack_with_no_lost_run_operates_without_a_recovery():
    engine = RecordingEngine()
    assert asyncio.run(engine.up(REQUEST)).ok
    assert [operation for operation, _ in engine.ran] == ["up"]


def test_the_lock_a_lost_run_left_is_cleared_before_the_next_operation_of_any_kind():
    for operate in (SerializedEngine.up, SerializedEngine.destroy, SerializedEngine.preview):
        engine = RecordingEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
        engine.lost_run("ns/s", "strata-operator-0", 1700000000.0)
        assert asyncio.run(operate(engine, REQUEST)).ok
        [(first, recovery), (then, request)] = engine.ran
        assert (first, then) == ("recover", operate.__name__)
        assert (recovery.interrupted_host, recovery.interrupted_since) == ("strata-operator-0", 1700000000.0)
        assert recovery.stack_name == "dev" and request == REQUEST
        asyncio.run(operate(engine, REQUEST))  # cleared once: the operation after runs alone
        assert [operation for operation, _ in engine.ran[2:]] == [operate.__name__]


def test_a_lock_that_cannot_be_cleared_yet_fails_the_operation_unrun_and_is_tried_again_next_time():
    engine = RecordingEngine(UpdateResult("failed", "could not list bucket: connection refused"),
                             UpdateResult("succeeded"))
    engine.lost_run("ns/s", "strata-operator-0", 1700000000.0)
    result = asyncio.run(engine.up(REQUEST))
    assert result.outcome == "failed"
    assert result.message == ("clearing the lock the last run left in the backend failed: "
                              "could not list bucket: connection refused")
    assert [operation for operation, _ in engine.ran] == ["recover"]
    assert asyncio.run(engine.up(REQUEST)).ok
    assert [operation for operation, _ in engine.ran] == ["recover", "recover", "up"]


def test_a_workspace_pods_runs_take_their_lock_under_the_pods_hostname(tmp_path):
    engine = PodEngine(EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true"),
                       WorkspaceSettings(image="strata:1"), kube=None)
    recoveries = []

    async def run_locked(operation, request):
        if operation == "recover":
            recoveries.append(request.interrupted_host)
        return UpdateResult("succeeded")

    engine._run_locked = run_locked
    engine.lost_run("ns/s", "strata-operator-0", 1700000000.0)  # as the controller knows it: the operator's host
    asyncio.run(engine.up(REQUEST))
    asyncio.run(engine.recover(REQUEST))  # after the operator's restart, from the run its status names
    pod = WorkspaceNames.of("ns/s").pod
    assert recoveries == [pod, pod]


def test_a_deleted_stacks_lost_run_is_forgotten():
    engine = RecordingEngine()
    engine.lost_run("ns/s", "strata-operator-0", 1700000000.0)
    engine.forget("ns/s")
    assert asyncio.run(engine.destroy(REQUEST)).ok
    assert [operation for operation, _ in engine.ran] == ["destroy"]


class RecordingKube:
    async def patch_stack_status(self, namespace, name, status):
        pass


class Logger:
    def info(self, *args):
        pass

    warning = info


def session(engine) -> StackSession:
    ctx = Context(kube=RecordingKube(), engine=engine, settings=OperatorSettings(backend_probe_seconds=0.01))
    return StackSession(ctx, {"metadata": {"namespace": "ns", "name": "s", "generation": 1}, "status": {}},
                        logger=Logger())


def refused_port() -> int:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        return listening.getsockname()[1]  # bound, never listening: refused


async def slowly(result: UpdateResult) -> UpdateResult:
    await asyncio.sleep(0.2)  # long enough for the watch's probes
    return result


def test_a_run_that_failed_while_its_backend_was_away_is_a_lost_run_and_the_outages(monkeypatch):
    monkeypatch.setattr(stack_update, "post_event", lambda *_, **__: None)
    port = refused_port()
    backend = f"s3://state?endpoint=127.0.0.1:{port}"
    for result, lost in ((UpdateResult("failed", "the CLI gave up"), True), (UpdateResult("succeeded"), False),
                         (UpdateResult("conflict", "locked by another update"), False)):
        engine = RecordingEngine()
        s = session(engine)
        said = asyncio.run(stack_update.run_watched(s, backend, "the up s-1", slowly(result), "strata-operator-0",
                                                    1700000000.0))
        assert engine._lost_runs == ({"ns/s": ("strata-operator-0", 1700000000.0)} if lost else {})
        assert said == (UpdateResult("failed", f"the state backend at 127.0.0.1:{port} does not answer "
                                               "(Connection refused): the up s-1 stopped",
                                     reason=RECONCILING_BACKEND_UNREACHABLE) if lost else result)


def test_a_run_that_failed_at_once_with_its_backend_away_says_the_outage_the_watch_had_no_time_to(monkeypatch):
    events = []
    monkeypatch.setattr(stack_update, "post_event",
                        lambda body, reason, message, **kw: events.append((reason, message, kw.get("warning"))))
    port = refused_port()
    s = session(RecordingEngine())
    s.ctx.settings.backend_probe_seconds = 60  # no probe during the run: it fails before the first
    said = asyncio.run(stack_update.run_watched(s, f"s3://state?endpoint=127.0.0.1:{port}", "the up s-1",
                                                slowly(UpdateResult("failed", "could not list bucket")),
                                                "strata-operator-0", 1700000000.0))
    assert said.reason == RECONCILING_BACKEND_UNREACHABLE
    assert events == [(EVENT_BACKEND_UNREACHABLE, said.message, True)]
    assert s.watched.backend_down == f"127.0.0.1:{port}"


def test_a_stack_whose_backend_is_still_away_waits_for_it_and_runs_once_it_answers():
    s = session(RecordingEngine())
    s.ctx.settings.backend_probe_seconds = 7.0
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        where = f"127.0.0.1:{listening.getsockname()[1]}"
        backend = f"s3://state?endpoint={where}"
        assert asyncio.run(stack_update.backend_still_away(s, backend)) is None  # never said away: runs
        s.watched.backend_down = where
        assert asyncio.run(stack_update.backend_still_away(s, backend)) == 7.0
        reconciling = {c["type"]: c for c in s.status["conditions"]}["Reconciling"]
        assert (reconciling["reason"], reconciling["message"]) == (RECONCILING_BACKEND_UNREACHABLE, (
            f"the state backend at {where} does not answer (Connection refused): the Stack runs again once it "
            "answers"))
        # Another backend now (the spec changed): this outage is not its.
        assert asyncio.run(stack_update.backend_still_away(s, "s3://state?endpoint=127.0.0.1:1")) is None
        listening.listen()
        assert asyncio.run(stack_update.backend_still_away(s, backend)) is None


def test_a_watch_remembers_its_backend_went_away_after_it_came_back(monkeypatch):
    events = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: events.append(reason))
    watch = stack_update.BackendWatch(session(RecordingEngine()), ("127.0.0.1", refused_port()), "the up s-1")

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


def test_an_outage_said_by_a_run_that_failed_is_ended_by_the_stacks_next_run(monkeypatch):
    events = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: events.append(reason))
    s = session(RecordingEngine())
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        backend = f"s3://state?endpoint=127.0.0.1:{listening.getsockname()[1]}"
        failed = asyncio.run(stack_update.run_watched(s, backend, "the up s-1",
                                                      slowly(UpdateResult("failed", "the CLI gave up")),
                                                      "strata-operator-0", 1700000000.0))
        assert not failed.ok and events == [EVENT_BACKEND_UNREACHABLE]
        assert s.watched.backend_down == f"127.0.0.1:{listening.getsockname()[1]}"
        listening.listen()  # the backend is back before the Stack's next run
        asyncio.run(stack_update.run_watched(s, backend, "the up s-2", slowly(UpdateResult("succeeded")),
                                             "strata-operator-0", 1700000100.0))
    assert events == [EVENT_BACKEND_UNREACHABLE, EVENT_BACKEND_REACHABLE]
    assert s.watched.backend_down == ""
