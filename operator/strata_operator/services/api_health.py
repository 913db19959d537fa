"""Whether the API server answers the operator's own calls (services/kube.py: Stack status, Leases, Secrets,
sources): one log line when they start failing (5xx, 429, timeouts, refused connections), one when it
answers again, and the metrics users alert on: `api_server_failing` (1 while failing) and
`api_server_errors_total{cause}`. A 4xx is an answer: the server is up, the request was refused."""

from __future__ import annotations

import logging
import threading
import time

from . import metrics

logger = logging.getLogger(__name__)


def failure_cause(status: int | None, error: BaseException | None = None) -> str | None:
    """What made a call fail for the server's sake ("HTTP 503", "ReadTimeoutError"), None if it answered."""
    if status is not None:
        return f"HTTP {status}" if status >= 500 or status == 429 else None
    return type(error).__name__ if error is not None else None


class ApiHealth:
    """The state of one API server as the operator's calls find it (calls run on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failing_since: float | None = None
        self.failures = 0

    def failed(self, cause: str, now: float | None = None) -> str | None:
        """Record a failed call; the line to log when it is the first of an outage."""
        metrics.API_ERRORS.labels(cause).inc()
        with self._lock:
            self.failures += 1
            if self.failing_since is not None:
                return None
            self.failing_since = time.monotonic() if now is None else now
        metrics.API_FAILING.set(1)
        return (f"the API server is failing ({cause}): Stacks wait, nothing is lost; the operator retries and "
                "catches up once it answers (metric api_server_failing is 1 meanwhile)")

    def answered(self, now: float | None = None) -> str | None:
        """Record an answered call; the line to log when it ends an outage."""
        with self._lock:
            if self.failing_since is None:
                return None
            lasted = (time.monotonic() if now is None else now) - self.failing_since
            failures, self.failing_since, self.failures = self.failures, None, 0
        metrics.API_FAILING.set(0)
        return f"the API server answers again after {lasted:.0f} s ({failures} failed call(s))"


API_HEALTH = ApiHealth()


def record(status: int | None, error: BaseException | None = None) -> None:
    """Log the start and end of an outage from one call's outcome (status None and no error: answered)."""
    cause = failure_cause(status, error)
    line = API_HEALTH.failed(cause) if cause else API_HEALTH.answered()
    if line:
        logger.log(logging.WARNING if cause else logging.INFO, "%s", line)
