"""A run may leave its lock in the backend when its CLI cannot release it: its backend stopped answering
(the controller sees that), or its workspace pod was lost (the pod executor sees that), or its update finished
but the backend was gone as it deleted its lock, or the CLI was killed (the worker sees those). Either way the engine clears that
lock before the Stack's next operation, as after a run interrupted with the operator, instead of the next run
finding it and failing as a conflict; a run lost with its backend is recovered, like one lost with the
operator, once the backend answers. The executor's own runs and the apiserver are recorders."""

import asyncio
import contextlib
import dataclasses
import socket
import sys
import time
from datetime import datetime, timezone

import pytest
from pulumi.automation.errors import CommandError

from strata_operator.api import status as st
from strata_operator.api.stack import parse_stack_spec
from strata_operator.api.status import (EVENT_BACKEND_REACHABLE, EVENT_BACKEND_UNREACHABLE, EVENT_UPDATE_RECOVERED,
                                       EVENT_UPDATE_SUCCESSFUL, OUT_OF_MEMORY, RECONCILING_BACKEND_UNREACHABLE,
                                       UPDATE_INTERRUPTED)
from strata_operator.controllers import stack_update
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack_session import StackSession, run_directory
from strata_operator.decisions.planning import Requests, plan_stack
from strata_operator.engine.pod.executor import PodEngine, WorkspaceSettings, packed_source
from strata_operator.engine.pod.workspace_pod import WorkspaceNames
from strata_operator.engine.port import RUNS_AGAIN, SerializedEngine, UpdateRequest, UpdateResult
from strata_operator.engine.process import executor as process_executor
from strata_operator.engine.process.executor import EngineSettings
from strata_operator.engine.process.memory_limit import ContainerMemory
from strata_operator.engine.process.worker import KnownVersionPulumiCommand, LockWatchingCommand
from strata_operator.sources.references import Resolved

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
    # In the operator's own namespace, whose Stacks' probes say the cause (a team's: test_backend_probe.py).
    ctx = Context(kube=RecordingKube(), engine=engine, settings=OperatorSettings(backend_probe_seconds=0.01,
                                                                                 own_namespace="ns"))
    return StackSession(ctx, {"metadata": {"namespace": "ns", "name": "s", "generation": 1}, "status": {}},
                        logger=Logger())


def refused_port() -> int:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        return listening.getsockname()[1]  # bound, never listening: refused


def events_said(monkeypatch) -> list[str]:
    """The reasons of the Events the controller posts, in order."""
    events: list[str] = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: events.append(reason))
    return events


