"""The worker's pure parts: config written into the stack file, results read from an event log, the
record of which backend stack is known to exist, what a failure reports. The real CLI runs them in
tests/engine/operator."""

import base64
import json
import subprocess

import pytest
import yaml
from pulumi import automation as auto
from pulumi.automation.errors import StackNotFoundError

from strata_operator.api.status import update_message
from strata_operator.engine.process import worker
from strata_operator.engine.process.executor import IMAGE_PULUMI_VERSION
from strata_operator.engine.process.virtualenvs import PythonEnvError
from strata_operator.engine.process.worker import (EnvironmentBuild, KnownStack, UpdateBlocked, _ensure_file_backend,
                                                   _event_log_results, _holds_secret, _on_stack, _secrets_settings,
                                                   _write_stack_file, failure_result, finished_run_update,
                                                   request_redactor)

SECRET = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "plaintext": '"[secret]"'}


def test_plain_config_is_namespaced_and_merged_over_the_stack_file(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: app\nruntime: yaml\n")
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(
        {"encryptionsalt": "v1:from-init", "config": {"app:kept": "from the repo", "app:size": 1}}))
    _write_stack_file(str(tmp_path), "org/app/dev", {"size": 3, "aws:region": "eu-west-1",
                                                      "tags": {"team": "a", "ids": [1, 2]}},
                      {"encryptionsalt": "v1:remembered"})
    written = yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text())
    assert written["encryptionsalt"] == "v1:from-init"  # what is in the file wins
    assert written["config"] == {"app:kept": "from the repo", "app:size": 3, "aws:region": "eu-west-1",
                                 "app:tags": {"team": "a", "ids": [1, 2]}}


def test_remembered_secrets_settings_come_back_without_config(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: app\nruntime: yaml\n")
    _write_stack_file(str(tmp_path), "dev", {}, {"encryptionsalt": "v1:remembered"})
    assert yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text()) == {"encryptionsalt": "v1:remembered"}
    assert _secrets_settings(str(tmp_path), "dev") == {"encryptionsalt": "v1:remembered"}


