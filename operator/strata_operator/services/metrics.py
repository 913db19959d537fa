"""Prometheus metrics on their own registry and port: stacks_active, stacks_failing, stacks_drifted, update
durations, drift checks, and whether the API server answers (api_server_failing, api_server_errors_total).

They name every team's Stacks, so they are served on loopback by default (`--metrics-bind-address`), and on
any other address only to whom the cluster says may read them (`--metrics-auth kubernetes`, as
controller-runtime's `--metrics-secure` and kube-rbac-proxy do): the request's bearer token is checked with a
TokenReview, its user with a SubjectAccessReview for `get` on the non-resource URL /metrics (what the
ClusterRole strata-metrics-reader grants), each answer kept for a short while per token. Plain HTTP: a
scraper's token crosses the pod network unencrypted."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()
STACKS_ACTIVE = Gauge("stacks_active", "Stacks the operator is managing", registry=REGISTRY)
STACKS_FAILING = Gauge("stacks_failing", "1 while a Stack's last update failed or it is stalled",
                       ["namespace", "name"], registry=REGISTRY)
STACKS_DRIFTED = Gauge("stacks_drifted", "1 while a Stack's last drift check found changes made outside Pulumi",
                       ["namespace", "name"], registry=REGISTRY)
DRIFT_CHECKS = Counter("drift_checks", "Drift checks (refresh previews) by outcome", ["outcome"], registry=REGISTRY)
API_FAILING = Gauge("api_server_failing", "1 while the operator's calls to the API server fail (5xx, 429, "
                    "timeouts, refused connections); alert on it staying 1", registry=REGISTRY)
API_ERRORS = Counter("api_server_errors", "The operator's API calls that failed for the server's sake, by cause",
                     ["cause"], registry=REGISTRY)
UPDATE_DURATION = Histogram("stack_update_duration_seconds", "Duration of engine operations",
                            ["operation", "outcome"], registry=REGISTRY,
                            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))


def mark_failing(namespace: str, name: str, failing: bool) -> None:
    if failing:
        STACKS_FAILING.labels(namespace, name).set(1)
    else:
        _remove(STACKS_FAILING, namespace, name)


def mark_drifted(namespace: str, name: str, drifted: bool) -> None:
    if drifted:
        STACKS_DRIFTED.labels(namespace, name).set(1)
    else:
        _remove(STACKS_DRIFTED, namespace, name)


def forget(namespace: str, name: str) -> None:
    _remove(STACKS_FAILING, namespace, name)
    _remove(STACKS_DRIFTED, namespace, name)


def _remove(gauge: Gauge, namespace: str, name: str) -> None:
    try:
        gauge.remove(namespace, name)
    except KeyError:
        pass


METRICS_PATH = "/metrics"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
METRICS_READER_ROLE = "strata-metrics-reader"
# How long an answer about a token stands: a scraper allowed is asked about again each minute, a refused
# token (a new grant, a typo fixed) after 10 s. A token whose grant was revoked reads at most a minute more.
ALLOWED_SECONDS = 60.0
REFUSED_SECONDS = 10.0
REMEMBERED_TOKENS = 1024  # random tokens cannot grow the memory of answers past this


@dataclasses.dataclass(frozen=True)
class MetricsServing:
    """Where the metrics are served and to whom (--metrics-port, --metrics-bind-address, --metrics-auth)."""

    port: int = 8383
    """0: not served."""
    address: str = "127.0.0.1"
    auth: str = "none"
    """"kubernetes": only to clients whose bearer token the API server accepts, for a user it lets get /metrics."""


@dataclasses.dataclass(frozen=True)
class Access:
    """The answer to one request for the metrics: its HTTP status and why."""

    status: int
    reason: str


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` header; "" for none or another scheme."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def build_token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def build_access_review(user: Mapping[str, Any]) -> dict[str, Any]:
    """The SubjectAccessReview of `user` (a TokenReview's status.user) getting /metrics."""
    spec: dict[str, Any] = {"user": user.get("username", ""),
                            "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"}}
    for field in ("uid", "groups", "extra"):
        if user.get(field):
            spec[field] = user[field]
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def decide_access(authentication: Mapping[str, Any], authorization: Mapping[str, Any] | None) -> Access:
    """The answer to a request from the status of its token's TokenReview and, once that authenticated
    someone, of their SubjectAccessReview."""
    user = (authentication.get("user") or {}).get("username", "")
    if not authentication.get("authenticated") or not user:
        return Access(401, "the bearer token is not one the API server accepts")
    if authorization is None or not authorization.get("allowed") or authorization.get("denied"):
        return Access(403, f"{user} may not get {METRICS_PATH}: bind the ClusterRole {METRICS_READER_ROLE} to it")
    return Access(200, f"{user} may get {METRICS_PATH}")


