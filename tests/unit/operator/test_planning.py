"""Planning: spec + observed state -> run, or the verdict and when to look again."""

from datetime import datetime, timedelta, timezone

import pytest

from strata_operator.decisions.backoff import cooldown_seconds
from strata_operator.decisions.outputs import combine_digests
from strata_operator.decisions.planning import (Requests, check_prerequisite, consumed_digest, drift_check_due,
                                                drift_status, ever_deployed, missing_service_account,
                                                new_revision_verdict, plan_finalize, plan_on_prerequisite_outputs,
                                                plan_stack, prerequisite_digests, prerequisites_verdict,
                                                ready_for_another_revision, suspended_verdict,
                                                terminating_namespace_message)
from strata_operator.api.stack import Prerequisite, Requirement, parse_stack_spec
from strata_operator.api.status import RunRecord, failed_update, rfc3339, succeeded_update
from strata_operator.api.validation import SpecIssue

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
SHA = "a" * 40


def spec(**extra):
    return parse_stack_spec({"stack": "dev", "projectRepo": "https://h/r.git", "commit": SHA, **extra}, "ns")


def run(gen=1, request="", commit=SHA, at=NOW - timedelta(hours=1)):
    return RunRecord("s-1", "up", gen, request, commit, at, "host")


def ok(gen=1, request="", commit=SHA, at=NOW - timedelta(hours=1)):
    return succeeded_update(run(gen, request, commit), "", at)


def failed(n, gen=1, commit=SHA, at=NOW, reason="UpdateFailed"):
    last = None
    for _ in range(n):
        last = failed_update(last, run(gen, commit=commit), reason, "boom", "", at)
    return last


def test_first_sight_runs():
    assert plan_stack(spec(), 1, Requests(), None, SHA, NOW).run == "up"


def test_nothing_changed_is_ready_with_no_requeue_for_a_commit():
    plan = plan_stack(spec(), 1, Requests(), ok(), SHA, NOW)
    assert plan.run is None and plan.verdict.phase == "ready" and plan.requeue_after is None


def test_branch_is_polled_every_resync_period():
    s = parse_stack_spec({"stack": "dev", "projectRepo": "https://h/r.git", "branch": "main",
                          "resyncFrequencySeconds": 120}, "ns")
    plan = plan_stack(s, 1, Requests(), ok(), SHA, NOW)
    assert plan.run is None and plan.requeue_after == 120


@pytest.mark.parametrize("generation,requests,revision,message", [
    (2, Requests(), SHA, "New stack generation: 2"),
    (1, Requests(pulumi="now"), SHA, "Sync request: 'now'"),
    (1, Requests(flux="2025-01-01T11:00:00Z"), SHA, "Reconcile requested at 2025-01-01T11:00:00Z"),
    (1, Requests(), "b" * 40, "New commit detected"),
])
def test_each_trigger_runs(generation, requests, revision, message):
    plan = plan_stack(spec(), generation, requests, ok(), revision, NOW)
    assert plan.run == "up" and plan.message.startswith(message)


def test_handled_flux_request_does_not_run_again():
    r = Requests(flux="t1", flux_handled="t1")
    assert plan_stack(spec(), 1, r, ok(), SHA, NOW).run is None


def test_the_run_that_answered_a_flux_request_leaves_nothing_to_do():
    before = Requests(flux="t1", flux_handled="t0")  # as read when the run was planned
    assert plan_stack(spec(), 1, before, ok(), SHA, NOW).run == "up"
    after = before.answered()
    assert after == Requests(flux="t1", flux_handled="t1")
    plan = plan_stack(spec(), 1, after, ok(), SHA, NOW)
    assert plan.run is None and plan.verdict.phase == "ready"


def test_preview_stack_plans_preview():
    s = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "preview": True}, "ns")
    assert plan_stack(s, 1, Requests(), None, "p/1", NOW).run == "preview"