def test_nothing_to_write_leaves_no_file(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: app\nruntime: yaml\n")
    _write_stack_file(str(tmp_path), "dev", {}, {})
    assert not (tmp_path / "Pulumi.dev.yaml").exists()
    assert _secrets_settings(str(tmp_path), "dev") == {}


def _log(tmp_path, *events):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _stack_outputs(outputs):
    return {"resOutputsEvent": {"metadata": {"type": "pulumi:pulumi:Stack", "urn": "urn:pulumi:dev::app::"
                                             "pulumi:pulumi:Stack::app-dev", "new": {"outputs": outputs}}}}


def test_event_log_gives_root_outputs_with_secrets_withheld_and_the_summary(tmp_path):
    path = _log(tmp_path,
                {"preludeEvent": {"config": {}}},
                {"resOutputsEvent": {"metadata": {"type": "pulumi:index:Stash", "new": {"outputs": {"x": 1}}}}},
                _stack_outputs({"said": "hello", "password": SECRET, "nested": {"a": [1, SECRET]}, "n": 2}),
                {"summaryEvent": {"resourceChanges": {"create": 2, "same": 1}}})
    outputs, summary = _event_log_results(path)
    assert outputs == {"said": {"value": "hello", "secret": False}, "password": {"value": None, "secret": True},
                       "nested": {"value": None, "secret": True}, "n": {"value": 2, "secret": False}}
    assert summary == {"create": 2, "same": 1}


def test_event_log_without_stack_outputs_says_so(tmp_path):
    assert _event_log_results(_log(tmp_path, {"summaryEvent": {"resourceChanges": {}}})) == (None, {})
    assert _event_log_results(tmp_path / "missing.jsonl") == (None, {})


def test_secret_detection_looks_inside_values():
    assert _holds_secret(SECRET) and _holds_secret([SECRET]) and _holds_secret({"a": {"b": SECRET}})
    assert not _holds_secret({"plaintext": "x"}) and not _holds_secret("[secret]-like text")


def test_known_stack_record_is_per_backend_and_stack(tmp_path):
    record = tmp_path / "known.json"
    known = KnownStack(record, "file:///a", "dev")
    assert known.settings() is None
    known.remember({"encryptionsalt": "v1:x"})
    assert known.settings() == {"encryptionsalt": "v1:x"}
    assert KnownStack(record, "file:///b", "dev").settings() is None
    assert KnownStack(record, "file:///a", "prod").settings() is None
    known.forget()
    assert known.settings() is None
    known.forget()  # already gone: fine


# --- what a failed update reports --------------------------------------------------------------

def _request(tmp_path, **extra):
    return {"stack_name": "dev", "plugin_cache": str(tmp_path / "pulumi" / "plugins"), "secret_config": {},
            "env": {}, "worker_env": {}, "secret_env": [], **extra}


def test_only_secret_values_are_redacted_plain_ones_stay_readable(tmp_path):
    request = _request(tmp_path, secret_config={"token": "config-canary-123"},
                       env={"PULUMI_BACKEND_URL": "file:///srv/state", "PULUMI_CONFIG_PASSPHRASE": "pass-canary-456",
                            "FROM_SECRET": "env-canary-789", "REGION": "eu-west-1"},
                       secret_env=["FROM_SECRET", "PULUMI_CONFIG_PASSPHRASE"])
    text = request_redactor(request).redact(
        'unable to open "file:///srv/state" in eu-west-1 with config-canary-123 pass-canary-456 env-canary-789')
    assert text == 'unable to open "file:///srv/state" in eu-west-1 with [secret] [secret] [secret]'


def test_a_backend_url_from_a_secret_keeps_its_directory_secret_too(tmp_path):
    url = (tmp_path / "secret-canary-dir" / "..x" / "state").as_uri()
    request = _request(tmp_path, env={"PULUMI_BACKEND_URL": url}, worker_env={"PULUMI_BACKEND_URL": url},
                       secret_env=["PULUMI_BACKEND_URL"])
    text = request_redactor(request).redact(f"cannot create the directory {tmp_path}/secret-canary-dir/..x/state")
    assert "secret-canary-dir" not in text


def test_a_missing_plugin_blocks_with_the_command_that_installs_it(tmp_path):
    from strata_operator.engine.process.virtualenvs import PythonEnvError

    pip = ("  subprocess.CalledProcessError: Command '['pulumi', 'plugin', 'install', 'resource', 'flux', '1.0.1', "
           "'--server', 'github://api.github.com/oun']' returned non-zero exit status 255.\n"
           "  ERROR: Failed building wheel for pulumi-flux\n  [end of output]\n" + "  noise\n" * 10)
    err = PythonEnvError("installing requirements.txt failed (requirements.txt of the program): noise", output=pip)
    result = failure_result(err, _request(tmp_path))
    assert result["outcome"] == "blocked"
    assert (f"PULUMI_HOME={tmp_path / 'pulumi'} pulumi plugin install resource flux 1.0.1 "
            "--server github://api.github.com/oun") in result["message"]
    unrelated = PythonEnvError("installing requirements.txt failed: no matching distribution for nosuch")
    assert failure_result(unrelated, _request(tmp_path)) == {
        "outcome": "failed", "reason": "WorkspaceFailed", "message": str(unrelated)}


def test_an_uncreatable_backend_directory_blocks_naming_it_and_why(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UpdateBlocked) as raised:
        _ensure_file_backend(blocker / "state")
    assert str(blocker / "state") in str(raised.value) and "Not a directory" in str(raised.value)
    assert failure_result(raised.value, _request(tmp_path)) == {"outcome": "blocked", "message": str(raised.value)}
    with pytest.raises(UpdateBlocked, match="exists but is not a directory"):
        _ensure_file_backend(blocker)


def test_a_missing_backend_directory_is_created_private(tmp_path):
    root = tmp_path / "new" / "state"
    _ensure_file_backend(root)
    assert root.is_dir() and root.stat().st_mode & 0o777 == 0o700
    _ensure_file_backend(root)  # there already: nothing to do


def test_a_cli_too_old_for_a_flag_blocks_as_pulumi_version_too_low(tmp_path):
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import CommandError

    err = CommandError(CommandResult(stdout="", stderr="Error: unknown flag: --run-program\n", code=255))
    result = failure_result(err, _request(tmp_path))
    assert (result["outcome"], result["reason"]) == ("blocked", "PulumiVersionTooLow")
    assert result["message"].startswith("the operator's pulumi CLI does not know --run-program")
    plain = CommandError(CommandResult(stdout="", stderr="error: resource failed\n", code=255))
    assert "reason" not in failure_result(plain, _request(tmp_path))


def test_the_update_log_is_redacted_and_kept_by_the_operator_private_and_replaced_by_the_next_run(tmp_path):
    """The worker sends its run's log back with the result (it writes nothing the operator keeps: under the
    sandbox it could not, and a program could point such a write elsewhere); the operator writes it."""
    from strata_operator.engine.process.executor import RESULT_PREFIX, UPDATE_LOG, keep_worker_files
    from strata_operator.engine.process.worker import update_log
    from strata_operator.services.redaction import Redactor

    redactor = Redactor()
    redactor.add("hunter2-canary")
    request = {"operation": "up", "stack_name": "org/app/dev"}
    result = {"outcome": "failed", "message": "bad [secret]"}
    result["update_log"] = update_log(request, result, "error: token hunter2-canary refused\n", redactor,
                                      {"environment": 1.2, "total": 4.5})
    said = json.dumps(result)
    assert "hunter2-canary" not in said and RESULT_PREFIX not in said
    keep_worker_files(said, tmp_path / "stack", "")
    path = tmp_path / "stack" / UPDATE_LOG
    record = json.loads(path.read_text())
    assert (record["operation"], record["stack"], record["outcome"], record["message"]) == \
        ("up", "org/app/dev", "failed", "bad [secret]")
    assert record["seconds"] == {"environment": 1.2, "total": 4.5}  # where the run's time went
    assert record["output"] == "error: token [secret] refused\n"
    assert path.stat().st_mode & 0o777 == 0o600
    again = {"outcome": "succeeded"}
    again["update_log"] = update_log({**request, "operation": "destroy"}, again, "gone\n", redactor)
    keep_worker_files(json.dumps(again), tmp_path / "stack", "")
    assert json.loads(path.read_text())["output"] == "gone\n" and not path.with_suffix(".partial").exists()


def test_a_saved_plan_comes_back_with_the_result_and_is_written_where_the_operator_asked(tmp_path):
    from strata_operator.engine.process.executor import keep_worker_files

    keep_worker_files(json.dumps({"outcome": "succeeded", "plan": base64.b64encode(b'{"plan": 1}').decode()}),
                      tmp_path / "stack", str(tmp_path / "plan.json"))
    assert (tmp_path / "plan.json").read_bytes() == b'{"plan": 1}'
    keep_worker_files(json.dumps({"outcome": "succeeded", "plan": "not base64!"}), tmp_path / "stack",
                      str(tmp_path / "other.json"))
    assert not (tmp_path / "other.json").exists()


class _FakeCli:
    """A `pulumi` that only answers `stack output --json --show-secrets` (or fails), counting its runs."""

    def __init__(self, tmp_path, values, code=0):
        self.calls = tmp_path / "calls"
        script = tmp_path / "pulumi"
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {self.calls}\necho '{json.dumps(values)}'\n"
                          f"echo 'the values: {json.dumps(values)}' >&2\nexit {code}\n")
        script.chmod(0o755)
        self.command = str(script)

    def runs(self):
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def _up_result(**outputs):
    return {"outcome": "succeeded", "outputs": {k: {"value": None if s else v, "secret": s}
                                                for k, (v, s) in outputs.items()}}


