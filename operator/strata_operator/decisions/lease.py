"""Leader election on a coordination.k8s.io/v1 Lease: the pure part (no I/O, no clock reads).

The rules are controller-runtime's (client-go leaderelection): a candidate takes a Lease that does
not exist, that nobody holds (released), or whose holder has not renewed it for its
`leaseDurationSeconds`; the holder renews it every few seconds and, if it cannot renew within
RENEW_DEADLINE_SECONDS (shorter than the duration), stops before anyone may take over.

"Has not renewed" is judged on this process's own monotonic clock, from when it first saw the Lease
as it is now, never by comparing `renewTime` with the local wall clock: so clock skew between the
holder's machine and ours can neither steal a live Lease nor keep a dead one.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Literal

API_VERSION = "coordination.k8s.io/v1"
DEFAULT_LEASE_NAME = "strata-operator-leader"
LEASE_DURATION_SECONDS = 15
RENEW_PERIOD_SECONDS = 5.0
# A leader that has not renewed for this long stops handling Stacks: a standby can take over only
# LEASE_DURATION_SECONDS after it last saw a renewal, so the leader is gone first.
RENEW_DEADLINE_SECONDS = 10.0
# How often a standby (or a leader whose renewal failed) tries again.
RETRY_PERIOD_SECONDS = 2.0

Action = Literal["create", "acquire", "renew", "wait"]


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease's spec that election reads; times stay as the API wrote them."""

    holder: str = ""
    duration_seconds: int = LEASE_DURATION_SECONDS
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0

    @classmethod
    def of(cls, lease: dict[str, Any] | None) -> "LeaseRecord | None":
        """The record of a Lease object as read (None: there is no Lease)."""
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(holder=spec.get("holderIdentity") or "",
                   duration_seconds=int(duration) if duration and int(duration) > 0 else LEASE_DURATION_SECONDS,
                   acquire_time=spec.get("acquireTime") or "", renew_time=spec.get("renewTime") or "",
                   transitions=int(spec.get("leaseTransitions") or 0))


@dataclasses.dataclass(frozen=True)
class Observation:
    """The Lease as last read, and when (monotonic seconds, this process's clock) it was first read so."""

    record: LeaseRecord | None
    since: float


def observe(previous: Observation | None, record: LeaseRecord | None, now: float) -> Observation:
    """Keep the time of first sight while the Lease is unchanged; any write by anyone resets it."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    holder: str
    """Who holds the Lease if the write (if any) succeeds."""
    spec: dict[str, Any] | None = None
    """The Lease spec to write (create/acquire/renew); None for wait."""
    expires_in: float = 0.0
    """wait: seconds until the holder's Lease lapses unless it renews first."""


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with exactly six fractional digits, UTC)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(holder: str, acquire_time: str, renew_time: str, transitions: int,
               duration: int = LEASE_DURATION_SECONDS) -> dict[str, Any]:
    return {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": acquire_time,
            "renewTime": renew_time, "leaseTransitions": transitions}


def decide(observation: Observation, identity: str, now: float, wall: datetime,
           duration: int = LEASE_DURATION_SECONDS) -> Decision:
    """What `identity` does with the Lease it observed: create, acquire, renew, or wait.

    `now` is monotonic seconds (the clock of `observation.since`); `wall` only stamps the written times."""
    stamp = micro_time(wall)
    record = observation.record
    if record is None:
        return Decision("create", identity, lease_spec(identity, stamp, stamp, 0, duration))
    if record.holder == identity:
        return Decision("renew", identity,
                        lease_spec(identity, record.acquire_time or stamp, stamp, record.transitions, duration))
    remaining = observation.since + record.duration_seconds - now
    if record.holder and remaining > 0:
        return Decision("wait", record.holder, expires_in=remaining)
    return Decision("acquire", identity, lease_spec(identity, stamp, stamp, record.transitions + 1, duration))


def release_spec(record: LeaseRecord | None, identity: str, wall: datetime) -> dict[str, Any] | None:
    """The spec that hands the Lease back at once (no holder, one-second duration), as client-go's
    ReleaseOnCancel writes it; None when `identity` does not hold it (nothing to release)."""
    if record is None or record.holder != identity:
        return None
    stamp = micro_time(wall)
    return {"leaseDurationSeconds": 1, "acquireTime": record.acquire_time or stamp, "renewTime": stamp,
            "leaseTransitions": record.transitions}


def lease_object(namespace: str, name: str, spec: dict[str, Any], read: dict[str, Any] | None = None,
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The Lease to create (read is None) or to replace: the object as read with the new spec, its
    resourceVersion kept so a concurrent writer makes the replace fail instead of being overwritten."""
    if read is None:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if labels:
            metadata["labels"] = dict(labels)
        return {"apiVersion": API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}
    return {**read, "apiVersion": API_VERSION, "kind": "Lease", "spec": spec}
