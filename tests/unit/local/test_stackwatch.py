from strata_components.local import stackwatch
from strata_components.local.stackwatch import StackState


def _stack(name, namespace="strata-system", conditions=(), deleting=False):
    meta = {"name": name, "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    # Conditions set after the deletion began, as the operator's finalizer writes them.
    return {"metadata": meta, "status": {"conditions": [
        {"type": kind, "status": status, "reason": reason, "message": message,
         "lastTransitionTime": "2026-11-23T00:00:05Z"}
        for kind, status, reason, message in conditions]}}


READY = [("Ready", "True", "ProcessingCompleted", "")]
RETRYING = [("Ready", "False", "NotReadyInProgress", ""),
            ("Reconciling", "True", "RetryingAfterFailure", "1 update failure(s): boom")]
STALLED = [("Ready", "False", "NotReadyStalled", ""), ("Stalled", "True", "UpdateFailed", "5 consecutive failures")]


def test_a_stack_shows_the_condition_that_is_true_with_its_reason_and_message():
    assert stackwatch.stack_state(_stack("p", conditions=READY)) == StackState("strata-system/p", "Ready",
                                                                               "ProcessingCompleted")
    assert stackwatch.stack_state(_stack("p", conditions=RETRYING)) == StackState(
        "strata-system/p", "Reconciling", "RetryingAfterFailure", "1 update failure(s): boom")
    assert stackwatch.stack_state(_stack("p", conditions=STALLED)).state == "Stalled"
    assert stackwatch.stack_state(_stack("p")).state == "Pending"
    deleting = stackwatch.stack_state(_stack("p", conditions=RETRYING, deleting=True))
    assert (deleting.state, deleting.reason) == ("Deleting", "RetryingAfterFailure")


def test_expected_stacks_that_do_not_exist_yet_are_missing():
    states = stackwatch.snapshot([_stack("a", conditions=READY)], expected=["strata-system/a", "team-x/team-x"])
    assert states["team-x/team-x"].state == "Missing"
    assert not stackwatch.ready_verdict(states).done


def test_one_progress_line_per_change_and_none_when_nothing_changed():
    before = stackwatch.snapshot([_stack("a", conditions=RETRYING), _stack("b", conditions=READY)])
    after = stackwatch.snapshot([_stack("a", conditions=READY), _stack("b", conditions=READY)])
    assert stackwatch.changes(before, after) == ["  strata-system/a: Ready (ProcessingCompleted)"]
    assert stackwatch.changes(after, after) == []
    assert stackwatch.changes(after, {}) == ["  strata-system/a: gone", "  strata-system/b: gone"]
    assert "RetryingAfterFailure): 1 update failure(s): boom" in stackwatch.changes({}, before)[0]


def test_ready_when_all_are_ready_failed_when_one_is_stalled():
    ready = stackwatch.snapshot([_stack("a", conditions=READY)])
    assert stackwatch.ready_verdict(ready).done
    stalled = stackwatch.snapshot([_stack("a", conditions=READY), _stack("b", conditions=STALLED)])
    verdict = stackwatch.ready_verdict(stalled)
    assert not verdict.done and [s.key for s in verdict.failed] == ["strata-system/b"]
    assert not stackwatch.ready_verdict({}).done  # nothing seen is not "all Ready"


def test_gone_when_no_stack_is_left():
    assert stackwatch.gone_verdict({}).done
    destroy_blocked = [("Ready", "False", "NotReadyStalled", ""), ("Stalled", "True", "DestroyBlocked", "no ref")]
    blocked = stackwatch.snapshot([_stack("a", conditions=destroy_blocked, deleting=True)])
    assert stackwatch.gone_verdict(blocked).failed


def test_watch_says_each_change_and_stops_at_the_verdict(monkeypatch):
    monkeypatch.setattr(stackwatch, "POLL_SECONDS", 0)
    rounds = iter([[_stack("a", conditions=RETRYING)], [_stack("a", conditions=RETRYING)],
                   [_stack("a", conditions=READY)]])
    said = []
    verdict, states = stackwatch.watch(lambda: next(rounds), stackwatch.ready_verdict, timeout=60, say=said.append)
    assert verdict.done and states["strata-system/a"].state == "Ready"
    assert len(said) == 2 and "Reconciling" in said[0] and "Ready" in said[1]


def test_watch_gives_up_at_the_timeout_and_survives_an_api_error(monkeypatch):
    monkeypatch.setattr(stackwatch, "POLL_SECONDS", 0)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("refused")
        return [_stack("a", conditions=RETRYING)]

    said = []
    verdict, _states = stackwatch.watch(flaky, stackwatch.ready_verdict, timeout=0.05, say=said.append)
    assert not verdict.done and not verdict.failed
    assert not [line for line in said if "cannot list" in line]  # a short hiccup is not worth a line
    assert "Reconciling" in said[0]


def test_watch_says_so_when_the_api_server_stays_away(monkeypatch):
    monkeypatch.setattr(stackwatch, "POLL_SECONDS", 0)
    monkeypatch.setattr(stackwatch, "API_PATIENCE", 0.02)

    def refused():
        raise ConnectionError("refused")

    said = []
    stackwatch.watch(refused, stackwatch.ready_verdict, timeout=0.1, say=said.append)
    assert said and "cannot list Stacks for" in said[0] and "refused" in said[0]


def test_other_kinds_are_keyed_by_kind_and_a_false_ready_is_not_ready():
    kustomization = {"kind": "Kustomization", "metadata": {"name": "flux-system", "namespace": "flux-system"},
                     "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "HealthCheckFailed",
                                                "message": "timeout waiting for: [Stack/team-alpha/app]"}],
                                "lastAppliedRevision": "main@sha1:abc"}}
    state = stackwatch.stack_state(kustomization)
    assert (state.key, state.state, state.reason) == ("kustomization flux-system/flux-system", "NotReady",
                                                      "HealthCheckFailed")
    assert "timeout waiting for" in state.line()
    line, = stackwatch.flux_lines([kustomization])
    assert line.split()[:5] == ["kustomization", "flux-system/flux-system", "main@sha1:abc", "False", "timeout"]


