"""Real failures, backoff and Stalled; real lock conflicts on one backend stack; prerequisites."""

import time
from datetime import datetime, timezone
from pathlib import Path

from strata_components.local import processes

from .conftest import STALL_AFTER_FAILURES, condition, eventually_constant, has_condition, stash_program


def _big_program(count: int = 300) -> dict:
    """Enough Stash resources that an update takes several seconds with the real engine."""
    return {"resources": {f"s{i}": {"type": "pulumi:index:Stash", "properties": {"input": i}} for i in range(count)}}


def test_bad_expression_backs_off_and_a_spec_change_bypasses_the_cooldown(stacks):
    stacks.program("typo", {"resources": {"s": {"type": "pulumi:index:Stash",
                                                "properties": {"input": "${nothere.output}"}}}})
    stacks.create("typo", stacks.spec(programRef={"name": "typo"}))
    obj = stacks.wait("typo", lambda o: has_condition(o, "Reconciling", "RetryingAfterFailure"), 90, "first failure")
    last = obj["status"]["lastUpdate"]
    assert last["state"] == "failed" and last["failures"] == 1
    assert "nothere" in last["message"]
    assert "nothere" in condition(obj, "Reconciling")["message"]
    # The first cooldown is 10 s: no second run meanwhile.
    assert eventually_constant(lambda: stacks.runs("typo"), 4) == 1

    started = time.monotonic()
    stacks.patch("typo", {"spec": {"config": {"any": "change"}}})
    obj = stacks.wait("typo", lambda o: o["status"]["lastUpdate"]["generation"] == 2, 30, "run for generation 2")
    assert time.monotonic() - started < 10, "the spec change waited for the cooldown"
    assert obj["status"]["lastUpdate"]["failures"] == 1  # a new generation starts counting again


def test_missing_required_config_stalls_after_n_failures_until_the_source_changes(stacks):
    program = stash_program(greeting="${who}")
    program["configuration"] = {"who": {"type": "String"}}
    stacks.program("needs-config", program)
    stacks.create("needs-config", stacks.spec(programRef={"name": "needs-config"}, retryMaxBackoffDurationSeconds=1))
    obj = stacks.wait_stalled("needs-config", "UpdateFailed", 90)
    last = obj["status"]["lastUpdate"]
    assert last["failures"] == STALL_AFTER_FAILURES
    assert "missing required configuration variable 'who'" in last["message"]
    assert f"{STALL_AFTER_FAILURES} consecutive update failures" in condition(obj, "Stalled")["message"]
    processes.wait_until(lambda: len(stacks.events("needs-config", "StackUpdateFailure")) == STALL_AFTER_FAILURES,
                         15, "one StackUpdateFailure Event per failure")
    assert eventually_constant(lambda: stacks.runs("needs-config"), 4) == STALL_AFTER_FAILURES  # stalled: no runs

    program["configuration"]["who"]["default"] = "hi"
    stacks.replace_program("needs-config", program)
    assert stacks.wait_ready("needs-config", 60)["status"]["outputs"] == {"greeting": "hi"}


def _locked(stacks) -> bool:
    return any(Path(stacks.backend.removeprefix("file://")).glob(".pulumi/locks/**/*.json"))


def test_two_stacks_on_one_backend_stack_conflict(stacks):
    stacks.program("shared", _big_program())
    stacks.create("holder", stacks.spec(programRef={"name": "shared"}))
    processes.wait_until(lambda: _locked(stacks), 60, "the holder's update to take the backend lock", interval=0.1)

    stacks.create("contender", stacks.spec(programRef={"name": "shared"}))
    stacks.create("patient", stacks.spec(programRef={"name": "shared"}, retryOnUpdateConflict=True,
                                         retryMaxBackoffDurationSeconds=1))
    contender = stacks.wait_stalled("contender", "UpdateConflict", 60)
    assert contender["status"]["lastUpdate"]["reason"] == "UpdateConflict"
    # The real CLI says "locked", or (reading the checkpoint the holder is writing) "failed to load checkpoint".
    assert "locked" in contender["status"]["lastUpdate"]["message"]
    assert has_condition(stacks.get("holder"), "Reconciling", "StackProcessing")
    processes.wait_until(lambda: stacks.events("contender", "StackUpdateConflictDetected"), 15, "conflict Event")

    stacks.wait_ready("holder", 120)
    # With retryOnUpdateConflict the other one retries after its backoff and succeeds once the lock is free.
    patient = stacks.wait_ready("patient", 120)
    assert patient["status"]["lastUpdate"]["state"] == "succeeded"
    # Without it, the conflict stays reported until something changes.
    assert has_condition(stacks.get("contender"), "Stalled", "UpdateConflict")


