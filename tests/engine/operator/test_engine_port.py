"""The production engine port (`AutomationEngine`) against the real pulumi CLI 3.259 + YAML host.

No test double: every outcome here is produced by the real engine on a file:// backend.
"""

import asyncio
import json
import os
import signal
import subprocess

import pytest

from strata_operator.api.status import update_message
from strata_operator.engine.port import UpdateRequest
from tests.engine.workspace import PULUMI, YAML_HOST
from strata_operator.engine.process.executor import AutomationEngine, Domain, EngineSettings

pytestmark = pytest.mark.engine

CANARY = "canary-secret-7f3a9"

PROGRAM = """name: stash
runtime: yaml
configuration:
  greeting:
    type: String
resources:
  note:
    type: pulumi:index:Stash
    properties:
      input: ${greeting}
  hidden:
    type: pulumi:index:Stash
    properties:
      input: ${password}
outputs:
  said: ${note.output}
  password: ${hidden.output}
  tags: ${tags}
"""


@pytest.fixture
def engine(tmp_path, monkeypatch):
    if not PULUMI.exists() or not YAML_HOST.exists():
        pytest.fail(f"toolchain missing: build it with `make setup` ({PULUMI}, {YAML_HOST})")
    # Every namespace trusted: these tests are about the engine's operations; test_sandbox_attacks.py runs them sandboxed.
    return AutomationEngine(EngineSettings(pulumi_command=str(PULUMI), plugin_dirs=(str(YAML_HOST),),
                                           state_dir=tmp_path / "state", trusted_namespaces=frozenset({"*"})))


def request(tmp_path, program=PROGRAM, **extra):
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "Pulumi.yaml").write_text(program.replace("${password}", "${pw}").replace(
        "configuration:\n", "configuration:\n  pw:\n    type: String\n    secret: true\n  tags:\n    default: {}\n", 1))
    backend = tmp_path / "backend"
    backend.mkdir(exist_ok=True)
    fields = dict(stack_key="ns/stash", stack_name="dev", project_dir=str(project),
                  env={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "pass-phrase-123"},
                  config={"greeting": "hello", "tags": {"team": "a"}}, secret_config={"pw": CANARY})
    fields.update(extra)
    return UpdateRequest(**fields)


def test_up_preview_refresh_outputs_destroy_remove(engine, tmp_path):
    req = request(tmp_path)
    up = asyncio.run(engine.up(req))
    assert up.ok, up.message
    assert up.outputs["said"] == ("hello", False)
    assert up.outputs["tags"] == ({"team": "a"}, False)
    assert up.outputs["password"] == (None, True)  # the secret's value never leaves the worker
    assert up.summary.get("create") == 3  # the stack + two Stash resources
    state = (tmp_path / "backend").rglob("dev.json")
    assert CANARY not in "".join(p.read_text() for p in state)  # stored encrypted
    again = asyncio.run(engine.preview(req))
    assert again.ok and again.summary.get("same") == 3 and not again.summary.get("create")
    assert asyncio.run(engine.refresh(req)).ok
    assert asyncio.run(engine.outputs(req)).outputs["said"] == ("hello", False)
    destroyed = asyncio.run(engine.destroy(req))
    assert destroyed.ok and destroyed.summary.get("delete") == 3
    assert asyncio.run(engine.remove_stack(req)).ok
    assert not list((tmp_path / "backend").rglob("dev.json"))


def test_bad_expression_fails_with_the_engine_error(engine, tmp_path):
    req = request(tmp_path, PROGRAM.replace("${note.output}", "${nosuch.output}"))
    result = asyncio.run(engine.up(req))
    assert result.outcome == "failed"
    assert "nosuch" in result.message and CANARY not in result.message


def test_missing_required_config_fails(engine, tmp_path):
    req = request(tmp_path)
    result = asyncio.run(engine.up(UpdateRequest(**{**req.__dict__, "config": {"tags": {}}})))
    assert result.outcome == "failed" and "greeting" in result.message


