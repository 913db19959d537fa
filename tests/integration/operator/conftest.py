"""The real Strata operator as a host process on the local platform, and helpers to drive Stacks.

The operator's CRDs and RBAC are server-side applied as the Operator component renders them
(components.local.operator_host); the operator runs under a TokenRequest token of its own
ServiceAccount (so a missing RBAC rule fails these tests), with the toolchain's pulumi CLI and YAML host, and is ready when its Kopf health endpoint answers. No test
double anywhere in this tier: every update, failure, lock conflict and interruption is the real engine's.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.operator_host import OperatorHost, operator_host
from strata_components.local.platform import LocalPlatform
from strata_components.local.toolchain import Toolchain

pytestmark = pytest.mark.platform

PASSPHRASE = "operator-it-passphrase-5d1c"
GROUP, VERSION = "pulumi.com", "v1"
# Few failures before Stalled, so the failure tests finish in seconds (the default is 5).
STALL_AFTER_FAILURES = 3
# Branch heads polled every few seconds instead of every minute (PKO's floor), for the same reason.
MIN_RESYNC_SECONDS = 3


class Operator(OperatorHost):
    """The operator host process, plus what tests need: its log text and kill -9 of the whole tree."""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the operator and all its descendants at once, like a node losing the pod."""
        pid = self.pid()
        assert pid is not None, "the operator is not running"
        for victim in [pid, *processes.descendants(pid)]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        processes.wait_until(lambda: self.pid() is None, 10, "operator gone after kill -9")
        self.platform.stop_controller(self.process.name)  # forget the pid file


@pytest.fixture(scope="session")
def plugin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's plugin cache (PULUMI_HOME/plugins-style), empty until a test installs a plugin into it;
    never the user's own ~/.pulumi/plugins."""
    cache = tmp_path_factory.mktemp("operator-pulumi-home") / "plugins"
    cache.mkdir()
    return cache


