"""Engine operations, run out of the Kopf process: `python -m strata_operator.engine.process.worker SOCKET`.

That process is a fork server (`serve`); each operation is a child forked for it, which reads an
`UpdateRequest` (JSON, with its operation) from its connection, drives `pulumi.automation` against
the `pulumi` CLI on PATH in the project directory, and writes one result line prefixed with
`STRATA-RESULT `. The child's environment is only the Stack's own; its exit does not matter, the
result line does.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import yaml
from pulumi import automation as auto
from pulumi.automation.errors import (CommandError, ConcurrentUpdateError, StackAlreadyExistsError, StackNotFoundError,
                                      create_command_error)
from semver import VersionInfo

from ...api.status import PULUMI_VERSION_TOO_LOW, STACK_NOT_FOUND, WORKSPACE_FAILED, is_update_of
from ...decisions.outputs import output_digests, outputs_digest
from ...services.redaction import Redactor
from .bytecode import record_imported
from .executor import CREDENTIALS, IMAGE_PULUMI_VERSION, RESULT_PREFIX
from .plugins import cached_plugins, link_plugins, missing_plugin, missing_plugin_advice
from .virtualenvs import PythonEnvError, ensure_virtualenv

# How the CLI refuses a flag it predates (e.g. destroy --run-program for spec.runProgram).
_UNKNOWN_FLAG = re.compile(r"unknown flag: (--[a-z][a-z-]*)")

_PERMALINK = re.compile(r"(?:View (?:Live|in Browser)|Permalink)[^:]*:\s+(https?://\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "error: ..." at the start of a diagnostic or after a progress prefix; YAML program errors say "Error:".
_ERROR_LINE = re.compile(r"^(?:.*\s)?error:\s*(.+)$", re.I)
# The items of "N errors occurred:", which carry the actual causes.
_ERROR_ITEM = re.compile(r"^\s*\*\s+(.+)$")
# How the engine marks a secret value in serialized state and event logs.
SECRETS_SETTINGS = ("secretsprovider", "encryptedkey", "encryptionsalt")
_SECRET_SIG, _SECRET_KIND = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
_NOISE = re.compile(r"^(?:an unhandled error occurred: )?\d+ errors? occurred:?$|^update failed", re.I)


def _failure_message(err: CommandError) -> str:
    """The engine's own error lines (and the items of its error lists), not the whole transcript."""
    text = _ANSI.sub("", str(err))
    lines = []
    for line in text.splitlines():
        found = _ERROR_LINE.match(line) or _ERROR_ITEM.match(line)
        if found and not _NOISE.match(found.group(1).strip()):
            lines.append(found.group(1).strip().rstrip(";"))
    unique = list(dict.fromkeys(line for line in lines if line))
    if not unique:
        unique = [line.strip() for line in text.strip().splitlines()[-3:]]
    return "; ".join(unique)[:1500]


def _permalink(stdout: str) -> str:
    found = _PERMALINK.search(stdout or "")
    return found.group(1) if found else ""


def _read_yaml(path: Path) -> dict[str, Any]:
    return (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}


def _project_name(workdir: str) -> str:
    return str(_read_yaml(Path(workdir) / "Pulumi.yaml").get("name") or
               _read_yaml(Path(workdir) / "Pulumi.yml").get("name", ""))


def _stack_file(workdir: str, stack_name: str) -> Path:
    return Path(workdir) / f"Pulumi.{stack_name.split('/')[-1]}.yaml"


def _write_stack_file(workdir: str, stack_name: str, config: dict[str, Any], secrets_settings: dict[str, str]) -> None:
    """Plain config and the stack's secrets settings straight into the stack file: no CLI run.

    Merged over what the file already holds (a repository's own stack file wins on the secrets
    settings, `stack init` wrote the salt of a new stack); keys without a namespace belong to the
    project, as with `pulumi config set`. Without the salt the CLI re-keys the stack on every
    update (measured: +0.2 s a run), so the last run's is brought back.
    """
    path = _stack_file(workdir, stack_name)
    settings = _read_yaml(path)
    before = dict(settings)
    for key, value in secrets_settings.items():
        settings.setdefault(key, value)
    if config:
        project = _project_name(workdir)
        settings["config"] = {**(settings.get("config") or {}),
                              **{key if ":" in key else f"{project}:{key}": value for key, value in config.items()}}
    if settings != before:
        path.write_text(yaml.safe_dump(settings, sort_keys=False))


def _secrets_settings(workdir: str, stack_name: str) -> dict[str, str]:
    """The stack file's secrets provider settings (salt, provider URL, encrypted key): no secret in them."""
    settings = _read_yaml(_stack_file(workdir, stack_name))
    return {key: settings[key] for key in SECRETS_SETTINGS if settings.get(key)}


