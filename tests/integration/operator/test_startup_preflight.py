"""An operator that cannot start says why in one line and exits 1, with nothing left running: no Kopf
retry every 60 s, no fork server per retry (issue #29: a taken metrics port left 4 idle workers in 5 minutes
and no exit). Each started as `strata operator run` is, under the operator's own ServiceAccount token."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_components.local import processes
from strata_components.local.kube import write_private
from strata_components.local.operator_host import OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT

# Far below Kopf's 60 s retry of a failed startup handler.
EXIT_WITHIN = 30.0


def _argv(platform, tmp_path: Path, *extra: str) -> tuple[list[str], dict[str, str], list[int]]:
    kubeconfig = write_private(tmp_path / "kubeconfig",
                               platform.token_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, 600))
    metrics_port, health_port = processes.free_ports(2)
    argv = [sys.executable, "-m", "strata_operator", "--kubeconfig", str(kubeconfig),
            "--pulumi", str(platform.toolchain.dir("pulumi") / "bin" / "pulumi"),
            "--state-dir", str(tmp_path / "state"), "--metrics-port", str(metrics_port),
            "--health-port", str(health_port), *extra]
    return argv, {"KUBECONFIG": str(kubeconfig)}, [metrics_port, health_port]


def _run_until_exit(platform, name: str, argv: list[str], env: dict[str, str]) -> tuple[int, list[str], int]:
    """(exit code, the log's `cannot start` lines, pid) of one operator run; fails if it has not exited in time."""
    pid = processes.start(processes.HostProcess(name, argv, env=env), platform.run_dir, platform.log_dir)
    deadline = time.monotonic() + EXIT_WITHIN
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)  # started by this process: its child
            if done:
                log = (platform.log_dir / f"{name}.log").read_text(errors="replace")
                return os.waitstatus_to_exitcode(status), [line for line in log.splitlines()
                                                           if "cannot start:" in line], pid
            time.sleep(0.2)
        log = (platform.log_dir / f"{name}.log").read_text(errors="replace")
        pytest.fail(f"the operator still runs after {EXIT_WITHIN:.0f} s:\n{log[-3000:]}")
    finally:
        platform.stop_controller(name)