@pytest.fixture(scope="session")
def operator(platform: LocalPlatform, toolchain: Toolchain, plugin_cache: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    host = operator_host(platform, toolchain, tmp_path_factory.mktemp("operator"), extra_args=(
        "--stall-after-failures", str(STALL_AFTER_FAILURES), "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
        "--plugin-cache", str(plugin_cache), "--verbose"))
    running = Operator(**{field.name: getattr(host, field.name) for field in dataclasses.fields(host)})
    running.start()
    try:
        yield running
    finally:
        running.stop()


# --- Stacks in a test's namespace ---------------------------------------------------------------


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def has_condition(obj: dict[str, Any] | None, ctype: str, reason: str | None = None) -> bool:
    found = condition(obj, ctype)
    return bool(found and found["status"] == "True" and (reason is None or found["reason"] == reason))


@dataclasses.dataclass
class Stacks:
    """Stacks, Programs and Secrets in one test namespace, on one file:// backend with a passphrase Secret."""

    api: client.ApiClient
    namespace: str
    backend: str
    operator: Operator

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def spec(self, **fields: Any) -> dict[str, Any]:
        """A Stack spec on this backend whose passphrase comes from a Secret, as a PKO user writes it."""
        base = {"stack": "dev", "backend": self.backend,
                "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                                         "secret": {"name": "pulumi", "key": "passphrase"}}}}
        base.update(fields)
        return base

    def secret(self, name: str, data: dict[str, str]) -> None:
        self.core.create_namespaced_secret(self.namespace, {
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})

    def program(self, name: str, program: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": name}, "program": program})

    def replace_program(self, name: str, program: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "programs", name,
                                                   [{"op": "replace", "path": "/program", "value": program}],
                                                   _content_type="application/json-patch+json")

    def create(self, name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": name}
        if annotations:
            metadata["annotations"] = annotations
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": metadata, "spec": spec})

    def patch(self, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", name, body)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", name)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, "stacks", name)

    def wait(self, name: str, predicate, timeout: float = 60, what: str = "") -> dict[str, Any]:
        """Poll the Stack until `predicate(obj)`; on timeout say what it looked like last."""
        last: dict[str, Any] = {}

        def check():
            obj = self.get(name)
            last["obj"] = obj
            return obj if obj is not None and predicate(obj) else None

        try:
            return processes.wait_until(check, timeout, f"Stack {name}: {what}", log=self.operator.log, interval=0.3)
        except processes.ProcessError as error:
            status = (last.get("obj") or {}).get("status")
            raise AssertionError(f"{error}; last status: {status}") from None

    def wait_ready(self, name: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait(name, lambda o: has_condition(o, "Ready"), timeout, "Ready=True")

    def wait_stalled(self, name: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait(name, lambda o: has_condition(o, "Stalled", reason), timeout, f"Stalled/{reason}")

    def events(self, name: str, reason: str | None = None) -> list[client.CoreV1Event]:
        found = self.core.list_namespaced_event(self.namespace,
                                                field_selector=f"involvedObject.name={name},involvedObject.kind=Stack")
        return [e for e in found.items if reason is None or e.reason == reason]

    def wait_events(self, name: str, reason: str, count: int = 1, timeout: float = 15) -> list[client.CoreV1Event]:
        """Kopf posts Events in the background, after the status they go with: poll for `count` of them."""
        processes.wait_until(lambda: len(self.events(name, reason)) >= count, timeout,
                             f"{count} {reason} Event(s) of Stack {name}", interval=0.3)
        return self.events(name, reason)

    def locks(self) -> list[Path]:
        """The lock files in the backend: one while an update holds its stack."""
        return list(Path(self.backend.removeprefix("file://")).glob(".pulumi/locks/**/*.json"))

    def runs(self, name: str) -> int:
        """Engine runs the operator started for this Stack (one StackUpdateDetected Event each)."""
        return len(self.events(name, "StackUpdateDetected"))


@pytest.fixture
def stacks(operator: Operator, kube_client, namespace: str, tmp_path: Path) -> Stacks:
    backend = tmp_path / "backend"
    backend.mkdir()
    env = Stacks(kube_client, namespace, backend.as_uri(), operator)
    env.secret("pulumi", {"passphrase": PASSPHRASE})
    return env


def team_identity(platform: Any, namespace: str, team: str) -> str:
    """A team's ServiceAccount and Role in `namespace`, exactly as the TeamEnvironment component renders
    them, server-side applied; returns the ServiceAccount's name (what a team's sync runs as)."""
    from strata_components.local.kube import server_side_apply
    from strata_components.team import build_team_objects
    from strata_components.team_entries import team_names

    server_side_apply(platform.kubeconfig_path, [obj for obj in build_team_objects(team, namespace)
                                                 if obj["kind"] != "Namespace"])
    return team_names(team, namespace)["service_account"]


def stash_program(**values: Any) -> dict[str, Any]:
    """A Program body with one `pulumi:index:Stash` per value, each exported as an output (its `input`:
    a Stash keeps its first `output` until replaced)."""
    return {"resources": {name: {"type": "pulumi:index:Stash", "properties": {"input": value}}
                          for name, value in values.items()},
            "outputs": {name: f"${{{name}.input}}" for name in values}}


def stash_project(name: str, **values: Any) -> str:
    """The same as a Pulumi YAML project file (for git and Flux sources)."""
    import yaml

    return yaml.safe_dump({"name": name, "runtime": "yaml", **stash_program(**values)}, sort_keys=False)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def eventually_constant(read, seconds: float, interval: float = 0.5):
    """Read `read()` repeatedly for `seconds`; assert it never changes; return the value."""
    first = read()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = read()
        assert now == first, f"changed while nothing changed: {first!r} -> {now!r}"
    return first


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked common_word_secret run after the others. A Stack's status and Events are masked with its
    own namespace's secrets only, but the operator's log masks every secret it has seen (one process serves
    the whole session), so a secret such as PKO's manifests' passphrase "test" turns every later "test" in
    its log (test namespaces' names among them, which some tests look for there) into [secret]."""
    items.sort(key=lambda item: item.get_closest_marker("common_word_secret") is not None)