def _set_secret_config(command: auto.PulumiCommand, workdir: str, stack_name: str, secrets: dict[str, str]) -> None:
    """One by one with the value on stdin: never in argv, where any local user could read it."""
    for key, value in secrets.items():
        done = subprocess.run([command.command, "config", "set", "--secret", "--stack", stack_name,
                               "--non-interactive", key],
                              input=value, capture_output=True, text=True, cwd=workdir)
        if done.returncode != 0:
            error = create_command_error(auto.CommandResult(done.stdout, done.stderr, done.returncode))
            if isinstance(error, StackNotFoundError):
                raise error
            raise RuntimeError(f"setting secret config {key!r} failed: {done.stderr.strip()}")


class KnownStack:
    """Whether this Stack's backend stack is known to exist (so an update needs no `stack init` run),
    and its secrets settings as the last run left them.

    A record in the Stack's own state directory, written after the stack was created or used; when
    it is stale (the stack was removed behind our back) the update says so and is retried after init.
    """

    def __init__(self, path: Path, backend: str, stack_name: str):
        self.path, self.key = path, {"backend": backend, "stack": stack_name}

    def settings(self) -> dict[str, str] | None:
        """The remembered secrets settings, or None when the stack is not known to exist."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return record.get("settings", {}) if {k: record.get(k) for k in self.key} == self.key else None

    def remember(self, settings: dict[str, str]) -> None:
        self.path.write_text(json.dumps({**self.key, "settings": settings}))

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def _prepare_stack(workspace: auto.LocalWorkspace, request: dict[str, Any], create: bool,
                   secrets_settings: dict[str, str]) -> None:
    """Create the stack if asked (an existing one is fine), then give it its settings and config."""
    name, workdir = request["stack_name"], workspace.work_dir
    if create:
        try:
            workspace.create_stack(name)
        except StackAlreadyExistsError:
            pass
    _write_stack_file(workdir, name, request["config"], secrets_settings)
    _set_secret_config(workspace.pulumi_command, workdir, name, request["secret_config"])
    if request["environments"]:
        workspace.add_environments(name, *request["environments"])


def _event_log_results(path: Path) -> tuple[dict[str, dict[str, Any]] | None, dict[str, int]]:
    """(root stack outputs, resource changes) from an engine event log; outputs None if it had none.

    The engine writes secret outputs into the log as "[secret]" under the secret signature, so no
    secret value is ever read here.
    """
    outputs: dict[str, dict[str, Any]] | None = None
    summary: dict[str, int] = {}
    if not path.is_file():
        return outputs, summary
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        res_outputs = event.get("resOutputsEvent")
        if res_outputs and res_outputs.get("metadata", {}).get("type") == "pulumi:pulumi:Stack":
            new = res_outputs["metadata"].get("new") or {}
            outputs = {key: {"value": _unwrap_secret(value), "secret": _holds_secret(value)}
                       for key, value in (new.get("outputs") or {}).items()}
        if event.get("summaryEvent"):
            summary = dict(event["summaryEvent"].get("resourceChanges") or {})
    return outputs, summary


def _holds_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return value.get(_SECRET_SIG) == _SECRET_KIND or any(_holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_secret(v) for v in value)
    return False


def _unwrap_secret(value: Any) -> Any:
    return None if _holds_secret(value) else value


def _cli_outputs(command: auto.PulumiCommand, workdir: str, stack_name: str) -> dict[str, dict[str, Any]]:
    """One `stack output --json` without --show-secrets: secret values come back as "[secret]"."""
    result = command.run(["stack", "output", "--json", "--non-interactive", "--stack", stack_name], workdir, {})
    return {key: {"value": None if value == "[secret]" else value, "secret": value == "[secret]"}
            for key, value in json.loads(result.stdout or "{}").items()}


def _finished_update(command: auto.PulumiCommand, workdir: str, stack_name: str, run: str) -> dict[str, Any] | None:
    """The backend's newest update, if it is the run named `run`'s and it succeeded; else None (a stack
    that cannot be read, or never was created, had no finished update of that run)."""
    if not run:
        return None
    try:
        listed = command.run(["stack", "history", "--json", "--page-size", "1", "--non-interactive",
                              "--stack", stack_name], workdir, {})
        entries = json.loads(listed.stdout or "[]")
    except (CommandError, ValueError):
        return None
    newest = entries[0] if isinstance(entries, list) and entries else {}
    return newest if finished_run_update(newest, run) else None


def finished_run_update(entry: dict[str, Any], run: str) -> bool:
    """A history entry (`pulumi stack history --json`) is the successful update of the run named `run`."""
    return (entry.get("kind") == "update" and entry.get("result") == "succeeded"
            and is_update_of(entry.get("message", ""), run))


def _selection(request: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The CLI arguments for the request's targets and its message."""
    targets = [arg for target in request["targets"] for arg in ("--target", target)]
    if request["targets"] and request["target_dependents"]:
        targets.append("--target-dependents")
    return targets, (["--message", request["message"]] if request["message"] else [])


