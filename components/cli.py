"""The `strata` command: the local platform (`strata local ...`), the dev stack (`strata dev ...`), the
operator (`strata operator run`) and its Stacks (`strata get stacks`, `strata reconcile stack NAME`,
`strata logs stack NAME`, in the manner of `flux get|reconcile|logs`), and `strata console`, the same in a
browser.

Every action is a subcommand with its own options, and a group's options are accepted before or
after the action alike (`strata local --state-dir X up` and `strata local up --state-dir X`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

try:
    from . import backup, stackctl
    from .local import clusterstack, devstack, toolchain
    from .local.images import ImageError
    from .local.platform import (CLUSTER_PROFILE_MIN_REAL_NODES, DEFAULT_HOST_CONTROLLERS, HOST_CONTROLLERS,
                                 PROFILES, LocalPlatform, PlatformConfig, PlatformError, default_state_dir,
                                 recorded_shape)
    from .local.processes import ProcessError
except ImportError as missing_extra:
    if missing_extra.name != "strata_components.local":
        raise
    raise SystemExit(f"strata: {missing_extra}") from None  # it names the extra and the fix


def _platform(args: argparse.Namespace) -> LocalPlatform:
    return LocalPlatform(PlatformConfig(
        state_dir=args.state_dir, nodes=args.nodes, real_nodes=args.real_nodes,
        host_controllers=tuple(args.controllers.split(",")) if args.controllers else (),
        apiserver_port=args.apiserver_port, profile=args.profile,
    ))


def _local_up(args: argparse.Namespace) -> int:
    toolchain.ensure()
    info = _platform(args).up()
    print(f"export KUBECONFIG={shlex.quote(str(info.kubeconfig_path))}")
    return 0


def _local_down(args: argparse.Namespace) -> int:
    stopped = _platform(args).down()
    print(f"stopped {len(stopped)} process(es)" if stopped else "nothing was running")
    return 0


def _local_status(args: argparse.Namespace) -> int:
    platform = _platform(args)
    status = platform.status()
    # Each process's state, then the ports the platform picked and keeps (the operator's included).
    print(json.dumps({**status, "ports": platform.ports()}, indent=1))
    return 0 if all(status.values()) else 3


def _local_env(args: argparse.Namespace) -> int:
    for key, value in _platform(args).shell_env().items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _local_bucket(args: argparse.Namespace) -> int:
    platform = _platform(args)
    platform.create_bucket(args.name)
    print(platform.s3_backend_url(args.name))
    return 0


def _local_toolchain(args: argparse.Namespace) -> int:
    return toolchain.main([*args.names, *(arg for name in args.rebuild for arg in ("--rebuild", name))])


def _local_host_packages(_args: argparse.Namespace) -> int:
    from .local import realnode

    realnode.ensure_debian_packages(lambda line: print(line, file=sys.stderr))
    return 0  # optional: kwok nodes need none of it


def _dev_up(args: argparse.Namespace) -> int:
    if args.stack == clusterstack.STACK:
        clusterstack.up(args.project, devstack.dev_home(args.home).base, timeout=args.timeout)
    else:
        devstack.up(args.project, devstack.dev_home(args.home), timeout=args.timeout)
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    if args.stack == clusterstack.STACK:
        clusterstack.down(args.project, devstack.dev_home(args.home).base, force=args.force,
                          stuck_after=args.stuck_after)
    else:
        devstack.down(args.project, devstack.dev_home(args.home), force=args.force, stuck_after=args.stuck_after)
    return 0


def _image_build(args: argparse.Namespace) -> int:
    from .local import images, realnode

    install = images.user_pulumi_install()
    if install.missing:  # an image that cannot run the layers in a cluster is not worth pushing
        raise ImageError(images.build_missing_install_message(install.missing))
    built = images.build_operator_image(toolchain.ensure(), install)
    if args.push:  # the way users ship it: through the registry, pulled by the nodes
        repository, tag = built.name.rsplit(":", 1)
        platform = LocalPlatform(PlatformConfig(state_dir=args.state_dir))
        print(platform.push_image(built, repository.rsplit("/", 1)[-1], tag))
        return 0
    nodes = [realnode.load_node(d) for d in realnode.node_dirs(args.state_dir) if (d / "node.json").exists()]
    for node in nodes:
        images.load_image(built, node.containerd_socket)
        print(f"loaded into real node {node.name}", file=sys.stderr)
    print(built.name)
    return 0


def _backup_roots(args: argparse.Namespace) -> list[Path]:
    """The backends named, else the dev home's (the bootstrap's and platform's, the teams' below it)."""
    return [backup.backend_dir(b) for b in args.backend] or [devstack.dev_home(args.home).backend_dir]


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _backup_create(args: argparse.Namespace) -> int:
    out = args.out or Path(f"strata-backup-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.tar.gz")
    manifest = backup.create(_backup_roots(args), out.absolute(), wait_seconds=args.wait, say=_say)
    stacks = sum(len(backup.stacks_of(entry["files"])) for entry in manifest["backends"])
    print(f"{out}: {len(manifest['backends'])} backend(s), {stacks} stack(s)")
    return 0


def _backup_restore(args: argparse.Namespace) -> int:
    restored = backup.restore(args.archive, args.backend, say=_say)
    print(f"restored {len(restored)} backend(s) from {args.archive}")
    return 0


def _operator_run(args: argparse.Namespace) -> int:
    from strata_operator.main import run

    return run(args.rest)


def _cluster(args: argparse.Namespace) -> stackctl.Cluster:
    return stackctl.Cluster.connect(args.kubeconfig, args.context, args.namespace)


def _get_stacks(args: argparse.Namespace) -> int:
    return stackctl.get_stacks(_cluster(args), args.all_namespaces, args.namespace, args.output)


def _reconcile_stack(args: argparse.Namespace) -> int:
    timeout = stackctl.parse_duration(args.timeout)  # a typo fails before anything is annotated
    return stackctl.reconcile_stack(_cluster(args), args.namespace, args.name, timeout, args.output)


def _suspend_stack(args: argparse.Namespace) -> int:
    return stackctl.suspend_stack(_cluster(args), args.namespace, args.name, args.output)


def _resume_stack(args: argparse.Namespace) -> int:
    timeout = stackctl.parse_duration(args.timeout)
    return stackctl.resume_stack(_cluster(args), args.namespace, args.name, timeout, args.output)


def _approve_stack(args: argparse.Namespace) -> int:
    timeout = stackctl.parse_duration(args.timeout)
    return stackctl.approve_stack(_cluster(args), args.namespace, args.name, timeout, args.output)


def _logs_stack(args: argparse.Namespace) -> int:
    state_dirs = [args.operator_state_dir] if args.operator_state_dir else stackctl.operator_state_dirs()
    return stackctl.stack_logs(_cluster(args), args.namespace, args.name, state_dirs, args.output)


def _console(args: argparse.Namespace) -> int:
    from .console import app

    state_dirs = [args.operator_state_dir] if args.operator_state_dir else stackctl.operator_state_dirs()
    try:
        app.serve(_cluster(args), args.port, state_dirs)
    except app.ConsoleError as error:
        raise stackctl.StackCtlError(str(error)) from None
    return 0


def _stack_options() -> argparse.ArgumentParser:
    """What kubectl and flux take for every command that talks to a cluster."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--kubeconfig", default=argparse.SUPPRESS,
                         help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    options.add_argument("--context", default=argparse.SUPPRESS, help="kubeconfig context (default: current)")
    options.add_argument("-n", "--namespace", default=argparse.SUPPRESS,
                         help="namespace (default: the context's, else default)")
    options.add_argument("-o", "--output", choices=("table", "json"), default=argparse.SUPPRESS,
                         help="table (default) or json")
    return options