def test_continue_resync_reruns_after_period_only():
    s = spec(continueResyncOnCommitMatch=True, resyncFrequencySeconds=300)
    assert plan_stack(s, 1, Requests(), ok(at=NOW - timedelta(seconds=100)), SHA, NOW).requeue_after == 200
    assert plan_stack(s, 1, Requests(), ok(at=NOW - timedelta(seconds=300)), SHA, NOW).run == "up"


def test_failure_waits_for_cooldown_then_retries():
    last = failed(1, at=NOW - timedelta(seconds=4))
    plan = plan_stack(spec(), 1, Requests(), last, SHA, NOW)
    assert plan.run is None and plan.verdict.reason == "RetryingAfterFailure"
    assert plan.requeue_after == pytest.approx(6)
    assert plan_stack(spec(), 1, Requests(), failed(1, at=NOW - timedelta(seconds=10)), SHA, NOW).run == "up"


def test_new_commit_bypasses_cooldown():
    plan = plan_stack(spec(), 1, Requests(), failed(3), "c" * 40, NOW)
    assert plan.run == "up"


def test_spec_change_bypasses_stall():
    assert plan_stack(spec(), 2, Requests(), failed(9), SHA, NOW).run == "up"


def test_stalls_after_n_consecutive_failures():
    plan = plan_stack(spec(), 1, Requests(), failed(5, at=NOW - timedelta(days=2)), SHA, NOW, stall_after_failures=5)
    assert plan.run is None and plan.verdict.phase == "stalled" and plan.verdict.reason == "UpdateFailed"
    assert "5 consecutive" in plan.verdict.message


def test_conflict_stalls_without_retry_flag_and_retries_with_it():
    last = failed(1, at=NOW - timedelta(minutes=5), reason="UpdateConflict")
    assert plan_stack(spec(), 1, Requests(), last, SHA, NOW).verdict.reason == "UpdateConflict"
    assert plan_stack(spec(retryOnUpdateConflict=True), 1, Requests(), last, SHA, NOW).run == "up"
    many = failed(9, at=NOW, reason="UpdateConflict")
    waiting = plan_stack(spec(retryOnUpdateConflict=True), 1, Requests(), many, SHA, NOW, stall_after_failures=3)
    assert waiting.run is None and waiting.verdict.reason == "RetryingAfterFailure" and waiting.requeue_after


def test_an_interrupted_update_resumes_without_backoff():
    last = failed_update(failed(2, at=NOW), run(), "UpdateInterrupted", "operator restart", "", NOW)
    assert plan_stack(spec(), 1, Requests(), last, SHA, NOW, stall_after_failures=3).run == "up"


def test_a_blocked_update_stalls_at_once_until_something_changes():
    last = failed_update(None, run(), "UpdateBlocked", "the resource plugin flux v1.0.1 is missing", "",
                         NOW - timedelta(days=3))
    plan = plan_stack(spec(), 1, Requests(), last, SHA, NOW)
    assert plan.run is None and plan.verdict.phase == "stalled" and plan.verdict.reason == "UpdateFailed"
    assert plan.verdict.message.startswith("the resource plugin flux v1.0.1 is missing. Retrying cannot fix this")
    assert "pulumi.com/reconciliation-request" in plan.verdict.message
    assert plan_stack(spec(), 1, Requests(pulumi="fixed"), last, SHA, NOW).run == "up"
    assert plan_stack(spec(), 2, Requests(), last, SHA, NOW).run == "up"
    assert plan_stack(spec(), 1, Requests(), last, "c" * 40, NOW).run == "up"


NO_CLUSTER = ("configured Kubernetes cluster is unreachable: unable to load Kubernetes client configuration from "
              "kubeconfig file. Make sure you have: set up the provider as per https://www.pulumi.com/registry/")


