"""destroyOnFinalize (also with the Program gone), serviceAccountName, kill -9 of the operator mid-update, a stop
that lets the running update finish, and an update that finished while its status write was lost."""

import base64
import json
from pathlib import Path

from strata_components.local import processes

from .conftest import GROUP, VERSION, condition, eventually_constant, has_condition, stash_program


def _backend_stack(stacks, project: str) -> Path:
    return Path(stacks.backend.removeprefix("file://")) / ".pulumi" / "stacks" / project / "dev.json"


def _resources(checkpoint: Path) -> list[str]:
    deployment = json.loads(checkpoint.read_text())["checkpoint"].get("latest") or {}
    return [r["type"] for r in deployment.get("resources") or []]


def _stashes_so_far(checkpoint: Path) -> int:
    """Stash resources in a checkpoint the engine may be rewriting right now (0 while unreadable)."""
    try:
        return _resources(checkpoint).count("pulumi:index:Stash")
    except (OSError, ValueError, KeyError):
        return 0


def _gone(stacks, name: str) -> bool:
    return stacks.get(name) is None


def test_destroy_on_finalize_destroys_and_removes_the_stack(stacks):
    stacks.program("doomed", stash_program(a="1", b="2"))
    stacks.create("doomed", stacks.spec(programRef={"name": "doomed"}, destroyOnFinalize=True))
    stacks.wait_ready("doomed", 90)
    checkpoint = _backend_stack(stacks, "doomed")
    assert _resources(checkpoint).count("pulumi:index:Stash") == 2

    stacks.delete("doomed")
    processes.wait_until(lambda: _gone(stacks, "doomed"), 90, "Stack doomed finalized")
    assert not checkpoint.exists(), "destroy then `stack rm` leaves no stack in the backend"


def test_destroy_on_finalize_after_the_program_is_gone(stacks):
    stacks.program("orphan", stash_program(a="1"))
    stacks.create("orphan", stacks.spec(programRef={"name": "orphan"}, destroyOnFinalize=True))
    stacks.wait_ready("orphan", 90)
    stacks.custom.delete_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "programs", "orphan")

    stacks.delete("orphan")
    processes.wait_until(lambda: _gone(stacks, "orphan"), 90, "Stack orphan finalized from the last program copy")
    assert not _backend_stack(stacks, "orphan").exists()


def test_destroy_on_finalize_of_a_stack_never_created_in_its_backend_releases_it(stacks):
    """Its updates never created the backend stack (here useLocalStackOnly, elsewhere a wrong backend or
    credential): there is nothing to destroy, and deleting the Stack must not wait on a destroy for ever."""
    stacks.program("never", stash_program(a="1"))
    stacks.create("never", stacks.spec(programRef={"name": "never"}, destroyOnFinalize=True, useLocalStackOnly=True))
    stacks.wait("never", lambda o: (o.get("status", {}).get("lastUpdate") or {}).get("reason") == "StackNotFound", 90,
                "its update failed: no such stack")
    stacks.delete("never")
    processes.wait_until(lambda: _gone(stacks, "never"), 60, "Stack never released")
    assert not _backend_stack(stacks, "never").exists()


def test_no_destroy_without_the_flag_and_a_clear_stall_when_nothing_can_destroy(stacks):
    stacks.program("kept", stash_program(a="1"))
    stacks.create("kept", stacks.spec(programRef={"name": "kept"}))
    stacks.wait_ready("kept", 90)
    stacks.delete("kept")
    processes.wait_until(lambda: _gone(stacks, "kept"), 60, "Stack kept released")
    assert "pulumi:index:Stash" in _resources(_backend_stack(stacks, "kept"))

    # Never succeeded and its Program never existed: destroy is impossible, and the object says why.
    stacks.create("stuck", stacks.spec(stack="stuck", programRef={"name": "never"}, destroyOnFinalize=True))
    stacks.wait_stalled("stuck", "SourceUnavailable", 60)
    stacks.delete("stuck")
    stuck = stacks.wait_stalled("stuck", "DestroyBlocked", 60)
    message = condition(stuck, "Stalled")["message"]
    assert "never" in message and "finalizer.stack.pulumi.com" in message
    stacks.patch("stuck", {"metadata": {"finalizers": None}})
    processes.wait_until(lambda: _gone(stacks, "stuck"), 30, "Stack stuck released by hand")


