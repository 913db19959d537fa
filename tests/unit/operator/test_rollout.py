"""Progressive rollout: waves by selector and count, the gate each Stack passes, the Program's progress."""

from strata_operator.decisions.rollout import (ROLLOUT_HALTED, ROLLOUT_WAITING, RolloutStack, Wave, assign_waves,
                                               parse_waves, rollout_gate, rollout_progress, selector_matches)

NEW, OLD = "app/2", "app/1"
WAVES = [Wave(selector={"matchLabels": {"ring": "canary"}}), Wave(count=2)]


def stack(name, ring="", state="succeeded", commit=OLD, message=""):
    last = {"state": state, "lastSuccessfulCommit": commit if state == "succeeded" else OLD,
            "lastAttemptedCommit": commit, "message": message}
    return RolloutStack(name, {"ring": ring} if ring else {}, last)


def fleet(**overrides):
    names = {"c1": "canary", "c2": "canary", "a": "", "b": "", "d": "", "e": ""}
    return [overrides.get(name) or stack(name, ring) for name, ring in names.items()]


def test_waves_take_selected_then_counted_then_the_rest_by_name():
    assert assign_waves(WAVES, fleet()) == {"c1": 0, "c2": 0, "a": 1, "b": 1, "d": 2, "e": 2}
    assert parse_waves({"program": {}}) is None
    assert parse_waves({"rollout": {"waves": [{"count": 3}]}}) == [Wave(count=3)]


def test_selectors_read_like_kubernetes():
    labels = {"ring": "canary", "zone": "eu"}
    assert selector_matches({"matchLabels": {"ring": "canary"}}, labels)
    assert not selector_matches({"matchLabels": {"ring": "main"}}, labels)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu", "us"]}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["eu"]}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, labels)


def test_the_first_wave_goes_at_once_and_later_ones_wait_for_every_earlier_stack():
    stacks = fleet()
    assert rollout_gate(WAVES, stacks, "c1", NEW) is None
    waiting = rollout_gate(WAVES, stacks, "a", NEW)
    assert waiting.reason == ROLLOUT_WAITING and "wave 2 of 3" in waiting.message and "c1, c2" in waiting.message
    half = fleet(c1=stack("c1", "canary", commit=NEW))
    assert "c2" in rollout_gate(WAVES, half, "a", NEW).message and "c1" not in rollout_gate(WAVES, half, "a", NEW).message
    canaries_done = fleet(c1=stack("c1", "canary", commit=NEW), c2=stack("c2", "canary", commit=NEW))
    assert rollout_gate(WAVES, canaries_done, "a", NEW) is None
    assert rollout_gate(WAVES, canaries_done, "d", NEW).reason == ROLLOUT_WAITING, "the last wave waits for wave 2"


def test_a_failure_in_an_earlier_wave_halts_the_later_ones():
    broken = fleet(c1=stack("c1", "canary", state="failed", commit=NEW, message="missing config 'must'"),
                   c2=stack("c2", "canary", commit=NEW))
    halted = rollout_gate(WAVES, broken, "d", NEW)
    assert halted.reason == ROLLOUT_HALTED and "c1 of wave 1 failed" in halted.message
    assert "missing config 'must'" in halted.message
    assert rollout_gate(WAVES, broken, "c2", NEW) is None, "a Stack's own wave is not held by its peers"


def test_progress_says_which_wave_runs_and_why_it_halted():
    start = rollout_progress(WAVES, fleet(), NEW)
    assert start == {"revision": NEW, "complete": False, "currentWave": 1,
                     "waves": [{"stacks": 2, "succeeded": 0, "failed": []}, {"stacks": 2, "succeeded": 0, "failed": []},
                               {"stacks": 2, "succeeded": 0, "failed": []}]}
    broken = fleet(c1=stack("c1", "canary", state="failed", commit=NEW), c2=stack("c2", "canary", commit=NEW))
    assert rollout_progress(WAVES, broken, NEW)["halted"] == f"wave 1: c1 failed {NEW}; later waves wait"
    done = [stack(s.name, s.labels.get("ring", ""), commit=NEW) for s in fleet()]
    assert rollout_progress(WAVES, done, NEW)["complete"] is True
