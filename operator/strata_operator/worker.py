"""One engine operation, run as `python -m strata_operator.worker` by `AutomationEngine`.

Reads an `UpdateRequest` (JSON, with its operation) on stdin, drives `pulumi.automation` against the
`pulumi` CLI on PATH in the current directory (the project), and prints one result line prefixed
with `STRATA-RESULT `. Its environment is only the Stack's own; its exit does not matter, the
result line does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pulumi import automation as auto
from pulumi.automation.errors import CommandError, ConcurrentUpdateError

from .engine import RESULT_PREFIX
from .pythonenv import ensure_virtualenv
from .redaction import Redactor

_PERMALINK = re.compile(r"(?:View (?:Live|in Browser)|Permalink)[^:]*:\s+(https?://\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "error: ..." at the start of a diagnostic or after a progress prefix; YAML program errors say "Error:".
_ERROR_LINE = re.compile(r"^(?:.*\s)?error:\s*(.+)$", re.I)
# The items of "N errors occurred:", which carry the actual causes.
_ERROR_ITEM = re.compile(r"^\s*\*\s+(.+)$")
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


def _set_config(stack: auto.Stack, workdir: str, request: dict[str, Any]) -> None:
    """Plain config in one CLI call (JSON values allowed); secrets one by one on stdin, never in argv."""
    plain = {key: ({"value": value} if isinstance(value, str) else {"value": json.dumps(value), "objectValue": value})
             | {"secret": False} for key, value in request["config"].items()}
    if plain:
        stack.workspace.set_all_config_json(stack.name, json.dumps(plain))
    for key, value in request["secret_config"].items():
        done = subprocess.run(["pulumi", "config", "set", "--secret", "--stack", stack.name, "--non-interactive", key],
                              input=value, capture_output=True, text=True, cwd=workdir)
        if done.returncode != 0:
            raise RuntimeError(f"setting secret config {key!r} failed: {done.stderr.strip()}")


def _file_backend_dir(env: dict[str, str]) -> Path | None:
    url = env.get("PULUMI_BACKEND_URL", "")
    if not url.startswith("file://"):
        return None
    parsed = urlparse(url)
    raw = unquote(parsed.netloc + parsed.path)
    return Path(os.path.expanduser(raw)).resolve() if raw not in ("", "~") else Path.home()


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


def _run(request: dict[str, Any], pulumi_command: auto.PulumiCommand) -> dict[str, Any]:
    workdir = os.getcwd()
    operation = request["operation"]
    if operation in ("up", "preview"):
        # Only these run the program. HOME is the Stack's own directory (engine.worker_env).
        ensure_virtualenv(Path(workdir), Path(os.environ["HOME"]).parent / "venvs")
    workspace = auto.LocalWorkspace(work_dir=workdir, pulumi_home=os.environ.get("PULUMI_HOME"),
                                    secrets_provider=request["secrets_provider"] or None,
                                    pulumi_command=pulumi_command)
    if operation == "recover":
        root = _file_backend_dir(dict(os.environ))
        if root is not None:
            actions = _recover_file_backend(root, request["stack_name"], request["interrupted_host"],
                                            request["interrupted_since"])
        else:
            auto.Stack.select(request["stack_name"], workspace).cancel()
            actions = ["cancelled the interrupted update in the backend"]
        return {"outcome": "succeeded", "message": "; ".join(actions) or "nothing to recover"}
    if operation == "remove":
        workspace.remove_stack(request["stack_name"])
        return {"outcome": "succeeded"}

    if request["create"] and operation != "destroy":
        stack = auto.Stack.create_or_select(request["stack_name"], workspace)
    else:
        stack = auto.Stack.select(request["stack_name"], workspace)
    if operation != "outputs":
        _set_config(stack, workdir, request)
        if request["environments"]:
            stack.add_environments(*request["environments"])
    targets = list(request["targets"]) or None
    message = request["message"] or None
    stdout = ""
    summary: dict[str, int] = {}
    outputs: dict[str, auto.OutputValue] | None = None
    if request["refresh"] and operation in ("up", "preview"):
        stack.refresh(expect_no_changes=request["expect_no_refresh_changes"] or None, message=message)
    if operation == "up":
        result = stack.up(target=targets, target_dependents=request["target_dependents"] or None, message=message)
        # up() already read the outputs; reading them again costs two more CLI runs.
        stdout, summary, outputs = result.stdout, dict(result.summary.resource_changes or {}), result.outputs
    elif operation == "preview":
        preview = stack.preview(target=targets, target_dependents=request["target_dependents"] or None,
                                message=message)
        stdout, summary = preview.stdout, {k.value if hasattr(k, "value") else str(k): v
                                           for k, v in (preview.change_summary or {}).items()}
    elif operation == "refresh":
        refreshed = stack.refresh(target=targets, message=message)
        stdout, summary = refreshed.stdout, dict(refreshed.summary.resource_changes or {})
    elif operation == "destroy":
        destroyed = stack.destroy(target=targets, message=message)
        stdout, summary = destroyed.stdout, dict(destroyed.summary.resource_changes or {})
    if operation in ("preview", "destroy"):
        outputs = {}
    elif outputs is None:
        outputs = stack.outputs()
    return {"outcome": "succeeded", "permalink": _permalink(stdout), "summary": summary,
            "outputs": {name: {"value": out.value, "secret": out.secret} for name, out in outputs.items()}}


def _enter(request: dict[str, Any]) -> None:
    """Become this Stack's worker: its environment only (nothing of the neutral start-up one), its workdir."""
    os.environ.clear()
    os.environ.update(request["worker_env"])
    os.environ.setdefault("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true")
    os.chdir(request["project_dir"])


def main() -> int:
    # Started ahead of need with a neutral environment: the imports above and the CLI's version probe
    # are paid while waiting. The request (with the Stack's environment and secrets) comes on stdin.
    os.environ.setdefault("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true")
    pulumi_command = auto.PulumiCommand()
    payload = sys.stdin.read()
    if not payload:
        return 0  # the operator went away before handing this spare worker a request
    request = json.loads(payload)
    redactor = Redactor()
    redactor.add(*request["secret_config"].values(), *request["env"].values())
    _enter(request)
    try:
        result = _run(request, pulumi_command)
    except ConcurrentUpdateError as err:
        result = {"outcome": "conflict", "message": _failure_message(err)}
    except CommandError as err:
        message = _failure_message(err)
        if _lost_checkpoint_race(message, request["stack_name"]):
            result = {"outcome": "conflict", "message": f"the stack is locked by another update ({message})"}
        else:
            result = {"outcome": "failed", "message": message}
    except Exception as err:  # noqa: BLE001 - every failure must come back as a result line
        result = {"outcome": "failed", "message": f"{type(err).__name__}: {err}"}
    result["message"] = redactor.redact(result.get("message", ""))
    for output in result.get("outputs", {}).values():
        if output["secret"]:
            # Secret outputs never leave the worker with their value.
            output["value"] = None
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