def _claims(segment: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def test_service_account_name_hands_the_update_a_token_of_that_account(stacks):
    stacks.core.create_namespaced_service_account(stacks.namespace, {"metadata": {"name": "deployer"}})
    # The update's KUBECONFIG is `../kubeconfig` beside the project; the program exports the token's claims.
    token = {"fn::select": [1, {"fn::split": ["token: ", {"fn::readFile": "../kubeconfig"}]}]}
    stacks.program("whoami", {"outputs": {"claims": {"fn::select": [1, {"fn::split": [".", token]}]}}})
    stacks.create("whoami", stacks.spec(programRef={"name": "whoami"}, serviceAccountName="deployer"))
    claims = _claims(stacks.wait_ready("whoami", 90)["status"]["outputs"]["claims"])
    assert claims["sub"] == f"system:serviceaccount:{stacks.namespace}:deployer"
    assert claims["exp"] - claims["iat"] <= 3600  # short-lived TokenRequest token

    stacks.create("nobody", stacks.spec(stack="nobody", programRef={"name": "whoami"}, serviceAccountName="ghost"))
    waiting = stacks.wait("nobody", lambda o: has_condition(o, "Reconciling", "RetryingAfterFailure"), 60,
                          "waiting for the ServiceAccount")
    assert "spec.serviceAccountName" in condition(waiting, "Reconciling")["message"]
    assert not waiting["status"].get("currentUpdate") and stacks.runs("nobody") == 0


def test_kill_9_mid_update_then_restart_converges(stacks, operator):
    stacks.program("big", {"resources": {f"s{i}": {"type": "pulumi:index:Stash", "properties": {"input": i}}
                                         for i in range(300)}, "outputs": {"last": "${s299.input}"}})
    stacks.create("big", stacks.spec(programRef={"name": "big"}))
    checkpoint = _backend_stack(stacks, "big")
    processes.wait_until(lambda: _stashes_so_far(checkpoint) >= 20, 60, "the update to be part-way", interval=0.1)
    operator.kill()
    assert _stashes_so_far(checkpoint) < 300, "the update finished before the kill"
    assert stacks.locks(), "the killed update left its lock behind"
    assert stacks.get("big")["status"]["currentUpdate"]

    operator.start()
    obj = stacks.wait_ready("big", 180)
    assert obj["status"]["outputs"] == {"last": 299}
    assert _stashes_so_far(checkpoint) == 300
    assert not stacks.locks()
    assert not obj["status"].get("currentUpdate")
    processes.wait_until(lambda: [e for e in stacks.events("big", "StackUpdateFailure") if "interrupted" in e.message],
                         15, "the interrupted update reported")
    assert stacks.runs("big") == 2


def _updates_in_history(stacks, project: str) -> list[dict]:
    """The backend's own record of the stack's updates (one file per engine run), oldest first."""
    history = Path(stacks.backend.removeprefix("file://")) / ".pulumi" / "history" / project / "dev"
    entries = [json.loads(path.read_text()) for path in sorted(history.glob("*.history.json"))]
    return [entry for entry in entries if entry.get("kind") == "update"]


def test_an_update_that_finished_while_its_status_write_was_lost_is_recorded_not_run_again(stacks, operator):
    """What an API-server outage leaves (the update succeeded, its status write failed, the operator lost
    its Lease): currentUpdate still names the run. The next operator finds that run's update in the
    backend's history and records it, with the Flux request it answered: one engine run, not two."""
    stacks.program("lost", {"resources": {f"s{i}": {"type": "pulumi:index:Stash", "properties": {"input": i}}
                                          for i in range(60)}, "outputs": {"last": "${s59.input}"}})
    flux_request = {"reconcile.fluxcd.io/requestedAt": "2026-11-26T23:00:00Z"}
    stacks.create("lost", stacks.spec(programRef={"name": "lost"}), annotations=flux_request)
    running = processes.wait_until(lambda: (stacks.get("lost") or {}).get("status", {}).get("currentUpdate"), 60,
                                   "the update to start", interval=0.05)
    ready = stacks.wait_ready("lost", 120)
    assert len(_updates_in_history(stacks, "lost")) == 1
    assert ready["status"]["lastHandledReconcileAt"] == running["fluxRequestedAt"] == "2026-11-26T23:00:00Z"
    operator.kill()
    stacks.custom.patch_namespaced_custom_object_status(GROUP, VERSION, stacks.namespace, "stacks", "lost", {
        "status": {"currentUpdate": running, "lastUpdate": None, "outputs": None, "lastHandledReconcileAt": None}})

    operator.start()
    obj = stacks.wait(
        "lost", lambda o: has_condition(o, "Ready") and (o["status"].get("lastUpdate") or {}).get("state") == "succeeded",
        120, "Ready with the lost run recorded")
    assert obj["status"]["lastUpdate"]["name"] == running["name"] == ready["status"]["lastUpdate"]["name"]
    assert obj["status"]["outputs"] == {"last": 59} and not obj["status"].get("currentUpdate")
    assert obj["status"]["lastHandledReconcileAt"] == "2026-11-26T23:00:00Z"
    eventually_constant(lambda: stacks.runs("lost"), 5)
    assert len(_updates_in_history(stacks, "lost")) == 1, "the finished update ran a second time"
    assert stacks.runs("lost") == 1
    assert not [e for e in stacks.events("lost", "StackUpdateFailure") if "interrupted" in e.message]


def test_a_stopping_operator_lets_the_running_update_finish_and_its_successor_runs_nothing(stacks, operator):
    """An upgrade or restart stops the operator with SIGTERM mid-update: the update finishes and is recorded
    before the process exits, and the next operator has nothing to run (one engine run, as in the backend)."""
    stacks.program("drained", {"resources": {f"s{i}": {"type": "pulumi:index:Stash", "properties": {"input": i}}
                                             for i in range(300)}, "outputs": {"last": "${s299.input}"}})
    stacks.create("drained", stacks.spec(programRef={"name": "drained"}))
    checkpoint = _backend_stack(stacks, "drained")
    processes.wait_until(lambda: _stashes_so_far(checkpoint) >= 20, 60, "the update to be part-way", interval=0.1)
    processes.stop(operator.platform.run_dir, operator.process.name, grace=240)
    assert _stashes_so_far(checkpoint) == 300, "the update was cut short by the stop"
    stopped = stacks.get("drained")["status"]
    assert stopped["lastUpdate"]["state"] == "succeeded" and not stopped.get("currentUpdate")

    operator.start()
    stacks.wait_ready("drained", 60)
    eventually_constant(lambda: stacks.runs("drained"), 5)
    assert stacks.runs("drained") == 1 and len(_updates_in_history(stacks, "drained")) == 1
    assert not stacks.locks()
