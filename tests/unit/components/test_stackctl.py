"""The pure half of `strata get|reconcile|suspend|resume|logs`: rows, ages, durations, the verdicts."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from strata_components import stackctl

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)
SHA = "0123456789abcdef0123456789abcdef01234567"


def _at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stack(name="web", ready="True", reason="ProcessingCompleted", message="up to date", true_kind="Ready",
           last=None, **status):
    kinds = {kind: {"type": kind, "status": "True" if kind == true_kind else "False",
                    "reason": reason if kind in (true_kind, "Ready") else "", "message": message if kind == true_kind
                    else ""} for kind in ("Ready", "Stalled", "Reconciling")}
    kinds["Ready"]["status"] = ready
    return {"metadata": {"name": name, "namespace": "apps", "creationTimestamp": _at(3 * 3600)},
            "status": {"conditions": list(kinds.values()), "lastUpdate": last or {}, **status}}


@pytest.mark.parametrize("seconds, shown", [(0, "0s"), (59, "59s"), (60, "1m"), (119 * 60, "119m"),
                                            (2 * 3600, "2h"), (47 * 3600, "47h"), (2 * 86400, "2d"), (-5, "0s")])
def test_ages_read_like_kubectl(seconds, shown):
    assert stackctl.format_age(seconds) == shown


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("1.5s", 1.5)])
def test_durations_take_seconds_or_go_style(text, seconds):
    assert stackctl.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m", "1d"])
def test_a_bad_duration_names_the_option_and_the_forms(text):
    with pytest.raises(stackctl.StackCtlError, match="--timeout .* is not a duration: give seconds or e.g. 90s"):
        stackctl.parse_duration(text)


def test_a_ready_stack_row():
    last = {"type": "up", "state": "succeeded", "lastResyncTime": _at(120), "lastSuccessfulCommit": SHA,
            "lastAttemptedCommit": SHA}
    row = stackctl.stack_row(_stack(last=last), NOW)
    assert row == stackctl.StackRow(namespace="apps", name="web", ready="True", reason="ProcessingCompleted",
                                    message="up to date", last_update="up succeeded 2m ago",
                                    last_update_time=_at(120), commit="01234567", age="3h")
    assert not row.failing


def test_a_failing_stack_row_shows_the_true_condition_and_the_attempted_commit():
    last = {"type": "up", "state": "failed", "lastResyncTime": _at(30), "lastAttemptedCommit": "program-digest-1"}
    row = stackctl.stack_row(_stack(ready="False", reason="RetryingAfterFailure", true_kind="Reconciling",
                                    message="2 update failure(s): missing region", last=last), NOW)
    assert (row.ready, row.reason, row.message, row.last_update, row.commit) == \
        ("False", "RetryingAfterFailure", "2 update failure(s): missing region", "up failed 30s ago",
         "program-digest-1")
    assert row.failing


def test_a_running_update_and_a_stack_never_reported_on():
    running = stackctl.stack_row(_stack(ready="False", reason="StackProcessing", true_kind="Reconciling",
                                        currentUpdate={"type": "destroy"}), NOW)
    assert running.last_update == "destroy running"
    fresh = stackctl.stack_row({"metadata": {"name": "new", "namespace": "apps", "creationTimestamp": _at(5)}}, NOW)
    assert (fresh.ready, fresh.reason, fresh.last_update, fresh.commit, fresh.age) == \
        ("Unknown", "-", "-", "-", "5s")
    assert fresh.message == "the operator has not reported on it yet"


def test_the_table_aligns_columns_and_shows_messages_only_for_failing_stacks():
    good = stackctl.StackRow("apps", "web", "True", "ProcessingCompleted", "up to date", "up succeeded 2m ago", "",
                             "01234567", "3h")
    bad = stackctl.StackRow("team-a", "db", "False", "UpdateFailed", "plugin missing: install it", "up failed 5s ago",
                            "", "-", "1d")
    assert stackctl.render_table([good, bad], all_namespaces=True).splitlines() == [
        "NAMESPACE   NAME   READY   REASON                LAST UPDATE           COMMIT     AGE   MESSAGE",
        "apps        web    True    ProcessingCompleted   up succeeded 2m ago   01234567   3h",
        "team-a      db     False   UpdateFailed          up failed 5s ago      -          1d    plugin missing: install it",
    ]
    assert stackctl.render_table([good], all_namespaces=False).splitlines()[0].startswith("NAME   READY")


REQUEST = "2026-11-23T12:00:00.000000Z"


def test_reconcile_waits_until_the_operator_answered_this_request():
    stale = _stack(observedReconcileRequest="earlier")
    assert stackctl.reconcile_verdict(stale, REQUEST) == stackctl.ReconcileVerdict(
        False, False, "Requested", "waiting for the operator to pick the request up")
    processing = _stack(ready="False", reason="StackProcessing", true_kind="Reconciling", message="processing",
                        observedReconcileRequest=REQUEST, currentUpdate={"type": "up"})
    assert stackctl.reconcile_verdict(processing, REQUEST) == stackctl.ReconcileVerdict(
        False, False, "StackProcessing", "processing")


def test_reconcile_succeeds_on_ready_and_fails_on_stalled():
    ready = _stack(observedReconcileRequest=REQUEST)
    assert stackctl.reconcile_verdict(ready, REQUEST) == stackctl.ReconcileVerdict(True, True, "ProcessingCompleted",
                                                                                   "up to date")
    stalled = _stack(ready="False", reason="UpdateFailed", true_kind="Stalled", message="install the plugin",
                     observedReconcileRequest=REQUEST)
    assert stackctl.reconcile_verdict(stalled, REQUEST) == stackctl.ReconcileVerdict(
        True, False, "UpdateFailed", "install the plugin")


def test_reconcile_fails_when_the_run_for_this_request_failed_and_waits_for_a_retry():
    failed = {"state": "failed", "reason": "UpdateFailed", "message": "missing region", "reconcileRequest": REQUEST}
    retrying = _stack(ready="False", reason="RetryingAfterFailure", true_kind="Reconciling",
                      message="1 update failure(s)", observedReconcileRequest=REQUEST, last=failed)
    assert stackctl.reconcile_verdict(retrying, REQUEST) == stackctl.ReconcileVerdict(
        True, False, "UpdateFailed", "missing region")
    older = _stack(ready="False", reason="RetryingAfterFailure", true_kind="Reconciling", message="retrying",
                   observedReconcileRequest=REQUEST, last={**failed, "reconcileRequest": "earlier"})
    assert not stackctl.reconcile_verdict(older, REQUEST).done, "an earlier request's failure is not this one's"


def test_resume_waits_until_the_operator_planned_on_the_resumed_generation():
    still = _stack(ready="True", reason="Suspended", message="suspended", observedGeneration=7)
    assert not stackctl.resume_verdict(still, 7).done, "the operator has not seen suspend: false yet"
    older = _stack(observedGeneration=6)
    assert not stackctl.resume_verdict(older, 7).done
    running = _stack(ready="False", reason="StackProcessing", true_kind="Reconciling", message="processing",
                     observedGeneration=7, currentUpdate={"type": "up"})
    assert not stackctl.resume_verdict(running, 7).done
    assert stackctl.resume_verdict(_stack(observedGeneration=7), 7) == stackctl.ReconcileVerdict(
        True, True, "ProcessingCompleted", "up to date")
    failed = {"state": "failed", "reason": "UpdateFailed", "message": "missing region", "generation": 7}
    retrying = _stack(ready="False", reason="RetryingAfterFailure", true_kind="Reconciling", message="retrying",
                      observedGeneration=7, last=failed)
    assert stackctl.resume_verdict(retrying, 7) == stackctl.ReconcileVerdict(True, False, "UpdateFailed",
                                                                             "missing region")
    before = _stack(ready="False", reason="RetryingAfterFailure", true_kind="Reconciling", message="retrying",
                    observedGeneration=7, last={**failed, "generation": 5})
    assert not stackctl.resume_verdict(before, 7).done, "a failure from before the resume is not its answer"


DIGEST = "sha256:" + "ab" * 32


def test_approve_waits_until_that_plan_was_applied_or_replaced():
    waiting = _stack(ready="False", reason="AwaitingApproval", true_kind="Reconciling", message="awaits approval",
                     plan={"digest": DIGEST})
    assert stackctl.approve_verdict(waiting, DIGEST) == stackctl.ReconcileVerdict(False, False, "AwaitingApproval",
                                                                                  "awaits approval")
    applying = _stack(ready="False", reason="StackProcessing", true_kind="Reconciling", message="processing",
                      plan={"digest": DIGEST}, currentUpdate={"type": "up"}, last={"plan": DIGEST, "state": "failed"})
    assert not stackctl.approve_verdict(applying, DIGEST).done, "an earlier try of the plan is not the answer"
    applied = _stack(last={"plan": DIGEST, "state": "succeeded"})
    assert stackctl.approve_verdict(applied, DIGEST) == stackctl.ReconcileVerdict(True, True, "PlanApplied",
                                                                                  f"plan {DIGEST} applied")
    refused = _stack(ready="False", reason="AwaitingApproval", true_kind="Reconciling", message="new plan",
                     last={"plan": DIGEST, "state": "failed", "reason": "PlanRefused", "message": "violates plan"})
    assert stackctl.approve_verdict(refused, DIGEST) == stackctl.ReconcileVerdict(True, False, "PlanRefused",
                                                                                  "violates plan")
    replaced = _stack(ready="False", reason="AwaitingApproval", true_kind="Reconciling", message="plan B awaits",
                      plan={"digest": "sha256:" + "cd" * 32})
    verdict = stackctl.approve_verdict(replaced, DIGEST)
    assert (verdict.done, verdict.ok, verdict.reason) == (True, False, "PlanReplaced")
    assert "was replaced before it was applied: plan B awaits" in verdict.message


def test_the_update_log_sits_in_the_stacks_directory_of_the_operator_state(monkeypatch, tmp_path):
    assert stackctl.update_log_path(Path("/s"), "apps", "web") == Path("/s/stacks/apps/web/last-update.json")
    monkeypatch.delenv("STRATA_OPERATOR_STATE", raising=False)
    monkeypatch.setenv("STRATA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert stackctl.operator_state_dirs() == [tmp_path / "home" / "platform" / "operator",
                                              tmp_path / "user" / ".cache" / "strata" / "operator"]
    monkeypatch.setenv("STRATA_OPERATOR_STATE", "/elsewhere")
    assert stackctl.operator_state_dirs()[0] == Path("/elsewhere")
