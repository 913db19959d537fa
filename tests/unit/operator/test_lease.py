"""Leader election's pure part: the Lease as read + this process's clock + identity -> what to do."""

from datetime import datetime, timezone

import pytest

from strata_operator.decisions.lease import (LEASE_DURATION_SECONDS, RENEW_DEADLINE_SECONDS, RENEW_PERIOD_SECONDS,
                                             LeaseRecord, Observation, decide, lease_object, micro_time, observe,
                                             release_spec)

WALL = datetime(2025, 1, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)
STAMP = "2025-01-01T12:00:00.250000Z"
EARLIER = "2025-01-01T11:00:00.000000Z"


def lease(holder="other_1", renew=EARLIER, duration=15, transitions=2, acquire=EARLIER):
    spec = {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": acquire,
            "renewTime": renew, "leaseTransitions": transitions}
    return {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
            "spec": {k: v for k, v in spec.items() if v is not None}}


def seen(obj, since=100.0):
    return Observation(LeaseRecord.of(obj), since)


def test_timings_leave_the_leader_time_to_stop_before_anyone_takes_over():
    assert RENEW_PERIOD_SECONDS < RENEW_DEADLINE_SECONDS < LEASE_DURATION_SECONDS
    # At least one retry fits between a failed renewal and the deadline.
    assert RENEW_DEADLINE_SECONDS - RENEW_PERIOD_SECONDS >= 2


def test_no_lease_creates_it_held_by_us():
    decision = decide(seen(None), "me_1", 100.0, WALL)
    assert decision.action == "create" and decision.holder == "me_1"
    assert decision.spec == {"holderIdentity": "me_1", "leaseDurationSeconds": 15, "acquireTime": STAMP,
                             "renewTime": STAMP, "leaseTransitions": 0}


def test_a_live_lease_of_another_holder_is_waited_for():
    decision = decide(seen(lease()), "me_1", 104.0, WALL)
    assert decision.action == "wait" and decision.holder == "other_1" and decision.spec is None
    assert decision.expires_in == pytest.approx(11.0)


def test_expiry_is_judged_on_our_clock_from_first_sight_not_on_renew_time():
    # renewTime is an hour old by our wall clock (skew, or a stale read): still live until we have
    # watched it unchanged for the whole duration.
    first = observe(None, LeaseRecord.of(lease()), 100.0)
    assert decide(first, "me_1", 100.0, WALL).action == "wait"
    assert decide(observe(first, LeaseRecord.of(lease()), 114.9), "me_1", 114.9, WALL).action == "wait"
    taken = decide(observe(first, LeaseRecord.of(lease()), 115.0), "me_1", 115.0, WALL)
    assert taken.action == "acquire" and taken.holder == "me_1"
    assert taken.spec == {"holderIdentity": "me_1", "leaseDurationSeconds": 15, "acquireTime": STAMP,
                          "renewTime": STAMP, "leaseTransitions": 3}


def test_a_renewal_restarts_the_wait():
    first = observe(None, LeaseRecord.of(lease()), 100.0)
    renewed = observe(first, LeaseRecord.of(lease(renew="2025-01-01T11:00:05.000000Z")), 112.0)
    assert renewed.since == 112.0
    assert decide(observe(renewed, renewed.record, 120.0), "me_1", 120.0, WALL).action == "wait"
    assert observe(renewed, LeaseRecord.of(lease(renew="2025-01-01T11:00:05.000000Z")), 130.0) is renewed


def test_the_holders_own_duration_counts():
    short = seen(lease(duration=3))
    assert decide(short, "me_1", 102.9, WALL).action == "wait"
    assert decide(short, "me_1", 103.0, WALL).action == "acquire"
    # Missing or nonsense durations fall back to the default rather than expiring at once.
    assert LeaseRecord.of(lease(duration=None)).duration_seconds == LEASE_DURATION_SECONDS
    assert LeaseRecord.of(lease(duration=0)).duration_seconds == LEASE_DURATION_SECONDS


def test_a_released_lease_is_taken_at_once():
    released = lease(holder=None, duration=1)
    decision = decide(seen(released), "me_1", 100.0, WALL)
    assert decision.action == "acquire" and decision.spec["leaseTransitions"] == 3
    assert decide(seen(lease(holder="")), "me_1", 100.0, WALL).action == "acquire"


def test_our_own_lease_is_renewed_keeping_acquire_time_and_transitions():
    decision = decide(seen(lease(holder="me_1"), since=0.0), "me_1", 1000.0, WALL)
    assert decision.action == "renew"
    assert decision.spec == {"holderIdentity": "me_1", "leaseDurationSeconds": 15, "acquireTime": EARLIER,
                             "renewTime": STAMP, "leaseTransitions": 2}


def test_release_hands_back_only_our_own_lease():
    spec = release_spec(LeaseRecord.of(lease(holder="me_1")), "me_1", WALL)
    assert spec == {"leaseDurationSeconds": 1, "acquireTime": EARLIER, "renewTime": STAMP, "leaseTransitions": 2}
    assert "holderIdentity" not in spec
    assert release_spec(LeaseRecord.of(lease()), "me_1", WALL) is None
    assert release_spec(None, "me_1", WALL) is None


def test_lease_objects_keep_the_resource_version_for_optimistic_updates():
    read = lease()
    replaced = lease_object("ns", "l", {"holderIdentity": "me_1"}, read)
    assert replaced["metadata"]["resourceVersion"] == "7"
    assert replaced["spec"] == {"holderIdentity": "me_1"}
    assert read["spec"]["holderIdentity"] == "other_1"  # the read object is not modified
    created = lease_object("ns", "l", {"holderIdentity": "me_1"}, labels={"a": "b"})
    assert created == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": "l", "namespace": "ns", "labels": {"a": "b"}},
                       "spec": {"holderIdentity": "me_1"}}


def test_micro_time_always_has_six_fractional_digits_in_utc():
    assert micro_time(datetime(2025, 1, 1, tzinfo=timezone.utc)) == "2025-01-01T00:00:00.000000Z"
    assert micro_time(WALL) == STAMP
