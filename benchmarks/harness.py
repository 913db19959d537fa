"""Shared by the operator benchmarks: a scratch local platform with the real operator, and Stack helpers."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from strata_components.local.kube import api_client
from strata_components.local.processes import descendants
from strata_components.local.operator_host import OperatorHost, operator_host
from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.toolchain import installed

GROUP, VERSION = "pulumi.com", "v1"
PASSPHRASE = "benchmark-passphrase"
NAMESPACE = "bench"


def stash_program(count: int = 1) -> dict[str, Any]:
    """A Pulumi YAML program body with `count` builtin Stash resources (no provider plugin needed)."""
    return {"resources": {f"note{i}": {"type": "pulumi:index:Stash", "properties": {"input": f"value {i}"}}
                          for i in range(count)},
            "outputs": {"first": "${note0.input}"}}


@dataclasses.dataclass
class Bench:
    platform: LocalPlatform
    operator: OperatorHost
    api: client.ApiClient
    scratch: Path

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def backend(self, name: str) -> str:
        path = self.scratch / "backends" / name
        path.mkdir(parents=True, exist_ok=True)
        return path.as_uri()

    def create_program(self, name: str, program: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "programs", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Program", "metadata": {"name": name}, "program": program})

    def create_stack(self, name: str, program: str, backend: str) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name},
            "spec": {"stack": name, "backend": backend, "programRef": {"name": program},
                     "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {
                         "type": "Secret", "secret": {"name": "pulumi", "key": "passphrase"}}}}})

    def stacks(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks")["items"]

    def get_stack(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", name)


def is_ready(stack: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (stack.get("status") or {}).get("conditions") or [])


def _memory_kb(pid: int, path: str, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/{path}").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(field)), 0)


def rss_tree_mb(pid: int) -> tuple[float, float]:
    """(RSS of pid, RSS of all its descendants) in MB."""
    return (_memory_kb(pid, "status", "VmRSS:") / 1024,
            sum(_memory_kb(child, "status", "VmRSS:") for child in descendants(pid)) / 1024)


def pss_tree_mb(pid: int) -> float:
    """PSS of pid's descendants in MB: pages shared between forked workers counted once, not per process."""
    return sum(_memory_kb(child, "smaps_rollup", "Pss:") for child in descendants(pid)) / 1024


@contextlib.contextmanager
def platform_with_operator(operator_args: tuple[str, ...] = (),
                           host_controllers: tuple[str, ...] = ()) -> Iterator[Bench]:
    """A scratch platform and the real operator; `host_controllers` names the Flux controllers to run
    as host processes (none by default: the operator benchmarks need no Flux)."""
    toolchain = installed()
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as tmp:
        scratch = Path(tmp)
        platform = LocalPlatform(PlatformConfig(state_dir=scratch / "platform", host_controllers=host_controllers),
                                 toolchain=toolchain)
        try:
            platform.up(say=lambda _: None)
            operator = operator_host(platform, toolchain, scratch / "operator", extra_args=operator_args)
            operator.start()
            with api_client(platform.kubeconfig_path) as api:
                core = client.CoreV1Api(api)
                core.create_namespace({"metadata": {"name": NAMESPACE}})
                core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "pulumi"}, "data": {
                    "passphrase": base64.b64encode(PASSPHRASE.encode()).decode()}})
                yield Bench(platform, operator, api, scratch)
        finally:
            platform.down(say=lambda _: None)
