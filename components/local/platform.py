"""The local platform: a real Kubernetes control plane on loopback, kwok nodes, host controllers, a git server.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as host processes built from
Go modules; kwok plays the nodes (pods get scheduled and turn Ready, nothing runs in them).
Controllers that must really run — Flux's source- and kustomize-controller, the Strata operator —
run as supervised host processes with the kubeconfig they are given. Everything lives in one state
directory; `up` is idempotent and `down` leaves no process behind.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from . import cluster_addons, objectstore, processes, realnode, registry, toolchain as toolchains
from .fluxbundle import ensure_bundle
from .gitserver import GitRepos
from ..flux_tenancy import LOCKDOWN_FLAGS
from ..kubeconfig import build_client_certificate_kubeconfig, build_token_kubeconfig, pem_data
from .kube import http_ok, https_ok, load_documents, server_side_apply, write_private
from .pki import ensure_pki, issue_client_certificate
from .processes import HostProcess, ProcessError
from .progress import Say, format_seconds, stderr_say, tail
from .toolchain import Toolchain, ToolchainError, installed, profile_tools

FLUX_NAMESPACE = "flux-system"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Every host process in start order (see start_waves), with the ports it listens on (allocated once, kept in platform.json).
PROCESS_PORTS = {
    "etcd": ("etcd_client", "etcd_peer"),
    "kube-apiserver": ("apiserver",),
    "kube-controller-manager": ("controller_manager",),
    "kube-scheduler": ("scheduler",),
    "kwok": ("kwok",),
    "git-server": ("git",),
    "flux-bundle-server": ("flux_bundle",),
    # First of the Flux controllers, so its event server is the first up (no events are sent before
    # the bootstrap creates Flux objects).
    "notification-controller": ("notification_events", "notification_receiver", "notification_metrics",
                                "notification_health"),
    "source-controller": ("source_storage", "source_metrics", "source_health"),
    "kustomize-controller": ("kustomize_metrics", "kustomize_health"),
}
# Ports of the controllers others start beside the platform (the bootstrap's operator, through
# start_controller): picked free and kept with the platform's own, checked by that controller when it starts.
CONTROLLER_PORTS = {"strata-operator": ("operator_metrics", "operator_health")}
PORTS = tuple(port for ports in (*PROCESS_PORTS.values(), *CONTROLLER_PORTS.values()) for port in ports)
# Started one by one, each once the one before answers; every other process needs only the API server.
CONTROL_PLANE = ("etcd", "kube-apiserver")
# Started beside real nodes and stopped with them (kube-proxy's chains are among what `down` undoes).
NODE_SIDE_PROCESSES = (cluster_addons.KUBE_PROXY_PROCESS, registry.PROCESS, objectstore.PROCESS)
HOST_CONTROLLERS = ("source-controller", "kustomize-controller", "notification-controller")
# What `strata local up` and the Cluster component run unless told otherwise.
DEFAULT_HOST_CONTROLLERS = ("source-controller", "kustomize-controller")
# Cluster and context name in the kubeconfigs the platform writes.
KUBECONFIG_CLUSTER = "strata-local"
# `dev`: kwok nodes (plus --real-nodes N). `cluster`: what a team's own cluster has, for running the
# product in it: at least two real nodes with kube-proxy and CoreDNS (cluster_addons.py).
PROFILES = ("dev", "cluster")
CLUSTER_PROFILE_MIN_REAL_NODES = 2
FLUX_IMAGE_PREFIX = "fluxcd"  # upstream's ghcr.io/fluxcd/<controller>, so `--registry <registry>/fluxcd` works
FLUX_USER = 65534  # upstream's images run as nobody
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class PlatformError(Exception):
    """The platform could not start; the message names the cause and the fix."""


def start_waves(names: list[str]) -> list[list[str]]:
    """`names` (in start order) as waves of processes started together: etcd alone, then the API
    server alone (each needs the one before it answering), then all the others at once: each needs
    only the API server, so waiting for one before starting the next only adds up their start-ups."""
    waves = [[name] for name in CONTROL_PLANE if name in names]
    rest = [name for name in names if name not in CONTROL_PLANE]
    return waves + ([rest] if rest else [])


def subprocess_ok(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(os.environ.get("STRATA_STATE_DIR") or Path(base) / "strata" / "platform")


def _needs_objects(process: str) -> bool:
    return process in HOST_CONTROLLERS or process == "git-server"


def build_git_server_rbac() -> list[dict]:
    """What the git server's identity (`strata:git-server`, a client certificate of the platform's CA) may
    do: find the GitRepositories of a pushed repository and ask Flux to fetch them, nothing else."""
    name = "strata:git-server"
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": ["source.toolkit.fluxcd.io"], "resources": ["gitrepositories"],
                    "verbs": ["list", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]},
    ]


# What containerd's CRI answers while it restores the containers it ran before a restart, and how long
# the kubelet's start waits that out.
CRI_NOT_READY = "server is not initialized yet"
CRI_RESTORE_SECONDS = 120

# The options a platform was last started with (recorded_shape): its profile, host controllers and nodes.
SHAPE_FILE = "shape.json"


def recorded_shape(state_dir: Path) -> dict[str, Any]:
    """The options the platform in `state_dir` was last started with ({} if it never was)."""
    try:
        return json.loads((state_dir / SHAPE_FILE).read_text())
    except (OSError, ValueError):
        return {}


@dataclasses.dataclass(frozen=True)
class PlatformConfig:
    state_dir: Path = dataclasses.field(default_factory=default_state_dir)
    nodes: int = 1
    real_nodes: int = 0
    """Nodes where pods really run (kubelet on containerd; needs root, see realnode.py)."""
    host_controllers: tuple[str, ...] = ("source-controller",)
    apiserver_port: int | None = None
    """A fixed port for kube-apiserver; by default a free one is picked on first start."""
    profile: str = "dev"
    """One of PROFILES; `cluster` builds its tools (kube-proxy, CoreDNS) on first use."""

    @property
    def real_node_count(self) -> int:
        if self.profile == "cluster":
            return max(self.real_nodes, CLUSTER_PROFILE_MIN_REAL_NODES)
        return self.real_nodes


@dataclasses.dataclass(frozen=True)
class PlatformInfo:
    state_dir: Path
    kubeconfig_path: Path
    server: str
    git: GitRepos
    ports: dict[str, int]
    bin_dirs: tuple[Path, ...]

    @property
    def kubeconfig(self) -> str:
        return self.kubeconfig_path.read_text()

    @property
    def flux_storage_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['source_storage']}"

    @property
    def flux_events_url(self) -> str:
        """The notification-controller's event server (when it runs): where Flux-format events are POSTed."""
        return f"http://127.0.0.1:{self.ports['notification_events']}/"

    @property
    def flux_bundle_url(self) -> str:
        """pulumi-flux's `baseurl` for the offline install bundle."""
        return f"http://127.0.0.1:{self.ports['flux_bundle']}"