def test_real_values_cost_a_cli_run_only_when_asked_and_an_output_is_secret(tmp_path, monkeypatch):
    from strata_operator.engine.process.executor import DIGEST_KEY, digest_key
    from strata_operator.engine.process.worker import with_output_values

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    cli = _FakeCli(tmp_path, {"url": "http://x", "password": "hunter2-real"})
    # The Stack's key, which the operator keeps and sends with each request.
    request = {"stack_name": "dev", "real_outputs": True, "digest_key": digest_key(tmp_path / DIGEST_KEY).hex()}
    # No secret output: the event log's values are the real ones, no CLI run.
    plain = with_output_values(cli, request, str(tmp_path), _up_result(url=("http://x", False)))
    assert plain["real_outputs"] == {"url": "http://x"} and plain["outputs_digest"] and cli.runs() == []
    # Not asked: a secret output has no digest and the total is unknown; still no CLI run.
    unread = with_output_values(cli, {**request, "real_outputs": False}, str(tmp_path),
                                _up_result(url=("http://x", False), password=(None, True)))
    assert "real_outputs" not in unread and "outputs_digest" not in unread
    assert set(unread["output_digests"]) == {"url"} and cli.runs() == []
    # Asked, with a secret output: one `stack output --show-secrets`, keyed digest, key kept private.
    real = with_output_values(cli, request, str(tmp_path), _up_result(url=("http://x", False), password=(None, True)))
    assert cli.runs() == ["stack output --json --show-secrets --non-interactive --stack dev"]
    assert real["real_outputs"] == {"url": "http://x", "password": "hunter2-real"}
    assert real["output_digests"]["password"].startswith("hmac-sha256:")
    assert real["output_digests"]["url"] == unread["output_digests"]["url"]
    assert "hunter2-real" not in json.dumps({k: v for k, v in real.items() if k != "real_outputs"})
    assert (tmp_path / DIGEST_KEY).stat().st_mode & 0o777 == 0o600
    again = with_output_values(cli, request, str(tmp_path), _up_result(url=("http://x", False), password=(None, True)))
    assert again["outputs_digest"] == real["outputs_digest"], "the key is kept: same values, same digest"


