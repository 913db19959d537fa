"""Retry delays after failed updates: exponential, capped, deterministic (PKO's schedule).

The first failure waits 10 s, each further consecutive failure triples the wait, up to 24 h or the
Stack's `retryMaxBackoffDurationSeconds`. A new commit or spec change bypasses the wait entirely
(that is decided in planning, not here). Also the jittered retries of API requests (ApiRetryDelays).
"""

from __future__ import annotations

import random

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


# Kopf's retries of an API request that failed for the server's sake (5xx, 429, no answer). Kopf's own
# (1, 1, 2, 3, 5, 8, 13, 21) give up after 54 s, and a watch that gives up leaves its kind unwatched;
# these go on for API_RETRY_TOTAL_SECONDS, each delay jittered so that the requests of every Stack and
# watch failed together do not all come back in the same second (no thundering herd on recovery).
API_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
API_RETRY_TOTAL_SECONDS = 600.0
API_RETRY_JITTER = 0.5


class ApiRetryDelays:
    """An iterable of delays (Kopf's `settings.networking.error_backoffs`), fresh for every request:
    the schedule above, then 30 s, each times a random factor in [1 - jitter, 1 + jitter], until about
    API_RETRY_TOTAL_SECONDS have been waited."""

    def __init__(self, uniform=random.uniform):
        self.uniform = uniform

    def __iter__(self):
        waited = 0.0
        step = 0
        while waited < API_RETRY_TOTAL_SECONDS:
            base = API_RETRY_DELAYS[min(step, len(API_RETRY_DELAYS) - 1)]
            delay = base * self.uniform(1 - API_RETRY_JITTER, 1 + API_RETRY_JITTER)
            waited += delay
            step += 1
            yield delay
