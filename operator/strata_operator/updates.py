"""PKO v2's Workspace and Update API (`auto.pulumi.com/v1alpha1`) on the engine port.

A Workspace is materialised for the process executor: its program fetched into a workdir under the
operator's state directory (git, a Flux artifact URL, a host directory, or projectInfo alone), its
env references checked, status `Ready` as PKO writes it. An Update runs exactly one operation
(preview, up, refresh, destroy) of `spec.stackName` in its Workspace, through `engine.Engine` only,
and records it as PKO v2 does: conditions Progressing/Failed/Complete with PKO's reasons, startTime,
endTime, message, permalink, projectInfo, the outputs of an up in an immutable Secret
`<update>-stack-outputs` it owns, and its deletion `ttlAfterCompleted` after completing.

An Update runs once. A completed one is never run again (a restart sees Complete=True); one found
Progressing with no run in this process was interrupted and is marked Failed/Aborted, as PKO does.
Nothing here patches the objects themselves (no finalizers, no Kopf annotations): only their status.
Importing this module registers the Kopf handlers (main.run does, beside `handlers`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import re
import logging
import shutil
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from .engine import UpdateRequest, UpdateResult
from .redaction import REDACTOR, redact
from .resolve import RefError
from .sources import SourceError, project_info
from .spec import SpecInvalid, SpecIssue, parse_duration
from .status import WORKSPACE_FAILED, rfc3339
from .workspace import WORKSPACE_SUFFIX
from .workspaces import (AUTO_GROUP, AUTO_VERSION, SECRET_VARIABLES, LocalSource, WorkspaceSpec, git_credentials,
                         literal_env, materialise, misplaced_backend, not_applicable, parse_workspace, resolve_env,
                         stack_config)

UPDATE_TYPES = ("preview", "up", "refresh", "destroy")
PROGRESSING, FAILED, COMPLETE, READY, STALLED = "Progressing", "Failed", "Complete", "Ready", "Stalled"
# PKO's labels and annotation on an Update's outputs Secret.
COMPONENT_LABEL, UPDATE_NAME_LABEL = "auto.pulumi.com/component", "auto.pulumi.com/update-name"
SECRET_OUTPUTS_ANNOTATION = "pulumi.com/secrets"
_SECRET_KEY_CHARS = re.compile(r"[^-._a-zA-Z0-9]")
# What PKO's events say, per operation: (past tense for success, verb for failure).
_WORDS = {"preview": ("Previewed", "preview"), "up": ("Updated", "update"), "refresh": ("Refreshed", "refresh"),
          "destroy": ("Destroyed", "destroy")}
RETRY_SECONDS = (10.0, 30.0, 60.0, 120.0, 300.0)
MARKER = "current.json"


def _now() -> datetime:
    return datetime.now(timezone.utc)


# --- pure: the Update's spec and status ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    workspace_name: str
    stack_name: str
    type: str
    ttl_seconds: float | None = None
    parallel: int = 0
    message: str = ""
    expect_no_changes: bool = False
    replace: tuple[str, ...] = ()
    target: tuple[str, ...] = ()
    target_dependents: bool = False
    refresh: bool = False
    continue_on_error: bool = False
    remove: bool = False
    run_program: bool = False


def parse_update(raw: dict[str, Any] | None) -> UpdateSpec:
    """An Update's spec; SpecInvalid names each field that cannot run and its fix."""
    raw = raw or {}
    issues = []
    kind = raw.get("type") or ""
    if kind not in UPDATE_TYPES:
        issues.append(SpecIssue("spec.type", f"{kind!r} is not an operation", f"use one of {', '.join(UPDATE_TYPES)}"))
    if not raw.get("workspaceName"):
        issues.append(SpecIssue("spec.workspaceName", "empty", "name the Workspace in this namespace to update"))
    if not raw.get("stackName"):
        issues.append(SpecIssue("spec.stackName", "empty", "name the Pulumi stack to select (e.g. dev)"))
    ttl = None
    if raw.get("ttlAfterCompleted"):
        try:
            ttl = parse_duration(str(raw["ttlAfterCompleted"]))
        except ValueError:
            issues.append(SpecIssue("spec.ttlAfterCompleted", f"{raw['ttlAfterCompleted']!r} is not a duration",
                                    "write a Go duration such as 90s, 10m or 1h"))
    parallel = int(raw.get("parallel") or 0)
    if parallel < 0:
        issues.append(SpecIssue("spec.parallel", "negative", "give 1 or more, or leave it out for no limit"))
    if issues:
        raise SpecInvalid(issues)
    return UpdateSpec(str(raw["workspaceName"]), str(raw["stackName"]), kind, ttl, parallel, str(raw.get("message") or ""),
                      bool(raw.get("expectNoChanges")), tuple(raw.get("replace") or ()), tuple(raw.get("target") or ()),
                      bool(raw.get("targetDependents")), bool(raw.get("refresh")), bool(raw.get("continueOnError")),
                      bool(raw.get("remove")), bool(raw.get("runProgram")))