def test_destroy_with_run_program_runs_the_program(engine, tmp_path):
    """spec.runProgram: destroy --run-program loads the program, so one that no longer loads fails the destroy
    that, without it, works from the state alone."""
    assert asyncio.run(engine.up(request(tmp_path))).ok
    req = request(tmp_path, PROGRAM.replace("${note.output}", "${nosuch.output}"))  # breaks the program
    refused = asyncio.run(engine.destroy(UpdateRequest(**{**req.__dict__, "run_program": True})))
    assert refused.outcome == "failed" and "nosuch" in refused.message
    destroyed = asyncio.run(engine.destroy(req))
    assert destroyed.ok and destroyed.summary.get("delete") == 3


def test_held_lock_is_a_conflict_and_recover_clears_only_our_dead_run(engine, tmp_path):
    req = request(tmp_path)
    assert asyncio.run(engine.up(req)).ok
    locks = tmp_path / "backend/.pulumi/locks/organization/stash/dev"
    locks.mkdir(parents=True, exist_ok=True)
    lock = locks / "0b0e1f0e-0000-4000-8000-000000000000.json"
    lock.write_text(json.dumps({"pid": 999999, "username": "x", "hostname": "dead-host",
                                "timestamp": "2030-01-01T00:00:00Z"}))
    blocked = asyncio.run(engine.up(req))
    assert blocked.outcome == "conflict", blocked.message
    other = asyncio.run(engine.recover(UpdateRequest(**{**req.__dict__, "interrupted_host": "another-host",
                                                        "interrupted_since": 0.0})))
    assert other.ok and lock.exists()  # not ours: left alone
    ours = asyncio.run(engine.recover(UpdateRequest(**{**req.__dict__, "interrupted_host": "dead-host",
                                                       "interrupted_since": 0.0})))
    assert ours.ok and "lock" in ours.message and not lock.exists()
    assert asyncio.run(engine.up(req)).ok


def test_recover_returns_the_interrupted_runs_update_when_it_had_finished(engine, tmp_path):
    """An operator that lost a run after its update succeeded (its status write failed) finds that update in
    the backend's history by the run's name in its message, and gets its outputs: nothing runs again."""
    req = request(tmp_path)
    assert asyncio.run(engine.up(UpdateRequest(**{**req.__dict__, "message": update_message("first", "app-1")}))).ok
    finished = asyncio.run(engine.up(UpdateRequest(**{**req.__dict__, "message": update_message("second", "app-2"),
                                                      "config": {"greeting": "again", "tags": {}}})))
    assert finished.ok, finished.message
    recovered = asyncio.run(engine.recover(UpdateRequest(**{**req.__dict__, "interrupted_host": "dead-host",
                                                            "interrupted_run": "app-2"})))
    assert recovered.ok and recovered.finished, recovered.message
    assert recovered.outputs == finished.outputs and recovered.outputs["password"] == (None, True)
    assert recovered.summary == finished.summary and recovered.output_digests == finished.output_digests
    # An earlier run's update is not the newest; a run whose update never happened has none.
    for run in ("app-1", "app-3", ""):
        other = asyncio.run(engine.recover(UpdateRequest(**{**req.__dict__, "interrupted_run": run})))
        assert other.ok and not other.finished, run


def test_recover_of_a_first_run_that_never_created_its_stack_finds_nothing_finished(engine, tmp_path):
    req = request(tmp_path)
    recovered = asyncio.run(engine.recover(UpdateRequest(**{**req.__dict__, "interrupted_run": "app-1"})))
    assert recovered.ok and not recovered.finished, recovered.message