def _resync_age(stacks, name: str) -> float:
    last = stacks.get(name)["status"]["lastUpdate"]["lastResyncTime"]
    moment = datetime.strptime(last, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - moment).total_seconds()


def test_prerequisites_wait_then_rerun_a_stale_prerequisite(stacks):
    stacks.program("base", stash_program(layer="base"))
    stacks.program("app", stash_program(layer="app"))
    stacks.create("app", stacks.spec(stack="app", programRef={"name": "app"}, prerequisites=[{"name": "base"}]))
    waiting = stacks.wait("app", lambda o: has_condition(o, "Reconciling", "PrerequisiteNotSatisfied"), 60,
                          "waiting for base")
    assert "'base'" in condition(waiting, "Reconciling")["message"]
    assert stacks.runs("app") == 0

    stacks.create("base", stacks.spec(stack="base", programRef={"name": "base"}))
    stacks.wait_ready("base", 90)
    stacks.wait_ready("app", 90)  # woken by base's change, not by a timer
    base_run = stacks.get("base")["status"]["lastUpdate"]["name"]

    # A prerequisite older than succeededWithinDuration is asked to re-run first (PKO behaviour).
    processes.wait_until(lambda: _resync_age(stacks, "base") > 4, 10, "base's last run to be 4 s old")
    stacks.create("fresh-app", stacks.spec(stack="fresh", programRef={"name": "app"}, prerequisites=[
        {"name": "base", "requirement": {"succeededWithinDuration": "4s"}}]))
    stacks.wait_ready("fresh-app", 90)
    base = stacks.get("base")
    assert base["status"]["lastUpdate"]["name"] != base_run
    assert base["metadata"]["annotations"]["pulumi.com/reconciliation-request"] == f"after-{base_run}"


def test_a_failed_then_a_stale_prerequisite_blocks_and_then_releases(stacks):
    """Not only a missing prerequisite: one that failed blocks until it succeeds, and one older than
    succeededWithinDuration blocks (naming why) until its re-run succeeds."""
    broken = {"resources": {"s": {"type": "pulumi:index:Stash", "properties": {"input": "${nothere.output}"}}}}
    stacks.program("base", broken)
    stacks.program("app", stash_program(layer="app"))
    stacks.create("base", stacks.spec(stack="base", programRef={"name": "base"}))
    stacks.wait("base", lambda o: ((o.get("status") or {}).get("lastUpdate") or {}).get("state") == "failed", 90,
                "base failed")
    stacks.create("app", stacks.spec(stack="app", programRef={"name": "app"}, prerequisites=[
        {"name": "base", "requirement": {"succeededWithinDuration": "1h"}}]))
    blocked = stacks.wait("app", lambda o: has_condition(o, "Reconciling", "PrerequisiteNotSatisfied"), 60,
                          "blocked by the failed base")
    assert condition(blocked, "Reconciling")["message"] == "prerequisite 'base' failed"
    assert eventually_constant(lambda: stacks.runs("app"), 4) == 0

    stacks.replace_program("base", _big_program(150))  # fixed, and slow enough to watch the next block
    stacks.wait_ready("base", 120)
    released = stacks.wait_ready("app", 90)  # woken by base's success
    assert released["status"]["lastUpdate"]["state"] == "succeeded"
    base_run = stacks.get("base")["status"]["lastUpdate"]["name"]

    processes.wait_until(lambda: _resync_age(stacks, "base") > 3, 10, "base's last run to be 3 s old")
    stacks.patch("app", {"spec": {"prerequisites": [
        {"name": "base", "requirement": {"succeededWithinDuration": "3s"}}]}})
    stale = stacks.wait("app", lambda o: has_condition(o, "Reconciling", "PrerequisiteNotSatisfied"), 30,
                        "blocked by the stale base")
    # Found out of date, base is asked to re-run; until that run completes app waits on it.
    assert condition(stale, "Reconciling")["message"] in ("prerequisite 'base' is out of date (older than 3s)",
                                                          "prerequisite 'base' has not run to completion")
    asked = stacks.get("base")["metadata"]["annotations"]["pulumi.com/reconciliation-request"]
    assert asked == f"after-{base_run}"
    released = stacks.wait("app", lambda o: has_condition(o, "Ready") and o["status"]["lastUpdate"]["generation"]
                           == o["metadata"]["generation"], 120, "released once base re-ran")
    assert stacks.get("base")["status"]["lastUpdate"]["name"] != base_run