def _update_options(request: dict[str, Any]) -> list[str]:
    """The CLI arguments of PKO v2's Update options (absent from older requests)."""
    args = ["--expect-no-changes"] if request.get("expect_no_changes") else []
    if request.get("continue_on_error"):
        args.append("--continue-on-error")
    args += [arg for urn in request.get("replace") or () for arg in ("--replace", urn)]
    if request.get("parallel"):
        args += ["--parallel", str(request["parallel"])]
    return args


def _with_event_log(command: auto.PulumiCommand, args: list[str], workdir: str, env: dict[str, str] | None = None
                    ) -> tuple[auto.CommandResult, dict[str, dict[str, Any]] | None, dict[str, int]]:
    """Run the CLI with an event log: (result, root stack outputs or None, resource changes)."""
    event_log = Path(workdir).parent / f".events-{os.getpid()}.jsonl"
    try:
        # As the Automation API does: the CLI offers --event-log only with debug commands on.
        result = command.run([*args, "--event-log", str(event_log)], workdir,
                             {"PULUMI_DEBUG_COMMANDS": "true", **(env or {})})
    finally:
        outputs, summary = _event_log_results(event_log)
        event_log.unlink(missing_ok=True)
    return result, outputs, summary


def _save_plan(command: auto.PulumiCommand, request: dict[str, Any], workdir: str) -> dict[str, Any]:
    """`pulumi preview --save-plan`: the plan an approval applies exactly, and what it would change."""
    targets, message = _selection(request)
    refresh = ["--refresh"] if request["refresh"] else []
    # Saved in the run's own copy and sent back with the result: the operator keeps it where no program writes.
    plan = Path(workdir).parent / "plan.json"
    result, _, summary = _with_event_log(command, ["preview", "--save-plan", str(plan), "--non-interactive",
                                                   "--stack", request["stack_name"], *refresh, *targets, *message],
                                         workdir)
    return {"outcome": "succeeded", "permalink": _permalink(result.stdout), "summary": summary, "outputs": {},
            "plan": base64.b64encode(plan.read_bytes()).decode(), "engine_output": result.stdout + result.stderr}


def _refresh_preview(command: auto.PulumiCommand, request: dict[str, Any], workdir: str) -> dict[str, Any]:
    """`pulumi refresh --preview-only`: what differs between the stack's state and the world, written nowhere."""
    targets, _ = _selection(request)
    # PULUMI_SKIP_CONFIRMATIONS (set for every update) implies --yes, which --preview-only refuses.
    result, _, summary = _with_event_log(command, ["refresh", "--preview-only", "--non-interactive", "--stack",
                                                   request["stack_name"], *targets], workdir,
                                         {"PULUMI_SKIP_CONFIRMATIONS": "false"})
    return {"outcome": "succeeded", "summary": summary, "outputs": {}, "engine_output": result.stdout + result.stderr}


def _up(command: auto.PulumiCommand, request: dict[str, Any], workdir: str) -> dict[str, Any]:
    """`pulumi up` of a prepared stack, in exactly one CLI run (two with expectNoRefreshChanges).

    The Automation API's `Stack.up` also selects the stack and, afterwards, reads the outputs twice
    and the history once (about 1 s of every update); here outputs and the change summary come from
    the update's own event log. With a plan file (an approved plan) the engine refuses any step
    outside it.
    """
    name = request["stack_name"]
    targets, message = _selection(request)
    refresh = []
    if request["refresh"] and request["expect_no_refresh_changes"]:
        # `up --refresh` cannot fail on refresh changes alone: a refresh of its own that may.
        command.run(["refresh", "--yes", "--skip-preview", "--non-interactive", "--expect-no-changes", "--stack", name,
                     *targets, *message], workdir, {})
    elif request["refresh"]:
        refresh = ["--refresh"]
    plan = ["--plan", request["plan_file"]] if request["plan_file"] else []
    result, outputs, summary = _with_event_log(command, ["up", "--yes", "--skip-preview", "--non-interactive",
                                                         "--stack", name, *plan, *refresh, *targets, *message,
                                                         *_update_options(request)], workdir)
    if outputs is None:
        outputs = _cli_outputs(command, workdir, name)
    return {"outcome": "succeeded", "permalink": _permalink(result.stdout), "summary": summary, "outputs": outputs,
            "engine_output": result.stdout + result.stderr}