def _left_behind(pid: int, state_dir: Path) -> list[str]:
    """Processes of that operator still alive: its process group, or anything working in its state dir
    (the fork server leads its own session there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cwd = os.readlink(entry / "cwd")
        except (OSError, IndexError):
            continue
        if stat[0] != "Z" and (int(stat[2]) == pid or cwd.startswith(str(state_dir))):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {command}")
    return found


def test_a_taken_metrics_port_is_one_line_and_exit_1_with_nothing_left(operator, platform, tmp_path):
    argv, env, (metrics_port, _health) = _argv(platform, tmp_path)
    with socket.socket() as squatter:  # another program on that port, as a second operator on the host was
        squatter.bind(("0.0.0.0", metrics_port))
        squatter.listen()
        code, lines, pid = _run_until_exit(platform, "strata-operator-port-taken", argv, env)
    assert code == 1
    assert lines and len(lines) == 1, lines
    assert lines[0].endswith(f"cannot start: the metrics port {metrics_port} (--metrics-port) is already in use on "
                             "this host; fix: stop what listens there, or give --metrics-port a free port "
                             "(--metrics-port 0 turns it off)")
    assert _left_behind(pid, tmp_path / "state") == []


def test_no_permission_for_its_lease_is_one_line_and_exit_1(operator, platform, namespace, tmp_path):
    # The operator's Role for its Lease is in strata-system only.
    argv, env, _ports = _argv(platform, tmp_path, "--leader-election-namespace", namespace)
    code, lines, pid = _run_until_exit(platform, "strata-operator-no-lease", argv, env)
    assert code == 1
    assert len(lines) == 1, lines
    assert (f"cannot start: the operator may not get/create/update its leader Lease {namespace}/strata-operator-leader"
            in lines[0]) and f"fix: grant get, create and update on coordination.k8s.io leases in namespace " \
                                f"{namespace}" in lines[0]
    assert _left_behind(pid, tmp_path / "state") == []


def test_a_startup_step_that_fails_stops_it_at_once_even_while_another_leads(operator, platform, tmp_path):
    # Past the preflight (ports free, Lease allowed, CRDs served), the engine's state directory cannot be
    # made; the session's operator holds the Lease, so this one would stand by before it could exit.
    argv, env, _ports = _argv(platform, tmp_path)
    (tmp_path / "state").write_text("a file where the state directory goes")
    started = time.monotonic()
    code, lines, pid = _run_until_exit(platform, "strata-operator-bad-state", argv, env)
    assert code == 1 and time.monotonic() - started < EXIT_WITHIN
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"cannot start: the state directory {tmp_path / 'state'} (--state-dir) cannot be made "
                             "(File exists); fix: give --state-dir a directory this user may write")
    assert _left_behind(pid, tmp_path) == []


def test_the_dev_stacks_operator_gets_the_platforms_kept_ports_shown_by_status(operator, platform, plugin_cache,
                                                                              tmp_path):
    """The Operator component's local process (its dynamic provider, as `make up` runs it): ports picked free
    by the platform on first use, the same after a restart, shown by `strata local status`. It stands by
    beside the session's operator (which leads), so it handles nothing here."""
    import json
    import urllib.request

    from strata_components.local.kube import http_ok
    from strata_components.operator import OperatorProcessProvider

    state = tmp_path / "platform"  # a platform record of its own, so this operator's process name is free
    state.mkdir()
    (state / "platform.json").write_text(json.dumps({"ports": {
        name: port for name, port in platform.ports().items() if not name.startswith("operator_")}}))
    props = {"state_dir": str(state), "name": "strata-operator", "command": [sys.executable, "-m", "strata_operator"],
             "flags": [f"--state-dir={tmp_path / 'operator'}", "--plugin-cache", str(plugin_cache),
                       "--pulumi", str(platform.toolchain.dir("pulumi") / "bin" / "pulumi")],
             "requested_ports": {}, "env": {},
             "kubeconfig": platform.token_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, 600)}
    provider = OperatorProcessProvider()
    outs = provider.create(props).outs
    try:
        kept = json.loads((state / "platform.json").read_text())["ports"]
        assert (outs["metrics_port"], outs["health_port"]) == (kept["operator_metrics"], kept["operator_health"])
        assert http_ok(outs["health_url"])
        with urllib.request.urlopen(f"http://127.0.0.1:{outs['metrics_port']}/metrics", timeout=5) as response:
            assert b"stacks_active" in response.read()
        status = subprocess.run([sys.executable, "-m", "strata_components.cli", "local", "status", "--state-dir",
                                 str(state)], capture_output=True, text=True, timeout=60)
        shown = json.loads(status.stdout)
        assert shown["strata-operator"] is True
        assert (shown["ports"]["operator_metrics"], shown["ports"]["operator_health"]) == (
            outs["metrics_port"], outs["health_port"])
        again = provider.update("id", outs, {**props, "flags": [*props["flags"], "--verbose"]}).outs
        assert (again["metrics_port"], again["health_port"]) == (outs["metrics_port"], outs["health_port"])
        assert http_ok(again["health_url"])
    finally:
        provider.delete("id", outs)
    assert processes.running_pid(state / "run", "strata-operator") is None


def _catches_sigterm(pid: int) -> bool:
    caught = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & 1 << (signal.SIGTERM - 1))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and util-linux's unshare for a PID namespace of its own")
def test_as_a_containers_pid_1_a_sigterm_while_it_starts_stops_it_at_once(operator, platform, tmp_path):
    """As a pod's PID 1, which the kernel spares any signal it has no handler for: a pod deleted while the
    operator imports and starts must not wait out its grace period (a clean-clone run waited 180 s)."""
    argv, env, _ports = _argv(platform, tmp_path)
    container = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv], env={**os.environ, **env},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        children = Path(f"/proc/{container.pid}/task/{container.pid}/children")
        pid_1 = processes.wait_until(lambda: children.read_text().split(), 10, "the namespace's first process")[0]
        # At once when its first handler is in place: into the imports, seconds before Kopf's own handlers
        # (a fixed sleep landed after them on a warm machine, where Kopf's clean stop exits 0).
        processes.wait_until(lambda: _catches_sigterm(int(pid_1)), 10, "the operator's first SIGTERM handler",
                             interval=0.005)
        os.kill(int(pid_1), signal.SIGTERM)
        started = time.monotonic()
        try:
            code = container.wait(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM to the operator as PID 1 while it started: still running {EXIT_WITHIN:.0f} s later")
        took = time.monotonic() - started
    finally:
        container.kill()
        container.wait()
    assert took < 10, took
    assert code != 0 and "Traceback" not in container.stderr.read(), code