def condition(status: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == ctype), None)


def is_true(status: dict[str, Any] | None, ctype: str) -> bool:
    return (condition(status, ctype) or {}).get("status") == "True"


def set_conditions(previous: list[dict[str, Any]] | None, wanted: list[tuple[str, str, str, str]], generation: int,
                   now: datetime) -> list[dict[str, Any]]:
    """meta.SetStatusCondition for each (type, status, reason, message): lastTransitionTime moves only when
    the status flips; conditions of other types stay."""
    result = [dict(c) for c in previous or []]
    for ctype, status, reason, message in wanted:
        old = next((c for c in result if c.get("type") == ctype), None)
        new = {"type": ctype, "status": status, "reason": reason, "message": message,
               "observedGeneration": generation,
               "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status
               else rfc3339(now)}
        if old is None:
            result.append(new)
        else:
            old.clear()
            old.update(new)
    return result


def progressing() -> list[tuple[str, str, str, str]]:
    return [(PROGRESSING, "True", "Progressing", ""), (FAILED, "False", "Progressing", ""),
            (COMPLETE, "False", "Progressing", "")]


def waiting(reason: str) -> list[tuple[str, str, str, str]]:
    """Not started: WorkspaceNotFound or WorkspaceNotReady (PKO retries when the Workspace turns Ready)."""
    return [(PROGRESSING, "False", reason, ""), (FAILED, "False", "Progressing", ""),
            (COMPLETE, "False", "Progressing", "")]


def finished(failed_reason: str | None) -> list[tuple[str, str, str, str]]:
    """Complete, succeeded (None) or failed with PKO's reason (Unknown, UpdateConflict, ...)."""
    failed = ("False", "UpdateSucceeded") if failed_reason is None else ("True", failed_reason)
    return [(PROGRESSING, "False", "Complete", ""), (FAILED, *failed, ""), (COMPLETE, "True", "Updated", "")]


def aborted(reason: str) -> list[tuple[str, str, str, str]]:
    """PKO's markFailed: Aborted (interrupted), Canceled, or Strata's SpecInvalid."""
    return [(PROGRESSING, "False", "Failed", ""), (FAILED, "True", reason, ""), (COMPLETE, "True", "Failed", "")]


def failure_reason(result: UpdateResult) -> str:
    """PKO's Failed reason for an engine failure: its known errors, else the gRPC code Unknown."""
    if result.outcome == "conflict":
        return "UpdateConflict"
    if result.outcome == "cancelled":
        return "Canceled"
    if "invalid access token" in result.message:
        return "InvalidAccessToken"
    return "Unknown"


