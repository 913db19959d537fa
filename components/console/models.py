"""What each console page shows, built from Kubernetes objects (pure, unit-tested alone).

Every builder takes the objects as the API server returned them to the user and returns plain data
for the templates; nothing here talks to a cluster. Secret values never get past these builders:
outputs the operator marked secret stay `[secret]`, and a plan's secret properties (Pulumi's secret
signature, ciphertext or plain) become `[secret]` before anything is rendered.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .. import stackctl

SECRET = "[secret]"
# Pulumi marks a secret property value with this key and value (resource.SecretSig) wherever it serializes one.
SECRET_SIG_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
# Flux labels what a Kustomization applied with its name and namespace.
FLUX_NAME_LABEL, FLUX_NAMESPACE_LABEL = "kustomize.toolkit.fluxcd.io/name", "kustomize.toolkit.fluxcd.io/namespace"
STATES = ("Stalled", "Failed", "Reconciling", "Suspended", "Ready", "Unknown")
LAYER_NAMES = ("bootstrap", "platform", "teams", "apps")
# The Stack's Events that make its update history, oldest kept first by the API server.
HISTORY_REASONS = ("StackUpdateDetected", "StackCreated", "StackUpdateFailure", "StackUpdateConflictDetected",
                   "PlanAwaitingApproval", "PlanRefused", "DriftDetected", "DriftResolved", "Suspended", "Resumed",
                   "StackOutputRetrievalFailure")


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind the console lists and watches."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


STACK = Kind("Stack", "pulumi.com", "v1", "stacks")
PROGRAM = Kind("Program", "pulumi.com", "v1", "programs")
WORKSPACE = Kind("Workspace", "auto.pulumi.com", "v1alpha1", "workspaces")
GIT_REPOSITORY = Kind("GitRepository", "source.toolkit.fluxcd.io", "v1", "gitrepositories")
OCI_REPOSITORY = Kind("OCIRepository", "source.toolkit.fluxcd.io", "v1", "ocirepositories")
BUCKET = Kind("Bucket", "source.toolkit.fluxcd.io", "v1", "buckets")
KUSTOMIZATION = Kind("Kustomization", "kustomize.toolkit.fluxcd.io", "v1", "kustomizations")
KINDS = (STACK, PROGRAM, WORKSPACE, GIT_REPOSITORY, OCI_REPOSITORY, BUCKET, KUSTOMIZATION)
FLUX_SOURCES = ("GitRepository", "OCIRepository", "Bucket")


def key(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}"


def dom_id(object_key: str) -> str:
    """An HTML id for an object's row (names are DNS labels and subdomains: dots and dashes only)."""
    return "row-" + object_key.replace("/", "--").replace(".", "-_")


# -- state ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class State:
    state: str  # one of STATES
    reason: str
    message: str


# Pages of a large fleet read the same unchanged objects again and again: what an object version says is
# kept by (kind, namespace, name, resourceVersion), and a row also by the 10 s its ages were read in.
MEMO_LIMIT = 50_000
_states: dict[tuple[str, ...], State] = {}
_rows: dict[tuple[str, ...], "OverviewRow"] = {}
AGE_BUCKET_SECONDS = 10


