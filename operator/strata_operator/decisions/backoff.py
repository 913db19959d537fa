"""Retry delays after failed updates: exponential, capped, deterministic (PKO's schedule).

The first failure waits 10 s, each further consecutive failure triples the wait, up to 24 h or the
Stack's `retryMaxBackoffDurationSeconds`. A new commit or spec change bypasses the wait entirely
(that is decided in planning, not here).
"""

from __future__ import annotations

BASE_SECONDS = 10.0
FACTOR = 3.0
DEFAULT_CAP_SECONDS = 24 * 3600.0


def cooldown_seconds(failures: int, max_backoff_seconds: int = 0) -> float:
    """Seconds to wait after `failures` consecutive failed updates (0 when nothing failed)."""
    if failures <= 0:
        return 0.0
    cap = float(max_backoff_seconds) if max_backoff_seconds > 0 else DEFAULT_CAP_SECONDS
    # Stop at the cap: the failure count of a long-failing Stack grows without bound.
    delay = BASE_SECONDS
    for _ in range(failures - 1):
        delay *= FACTOR
        if delay >= cap:
            return cap
    return min(delay, cap)