@contextlib.contextmanager
def backend_port(answering: bool):
    """A local port for a backend's endpoint, taking connections or refusing them (`listen()` to mend it),
    and its host:port."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        if answering:
            listening.listen()
        yield listening, f"127.0.0.1:{listening.getsockname()[1]}"


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
    with backend_port(answering=False) as (listening, where):
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
    events = events_said(monkeypatch)
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
    events = events_said(monkeypatch)
    s = session(RecordingEngine())
    with backend_port(answering=False) as (listening, where):
        backend = f"s3://state?endpoint={where}"
        failed = asyncio.run(stack_update.run_watched(s, backend, "the up s-1",
                                                      slowly(UpdateResult("failed", "the CLI gave up")),
                                                      "strata-operator-0", 1700000000.0))
        assert not failed.ok and events == [EVENT_BACKEND_UNREACHABLE]
        assert s.watched.backend_down == where
        listening.listen()  # the backend is back before the Stack's next run
        asyncio.run(stack_update.run_watched(s, backend, "the up s-2", slowly(UpdateResult("succeeded")),
                                             "strata-operator-0", 1700000100.0))
    assert events == [EVENT_BACKEND_UNREACHABLE, EVENT_BACKEND_REACHABLE]
    assert s.watched.backend_down == ""


def test_an_operation_whose_cli_could_not_delete_its_lock_leaves_it_to_be_cleared_before_the_next():
    class LockLeavingEngine(RecordingEngine):
        async def _run_locked(self, operation, request):
            self.ran.append((operation, request))
            # The update finished; deleting its lock found the backend gone (the CLI still exits 0).
            return UpdateResult("succeeded", lock_left=operation == "up")

    engine = LockLeavingEngine()
    before = time.time()
    assert asyncio.run(engine.up(REQUEST)).ok
    host, since = engine._lost_runs["ns/s"]
    assert host == socket.gethostname() and before <= since <= time.time()
    asyncio.run(engine.destroy(REQUEST))
    [(_, up), (first, recovery), (then, _)] = engine.ran
    assert (first, then) == ("recover", "destroy")
    assert (recovery.interrupted_host, recovery.interrupted_since, recovery.interrupted_run) == (host, since, "")
    assert engine._lost_runs == {}


def test_the_recovery_of_a_lost_run_clears_its_lock_once_not_twice():
    engine = RecordingEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    engine.lost_run("ns/s", "strata-operator-0", 1700000000.0)
    # The status's currentUpdate names the run (its start as RFC 3339 keeps whole seconds only).
    recovery = dataclasses.replace(REQUEST, interrupted_host="strata-operator-0", interrupted_since=1700000001.0,
                                   interrupted_run="s-1")
    assert asyncio.run(engine.recover(recovery)).ok
    [(operation, request)] = engine.ran
    assert operation == "recover" and request.interrupted_run == "s-1"
    assert (request.interrupted_host, request.interrupted_since) == ("strata-operator-0", 1700000000.0)
    assert engine._lost_runs == {}


def test_the_worker_notes_a_cli_run_that_could_not_delete_its_lock_whether_it_failed_or_not(tmp_path):
    cli = tmp_path / "pulumi"
    # What the real CLI prints when the backend goes away as it deletes its lock (backend/diy/lock.go).
    cli.write_text('#!/bin/sh\necho "error: there was a problem deleting the lock at s3://b/.pulumi/locks/x.json, '
                   'manual clean up may be required: connection refused" >&2\nfor arg; do code=$arg; done\nexit "$code"\n')
    cli.chmod(0o755)
    for code in (0, 1):
        command = LockWatchingCommand(KnownVersionPulumiCommand("3.259.0"))
        command.command = str(cli)
        try:
            command.run([str(code)], str(tmp_path), {})
        except CommandError:
            assert code == 1
        assert command.lock_left
    quiet = LockWatchingCommand(KnownVersionPulumiCommand("3.259.0"))
    quiet.command = "/bin/true"
    quiet.run([], str(tmp_path), {})
    assert not quiet.lock_left and quiet.version == KnownVersionPulumiCommand("3.259.0").version


def test_the_worker_notes_a_killed_cli_run_as_one_that_left_its_lock_and_says_the_signal(tmp_path):
    cli = tmp_path / "pulumi"
    cli.write_text('#!/bin/sh\necho "Updating (dev):"\nkill -KILL $$\n')  # as the OOM killer would
    cli.chmod(0o755)
    command = LockWatchingCommand(KnownVersionPulumiCommand("3.259.0"))
    command.command = str(cli)
    with pytest.raises(CommandError):
        command.run(["up"], str(tmp_path), {})
    assert (command.lock_left, command.killed_by) == (True, "SIGKILL")
    interrupted = tmp_path / "interrupted"
    interrupted.write_text('#!/bin/sh\nkill -INT $$\n')  # the engine's own cancel: the CLI releases its lock
    interrupted.chmod(0o755)
    for cli, why in ((interrupted, "cancelled"), ("/bin/false", "a failure of its own")):
        released = LockWatchingCommand(KnownVersionPulumiCommand("3.259.0"))
        released.command = str(cli)
        with pytest.raises(CommandError):
            released.run([], str(tmp_path), {})
        assert (released.lock_left, released.killed_by) == (False, ""), why


def test_a_worker_still_running_after_the_interrupts_grace_is_killed_and_said_to_have_left_its_lock(monkeypatch):
    monkeypatch.setattr(process_executor, "CANCEL_GRACE_SECONDS", 2.0)

    async def interrupted(ignores_sigint: bool) -> bool:
        # A worker's process group: a CLI cancelling at SIGINT stops; one stuck in a provider call does not.
        # One process, whose SIGINT disposition is set before it says so (a shell forking a child races it).
        disposition = "signal.SIG_IGN" if ignores_sigint else "signal.default_int_handler"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", f"import signal, time; signal.signal(signal.SIGINT, {disposition}); "
                                  "print(flush=True); time.sleep(30)",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
        await process.stdout.readline()
        worker = process_executor.Worker(process.pid, process.stdout, process.stdin)
        await worker.interrupt()
        await process.wait()
        return worker.killed

    assert asyncio.run(interrupted(ignores_sigint=True))
    assert not asyncio.run(interrupted(ignores_sigint=False))


def test_a_worker_that_ended_without_a_result_may_have_left_its_lock_and_says_how_it_ended():
    killed = process_executor._parse_worker_output("up", None, "", False, 1.0)
    assert (killed.outcome, killed.lock_left) == ("failed", True)
    assert killed.message.startswith("the up's worker process ended without a result (killed: out of memory, or by "
                                     "hand); the CLI it ran was stopped")
    traceback = "Traceback (most recent call last):\nMemoryError"
    crashed = process_executor._parse_worker_output("up", None, traceback, False, 1.0)
    assert crashed.message.startswith("the up's worker process ended without a result (Traceback (most recent call "
                                      "last):\nMemoryError); ")
    # Cancelled, it said nothing either: that is the cancel's, whose kill (if any) says itself.
    assert not process_executor._parse_worker_output("up", None, "", True, 1.0).lock_left


class RecoveringEngine(RecordingEngine):
    """A recovery answers with the one result given; nothing else may run."""

    async def _run_locked(self, operation, request):
        assert operation == "recover", operation
        return await super()._run_locked(operation, request)


def interrupted(engine, tmp_path, backend: str) -> tuple[StackSession, object]:
    """A Stack whose up s-1 never concluded (status.currentUpdate), and its spec."""
    s = session(engine)
    s.ctx.settings.engine = EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true")
    s.status["currentUpdate"] = {"name": "s-1", "type": "up", "generation": 1, "commit": "c1", "host": "op-0",
                                 "startTime": "2026-11-29T10:00:00Z", "project": "p"}
    spec = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "backend": backend}, "ns")
    return s, spec


RESOLVED = Resolved(env={}, config={}, secret_config={}, git=None)


def test_a_run_lost_with_its_backend_is_recovered_only_once_the_backend_answers(monkeypatch, tmp_path):
    events = events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("succeeded", "nothing to recover"))
    with backend_port(answering=False) as (listening, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.ctx.settings.backend_probe_seconds = 7.0
        # Restarted while the backend is away: the run's outage is said, its recovery waits.
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) == 7.0
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) == 7.0
        assert engine.ran == [] and events == [EVENT_BACKEND_UNREACHABLE] and s.status["currentUpdate"]
        reconciling = {c["type"]: c for c in s.status["conditions"]}["Reconciling"]
        assert (reconciling["reason"], reconciling["message"]) == (RECONCILING_BACKEND_UNREACHABLE, (
            f"the state backend at {where} does not answer (Connection refused): the Stack runs again once it "
            "answers"))
        listening.listen()
        # Back: the lost run did not finish, and its failure was the outage's: none is counted, it runs again.
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    [(operation, request)] = engine.ran
    assert (operation, request.interrupted_run, request.interrupted_host) == ("recover", "s-1", "op-0")
    assert s.status["currentUpdate"] is None and "lastUpdate" not in s.status
    assert events == [EVENT_BACKEND_UNREACHABLE, EVENT_BACKEND_REACHABLE] and s.watched.backend_down == ""


def test_a_run_lost_with_its_backend_whose_update_had_finished_is_recorded_not_run_again(monkeypatch, tmp_path):
    events = events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend",
                                           summary={"create": 2}, finished=True))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.watched.backend_down = where  # the run failed as its backend went away, which the Stack said
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    last = s.status["lastUpdate"]
    assert (last["name"], last["state"], last["generation"], last["lastSuccessfulCommit"]) == ("s-1", "succeeded",
                                                                                               1, "c1")
    assert s.status["currentUpdate"] is None
    assert events == [EVENT_BACKEND_REACHABLE, EVENT_UPDATE_SUCCESSFUL]


def test_a_run_interrupted_with_the_operator_and_unfinished_is_recorded_as_interrupted(monkeypatch, tmp_path):
    monkeypatch.setattr(stack_update, "post_event", lambda *_, **__: None)
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    last = s.status["lastUpdate"]
    assert (last["name"], last["state"], last["reason"]) == ("s-1", "failed", UPDATE_INTERRUPTED)
    assert s.status["currentUpdate"] is None


class OperatorPodKube(RecordingKube):
    """The operator's pods as the kubelet reports them: op-0's container OOM-killed during the run."""

    def __init__(self):
        self.read = []

    async def get_pod(self, namespace, name):
        self.read.append((namespace, name))
        terminated = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T10:00:30Z"}
        return {"metadata": {"name": name, "namespace": namespace},
                "spec": {"containers": [{"name": "operator", "resources": {"limits": {"memory": "1Gi"}}}]},
                "status": {"containerStatuses": [{"name": "operator", "state": {"running": {}},
                                                  "lastState": {"terminated": terminated}}]}}


@pytest.mark.parametrize("pod_executor,packing,during", [
    (False, False, "most likely for this update"),
    (True, True, "while it packed this Stack's source for its workspace pod"),
    (True, False, "during this update (run in its workspace pod: the operator was not packing this Stack's source)")])
def test_a_run_whose_operator_container_the_kernel_killed_for_memory_is_out_of_memory_with_backoff(
        monkeypatch, tmp_path, pod_executor, packing, during):
    """On cgroup v2 nodes the kernel kills a container whole at its limit: run again at once, the update
    would kill the operator again and again (a crash loop, the standby's after it). It is a failure of the
    Stack's instead, with backoff, Stalled after --stall-after-failures. Under the process executor the
    update ran in that container; under the pod executor the operator fetched, packed and uploaded its
    source there, and the message says whether it was packing this Stack's (the tarball it left beside
    the run's source)."""
    events = events_said(monkeypatch)
    monkeypatch.setattr(stack_update, "discover_namespace", lambda _: ("strata-system", "the pod's namespace"))
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.ctx.kube = kube = OperatorPodKube()
        s.ctx.settings.engine.container_memory = ContainerMemory("the operator's container",
                                                                 "the Operator component's resources")
        if pod_executor:
            s.ctx.settings.workspace = WorkspaceSettings(image="img:1")
        left = run_directory(s, "s-1") / "src"  # what the killed operator left of the run
        left.mkdir(parents=True)
        if packing:
            packed_source(left).write_bytes(b"the first megabytes of a tarball")
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    assert kube.read == [("strata-system", "op-0")]  # the operator pod that ran it
    last = s.status["lastUpdate"]
    assert (last["name"], last["state"], last["reason"], last["failures"]) == ("s-1", "failed", OUT_OF_MEMORY, 1)
    assert last["message"] == (
        "update s-1 was interrupted: the kernel killed the operator's container (pod op-0) for out of memory at "
        f"its memory limit of 1Gi, {during}; raise the Operator component's resources.limits.memory; cancelled "
        "the interrupted update in the backend")
    assert events == [st.EVENT_UPDATE_FAILURE] and s.status["currentUpdate"] is None
    assert not left.parent.exists()  # the run's leftovers go with its recovery
    # Not resumed at once, as an interrupted run is: retried after its backoff, Stalled after repeated failures.
    now = datetime.now(timezone.utc)
    retrying = plan_stack(spec, 1, Requests(), last, "c1", now)
    assert retrying.run is None and retrying.verdict.reason == st.RECONCILING_RETRY, retrying
    stalled = plan_stack(spec, 1, Requests(), last, "c1", now, stall_after_failures=1)
    assert stalled.run is None and stalled.verdict.phase == "stalled", stalled


def test_on_a_host_a_run_interrupted_with_the_operator_reads_no_pod(monkeypatch, tmp_path):
    """No container, no limit: the cause stays the operator's restart."""
    events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.ctx.kube = kube = OperatorPodKube()
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    assert kube.read == [] and s.status["lastUpdate"]["reason"] == UPDATE_INTERRUPTED


def test_a_run_the_operator_before_a_restart_lost_with_its_backend_counts_no_failure(monkeypatch, tmp_path):
    events = events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        # What the process before said as the run stopped; this one never saw the backend away.
        s.status["conditions"] = [{"type": "Reconciling", "status": "True", "reason": RECONCILING_BACKEND_UNREACHABLE,
                                   "message": f"the state backend at {where} does not answer (Connection refused)"}]
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    assert s.status["currentUpdate"] is None and "lastUpdate" not in s.status
    assert events == [EVENT_BACKEND_REACHABLE]


def test_an_operator_told_not_to_probe_its_backends_recovers_without_waiting_for_one(monkeypatch, tmp_path):
    events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("failed", "could not list bucket"))
    with backend_port(answering=False) as (_, where):  # from the operator; its workspace pods may reach it
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.ctx.settings.backend_probe_seconds = 0
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    assert [operation for operation, _ in engine.ran] == ["recover"]