class LocalPlatform:
    def __init__(self, config: PlatformConfig | None = None, toolchain: Toolchain | None = None):
        self.config = config or PlatformConfig()
        unknown = set(self.config.host_controllers) - set(HOST_CONTROLLERS)
        if unknown:
            raise PlatformError(f"unknown host controllers {sorted(unknown)}; choose from {list(HOST_CONTROLLERS)}")
        if self.config.profile not in PROFILES:
            raise PlatformError(f"unknown profile {self.config.profile!r}; choose from {list(PROFILES)}")
        self._toolchain = toolchain
        self.state = Path(self.config.state_dir)
        self.pki = self.state / "pki"
        self.run_dir = self.state / "run"
        self.log_dir = self.state / "logs"

    # -- layout -------------------------------------------------------------------------------
    @property
    def toolchain(self) -> Toolchain:
        if self._toolchain is None:
            try:
                self._toolchain = installed(profile_tools(self.config.profile))
            except ToolchainError as error:
                raise PlatformError(str(error)) from None
        return self._toolchain

    @property
    def kubeconfig_path(self) -> Path:
        return self.state / "kubeconfig"

    def _ports(self) -> dict[str, int]:
        state_file = self.state / "platform.json"
        if state_file.exists():
            ports = json.loads(state_file.read_text())["ports"]
            if set(ports) <= set(PORTS) and (self.config.apiserver_port in (None, ports["apiserver"])):
                # A platform made before a component was added keeps its ports; the new ones get free ports.
                missing = [name for name in PORTS if name not in ports]
                if not missing:
                    return ports
                taken = set(ports.values())
                fresh = [port for port in processes.free_ports(len(missing) + len(taken)) if port not in taken]
                ports.update(zip(missing, fresh))
                state_file.write_text(json.dumps({"ports": ports}, indent=1))
                return ports
        ports = dict(zip(PORTS, processes.free_ports(len(PORTS))))
        if self.config.apiserver_port:
            ports["apiserver"] = self.config.apiserver_port
        self.state.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps({"ports": ports}, indent=1))
        return ports

    def _check_ports_free(self, ports: dict[str, int]) -> None:
        """Ports of components that are not running must be free, else say which program is in the way."""
        for component, names in PROCESS_PORTS.items():
            if processes.running_pid(self.run_dir, component) is not None:
                continue
            for name in names:
                if not processes.port_is_free(ports[name]):
                    fix = ("pick another with --apiserver-port" if name == "apiserver" and self.config.apiserver_port
                           else f"stop that program, or delete {self.state / 'platform.json'} to pick new ports")
                    raise PlatformError(f"port {ports[name]} ({component}) is already in use on 127.0.0.1; fix: {fix}")

    def controller_ports(self, name: str) -> dict[str, int]:
        """The kept ports of a controller of CONTROLLER_PORTS (picked on first use, then the same every start)."""
        ports = self._ports()
        return {port: ports[port] for port in CONTROLLER_PORTS[name]}

    @property
    def git_push_credentials(self) -> Path:
        """What a push to the platform's git server needs (user:password): its owner's alone."""
        return self.state / "git-push.credentials"

    def info(self) -> PlatformInfo:
        ports = json.loads((self.state / "platform.json").read_text())["ports"]
        return PlatformInfo(
            state_dir=self.state, kubeconfig_path=self.kubeconfig_path,
            server=f"https://127.0.0.1:{ports['apiserver']}",
            git=GitRepos(self.state / "git", f"http://127.0.0.1:{ports['git']}", self.git_push_credentials),
            ports=ports, bin_dirs=tuple(self.toolchain.bin_dirs),
        )

    # -- processes ----------------------------------------------------------------------------
    def _processes(self, ports: dict[str, int], flux_bundle: Path) -> list[tuple[HostProcess, object]]:
        """Every host process with its readiness check, in start order."""
        tc, state, pki = self.toolchain, self.state, self.pki
        server = f"https://127.0.0.1:{ports['apiserver']}"
        kubeconfigs = state / "kubeconfigs"
        # Clients need a certificate of etcd's own CA (pki.ensure_etcd_pki): only the API server has one.
        etcd_pki = pki / "etcd"
        etcd_url = f"https://127.0.0.1:{ports['etcd_client']}"
        peer_url = f"https://127.0.0.1:{ports['etcd_peer']}"
        result: list[tuple[HostProcess, object]] = [
            (HostProcess("etcd", [str(tc.bin("etcd")), "--name=strata", f"--data-dir={state / 'etcd'}",
                                  f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                                  "--client-cert-auth", f"--trusted-ca-file={etcd_pki / 'ca.crt'}",
                                  f"--cert-file={etcd_pki / 'server.crt'}", f"--key-file={etcd_pki / 'server.key'}",
                                  f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                                  "--peer-client-cert-auth", f"--peer-trusted-ca-file={etcd_pki / 'ca.crt'}",
                                  f"--peer-cert-file={etcd_pki / 'server.crt'}",
                                  f"--peer-key-file={etcd_pki / 'server.key'}",
                                  f"--initial-cluster=strata={peer_url}", "--unsafe-no-fsync", "--log-level=warn"]),
             lambda: https_ok(f"{etcd_url}/health", etcd_pki, client="healthcheck-client")),
            (HostProcess("kube-apiserver", [
                str(tc.bin("kube-apiserver")), f"--etcd-servers={etcd_url}", f"--etcd-cafile={etcd_pki / 'ca.crt'}",
                f"--etcd-certfile={etcd_pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={etcd_pki / 'apiserver-etcd-client.key'}",
                # The machine may have no default route: without an explicit address the apiserver exits.
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true", "--profiling=false", "--watch-cache=true",
                # Logs, exec and port-forward on real nodes: kubelet checks this certificate.
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ]), lambda: https_ok(f"{server}/readyz", pki)),
            (HostProcess("kube-controller-manager", [
                str(tc.bin("kube-controller-manager")),
                *self._component_kubeconfig_flags(kubeconfigs / "controller-manager.kubeconfig"),
                "--bind-address=127.0.0.1", f"--secure-port={ports['controller_manager']}",
                "--use-service-account-credentials=true", f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--leader-elect=false", "--profiling=false",
                # Starting each controller makes its ServiceAccount and token: at the default 20 requests per
                # second that took 4.5 s before the first namespace had its default ServiceAccount.
                "--kube-api-qps=200", "--kube-api-burst=400",
            ]), lambda: https_ok(f"https://127.0.0.1:{ports['controller_manager']}/healthz", pki, verify_server=False)),
            (HostProcess("kube-scheduler", [
                str(tc.bin("kube-scheduler")),
                *self._component_kubeconfig_flags(kubeconfigs / "scheduler.kubeconfig"),
                "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}",
                "--leader-elect=false", "--profiling=false",
            ]), lambda: https_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz", pki, verify_server=False)),
            (HostProcess("kwok", [
                str(tc.bin("kwok")), f"--kubeconfig={self.kubeconfig_path}",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--config={tc.dir('kwok') / 'stages.yaml'}", f"--server-address=127.0.0.1:{ports['kwok']}",
                "--cidr=10.244.0.0/16", "--node-ip=127.0.0.1",
                # The stages heartbeat node status every 10 minutes and leave liveness to the node's Lease.
                # Without Leases the controller-manager marked the node NotReady every ~55 s and, with it,
                # every pod on it, for good (kwok readies a pod once): a Deployment created just before
                # such a flap never became available.
                "--node-lease-duration-seconds=40",
            ]), lambda: http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz")),
            (HostProcess("git-server", [
                sys.executable, "-m", "strata_components.local.gitserver", f"--root={state / 'git'}",
                f"--port={ports['git']}", f"--push-auth-file={self.git_push_credentials}",
                # A push is announced to Flux at once (as a webhook Receiver would): no waiting for a poll,
                # under an identity of its own that may patch GitRepositories and nothing else.
                f"--kubeconfig={kubeconfigs / 'git-server.kubeconfig'}",
            ]), lambda: not processes.port_is_free(ports["git"])),
            (HostProcess("flux-bundle-server", [
                sys.executable, "-m", "http.server", "--bind=127.0.0.1", f"--directory={flux_bundle}",
                str(ports["flux_bundle"]),
            ]), lambda: not processes.port_is_free(ports["flux_bundle"])),
        ]
        flux_env = {"KUBECONFIG": str(self.kubeconfig_path), "RUNTIME_NAMESPACE": FLUX_NAMESPACE}
        notifying = "notification-controller" in self.config.host_controllers
        # With notification-controller on the host, the other controllers send it their events, as in a cluster.
        events = f"http://127.0.0.1:{ports['notification_events']}/" if notifying else ""
        common = ["--enable-leader-election=false", "--log-level=info", "--log-encoding=console",
                  f"--events-addr={events}"]
        if notifying:
            result.append((HostProcess("notification-controller", [
                str(tc.bin("notification-controller")),
                f"--events-addr=127.0.0.1:{ports['notification_events']}",
                f"--receiverAddr=127.0.0.1:{ports['notification_receiver']}",
                f"--metrics-addr=127.0.0.1:{ports['notification_metrics']}",
                f"--health-addr=127.0.0.1:{ports['notification_health']}",
                "--enable-leader-election=false", "--log-level=info", "--log-encoding=console",
                *LOCKDOWN_FLAGS["notification-controller"],
            ], env=flux_env), lambda: http_ok(f"http://127.0.0.1:{ports['notification_health']}/readyz")))
        if "source-controller" in self.config.host_controllers:
            storage = f"127.0.0.1:{ports['source_storage']}"
            result.append((HostProcess("source-controller", [
                str(tc.bin("source-controller")), f"--storage-path={state / 'flux' / 'source'}",
                f"--storage-addr={storage}", f"--storage-adv-addr={storage}",
                f"--metrics-addr=127.0.0.1:{ports['source_metrics']}",
                f"--health-addr=127.0.0.1:{ports['source_health']}", *common,
            ], env=flux_env), lambda: http_ok(f"http://127.0.0.1:{ports['source_health']}/readyz")))
        if "kustomize-controller" in self.config.host_controllers:
            result.append((HostProcess("kustomize-controller", [
                str(tc.bin("kustomize-controller")),
                f"--metrics-addr=127.0.0.1:{ports['kustomize_metrics']}",
                f"--health-addr=127.0.0.1:{ports['kustomize_health']}", *common,
                *LOCKDOWN_FLAGS["kustomize-controller"],
            ], env=flux_env), lambda: http_ok(f"http://127.0.0.1:{ports['kustomize_health']}/readyz")))
        return result

    @staticmethod
    def _component_kubeconfig_flags(kubeconfig: Path) -> list[str]:
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}"]

    def _client_kubeconfig(self, ports: dict[str, int], stem: str) -> str:
        """A kubeconfig authenticating with the PKI's `<stem>.crt`/`<stem>.key`."""
        return build_client_certificate_kubeconfig(
            cluster=KUBECONFIG_CLUSTER, server=f"https://127.0.0.1:{ports['apiserver']}",
            ca_data=pem_data((self.pki / "ca.crt").read_text()), user=stem,
            certificate_data=pem_data((self.pki / f"{stem}.crt").read_text()),
            key_data=pem_data((self.pki / f"{stem}.key").read_text()))

    def _write_kubeconfigs(self, ports: dict[str, int]) -> None:
        for stem, path in (("admin", self.kubeconfig_path),
                           ("controller-manager", self.state / "kubeconfigs" / "controller-manager.kubeconfig"),
                           ("scheduler", self.state / "kubeconfigs" / "scheduler.kubeconfig"),
                           ("git-server", self.state / "kubeconfigs" / "git-server.kubeconfig")):
            write_private(path, self._client_kubeconfig(ports, stem))

    # -- lifecycle ----------------------------------------------------------------------------
    def up(self, say: Say = stderr_say) -> PlatformInfo:
        """Start whatever is not running yet and wait until every component is ready."""
        started = time.monotonic()
        self._ensure_profile_tools(say)
        ports = self._ports()
        self._record_shape()
        plan = self._processes(ports, ensure_bundle(self.toolchain, say))
        self._check_ports_free(ports)
        ensure_pki(self.pki)
        self._write_kubeconfigs(ports)
        for directory in ("git", "flux/source"):
            (self.state / directory).mkdir(parents=True, exist_ok=True)
        if not self.git_push_credentials.exists():
            write_private(self.git_push_credentials, f"strata:{secrets.token_urlsafe(24)}")
        for wave in start_waves([process.name for process, _ in plan]):
            members = [(process, ready) for process, ready in plan if process.name in wave]
            already = {process.name for process, _ in members
                       if processes.running_pid(self.run_dir, process.name) is not None}
            # The git server and Flux's controllers need objects in the API server first (their RBAC, Flux's
            # CRDs): applied while the others start, rather than before them (2 s on make up's path).
            needing = [(process, ready) for process, ready in members if _needs_objects(process.name)]
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                applied = pool.submit(self._apply_platform_objects, [p.name for p, _ in needing]) if needing else None
                rest = [member for member in members if member not in needing]
                for process, _ in rest:
                    processes.start(process, self.run_dir, self.log_dir)
                self._wait_started(rest, already, started, say)
                if applied is not None:
                    applied.result()
            for process, _ in needing:
                processes.start(process, self.run_dir, self.log_dir)
            self._wait_started(needing, already, started, say)
        if self.config.real_node_count:
            self._start_real_nodes(ports, say)
        say(f"local platform ready in {format_seconds(time.monotonic() - started)}: "
            f"https://127.0.0.1:{ports['apiserver']}, kubeconfig {self.kubeconfig_path}")
        return self.info()

    def _record_shape(self) -> None:
        """What this platform is made of, for `strata local status/down/env` run without those options."""
        (self.state / SHAPE_FILE).write_text(json.dumps({
            "profile": self.config.profile, "controllers": ",".join(self.config.host_controllers),
            "nodes": self.config.nodes, "real_nodes": self.config.real_nodes}, indent=1))

    def _ensure_profile_tools(self, say: Say) -> None:
        """The profile's own tools, built on its first use (`make setup` builds only the default ones)."""
        missing = [name for name in profile_tools(self.config.profile) if name not in self.toolchain.entries]
        if missing:
            try:
                built = toolchains.ensure(missing, say=say)
            except ToolchainError as error:
                raise PlatformError(str(error)) from None
            self._toolchain = Toolchain({**self.toolchain.entries, **built.entries})

    def _exited(self, name: str, log: Path) -> bool:
        if processes.running_pid(self.run_dir, name) is None:
            last = tail(log, 5).strip().splitlines()
            raise PlatformError(f"{name} exited during start: {last[-1] if last else 'no output'} (log: {log})")
        return False

    def _wait_started(self, members: list[tuple[HostProcess, Any]], already: set[str], started: float,
                      say: Say) -> None:
        for process, ready in members:
            self._wait_ready(process, ready)
            say(f"  {process.name}: {'already running' if process.name in already else 'ready'} "
                f"({format_seconds(time.monotonic() - started)})")
            if process.name == "kwok":
                self._ensure_nodes(say)

    def _apply_platform_objects(self, names: list[str]) -> None:
        """What the processes `names` need in the API server before they start, in one apply: the git
        server's RBAC, the Flux controllers' namespace and CRDs (then waited for until established)."""
        objects = build_git_server_rbac() if "git-server" in names else []
        crds = load_documents(sorted(path for name in names if name in HOST_CONTROLLERS
                                     for path in (self.toolchain.dir(name) / "crds").glob("*.yaml")))
        if crds:
            objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FLUX_NAMESPACE}})
        server_side_apply(self.kubeconfig_path, [*objects, *crds])
        if crds:
            self._wait_crds_established([doc["metadata"]["name"] for doc in crds])

    def _wait_crds_established(self, names: list[str]) -> None:
        from kubernetes import client

        from .kube import api_client

        with api_client(self.kubeconfig_path) as api:
            extensions = client.ApiextensionsV1Api(api)

            def established() -> bool:
                for name in names:
                    conditions = extensions.read_custom_resource_definition(name).status.conditions or []
                    if not any(c.type == "Established" and c.status == "True" for c in conditions):
                        return False
                return True

            processes.wait_until(established, timeout=30, what="Flux CRDs")

    def _ensure_nodes(self, say: Say) -> None:
        from kubernetes import client

        from .kube import api_client

        with api_client(self.kubeconfig_path) as api:
            core = client.CoreV1Api(api)
            for index in range(self.config.nodes):
                name = f"strata-node-{index}"
                body = {
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                                 "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                    "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
                               "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"}},
                }
                try:
                    core.create_node(body)
                except client.ApiException as error:
                    if error.status != 409:
                        raise
            self._wait_nodes_ready("type=kwok", self.config.nodes, timeout=60)
            # Pods are refused until the service-account controller made the namespace's default SA.
            processes.wait_until(lambda: core.list_namespaced_service_account("default").items, timeout=60,
                                 what="default ServiceAccount")
        say(f"  nodes: {self.config.nodes} kwok node(s) Ready")

    def _start_real_nodes(self, ports: dict[str, int], say: Say) -> None:
        from .images import ImageError, build_pause_image, load_image

        missing = realnode.missing_requirements(self._kubelet())
        if missing:
            raise PlatformError("real nodes cannot start here: missing " + "; ".join(missing))
        too_long = realnode.socket_path_problem(self.state, self.config.real_node_count)
        if too_long:
            raise PlatformError(f"real nodes cannot start here: {too_long}")
        started = time.monotonic()
        (self.state / "nodes").mkdir(exist_ok=True)  # the nodes' and their side processes' records
        try:
            realnode.claim_host(self.state, self.run_dir, say, extra_processes=NODE_SIDE_PROCESSES)
            realnode.ensure_bridge()
            pause = build_pause_image(say)
        except (realnode.RealNodeError, ImageError) as error:
            raise PlatformError(f"real nodes: {error}") from None
        if (processes.running_pid(self.run_dir, realnode.GATEWAY_PROCESS) is None
                and not processes.port_is_free(443, realnode.SERVICE_ADDRESS)):
            raise PlatformError(f"another local platform on this host runs real nodes ({realnode.SERVICE_ADDRESS}:443 "
                                "is taken): they share the host's pod bridge; stop it first (strata local down "
                                "--state-dir DIR), or start this one without --real-nodes")
        cluster = self.config.profile == "cluster"
        forwards = [f"{realnode.SERVICE_ADDRESS}:443=127.0.0.1:{ports['apiserver']}",
                    f"{realnode.NODE_ADDRESS}:{ports['git']}=127.0.0.1:{ports['git']}"]
        if cluster:  # the `kubernetes` Service's endpoint, where kube-proxy sends it
            forwards.append(f"{realnode.NODE_ADDRESS}:{ports['apiserver']}=127.0.0.1:{ports['apiserver']}")
        gateway = HostProcess(realnode.GATEWAY_PROCESS, [
            sys.executable, "-m", "strata_components.local.gateway", *(f"--forward={f}" for f in forwards)])
        self._start_and_wait(gateway, lambda: not processes.port_is_free(443, realnode.SERVICE_ADDRESS))
        registry_port, dns_image = None, None
        if cluster:  # before the nodes: their containerd pulls CoreDNS from the registry
            registry_port = self._start_registry(say)
            self._start_object_store(say)
            dns_image = self._push_coredns_image(say)
            self._push_flux_images(say)
        for index in range(self.config.real_node_count):
            node = realnode.prepare_node(self.state, index, self.pki,
                                         lambda stem: self._client_kubeconfig(ports, stem),
                                         cluster_dns=realnode.CLUSTER_DNS if cluster else None,
                                         registry_port=registry_port)
            self._start_and_wait(realnode.containerd_process(node), lambda node=node: subprocess_ok(
                ["ctr", "--address", str(node.containerd_socket), "version"]))
            try:
                load_image(pause, node.containerd_socket)  # the sandbox image: every node has it before any pull
            except ImageError as error:
                raise PlatformError(f"real node {node.name}: {error}") from None
            self._start_kubelet(node)
        self._wait_nodes_ready("type=real", self.config.real_node_count, timeout=120)
        say(f"  nodes: {self.config.real_node_count} real node(s) Ready (kubelet on containerd, "
            f"{format_seconds(time.monotonic() - started)})")
        if cluster:
            self._start_service_networking(ports, say)
            self._start_cluster_dns(dns_image, say)

    def registry_host(self) -> str:
        """HOST:PORT of the cluster profile's registry (see registry.py)."""
        path = self.state / "nodes" / "registry.json"
        if not path.exists():
            raise PlatformError(f"the platform in {self.state} has no registry; fix: strata local up --profile cluster")
        return registry.registry_host(json.loads(path.read_text())["port"])

    def _start_registry(self, say: Say) -> int:
        """The registry on the bridge address (ports picked once, kept in nodes/registry.json)."""
        path = self.state / "nodes" / "registry.json"
        if not path.exists():
            path.write_text(json.dumps({"port": processes.free_ports(1, realnode.NODE_ADDRESS)[0]}))
        ports = json.loads(path.read_text())
        self._check_port_free(ports["port"], registry.PROCESS, path, realnode.NODE_ADDRESS)
        config = self.state / "nodes" / "registry.yaml"
        config.write_text(yaml.safe_dump(registry.build_registry_config(self.state / "registry", ports["port"])))
        started = time.monotonic()
        self._start_and_wait(registry.registry_process(self.toolchain.bin("registry"), config),
                             lambda: http_ok(f"http://{registry.registry_host(ports['port'])}/v2/"))
        say(f"  registry: ready at {registry.registry_host(ports['port'])} "
            f"({format_seconds(time.monotonic() - started)})")
        return ports["port"]

    @property
    def object_store_credentials(self) -> Path:
        """The object store's AWS shared-credentials file (0600; AWS_SHARED_CREDENTIALS_FILE points clients at it)."""
        return self.state / "objectstore" / "credentials"

    def object_store_port(self) -> int:
        path = self.state / "nodes" / "object-store.json"
        if not path.exists():
            raise PlatformError(f"the platform in {self.state} has no object store; fix: strata local up --profile cluster")
        return json.loads(path.read_text())["port"]

    def s3_backend_url(self, bucket: str = objectstore.DEFAULT_BUCKET) -> str:
        """Pulumi's backend URL for a bucket of the platform's object store."""
        return objectstore.backend_url(self.object_store_port(), bucket)

    def create_bucket(self, bucket: str) -> None:
        try:
            objectstore.ensure_bucket(self.object_store_port(), bucket,
                                      objectstore.read_credentials(self.object_store_credentials))
        except objectstore.ObjectStoreError as error:
            raise PlatformError(str(error)) from None

    def _start_object_store(self, say: Say) -> None:
        """MinIO on the bridge address, its credentials generated once (never in argv or a log)."""
        path = self.state / "nodes" / "object-store.json"
        if not path.exists():
            path.write_text(json.dumps({"port": processes.free_ports(1, realnode.NODE_ADDRESS)[0]}))
        port = json.loads(path.read_text())["port"]
        self._check_port_free(port, objectstore.PROCESS, path, realnode.NODE_ADDRESS)
        credentials = objectstore.ensure_credentials(self.object_store_credentials)
        started = time.monotonic()
        self._start_and_wait(objectstore.object_store_process(
            self.toolchain.bin("minio"), self.state / "objectstore", port, credentials),
            lambda: http_ok(f"{objectstore.endpoint(port)}/minio/health/ready"))
        self.create_bucket(objectstore.DEFAULT_BUCKET)
        say(f"  object store: ready at {objectstore.endpoint(port)}, bucket {objectstore.DEFAULT_BUCKET} "
            f"({format_seconds(time.monotonic() - started)}); credentials in {self.object_store_credentials}")

    def push_image(self, archive, repository: str, tag: str) -> str:
        """Push an image archive to the platform's registry as REPOSITORY:TAG; returns the full reference."""
        reference = f"{self.registry_host()}/{repository}:{tag}"
        try:
            registry.push(archive.path, reference)
        except registry.RegistryError as error:
            raise PlatformError(str(error)) from None
        return reference

    def flux_registry(self) -> str:
        """What Flux's air-gapped install takes as `--registry`: its controllers' images are there."""
        return f"{self.registry_host()}/{FLUX_IMAGE_PREFIX}"

    def _push_flux_images(self, say: Say) -> None:
        """Flux's controller images from the toolchain's binaries, as upstream ships them (static binary,
        non-root, CA bundle for HTTPS sources), pushed as <registry>/fluxcd/<controller>:<version>."""
        from .images import build_binary_image

        started = time.monotonic()
        specs = toolchains.load_specs()
        for controller in HOST_CONTROLLERS:
            image = build_binary_image(self.toolchain.bin(controller), f"strata.local/{FLUX_IMAGE_PREFIX}/{controller}",
                                       specs[controller].version, user=FLUX_USER, files={CA_BUNDLE: Path(CA_BUNDLE)},
                                       say=say)
            self.push_image(image, f"{FLUX_IMAGE_PREFIX}/{controller}", specs[controller].version)
        say(f"  Flux images: {', '.join(HOST_CONTROLLERS)} in {self.flux_registry()} "
            f"({format_seconds(time.monotonic() - started)})")

    def _push_coredns_image(self, say: Say) -> str:
        from .images import build_binary_image

        version = toolchains.load_specs()["coredns"].version
        image = build_binary_image(self.toolchain.bin("coredns"), "strata.local/coredns", version,
                                   user=cluster_addons.DNS_USER, say=say)
        return self.push_image(image, "coredns/coredns", version)

    def _kube_proxy_ports(self) -> dict[str, int]:
        path = self.state / "nodes" / "kube-proxy.json"
        if not path.exists():
            health, metrics = processes.free_ports(2)
            path.write_text(json.dumps({"health": health, "metrics": metrics}))
        return json.loads(path.read_text())

    def _start_service_networking(self, ports: dict[str, int], say: Say) -> None:
        """kube-proxy, once for every real node (they share the host's network), and the `kubernetes` endpoints."""
        started = time.monotonic()
        server_side_apply(self.kubeconfig_path, [cluster_addons.build_apiserver_endpoints(ports["apiserver"])])
        forwarding = Path("/proc/sys/net/ipv4/ip_forward")
        if forwarding.read_text().strip() != "1":  # restored by `down` (recorded in realnode.HOST_RECORD)
            forwarding.write_text("1")
        try:  # removed by `down` with the other chains added since the record
            cluster_addons.ensure_pod_egress()
        except realnode.RealNodeError as error:
            raise PlatformError(f"real nodes: {error}") from None
        proxy_ports = self._kube_proxy_ports()
        if processes.running_pid(self.run_dir, cluster_addons.KUBE_PROXY_PROCESS) is not None:
            # kube-proxy exits when its configuration file is written, even unchanged: a running one is left alone.
            say(f"  kube-proxy: already running ({format_seconds(time.monotonic() - started)})")
            return
        kubeconfig = self.state / "kubeconfigs" / "kube-proxy.kubeconfig"
        issue_client_certificate(self.pki, "kube-proxy", "system:kube-proxy", None)
        write_private(kubeconfig, self._client_kubeconfig(ports, "kube-proxy"))
        config = self.state / "nodes" / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(cluster_addons.build_kube_proxy_config(
            kubeconfig=kubeconfig, hostname="real-0", health_port=proxy_ports["health"],
            metrics_port=proxy_ports["metrics"])))
        for port in proxy_ports.values():
            self._check_port_free(port, cluster_addons.KUBE_PROXY_PROCESS, self.state / "nodes" / "kube-proxy.json")
        self._start_and_wait(HostProcess(cluster_addons.KUBE_PROXY_PROCESS, [
            str(self.toolchain.bin("kube-proxy")), f"--config={config}", "--v=1"]),
            lambda: http_ok(f"http://127.0.0.1:{proxy_ports['health']}/healthz"))
        say(f"  kube-proxy: ready, iptables mode ({format_seconds(time.monotonic() - started)})")

    def _check_port_free(self, port: int, component: str, record: Path, host: str = "127.0.0.1") -> None:
        """A port of a component that is not running must be free, else one error naming it and the fix."""
        if processes.running_pid(self.run_dir, component) is None and not processes.port_is_free(port, host):
            raise PlatformError(f"port {port} ({component}) is already in use on {host}; fix: stop that "
                                f"program, or delete {record} to pick new ports")

    def _start_cluster_dns(self, image: str, say: Say) -> None:
        from kubernetes import client

        from .kube import api_client

        started = time.monotonic()
        replicas = self.config.real_node_count
        server_side_apply(self.kubeconfig_path, cluster_addons.build_coredns_objects(image, replicas))
        with api_client(self.kubeconfig_path) as api:
            apps = client.AppsV1Api(api)

            def available() -> bool:
                status = apps.read_namespaced_deployment(cluster_addons.DNS_NAME, cluster_addons.DNS_NAMESPACE).status
                return (status.updated_replicas or 0) >= replicas and (status.available_replicas or 0) >= replicas

            try:
                processes.wait_until(available, timeout=120, what="CoreDNS")
            except ProcessError:
                raise PlatformError(
                    f"CoreDNS did not become available in 120s; see `kubectl -n {cluster_addons.DNS_NAMESPACE} "
                    f"describe pods -l k8s-app=kube-dns` and the kubelet logs in {self.log_dir}") from None
        say(f"  DNS: CoreDNS {replicas} replica(s) available at {realnode.CLUSTER_DNS} "
            f"({format_seconds(time.monotonic() - started)})")

    def _kubelet(self) -> Path | None:
        try:
            return self.toolchain.bin("kubelet")
        except ToolchainError:
            return None

    def _start_kubelet(self, node: realnode.RealNode) -> None:
        """The node's kubelet, started again while containerd's CRI says it is not ready: a containerd
        restarted under running containers answers its API before its CRI has restored them, and a kubelet
        started then exits at once ("server is not initialized yet")."""
        deadline = time.monotonic() + CRI_RESTORE_SECONDS
        while True:
            try:
                self._start_and_wait(realnode.kubelet_process(node, self._kubelet()),
                                     lambda: http_ok(f"http://127.0.0.1:{node.healthz_port}/healthz"))
                return
            except PlatformError as error:
                if CRI_NOT_READY not in str(error) or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def _start_and_wait(self, process: HostProcess, ready, timeout: float = 90) -> None:
        processes.start(process, self.run_dir, self.log_dir)
        self._wait_ready(process, ready, timeout)

    def _wait_ready(self, process: HostProcess, ready, timeout: float = 90) -> None:
        log = self.log_dir / f"{process.name}.log"
        try:
            processes.wait_until(lambda: ready() or self._exited(process.name, log), timeout=timeout,
                                 what=process.name, log=log)
        except ProcessError:
            raise PlatformError(f"{process.name} did not become ready in {timeout:.0f}s; see {log}") from None

    def _wait_nodes_ready(self, label_selector: str, count: int, timeout: float) -> None:
        from kubernetes import client

        from .kube import api_client

        with api_client(self.kubeconfig_path) as api:
            core = client.CoreV1Api(api)

            def ready() -> bool:
                nodes = core.list_node(label_selector=label_selector).items
                return sum(any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
                           for n in nodes) >= count

            try:
                processes.wait_until(ready, timeout=timeout, what=f"{label_selector} nodes")
            except ProcessError:
                raise PlatformError(f"{count} {label_selector} node(s) not Ready in {timeout:.0f}s; "
                                    f"see the logs in {self.log_dir}") from None

    def down(self, say: Say = stderr_say) -> list[str]:
        """Stop every process of the platform (reverse start order); returns the names that were running."""
        stopped = realnode.stop_nodes(self.state, self.run_dir, say, extra_processes=NODE_SIDE_PROCESSES)
        names = list(reversed(PROCESS_PORTS))
        for extra in sorted(self.run_dir.glob("*.json")) if self.run_dir.exists() else []:
            if extra.stem not in names:
                names.insert(0, extra.stem)  # controllers started by others (e.g. the operator) go first
        for name in names:
            if processes.stop(self.run_dir, name):
                stopped.append(name)
                say(f"  stopped {name}")
        return stopped

    def status(self) -> dict[str, bool]:
        names = [name for name in PROCESS_PORTS
                 if name not in HOST_CONTROLLERS or name in self.config.host_controllers]
        for node in realnode.node_dirs(self.state):
            names += [f"containerd-{node.name}", f"kubelet-{node.name}"]
        if self.config.profile == "cluster":
            names += [cluster_addons.KUBE_PROXY_PROCESS, registry.PROCESS, objectstore.PROCESS]
        if realnode.node_dirs(self.state):
            names.append(realnode.GATEWAY_PROCESS)
        # A controller started beside the platform (its record stays until it is stopped): a dead one shows.
        names += [name for name in CONTROLLER_PORTS if (self.run_dir / f"{name}.json").exists()]
        return {name: processes.running_pid(self.run_dir, name) is not None for name in names}

    def ports(self) -> dict[str, int]:
        """Every port kept in platform.json ({} before the first start)."""
        state_file = self.state / "platform.json"
        return json.loads(state_file.read_text())["ports"] if state_file.exists() else {}

    def start_controller(self, process: HostProcess, ready=None, timeout: float = 60) -> int:
        """Run another controller (e.g. the Strata operator) as a supervised process of this platform."""
        pid = processes.start(process, self.run_dir, self.log_dir)
        if ready is not None:
            log = self.log_dir / f"{process.name}.log"
            processes.wait_until(lambda: ready() or self._exited(process.name, log), timeout=timeout,
                                 what=process.name, log=log)
        return pid

    def stop_controller(self, name: str, grace: float = processes.STOP_GRACE_SECONDS) -> bool:
        return processes.stop(self.run_dir, name, grace)

    def token_kubeconfig(self, namespace: str, service_account: str, expiration_seconds: int = 3600) -> str:
        """A kubeconfig holding only a short-lived TokenRequest token of one ServiceAccount."""
        from kubernetes import client

        from .kube import api_client

        with api_client(self.kubeconfig_path) as api:
            token = client.CoreV1Api(api).create_namespaced_service_account_token(
                service_account, namespace,
                {"spec": {"expirationSeconds": expiration_seconds}},
            ).status.token
        ports = json.loads((self.state / "platform.json").read_text())["ports"]
        return build_token_kubeconfig(cluster=KUBECONFIG_CLUSTER, server=f"https://127.0.0.1:{ports['apiserver']}",
                                      ca_data=pem_data((self.pki / "ca.crt").read_text()),
                                      user=f"{namespace}-{service_account}", token=token, namespace=namespace)

    def shell_env(self) -> dict[str, str]:
        """KUBECONFIG and a PATH with the toolchain's binaries first, for `strata local env`."""
        path = os.pathsep.join([*(str(d) for d in self.toolchain.bin_dirs), os.environ.get("PATH", "")])
        env = {"KUBECONFIG": str(self.kubeconfig_path), "PATH": path}
        if self.config.profile == "cluster":  # the object store's credentials by file: never printed
            env.update({"AWS_SHARED_CREDENTIALS_FILE": str(self.object_store_credentials), "AWS_REGION": objectstore.REGION,
                        "STRATA_S3_BACKEND": self.s3_backend_url()})
        return env