def _show_secrets(command: auto.PulumiCommand, workdir: str, stack_name: str) -> dict[str, Any]:
    """The outputs' real values (`stack output --json --show-secrets`). Run directly, not through the
    Automation API, whose errors carry the CLI's stdout: nothing of it may reach a message."""
    done = subprocess.run([command.command, "stack", "output", "--json", "--show-secrets", "--non-interactive",
                           "--stack", stack_name], capture_output=True, text=True, cwd=workdir)
    if done.returncode != 0:
        raise RuntimeError(f"`pulumi stack output --show-secrets` exited with {done.returncode}")
    try:
        values = json.loads(done.stdout or "{}")
    except ValueError:
        raise RuntimeError("`pulumi stack output --show-secrets` did not print JSON") from None
    if not isinstance(values, dict):
        raise RuntimeError("`pulumi stack output --show-secrets` did not print an object")
    return values


def with_output_values(command: auto.PulumiCommand, request: dict[str, Any], workdir: str,
                       result: dict[str, Any]) -> dict[str, Any]:
    """Add to an up's result the outputs' digests and, if the request asks, their real values.

    Plain outputs' values are the event log's; secret ones cost one more CLI run, made only when the
    request asks for real values (spec.outputsSecret, or the Stack is a prerequisite) and an output is
    secret. Without it a secret output has no digest."""
    outputs = {name: (entry["value"], bool(entry["secret"])) for name, entry in result.get("outputs", {}).items()}
    any_secret = any(secret for _, secret in outputs.values())
    real: dict[str, Any] | None = None
    if request.get("real_outputs"):
        if any_secret:
            try:
                real = _show_secrets(command, workdir, request["stack_name"])
            except (OSError, RuntimeError) as err:
                result["outputs_error"] = f"reading the outputs' values failed: {err}"
        else:
            real = {name: value for name, (value, _) in outputs.items()}
        if real is not None:
            result["real_outputs"] = real
    # The Stack's own key, which only the operator stores (executor.digest_key).
    key = bytes.fromhex(request.get("digest_key") or "") if any_secret and real is not None else b""
    digests = output_digests(outputs, real, key)
    result["output_digests"] = digests
    total = outputs_digest(outputs, digests)
    if total:
        result["outputs_digest"] = total
    return result


class UpdateBlocked(Exception):
    """A failure that retrying cannot fix; the message names what to change."""


def _file_backend_dir(env: dict[str, str]) -> Path | None:
    url = env.get("PULUMI_BACKEND_URL", "")
    if not url.startswith("file://"):
        return None
    parsed = urlparse(url)
    raw = unquote(parsed.netloc + parsed.path)
    return Path(os.path.expanduser(raw)).resolve() if raw not in ("", "~") else Path.home()


def _ensure_file_backend(root: Path) -> None:
    """Create a file:// backend's missing directory, private to the operator's user (as `make up` does
    for its own); one that cannot be created blocks the Stack, named with the reason."""
    if root.is_dir():
        return
    try:
        root.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not root.is_dir():
            raise UpdateBlocked(f"the file:// backend's directory {root} exists but is not a directory; remove "
                                "it or point spec.backend elsewhere") from None
    except OSError as err:
        raise UpdateBlocked(f"cannot create the file:// backend's directory {root}: {err.strerror}; "
                            f"create it for the operator's user (uid {os.getuid()}) or point spec.backend at a "
                            "directory that user can write") from None


def _stack_locks(root: Path, stack_name: str) -> list[Path]:
    return sorted((root / ".pulumi" / "locks").glob(f"**/{stack_name.split('/')[-1]}/*.json"))


def _lost_checkpoint_race(message: str, stack_name: str) -> bool:
    """A file:// backend stack being written by another update can fail to load ("failed to load
    checkpoint: EOF") before the lock check is reached: with that update's lock present, it is a conflict."""
    root = _file_backend_dir(dict(os.environ))
    return root is not None and "failed to load checkpoint" in message and bool(_stack_locks(root, stack_name))