NO_TOKEN = Access(401, f"send a bearer token of a user who may get {METRICS_PATH} (ClusterRole {METRICS_READER_ROLE})")


class ReviewedAccess:
    """Who may read the metrics, as the API server says (`review`: POST a review to its path, answer its
    status), remembered per token (by digest) for a short while."""

    def __init__(self, review: Callable[[str, dict[str, Any]], Mapping[str, Any]],
                 clock: Callable[[], float] = time.monotonic):
        self.review, self.clock = review, clock
        self._answers: dict[bytes, tuple[float, Access]] = {}
        self._lock = threading.Lock()

    def check(self, authorization: str) -> Access:
        token = bearer_token(authorization)
        if not token:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).digest()
        with self._lock:
            until, access = self._answers.get(key, (0.0, None))
        if access is not None and self.clock() < until:
            return access
        try:
            authentication = self.review(TOKEN_REVIEWS, build_token_review(token))
            user = (authentication.get("user") or {}) if authentication.get("authenticated") else {}
            authorization = self.review(ACCESS_REVIEWS, build_access_review(user)) if user.get("username") else None
        except Exception as err:  # noqa: BLE001 - no answer is not a refusal: say so, remember nothing
            logger.warning("cannot review a metrics request's token: %s", type(err).__name__)
            return Access(503, "the API server did not answer whether this token may read the metrics; try again")
        access = decide_access(authentication, authorization)
        self._remember(key, access)
        return access

    def _remember(self, key: bytes, access: Access) -> None:
        now = self.clock()
        with self._lock:
            if len(self._answers) >= REMEMBERED_TOKENS:
                self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            while len(self._answers) >= REMEMBERED_TOKENS:
                del self._answers[next(iter(self._answers))]  # the oldest
            self._answers[key] = (now + (ALLOWED_SECONDS if access.status == 200 else REFUSED_SECONDS), access)


def metrics_app(access: ReviewedAccess | None) -> Callable[..., Iterable[bytes]]:
    """The WSGI app of the metrics: Prometheus's exposition, behind `access` when there is one."""
    exposition = make_wsgi_app(REGISTRY)
    if access is None:
        return exposition

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            answer, headers = Access(404, f"not found; the metrics are at {METRICS_PATH}"), []
        else:
            answer = access.check(environ.get("HTTP_AUTHORIZATION", ""))
            if answer.status == 200:
                return exposition(environ, start_response)
            headers = [("WWW-Authenticate", 'Bearer realm="strata-operator metrics"')] if answer.status == 401 else []
        start_response(f"{answer.status} {HTTPStatus(answer.status).phrase}",
                       [("Content-Type", "text/plain; charset=utf-8"), *headers])
        return [f"{answer.reason}\n".encode()]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """No access log (the operator's log is for Stacks)."""


def serve(port: int, address: str = "127.0.0.1", access: ReviewedAccess | None = None) -> WSGIServer:
    """Serve the metrics on `address`:`port` from a thread of their own (a thread per request); OSError if
    it cannot be bound."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    server = make_server(address, port, metrics_app(access), Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def render() -> str:
    return generate_latest(REGISTRY).decode()