def test_a_run_that_failed_as_its_backend_came_back_failed_with_the_outage(monkeypatch):
    events = events_said(monkeypatch)
    engine = RecordingEngine()
    s = session(engine)
    with backend_port(answering=False) as (listening, where):
        async def outage_then_failure() -> UpdateResult:
            await asyncio.sleep(0.1)  # the watch sees the backend away
            listening.listen()
            await asyncio.sleep(0.1)  # and back; the CLI, having given up meanwhile, fails now
            return UpdateResult("failed", "failed to save snapshot: operation error S3: PutObject")

        result = asyncio.run(stack_update.run_watched(s, f"s3://state?endpoint={where}", "the up s-1",
                                                      outage_then_failure(), "strata-operator-0", 1700000000.0))
    assert (result.reason, result.message) == (RECONCILING_BACKEND_UNREACHABLE, (
        f"the state backend at {where} went away during the up s-1, which failed (failed to save snapshot: "
        "operation error S3: PutObject)"))
    assert engine._lost_runs == {"ns/s": ("strata-operator-0", 1700000000.0)}
    assert events == [EVENT_BACKEND_UNREACHABLE, EVENT_BACKEND_REACHABLE] and s.watched.backend_down == ""


def test_the_recovery_of_a_run_this_operator_saw_fail_with_the_outage_counts_no_failure(monkeypatch, tmp_path):
    events = events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.watched.outage_run = "s-1"  # its watch already said the backend was back
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    assert s.status["currentUpdate"] is None and "lastUpdate" not in s.status
    assert events == [] and s.watched.outage_run == ""