def _local_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS,
                         help=f"where the platform keeps PKI, data, logs (default: {default_state_dir()})")
    options.add_argument("--nodes", type=int, default=argparse.SUPPRESS, help="number of kwok nodes (default: 1)")
    options.add_argument("--real-nodes", type=int, default=argparse.SUPPRESS,
                         help="nodes where pods really run: kubelet on containerd, needs root (default: 0)")
    options.add_argument("--controllers", default=argparse.SUPPRESS,
                         help=f"host controllers to run, comma-separated, of {','.join(HOST_CONTROLLERS)} "
                              f"(default: {','.join(DEFAULT_HOST_CONTROLLERS)})")
    options.add_argument("--apiserver-port", type=int, default=argparse.SUPPRESS,
                         help="fixed kube-apiserver port (default: a free one)")
    options.add_argument("--profile", choices=PROFILES, default=argparse.SUPPRESS,
                         help=f"dev: kwok nodes; cluster: what a team's cluster has, at least "
                              f"{CLUSTER_PROFILE_MIN_REAL_NODES} real nodes with kube-proxy and CoreDNS, its tools built "
                              f"on first use (default: dev)")
    return options


def _dev_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--project", type=Path, default=argparse.SUPPRESS, help="the bootstrap project (default: .)")
    options.add_argument("--home", type=Path, default=argparse.SUPPRESS,
                         help="where the dev stack keeps its passphrase, backend, platform and config (default: "
                              "$STRATA_HOME, else $XDG_STATE_HOME/strata, else ~/.local/state/strata)")
    options.add_argument("--stack", choices=(devstack.STACK, clusterstack.STACK), default=argparse.SUPPRESS,
                         help="dev: the local embedded default; cluster: Pulumi.cluster.yaml on the stand-in for a "
                              "cluster you already have (default: dev)")
    return options