def ttl_remaining(status: dict[str, Any] | None, ttl_seconds: float | None, now: datetime) -> float | None:
    """Seconds until a completed Update is due for deletion (<= 0: now); None when it is kept."""
    complete = condition(status, COMPLETE)
    if ttl_seconds is None or not complete or complete.get("status") != "True":
        return None
    since = datetime.strptime(complete["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return (since + timedelta(seconds=ttl_seconds) - now).total_seconds()


def _go_json(value: Any) -> bytes:
    """json.Marshal's bytes: compact, map keys sorted, <>& escaped as Go escapes them."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def outputs_secret(namespace: str, name: str, uid: str, outputs: dict[str, tuple[Any, bool]],
                   real: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """PKO's `<update>-stack-outputs` Secret: immutable, one key per output (its name with characters a
    Secret key cannot hold replaced by _) holding the value's JSON, the secret ones listed in the
    annotation pulumi.com/secrets, owned by the Update. Also the outputs left out: secret ones whose
    real value could not be read."""
    data, secrets, missing = {}, [], []
    for output, (value, secret) in sorted(outputs.items()):
        if secret and (real is None or output not in real):
            missing.append(output)
            continue
        key = _SECRET_KEY_CHARS.sub("_", output)
        data[key] = base64.b64encode(_go_json(real[output] if secret else value)).decode()  # type: ignore[index]
        if secret:
            secrets.append(key)
    body = {"apiVersion": "v1", "kind": "Secret", "immutable": True, "data": data,
            "metadata": {"name": f"{name}-stack-outputs", "namespace": namespace,
                         "labels": {COMPONENT_LABEL: "update", UPDATE_NAME_LABEL: name},
                         "annotations": {SECRET_OUTPUTS_ANNOTATION: json.dumps(sorted(secrets), separators=(",", ":"))},
                         "ownerReferences": [{"apiVersion": f"{AUTO_GROUP}/{AUTO_VERSION}", "kind": "Update",
                                              "name": name, "uid": uid}]}}
    return body, missing


def workspace_key(namespace: str, name: str) -> str:
    """The engine's unit of mutual exclusion and state (PULUMI_HOME, ...) for a Workspace: '@' is in no
    Kubernetes name, so it never meets a Stack's `<namespace>/<name>`."""
    return f"{namespace}/{name}{WORKSPACE_SUFFIX}"


def workspace_ready(workspace: dict[str, Any] | None) -> bool:
    """PKO's isWorkspaceReady: not being deleted, status for the current generation, Ready=True."""
    if not workspace or workspace.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = workspace.get("status") or {}
    return status.get("observedGeneration") == workspace["metadata"].get("generation") and is_true(status, READY)


# --- state of this process ------------------------------------------------------------------------


@dataclasses.dataclass
class ObjectLoop:
    """One object's passes, one at a time: the latest body is handed to `run`, which returns seconds
    until the next pass (None: only when woken)."""

    run: Any
    body: Any = None
    wakeup: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    seen: tuple[Any, ...] = ()

    def feed(self, body: Any, intent: tuple[Any, ...]) -> None:
        self.body = body
        if intent != self.seen:
            self.seen = intent
            self.wakeup.set()
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self.wakeup.clear()
            delay = await self.run(self.body)
            if delay == 0.0:
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=delay)


@dataclasses.dataclass
class AutoState:
    workspaces: dict[tuple[str, str], ObjectLoop] = dataclasses.field(default_factory=dict)
    failures: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    runs: dict[tuple[str, str], asyncio.Task] = dataclasses.field(default_factory=dict)
    # Updates this process finished (uid): stale events of their own earlier status never re-run them.
    done: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    expiring: dict[tuple[str, str], asyncio.Task] = dataclasses.field(default_factory=dict)
    # Updates waiting for their Workspace (namespace, workspace) -> names.
    waiting: dict[tuple[str, str], set[str]] = dataclasses.field(default_factory=dict)
    # Updates between their first status write and their run (or waiting): Workspace cleanup leaves theirs.
    using: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    pulumi_version: str = ""


def _state(memo: kopf.Memo) -> AutoState:
    return memo.auto


def _event(body: Any, reason: str, message: str, warning: bool = False) -> None:
    kopf.event(body, type="Warning" if warning else "Normal", reason=reason, message=redact(message)[:1024])


async def _patch_status(ctx: Any, plural: str, body: Any, status: dict[str, Any]) -> bool:
    meta = body["metadata"]
    clean = {key: redact(value) if isinstance(value, str) else value for key, value in status.items()}
    if "conditions" in clean:
        clean["conditions"] = [{**c, "message": redact(c["message"])} for c in clean["conditions"]]
    return await ctx.kube.patch_custom_status(AUTO_GROUP, AUTO_VERSION, plural, meta["namespace"], meta["name"], clean)


# --- Workspaces ---------------------------------------------------------------------------------


def _workspace_dir(ctx: Any, namespace: str, name: str) -> Path:
    return ctx.settings.engine.state_dir / "workspaces" / namespace / name


@dataclasses.dataclass(frozen=True)
class Program:
    """Where a Workspace's program is, for its current generation: fetched by this process (`project`,
    inside `source_root`), or a directory of its workspace pod (`local_dir`: spec.local, pod executor)."""

    project: Path | None = None
    source_root: Path | None = None
    local_dir: str = ""