def _version(kind: str, obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    meta = obj.get("metadata") or {}
    version = meta.get("resourceVersion")
    return (kind, meta.get("namespace", ""), meta.get("name", ""), version) if version else None


def _remember(memo: dict, memo_key: tuple | None, value: Any) -> Any:
    if memo_key is not None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[memo_key] = value
    return value


def object_state(kind: str, obj: Mapping[str, Any]) -> State:
    """kstatus read as a person asks it: Stalled, Failed (a failed update being retried), Reconciling,
    Suspended, Ready, or Unknown before any controller reported."""
    version = _version(kind, obj)
    if version is not None and version in _states:
        return _states[version]
    return _remember(_states, version, _object_state(kind, obj))


def _object_state(kind: str, obj: Mapping[str, Any]) -> State:
    found = stackctl.conditions(obj)
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready = found.get("Ready") or {}
    true = next((found[c] for c in stackctl.KSTATUS if (found.get(c) or {}).get("status") == "True"), None)
    meta = obj.get("metadata") or {}
    if spec.get("suspend") or ready.get("reason") == stackctl.SUSPENDED:
        return State("Suspended", ready.get("reason", stackctl.SUSPENDED), ready.get("message", "suspended"))
    if not found and kind == "Program" and "observedGeneration" in status:
        # A Program's status has no conditions: it is current once its newest generation is rendered.
        rendered = int(status["observedGeneration"]) >= int(meta.get("generation") or 0) and status.get("artifact")
        revision = (status.get("artifact") or {}).get("revision", "")
        return (State("Ready", "Rendered", f"revision {revision}") if rendered
                else State("Reconciling", "Progressing", "the operator has not rendered the newest generation yet"))
    if not found:
        return State("Unknown", "-", "no controller has reported on it yet")
    stalled = found.get("Stalled") or {}
    if stalled.get("status") == "True":
        return State("Stalled", stalled.get("reason", ""), stalled.get("message", ""))
    last = status.get("lastUpdate") or {}
    if kind == "Stack" and last.get("state") == "failed" and ready.get("status") != "True" \
            and not status.get("currentUpdate"):
        return State("Failed", last.get("reason") or ready.get("reason", ""), last.get("message") or ready.get("message", ""))
    observed = status.get("observedGeneration")
    if observed is not None and int(observed) < int(meta.get("generation") or 0):
        return State("Reconciling", "Progressing", "the controller has not seen the newest generation yet")
    if true is not None and true.get("type") == "Ready":
        return State("Ready", true.get("reason", ""), true.get("message", ""))
    if true is not None:
        return State("Reconciling", true.get("reason", ""), true.get("message", ""))
    if ready.get("status") == "False":
        return State("Failed", ready.get("reason", ""), ready.get("message", ""))
    return State("Reconciling", ready.get("reason", "-"), ready.get("message", ""))


# -- overview ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OverviewRow:
    key: str
    kind: str
    namespace: str
    name: str
    state: str
    reason: str
    message: str
    last_update: str
    commit: str
    age: str
    href: str

    @property
    def dom_id(self) -> str:
        return dom_id(self.key)

    @property
    def css(self) -> str:
        return "state-" + self.state.lower()


def _age(obj: Mapping[str, Any], now: datetime) -> str:
    created = stackctl.parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return stackctl.format_age((now - created).total_seconds()) if created else "-"


def _flux_last(obj: Mapping[str, Any], now: datetime) -> tuple[str, str]:
    """A Flux object's last update (its Ready transition) and revision, short."""
    status = obj.get("status") or {}
    revision = status.get("lastAppliedRevision") or (status.get("artifact") or {}).get("revision", "")
    ready = stackctl.conditions(obj).get("Ready") or {}
    when = stackctl.parse_time(ready.get("lastTransitionTime"))
    last = f"{ready.get('reason', '')} {stackctl.format_age((now - when).total_seconds())} ago" if when else "-"
    commit = revision.rsplit(":", 1)[-1] if "sha1:" in revision else revision
    return last, stackctl.short_commit(commit) or "-"


def overview_row(kind: str, obj: Mapping[str, Any], now: datetime) -> OverviewRow:
    version = _version(kind, obj)
    memo_key = (*version, str(int(now.timestamp()) // AGE_BUCKET_SECONDS)) if version else None
    if memo_key is not None and memo_key in _rows:
        return _rows[memo_key]
    return _remember(_rows, memo_key, _overview_row(kind, obj, now))


def _overview_row(kind: str, obj: Mapping[str, Any], now: datetime) -> OverviewRow:
    meta = obj.get("metadata") or {}
    state = object_state(kind, obj)
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    if kind == "Stack":
        row = stackctl.stack_row(obj, now)
        last, commit, age = row.last_update, row.commit, row.age
        href = f"/stacks/{namespace}/{name}"
    else:
        last, commit = _flux_last(obj, now)
        age = _age(obj, now)
        if kind == "Program":
            artifact = (obj.get("status") or {}).get("artifact") or {}
            commit = artifact.get("revision") or "-"
            href = f"/rollout/{namespace}/{name}"
        else:
            href = ""
    return OverviewRow(key(kind, obj), kind, namespace, name, state.state, state.reason, state.message, last,
                       commit, age, href)


def cared_for(objects: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, list[Mapping[str, Any]]]:
    """The objects Strata cares about: every Stack, Program and Workspace; the Kustomizations that applied
    one of them and the Flux sources those Kustomizations or a Stack read."""
    stacks = list(objects.get("Stack", ()))
    ours = [*stacks, *objects.get("Program", ()), *objects.get("Workspace", ())]
    owners = {(labels.get(FLUX_NAMESPACE_LABEL), labels.get(FLUX_NAME_LABEL))
              for labels in ((o.get("metadata") or {}).get("labels") or {} for o in ours) if labels.get(FLUX_NAME_LABEL)}
    kustomizations = [k for k in objects.get("Kustomization", ())
                      if ((k.get("metadata") or {}).get("namespace"), (k.get("metadata") or {}).get("name")) in owners]
    sources: set[tuple[str, str, str]] = set()
    for k in kustomizations:
        ref = (k.get("spec") or {}).get("sourceRef") or {}
        sources.add((ref.get("kind", ""), ref.get("namespace") or k["metadata"]["namespace"], ref.get("name", "")))
    for stack in stacks:
        ref = ((stack.get("spec") or {}).get("fluxSource") or {}).get("sourceRef") or {}
        if ref:
            sources.add((ref.get("kind", ""), stack["metadata"]["namespace"], ref.get("name", "")))
    cared: dict[str, list[Mapping[str, Any]]] = {
        "Stack": stacks, "Program": list(objects.get("Program", ())), "Workspace": list(objects.get("Workspace", ())),
        "Kustomization": kustomizations}
    for kind in FLUX_SOURCES:
        cared[kind] = [o for o in objects.get(kind, ())
                       if (kind, o["metadata"].get("namespace"), o["metadata"].get("name")) in sources]
    return cared


@dataclasses.dataclass(frozen=True)
class Filters:
    namespace: str = ""
    state: str = ""
    kind: str = ""

    def admits(self, row: OverviewRow) -> bool:
        return ((not self.namespace or row.namespace == self.namespace) and (not self.state or row.state == self.state)
                and (not self.kind or row.kind == self.kind))

    def query(self) -> str:
        return "&".join(f"{name}={value}" for name, value in dataclasses.asdict(self).items() if value)


@dataclasses.dataclass(frozen=True)
class Overview:
    rows: list[OverviewRow]
    counts: dict[str, int]  # state -> objects of every kind, before filtering by state
    namespaces: list[str]
    total: int


def overview(objects: Mapping[str, Iterable[Mapping[str, Any]]], filters: Filters, now: datetime) -> Overview:
    """The rows the filters admit (failing first, then by kind, namespace and name), the state counts."""
    rows = [overview_row(kind, obj, now) for kind, objs in cared_for(objects).items() for obj in objs]
    namespaces = sorted({row.namespace for row in rows})
    scope = dataclasses.replace(filters, state="")
    scoped = [row for row in rows if scope.admits(row)]
    counts = {state: 0 for state in STATES}
    for row in scoped:
        counts[row.state] += 1
    order = {state: index for index, state in enumerate(STATES)}
    kinds = {kind.kind: index for index, kind in enumerate(KINDS)}
    shown = sorted((row for row in scoped if filters.admits(row)),
                   key=lambda r: (order[r.state] > order["Reconciling"], kinds.get(r.kind, 99), r.namespace, r.name))
    return Overview(shown, counts, namespaces, len(rows))


# -- secrets and plans ------------------------------------------------------------------------------

def is_secret(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get(SECRET_SIG_KEY) == SECRET_SIG


def mask(value: Any) -> Any:
    """The value with every secret in it (Pulumi's secret signature, whatever it holds) replaced by [secret]."""
    if is_secret(value):
        return SECRET
    if isinstance(value, Mapping):
        return {k: mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def show(value: Any) -> str:
    """A property value as one line of text for the page (already masked)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class PropertyDiff:
    op: str  # "+" added, "~" updated, "-" deleted
    path: str
    value: str


@dataclasses.dataclass(frozen=True)
class ResourceChange:
    op: str  # create, update, replace, delete, same, ...
    urn: str
    type: str
    name: str
    diffs: list[PropertyDiff]


def _urn_parts(urn: str) -> tuple[str, str]:
    """(type, name) of `urn:pulumi:stack::project::parent$type::name`."""
    parts = urn.split("::")
    return (parts[2].rsplit("$", 1)[-1], parts[3]) if len(parts) >= 4 else ("", urn)


def resource_op(steps: Iterable[str]) -> str:
    """One word for a resource's steps as the engine plans them (create-replacement + replace -> replace)."""
    steps = list(steps)
    if any(step in ("replace", "create-replacement", "delete-replaced") for step in steps):
        return "replace"
    for op in ("create", "update", "delete", "import", "refresh", "read"):
        if op in steps:
            return op
    return steps[0] if steps else "same"


def _property_diffs(diff: Mapping[str, Any], secret_keys: set[str]) -> list[PropertyDiff]:
    def value(name: str, raw: Any) -> str:
        return SECRET if name in secret_keys else show(mask(raw))

    found = [PropertyDiff("+", name, value(name, raw)) for name, raw in (diff.get("adds") or {}).items()]
    found += [PropertyDiff("~", name, value(name, raw)) for name, raw in (diff.get("updates") or {}).items()]
    found += [PropertyDiff("-", name, "") for name in diff.get("deletes") or []]
    return sorted(found, key=lambda d: d.path)


def plan_changes(plan: bytes | str) -> list[ResourceChange]:
    """The resources a saved plan (`pulumi preview --save-plan`) would change, with their input property
    diffs (secrets masked); resources it leaves as they are are left out."""
    document = json.loads(plan or "{}")
    changes = []
    for urn, resource in (document.get("resourcePlans") or {}).items():
        goal = resource.get("goal") or {}
        op = resource_op(resource.get("steps") or [])
        if op == "same":
            continue
        rtype, name = _urn_parts(urn)
        secret_keys = set(goal.get("additionalSecretOutputs") or [])
        changes.append(ResourceChange(op, urn, goal.get("type") or rtype, goal.get("name") or name,
                                      _property_diffs(goal.get("inputDiff") or {}, secret_keys)))
    order = {"delete": 0, "replace": 1, "update": 2, "create": 3}
    return sorted(changes, key=lambda c: (order.get(c.op, 4), c.type, c.name))


# -- the Stack page ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    time: str
    reason: str
    message: str
    warning: bool
    count: int


@dataclasses.dataclass(frozen=True)
class StackPage:
    namespace: str
    name: str
    stack: str
    state: State
    row: stackctl.StackRow
    conditions: list[dict[str, Any]]
    outputs: list[tuple[str, str]]
    last_update: dict[str, Any]
    drift: dict[str, Any]
    plan: dict[str, Any]
    suspended: bool
    history: list[HistoryEntry]
    prerequisites: list[str]
    source: str


def _source(spec: Mapping[str, Any]) -> str:
    if spec.get("projectRepo"):
        at = spec.get("commit") or spec.get("branch") or "default branch"
        return f"git {spec['projectRepo']} @ {at}" + (f", dir {spec['repoDir']}" if spec.get("repoDir") else "")
    if spec.get("fluxSource"):
        ref = spec["fluxSource"].get("sourceRef") or {}
        return f"Flux {ref.get('kind')} {ref.get('name')}" + (f", dir {spec['fluxSource']['dir']}"
                                                             if spec["fluxSource"].get("dir") else "")
    if spec.get("programRef"):
        return f"Program {spec['programRef'].get('name')}"
    return "-"


def history(events: Iterable[Mapping[str, Any]]) -> list[HistoryEntry]:
    """The Stack's update history from its Events (the operator posts one per update, plan and drift
    finding, with the change summary on success), newest first."""
    entries = []
    for event in events:
        if event.get("reason") not in HISTORY_REASONS:
            continue
        when = event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
            "creationTimestamp") or ""
        entries.append(HistoryEntry(str(when), event["reason"], event.get("message", ""),
                                    event.get("type") == "Warning", int(event.get("count") or 1)))
    return sorted(entries, key=lambda e: e.time, reverse=True)


def stack_page(stack: Mapping[str, Any], events: Iterable[Mapping[str, Any]], now: datetime) -> StackPage:
    meta, spec, status = stack.get("metadata") or {}, stack.get("spec") or {}, stack.get("status") or {}
    outputs = [(name, SECRET if value == SECRET or is_secret(value) else show(mask(value)))
               for name, value in sorted((status.get("outputs") or {}).items())]
    return StackPage(
        namespace=meta.get("namespace", ""), name=meta.get("name", ""), stack=spec.get("stack", ""),
        state=object_state("Stack", stack), row=stackctl.stack_row(stack, now),
        conditions=sorted(status.get("conditions") or [], key=lambda c: c.get("type", "")),
        outputs=outputs, last_update=status.get("lastUpdate") or {}, drift=status.get("drift") or {},
        plan=status.get("plan") or {}, suspended=bool(spec.get("suspend")), history=history(events),
        prerequisites=[p.get("name", "") for p in spec.get("prerequisites") or []], source=_source(spec))


# -- approvals --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PendingPlan:
    namespace: str
    name: str
    digest: str
    summary: str
    revision: str
    created: str
    message: str


def pending_plans(stacks: Iterable[Mapping[str, Any]]) -> list[PendingPlan]:
    """Every Stack whose saved plan awaits approval."""
    found = []
    for stack in stacks:
        saved = (stack.get("status") or {}).get("plan") or {}
        reconciling = stackctl.conditions(stack).get("Reconciling") or {}
        if not saved.get("digest") or reconciling.get("reason") != "AwaitingApproval":
            continue
        meta = stack["metadata"]
        changes = ", ".join(f"{op} {n}" for op, n in sorted((saved.get("changes") or {}).items()) if op != "same" and n)
        found.append(PendingPlan(meta["namespace"], meta["name"], saved["digest"], changes or "no changes",
                                 saved.get("revision") or f"generation {saved.get('generation')}",
                                 saved.get("createdAt", ""), reconciling.get("message", "")))
    return sorted(found, key=lambda p: (p.namespace, p.name))


# -- layers -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Node:
    key: str
    kind: str
    namespace: str
    name: str
    state: str
    layer: int
    x: int
    y: int
    href: str

    @property
    def dom_id(self) -> str:
        return "node-" + self.key.replace("/", "--")

    @property
    def subtitle(self) -> str:
        return " · ".join(part for part in (self.kind, self.namespace[:14], self.state) if part)


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str
    target: str
    why: str  # prerequisite, StackReference, outputs, Flux, owner, created


@dataclasses.dataclass(frozen=True)
class Graph:
    nodes: list[Node]
    edges: list[tuple[Edge, Node, Node]]
    columns: list[str]
    width: int
    height: int


def _stack_references(program: Mapping[str, Any]) -> list[str]:
    """The stacks a YAML Program reads through `pulumi:pulumi:StackReference` resources."""
    found = []
    for resource in ((program.get("program") or {}).get("resources") or {}).values():
        if isinstance(resource, Mapping) and resource.get("type") == "pulumi:pulumi:StackReference":
            name = (resource.get("properties") or {}).get("name")
            if isinstance(name, str):
                found.append(name)
    return found


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def layer_edges(objects: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[Edge]:
    """Who waits for whom: a Stack for its prerequisites; for the stacks it references (a YAML Program's
    StackReference, or a config value naming a stack, as the app layer names its hand-off stack); for
    the Stack whose outputs name it (the platform layer hands each team's stack over that way); an
    object for the Kustomization that applied it (Flux's labels) or the Stack that owns it."""
    stacks = list(objects.get("Stack", ()))
    by_stack_name: dict[str, str] = {}
    for stack in stacks:
        qualified = (stack.get("spec") or {}).get("stack", "")
        if "/" in qualified:
            by_stack_name.setdefault(qualified, key("Stack", stack))
    programs = {(p["metadata"].get("namespace"), p["metadata"]["name"]): p for p in objects.get("Program", ())}
    edges = []
    for stack in stacks:
        meta, spec = stack["metadata"], stack.get("spec") or {}
        me = key("Stack", stack)
        for prerequisite in spec.get("prerequisites") or []:
            edges.append(Edge(f"Stack/{meta['namespace']}/{prerequisite.get('name')}", me, "prerequisite"))
        program = programs.get((meta.get("namespace"), (spec.get("programRef") or {}).get("name")))
        for reference in [*_stack_references(program or {}), *_strings(spec.get("config") or {})]:
            if by_stack_name.get(reference, me) != me:
                edges.append(Edge(by_stack_name[reference], me, "StackReference"))
        for output in _strings((stack.get("status") or {}).get("outputs") or {}):
            if by_stack_name.get(output, me) != me:
                edges.append(Edge(me, by_stack_name[output], "outputs"))
    for kind in ("Stack", "Program", "Kustomization"):
        for obj in objects.get(kind, ()):
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(FLUX_NAME_LABEL):
                edges.append(Edge(f"Kustomization/{labels.get(FLUX_NAMESPACE_LABEL)}/{labels[FLUX_NAME_LABEL]}",
                                  key(kind, obj), "Flux"))
            for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
                if owner.get("kind") == "Stack":
                    edges.append(Edge(f"Stack/{obj['metadata'].get('namespace')}/{owner.get('name')}", key(kind, obj),
                                      "owner"))
    return list(dict.fromkeys(edges))


NODE_W, NODE_H, COLUMN_GAP, ROW_GAP, MARGIN = 220, 44, 80, 16, 24


BOOTSTRAP = "bootstrap"
# What pulumi-kubernetes labels the objects it creates with: a root Stack carrying it came from a Pulumi
# program outside the cluster, the bootstrap (`make up`).
MANAGED_BY = ("app.kubernetes.io/managed-by", "pulumi")


def layers(objects: Mapping[str, Iterable[Mapping[str, Any]]], namespace: str = "") -> Graph:
    """The layer graph: Stacks and the Kustomizations between them, each in the column of its depth,
    after the bootstrap (the `pulumi up` outside the cluster that created the root Stacks), laid out
    for an SVG; within a column, nodes follow their parents' order."""
    cared = cared_for(objects)
    members = {key(kind, obj): (kind, obj) for kind in ("Stack", "Kustomization") for obj in cared.get(kind, ())
               if not namespace or (obj.get("metadata") or {}).get("namespace") == namespace}
    edges = [e for e in layer_edges(cared) if e.source in members and e.target in members and e.source != e.target]
    parents: dict[str, set[str]] = {k: set() for k in members}
    for edge in edges:
        parents[edge.target].add(edge.source)
    bootstrapped = [k for k, (kind, obj) in members.items() if kind == "Stack" and not parents[k]
                    and ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1]]
    if bootstrapped:
        members[BOOTSTRAP] = ("Pulumi", {"metadata": {"name": "bootstrap (make up)"}})
        parents[BOOTSTRAP] = set()
        for root in bootstrapped:
            edges.append(Edge(BOOTSTRAP, root, "created"))
            parents[root].add(BOOTSTRAP)
    depth: dict[str, int] = {}

    def depth_of(node: str, seen: frozenset[str] = frozenset()) -> int:
        if node not in depth:
            found = 1 + max((depth_of(p, seen | {node}) for p in parents[node] if p not in seen), default=-1)
            depth[node] = found if node == BOOTSTRAP or not bootstrapped else max(found, 1)
        return depth[node]

    for node in members:
        depth_of(node)
    columns = max(depth.values(), default=-1) + 1
    rows: dict[int, list[str]] = {}
    place: dict[str, int] = {}
    by_column: dict[int, list[str]] = {}
    for k in members:
        by_column.setdefault(depth[k], []).append(k)
    for column in range(columns):
        here = by_column.get(column, [])
        here.sort(key=lambda k: (min((place[p] for p in parents[k] if p in place), default=-1),
                                 members[k][0] != "Stack", k))
        rows[column] = here
        place.update({k: i for i, k in enumerate(here)})
    nodes = {}
    for column, keys in rows.items():
        for row, node in enumerate(keys):
            kind, obj = members[node]
            meta = obj["metadata"]
            state = "Ready" if node == BOOTSTRAP else object_state(kind, obj).state
            nodes[node] = Node(node, kind, meta.get("namespace", ""), meta["name"], state, column,
                               MARGIN + column * (NODE_W + COLUMN_GAP), MARGIN + 28 + row * (NODE_H + ROW_GAP),
                               f"/stacks/{meta.get('namespace')}/{meta['name']}" if kind == "Stack" else "")
    tallest = max((len(keys) for keys in rows.values()), default=0)
    names = (LAYER_NAMES if bootstrapped else ())
    return Graph(sorted(nodes.values(), key=lambda n: (n.layer, n.y)),
                 [(e, nodes[e.source], nodes[e.target]) for e in edges],
                 [names[i] if i < len(names) else f"layer {i + (0 if bootstrapped else 1)}" for i in range(columns)],
                 2 * MARGIN + max(columns, 1) * (NODE_W + COLUMN_GAP) - COLUMN_GAP,
                 2 * MARGIN + 28 + max(tallest, 1) * (NODE_H + ROW_GAP))


# -- rollout ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Wave:
    number: int  # from 1, as status.rollout.currentWave counts
    stacks: list[tuple[str, str, str]]  # (name, state, what it ran: the revision or its last failure)
    succeeded: int
    failed: list[str]
    current: bool

    @property
    def percent(self) -> int:
        return round(100 * self.succeeded / len(self.stacks)) if self.stacks else 100


@dataclasses.dataclass(frozen=True)
class Rollout:
    namespace: str
    name: str
    revision: str
    waves: list[Wave]
    halted: str
    complete: bool
    configured: bool


def rollout(program: Mapping[str, Any], stacks: Iterable[Mapping[str, Any]]) -> Rollout:
    """A Program's waves as the operator assigns them (decisions.rollout), each Stack with its state and
    whether it ran the revision, and how far status.rollout says the rollout got."""
    from strata_operator.decisions.rollout import RolloutStack, assign_waves, parse_waves

    meta = program.get("metadata") or {}
    using = [s for s in stacks if (s.get("metadata") or {}).get("namespace") == meta.get("namespace")
             and ((s.get("spec") or {}).get("programRef") or {}).get("name") == meta.get("name")]
    progress = (program.get("status") or {}).get("rollout") or {}
    revision = str(progress.get("revision") or ((program.get("status") or {}).get("artifact") or {}).get("revision", ""))
    members = [RolloutStack(s["metadata"]["name"], s["metadata"].get("labels") or {},
                            (s.get("status") or {}).get("lastUpdate") or {}) for s in using]
    waves_spec = parse_waves(program) or []
    assigned = assign_waves(waves_spec, members)
    by_name = {s["metadata"]["name"]: s for s in using}
    waves = []
    for index in range(max(assigned.values(), default=-1) + 1):
        names = sorted(n for n, wave in assigned.items() if wave == index)
        rows = []
        for name in names:
            member = next(m for m in members if m.name == name)
            ran = ("ran " + revision if member.succeeded(revision) else
                   "failed: " + member.last.get("message", "") if member.failed(revision) else "waiting")
            rows.append((name, object_state("Stack", by_name[name]).state, ran))
        waves.append(Wave(index + 1, rows, sum(1 for m in members if assigned[m.name] == index and m.succeeded(revision)),
                          [m.name for m in members if assigned[m.name] == index and m.failed(revision)],
                          progress.get("currentWave") == index + 1))
    return Rollout(meta.get("namespace", ""), meta.get("name", ""), revision, waves, progress.get("halted", ""),
                   bool(progress.get("complete")), bool(waves_spec))
