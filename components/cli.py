"""The `strata` command: the local platform (`strata local ...`) and the operator (`strata operator run`)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .local import devstack, toolchain
from .local.platform import HOST_CONTROLLERS, LocalPlatform, PlatformConfig, PlatformError, default_state_dir
from .local.processes import ProcessError


def _platform(args: argparse.Namespace) -> LocalPlatform:
    return LocalPlatform(PlatformConfig(
        state_dir=args.state_dir, nodes=args.nodes,
        host_controllers=tuple(args.controllers.split(",")) if args.controllers else (),
        apiserver_port=args.apiserver_port,
    ))


def _local(args: argparse.Namespace) -> int:
    if args.action == "toolchain":
        return toolchain.main(args.rest)
    platform = _platform(args)
    if args.action == "up":
        toolchain.ensure()
        info = platform.up()
        print(f"export KUBECONFIG={shlex.quote(str(info.kubeconfig_path))}")
    elif args.action == "down":
        stopped = platform.down()
        print(f"stopped {len(stopped)} process(es)" if stopped else "nothing was running")
    elif args.action == "status":
        status = platform.status()
        print(json.dumps(status, indent=1))
        return 0 if all(status.values()) else 3
    elif args.action == "env":
        for key, value in platform.shell_env().items():
            print(f"export {key}={shlex.quote(value)}")
    return 0


def _dev(args: argparse.Namespace) -> int:
    action = devstack.up if args.action == "up" else devstack.down
    action(args.project, args.state_dir)
    return 0


def _operator(args: argparse.Namespace) -> int:
    from strata_operator.main import run

    return run(args.rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="the local platform: Kubernetes on loopback, Flux, git server")
    local.add_argument("action", choices=["up", "down", "status", "env", "toolchain"])
    local.add_argument("--state-dir", type=Path, default=default_state_dir(),
                       help="where the platform keeps PKI, data, logs (default: %(default)s)")
    local.add_argument("--nodes", type=int, default=1, help="number of kwok nodes")
    local.add_argument("--controllers", default=",".join(HOST_CONTROLLERS),
                       help="host controllers to run, comma-separated (default: %(default)s)")
    local.add_argument("--apiserver-port", type=int, help="fixed kube-apiserver port (default: a free one)")
    local.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    local.set_defaults(handler=_local)

    dev = commands.add_parser("dev", help="the bootstrap program's dev stack (what `make up` runs)")
    dev.add_argument("action", choices=["up", "down"])
    dev.add_argument("--project", type=Path, default=Path.cwd(), help="the bootstrap project (default: .)")
    dev.add_argument("--state-dir", type=Path, default=default_state_dir())
    dev.set_defaults(handler=_dev)

    operator = commands.add_parser("operator", help="the Strata operator")
    operator.add_argument("action", choices=["run"])
    operator.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the operator")
    operator.set_defaults(handler=_operator)

    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (toolchain.ToolchainError, PlatformError, ProcessError, devstack.DevStackError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
