"""Keep secrets out of logs, events, status and exception text.

Every secret value the operator resolves (secretsRef values, envRefs from Secrets, git tokens and
keys, passphrases, secret outputs) is registered with the process-wide `REDACTOR` before it is used;
every string that leaves the operator (status messages, Event messages, log records, errors raised
to Kopf) goes through `redact`. Credentials embedded in URLs and PEM private keys are masked even
when nobody registered them.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Iterable

MASK = "[secret]"
# Shorter values would mask ordinary words ("on", "dev"); no credential is that short.
MIN_SECRET_LENGTH = 4

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s:]+(?::[^/@\s]*)?)@")
_PEM_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.S)
_AUTH_HEADER = re.compile(r"(?i)(authorization:\s*(?:basic|bearer|token)\s+)\S+")


class Redactor:
    """A thread-safe set of secret values and the masking of any text against them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, *values: str | None) -> None:
        fresh = set()
        for value in values:
            if not value:
                continue
            for candidate in _variants(value):
                if len(candidate) >= MIN_SECRET_LENGTH and candidate not in self._values:
                    fresh.add(candidate)
        if not fresh:
            return
        with self._lock:
            self._values |= fresh
            # Longest first so a secret containing another is masked whole.
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def redact(self, text: str) -> str:
        if not text:
            return text
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MASK, text)
        text = _PEM_KEY.sub(MASK, text)
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
        return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)

    def redact_all(self, texts: Iterable[str]) -> list[str]:
        return [self.redact(t) for t in texts]


def _variants(value: str) -> list[str]:
    """The value as given, each of its lines (multi-line keys get printed line by line), and base64."""
    variants = [value, value.strip()]
    variants += [line.strip() for line in value.splitlines() if line.strip()]
    variants.append(base64.b64encode(value.encode()).decode())
    return variants


REDACTOR = Redactor()


def redact(text: str) -> str:
    return REDACTOR.redact(text)


class RedactingFilter(logging.Filter):
    """Masks secrets in every record (message and arguments rendered first) before any handler sees it."""

    def __init__(self, redactor: Redactor = REDACTOR):
        super().__init__()
        self._redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = None
        record.msg = self._redactor.redact(message)
        record.args = None
        return True


def install_log_redaction(redactor: Redactor = REDACTOR) -> None:
    """Attach the filter to every root handler, so Kopf's and ours are both covered."""
    root = logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(redactor))