def test_a_stack_removed_behind_the_operators_back_is_created_again(engine, tmp_path):
    req = request(tmp_path)
    assert asyncio.run(engine.up(req)).ok
    env = {**req.env, "PATH": f"{PULUMI.parent}:{YAML_HOST}:/usr/bin:/bin", "PULUMI_HOME": str(tmp_path / "home")}
    subprocess.run([str(PULUMI), "stack", "rm", "--yes", "--force", "--stack", "dev"], cwd=req.project_dir, env=env,
                   check=True, capture_output=True)
    again = asyncio.run(engine.up(UpdateRequest(**{**req.__dict__, "config": {"greeting": "again", "tags": {}}})))
    assert again.ok, again.message
    assert again.outputs["said"] == ("again", False) and again.summary.get("create") == 3


def test_a_second_update_changes_only_what_the_config_changed(engine, tmp_path):
    req = request(tmp_path)
    assert asyncio.run(engine.up(req)).ok
    changed = asyncio.run(engine.up(UpdateRequest(**{**req.__dict__, "config": {"greeting": "bye", "tags": {}}})))
    assert changed.ok, changed.message
    # A Stash keeps the output it was created with; the input change shows as its one update.
    assert changed.outputs["tags"] == ({}, False) and changed.outputs["said"] == ("hello", False)
    assert changed.summary.get("update") == 1 and changed.summary.get("same") == 2


def _history(req, tmp_path) -> list[str]:
    env = {**req.env, "PATH": f"{PULUMI.parent}:{YAML_HOST}:/usr/bin:/bin", "PULUMI_HOME": str(tmp_path / "home")}
    done = subprocess.run([str(PULUMI), "stack", "history", "--json", "--stack", "dev"], cwd=req.project_dir,
                          env=env, check=True, capture_output=True, text=True)
    return [entry["kind"] for entry in json.loads(done.stdout)]


def test_refresh_runs_with_the_update_and_a_preview_never_writes_state(engine, tmp_path):
    req = request(tmp_path)
    assert asyncio.run(engine.up(req)).ok
    refreshed = UpdateRequest(**{**req.__dict__, "refresh": True})
    assert asyncio.run(engine.up(refreshed)).ok
    strict = UpdateRequest(**{**req.__dict__, "refresh": True, "expect_no_refresh_changes": True})
    assert asyncio.run(engine.up(strict)).ok
    before = _history(req, tmp_path)
    assert before.count("refresh") == 1 and before.count("update") == 3  # newest first
    preview = asyncio.run(engine.preview(strict))
    assert preview.ok, preview.message
    assert _history(req, tmp_path) == before  # neither the preview nor its refresh left a trace


def test_a_dead_fork_server_is_replaced(engine, tmp_path):
    req = request(tmp_path)

    async def kill_server_then_update():
        await engine.start()
        server = engine._forkservers[Domain()].process
        os.kill(server.pid, signal.SIGKILL)  # as the OOM killer would; not waited for: the engine finds out
        return await engine.up(req)

    result = asyncio.run(kill_server_then_update())
    assert result.ok, result.message


def test_a_saved_plan_applies_exactly_and_a_strayed_one_is_refused(engine, tmp_path):
    from strata_operator.decisions.approval import plan_refused

    plan = tmp_path / "plan.json"
    saved = asyncio.run(engine.preview(request(tmp_path, plan_file=str(plan))))
    assert saved.ok and saved.summary.get("create") == 3 and plan.is_file()
    assert CANARY not in plan.read_text(), "secret config is kept encrypted in the plan"
    assert asyncio.run(engine.outputs(request(tmp_path))).outputs == {}, "saving a plan applies nothing"
    applied = asyncio.run(engine.up(request(tmp_path, plan_file=str(plan))))
    assert applied.ok and applied.outputs["said"] == ("hello", False)

    asyncio.run(engine.preview(request(tmp_path, plan_file=str(plan), config={"greeting": "hi", "tags": {}})))
    strayed = asyncio.run(engine.up(request(tmp_path, plan_file=str(plan), config={"greeting": "other", "tags": {}})))
    assert not strayed.ok and plan_refused(strayed.message), strayed.message
    assert asyncio.run(engine.outputs(request(tmp_path))).outputs["said"] == ("hello", False), "nothing applied"
