"""Entry points: `strata operator run` (host process) and `python -m strata_operator` (container)."""

from __future__ import annotations

import argparse
import copy
import importlib
import ipaddress
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .api import RESOURCES_FIELD_ENV
from .api.sharding import MAIN_SELECTOR, SHARD_KEY, Shard
from .api.stack import MIN_RESYNC_SECONDS
from .decisions.lease import DEFAULT_LEASE_NAME
from .decisions.planning import DEFAULT_STALL_AFTER_FAILURES
from .engine.pod.executor import DEFAULT_POD_CONCURRENCY, WorkspaceSettings
from .engine.port import EngineUnavailable
from .engine.process.bytecode import bytecode_cache_beside
from .engine.process.executor import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_SECONDS, EngineSettings
from .engine.process.memory_limit import ContainerMemory
from .engine.process.plugins import default_plugin_cache
from .engine.process.virtualenvs import default_python_cache
from .services.flux_events import check_address
from .services.memory import start_trimming
from .services.metrics import MetricsServing
from .sources.archive import DEFAULT_MAX_SOURCE_BYTES

if TYPE_CHECKING:  # imported when run() starts: importing controllers registers their Kopf handlers
    from .controllers.leadership import ElectionSettings
    from .controllers.preflight import PreflightSettings

# The modules whose Kopf handlers the operator runs, in the order they register: startup handlers run
# in it, so leadership's, which waits until this process leads, comes last.
HANDLER_MODULES = (
    "controllers.startup",  # settings, the engine, metrics
    "controllers.stack", "controllers.program",  # pulumi.com Stacks and Programs
    "controllers.auto_state", "controllers.workspace", "controllers.update",  # PKO v2's Workspace and Update
    "services.kopf_login",  # Kopf's API session, with a bound on its connections
    "controllers.leadership",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata operator run", description="Run the Strata operator (pulumi.com/v1 "
                                "Stacks and Programs) against the cluster in KUBECONFIG or in-cluster credentials.")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable); default: all namespaces")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig file (default: $KUBECONFIG)")
    p.add_argument("--pulumi", default=os.environ.get("STRATA_PULUMI", ""),
                   help="path to the pulumi CLI (default: found on PATH)")
    p.add_argument("--plugin-dir", action="append", default=[],
                   help="directory with language hosts/plugins to put on the updates' PATH, or a plugin install "
                        "directory (resource-NAME-vVERSION) to share like the cache's (repeatable); the operator's "
                        "PATH directories holding pulumi-language-*/pulumi-resource-* are passed on too")
    p.add_argument("--plugin-cache", type=Path, default=default_plugin_cache(), metavar="DIR",
                   help="provider plugins every Stack's updates see (read-only), laid out like PULUMI_HOME/plugins: "
                        "fill it with `PULUMI_HOME=<its parent> pulumi plugin install ...` (default: "
                        "$PULUMI_HOME/plugins, else ~/.pulumi/plugins; read before every update)")
    p.add_argument("--python-cache", type=Path, default=default_python_cache(), metavar="DIR",
                   help="uv's cache for every Stack's Python environment (programs never see it; default: "
                        "$XDG_CACHE_HOME/strata/uv, else ~/.cache/strata/uv); the bytecode compiled for those "
                        "environments is kept beside it, in DIR-bytecode")
    p.add_argument("--state-dir", type=Path,
                   default=Path(os.environ.get("STRATA_OPERATOR_STATE", Path.home() / ".cache/strata/operator")),
                   help="where per-Stack workdirs and PULUMI_HOMEs live")
    p.add_argument("--concurrency", type=int, help="maximum concurrent updates (default: 10, or twice the CPU cores if "
                   f"fewer; with --executor pod {DEFAULT_POD_CONCURRENCY}, since updates then run on the cluster's nodes)")
    p.add_argument("--update-timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, help="seconds per engine run")
    p.add_argument("--max-source-bytes", type=int, default=DEFAULT_MAX_SOURCE_BYTES, metavar="BYTES",
                   help="the largest source a Stack or Workspace may have, in bytes: a git checkout's files and "
                        "what git fetches, a Flux artifact downloaded and unpacked, a workspace pod's upload; a "
                        f"larger one stalls its Stack naming this flag (default: {DEFAULT_MAX_SOURCE_BYTES >> 20} MiB)")
    p.add_argument("--stall-after-failures", type=int, default=DEFAULT_STALL_AFTER_FAILURES,
                   help="consecutive failures after which a Stack is Stalled/UpdateFailed until it changes")
    p.add_argument("--min-resync-seconds", type=int, default=MIN_RESYNC_SECONDS,
                   help="floor of resyncFrequencySeconds, also the branch poll period (PKO: 60; lower it for tests)")
    p.add_argument("--operator-refs", action=argparse.BooleanOptionalAction, default=False,
                   help="allow Env and FS refs (PKO v1's meaning: they read the operator's own environment and "
                        "files) and a PKO Workspace's local.dir from the operator's host; off by default, so that "
                        "whoever may write a Stack cannot read the operator's credentials through them")
    p.add_argument("--backend-probe-seconds", type=float, default=10.0,
                   help="while an update runs, how often the operator checks that its state backend takes a "
                        "connection, saying BackendUnreachable on the Stack when not (0: off, for an operator "
                        "whose network may not reach the backends its workspace pods reach)")
    p.add_argument("--metrics-port", type=int, default=8383, help="Prometheus metrics port (0: off)")
    p.add_argument("--metrics-bind-address", type=ip_address, default="127.0.0.1", metavar="ADDRESS",
                   help="the IP address the metrics are served on (default 127.0.0.1: this host only; 0.0.0.0: every "
                        "address, with --metrics-auth kubernetes, as the Operator component runs it in a pod)")
    p.add_argument("--metrics-auth", choices=("none", "kubernetes"), default="none",
                   help="who may read the metrics: `none`, whoever reaches the address (default); `kubernetes`, a "
                        "client whose bearer token the API server accepts (TokenReview) for a user who may get the "
                        "non-resource URL /metrics (SubjectAccessReview; the ClusterRole strata-metrics-reader "
                        "grants it); needs create on tokenreviews and subjectaccessreviews")
    p.add_argument("--health-port", type=int, default=8384, help="liveness/readiness port (0: off)")
    p.add_argument("--no-leader-election", action="store_true",
                   help="handle Stacks without holding the leader Lease (for a single replica or tests; two "
                        "operators without it both run updates of the same Stacks)")
    p.add_argument("--leader-election-lease", metavar="NAME",
                   help="coordination.k8s.io Lease the operator replicas elect their one leader on (default: "
                        f"{DEFAULT_LEASE_NAME}; a shard's: {DEFAULT_LEASE_NAME}-shard-<hash of its selector>)")
    p.add_argument("--leader-election-namespace", default="", metavar="NAMESPACE",
                   help="namespace of that Lease (default: the pod's own, else the kubeconfig context's, "
                        "else strata-system)")
    p.add_argument("--watch-label-selector", default=os.environ.get("STRATA_WATCH_LABEL_SELECTOR", ""),
                   metavar="SELECTOR",
                   help="handle only the Stacks, Programs, Workspaces and Updates whose labels match (Flux's "
                        f"sharding: the main operator '{MAIN_SELECTOR}', each shard '{SHARD_KEY}=<shard>'); "
                        "default: all")
    p.add_argument("--flux-events-address", default=os.environ.get("STRATA_FLUX_EVENTS_ADDRESS", ""), metavar="URL",
                   help="also send every Stack Event, in Flux's event format, to Flux's notification-controller "
                        "event server at this URL (e.g. http://notification-controller.flux-system.svc.cluster."
                        "local./), asynchronously and best effort; default: off")
    p.add_argument("--executor", choices=("process", "pod"), default=os.environ.get("STRATA_EXECUTOR", "process"),
                   help="where updates run: `process`, forked by the operator as its own user (default); `pod`, in "
                        "a workspace pod per Stack in its namespace, under its serviceAccountName, from "
                        "--workspace-image (isolates teams from each other and from the operator)")
    p.add_argument("--workspace-image", default=os.environ.get("STRATA_WORKSPACE_IMAGE", ""), metavar="IMAGE",
                   help="with --executor pod: the image of workspace pods, the operator's own (its agent, pulumi "
                        "CLI and language hosts run the updates)")
    p.add_argument("--workspace-image-pull-policy", default="IfNotPresent", choices=("Always", "IfNotPresent", "Never"))
    p.add_argument("--workspace-node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="with --executor pod: a node label every workspace pod requires (repeatable)")
    p.add_argument("--workspace-toleration", action="append", default=[], metavar="KEY=VALUE:EFFECT",
                   help="with --executor pod: a taint every workspace pod tolerates (repeatable)")
    p.add_argument("--trusted-namespace", action="append", default=[], metavar="NAMESPACE",
                   help="with --executor process: a namespace whose Stacks' programs run unsandboxed, as the "
                        "operator's own user, able to read whatever it can (repeatable; '*': every namespace, for "
                        "an operator whose every Stack author may act as the operator). The operator's own "
                        "namespace is always trusted; every other one runs in a bubblewrap sandbox of its own, "
                        "or not at all")
    p.add_argument("--verbose", "-v", action="store_true")
    return p


def ip_address(value: str) -> str:
    """An IP address flag's value; argparse names the flag with the error."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address: give one such as 127.0.0.1, or 0.0.0.0 "
                                         "for every address (the port is --metrics-port)") from None


def workspace_settings(args: argparse.Namespace) -> WorkspaceSettings | None:
    """The pod executor's settings from the flags (None: the process executor); SystemExit names a bad flag."""
    if args.executor != "pod":
        return None
    if not args.workspace_image:
        raise SystemExit("--executor pod needs --workspace-image IMAGE (the operator's own image), or "
                         "STRATA_WORKSPACE_IMAGE")
    selector = {}
    for item in args.workspace_node_selector:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--workspace-node-selector {item!r}: write KEY=VALUE")
        selector[key] = value
    tolerations = []
    for item in args.workspace_toleration:
        match = re.fullmatch(r"([^=:]+)(?:=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)", item)
        if match is None:
            raise SystemExit(f"--workspace-toleration {item!r}: write KEY=VALUE:EFFECT or KEY:EFFECT (EFFECT: "
                             "NoSchedule, PreferNoSchedule or NoExecute)")
        key, value, effect = match.groups()
        tolerations.append({"key": key, "operator": "Equal", "value": value, "effect": effect} if value is not None
                           else {"key": key, "operator": "Exists", "effect": effect})
    return WorkspaceSettings(image=args.workspace_image, image_pull_policy=args.workspace_image_pull_policy,
                             node_selector=selector, tolerations=tuple(tolerations))


def operator_container_memory(environ: Mapping[str, str]) -> ContainerMemory | None:
    """The operator's container, when its Deployment says where its resources are set (the Operator
    component's does): updates the process executor runs there share its memory limit. None on a host."""
    field = environ.get(RESOURCES_FIELD_ENV, "")
    return ContainerMemory("the operator's container", field) if field else None


def trusted_namespaces(args: argparse.Namespace) -> frozenset[str]:
    """The namespaces whose programs run unsandboxed: the operator's own (where its Lease is: the platform's
    Stacks run there) and --trusted-namespace."""
    from .controllers.leadership import discover_namespace

    own = args.leader_election_namespace or discover_namespace(args.kubeconfig)[0]
    return frozenset({own, *args.trusted_namespace})


def preflight_settings(args: argparse.Namespace, election: ElectionSettings) -> PreflightSettings:
    from .controllers.leadership import discover_namespace
    from .controllers.preflight import PortSetting, PreflightSettings

    lease = None
    if election.enabled:
        lease = (election.namespace or discover_namespace(election.kubeconfig)[0], election.lease_name)
    return PreflightSettings(ports=(PortSetting("--metrics-port", args.metrics_port, "metrics",
                                                args.metrics_bind_address),
                                    PortSetting("--health-port", args.health_port, "health")),
                             kubeconfig=args.kubeconfig, lease=lease)


class ObjectPrefixFormatter(logging.Formatter):
    """Prefix Kopf's per-object records with [namespace/name], as `kopf run` does."""

    def format(self, record: logging.LogRecord) -> str:
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("name"):
            record = copy.copy(record)
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
            record.msg = f"[{where}] {record.msg}"
        return super().format(record)


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (without the program name) and run the operator until interrupted; a stopped operator
    ends its process here (an operator that cannot start returns 1)."""
    import kopf

    for module in HANDLER_MODULES:  # importing one registers its Kopf handlers
        importlib.import_module(f"{__package__}.{module}")
    from .controllers.context import OperatorSettings
    from .controllers import preflight
    from .controllers.leadership import ElectionSettings, check_settings, discover_namespace
    from .controllers.startup import StartupFailed, describe_startup_failure

    args = build_parser().parse_args(argv)
    if args.concurrency is None:
        args.concurrency = DEFAULT_POD_CONCURRENCY if args.executor == "pod" else DEFAULT_CONCURRENCY
    if args.concurrency < 1:
        raise SystemExit("--concurrency must be at least 1")
    if args.min_resync_seconds < 1:
        raise SystemExit("--min-resync-seconds must be at least 1")
    if args.max_source_bytes < 1:
        raise SystemExit("--max-source-bytes must be at least 1")
    if args.plugin_cache.name != "plugins":
        raise SystemExit(f"--plugin-cache {args.plugin_cache}: name the plugins directory of a PULUMI_HOME (e.g. "
                         "/srv/pulumi/plugins), so that `PULUMI_HOME=/srv/pulumi pulumi plugin install ...` fills it")
    workspace = workspace_settings(args)
    try:
        shard = Shard.of(args.watch_label_selector)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    try:
        flux_events_address = check_address(args.flux_events_address)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if args.kubeconfig:
        # Kopf's own login reads KUBECONFIG too; keep one source of truth.
        os.environ["KUBECONFIG"] = args.kubeconfig
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    election = ElectionSettings(enabled=not args.no_leader_election,
                                lease_name=args.leader_election_lease or shard.lease_name(DEFAULT_LEASE_NAME),
                                namespace=args.leader_election_namespace, kubeconfig=args.kubeconfig,
                                health_endpoint=liveness, restart_in_place=True)
    check_settings(election)
    console = logging.StreamHandler()
    console.setFormatter(ObjectPrefixFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[console])
    log = logging.getLogger("strata_operator")
    failures = preflight.check(preflight_settings(args, election))  # before anything is started or forked
    if failures:
        for failure in failures:
            log.critical("%s", failure.line())
        return 1
    python_cache = args.python_cache.expanduser().absolute()
    engine = EngineSettings(pulumi_command=args.pulumi, state_dir=args.state_dir, concurrency=args.concurrency,
                            timeout_seconds=args.update_timeout, plugin_dirs=tuple(args.plugin_dir),
                            plugin_cache=args.plugin_cache.expanduser().absolute(),
                            python_cache=python_cache, bytecode_cache=bytecode_cache_beside(python_cache),
                            container_memory=operator_container_memory(os.environ),
                            trusted_namespaces=trusted_namespaces(args))
    try:
        log.info("%s", engine.summary())
    except EngineUnavailable as err:
        log.error("%s", err)
    settings = OperatorSettings(
        engine=engine,
        stall_after_failures=args.stall_after_failures, min_resync_seconds=args.min_resync_seconds,
        allow_operator_refs=args.operator_refs, backend_probe_seconds=args.backend_probe_seconds,
        own_namespace=discover_namespace(args.kubeconfig)[0],
        metrics=MetricsServing(args.metrics_port, args.metrics_bind_address, args.metrics_auth),
        kubeconfig=args.kubeconfig, flux_events_address=flux_events_address,
        workspace=workspace, shard=shard, max_source_bytes=args.max_source_bytes)
    start_trimming()  # the free heap a burst of Stacks leaves goes back to the system
    try:
        kopf.run(
            clusterwide=not args.namespace, namespaces=args.namespace, standalone=True,
            liveness_endpoint=liveness, memo=kopf.Memo(operator_settings=settings, leader_election=election,
                                                       watched_namespaces=len(args.namespace)))
    except StartupFailed as err:
        # A startup handler failed (they are registered errors=PERMANENT): no retry; the engine's fork
        # server, if one started, exits with this process (its stdin closes).
        log.critical("cannot start: %s", describe_startup_failure(err))
        return 1
    # Stopped: its updates drained, its Lease handed over. The interpreter's own teardown would now free the
    # heap object by object (1.4 s with one Stack, measured), which a rolling upgrade or `make down` waits on.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