def test_only_the_finalizers_stall_of_a_deleting_stack_is_a_failed_destroy():
    def deleted_stack(stalled_at, reason="SourceUnavailable"):
        stack = _stack("app", "team-alpha", deleting=True, conditions=[
            ("Ready", "False", "NotReadyStalled", ""), ("Stalled", "True", reason, "source gone")])
        stack["status"]["conditions"][1]["lastTransitionTime"] = stalled_at
        return stack

    # Its Flux source was pruned a second before the Stack itself: the destroy has not spoken yet.
    before = stackwatch.stack_state(deleted_stack("2026-11-22T23:59:59Z"))
    assert (before.state, before.reason) == ("Deleting", "SourceUnavailable")
    # Nor has it when a pass that began before the deletion writes that stall a moment after it (seen in CI).
    assert stackwatch.stack_state(deleted_stack("2026-11-23T00:00:01Z")).state == "Deleting"
    # The finalizer's own stalls, once the deletion began: the destroy cannot proceed.
    for reason in ("DestroyBlocked", "NamespaceTerminating"):
        assert stackwatch.stack_state(deleted_stack("2026-11-23T00:00:01Z", reason)).state == "Stalled"
    assert stackwatch.stack_state(deleted_stack("2026-11-22T23:59:59Z", "DestroyBlocked")).state == "Deleting"


VIEW = stackwatch.OperatorView(pid=4242, last_line="", log="/p/logs/strata-operator.log",
                               lease="strata-system/strata-operator-leader")


def test_a_pending_stack_says_the_operator_is_not_running_with_its_last_words():
    import dataclasses

    dead = dataclasses.replace(VIEW, pid=None, last_line="cannot start: the metrics port 8383 (--metrics-port) is "
                                                         "already in use on this host; fix: ...")
    why = stackwatch.operator_blocker(dead, "host")
    assert why.startswith("the operator is not running (log: /p/logs/strata-operator.log; `make up` starts it "
                          "again); it last said: cannot start: the metrics port 8383")
    pending = {"strata-system/p": StackState("strata-system/p", "Pending", "", stackwatch.PENDING)}
    line = stackwatch.explain_pending(pending, why)["strata-system/p"].line()
    assert line == f"  strata-system/p: Pending: {why}"[:240 + len("  strata-system/p: Pending: ")]
    # However long its last line, the progress line keeps the log's path.
    long = stackwatch.operator_blocker(dataclasses.replace(dead, last_line="x" * 1000), "host")
    assert "(log: /p/logs/strata-operator.log" in StackState("s/p", "Pending", "", long).line()


def test_the_operator_standing_by_or_without_the_lease_is_named_and_a_leader_is_not():
    import dataclasses

    other = dataclasses.replace(VIEW, holder="elsewhere_7", renewed_seconds_ago=3.0)
    assert stackwatch.operator_blocker(other, "host") == (
        "the operator (pid 4242) is standing by: the Lease strata-system/strata-operator-leader is held by "
        "elsewhere_7, renewed 3 s ago (log: /p/logs/strata-operator.log)")
    lapsed = dataclasses.replace(other, renewed_seconds_ago=40.0)
    assert "has not taken the Lease strata-system/strata-operator-leader yet" in stackwatch.operator_blocker(lapsed,
                                                                                                           "host")
    assert "has not taken" in stackwatch.operator_blocker(VIEW, "host")  # no Lease yet
    assert stackwatch.operator_blocker(dataclasses.replace(VIEW, holder="host_4242", renewed_seconds_ago=1.0),
                                       "host") == ""


def test_only_pending_stacks_take_the_reason_and_the_watch_says_it_at_once(monkeypatch):
    monkeypatch.setattr(stackwatch, "POLL_SECONDS", 0)
    states = {"s/a": StackState("s/a", "Pending", "", stackwatch.PENDING),
              "s/b": StackState("s/b", "Ready", "ProcessingCompleted"),
              "kustomization s/c": StackState("kustomization s/c", "Pending", "", stackwatch.PENDING)}
    explained = stackwatch.explain_pending(states, "the operator is not running")
    assert explained["s/a"].message == "the operator is not running"
    assert explained["s/b"] == states["s/b"] and explained["kustomization s/c"] == states["kustomization s/c"]
    assert stackwatch.explain_pending(states, "") == states
    reasons = iter(["", "the operator is not running (log: x)"])
    rounds = iter([[_stack("a")], [_stack("a")], [_stack("a", conditions=READY)]])
    said = []
    stackwatch.watch(lambda: next(rounds), stackwatch.ready_verdict, timeout=60, say=said.append,
                     blocker=lambda: next(reasons))
    assert said == ["  strata-system/a: Pending: not yet picked up by its controller",
                    "  strata-system/a: Pending: the operator is not running (log: x)",
                    "  strata-system/a: Ready (ProcessingCompleted)"]