def test_a_failed_read_of_real_values_says_so_without_any_output_of_the_cli(tmp_path, monkeypatch):
    from strata_operator.engine.process.worker import with_output_values

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cli = _FakeCli(tmp_path, {"password": "hunter2-real"}, code=1)
    result = with_output_values(cli, {"stack_name": "dev", "real_outputs": True}, str(tmp_path),
                                _up_result(password=(None, True)))
    assert "real_outputs" not in result and "outputs_digest" not in result
    assert result["outputs_error"] == "reading the outputs' values failed: `pulumi stack output --show-secrets` " \
                                      "exited with 1"


def test_real_secret_values_are_registered_for_redaction_and_never_in_the_results_repr():
    from strata_operator.engine.port import UpdateResult, masked
    from strata_operator.services.redaction import Redactor

    line = json.dumps({"outcome": "succeeded", "message": "made s3cr3t-nested",
                       "outputs": {"url": {"value": "http://plain", "secret": False},
                                   "db": {"value": None, "secret": True}},
                       "real_outputs": {"url": "http://plain", "db": {"user": "admin", "password": "s3cr3t-nested"}},
                       "output_digests": {"url": "sha256:1"}, "outputs_digest": "sha256:t"})
    redactor = Redactor()
    result = masked(UpdateResult.from_json(line, 1.0), redactor)
    assert result.real_outputs["db"]["password"] == "s3cr3t-nested"
    assert "s3cr3t-nested" not in repr(result) and "http://plain" in repr(result)
    assert result.message == "made [secret]"
    assert redactor.redact("leaked s3cr3t-nested here") == "leaked [secret] here"
    assert redactor.redact("see http://plain") == "see http://plain", "plain outputs stay readable"
    assert (result.outputs_digest, result.output_digests) == ("sha256:t", {"url": "sha256:1"})


def test_only_the_newest_successful_update_of_the_run_is_its_finished_update():
    entry = {"kind": "update", "result": "succeeded", "message": update_message("Initial stack update", "app-1")}
    assert finished_run_update(entry, "app-1")
    assert not finished_run_update(entry, "app-2")
    assert not finished_run_update({**entry, "result": "failed"}, "app-1")
    assert not finished_run_update({**entry, "result": "in-progress"}, "app-1")
    assert not finished_run_update({**entry, "kind": "refresh"}, "app-1")
    assert not finished_run_update({}, "app-1")


class _Workspace:
    def __init__(self, work_dir):
        self.work_dir = str(work_dir)


