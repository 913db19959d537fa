"""The Strata operator as a host process of the local platform, under a token of its own ServiceAccount.

Its CRDs and RBAC are server-side applied as the Operator component renders them, and its only
credential is a TokenRequest token of the ServiceAccount that RBAC binds: a missing rule shows up
as a failure, never hidden behind an admin kubeconfig. It gets a clean environment (see
processes.BASE_ENV) and the toolchain's pulumi CLI and YAML host.
"""

from __future__ import annotations

import dataclasses
import sys
import urllib.request
from pathlib import Path

from . import processes
from .kube import api_client, http_ok, server_side_apply, write_private
from .platform import LocalPlatform
from .toolchain import Toolchain

OPERATOR_NAMESPACE = "strata-system"
OPERATOR_SERVICE_ACCOUNT = "strata-operator"
PROCESS_NAME = "strata-operator"


def install_operator_api(kubeconfig: Path, field_manager: str = "strata", executor: str = "process") -> None:
    """CRDs (waited until Established), then the namespace, ServiceAccount and RBAC exactly as the
    Operator component renders them for `executor`, so whatever runs under this identity proves those objects."""
    from ..operator import build_operator_identity, build_operator_rbac, load_packaged_manifests

    apply_crds(kubeconfig, load_packaged_manifests("crds"), field_manager)
    server_side_apply(kubeconfig, [
        *build_operator_identity(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT),
        *build_operator_rbac(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, load_packaged_manifests("rbac"),
                            executor),
    ], field_manager=field_manager)


def serve_namespace(kubeconfig: Path, namespace: str, executors: tuple[str, ...] = ("process", "pod"),
                    field_manager: str = "strata") -> None:
    """Let the operator serve `namespace` as a team's environment does: its Roles there, for `executors`.
    Nothing cluster-wide lets it use Secrets, tokens or pods in a namespace (Stacks there stall as
    NamespaceNotServed until this, or a team environment, grants them)."""
    from ..operator import build_served_namespace_rbac, load_packaged_manifests

    grants = {(o["kind"], o["metadata"]["name"]): o for executor in executors
              for o in build_served_namespace_rbac(namespace, OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT,
                                                   load_packaged_manifests("rbac"), executor)}
    server_side_apply(kubeconfig, list(grants.values()), field_manager=field_manager)


def apply_crds(kubeconfig: Path, crds: list[dict], field_manager: str = "strata") -> None:
    """Server-side apply `crds` (new ones, or a new version's schema of existing ones) and wait until
    every one is Established."""
    from kubernetes import client

    server_side_apply(kubeconfig, crds, field_manager=field_manager)
    with api_client(kubeconfig) as api:
        extensions = client.ApiextensionsV1Api(api)

        def established() -> bool:
            return all(any(c.type == "Established" and c.status == "True"
                           for c in extensions.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions
                           or []) for crd in crds)

        processes.wait_until(established, 30, "Stack and Program CRDs established")


@dataclasses.dataclass
class OperatorHost:
    """A started (or startable) operator host process."""

    platform: LocalPlatform
    process: processes.HostProcess
    health_url: str
    metrics_url: str
    state_dir: Path

    @property
    def log(self) -> Path:
        return self.platform.log_dir / f"{self.process.name}.log"

    def pid(self) -> int | None:
        return processes.running_pid(self.platform.run_dir, self.process.name)

    def start(self, timeout: float = 90) -> int:
        return self.platform.start_controller(self.process, ready=lambda: http_ok(self.health_url), timeout=timeout)

    def stop(self, grace: float = processes.STOP_GRACE_SECONDS) -> bool:
        """SIGTERM, then SIGKILL after `grace` (OPERATOR_STOP_GRACE_SECONDS lets running updates drain)."""
        return self.platform.stop_controller(self.process.name, grace)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return response.read().decode()


def operator_host(platform: LocalPlatform, toolchain: Toolchain, state_dir: Path, *,
                  extra_args: tuple[str, ...] = (), token_seconds: int = 6 * 3600, pulumi: Path | None = None,
                  plugin_dirs: tuple[Path, ...] = (), executor: str = "process",
                  name: str = PROCESS_NAME) -> OperatorHost:
    """Install the operator's API and describe its process (call .start()); state lives in `state_dir`.

    By default updates use the toolchain's CLI and YAML host; `pulumi` and `plugin_dirs` swap in an
    official install (with the Python language host and provider plugins) where one exists."""
    install_operator_api(platform.kubeconfig_path, executor=executor)
    state_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = write_private(state_dir / "kubeconfig",
                               platform.token_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, token_seconds))
    metrics_port, health_port = processes.free_ports(2)
    argv = [sys.executable, "-m", "strata_operator", "--kubeconfig", str(kubeconfig),
            "--pulumi", str(pulumi or toolchain.dir("pulumi") / "bin" / "pulumi"),
            *[arg for directory in (*plugin_dirs, toolchain.dir("pulumi-yaml") / "bin")
              for arg in ("--plugin-dir", str(directory))],
            "--state-dir", str(state_dir / "state"),
            "--metrics-port", str(metrics_port), "--health-port", str(health_port), *extra_args]
    process = processes.HostProcess(name, argv, env={"KUBECONFIG": str(kubeconfig)})
    return OperatorHost(platform, process, health_url=f"http://127.0.0.1:{health_port}/healthz",
                        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics", state_dir=state_dir / "state")
