"""`strata get stacks`, `strata reconcile stack` and `strata logs stack` as a user types them, against the
real operator on the local platform: the table and its JSON, a reconcile that succeeds and one that
fails (exit 1, with the Stack's message), the last update's engine output with a secret masked, and
the kubeconfig read like kubectl's (KUBECONFIG, --kubeconfig, --context)."""

import json
import os
import subprocess
import sys

from .conftest import stash_program

MISSING_CONFIG = {"configuration": {"region": {"type": "String"}},
                  "resources": {"r": {"type": "pulumi:index:Stash", "properties": {"input": "${region}"}}}}


def strata(*args: str, kubeconfig=None, env=None, timeout: float = 180) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    if kubeconfig is not None:
        environment["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([sys.executable, "-m", "strata_components.cli", *args], env=environment, text=True,
                          capture_output=True, timeout=timeout, check=False)


def failed(stack) -> bool:
    return ((stack.get("status") or {}).get("lastUpdate") or {}).get("state") == "failed"


def test_get_reconcile_and_logs_of_stacks(stacks, operator, local_platform, tmp_path):
    kubeconfig, ns = local_platform.kubeconfig_path, stacks.namespace
    stacks.program("hello", stash_program(greeting="hi"))
    stacks.program("needs-region", MISSING_CONFIG)
    stacks.create("good", stacks.spec(stack="good", programRef={"name": "hello"}))
    stacks.create("broken", stacks.spec(stack="broken", programRef={"name": "needs-region"}))
    stacks.wait_ready("good", 90)
    stacks.wait("broken", failed, 90, "its update failed")

    listed = strata("get", "stacks", "-n", ns, kubeconfig=kubeconfig)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split()[:5] == ["NAME", "READY", "REASON", "LAST", "UPDATE"]
    by_name = {line.split()[0]: line for line in lines}
    assert set(by_name) == {"good", "broken"}
    assert by_name["good"].split()[1:3] == ["True", "ProcessingCompleted"] and "up succeeded" in by_name["good"]
    assert by_name["broken"].split()[1] == "False" and "region" in by_name["broken"]

    rows = json.loads(strata("get", "stacks", "-o", "json", "--kubeconfig", str(kubeconfig), "-n", ns).stdout)
    assert [(r["name"], r["ready"]) for r in rows] == [("broken", "False"), ("good", "True")]
    everywhere = strata("get", "-A", "stacks", kubeconfig=kubeconfig)
    assert everywhere.stdout.splitlines()[0].startswith("NAMESPACE") and f"{ns} " in everywhere.stdout

    before = stacks.runs("good")
    done = strata("reconcile", "stack", "good", "-n", ns, "-o", "json", "--timeout", "90s", kubeconfig=kubeconfig)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["succeeded"] and result["ready"] == "True"
    assert stacks.get("good")["status"]["lastUpdate"]["reconcileRequest"] == result["request"]
    assert stacks.runs("good") == before + 1, "the request ran the engine once more"
    assert "► annotating Stack" in done.stderr and "✔" in done.stderr

    refused = strata("reconcile", "stack", "broken", "-n", ns, "--timeout", "90", kubeconfig=kubeconfig)
    assert refused.returncode == 1 and "✗" in refused.stderr and "region" in refused.stderr, refused.stderr

    logs = strata("logs", "stack", "good", "-n", ns, "--operator-state-dir", str(operator.state_dir),
                  kubeconfig=kubeconfig)
    assert logs.returncode == 0, logs.stderr
    assert "Resources:" in logs.stdout and "up of good succeeded" in logs.stderr
    found = strata("logs", "stack", "good", "-n", ns, kubeconfig=kubeconfig,
                   env={"STRATA_OPERATOR_STATE": str(operator.state_dir)})
    assert found.returncode == 0 and found.stdout == logs.stdout, found.stderr
    broken_log = json.loads(strata("logs", "stack", "broken", "-n", ns, "-o", "json", "--operator-state-dir",
                                   str(operator.state_dir), kubeconfig=kubeconfig).stdout)
    assert broken_log["outcome"] == "failed" and "region" in broken_log["output"]

    # What kubectl does: --kubeconfig wins over KUBECONFIG, --context must exist, errors exit 1 in one line.
    wrong = strata("get", "stacks", "-n", ns, "--kubeconfig", str(kubeconfig), kubeconfig=tmp_path / "none")
    assert wrong.returncode == 0, wrong.stderr
    no_context = strata("get", "stacks", "--context", "nope", kubeconfig=kubeconfig)
    assert no_context.returncode == 1 and "--context nope" in no_context.stderr
    missing = strata("logs", "stack", "absent", "-n", ns, kubeconfig=kubeconfig)
    assert missing.returncode == 1 and f"Stack {ns}/absent not found" in missing.stderr


def test_logs_mask_a_secret_the_engine_output_would_show(stacks, operator, local_platform, tmp_path):
    """A backend URL from a Secret, in a directory that cannot be created: the failure names the
    directory, and the log shows it masked."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    hidden_dir = blocker / "secret-path-canary-8e2f"
    stacks.secret("backend", {"url": hidden_dir.as_uri()})
    stacks.program("plain", stash_program(n="1"))
    spec = stacks.spec(stack="hidden", programRef={"name": "plain"},
                       envRefs={**stacks.spec()["envRefs"],
                                "PULUMI_BACKEND_URL": {"type": "Secret", "secret": {"name": "backend", "key": "url"}}})
    del spec["backend"]
    stacks.create("hidden", spec)
    stacks.wait_stalled("hidden", "UpdateFailed", 90)

    logs = strata("logs", "stack", "hidden", "-n", stacks.namespace, "--operator-state-dir", str(operator.state_dir),
                  kubeconfig=local_platform.kubeconfig_path)
    assert logs.returncode == 0, logs.stderr
    assert "cannot create the file:// backend's directory [secret]" in logs.stdout
    assert "canary-8e2f" not in logs.stdout + logs.stderr
