"""`strata get|reconcile|suspend|resume|approve|logs stack(s)`: daily operation of pulumi.com/v1 Stacks, the
way `flux get`, `flux reconcile`, `flux suspend`, `flux resume` and `flux logs` work for Flux's objects.

The deciding and formatting is pure (rows, ages, durations, the reconcile verdict) and unit-tested
alone; the rest reads the kubeconfig like kubectl (`--kubeconfig`, else $KUBECONFIG, else
~/.kube/config; `--context`; the context's namespace unless `-n`) and talks to the API server.
"""

import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

GROUP, VERSION, PLURAL = "pulumi.com", "v1", "stacks"
# The annotation the operator honours (strata_operator.api.RECONCILE_REQUEST_ANNOTATION), as PKO does.
RECONCILE_REQUEST = "pulumi.com/reconciliation-request"
# Where a worker leaves the last engine run's output, beside the Stack's home (strata_operator.engine.process.worker).
UPDATE_LOG = "last-update.json"
KSTATUS = ("Ready", "Stalled", "Reconciling")
# The Ready reason of a suspended Stack (strata_operator.api.status.SUSPENDED).
SUSPENDED = "Suspended"
# The annotation that approves a saved plan (strata_operator.decisions.approval.APPROVE_ANNOTATION).
APPROVE = "strata.dev/approve"
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


class StackCtlError(Exception):
    """A failure to report as one line, naming what to do."""


# -- pure: rows, ages, durations, verdicts ----------------------------------------------------------