def test_a_run_lost_with_its_backend_whose_lock_cannot_be_cleared_says_the_outage_interrupted_it(monkeypatch,
                                                                                                 tmp_path):
    events_said(monkeypatch)
    engine = RecoveringEngine(UpdateResult("failed", "could not list bucket: connection reset"))
    with backend_port(answering=True) as (_, where):
        s, spec = interrupted(engine, tmp_path, f"s3://state?endpoint={where}")
        s.watched.outage_run = "s-1"
        assert asyncio.run(stack_update.recover_interrupted(s, spec, RESOLVED)) is None
    last = s.status["lastUpdate"]
    assert (last["reason"], last["message"]) == (UPDATE_INTERRUPTED, (
        "update s-1 was interrupted (its state backend's outage); could not list bucket: connection reset"))


class WorkspaceLosingEngine(RecordingEngine):
    """An up lost with its workspace pod (recorded as the pod executor does); a recovery answers with the
    one result given."""

    async def _run_locked(self, operation, request):
        if operation == "recover":
            return await super()._run_locked(operation, request)
        self.ran.append((operation, request))
        self.lost_run(request.stack_key, "s-workspace", 1700000000.0)
        return UpdateResult("failed", f"the workspace pod s-workspace was deleted during the up{RUNS_AGAIN}",
                            reason=UPDATE_INTERRUPTED, duration=4.0)