def test_the_stack_is_prepared_while_the_environment_builds_and_the_program_runs_once_it_is_ready(tmp_path,
                                                                                                   monkeypatch):
    steps = []
    monkeypatch.setattr(worker, "_prepare_stack", lambda *_args: steps.append("prepare"))
    known = KnownStack(tmp_path / "known-stack.json", "file:///b", "org/app/dev")
    result = _on_stack(_Workspace(tmp_path), {"stack_name": "org/app/dev"}, known, True,
                       lambda: steps.append("program") or {"outcome": "succeeded"}, lambda: steps.append("ready"))
    assert steps == ["prepare", "ready", "program"] and result == {"outcome": "succeeded"}
    assert known.settings() == {}  # remembered: the next update needs no `stack init`



def test_a_stack_removed_behind_our_back_is_created_again_and_its_program_still_waits_for_the_environment(
        tmp_path, monkeypatch):
    steps = []

    def prepare(_workspace, _request, create, _settings):
        steps.append(f"prepare create={create}")
        if not create:  # `config set --secret` on the stack the record says exists
            raise StackNotFoundError(auto.CommandResult("", "no stack named 'org/app/dev' found", 255))

    monkeypatch.setattr(worker, "_prepare_stack", prepare)
    known = KnownStack(tmp_path / "known-stack.json", "file:///b", "org/app/dev")
    known.remember({})
    _on_stack(_Workspace(tmp_path), {"stack_name": "org/app/dev"}, known, True,
              lambda: steps.append("program") or {"outcome": "succeeded"}, lambda: steps.append("ready"))
    assert steps == ["prepare create=False", "prepare create=True", "ready", "program"]

def test_an_environment_that_fails_to_build_fails_the_update_when_it_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def broken(project_dir, venvs, cache, bytecode):
        assert (project_dir, venvs, cache, bytecode) == (tmp_path / "project", tmp_path / "venvs", tmp_path / "cache",
                                                         tmp_path / "bytecode")
        raise PythonEnvError("installing requirements.txt failed (the program's dependencies): no-such-package")

    monkeypatch.setattr(worker, "ensure_virtualenv", broken)
    seconds = {}
    build = EnvironmentBuild(tmp_path / "project", tmp_path / "cache", tmp_path / "bytecode", seconds)
    build.start()
    with pytest.raises(PythonEnvError, match="no-such-package"):
        build.wait()
    assert seconds["environment"] >= 0
    assert failure_result(build.error, {})["reason"] == "WorkspaceFailed"  # as when it was built before


def test_an_operation_without_a_program_waits_for_no_environment(tmp_path):
    seconds = {}
    build = EnvironmentBuild(tmp_path, tmp_path / "cache", None, seconds)
    build.wait()  # never started: nothing to wait for
    assert seconds == {}


@pytest.mark.parametrize("operation, builds", [("up", True), ("preview", True), ("refresh", True),
                                               ("destroy", True), ("outputs", False), ("recover", False)])
def test_every_operation_that_loads_the_states_providers_gets_the_programs_environment(
        operation, builds, tmp_path, monkeypatch):
    # A destroy loads a Python program's dynamic providers (pulumi-python), which run in its environment.
    built = []
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "pulumi-home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(worker, "link_plugins", lambda *args: None)
    monkeypatch.setattr(worker, "cached_plugins", lambda *args: [])
    monkeypatch.setattr(worker, "ensure_virtualenv", lambda *args, bytecode: built.append(args))
    monkeypatch.setattr(worker, "_run_operation", lambda request, command, workdir, environment: environment.wait())
    worker._run({"operation": operation, "plugin_cache": str(tmp_path), "plugin_dirs": [], "create": False,
                 "python_cache": str(tmp_path / "cache")}, None, {})
    assert bool(built) is builds


def test_a_cli_version_the_image_records_is_not_asked_of_the_cli(monkeypatch):
    def ran_the_cli(*args, **kwargs):
        raise AssertionError(f"ran {args}")
    monkeypatch.setattr(subprocess, "check_output", ran_the_cli)
    known = worker.pulumi_command_for({IMAGE_PULUMI_VERSION: "v3.259.0"})
    assert (known.command, str(known.version)) == ("pulumi", "3.259.0")
    # Elsewhere (the operator's host, a foreign workspace image) the Automation API asks `pulumi version`.
    monkeypatch.setattr(subprocess, "check_output", lambda args, **kwargs: b"v3.200.1\n")
    asked = worker.pulumi_command_for({})
    assert (type(asked), str(asked.version)) == (auto.PulumiCommand, "3.200.1")
