"""How a Stack's update runs: targets, refresh, preview, resync on an unchanged branch, structured config
and configRef. Each is checked against the backend's own state (`pulumi stack export` / `stack history`
with the toolchain's CLI), not only against what the operator reports."""

from __future__ import annotations

import json
import subprocess

import pytest

from strata_components.local.processes import wait_until

from .conftest import MIN_RESYNC_SECONDS, PASSPHRASE, eventually_constant, has_condition, stash_program, stash_project


@pytest.fixture
def pulumi_cli(stacks, toolchain, pulumi_env, tmp_path):
    """The toolchain's pulumi CLI on the test's backend, with the Stacks' passphrase; returns stdout."""
    env = {**pulumi_env, "PULUMI_BACKEND_URL": stacks.backend, "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE}
    cli = str(toolchain.dir("pulumi") / "bin" / "pulumi")

    def run(*args: str) -> str:
        done = subprocess.run([cli, *args, "--non-interactive"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"pulumi {' '.join(args)}: {done.stderr}"
        return done.stdout

    return run


def exported(pulumi_cli, project: str, stack: str = "dev") -> dict:
    return json.loads(pulumi_cli("stack", "export", "--stack", f"organization/{project}/{stack}"))


def stashes(pulumi_cli, project: str, stack: str = "dev") -> dict[str, dict]:
    """The backend's pulumi:index:Stash resources of a stack, by name."""
    resources = exported(pulumi_cli, project, stack)["deployment"].get("resources") or []
    return {r["urn"].rsplit("::", 1)[1]: r for r in resources if r["type"] == "pulumi:index:Stash"}


def history(pulumi_cli, project: str, stack: str = "dev") -> list[dict]:
    """The backend's update history of a stack, oldest first (the CLI lists newest first)."""
    entries = json.loads(pulumi_cli("stack", "history", "--json", "--stack", f"organization/{project}/{stack}"))
    return list(reversed(entries or []))


def stash_urn(project: str, name: str, stack: str = "dev") -> str:
    # A Program's project is named after the Program (sources.write_program_project).
    return f"urn:pulumi:{stack}::{project}::pulumi:index:Stash::{name}"


def _ran_generation(generation: int):
    def check(obj: dict) -> bool:
        last = obj["status"].get("lastUpdate") or {}
        return last.get("generation") == generation and has_condition(obj, "Ready")
    return check


def test_targets_update_only_the_targeted_resource(stacks, pulumi_cli):
    stacks.program("targeted", {
        "configuration": {"firstValue": {"type": "String"}, "secondValue": {"type": "String"}},
        "resources": {"first": {"type": "pulumi:index:Stash", "properties": {"input": "${firstValue}"}},
                      "second": {"type": "pulumi:index:Stash", "properties": {"input": "${secondValue}"}}},
        "outputs": {"first": "${first.input}", "second": "${second.input}"}})
    stacks.create("targeted", stacks.spec(programRef={"name": "targeted"},
                                          config={"firstValue": "one", "secondValue": "one"}))
    stacks.wait_ready("targeted", 90)
    assert {n: r["inputs"]["input"] for n, r in stashes(pulumi_cli, "targeted").items()} == {
        "first": "one", "second": "one"}

    # Both inputs change, but only `first` is targeted: `second` keeps its old state in the backend.
    target = stash_urn("targeted", "first")
    stacks.patch("targeted", {"spec": {"targets": [target], "config": {"firstValue": "two", "secondValue": "two"}}})
    obj = stacks.wait("targeted", _ran_generation(2), 90, "targeted run for generation 2")
    assert obj["status"]["lastUpdate"]["state"] == "succeeded"
    resources = stashes(pulumi_cli, "targeted")
    assert resources["first"]["urn"] == target
    assert {n: r["inputs"]["input"] for n, r in resources.items()} == {"first": "two", "second": "one"}
    assert obj["status"]["outputs"] == {"first": "two", "second": "one"}

    # Without targets the next run brings `second` up to date too.
    stacks.patch("targeted", {"spec": {"targets": None}})
    obj = stacks.wait("targeted", _ran_generation(3), 90, "untargeted run for generation 3")
    assert {n: r["inputs"]["input"] for n, r in stashes(pulumi_cli, "targeted").items()} == {
        "first": "two", "second": "two"}
    assert obj["status"]["outputs"] == {"first": "two", "second": "two"}
    assert stacks.runs("targeted") == 3


def test_refresh_before_up_finds_no_changes_in_stash_resources(stacks, pulumi_cli):
    stacks.program("refreshed", stash_program(colour="blue", size="large"))
    stacks.create("refreshed", stacks.spec(programRef={"name": "refreshed"}, refresh=True,
                                           expectNoRefreshChanges=True))
    first = stacks.wait_ready("refreshed", 90)["status"]
    assert first["outputs"] == {"colour": "blue", "size": "large"}
    assert first["lastUpdate"]["state"] == "succeeded" and first["lastUpdate"]["type"] == "up"

    # A second run refreshes existing resources: with expectNoRefreshChanges any drift would fail it.
    stacks.patch("refreshed", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "again"}}})
    obj = stacks.wait("refreshed", lambda o: (o["status"].get("lastUpdate") or {}).get("reconcileRequest") == "again"
                      and has_condition(o, "Ready"), 90, "second run with refresh")
    assert obj["status"]["lastUpdate"]["state"] == "succeeded"
    assert obj["status"]["lastUpdate"]["name"] != first["lastUpdate"]["name"]

    # The backend recorded each run as a refresh followed by an update.
    kinds = [(e["kind"], e["result"]) for e in history(pulumi_cli, "refreshed")]
    assert kinds == [("refresh", "succeeded"), ("update", "succeeded")] * 2, kinds
    second_refresh = history(pulumi_cli, "refreshed")[2]
    assert second_refresh["resourceChanges"] == {"same": 3}  # the stack and both Stashes, unchanged
    assert set(stashes(pulumi_cli, "refreshed")) == {"colour", "size"}