def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def format_age(seconds: float) -> str:
    """kubectl's short ages: 45s, 12m, 5h, 3d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `5m`, `1h30m` (Flux's --timeout takes Go durations)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = DURATION.match(text)
    if not text or not match:
        raise StackCtlError(f"--timeout {text!r} is not a duration: give seconds or e.g. 90s, 5m, 1h30m")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def short_commit(commit: str) -> str:
    """A git sha shortened as `git log --oneline` does; anything else (a Program's digest) as given."""
    return commit[:8] if re.fullmatch(r"[0-9a-f]{40}", commit or "") else (commit or "")


def conditions(stack: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (stack.get("status") or {}).get("conditions") or []}


@dataclasses.dataclass(frozen=True)
class StackRow:
    """One line of `strata get stacks`; `to_json` is its `--output json` form."""

    namespace: str
    name: str
    ready: str
    reason: str
    message: str
    last_update: str
    last_update_time: str
    commit: str
    age: str

    @property
    def failing(self) -> bool:
        return self.ready != "True"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def stack_row(stack: Mapping[str, Any], now: datetime) -> StackRow:
    """The kstatus verdict (the one true condition of Ready, Stalled, Reconciling), the last update
    (state, type and when it finished), its commit and the object's age."""
    metadata, status = stack.get("metadata") or {}, stack.get("status") or {}
    found = conditions(stack)
    ready = (found.get("Ready") or {}).get("status", "Unknown")
    current = next((found[kind] for kind in KSTATUS if (found.get(kind) or {}).get("status") == "True"),
                   found.get("Ready") or {})
    last = status.get("lastUpdate") or {}
    finished = parse_time(last.get("lastResyncTime"))
    if last.get("state"):
        when = f" {format_age((now - finished).total_seconds())} ago" if finished else ""
        last_update = f"{last.get('type', 'up')} {last['state']}{when}"
    else:
        last_update = "-"
    if status.get("currentUpdate"):
        last_update = f"{status['currentUpdate'].get('type', 'up')} running"
    created = parse_time(metadata.get("creationTimestamp"))
    return StackRow(
        namespace=metadata.get("namespace", ""), name=metadata.get("name", ""), ready=ready,
        reason=current.get("reason", "") or ("-" if not found else ""),
        message=current.get("message", "") if found else "the operator has not reported on it yet",
        last_update=last_update, last_update_time=last.get("lastResyncTime", ""),
        commit=short_commit(last.get("lastSuccessfulCommit") or last.get("lastAttemptedCommit", "")) or "-",
        age=format_age((now - created).total_seconds()) if created else "-")


def render_table(rows: Iterable[StackRow], all_namespaces: bool) -> str:
    """Aligned columns as `flux get` prints them; MESSAGE only for Stacks that are not Ready."""
    header = [*(["NAMESPACE"] if all_namespaces else []), "NAME", "READY", "REASON", "LAST UPDATE", "COMMIT",
              "AGE", "MESSAGE"]
    lines = [header] + [[*([row.namespace] if all_namespaces else []), row.name, row.ready, row.reason,
                         row.last_update, row.commit, row.age, row.message if row.failing else ""] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("   ".join([*(cell.ljust(width) for cell, width in zip(line, widths)), line[-1]]).rstrip()
                     for line in lines)


@dataclasses.dataclass(frozen=True)
class ReconcileVerdict:
    done: bool
    ok: bool
    reason: str
    message: str


def reconcile_verdict(stack: Mapping[str, Any], request: str) -> ReconcileVerdict:
    """Where a Stack stands after the reconcile request `request`: not done until the operator has
    answered that request (status.observedReconcileRequest) with a verdict; then Ready succeeds,
    Stalled fails, and so does a run for this request that failed and waits to be retried."""
    if (stack.get("status") or {}).get("observedReconcileRequest") != request:
        return ReconcileVerdict(False, False, "Requested", "waiting for the operator to pick the request up")
    return _settled(stack, lambda last: last.get("reconcileRequest") == request)


def resume_verdict(stack: Mapping[str, Any], generation: int) -> ReconcileVerdict:
    """Where a Stack stands after `resume` made `generation`: not done until the operator has planned on
    that generation and is no longer suspended; then as `reconcile_verdict`."""
    status = stack.get("status") or {}
    if (int(status.get("observedGeneration") or 0) < generation
            or (conditions(stack).get("Ready") or {}).get("reason") == SUSPENDED):
        return ReconcileVerdict(False, False, "Requested", "waiting for the operator to resume the Stack")
    return _settled(stack, lambda last: int(last.get("generation") or 0) >= generation)


def approve_verdict(stack: Mapping[str, Any], digest: str) -> ReconcileVerdict:
    """Where a Stack stands after plan `digest` was approved: done once an update applied that plan
    (lastUpdate.plan), or once another plan replaced it (the approved one was stale: never applied)."""
    status = stack.get("status") or {}
    last = status.get("lastUpdate") or {}
    if last.get("plan") == digest and not status.get("currentUpdate"):
        if last.get("state") == "succeeded":
            return ReconcileVerdict(True, True, "PlanApplied", f"plan {digest} applied")
        return ReconcileVerdict(True, False, last.get("reason", "UpdateFailed"), last.get("message", ""))
    saved = status.get("plan") or {}
    if saved.get("digest") and saved["digest"] != digest:
        ready = conditions(stack).get("Reconciling") or {}
        return ReconcileVerdict(True, False, "PlanReplaced",
                                f"plan {digest} was replaced before it was applied: {ready.get('message', '')}")
    current = next((c for c in conditions(stack).values() if c.get("status") == "True"), {})
    return ReconcileVerdict(False, False, current.get("reason", "Requested"),
                            current.get("message", "waiting for the operator to apply the plan"))


def _settled(stack: Mapping[str, Any], answers: Callable[[Mapping[str, Any]], bool]) -> ReconcileVerdict:
    """The verdict of a Stack whose operator has seen what was asked; `answers(lastUpdate)`: that run was for it."""
    status = stack.get("status") or {}
    found = conditions(stack)
    for kind in KSTATUS:
        condition = found.get(kind) or {}
        if condition.get("status") != "True":
            continue
        reason, message = condition.get("reason", ""), condition.get("message", "")
        if kind == "Ready":
            return ReconcileVerdict(True, True, reason, message)
        if kind == "Stalled":
            return ReconcileVerdict(True, False, reason, message)
        last = status.get("lastUpdate") or {}
        if last.get("state") == "failed" and answers(last) and not status.get("currentUpdate"):
            return ReconcileVerdict(True, False, last.get("reason") or reason, last.get("message") or message)
        return ReconcileVerdict(False, False, reason, message)
    return ReconcileVerdict(False, False, "Requested", "waiting for the operator to report")


def update_log_path(operator_state_dir: Path, namespace: str, name: str) -> Path:
    """The worker writes the log into the Stack's directory of the operator's state (engine.worker_env)."""
    return operator_state_dir / "stacks" / namespace / name / UPDATE_LOG


def operator_state_dirs() -> list[Path]:
    """Where an operator on this host keeps its state, most specific first: $STRATA_OPERATOR_STATE
    (the operator reads it too), the dev home's `platform/operator` (`make up`, the Operator
    component's local mode), then the operator's own default (`strata operator run` without --state-dir)."""
    from .local.devstack import dev_home

    explicit = os.environ.get("STRATA_OPERATOR_STATE")
    candidates = [Path(explicit)] if explicit else []
    candidates += [dev_home().platform_dir / "operator", Path.home() / ".cache" / "strata" / "operator"]
    return list(dict.fromkeys(candidates))


# -- the API server -------------------------------------------------------------------------------

@dataclasses.dataclass
class Cluster:
    """An API client from the kubeconfig, as kubectl picks it, and the namespace kubectl would use."""

    custom: Any
    namespace: str
    server: str
    api: Any = None  # the ApiClient, for Secrets and Events (the console's plan and history)

    @classmethod
    def connect(cls, kubeconfig: str | None, context: str | None, namespace: str | None) -> "Cluster":
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        first = path.split(os.pathsep)[0]
        if not kubeconfig and not any(Path(p).expanduser().is_file() for p in path.split(os.pathsep)):
            raise StackCtlError(f"no kubeconfig at {path}: set KUBECONFIG or pass --kubeconfig "
                                "(for the local platform: eval \"$(strata local env)\")")
        if kubeconfig and not Path(first).expanduser().is_file():
            raise StackCtlError(f"--kubeconfig {kubeconfig}: no such file")
        try:
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c["name"] == context), None) if context else active
            if chosen is None:
                raise StackCtlError(f"--context {context}: not in {path} (it has "
                                    f"{', '.join(c['name'] for c in contexts) or 'none'})")
            api = config.new_client_from_config(config_file=path, context=chosen["name"])
        except ConfigException as err:
            raise StackCtlError(f"kubeconfig {path}: {err}") from None
        return cls(custom=client.CustomObjectsApi(api),
                   namespace=namespace or chosen.get("context", {}).get("namespace") or "default",
                   server=api.configuration.host, api=api)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, not_found: str | None = None, **kwargs: Any) -> Any:
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            if err.status == 404:
                raise StackCtlError(not_found or f"{what}: the API server at {self.server} does not serve "
                                    "pulumi.com/v1 Stacks; install the operator's CRDs "
                                    "(operator/strata_operator/api/crds)") from None
            if err.status == 403:
                raise StackCtlError(f"{what}: forbidden for this kubeconfig's user ({self.server}): "
                                    f"{_api_message(err)}") from None
            raise StackCtlError(f"{what}: {err.status} {_api_message(err)}") from None
        except HTTPError as err:
            raise StackCtlError(f"{what}: cannot reach the API server at {self.server} ({err}); is the "
                                "cluster up (`strata local status`)?") from None

    def list_stacks(self, namespace: str | None) -> list[dict[str, Any]]:
        if namespace is None:
            listed = self._call("listing Stacks", self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        else:
            listed = self._call(f"listing Stacks in {namespace}", self.custom.list_namespaced_custom_object,
                                GROUP, VERSION, namespace, PLURAL)
        return sorted(listed.get("items", []), key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"]))

    def get_stack(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"reading Stack {namespace}/{name}", self.custom.get_namespaced_custom_object,
                          GROUP, VERSION, namespace, PLURAL, name,
                          not_found=f"Stack {namespace}/{name} not found (`strata get stacks -n {namespace}` "
                                    "lists the Stacks there)")

    def set_suspend(self, namespace: str, name: str, suspend: bool) -> dict[str, Any]:
        """Patch spec.suspend; returns the Stack as patched (its new generation)."""
        return self._call(f"patching Stack {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                          GROUP, VERSION, namespace, PLURAL, name, {"spec": {"suspend": suspend}})

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._call(f"annotating Stack {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                   GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"annotations": annotations}})

    def request_reconcile(self, namespace: str, name: str, request: str) -> None:
        self._call(f"annotating Stack {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                   GROUP, VERSION, namespace, PLURAL, name,
                   {"metadata": {"annotations": {RECONCILE_REQUEST: request}}})

    def list_objects(self, group: str, version: str, plural: str, namespace: str | None) -> dict[str, Any]:
        """Any custom kind's list (items and resourceVersion), cluster-wide or in one namespace."""
        if namespace is None:
            return self._call(f"listing {plural}", self.custom.list_cluster_custom_object, group, version, plural,
                              not_found=f"the API server at {self.server} does not serve {plural}.{group}/{version}")
        return self._call(f"listing {plural} in {namespace}", self.custom.list_namespaced_custom_object, group,
                          version, namespace, plural,
                          not_found=f"the API server at {self.server} does not serve {plural}.{group}/{version}")

    def get_object(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"reading {plural} {namespace}/{name}", self.custom.get_namespaced_custom_object, group,
                          version, namespace, plural, name, not_found=f"{plural} {namespace}/{name} not found")

    def secret_data(self, namespace: str, name: str) -> dict[str, bytes]:
        """A Secret's data, decoded (the user's own right to read it decides)."""
        import base64

        from kubernetes import client

        secret = self._call(f"reading Secret {namespace}/{name}", client.CoreV1Api(self.api).read_namespaced_secret,
                            name, namespace, not_found=f"Secret {namespace}/{name} not found")
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def stack_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        from kubernetes import client

        listed = self._call(f"listing Events of Stack {namespace}/{name}",
                            client.CoreV1Api(self.api).list_namespaced_event, namespace,
                            field_selector=f"involvedObject.kind=Stack,involvedObject.name={name}")
        return [self.api.sanitize_for_serialization(event) for event in listed.items]


def _api_message(err: Any) -> str:
    try:
        return json.loads(err.body).get("message", err.reason)
    except (TypeError, ValueError):
        return str(err.reason)


# -- the commands ---------------------------------------------------------------------------------

def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def get_stacks(cluster: Cluster, all_namespaces: bool, namespace: str | None, output: str) -> int:
    scope = None if all_namespaces else (namespace or cluster.namespace)
    now = datetime.now(timezone.utc)
    rows = [stack_row(stack, now) for stack in cluster.list_stacks(scope)]
    if output == "json":
        _print_json([row.to_json() for row in rows])
    elif not rows:
        _say("no Stacks found" + ("" if scope is None else f" in namespace {scope}"))
    else:
        print(render_table(rows, all_namespaces))
    return 0


def request_reconcile(cluster: Cluster, namespace: str | None, name: str) -> str:
    """Set the reconcile request on a Stack that is not suspended; returns the request."""
    namespace = namespace or cluster.namespace
    stack = cluster.get_stack(namespace, name)
    if (stack.get("spec") or {}).get("suspend"):
        raise StackCtlError(f"Stack {namespace}/{name} is suspended: nothing runs until "
                            f"`strata resume stack {name} -n {namespace}`, which runs what changed")
    request = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    _say(f"► annotating Stack {namespace}/{name} ({RECONCILE_REQUEST}={request})")
    cluster.request_reconcile(namespace, name, request)
    return request


def reconcile_stack(cluster: Cluster, namespace: str | None, name: str, timeout: float, output: str,
                    interval: float = 1.0) -> int:
    """Set the reconcile request, then follow the Stack until the operator has answered it."""
    namespace = namespace or cluster.namespace
    request = request_reconcile(cluster, namespace, name)
    return _follow(cluster, namespace, name, lambda stack: reconcile_verdict(stack, request), timeout, output,
                   {"request": request}, interval)


def approve_plan(cluster: Cluster, namespace: str | None, name: str, digest: str | None = None) -> dict[str, Any]:
    """Annotate the Stack with the digest of the plan it shows (status.plan), which the operator then
    applies; with `digest`, only if that is still the plan shown. Returns that status.plan."""
    if "/" in name:  # `strata approve stack NAMESPACE/STACK`
        namespace, name = name.split("/", 1)
    namespace = namespace or cluster.namespace
    stack = cluster.get_stack(namespace, name)
    saved = (stack.get("status") or {}).get("plan") or {}
    if not saved.get("digest"):
        mode = ((stack.get("spec") or {}).get("approval") or {}).get("mode", "Auto")
        raise StackCtlError(f"Stack {namespace}/{name} has no plan awaiting approval" + (
            "" if mode == "Manual" else " (its spec.approval.mode is not Manual: its updates need none)"))
    if digest is not None and saved["digest"] != digest:
        raise StackCtlError(f"Stack {namespace}/{name} no longer shows plan {digest}: plan {saved['digest']} "
                            "replaced it; review that one before approving")
    changes = ", ".join(f"{op} {n}" for op, n in sorted((saved.get("changes") or {}).items()) if op != "same" and n)
    _say(f"► approving plan {saved['digest']} of Stack {namespace}/{name} ({changes or 'no changes'}; made from "
         f"{saved.get('revision') or 'generation ' + str(saved.get('generation'))})")
    cluster.annotate(namespace, name, {APPROVE: saved["digest"]})
    return saved


def approve_stack(cluster: Cluster, namespace: str | None, name: str, timeout: float, output: str,
                  interval: float = 1.0) -> int:
    """Approve the plan the Stack shows (status.plan) and follow it until that plan is applied."""
    if "/" in name:
        namespace, name = name.split("/", 1)
    namespace = namespace or cluster.namespace
    digest = approve_plan(cluster, namespace, name)["digest"]
    return _follow(cluster, namespace, name, lambda stack: approve_verdict(stack, digest), timeout, output,
                   {"plan": digest}, interval)


def request_suspend(cluster: Cluster, namespace: str | None, name: str) -> dict[str, Any]:
    """Set spec.suspend; returns the Stack as patched."""
    namespace = namespace or cluster.namespace
    cluster.get_stack(namespace, name)
    _say(f"► suspending Stack {namespace}/{name}")
    return cluster.set_suspend(namespace, name, True)


def suspend_stack(cluster: Cluster, namespace: str | None, name: str, output: str) -> int:
    """Set spec.suspend, as `flux suspend` does: the operator runs nothing more (a run going on finishes)."""
    namespace = namespace or cluster.namespace
    stack = request_suspend(cluster, namespace, name)
    if output == "json":
        _print_json({**stack_row(stack, datetime.now(timezone.utc)).to_json(), "suspended": True})
    _say(f"✔ Stack {namespace}/{name} suspended")
    return 0


def request_resume(cluster: Cluster, namespace: str | None, name: str) -> int:
    """Clear spec.suspend; returns the generation that made."""
    namespace = namespace or cluster.namespace
    cluster.get_stack(namespace, name)
    _say(f"► resuming Stack {namespace}/{name}")
    return int(cluster.set_suspend(namespace, name, False)["metadata"]["generation"])


def resume_stack(cluster: Cluster, namespace: str | None, name: str, timeout: float, output: str,
                 interval: float = 1.0) -> int:
    """Clear spec.suspend and follow the Stack until the operator has run what changed meanwhile."""
    namespace = namespace or cluster.namespace
    generation = request_resume(cluster, namespace, name)
    return _follow(cluster, namespace, name, lambda stack: resume_verdict(stack, generation), timeout, output,
                   {"generation": generation}, interval)


def _follow(cluster: Cluster, namespace: str, name: str, verdict_of: Callable[[Mapping[str, Any]], ReconcileVerdict],
            timeout: float, output: str, extra: dict[str, Any], interval: float) -> int:
    """Poll the Stack until `verdict_of` says done or `timeout`; print the outcome; exit status."""
    _say("◎ waiting for Stack reconciliation")
    deadline, seen = time.monotonic() + timeout, ("", "")
    while True:
        stack = cluster.get_stack(namespace, name)
        verdict = verdict_of(stack)
        if (verdict.reason, verdict.message) != seen and not verdict.done:
            seen = (verdict.reason, verdict.message)
            _say(f"  {verdict.reason}: {verdict.message}")
        if verdict.done or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    row = stack_row(stack, datetime.now(timezone.utc))
    if output == "json":
        _print_json({**row.to_json(), **extra, "succeeded": verdict.ok, "timedOut": not verdict.done})
    if not verdict.done:
        _say(f"✗ Stack {namespace}/{name} not reconciled within {timeout:g}s; last: {verdict.reason}: "
             f"{verdict.message} (`strata logs stack {name} -n {namespace}` shows the last update's output)")
        return 1
    if not verdict.ok:
        _say(f"✗ Stack {namespace}/{name} {verdict.reason}: {verdict.message}")
        return 1
    _say(f"✔ Stack {namespace}/{name} reconciled: {row.last_update}, commit {row.commit}")
    return 0


def read_update_log(cluster: Cluster, namespace: str | None, name: str, state_dirs: list[Path]) -> dict[str, Any]:
    """The last engine run's record (operation, outcome, finished, seconds, output), as the operator's
    worker left it (already redacted), from the first of `state_dirs` that holds one for this Stack."""
    namespace = namespace or cluster.namespace
    cluster.get_stack(namespace, name)
    paths = [update_log_path(directory, namespace, name) for directory in state_dirs]
    path = next((candidate for candidate in paths if candidate.is_file()), None)
    if path is None:
        raise StackCtlError(f"no engine output for Stack {namespace}/{name} in {', '.join(map(str, paths))}: "
                            "the operator keeps the last run's output in its --state-dir, on its own host, once "
                            "a run has finished; pass that directory as --operator-state-dir")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StackCtlError(f"cannot read {path}: {err}") from None


def stack_logs(cluster: Cluster, namespace: str | None, name: str, state_dirs: list[Path], output: str) -> int:
    """Print the last engine run's output (see read_update_log)."""
    namespace = namespace or cluster.namespace
    record = read_update_log(cluster, namespace, name, state_dirs)
    if output == "json":
        _print_json({"namespace": namespace, "name": name, **record})
        return 0
    seconds = record.get("seconds") or {}
    took = ", ".join(f"{phase} {value:.1f}s" for phase, value in seconds.items())
    _say(f"{record['operation']} of {record['stack']} {record['outcome']} at {record['finished']}"
         + (f" ({took})" if took else ""))
    text = record["output"]
    sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
    return 0