LOCAL_DEFAULTS = {"state_dir": None, "nodes": 1, "real_nodes": 0, "controllers": ",".join(DEFAULT_HOST_CONTROLLERS), "apiserver_port": None, "profile": "dev"}
DEV_DEFAULTS = {"project": None, "home": None, "stack": "dev"}
STACK_DEFAULTS = {"kubeconfig": None, "context": None, "namespace": None, "output": "table",
                  "all_namespaces": False, "timeout": "5m", "operator_state_dir": None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    local_options = _local_options()
    local = commands.add_parser("local", parents=[local_options],
                                help="the local platform: Kubernetes on loopback, Flux, git server")
    local_actions = local.add_subparsers(dest="action", required=True)
    for name, handler, help_text in (("up", _local_up, "start the platform (idempotent)"),
                                     ("down", _local_down, "stop every process it started"),
                                     ("status", _local_status, "which processes run"),
                                     ("env", _local_env, "KUBECONFIG and PATH exports for a shell")):
        local_actions.add_parser(name, parents=[local_options], help=help_text).set_defaults(handler=handler)
    bucket = local_actions.add_parser("bucket", parents=[local_options],
                                      help="create a bucket in the cluster profile's object store; print its s3:// backend URL")
    bucket.add_argument("name", help="the bucket (S3 naming rules)")
    bucket.set_defaults(handler=_local_bucket)
    tools = local_actions.add_parser("toolchain", help="build the Go toolchain into the cache")
    tools.add_argument("names", nargs="*", help="tools to build (default: those every platform uses)")
    tools.add_argument("--rebuild", action="append", default=[], help="rebuild this tool even if cached")
    tools.set_defaults(handler=_local_toolchain)
    local_actions.add_parser("host-packages", help="install (as root) or name the Debian packages real nodes need"
                             ).set_defaults(handler=_local_host_packages)

    dev_options = _dev_options()
    dev = commands.add_parser("dev", parents=[dev_options], help="the bootstrap program's dev stack (`make up`)")
    dev_actions = dev.add_subparsers(dest="action", required=True)
    dev_up = dev_actions.add_parser("up", parents=[dev_options],
                                    help="pulumi up of the dev stack, then wait until every Stack is Ready")
    dev_up.add_argument("--timeout", type=float, default=devstack.DEFAULT_UP_TIMEOUT,
                        help="seconds to wait for the Stacks (default: %(default)s)")
    dev_up.set_defaults(handler=_dev_up)
    dev_down = dev_actions.add_parser("down", parents=[dev_options],
                                      help="destroy the dev stack and stop every local process")
    dev_down.add_argument("--force", action="store_true",
                          help="remove the finalizer of a Stack whose destroy cannot finish (its resources stay)")
    dev_down.add_argument("--stuck-after", type=float, default=devstack.DEFAULT_STUCK_SECONDS,
                          help="seconds a Stack may be destroyed without any change (default: %(default)s)")
    dev_down.set_defaults(handler=_dev_down)

    image = commands.add_parser("image", help="the operator's container image, without a registry")
    image_actions = image.add_subparsers(dest="action", required=True)
    image_build = image_actions.add_parser(
        "build", help="build the operator image (Debian tools, cached by content) with the Python language host "
                      "and provider plugins of your Pulumi install, load it into every running real node, print its name")
    image_build.add_argument("--state-dir", type=Path, default=default_state_dir(),
                             help="the local platform whose real nodes get the image (default: %(default)s)")
    image_build.add_argument("--push", action="store_true",
                             help="push it to the platform's registry (the cluster profile's) instead, and print "
                                  "the name pods pull it by")
    image_build.set_defaults(handler=_image_build)

    stack_options = _stack_options()
    get_options = argparse.ArgumentParser(add_help=False, parents=[stack_options])
    get_options.add_argument("-A", "--all-namespaces", action="store_true", default=argparse.SUPPRESS,
                             help="objects of every namespace")
    get = commands.add_parser("get", parents=[get_options], help="list objects with their status")
    get_kinds = get.add_subparsers(dest="action", required=True)
    get_kinds.add_parser("stacks", aliases=["stack"], parents=[get_options],
                         help="Stacks: ready, reason, last update, commit, age, message").set_defaults(
        handler=_get_stacks)

    def stack_command(command: str, help_text: str, stack_help: str, handler, name_help: str = "the Stack's name",
                      waits: bool = True) -> argparse.ArgumentParser:
        """`strata COMMAND stack NAME`, as flux's `COMMAND KIND NAME`; with --timeout where it waits."""
        kinds = commands.add_parser(command, parents=[stack_options], help=help_text).add_subparsers(
            dest="action", required=True)
        stack = kinds.add_parser("stack", parents=[stack_options], help=stack_help)
        stack.add_argument("name", help=name_help)
        if waits:
            stack.add_argument("--timeout", default=argparse.SUPPRESS,
                               help="how long to wait: seconds or 90s, 5m, 1h (default: 5m)")
        stack.set_defaults(handler=handler)
        return stack

    stack_command("reconcile", "run an object now and wait for the result",
                  f"set {stackctl.RECONCILE_REQUEST} and wait until the operator has answered it", _reconcile_stack)
    stack_command("suspend", "run nothing more for an object", "set spec.suspend: no updates run until resumed",
                  _suspend_stack, waits=False)
    stack_command("resume", "run an object again and wait",
                  "clear spec.suspend and wait until what changed meanwhile has run", _resume_stack)
    stack_command("approve", "approve an object's saved plan",
                  "approve the plan in status.plan (spec.approval.mode: Manual) and wait until it is applied",
                  _approve_stack, name_help="the Stack's name, or NAMESPACE/NAME")

    logs = commands.add_parser("logs", parents=[stack_options], help="an object's last engine output")
    logs_kinds = logs.add_subparsers(dest="action", required=True)
    logs_stack = logs_kinds.add_parser("stack", parents=[stack_options],
                                       help="the last update's engine output, redacted, as the operator kept it")
    logs_stack.add_argument("name", help="the Stack's name")
    logs_stack.add_argument("--operator-state-dir", type=Path, default=argparse.SUPPRESS,
                            help="the operator's --state-dir (default: the first holding the log of "
                                 "$STRATA_OPERATOR_STATE, the dev home's platform/operator, ~/.cache/strata/operator)")
    logs_stack.set_defaults(handler=_logs_stack)

    backups = commands.add_parser("backup", help="back up and restore every layer's Pulumi state (file:// backends)")
    backup_actions = backups.add_subparsers(dest="action", required=True)
    create = backup_actions.add_parser(
        "create", help="one archive of every backend under the given ones (the teams' teams/<team> included), "
                       "taken while no update holds a lock")
    create.add_argument("--backend", action="append", default=[], metavar="URL",
                        help="a file:// backend or its directory (repeatable; default: the dev home's, "
                             "which holds the bootstrap's, the platform's and below it each team's)")
    create.add_argument("--home", type=Path, default=None, help="the dev home (default: as `strata dev`)")
    create.add_argument("--out", type=Path, default=None, help="the archive (default: strata-backup-<UTC time>.tar.gz)")
    create.add_argument("--wait", type=float, default=backup.DEFAULT_WAIT_SECONDS,
                        help="seconds to wait for running updates to finish (default: %(default)s)")
    create.set_defaults(handler=_backup_create)
    restore = backup_actions.add_parser(
        "restore", help="put backends' state back exactly as in an archive (suspend their Stacks first)")
    restore.add_argument("archive", type=Path)
    restore.add_argument("--backend", action="append", default=[], metavar="URL",
                         help="restore only this backend: its file:// URL, directory, or path below the backed-up "
                              "one, e.g. teams/alpha (repeatable; default: all in the archive)")
    restore.set_defaults(handler=_backup_restore)

    console = commands.add_parser("console", parents=[stack_options],
                                  help="a web console of every Stack, layer, plan and rollout, on loopback, acting "
                                       "as your kubeconfig's user; prints its URL")
    console.add_argument("--port", type=int, default=0,
                         help="port on 127.0.0.1 (default: a free one, printed with the URL)")
    console.add_argument("--operator-state-dir", type=Path, default=argparse.SUPPRESS,
                         help="the operator's --state-dir, for the last update's engine output (as `strata logs`)")
    console.set_defaults(handler=_console)

    operator = commands.add_parser("operator", help="the Strata operator")
    operator_actions = operator.add_subparsers(dest="action", required=True)
    # Its options are the operator's own (`strata operator run --help` shows them).
    operator_actions.add_parser("run", help="run the operator", add_help=False).set_defaults(handler=_operator_run)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "operator":
        args.rest = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    # Group options are shared by the group and its actions, so their defaults are filled in here.
    stack_commands = ("get", "reconcile", "suspend", "resume", "approve", "logs", "console")
    defaults = {"local": LOCAL_DEFAULTS, "dev": DEV_DEFAULTS,
                **dict.fromkeys(stack_commands, STACK_DEFAULTS)}.get(args.command, {})
    if args.command == "local" and args.action in ("status", "down", "env"):
        # About a platform that exists: what it was started with, unless told otherwise (a cluster-profile
        # stand-in runs no host controllers, and its status must not list the default ones as stopped).
        defaults = {**defaults, **recorded_shape(getattr(args, "state_dir", None) or default_state_dir())}
    for key, value in defaults.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    if args.command == "local" and args.state_dir is None:
        args.state_dir = default_state_dir()
    if args.command == "dev" and args.project is None:
        args.project = Path.cwd()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return args.handler(args)
    except (toolchain.ToolchainError, PlatformError, ProcessError, devstack.DevStackError, ImageError,
            stackctl.StackCtlError, backup.BackupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