def materialised_program(ctx: Any, workspace: dict[str, Any]) -> Program | None:
    """The program this process made ready for the Workspace's current generation, if any."""
    meta = workspace["metadata"]
    try:
        marker = json.loads((_workspace_dir(ctx, meta["namespace"], meta["name"]) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("uid") != meta.get("uid") or marker.get("generation") != meta.get("generation"):
        return None
    if marker.get("local_dir"):  # a pod's directory: nothing this process can run (the executor changed)
        return Program(local_dir=marker["local_dir"]) if ctx.engine.in_workspace_pods else None
    project = Path(marker.get("project", ""))
    return Program(project, Path(marker.get("source_root") or project)) if project.is_dir() else None


async def _pulumi_version(ctx: Any, state: AutoState) -> str:
    if not state.pulumi_version:
        with contextlib.suppress(Exception):
            process = await asyncio.create_subprocess_exec(
                str(ctx.settings.engine.pulumi_cli()), "version", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "PULUMI_SKIP_UPDATE_CHECK": "true",
                                                        "HOME": str(ctx.settings.engine.state_dir / "worker")})
            out, _ = await asyncio.wait_for(process.communicate(), 30)
            state.pulumi_version = out.decode().strip().lstrip("v")
    return state.pulumi_version


async def reconcile_workspace(ctx: Any, state: AutoState, body: Any, logger: Any) -> float | None:
    """One pass over a Workspace: the program fetched for its generation, or why not."""
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation") or 0)
    key = (namespace, name)
    status = dict(body.get("status") or {})

    async def write(ready: tuple[str, str, str], stalled: tuple[str, str, str] | None = None, **fields: Any) -> None:
        conditions = set_conditions(status.get("conditions"), [(READY, *ready)], generation, _now())
        if stalled is not None:
            conditions = set_conditions(conditions, [(STALLED, *stalled)], generation, _now())
        else:
            conditions = [c for c in conditions if c["type"] != STALLED]
        patch = {"observedGeneration": generation, "conditions": conditions, **fields}
        if any(status.get(k) != v for k, v in patch.items()):
            if await _patch_status(ctx, "workspaces", body, patch):
                status.update(patch)

    if meta.get("deletionTimestamp"):
        await write(("False", "Deleting", "Workspace is being deleted"))
        return None
    raw = dict(body.get("spec") or {})
    in_pods = ctx.engine.in_workspace_pods
    ignored = not_applicable(raw, in_pods)
    if (status.get("ignoredFields") or []) != ignored and ignored:
        why = "its workspace pod has no Service and logs at its own level" if in_pods else \
            "the process executor runs updates on the operator's host: they configure PKO's workspace pod"
        _event(body, "NotApplicable", f"accepted but not applicable ({why}): {', '.join(ignored)}", warning=True)
    try:
        spec = parse_workspace(raw)
    except SpecInvalid as err:
        if (condition(status, STALLED) or {}).get("message") != redact(str(err)):
            _event(body, "StackInitializationFailure", str(err), warning=True)
        await write(("False", "SpecInvalid", str(err)), ("True", "SpecInvalid", str(err)), ignoredFields=ignored or None)
        return None
    program = materialised_program(ctx, body)
    if program is not None and workspace_ready(body):
        _wake_waiting(ctx, state, namespace, name)
        return None

    def retry() -> float:
        count = state.failures.get(key, 0)
        state.failures[key] = count + 1
        return RETRY_SECONDS[min(count, len(RETRY_SECONDS) - 1)]

    try:
        # The pod executor's pod reads its Secrets itself (the kubelet): the operator sees plain values only.
        env = literal_env(spec) if in_pods else \
            (await resolve_env(spec, namespace, ctx.kube.secret_data, ctx.kube.configmap_data)).env
        creds = await git_credentials(getattr(spec.source, "auth", None), namespace, ctx.kube.secret_data)
    except RefError as err:
        await write(("False", "WaitingForReference", str(err)), ignoredFields=ignored or None)
        return retry()
    problem = misplaced_backend(raw, env, in_pods)
    invalid = [problem] if problem else []
    for stack in spec.stacks if not in_pods else ():  # the pod's agent resolves them, from its environment
        try:
            stack_config(stack, env)
        except RefError as err:
            invalid.append(SpecIssue(str(err).split(":")[0], str(err).split(": ", 1)[-1],
                                     "set that variable in spec.env or spec.envFrom"))
    if invalid:
        message = "; ".join(str(i) for i in invalid)
        reason = "SpecInvalid" if problem else "InitializationFailed"
        if (condition(status, STALLED) or {}).get("message") != redact(message):
            _event(body, "StackInitializationFailure", message, warning=True)
        await write(("False", reason, message), ("True", reason, message), ignoredFields=ignored or None)
        return None

    if program is None:
        await write(("False", "Initializing", "Fetching the program"), ignoredFields=ignored or None)
        try:
            program, revision = await _fetch_program(ctx, state, spec, namespace, name, generation, meta, creds)
        except SourceError as err:
            if (condition(status, READY) or {}).get("message") != redact(str(err)):
                _event(body, "SourceUnavailable", str(err), warning=True)
            await write(("False", "SourceUnavailable", str(err)), ignoredFields=ignored or None)
            return retry()
        _event(body, "Initialized", f"Initialized workspace {name!r} at {revision}")
    if in_pods:
        await write(("False", "Initializing", "Starting the workspace pod"), ignoredFields=ignored or None)
        failure = await ctx.engine.prepare(workspace_request(namespace, name, raw, spec, program))
        if failure:
            if (condition(status, READY) or {}).get("message") != redact(failure):
                _event(body, WORKSPACE_FAILED, failure, warning=True)
            await write(("False", WORKSPACE_FAILED, failure), ignoredFields=ignored or None)
            return retry()
    state.failures.pop(key, None)
    await write(("True", "Succeeded", ""), pulumiVersion=await _pulumi_version(ctx, state) or None,
                ignoredFields=ignored or None)
    logger.info("workspace %s/%s ready", namespace, name)
    _wake_waiting(ctx, state, namespace, name)
    return None


async def _fetch_program(ctx: Any, state: AutoState, spec: WorkspaceSpec, namespace: str, name: str, generation: int,
                         meta: dict[str, Any], creds: Any) -> tuple[Program, str]:
    """The program of this generation, made ready and recorded (the marker); SourceError says why not.
    A pod executor's spec.local is a directory of the pod itself: nothing to fetch."""
    root = _workspace_dir(ctx, namespace, name)
    dest = root / f"{generation}-{uuid.uuid4().hex[:8]}"
    marker: dict[str, Any] = {"uid": meta.get("uid"), "generation": meta.get("generation")}
    if ctx.engine.in_workspace_pods and isinstance(spec.source, LocalSource):
        program, revision = Program(local_dir=spec.source.dir), f"local:{spec.source.dir}"
        marker["local_dir"] = spec.source.dir
        dest.mkdir(parents=True, exist_ok=True)
    else:
        try:
            project, revision = await asyncio.to_thread(materialise, spec, dest / "src", creds,
                                                        ctx.settings.allow_operator_refs)
        except SourceError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        program = Program(project, dest / "src")
        marker.update(project=str(project), source_root=str(dest / "src"))
    marker["revision"] = revision
    partial = root / (MARKER + ".partial")
    partial.write_text(json.dumps(marker))
    partial.replace(root / MARKER)
    _remove_old_workdirs(ctx, state, root, dest, namespace, name)
    return program, revision


def _remove_old_workdirs(ctx: Any, state: AutoState, root: Path, keep: Path, namespace: str, name: str) -> None:
    """Earlier generations' programs go, unless an Update of this Workspace is under way."""
    if ctx.engine.busy(workspace_key(namespace, name)) or state.using.get((namespace, name)):
        return
    for entry in root.iterdir():
        if entry.is_dir() and entry != keep:
            shutil.rmtree(entry, ignore_errors=True)


def _wake_waiting(ctx: Any, state: AutoState, namespace: str, workspace: str) -> None:
    names = state.waiting.pop((namespace, workspace), set())
    for name in names:
        asyncio.create_task(_restart_update(ctx, state, namespace, name))


async def _restart_update(ctx: Any, state: AutoState, namespace: str, name: str) -> None:
    body = await ctx.kube.get_custom(AUTO_GROUP, AUTO_VERSION, "updates", namespace, name)
    if body is not None:
        _handle_update(ctx, state, body)


# --- Updates ------------------------------------------------------------------------------------


def _handle_update(ctx: Any, state: AutoState, body: Any) -> None:
    """Decide what an Update event means; anything long runs in a task of its own."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    status = body.get("status") or {}
    if key in state.runs and not state.runs[key].done():
        return
    if meta["name"] in state.waiting.get((key[0], (body.get("spec") or {}).get("workspaceName")), ()):
        return  # started when its Workspace turns Ready (_wake_waiting)
    if state.done.get(key) == meta.get("uid") or is_true(status, COMPLETE):
        _schedule_expiry(ctx, state, body)
        return
    if is_true(status, PROGRESSING):
        # Progressing with no run here: the run was interrupted (operator restart). PKO: Aborted.
        state.runs[key] = _logged(_abort(ctx, state, body), key)
        return
    state.runs[key] = _logged(run_update(ctx, state, body), key)


LOG = logging.getLogger("strata_operator.updates")


def _logged(coroutine: Any, key: tuple[str, str]) -> asyncio.Task:
    """A task whose failure (a bug, the API unreachable) is logged; the Update is then found Progressing
    with no run, and marked Aborted, as PKO does after a failed reconcile."""
    def report(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            err = task.exception()
            LOG.error("[%s/%s] update failed: %s", *key, redact(f"{err.__class__.__name__}: {err}"))
    task = asyncio.create_task(coroutine)
    task.add_done_callback(report)
    return task


async def _abort(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    message = "the update was interrupted (operator restart) and is not run again; create a new Update"
    status = body.get("status") or {}
    patch = {"observedGeneration": meta.get("generation"), "message": message, "endTime": rfc3339(_now()),
             "conditions": set_conditions(status.get("conditions"), aborted("Aborted"), meta.get("generation", 0),
                                          _now())}
    _event(body, "UpdateFailed", f"Update {meta['name']!r} was interrupted: {message}", warning=True)
    await _finish(ctx, state, body, patch)


async def _finish(ctx: Any, state: AutoState, body: Any, patch: dict[str, Any]) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    if await _patch_status(ctx, "updates", body, patch):
        state.done[key] = meta.get("uid", "")
        _schedule_expiry(ctx, state, {**body, "status": {**(body.get("status") or {}), **patch}})


def _schedule_expiry(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    try:
        ttl = parse_update(body.get("spec")).ttl_seconds
    except SpecInvalid:
        ttl = None
    remaining = ttl_remaining(body.get("status"), ttl, _now())
    if remaining is None or (key in state.expiring and not state.expiring[key].done()):
        return

    async def expire() -> None:
        await asyncio.sleep(max(0.0, remaining))
        # As PKO: the Event first, while the Update still exists, then the deletion.
        _event(body, "UpdateExpired", "ttl expired and was deleted")
        await ctx.kube.delete_custom(AUTO_GROUP, AUTO_VERSION, "updates", meta["namespace"], meta["name"],
                                     uid=meta.get("uid", ""))

    state.expiring[key] = asyncio.create_task(expire())


async def run_update(ctx: Any, state: AutoState, body: Any) -> None:
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation") or 0)
    status = dict(body.get("status") or {})

    async def write(conditions: list[tuple[str, str, str, str]], **fields: Any) -> None:
        patch = {"observedGeneration": generation,
                 "conditions": set_conditions(status.get("conditions"), conditions, generation, _now()), **fields}
        await _patch_status(ctx, "updates", body, patch)
        status.update(patch)

    try:
        spec = parse_update(body.get("spec"))
    except SpecInvalid as err:
        _event(body, "UpdateFailed", str(err), warning=True)
        await _finish(ctx, state, body, {"observedGeneration": generation, "message": redact(str(err)),
                                         "conditions": set_conditions(status.get("conditions"), aborted("SpecInvalid"),
                                                                      generation, _now())})
        return
    await write(progressing())
    workspace = await ctx.kube.get_custom(AUTO_GROUP, AUTO_VERSION, "workspaces", namespace, spec.workspace_name)
    program = materialised_program(ctx, workspace) if workspace is not None else None
    if workspace is None or not workspace_ready(workspace) or program is None:
        state.waiting.setdefault((namespace, spec.workspace_name), set()).add(name)
        await write(waiting("WorkspaceNotFound" if workspace is None else "WorkspaceNotReady"))
        if workspace is not None and workspace_ready(workspace):
            # Ready, but fetched by another process (or before a restart): fetch it here.
            loop = state.workspaces.get((namespace, spec.workspace_name))
            if loop is not None:
                loop.wakeup.set()
        return
    ws_key = (namespace, spec.workspace_name)
    state.using[ws_key] = state.using.get(ws_key, 0) + 1
    run_dir = _workspace_dir(ctx, namespace, spec.workspace_name) / "runs" / f"{name}-{uuid.uuid4().hex[:6]}"
    try:
        started = _now()
        result, request = await _run_engine(ctx, spec, workspace, namespace, program, run_dir)
        ended = _now()
        fields: dict[str, Any] = {"startTime": rfc3339(started), "endTime": rfc3339(ended)}
        info = project_info(program.project) if program.project else None
        if info:
            fields["projectInfo"] = info
        if result.permalink:
            fields["permalink"] = result.permalink
        past, verb = _WORDS[spec.type]
        if result.ok and spec.type == "destroy" and spec.remove and request is not None:
            removed = await ctx.engine.remove_stack(request)
            if not removed.ok:
                result = dataclasses.replace(removed, message=f"the stack was destroyed but not removed: {removed.message}")
        problem = None
        if result.ok and spec.type == "up" and result.outputs:
            problem = await _write_outputs(ctx, body, result)
            if problem is None:
                fields["outputs"] = f"{name}-stack-outputs"
        if result.ok and problem is None:
            fields["message"] = spec.message
            conditions = finished(None)
            _event(body, "UpdateSucceeded", f"{past} stack {spec.stack_name!r}")
        else:
            message = problem or f"{spec.type} failed: {result.message}"
            fields["message"] = message
            conditions = finished("Unknown" if problem else failure_reason(result))
            _event(body, "UpdateFailed", f"Failed to {verb} stack {spec.stack_name!r}: {message}", warning=True)
        await _finish(ctx, state, body, {"observedGeneration": generation, **fields,
                                         "conditions": set_conditions(status.get("conditions"), conditions,
                                                                      generation, _now())})
    finally:
        state.using[ws_key] -= 1
        shutil.rmtree(run_dir, ignore_errors=True)


def workspace_request(namespace: str, name: str, raw: dict[str, Any], spec: WorkspaceSpec, program: Program,
                      **options: Any) -> UpdateRequest:
    """A pod executor's request for the Workspace's pod: the pod is built from the Workspace's spec (PKO's
    WorkspaceSpec, as a Stack's workspaceTemplate) and runs as its ServiceAccount; its environment,
    Secrets included, is the pod's own, and so are the stack's config values taken from it."""
    stack = spec.stack(options.get("stack_name", ""))
    return UpdateRequest(
        stack_key=workspace_key(namespace, name), project_dir=str(program.project or ""),
        source_root=str(program.source_root or ""), local_dir=program.local_dir,
        # Masked in what the update reports: what the pod's env takes from Secrets, and the engine's secrets.
        secret_env=tuple(sorted({var.name for var in spec.env if var.secret} | SECRET_VARIABLES)),
        service_account=spec.service_account_name, workspace_template={"spec": raw},
        env_config=tuple(item.to_json() for item in (stack.config if stack else ())),
        secrets_provider=stack.secrets_provider if stack else "", environments=stack.environment if stack else (),
        **{"stack_name": "", **options})


async def _run_engine(ctx: Any, spec: UpdateSpec, workspace: dict[str, Any], namespace: str, program: Program,
                      run_dir: Path) -> tuple[UpdateResult, UpdateRequest | None]:
    """The operation through the engine port; a workspace that cannot be resolved now fails the Update."""
    options = dict(stack_name=spec.stack_name, create=True, refresh=spec.refresh, targets=spec.target,
                   target_dependents=spec.target_dependents, message=spec.message, run_program=spec.run_program,
                   real_outputs=spec.type == "up", expect_no_changes=spec.expect_no_changes,
                   continue_on_error=spec.continue_on_error, replace=spec.replace, parallel=spec.parallel)
    try:
        raw = dict(workspace.get("spec") or {})
        ws: WorkspaceSpec = parse_workspace(raw)
        if ctx.engine.in_workspace_pods:
            request = workspace_request(namespace, spec.workspace_name, raw, ws, program, **options)
        else:
            request = await _process_request(ctx, spec, ws, namespace, program, run_dir, options)
    except (SpecInvalid, RefError, ApiException) as err:
        text = f"HTTP {err.status} {err.reason}" if isinstance(err, ApiException) else str(err)
        return UpdateResult("failed", redact(text)), None
    operation = {"preview": ctx.engine.preview, "up": ctx.engine.up, "refresh": ctx.engine.refresh,
                 "destroy": ctx.engine.destroy}[spec.type]
    return await operation(request), request


async def _process_request(ctx: Any, spec: UpdateSpec, ws: WorkspaceSpec, namespace: str, program: Program,
                           run_dir: Path, options: dict[str, Any]) -> UpdateRequest:
    """The process executor's request: the operator reads the workspace's environment and config, and
    mints a kubeconfig for its ServiceAccount (the forked worker has no pod identity)."""
    env = await resolve_env(ws, namespace, ctx.kube.secret_data, ctx.kube.configmap_data)
    stack = ws.stack(spec.stack_name)
    config, secret_config = stack_config(stack, env.env)
    values = dict(env.env)
    minted = await ctx.kube.service_account_kubeconfig(namespace, ws.service_account_name)
    if minted is None:
        raise RefError(f"spec.serviceAccountName of Workspace {spec.workspace_name!r}: ServiceAccount "
                       f"{ws.service_account_name!r} not found in namespace {namespace!r}")
    REDACTOR.add(minted[1])
    run_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = run_dir / "kubeconfig"
    kubeconfig.write_text(minted[0])
    kubeconfig.chmod(0o600)
    values["KUBECONFIG"] = str(kubeconfig)
    return UpdateRequest(
        stack_key=workspace_key(namespace, spec.workspace_name), project_dir=str(program.project), env=values,
        secret_env=tuple(sorted(env.secret_env)), config=config, secret_config=secret_config,
        secrets_provider=stack.secrets_provider if stack else "", environments=stack.environment if stack else (),
        **options)


async def _write_outputs(ctx: Any, body: Any, result: UpdateResult) -> str | None:
    """Create the outputs Secret; the problem, or None. Never a value in a message."""
    meta = body["metadata"]
    secret, missing = outputs_secret(meta["namespace"], meta["name"], meta.get("uid", ""), result.outputs,
                                     result.real_outputs)
    if missing:
        _event(body, "UpdateFailed", f"secret outputs {', '.join(missing)} could not be read "
                                     f"({result.outputs_error or 'no values'}): left out of the outputs Secret",
               warning=True)
    try:
        await ctx.kube.create_secret(meta["namespace"], secret)
    except ApiException as err:
        if err.status == 409:
            existing = await ctx.kube.get_secret(meta["namespace"], secret["metadata"]["name"])
            owners = ((existing or {}).get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("uid") == meta.get("uid") for o in owners):
                return None
        return (f"the up succeeded but its outputs Secret {secret['metadata']['name']!r} could not be created: "
                f"HTTP {err.status} {err.reason}")
    return None


# --- Kopf wiring --------------------------------------------------------------------------------


@kopf.on.startup()
async def start_auto(memo: kopf.Memo, **_: Any) -> None:
    """On the operator's own memo: each object's handlers get a shallow copy of it, so state set there
    would be that object's alone."""
    memo.auto = AutoState()


@kopf.on.event(AUTO_GROUP, AUTO_VERSION, "workspaces")
async def workspace_event(type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, logger: Any,
                    **_: Any) -> None:
    ctx, state = memo.ctx, _state(memo)
    key = (namespace, name)
    if type == "DELETED":
        loop = state.workspaces.pop(key, None)
        if loop is not None and loop.task is not None:
            loop.task.cancel()
        if not ctx.engine.busy(workspace_key(namespace, name)):
            shutil.rmtree(_workspace_dir(ctx, namespace, name), ignore_errors=True)
        ctx.engine.forget(workspace_key(namespace, name))
        return
    body = dict(body)
    if workspace_ready(body) and materialised_program(ctx, body) is not None:
        _wake_waiting(ctx, state, namespace, name)
    loop = state.workspaces.get(key)
    if loop is None:
        async def run(current: Any) -> float | None:
            try:
                return await reconcile_workspace(ctx, state, current, logger)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a bug or API outage must not stop the Workspace's passes
                logger.error("workspace pass failed: %s", redact(f"{err.__class__.__name__}: {err}"))
                return 30.0

        loop = state.workspaces[key] = ObjectLoop(run)
    meta = body["metadata"]
    loop.feed(body, (meta.get("uid"), meta.get("generation"), bool(meta.get("deletionTimestamp"))))


@kopf.on.event(AUTO_GROUP, AUTO_VERSION, "updates")
async def update_event(type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    ctx, state = memo.ctx, _state(memo)
    key = (namespace, name)
    if type == "DELETED":
        # PKO: a deleted Update is cancelled; its run (if any) is interrupted, nothing is written.
        run = state.runs.pop(key, None)
        if run is not None and not run.done():
            run.cancel()
        for task in (state.expiring.pop(key, None),):
            if task is not None:
                task.cancel()
        state.done.pop(key, None)
        for names in state.waiting.values():
            names.discard(name)
        return
    _handle_update(ctx, state, dict(body))


@kopf.on.cleanup()
async def stop_auto(memo: kopf.Memo, **_: Any) -> None:
    state = _state(memo)
    tasks = [t for t in [*state.runs.values(), *state.expiring.values(),
                         *(loop.task for loop in state.workspaces.values())] if t is not None and not t.done()]
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)

