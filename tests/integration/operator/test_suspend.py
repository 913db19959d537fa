"""spec.suspend on the real operator, driven by `strata suspend|resume stack` as a user types them: nothing
runs while suspended (a Program change and a reconcile request wait), the status and Events say so,
resuming runs what changed meanwhile once, and deleting a suspended Stack still destroys."""

import json
from pathlib import Path

from strata_components.local import processes

from .conftest import condition, eventually_constant, stash_program
from .test_stack_cli import strata


def test_suspend_holds_every_run_and_resume_runs_what_changed(stacks, local_platform):
    kubeconfig, ns = local_platform.kubeconfig_path, stacks.namespace
    stacks.program("greeting", stash_program(greeting="hello"))
    stacks.create("paused", stacks.spec(stack="paused", programRef={"name": "greeting"}, destroyOnFinalize=True))
    stacks.wait_ready("paused", 90)

    suspended = strata("suspend", "stack", "paused", "-n", ns, kubeconfig=kubeconfig)
    assert suspended.returncode == 0, suspended.stderr
    assert "► suspending Stack" in suspended.stderr and "✔" in suspended.stderr
    paused = stacks.wait(
        "paused", lambda o: (condition(o, "Ready") or {}).get("reason") == "Suspended", 30, "Ready/Suspended")
    ready = condition(paused, "Ready")
    # The last update succeeded, so Ready stays True; neither in progress nor stuck (kstatus: Current).
    assert ready["status"] == "True" and "spec.suspend is false" in ready["message"]
    assert condition(paused, "Reconciling") is None and condition(paused, "Stalled") is None
    assert paused["status"]["observedGeneration"] == paused["metadata"]["generation"]
    assert len(stacks.wait_events("paused", "Suspended")) == 1

    runs = stacks.runs("paused")
    stacks.replace_program("greeting", stash_program(greeting="changed while suspended"))
    stacks.patch("paused", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "while-suspended"}}})
    refused = strata("reconcile", "stack", "paused", "-n", ns, kubeconfig=kubeconfig)
    assert refused.returncode == 1 and "is suspended" in refused.stderr and "strata resume stack" in refused.stderr
    eventually_constant(lambda: stacks.runs("paused"), 8)
    assert stacks.runs("paused") == runs, "nothing ran while suspended"
    assert stacks.get("paused")["status"]["outputs"]["greeting"] == "hello"

    resumed = strata("resume", "stack", "paused", "-n", ns, "-o", "json", "--timeout", "90s", kubeconfig=kubeconfig)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["succeeded"]
    after = stacks.get("paused")
    assert after["status"]["outputs"]["greeting"] == "changed while suspended"
    assert condition(after, "Ready")["reason"] == "ProcessingCompleted"
    assert stacks.runs("paused") == runs + 1, "resuming ran once for everything that changed"
    assert len(stacks.wait_events("paused", "Resumed")) == 1

    # Suspended again, then deleted: destroyOnFinalize still destroys.
    assert strata("suspend", "stack", "paused", "-n", ns, kubeconfig=kubeconfig).returncode == 0
    stacks.wait("paused", lambda o: (condition(o, "Ready") or {}).get("reason") == "Suspended", 30, "suspended")
    checkpoint = Path(stacks.backend.removeprefix("file://")) / ".pulumi" / "stacks" / "greeting" / "paused.json"
    assert checkpoint.exists()
    stacks.delete("paused")
    processes.wait_until(lambda: stacks.get("paused") is None, 90, "suspended Stack destroyed and released")
    assert not checkpoint.exists(), "destroy then `stack rm` ran for the suspended Stack"


def test_a_stack_created_suspended_runs_nothing_until_resumed(stacks, local_platform):
    stacks.program("later", stash_program(value="v1"))
    stacks.create("dormant", stacks.spec(stack="dormant", programRef={"name": "later"}, suspend=True))
    dormant = stacks.wait(
        "dormant", lambda o: (condition(o, "Ready") or {}).get("reason") == "Suspended", 30, "Ready/Suspended")
    assert condition(dormant, "Ready")["status"] == "False"
    assert "before its first update" in condition(dormant, "Ready")["message"]
    eventually_constant(lambda: stacks.runs("dormant"), 5)
    assert stacks.runs("dormant") == 0

    stacks.patch("dormant", {"spec": {"suspend": False}})
    assert stacks.wait_ready("dormant", 90)["status"]["outputs"]["value"] == "v1"