def test_a_program_with_no_cluster_and_no_service_account_is_told_to_name_one():
    problem = missing_service_account(NO_CLUSTER, "", "team-alpha", in_workspace_pods=False)
    assert "spec.serviceAccountName" in problem and "namespace 'team-alpha'" in problem and "`edit`" in problem
    assert problem.endswith(NO_CLUSTER)
    # With a ServiceAccount (a kubeconfig of its own), in a workspace pod, or another failure: not this.
    assert missing_service_account(NO_CLUSTER, "deployer", "team-alpha", in_workspace_pods=False) is None
    assert missing_service_account(NO_CLUSTER, "", "team-alpha", in_workspace_pods=True) is None
    assert missing_service_account("error: 403 Forbidden", "", "team-alpha", in_workspace_pods=False) is None
    # It stalls at once (retrying cannot give it a cluster) until the spec, the source or a request changes.
    last = failed_update(None, run(), "ServiceAccountRequired", problem, "", NOW - timedelta(days=3))
    plan = plan_stack(spec(), 1, Requests(), last, SHA, NOW)
    assert plan.run is None and (plan.verdict.phase, plan.verdict.reason) == ("stalled", "ServiceAccountRequired")
    assert plan_stack(spec(), 2, Requests(), last, SHA, NOW).run == "up"


def test_a_ready_stack_about_to_run_a_new_revision_says_reconciling_before_anything_slow():
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "ProcessingCompleted"}], "lastUpdate": ok()}
    plan = plan_stack(spec(), 1, Requests(), ok(), "b" * 40, NOW)
    verdict = new_revision_verdict(ready, plan, "b" * 40)
    assert (verdict.phase, verdict.reason) == ("reconciling", "StackProcessing") and "New commit" in verdict.message
    # The revision it ran, nothing to run, or not Ready anyway (kstatus does not call it current): nothing to say.
    assert new_revision_verdict(ready, plan_stack(spec(), 2, Requests(), ok(), SHA, NOW), SHA) is None
    assert new_revision_verdict(ready, plan_stack(spec(), 1, Requests(), ok(), SHA, NOW), SHA) is None
    assert new_revision_verdict({"lastUpdate": ok()}, plan, "b" * 40) is None


def test_a_stack_reads_ready_for_another_revision_until_it_ran_or_announced_the_new_one():
    """What a changed Program waits on before saying it is current (controllers/program.py)."""
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "ProcessingCompleted"}], "lastUpdate": ok()}
    assert ready_for_another_revision(ready, "app/2")
    assert not ready_for_another_revision({**ready, "lastUpdate": {**ok(), "lastAttemptedCommit": "app/2"}}, "app/2")
    announced = {"conditions": [{"type": "Ready", "status": "False", "reason": "NotReadyInProgress"}]}
    assert not ready_for_another_revision(announced, "app/2")
    # A suspended Stack keeps its last Ready and will not run: nothing to wait for.
    suspended = {"conditions": [{"type": "Ready", "status": "True", "reason": "Suspended"}], "lastUpdate": ok()}
    assert not ready_for_another_revision(suspended, "app/2")


def test_a_failed_preview_is_reconciling_preview_failed_until_the_stall():
    previewing = spec(preview=True)
    last = failed_update(None, RunRecord("s-1", "preview", 1, "", SHA, NOW, "host"), "UpdateFailed", "boom", "", NOW)
    plan = plan_stack(previewing, 1, Requests(), last, SHA, NOW)
    assert plan.run is None and (plan.verdict.phase, plan.verdict.reason) == ("reconciling", "PreviewFailed")
    assert plan.verdict.message == "preview failed (1 attempt(s)): boom"
    for _ in range(4):
        last = failed_update(last, RunRecord("s-1", "preview", 1, "", SHA, NOW, "host"), "UpdateFailed", "boom", "",
                             NOW)
    assert plan_stack(previewing, 1, Requests(), last, SHA, NOW).verdict.reason == "UpdateFailed"


def test_a_workspace_that_keeps_failing_stalls_as_workspace_failed():
    retrying = plan_stack(spec(), 1, Requests(), failed(1, reason="WorkspaceFailed"), SHA, NOW)
    assert retrying.verdict.reason == "RetryingAfterFailure"
    stalled = plan_stack(spec(), 1, Requests(), failed(5, reason="WorkspaceFailed"), SHA, NOW)
    assert (stalled.verdict.phase, stalled.verdict.reason) == ("stalled", "WorkspaceFailed")