def _recover_file_backend(root: Path, stack_name: str, host: str, since: float) -> list[str]:
    """Remove what a killed `pulumi up` leaves in a file:// backend, if it is provably that run's.

    A lock is ours when its hostname is the host the interrupted run was started on and it was taken
    after that run started; a zero-byte `<stack>.json.attrs` makes the next load fail with EOF.
    """
    leaf = stack_name.split("/")[-1]
    actions = []
    for lock in _stack_locks(root, stack_name):
        try:
            info = json.loads(lock.read_text() or "{}")
        except (OSError, ValueError):
            continue
        taken = info.get("timestamp", "")
        try:
            taken_at = datetime.fromisoformat(taken.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        if info.get("hostname") == host and taken_at >= since - 5:
            lock.unlink()
            actions.append(f"removed the interrupted run's lock (pid {info.get('pid')})")
    for attrs in sorted((root / ".pulumi" / "stacks").glob(f"**/{leaf}.json.attrs")):
        if attrs.stat().st_size == 0:
            attrs.unlink()
            actions.append("removed a truncated checkpoint attributes file")
    return actions


# The operations that need the program's environment: up and preview run the program, and all four load
# the providers in its state, a Python program's dynamic providers (pulumi-python) among them, which run
# in that environment.
ENVIRONMENT_OPERATIONS = ("up", "preview", "refresh", "destroy")


class EnvironmentBuild:
    """The program's environment (ensure_virtualenv), built in a thread beside the CLI runs that prepare the
    stack (`stack init`, `config set --secret`: about a second each), which need none of it; `wait` before
    the program runs. `seconds["environment"]` gets how long it took."""

    def __init__(self, project_dir: Path, cache: Path, bytecode: Path | None, seconds: dict[str, float]):
        self.project_dir, self.cache, self.bytecode, self.seconds = project_dir, cache, bytecode, seconds
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.venv: Path | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._build, name="environment", daemon=True)
        self.thread.start()

    def _build(self) -> None:
        started = time.monotonic()
        try:
            # HOME is the Stack's own directory (executor.AutomationEngine.worker_env).
            self.venv = ensure_virtualenv(self.project_dir, Path(os.environ["HOME"]).parent / "venvs", self.cache,
                                          bytecode=self.bytecode)
        except BaseException as err:  # noqa: BLE001 - handed to the thread that waits for it
            self.error = err
        self.seconds["environment"] = round(time.monotonic() - started, 3)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def wait(self) -> None:
        """Until the environment is ready; its failure raised here."""
        self.join()
        if self.error is not None:
            raise self.error

    def record_imported(self) -> None:
        """After the program ran: what it imported, for its key's next environments (bytecode.py)."""
        if self.venv is not None and self.bytecode is not None:
            with contextlib.suppress(OSError):
                record_imported(self.venv, self.bytecode)


def _run(request: dict[str, Any], pulumi_command: auto.PulumiCommand, seconds: dict[str, float]) -> dict[str, Any]:
    """Run the request's operation; `seconds` gets how long the program's environment took to be ready."""
    workdir = os.getcwd()
    operation = request["operation"]
    # Before anything runs the CLI: the virtualenv build may already need them (pulumi-flux's setup.py).
    link_plugins(cached_plugins(Path(request["plugin_cache"]), request["plugin_dirs"]),
                 Path(os.environ["PULUMI_HOME"]) / "plugins")
    backend = _file_backend_dir(dict(os.environ))
    if backend is not None and operation in ("up", "preview", "refresh") and request["create"]:
        _ensure_file_backend(backend)
    bytecode = request.get("bytecode_cache")
    environment = EnvironmentBuild(Path(workdir), Path(request["python_cache"]), Path(bytecode) if bytecode else None,
                                   seconds)
    if operation in ENVIRONMENT_OPERATIONS:
        # Built while the stack is prepared.
        environment.start()
    try:
        return _run_operation(request, pulumi_command, workdir, environment)
    finally:
        environment.join()
        environment.record_imported()


def _run_operation(request: dict[str, Any], pulumi_command: auto.PulumiCommand, workdir: str,
                   environment: EnvironmentBuild) -> dict[str, Any]:
    operation = request["operation"]
    name = request["stack_name"]
    workspace = auto.LocalWorkspace(work_dir=workdir, pulumi_home=os.environ.get("PULUMI_HOME"),
                                    secrets_provider=request["secrets_provider"] or None,
                                    pulumi_command=pulumi_command)
    known = KnownStack(Path(os.environ["HOME"]).parent / "known-stack.json", os.environ.get("PULUMI_BACKEND_URL", ""),
                       name)
    if operation == "recover":
        root = _file_backend_dir(dict(os.environ))
        if root is not None:
            actions = _recover_file_backend(root, name, request["interrupted_host"], request["interrupted_since"])
        else:
            try:
                auto.Stack.select(name, workspace).cancel()
                actions = ["cancelled the interrupted update in the backend"]
            except StackNotFoundError:  # the run failed before its stack reached the backend: no lock either
                actions = []
        result = {"outcome": "succeeded", "message": "; ".join(actions) or "nothing to recover"}
        finished = _finished_update(pulumi_command, workdir, name, request.get("interrupted_run", ""))
        if finished is None:
            return result
        # The run was interrupted after its update had succeeded (its status could not be written):
        # that update is the result, and running it again would be a second run of the same change.
        result.update(finished=True, summary=finished.get("resourceChanges") or {},
                      outputs=_cli_outputs(pulumi_command, workdir, name))
        return with_output_values(pulumi_command, request, workdir, result)
    if operation == "remove":
        workspace.remove_stack(name)
        known.forget()
        return {"outcome": "succeeded"}
    if operation == "outputs":
        return {"outcome": "succeeded", "outputs": _cli_outputs(pulumi_command, workdir, name)}

    create = request["create"] and operation != "destroy"
    ready = environment.wait
    if operation == "up":
        result = _on_stack(workspace, request, known, create, lambda: _up(pulumi_command, request, workdir), ready)
        return with_output_values(pulumi_command, request, workdir, result)
    if operation == "preview" and request["plan_file"]:
        return _on_stack(workspace, request, known, create, lambda: _save_plan(pulumi_command, request, workdir),
                         ready)
    if operation == "refresh" and request["preview_only"]:
        return _on_stack(workspace, request, known, False, lambda: _refresh_preview(pulumi_command, request, workdir),
                         ready)
    return _on_stack(workspace, request, known, create, lambda: _automation_operation(workspace, request), ready)


