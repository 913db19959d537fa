"""Prometheus metrics on their own registry and port: stacks_active, stacks_failing, stacks_drifted, update
durations, drift checks, and whether the API server answers (api_server_failing, api_server_errors_total)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

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


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address, registry=REGISTRY)


def render() -> str:
    return generate_latest(REGISTRY).decode()