def test_an_unwatched_flux_kind_is_polled_every_resync_period():
    helm = parse_stack_spec({"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmChart", "name": "c"}}}, "ns")
    plan = plan_stack(helm, 1, Requests(), ok(commit="sha256:1"), "sha256:1", NOW)
    assert plan.verdict.phase == "ready" and plan.requeue_after == 60.0
    watched = parse_stack_spec({"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "c"}}}, "ns")
    assert plan_stack(watched, 1, Requests(), ok(commit="sha256:1"), "sha256:1", NOW).requeue_after is None


def test_terminating_namespace_message_says_what_is_left_and_how_to_release():
    message = terminating_namespace_message("team", "app", "spec.envRefs.X: Secret 's' not found", "")
    assert "namespace 'team' is terminating" in message and "spec.envRefs.X" in message
    assert "must be cleaned up manually" in message
    assert """kubectl patch stack app -n team --type=merge -p '{"metadata":{"finalizers":[]}}'""" in message


def test_failures_count_only_same_target():
    assert failed(3)["failures"] == 3
    again = failed_update(failed(3), run(gen=2), "UpdateFailed", "x", "", NOW)
    assert again["failures"] == 1 and again["lastSuccessfulCommit"] == ""


@pytest.mark.parametrize("failures,cap,expected", [
    (0, 0, 0), (1, 0, 10), (2, 0, 30), (3, 0, 90), (5, 0, 810), (20, 0, 86400), (10_000, 0, 86400), (4, 60, 60)])
def test_cooldown_schedule(failures, cap, expected):
    assert cooldown_seconds(failures, cap) == expected


def stack_obj(gen=1, annotations=None, last=None):
    return {"metadata": {"name": "base", "generation": gen, "annotations": annotations or {}},
            "status": {"lastUpdate": last} if last else {}}


def test_prerequisites():
    req = Prerequisite(name="base")
    within = Prerequisite(name="base", requirement=Requirement(succeeded_within_duration="30m"))
    assert check_prerequisite(req, None, NOW).problem == "prerequisite 'base' not found"
    assert "not run to completion" in check_prerequisite(req, stack_obj(gen=2, last=ok()), NOW).problem
    assert "not run to completion" in check_prerequisite(
        req, stack_obj(annotations={"pulumi.com/reconciliation-request": "x"}, last=ok()), NOW).problem
    assert "failed" in check_prerequisite(req, stack_obj(last=failed(1)), NOW).problem
    assert check_prerequisite(req, stack_obj(last=ok()), NOW).problem is None
    stale = check_prerequisite(within, stack_obj(last=ok(at=NOW - timedelta(hours=1))), NOW)
    assert "out of date" in stale.problem and stale.rerun_request == "after-s-1"
    assert check_prerequisite(within, stack_obj(last=ok(at=NOW - timedelta(minutes=5))), NOW).problem is None


def test_prerequisite_verdicts():
    a = check_prerequisite(Prerequisite(name="a"), None, NOW)
    b = check_prerequisite(Prerequisite(name="b"), None, NOW)
    assert prerequisites_verdict([]) is None
    assert prerequisites_verdict([a]).reason == "PrerequisiteNotSatisfied"
    assert prerequisites_verdict([a, b]).message.endswith("a, b")


def test_finalize_destroys_only_with_flag():
    assert plan_finalize(spec(), [], {}).destroy is False
    assert plan_finalize(spec(destroyOnFinalize=True), [], {}).destroy is True
    assert plan_finalize(None, [], {}).destroy is False


def test_a_stack_refused_before_its_first_update_has_nothing_to_destroy_one_refused_later_does():
    refused = [SpecIssue("spec.workspaceTemplate.spec.podTemplate.spec.hostPID", "shows the pod every process "
                         "of its node", "remove it")]
    never_ran = plan_finalize(spec(destroyOnFinalize=True), refused, {"observedGeneration": 1})
    assert never_ran.destroy is False and "hostPID" in never_ran.message, never_ran
    ran = {"lastUpdate": {"state": "succeeded", "lastSuccessfulCommit": "abc"}}
    assert plan_finalize(spec(destroyOnFinalize=True), refused, ran).destroy is True
    assert rfc3339(NOW) == "2025-01-01T12:00:00Z"


def test_a_cli_too_old_stalls_at_once_as_pulumi_version_too_low():
    last = failed_update(None, run(), "PulumiVersionTooLow", "the operator's pulumi CLI does not know --run-program",
                         "", NOW - timedelta(days=1))
    plan = plan_stack(spec(), 1, Requests(), last, SHA, NOW)
    assert (plan.run, plan.verdict.phase, plan.verdict.reason) == (None, "stalled", "PulumiVersionTooLow")
    assert plan_stack(spec(), 2, Requests(), last, SHA, NOW).run == "up"


def test_a_suspended_stack_reads_as_its_last_update_left_it():
    never = suspended_verdict(None)
    assert never.phase == "suspended" and not never.last_succeeded and "before its first update" in never.message
    good = suspended_verdict(ok())
    assert good.last_succeeded and f"({SHA}) succeeded at" in good.message
    bad = suspended_verdict(failed(2))
    assert not bad.last_succeeded and "failed" in bad.message and "boom" in bad.message
    for verdict in (never, good, bad):
        assert verdict.reason == "Suspended" and "spec.suspend is false" in verdict.message


def prereq_with_outputs(digests, outputs=None, total=None):
    obj = stack_obj(last=ok())
    obj["status"].update(outputs=outputs if outputs is not None else {k: "v" for k in digests},
                         outputDigests=digests)
    if total:
        obj["status"]["outputsDigest"] = total
    return obj


def test_a_dependent_consumes_all_outputs_or_only_those_it_names():
    base = prereq_with_outputs({"url": "sha256:1", "port": "sha256:2"}, total="sha256:all")
    assert consumed_digest(Prerequisite(name="base"), base) == "sha256:all"
    named = consumed_digest(Prerequisite(name="base", outputs=["url"]), base)
    assert named == combine_digests({"url": "sha256:1"})
    # Another output changing leaves what this dependent consumes as it was.
    other = prereq_with_outputs({"url": "sha256:1", "port": "sha256:CHANGED"}, total="sha256:all2")
    assert consumed_digest(Prerequisite(name="base", outputs=["url"]), other) == named
    assert consumed_digest(Prerequisite(name="base"), other) != "sha256:all"


def test_an_unknown_digest_is_none_never_a_change():
    assert consumed_digest(Prerequisite(name="base"), None) is None
    assert consumed_digest(Prerequisite(name="base"), stack_obj(last=ok())) is None
    # A secret output whose value was not read has no digest: what it consumes is unknown.
    secret_unread = prereq_with_outputs({"url": "sha256:1"}, outputs={"url": "u", "password": "[secret]"})
    assert consumed_digest(Prerequisite(name="base", outputs=["password"]), secret_unread) is None
    assert consumed_digest(Prerequisite(name="base", outputs=["url"]), secret_unread) is not None
    assert prerequisite_digests([Prerequisite(name="base"), Prerequisite(name="gone")],
                                {"base": prereq_with_outputs({}, total="sha256:t"), "gone": None}) == {
        "base": "sha256:t"}


def test_a_prerequisite_rerun_with_the_same_outputs_runs_nothing_and_a_change_runs_once():
    ready = plan_stack(spec(), 1, Requests(), ok(), SHA, NOW)
    assert ready.run is None
    last = dict(ok(), prerequisiteDigests={"base": "sha256:a"})
    unchanged = plan_on_prerequisite_outputs(spec(), ready, last, {"base": "sha256:a"})
    assert unchanged is ready
    changed = plan_on_prerequisite_outputs(spec(), ready, last, {"base": "sha256:b"})
    assert changed.run == "up" and changed.message == "Outputs of prerequisite 'base' changed since the last update"
    assert plan_on_prerequisite_outputs(spec(preview=True), ready, last, {"base": "sha256:b"}).run == "preview"
    # Unknown now (no digest): nothing to compare, nothing runs.
    assert plan_on_prerequisite_outputs(spec(), ready, last, {}) is ready
    # A run that predates the prerequisite's digest may have consumed other values: it runs once.
    assert plan_on_prerequisite_outputs(spec(), ready, ok(), {"base": "sha256:a"}).run == "up"
    # A run already planned keeps its own reason; a Stack never run has its initial update.
    first = plan_stack(spec(), 1, Requests(), None, SHA, NOW)
    assert plan_on_prerequisite_outputs(spec(), first, None, {"base": "sha256:b"}) is first


def test_a_failed_dependent_is_retried_at_once_when_what_it_consumes_changed():
    last = dict(failed(1), prerequisiteDigests={"base": "sha256:a"})
    waiting = plan_stack(spec(), 1, Requests(), last, SHA, NOW)
    assert waiting.run is None and waiting.verdict.reason == "RetryingAfterFailure"
    assert plan_on_prerequisite_outputs(spec(), waiting, last, {"base": "sha256:a"}) is waiting
    assert plan_on_prerequisite_outputs(spec(), waiting, last, {"base": "sha256:b"}).run == "up"


def test_runs_record_the_digests_they_consumed():
    record = RunRecord("s-1", "up", 1, "", SHA, NOW, "host", prerequisite_digests=(("base", "sha256:a"),))
    assert succeeded_update(record, "", NOW)["prerequisiteDigests"] == {"base": "sha256:a"}
    assert failed_update(None, record, "UpdateFailed", "boom", "", NOW)["prerequisiteDigests"] == {"base": "sha256:a"}
    assert "prerequisiteDigests" not in succeeded_update(run(), "", NOW)


def test_a_named_output_the_prerequisite_lacks_blocks_naming_it():
    base = prereq_with_outputs({"url": "sha256:1"})
    check = check_prerequisite(Prerequisite(name="base", outputs=["url", "endpoint"]), base, NOW)
    assert check.problem.startswith("prerequisite 'base' has no output 'endpoint'")
    assert "spec.prerequisites[].outputs" in check.problem
    assert check_prerequisite(Prerequisite(name="base", outputs=["url"]), base, NOW).problem is None


def test_drift_is_checked_every_interval_from_the_last_check_or_update():
    watched = spec(driftDetection={"interval": "10m"})
    assert drift_check_due(spec(), ok(), None, NOW) == (False, None), "no drift detection asked"
    assert drift_check_due(watched, None, None, NOW) == (False, None), "nothing applied yet"
    assert drift_check_due(watched, failed(1), None, NOW) == (False, None), "only what was applied can drift"
    assert drift_check_due(watched, ok(at=NOW - timedelta(minutes=3)), None, NOW) == (False, 420.0)
    assert drift_check_due(watched, ok(at=NOW - timedelta(hours=1)), None, NOW) == (True, 600.0)
    checked = {"checkedAt": rfc3339(NOW - timedelta(minutes=9))}
    assert drift_check_due(watched, ok(at=NOW - timedelta(hours=1)), checked, NOW) == (False, 60.0)
    # The operator's floor (--min-resync-seconds) bounds a short interval.
    assert drift_check_due(spec(driftDetection={"interval": "1s"}), ok(), None, NOW, floor=60) == (True, 60.0)


def test_drift_status_counts_only_what_changed_outside_pulumi():
    assert drift_status({"same": 3, "update": 1, "delete": 0}, "T") == {"checkedAt": "T", "drifted": True,
                                                                          "changes": {"update": 1}}
    assert drift_status({"same": 3}, "T") == {"checkedAt": "T", "drifted": False, "changes": {}}


def test_a_stack_is_deployed_once_any_update_of_it_succeeded():
    assert not ever_deployed({})
    assert not ever_deployed({"lastUpdate": {"state": "failed", "lastSuccessfulCommit": ""}})
    assert ever_deployed({"lastUpdate": {"state": "succeeded"}})
    assert ever_deployed({"lastUpdate": {"state": "failed", "lastSuccessfulCommit": "abc"}})
    assert ever_deployed({"lastUpdate": {"state": "failed"}, "outputs": {}})
