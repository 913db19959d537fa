"""Keep secrets out of logs, events, status and exception text, each namespace's to itself.

Every secret value the operator resolves for an object (secretsRef values, envRefs from Secrets, git
tokens and keys, passphrases, minted ServiceAccount tokens, secret outputs) is registered with
`redactor_for(its namespace)` before it is used, and every string that object shows (status messages,
Event messages, errors Kopf records on it) is masked with that namespace's redactor. Scoped by
namespace, not by Stack: a namespace is a team's boundary, and its Stacks, Workspaces and Updates share
its Secrets anyway. One namespace's secrets never mask another's text: with one set for every tenant, a
team could mask words in everyone's status, and learn whether a guess is anyone's secret by watching
its own status turn it into [secret].

Every namespace's redactor also masks the operator's own credentials (`add_operator_secrets`) and, as
every redactor does, credentials in URLs, PEM private keys and authorization headers that nobody
registered (`mask_patterns`). The operator's own log, read by its admins only, masks every secret the
process has seen (`LOG_REDACTOR`, put on every root handler by `install_log_redaction`).
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


def mask_patterns(text: str) -> str:
    """Credentials in URLs' userinfo, PEM private keys and authorization headers, whoever's they are."""
    text = _PEM_KEY.sub(MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


class Redactor:
    """A thread-safe set of secret values and the masking of any text against them (and `mask_patterns`).
    Every value added is added to `also` too (the log's redactor, which masks every secret seen)."""

    def __init__(self, also: Redactor | None = None) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._also = also

    def add(self, *values: str | None) -> None:
        if self._also is not None:
            self._also.add(*values)
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
        return mask_patterns(text)

    def redact_all(self, texts: Iterable[str]) -> list[str]:
        return [self.redact(t) for t in texts]


def _variants(value: str) -> list[str]:
    """The value as given, each of its lines (multi-line keys get printed line by line), and base64."""
    variants = [value, value.strip()]
    variants += [line.strip() for line in value.splitlines() if line.strip()]
    variants.append(base64.b64encode(value.encode()).decode())
    return variants


LOG_REDACTOR = Redactor()

_scopes_lock = threading.Lock()
_scopes: dict[str, Redactor] = {}
_operator_secrets: set[str] = set()


def redactor_for(namespace: str) -> Redactor:
    """What masks the text of `namespace`'s objects: the secrets resolved in that namespace and the
    operator's own credentials, never another namespace's secrets."""
    with _scopes_lock:
        scope = _scopes.get(namespace)
        if scope is None:
            scope = _scopes[namespace] = Redactor(also=LOG_REDACTOR)
            scope.add(*_operator_secrets)
        return scope


def add_operator_secrets(*values: str | None) -> None:
    """The operator's own credentials: masked in every namespace's text (those seen later too) and the log."""
    with _scopes_lock:
        _operator_secrets.update(value for value in values if value)
        for scope in _scopes.values():
            scope.add(*values)
    LOG_REDACTOR.add(*values)


class RedactingFilter(logging.Filter):
    """Masks secrets in every record (message and arguments rendered first) before any handler sees it."""

    def __init__(self, redactor: Redactor = LOG_REDACTOR):
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


def install_log_redaction(redactor: Redactor = LOG_REDACTOR) -> None:
    """Attach the filter to every root handler, so Kopf's and ours are both covered."""
    root = logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(redactor))
