"""Supervised host processes: start detached with a log and a pid file, check, stop with nothing left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


class ProcessError(Exception):
    """A host process could not be started or did not come up; the message names it and its log."""


@dataclasses.dataclass(frozen=True)
class HostProcess:
    """One long-running process of the local platform."""

    name: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: Path | None = None


# All a host process inherits besides its own `env`: the platform is often started from a `pulumi up`
# whose environment holds passphrases and cloud credentials, and no controller needs them.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "PYTHONPATH", "VIRTUAL_ENV")


def _pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.json"


def _alive(pid: int, argv0: str) -> bool:
    """The pid is running and still the program we started (pids get reused).

    Compared by /proc/PID/exe: a freshly exec'd binary can show an empty cmdline while the kernel
    is still loading it. A binary replaced since (a toolchain rebuild) shows as "PATH (deleted)": the
    process is still ours to stop.
    """
    try:
        executable = os.readlink(f"/proc/{pid}/exe")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and executable.removesuffix(" (deleted)") == os.path.realpath(argv0)


def running_pid(run_dir: Path, name: str) -> int | None:
    try:
        record = json.loads(_pid_file(run_dir, name).read_text())
    except (OSError, ValueError):
        return None
    return record["pid"] if _alive(record["pid"], record["argv0"]) else None


def start(process: HostProcess, run_dir: Path, log_dir: Path) -> int:
    """Start `process` unless it already runs; returns its pid."""
    pid = running_pid(run_dir, process.name)
    if pid is not None:
        return pid
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{process.name}.log", "ab")
    env = {**{k: v for k, v in os.environ.items() if k in BASE_ENV}, **process.env}
    try:
        child = subprocess.Popen(process.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, cwd=process.cwd, start_new_session=True)
    except OSError as error:
        raise ProcessError(f"cannot start {process.name} ({process.argv[0]}): {error.strerror}") from None
    finally:
        log.close()
    _pid_file(run_dir, process.name).write_text(json.dumps({"pid": child.pid, "argv0": process.argv[0]}))
    return child.pid


STOP_GRACE_SECONDS = 10.0


def stop(run_dir: Path, name: str, grace: float = STOP_GRACE_SECONDS) -> bool:
    """Stop the process group of `name`: SIGTERM, then SIGKILL after `grace`. True if it was running."""
    pid = running_pid(run_dir, name)
    _pid_file(run_dir, name).unlink(missing_ok=True)
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            break
        _reap(pid)
        time.sleep(0.05)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(pid)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # A group whose only members are zombies is gone for our purposes.
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (workers that start their own sessions included: process groups miss them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap(pid: int) -> None:
    """Collect the exit status when we are the parent (tests start the platform in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports the kernel says are free now."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind((host, 0))
            sockets.append(probe)
            ports.append(probe.getsockname()[1])
    finally:
        for probe in sockets:
            probe.close()
    return ports


def wait_until(check, timeout: float, what: str, log: Path | None = None, interval: float = 0.2):
    """Poll `check` until it returns a truthy value; ProcessError naming `what` and its log on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            where = f"; see {log}" if log else ""
            raise ProcessError(f"{what} not ready after {timeout:.0f}s{where}")
        time.sleep(interval)