def _on_stack(workspace: auto.LocalWorkspace, request: dict[str, Any], known: KnownStack, create: bool,
              operation: Callable[[], dict[str, Any]], ready: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Prepare the stack, wait until `ready` (the program's environment), run `operation`; a stale record
    costs one more try after `stack init`."""
    remembered = known.settings()
    try:
        _prepare_stack(workspace, request, create and remembered is None, remembered or {})
        ready()
        result = operation()
    except StackNotFoundError:
        known.forget()
        if not create:
            raise
        _prepare_stack(workspace, request, True, {})
        ready()  # the first try may have stopped before it
        result = operation()
    known.remember(_secrets_settings(workspace.work_dir, request["stack_name"]))
    return result


def _automation_operation(workspace: auto.LocalWorkspace, request: dict[str, Any]) -> dict[str, Any]:
    """The less frequent operations (preview, refresh, destroy) through `auto.Stack`."""
    operation = request["operation"]
    stack = auto.Stack.select(request["stack_name"], workspace)
    targets = list(request["targets"]) or None
    message = request["message"] or None
    if operation == "preview":
        # A preview never writes state: its refresh is a preview too.
        if request["refresh"] and request["expect_no_refresh_changes"]:
            # PULUMI_SKIP_CONFIRMATIONS (set for every update) implies --yes, which --preview-only refuses.
            workspace.pulumi_command.run(["refresh", "--preview-only", "--expect-no-changes", "--non-interactive",
                                          "--stack", request["stack_name"],
                                          *[arg for target in targets or () for arg in ("--target", target)]],
                                         workspace.work_dir, {"PULUMI_SKIP_CONFIRMATIONS": "false"})
        preview = stack.preview(target=targets, target_dependents=request["target_dependents"] or None,
                                refresh=request["refresh"] or None, message=message,
                                expect_no_changes=request.get("expect_no_changes") or None,
                                replace=list(request.get("replace") or ()) or None,
                                parallel=request.get("parallel") or None)
        stdout, summary = preview.stdout, {k.value if hasattr(k, "value") else str(k): v
                                           for k, v in (preview.change_summary or {}).items()}
    elif operation == "refresh":
        refreshed = stack.refresh(target=targets, message=message,
                                  expect_no_changes=request.get("expect_no_changes") or None,
                                  parallel=request.get("parallel") or None,
                                  run_program=request["run_program"] or None)
        stdout, summary = refreshed.stdout, dict(refreshed.summary.resource_changes or {})
    else:
        destroyed = stack.destroy(target=targets, message=message, run_program=request["run_program"] or None,
                                  continue_on_error=request.get("continue_on_error") or None,
                                  parallel=request.get("parallel") or None)
        stdout, summary = destroyed.stdout, dict(destroyed.summary.resource_changes or {})
    return {"outcome": "succeeded", "permalink": _permalink(stdout), "summary": summary, "outputs": {},
            "engine_output": stdout}


def _enter(request: dict[str, Any]) -> None:
    """Become this Stack's worker: its environment only (nothing of the neutral start-up one), its own copy of
    the program as the working directory."""
    os.environ.clear()
    os.environ.update(request["worker_env"])
    os.environ.setdefault("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true")
    for directory in ("HOME", "PULUMI_HOME"):
        os.makedirs(os.environ[directory], exist_ok=True)
    request["project_dir"] = stage_project(request)
    os.chdir(request["project_dir"])


def stage_project(request: dict[str, Any]) -> str:
    """Copy the program's source (as the operator fetched it, which the run only reads) into the Stack's own
    scratch directory, where the run writes its stack settings and the engine its event log; returns the
    project's directory in the copy. Links are copied as links, never followed."""
    project = Path(request["project_dir"])
    source = Path(request.get("source_root") or project)
    scratch = Path(request["sandbox_dir"]) / "work"
    shutil.rmtree(scratch, ignore_errors=True)
    staged = scratch / source.name
    shutil.copytree(source, staged, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    kubeconfig = Path(os.environ.get("KUBECONFIG", ""))
    if kubeconfig.parent == source.parent and kubeconfig.is_file():
        # The run's layout, as the operator made it: the identity's kubeconfig beside the source.
        shutil.copy2(kubeconfig, scratch / kubeconfig.name)
        os.environ["KUBECONFIG"] = str(scratch / kubeconfig.name)
    return str(staged / project.relative_to(source))


def request_redactor(request: dict[str, Any]) -> Redactor:
    """Masks the request's secrets: its secret config and its environment entries from Secrets (plain
    values, such as the backend's path, stay readable in messages)."""
    redactor = Redactor()
    # The update's whole environment: in a workspace pod, the pod's own (Secrets the kubelet set) is in it.
    env = {**request["env"], **request.get("worker_env", {})}
    redactor.add(*request["secret_config"].values(), *(env[name] for name in request["secret_env"] if name in env))
    if "PULUMI_BACKEND_URL" in request["secret_env"]:
        # Errors name a file backend's directory, not its URL: from a secret URL, that is secret too.
        url = request["worker_env"].get("PULUMI_BACKEND_URL", "")
        root = _file_backend_dir({"PULUMI_BACKEND_URL": url})
        redactor.add(url.removeprefix("file://"), str(root) if root else "")
    return redactor


def failure_result(err: Exception, request: dict[str, Any]) -> dict[str, Any]:
    """The result line for a failed operation: blocked when retrying cannot fix it, else failed or conflict."""
    if isinstance(err, UpdateBlocked):
        return {"outcome": "blocked", "message": str(err)}
    if isinstance(err, ConcurrentUpdateError):
        return {"outcome": "conflict", "message": _failure_message(err)}
    if isinstance(err, StackNotFoundError):
        return {"outcome": "failed", "reason": STACK_NOT_FOUND, "message": _failure_message(err)}
    plugin = missing_plugin(f"{err}\n{getattr(err, 'output', '')}")
    if plugin is not None:
        cli_dir = os.environ.get("PATH", "").split(os.pathsep)[0]
        return {"outcome": "blocked",
                "message": missing_plugin_advice(plugin, Path(request["plugin_cache"]), cli_dir)}
    if isinstance(err, CommandError):
        message = _failure_message(err)
        flag = _UNKNOWN_FLAG.search(f"{err}")
        if flag is not None:
            return {"outcome": "blocked", "reason": PULUMI_VERSION_TOO_LOW,
                    "message": f"the operator's pulumi CLI does not know {flag.group(1)} ({message}); update the "
                               "CLI on the operator's PATH, or remove the spec field that asks for it"}
        if _lost_checkpoint_race(message, request["stack_name"]):
            return {"outcome": "conflict", "message": f"the stack is locked by another update ({message})"}
        return {"outcome": "failed", "message": message}
    if isinstance(err, PythonEnvError):
        # PKO's reason for a workspace whose dependencies do not install (retried like any failure here).
        return {"outcome": "failed", "reason": WORKSPACE_FAILED, "message": str(err)}
    return {"outcome": "failed", "message": f"{type(err).__name__}: {err}"}


# The operations that run the engine on the stack; `strata logs stack` shows the last one's output.
LOGGED_OPERATIONS = ("up", "preview", "refresh", "destroy")


def update_log(request: dict[str, Any], result: dict[str, Any], output: str, redactor: Redactor,
               seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """The record of this run for `strata logs stack`: its engine output, redacted, and how long it took
    (`seconds`: in all, and the program's environment). Sent back with the result: the operator keeps it."""
    return {"operation": request["operation"], "stack": request["stack_name"], "outcome": result["outcome"],
            "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "message": result.get("message", ""), "seconds": seconds or {}, "output": redactor.redact(output)}


class LockWatchingCommand(auto.PulumiCommand):
    """`command`, noting whether a CLI run may have left its lock in the backend: it could not delete it
    (the backend went away as it ended; the CLI only prints that, and exits 0 after an update that
    finished), or it was killed (the kernel's OOM killer, a kill -9) before it could. The lock left
    behind would refuse every later operation of the stack as a concurrent update."""

    LOCK_NOT_DELETED = "there was a problem deleting the lock at"
    KILLED = re.compile(r"^\s*code: -(\d+)$", re.MULTILINE)  # CommandError's text: a signal's exit code

    def __init__(self, command: auto.PulumiCommand):  # noqa: the parent's __init__ would run `pulumi version`
        self.command, self.version = command.command, command.version
        self.lock_left = False
        self.killed_by = ""  # the signal that killed a CLI run, if one did

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str], on_output: Any = None,
            on_error: Any = None) -> auto.CommandResult:
        try:
            result = super().run(args, cwd, additional_env, on_output, on_error)
        except CommandError as err:
            text = str(err)
            self.lock_left |= self.LOCK_NOT_DELETED in text
            killed = self.KILLED.search(text)
            # SIGINT is the engine's own cancel, which the CLI answers by releasing its lock.
            if killed is not None and int(killed.group(1)) != signal.SIGINT:
                self.lock_left, self.killed_by = True, _signal_name(int(killed.group(1)))
            raise
        self.lock_left |= self.LOCK_NOT_DELETED in result.stderr
        return result


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def handle(request: dict[str, Any], pulumi_command: auto.PulumiCommand) -> dict[str, Any]:
    """Run one request as this process's only job; every failure comes back as a result, redacted."""
    redactor = request_redactor(request)
    started = time.monotonic()
    seconds: dict[str, float] = {}
    command = LockWatchingCommand(pulumi_command)
    try:
        _enter(request)
        result = _run(request, command, seconds)
        output = result.pop("engine_output", "")
    except Exception as err:  # noqa: BLE001 - every failure must come back as a result line
        result = failure_result(err, request)
        # A CommandError's text is the CLI's stdout and stderr; anything else is its message.
        output = str(err)
    if command.lock_left:
        result["lock_left"] = True
    if command.killed_by and result["outcome"] != "succeeded":
        # Its own output says nothing of it: it was cut off.
        result["message"] = (f"the pulumi CLI was killed by {command.killed_by} during the {request['operation']} "
                             "(out of memory, or killed by hand); the lock it left in the backend is cleared "
                             "before the stack's next operation")
    result["message"] = redactor.redact(result.get("message", ""))
    if request["operation"] in LOGGED_OPERATIONS:
        seconds["total"] = round(time.monotonic() - started, 3)
        result["update_log"] = update_log(request, result, output, redactor, seconds)
    return result


def _serve_one(conn: socket.socket, pulumi_command: auto.PulumiCommand) -> None:
    """In a freshly forked child: become a session leader, say who we are, run the request, exit."""
    os.setsid()  # the engine interrupts the whole tree (this worker and its CLIs) with killpg
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess needs to reap its own children
    # The engine's SIGINT is for the CLI (it cancels the update cleanly); this driver waits for it.
    # A handler, not SIG_IGN, so the CLI does not inherit the disposition.
    signal.signal(signal.SIGINT, lambda *_: None)
    # Anything printed, tracebacks included, goes to the engine like the result line does; the fork
    # server's stdin (the operator's pipe) is not this worker's business.
    for fd in (1, 2):
        os.dup2(conn.fileno(), fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # Our pid in the kernel's credentials: the operator reads it translated out of a sandbox's PID namespace.
    pid = os.getpid()
    conn.sendmsg([f"{pid}\n".encode()],
                 [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, CREDENTIALS.pack(pid, os.getuid(), os.getgid()))])
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    result = handle(json.loads(b"".join(chunks)), pulumi_command)
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


class KnownVersionPulumiCommand(auto.PulumiCommand):
    """The `pulumi` on PATH, whose version is already known: PulumiCommand's constructor runs `pulumi
    version` to learn it, a CLI start (0.4 s of CPU) in every workspace pod, for what the image records."""

    def __init__(self, version: str):  # noqa: the parent's __init__ is the CLI run this saves
        self.command = "pulumi"
        self.version = VersionInfo.parse(version.removeprefix("v"))


def pulumi_command_for(environ: Mapping[str, str]) -> auto.PulumiCommand:
    known = environ.get(IMAGE_PULUMI_VERSION, "")
    return KnownVersionPulumiCommand(known) if known else auto.PulumiCommand()


def serve(listen_fd: int) -> int:
    """The fork server: imports and the CLI's version probe paid once; each connection is one request,
    run in a child forked for it (milliseconds, where a new interpreter costs ~0.3 s of CPU).

    It accepts on the listening socket the operator made and handed over as a descriptor (its path is in no
    sandbox). This process never reads a request, so no Stack's environment or secret is ever in the memory
    the children inherit. It exits when the operator goes away (its stdin closes).
    """
    os.environ.setdefault("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true")
    pulumi_command = pulumi_command_for(os.environ)
    listener = socket.socket(fileno=listen_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the operator's Ctrl-C is for the operator
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(sys.stdin, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is sys.stdin:  # EOF: the operator is gone
                    listener.close()
                    return 0
                conn, _ = listener.accept()
                if os.fork() == 0:
                    try:
                        listener.close()
                        _serve_one(conn, pulumi_command)
                    finally:
                        os._exit(0)
                conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The process executor's worker fork server.")
    parser.add_argument("--listen-fd", type=int, required=True, help="the listening socket, inherited")
    sys.exit(serve(parser.parse_args().listen_fd))
