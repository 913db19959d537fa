"""Program CRs run by Stacks through the real operator, Kopf, apiserver and pulumi CLI + YAML host."""

import subprocess

from .conftest import PASSPHRASE, eventually_constant, stash_program


def test_program_stack_becomes_ready_with_outputs_and_masked_secrets(stacks, toolchain, local_platform, operator):
    program = stash_program(greeting="hello")
    program["configuration"] = {"token": {"type": "String"}}
    program["resources"]["hidden"] = {"type": "pulumi:index:Stash", "properties": {"input": "${token}"}}
    program["outputs"]["hidden"] = "${hidden.input}"
    stacks.program("hello", program)
    stacks.secret("app", {"token": "program-secret-9e1f"})
    stacks.create("hello", stacks.spec(programRef={"name": "hello"}, secretsRef={
        "token": {"type": "Secret", "secret": {"name": "app", "key": "token"}}}))

    kubectl = toolchain.bin("kubectl")
    waited = subprocess.run([str(kubectl), "--kubeconfig", str(local_platform.kubeconfig_path), "-n",
                             stacks.namespace, "wait", "--for=condition=Ready", "stack/hello", "--timeout=90s"],
                            capture_output=True, text=True, timeout=120)
    assert waited.returncode == 0, waited.stderr
    assert "condition met" in waited.stdout

    obj = stacks.get("hello")
    status = obj["status"]
    assert status["outputs"] == {"greeting": "hello", "hidden": "[secret]"}
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    last = status["lastUpdate"]
    assert last["state"] == "succeeded" and last["type"] == "up"
    assert last["lastSuccessfulCommit"] == "hello/1"  # the Program's name/generation
    assert status["projectInfo"] == {"name": "hello", "runtime": "yaml"}  # PKO v2: from the run's Pulumi.yaml
    assert not status.get("currentUpdate")
    assert [c["type"] for c in status["conditions"]] == ["Ready"]
    assert "finalizer.stack.pulumi.com" in obj["metadata"]["finalizers"]
    stacks.wait_events("hello", "StackCreated")  # posted in the background, after the status
    assert {e.reason for e in stacks.events("hello")} >= {"StackUpdateDetected", "StackCreated"}
    assert PASSPHRASE not in str(obj) and "program-secret-9e1f" not in str(obj)

    metrics = operator.metrics()
    assert 'stack_update_duration_seconds_count{operation="up",outcome="succeeded"}' in metrics
    assert "stacks_active " in metrics

    # Nothing changed: no further engine run, no status write.
    assert eventually_constant(lambda: (stacks.runs("hello"), stacks.get("hello")["status"]["lastUpdate"]["name"],
                                        stacks.get("hello")["metadata"]["resourceVersion"]), 8)[0] == 1


def test_program_change_reruns_and_updates_outputs(stacks):
    stacks.program("greeter", stash_program(greeting="hello"))
    stacks.create("greeter", stacks.spec(programRef={"name": "greeter"}))
    first = stacks.wait_ready("greeter", 90)["status"]["lastUpdate"]
    assert first["lastSuccessfulCommit"] == "greeter/1"

    stacks.replace_program("greeter", stash_program(greeting="bonjour"))
    after = stacks.wait(
        "greeter", lambda o: o["status"].get("lastUpdate", {}).get("lastSuccessfulCommit") == "greeter/2", 90,
        "re-run for Program generation 2")
    assert after["status"]["outputs"] == {"greeting": "bonjour"}
    assert stacks.runs("greeter") == 2
    program = stacks.custom.get_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "programs", "greeter")
    assert program["status"]["observedGeneration"] == 2 and program["status"]["artifact"]["revision"] == "2"


def test_reconciliation_request_annotation_forces_a_run(stacks):
    stacks.program("forced", stash_program(n=1))
    stacks.create("forced", stacks.spec(programRef={"name": "forced"}))
    stacks.wait_ready("forced", 90)
    stacks.patch("forced", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "now-1"}}})
    obj = stacks.wait("forced", lambda o: o["status"].get("lastUpdate", {}).get("reconcileRequest") == "now-1", 90,
                      "run for reconciliation-request now-1")
    assert obj["status"]["observedReconcileRequest"] == "now-1"
    assert stacks.runs("forced") == 2