LOST_UP = st.RunRecord(name="s-1a2b3c4d", kind="up", generation=1, reconcile_request="", commit="c1",
                       started=datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc), host="s-workspace")


def test_an_up_lost_with_its_workspace_after_its_update_finished_is_that_update_not_a_second(monkeypatch):
    said = []
    monkeypatch.setattr(stack_update, "post_event", lambda body, reason, message, **_: said.append((reason, message)))
    finished = UpdateResult("succeeded", "nothing to recover", summary={"update": 1}, finished=True)
    engine = WorkspaceLosingEngine(finished)
    lost = asyncio.run(engine.up(REQUEST))
    result = asyncio.run(stack_update._finished_before_lost(session(engine), REQUEST, LOST_UP, lost))
    assert (result.ok, result.finished, result.summary, result.duration) == (True, True, {"update": 1}, 4.0)
    [_, (operation, recovery)] = engine.ran
    # The recovery looks for this run's update in the backend's history, and clears the lost run's lock.
    assert (operation, recovery.interrupted_run, recovery.interrupted_since) == ("recover", "s-1a2b3c4d",
                                                                                 1700000000.0)
    assert engine._lost_runs == {}
    assert said == [(EVENT_UPDATE_RECOVERED, "the workspace pod s-workspace was deleted during the up, after its "
                                             "update had finished: that update is recorded, not run again")]


