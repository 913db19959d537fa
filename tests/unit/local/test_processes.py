import json
import os
import socket
import sys
import time

import pytest

from strata_components.local import processes
from strata_components.local.processes import HostProcess, ProcessError


def test_start_is_idempotent_and_stop_leaves_no_process(tmp_path):
    # The child spawns a grandchild: stop must take the whole process group.
    script = "import subprocess,time; subprocess.Popen(['sleep','300']); print('up', flush=True); time.sleep(300)"
    process = HostProcess("sleeper", [sys.executable, "-c", script])
    pid = processes.start(process, tmp_path / "run", tmp_path / "logs")
    assert processes.start(process, tmp_path / "run", tmp_path / "logs") == pid
    processes.wait_until(lambda: "up" in (tmp_path / "logs" / "sleeper.log").read_text(), 10, "sleeper")
    assert processes.running_pid(tmp_path / "run", "sleeper") == pid
    assert processes.stop(tmp_path / "run", "sleeper") is True
    assert processes.running_pid(tmp_path / "run", "sleeper") is None
    assert not processes._group_alive(pid)
    assert processes.stop(tmp_path / "run", "sleeper") is False


def test_a_reused_pid_is_not_mistaken_for_our_process(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # Our own pid is alive but runs another program than the one recorded.
    (run / "ghost.json").write_text('{"pid": %d, "argv0": "/no/such/binary"}' % __import__("os").getpid())
    assert processes.running_pid(run, "ghost") is None


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ProcessError, match="cannot start ghost"):
        processes.start(HostProcess("ghost", [str(tmp_path / "nope")]), tmp_path / "run", tmp_path / "logs")


def test_busy_port_is_detected():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not processes.port_is_free(busy.getsockname()[1])
    ports = processes.free_ports(3)
    assert len(set(ports)) == 3 and all(processes.port_is_free(p) for p in ports)


def test_wait_until_names_what_timed_out_and_its_log(tmp_path):
    started = time.monotonic()
    with pytest.raises(ProcessError, match=r"etcd not ready after 0s; see .*etcd.log"):
        processes.wait_until(lambda: False, 0.3, "etcd", log=tmp_path / "etcd.log", interval=0.05)
    assert time.monotonic() - started < 5


def test_a_clean_environment_keeps_the_callers_secrets_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "caller-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-cloud-key")
    dump = "import os, json; print(json.dumps(dict(os.environ)), flush=True)"
    processes.start(HostProcess("clean", [sys.executable, "-c", dump], env={"KUBECONFIG": "/k"}),
                    tmp_path / "run", tmp_path / "logs")
    log = tmp_path / "logs" / "clean.log"
    processes.wait_until(lambda: log.read_text(), 10, "dump")
    clean = json.loads(log.read_text())
    assert clean["KUBECONFIG"] == "/k" and "PATH" in clean
    assert "PULUMI_CONFIG_PASSPHRASE" not in clean and "AWS_SECRET_ACCESS_KEY" not in clean


def test_descendants_include_grandchildren_in_other_sessions(tmp_path):
    script = ("import subprocess,time; subprocess.Popen(['sleep','300'], start_new_session=True); "
              "print('up', flush=True); time.sleep(300)")
    pid = processes.start(HostProcess("tree", [sys.executable, "-c", script]), tmp_path / "run", tmp_path / "logs")
    try:
        processes.wait_until(lambda: len(processes.descendants(pid)) == 1, 10, "grandchild")
        grandchild = processes.descendants(pid)[0]
        assert open(f"/proc/{grandchild}/cmdline").read().startswith("sleep")
    finally:
        for child in processes.descendants(pid):
            os.kill(child, 9)
        processes.stop(tmp_path / "run", "tree")


def test_a_process_whose_binary_was_replaced_since_is_still_stopped(tmp_path):
    """A toolchain rebuild replaces binaries under running processes: `down` must still stop them."""
    binary = tmp_path / "bin" / "sleep"
    binary.parent.mkdir()
    binary.write_bytes(open("/bin/sleep", "rb").read())
    binary.chmod(0o755)
    pid = processes.start(HostProcess("rebuilt", [str(binary), "300"]), tmp_path / "run", tmp_path / "logs")
    processes.wait_until(lambda: os.readlink(f"/proc/{pid}/exe") == str(binary), 10, "sleep started")
    replacement = binary.with_name("sleep.new")
    replacement.write_bytes(binary.read_bytes())
    replacement.chmod(0o755)
    replacement.rename(binary)  # as the toolchain installs a rebuilt entry: the old file is gone
    assert os.readlink(f"/proc/{pid}/exe").endswith(" (deleted)")
    assert processes.running_pid(tmp_path / "run", "rebuilt") == pid
    assert processes.stop(tmp_path / "run", "rebuilt") is True
    assert not processes._group_alive(pid)