def test_preview_stack_creates_nothing_until_preview_is_turned_off(stacks, pulumi_cli):
    stacks.program("previewed", stash_program(colour="blue"))
    stacks.create("previewed", stacks.spec(programRef={"name": "previewed"}, preview=True))
    obj = stacks.wait_ready("previewed", 90)
    last = obj["status"]["lastUpdate"]
    assert last["type"] == "preview" and last["state"] == "succeeded"
    assert last["lastSuccessfulCommit"] == "previewed/1"
    assert "outputs" not in obj["status"]
    assert stashes(pulumi_cli, "previewed") == {}  # nothing created in the backend
    assert not [e for e in history(pulumi_cli, "previewed") if e["kind"] == "update"]
    # A preview is not re-run while nothing changes.
    assert eventually_constant(lambda: stacks.runs("previewed"), 5) == 1

    stacks.patch("previewed", {"spec": {"preview": False}})
    obj = stacks.wait("previewed", _ran_generation(2), 90, "an up for generation 2")
    assert obj["status"]["lastUpdate"]["type"] == "up"
    assert obj["status"]["outputs"] == {"colour": "blue"}
    assert stashes(pulumi_cli, "previewed")["colour"]["inputs"]["input"] == "blue"


def _updates(pulumi_cli, project: str, stack: str) -> list[dict]:
    return [e for e in history(pulumi_cli, project, stack) if e["kind"] == "update"]


def _resync_runs(stacks, name: str) -> int:
    return sum(1 for e in stacks.events(name, "StackUpdateDetected") if "Resync time elapsed" in e.message)


def test_continue_resync_on_commit_match_reruns_an_unchanged_branch(stacks, local_platform, pulumi_cli):
    repo = f"{stacks.namespace}-resync"
    url = local_platform.git.create(repo, {"Pulumi.yaml": stash_project("resynced", colour="blue")})
    stacks.create("quiet", stacks.spec(stack="quiet", projectRepo=url, branch="main"))
    stacks.create("resyncing", stacks.spec(stack="resyncing", projectRepo=url, branch="main",
                                           continueResyncOnCommitMatch=True))
    first = stacks.wait_ready("resyncing", 90)["status"]["lastUpdate"]
    stacks.wait_ready("quiet", 90)

    # With the flag, every resync period (here the operator's 3 s floor) re-runs the same commit.
    stacks.wait("resyncing", lambda o: _resync_runs(stacks, "resyncing") >= 2, 30 * MIN_RESYNC_SECONDS + 60,
                "two resync re-runs of the unchanged branch head")
    # Each re-run is a real update in the backend. The second re-run's Event comes as it starts, while
    # the Stack still shows the first re-run's Ready: wait for its update to be recorded.
    wait_until(lambda: len(_updates(pulumi_cli, "resynced", "resyncing")) >= 3, 60,
               "the second re-run's update in the backend's history", interval=1)
    obj = stacks.wait_ready("resyncing", 90)
    assert obj["status"]["lastUpdate"]["lastSuccessfulCommit"] == first["lastSuccessfulCommit"]
    assert obj["status"]["lastUpdate"]["name"] != first["name"]
    assert obj["status"]["outputs"] == {"colour": "blue"}

    # Without it, the same unchanged head ran once and stays that way.
    assert stacks.runs("quiet") == 1
    assert len(history(pulumi_cli, "resynced", "quiet")) == 1
    assert eventually_constant(lambda: stacks.runs("quiet"), 2 * MIN_RESYNC_SECONDS + 1) == 1


def test_structured_config_and_config_ref(stacks, pulumi_cli, operator):
    stacks.core.create_namespaced_config_map(stacks.namespace, {
        "metadata": {"name": "app-config"},
        "data": {"region": "eu-west-1", "limits": json.dumps({"cpu": 2, "memory": "1Gi"})}})
    names = ("settings", "zones", "region", "limits")
    stacks.program("configured", {
        "configuration": {"settings": {"type": "Object"}, "zones": {"type": "List<String>"},
                          "region": {"type": "String"}, "limits": {"type": "Object"}},
        "resources": {f"{n}Note": {"type": "pulumi:index:Stash", "properties": {"input": f"${{{n}}}"}}
                      for n in names},
        "outputs": {n: f"${{{n}Note.input}}" for n in names}})
    stacks.create("configured", stacks.spec(
        programRef={"name": "configured"},
        config={"settings": {"replicas": 3, "labels": {"tier": "web"}}, "zones": ["a", "b"]},
        configRef={"region": {"name": "app-config", "key": "region"},
                   "limits": {"name": "app-config", "key": "limits", "json": True}}))
    obj = stacks.wait_ready("configured", 90)
    expected = {"settings": {"replicas": 3, "labels": {"tier": "web"}}, "zones": ["a", "b"],
                "region": "eu-west-1", "limits": {"cpu": 2, "memory": "1Gi"}}
    assert obj["status"]["outputs"] == expected
    stored = stashes(pulumi_cli, "configured")
    assert {name.removesuffix("Note"): r["inputs"]["input"] for name, r in stored.items()} == expected
    # The passphrase the worker got from the Secret stays out of status, Events and the operator's log.
    assert PASSPHRASE not in str(obj) and PASSPHRASE not in operator.log_text()
    assert not any(PASSPHRASE in (e.message or "") for e in stacks.events("configured"))