def test_an_up_lost_with_its_workspace_before_its_update_finished_runs_again_with_its_lock_cleared(monkeypatch):
    monkeypatch.setattr(stack_update, "post_event", lambda *_, **__: None)
    engine = WorkspaceLosingEngine(UpdateResult("succeeded", "cancelled the interrupted update in the backend"))
    lost = asyncio.run(engine.up(REQUEST))
    assert asyncio.run(stack_update._finished_before_lost(session(engine), REQUEST, LOST_UP, lost)) is lost
    assert [operation for operation, _ in engine.ran] == ["up", "recover"] and engine._lost_runs == {}
    # The next up runs at once, with no second recovery.
    asyncio.run(engine.up(REQUEST))
    assert [operation for operation, _ in engine.ran] == ["up", "recover", "up"]


def test_an_up_lost_with_its_workspace_whose_recovery_fails_leaves_it_to_the_next_operation(monkeypatch):
    monkeypatch.setattr(stack_update, "post_event", lambda *_, **__: None)
    engine = WorkspaceLosingEngine(UpdateResult("failed", "the workspace pod does not answer"))
    lost = asyncio.run(engine.up(REQUEST))
    assert asyncio.run(stack_update._finished_before_lost(session(engine), REQUEST, LOST_UP, lost)) is lost
    assert engine._lost_runs == {"ns/s": ("s-workspace", 1700000000.0)}
