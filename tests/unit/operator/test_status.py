"""Conditions are kstatus-shaped and mutually exclusive; outputs mask secrets."""

from datetime import datetime, timedelta, timezone

from strata_operator.api.status import (SUSPENDED, RunRecord, Verdict, build_conditions, current_update, is_update_of,
                                        merge_patch, outputs_for_status, run_from_current_update, update_message,
                                        with_drifted)

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def by_type(conditions):
    return {c["type"]: c for c in conditions}


def test_ready_reconciling_stalled_are_exclusive():
    ready = by_type(build_conditions(None, Verdict("ready"), 3, T0))
    assert set(ready) == {"Ready"} and ready["Ready"]["status"] == "True"
    assert ready["Ready"]["reason"] == "ProcessingCompleted" and ready["Ready"]["observedGeneration"] == 3
    rec = by_type(build_conditions(None, Verdict("reconciling", "StackProcessing", "running"), 3, T0))
    assert set(rec) == {"Ready", "Reconciling"} and rec["Ready"]["status"] == "False"
    assert rec["Ready"]["reason"] == "NotReadyInProgress" and rec["Reconciling"]["reason"] == "StackProcessing"
    stalled = by_type(build_conditions(None, Verdict("stalled", "SpecInvalid", "spec.stack: bad"), 3, T0))
    assert set(stalled) == {"Ready", "Stalled"} and stalled["Ready"]["reason"] == "NotReadyStalled"


def test_transition_time_moves_only_when_status_flips():
    first = build_conditions(None, Verdict("reconciling", "StackProcessing", "a"), 1, T0)
    second = build_conditions(first, Verdict("stalled", "UpdateFailed", "b"), 1, T0 + timedelta(minutes=1))
    assert by_type(second)["Ready"]["lastTransitionTime"] == "2025-01-01T00:00:00Z"  # still False
    assert by_type(second)["Stalled"]["lastTransitionTime"] == "2025-01-01T00:01:00Z"
    third = build_conditions(second, Verdict("ready"), 1, T0 + timedelta(minutes=2))
    assert by_type(third)["Ready"]["lastTransitionTime"] == "2025-01-01T00:02:00Z"


def test_secret_outputs_are_masked():
    out = outputs_for_status({"url": ("http://x", False), "password": ("hunter22", True), "n": (3, False)})
    assert out == {"n": 3, "password": "[secret]", "url": "http://x"}


def test_merge_patch_nulls_what_the_new_value_dropped():
    old = {"state": "failed", "reason": "UpdateFailed", "failures": 2, "outputs": {"a": {"x": 1}, "gone": 1}}
    new = {"state": "succeeded", "failures": 0, "outputs": {"a": {"y": 2}}}
    assert merge_patch(old, new) == {"reason": None, "state": "succeeded", "failures": 0,
                                     "outputs": {"gone": None, "a": {"x": None, "y": 2}}}
    assert merge_patch(None, new) == new and merge_patch(old, None) is None


def test_suspended_is_ready_as_last_left_with_nothing_in_progress_or_stuck():
    for last_succeeded, ready in ((True, "True"), (False, "False")):
        conditions = build_conditions(None, Verdict("suspended", SUSPENDED, "suspended: ...", last_succeeded), 3, T0)
        # kstatus reads a resource with neither Reconciling nor Stalled as Current: not failed, not waiting.
        assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [("Ready", ready, "Suspended")]


def test_drifted_sits_beside_the_verdict_and_survives_new_verdicts():
    ready = build_conditions(None, Verdict("ready"), 2, T0)
    drifted = with_drifted(ready, True, "update 1 outside Pulumi", 2, T0)
    assert [(c["type"], c["status"]) for c in drifted] == [("Ready", "True"), ("Drifted", "True")]
    # kstatus still reads Ready alone: a drifted Stack is healthy, not Stalled.
    again = build_conditions(drifted, Verdict("reconciling", "StackProcessing", "updating"), 2, T0 + timedelta(1))
    assert [c["type"] for c in again] == ["Ready", "Reconciling", "Drifted"]
    assert by_type(again)["Drifted"]["lastTransitionTime"] == by_type(drifted)["Drifted"]["lastTransitionTime"]
    assert [c["type"] for c in with_drifted(again, False, "", 2, T0)] == ["Ready", "Reconciling"]


def test_a_runs_record_survives_status_with_its_project_flux_request_and_what_it_consumed():
    run = RunRecord(name="app-1a2b", kind="up", generation=3, reconcile_request="r", commit="abc",
                    started=datetime(2026, 11, 26, tzinfo=timezone.utc), host="op-0",
                    prerequisite_digests=(("infra", "d1"),), project="app", flux_request="2026-11-26T23:00:00Z")
    assert run_from_current_update(current_update(run)) == run


def test_an_update_message_names_its_run_and_only_that_run_matches():
    message = update_message("New stack generation: 3", "app-1a2b")
    assert message.startswith("New stack generation: 3") and is_update_of(message, "app-1a2b")
    assert not is_update_of(message, "app-1a2")  # a prefix of another run's name is not that run
    assert not is_update_of(message, "") and not is_update_of("New stack generation: 3", "app-1a2b")
    assert is_update_of(update_message("", "app-1a2b"), "app-1a2b")
