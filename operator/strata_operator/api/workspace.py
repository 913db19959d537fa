"""PKO v2's Workspace (`auto.pulumi.com/v1alpha1`): its spec parsed, naming the field (pure).

`parse_workspace` turns a spec into a `WorkspaceSpec` (source, env references, stacks, and the pod fields
PKO puts on its workspace pod, kept as given), so the pod executor builds its pod from the same
dataclass. Under the process executor the program runs on the operator's host: the pod fields, a
`securityProfile` other than the schema's default, and env sources only a pod has (`fieldRef` other than
the namespace and ServiceAccount, `resourceFieldRef`, `fileKeyRef`) are listed by `not_applicable`.
What a pass reads and fetches for it is in sources/workspace_program.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .auto_conditions import READY, is_true
from .stack import DEFAULT_SECURITY_PROFILE, file_backend_mount, git_url_issues
from .validation import SpecInvalid, SpecIssue
from .workspace_values import ConfigItem

# What PKO puts on its workspace pod, and only there.
POD_FIELDS = ("image", "imagePullPolicy", "resources", "podTemplate", "serviceTemplate", "pulumiLogLevel")
# fieldRef paths a Workspace's env may use here: what PKO's pod would read from itself.
FIELD_REFS = ("metadata.namespace", "spec.serviceAccountName")
# The engine's own secrets, wherever they come from.
SECRET_VARIABLES = frozenset({"PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN"})


@dataclasses.dataclass(frozen=True)
class KeyRef:
    """A key of a Secret or ConfigMap (corev1 SecretKeySelector / ConfigMapKeySelector)."""

    name: str
    key: str
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class GitAuthRefs:
    ssh_private_key: KeyRef | None = None
    username: KeyRef | None = None
    password: KeyRef | None = None
    token: KeyRef | None = None
    github_app: tuple[KeyRef, KeyRef, KeyRef] | None = None  # appID, installationID, privateKey


@dataclasses.dataclass(frozen=True)
class GitSource:
    url: str
    ref: str
    dir: str = ""
    auth: GitAuthRefs | None = None


@dataclasses.dataclass(frozen=True)
class FluxSource:
    url: str
    digest: str
    dir: str = ""


@dataclasses.dataclass(frozen=True)
class LocalSource:
    dir: str


@dataclasses.dataclass(frozen=True)
class ProjectInfoSource:
    """No program: a Pulumi.yaml with only the project's name and runtime (PKO: destroy without source)."""

    name: str
    runtime: str


Source = GitSource | FluxSource | LocalSource | ProjectInfoSource


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    value: str = ""
    secret: KeyRef | None = None
    config_map: KeyRef | None = None
    field_path: str = ""  # a supported fieldRef (FIELD_REFS)


@dataclasses.dataclass(frozen=True)
class EnvFrom:
    kind: str  # "Secret" or "ConfigMap"
    name: str
    prefix: str = ""
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class WorkspaceStack:
    name: str
    create: bool | None = None
    secrets_provider: str = ""
    config: tuple[ConfigItem, ...] = ()
    environment: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WorkspaceSpec:
    source: Source
    service_account_name: str = "default"
    env: tuple[EnvVar, ...] = ()
    env_from: tuple[EnvFrom, ...] = ()
    stacks: tuple[WorkspaceStack, ...] = ()
    # PKO's pod settings, as given (image, imagePullPolicy, resources, podTemplate, serviceTemplate,
    # pulumiLogLevel, securityProfile): what a pod executor builds its pod from.
    pod: dict[str, Any] = dataclasses.field(default_factory=dict)

    def stack(self, name: str) -> WorkspaceStack | None:
        return next((s for s in self.stacks if s.name == name), None)


def _key_ref(raw: Any, field: str, issues: list[SpecIssue]) -> KeyRef | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw.get("name") or not raw.get("key"):
        issues.append(SpecIssue(field, "needs a name and a key", "name the Secret and its key"))
        return None
    return KeyRef(str(raw["name"]), str(raw["key"]), bool(raw.get("optional")))


def _source(raw: dict[str, Any], issues: list[SpecIssue]) -> Source | None:
    given = [name for name in ("git", "flux", "local") if raw.get(name)]
    info = raw.get("projectInfo")
    if info:  # PKO: bypasses fetching entirely
        if not info.get("name") or not info.get("runtime"):
            issues.append(SpecIssue("spec.projectInfo", "needs name and runtime", "give both, or remove it"))
            return None
        return ProjectInfoSource(str(info["name"]), str(info["runtime"]))
    if not given:
        issues.append(SpecIssue("spec", "no program source", "give one of spec.git, spec.flux or spec.local"))
        return None
    if len(given) > 1:
        issues.append(SpecIssue(f"spec.{given[1]}", f"several program sources ({', '.join('spec.' + g for g in given)})",
                                "keep exactly one of them"))
        return None
    kind = given[0]
    body = raw[kind]
    directory = str(body.get("dir") or "")
    if kind == "git":
        if not body.get("url"):
            issues.append(SpecIssue("spec.git.url", "empty", "give the repository's URL"))
        else:
            issues += git_url_issues("spec.git.url", str(body["url"]))
        if not body.get("ref"):
            issues.append(SpecIssue("spec.git.ref", "empty", "name a branch, tag or commit SHA"))
        auth = body.get("auth") or None
        refs = None
        if auth:
            app = auth.get("githubApp")
            app_refs = None
            if app:
                parts = [_key_ref(app.get(k), f"spec.git.auth.githubApp.{k}", issues)
                         for k in ("appID", "installationID", "privateKey")]
                app_refs = tuple(parts) if all(parts) else None  # type: ignore[assignment]
            refs = GitAuthRefs(*(_key_ref(auth.get(k), f"spec.git.auth.{k}", issues)
                                 for k in ("sshPrivateKey", "username", "password", "token")),
                               github_app=app_refs)
        return GitSource(str(body.get("url") or ""), str(body.get("ref") or ""), directory, refs)
    if kind == "flux":
        for key, fix in (("url", "give the artifact's URL (a Flux source's status.artifact.url)"),
                         ("digest", "give the artifact's digest (status.artifact.digest), e.g. sha256:...")):
            if not body.get(key):
                issues.append(SpecIssue(f"spec.flux.{key}", "empty", fix))
        if body.get("url") and not str(body["url"]).lower().startswith(("http://", "https://")):
            issues.append(SpecIssue("spec.flux.url", f"{body['url']!r} is not an http:// or https:// URL: the operator "
                                    "fetches artifacts from a server, never from its own files",
                                    "give the artifact's URL on its server (a Flux source's status.artifact.url)"))
        return FluxSource(str(body.get("url") or ""), str(body.get("digest") or ""), directory)
    if not directory.startswith("/"):
        issues.append(SpecIssue("spec.local.dir", f"{directory!r} is not an absolute path",
                                "give the project directory's absolute path"))
    return LocalSource(directory)


def _env(raw: dict[str, Any], issues: list[SpecIssue]) -> tuple[tuple[EnvVar, ...], tuple[EnvFrom, ...]]:
    env = []
    for item in raw.get("env") or []:
        name = str(item.get("name") or "")
        field = f"spec.env[{name}]"
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            env.append(EnvVar(name, secret=_key_ref(source["secretKeyRef"], f"{field}.valueFrom.secretKeyRef", issues)))
        elif "configMapKeyRef" in source:
            env.append(EnvVar(name, config_map=_key_ref(source["configMapKeyRef"],
                                                        f"{field}.valueFrom.configMapKeyRef", issues)))
        elif (source.get("fieldRef") or {}).get("fieldPath") in FIELD_REFS:
            env.append(EnvVar(name, field_path=source["fieldRef"]["fieldPath"]))
        elif not source:
            env.append(EnvVar(name, value=str(item.get("value") or "")))
        # Other sources only a pod has: listed by not_applicable, the variable left unset.
    env_from = []
    for index, item in enumerate(raw.get("envFrom") or []):
        for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            ref = item.get(key)
            if ref is None:
                continue
            if not ref.get("name"):
                issues.append(SpecIssue(f"spec.envFrom[{index}].{key}.name", "empty", f"name the {kind}"))
                continue
            env_from.append(EnvFrom(kind, str(ref["name"]), str(item.get("prefix") or ""), bool(ref.get("optional"))))
    return tuple(env), tuple(env_from)


def _stacks(raw: dict[str, Any], issues: list[SpecIssue]) -> tuple[WorkspaceStack, ...]:
    stacks = []
    for s_index, item in enumerate(raw.get("stacks") or []):
        config = []
        for c_index, entry in enumerate(item.get("config") or []):
            field = f"spec.stacks[{s_index}].config[{c_index}]"
            source = entry.get("valueFrom") or {}
            if source.get("path"):
                issues.append(SpecIssue(f"{field}.valueFrom.path", f"{source['path']!r} is a file in PKO's workspace "
                                        "pod; the process executor runs on the operator's host and does not read it",
                                        "put the value in a Secret and use valueFrom.env with spec.env's "
                                        "secretKeyRef"))
                continue
            if entry.get("path") and entry.get("secret"):
                issues.append(SpecIssue(field, "a secret path value is not supported by the process executor",
                                        "set the whole object as the secret value, without path"))
                continue
            if entry.get("path") and isinstance(entry.get("value"), (dict, list)):
                issues.append(SpecIssue(f"{field}.value", "path is incompatible with structured values (as in PKO)",
                                        "give a string, or drop path and give the whole object"))
                continue
            config.append(ConfigItem(str(entry.get("key") or ""), field, entry.get("value"), bool(entry.get("path")),
                                     str(source.get("env") or ""), bool(source.get("json")),
                                     bool(entry.get("secret"))))
        stacks.append(WorkspaceStack(str(item.get("name") or ""), item.get("create"),
                                     str(item.get("secretsProvider") or ""), tuple(config),
                                     tuple(str(e) for e in item.get("environment") or ())))
    return tuple(stacks)


def parse_workspace(raw: dict[str, Any] | None) -> WorkspaceSpec:
    """A Workspace spec as a dataclass; SpecInvalid naming each field that cannot be used, with its fix."""
    raw = dict(raw or {})
    issues: list[SpecIssue] = []
    source = _source(raw, issues)
    env, env_from = _env(raw, issues)
    stacks = _stacks(raw, issues)
    pod = {key: raw[key] for key in (*POD_FIELDS, "securityProfile") if key in raw}
    if issues or source is None:
        raise SpecInvalid(issues)
    return WorkspaceSpec(source, str(raw.get("serviceAccountName") or "default"), env, env_from, stacks, pod)


def not_applicable(raw: dict[str, Any] | None, in_workspace_pods: bool = False) -> list[str]:
    """The spec fields this executor accepts and cannot apply: the process executor runs on the operator's
    host, so PKO's pod fields; the pod executor's pod has no Service and its own log level."""
    raw = raw or {}
    pod_fields = ("serviceTemplate", "pulumiLogLevel") if in_workspace_pods else POD_FIELDS
    fields = [f"spec.{key}" for key in pod_fields if raw.get(key) not in (None, "", {}, [], 0)]
    if raw.get("securityProfile") not in (None, "", DEFAULT_SECURITY_PROFILE):
        fields.append("spec.securityProfile")
    for item in (raw.get("env") or []) if not in_workspace_pods else ():
        source = item.get("valueFrom") or {}
        for kind in ("fieldRef", "resourceFieldRef", "fileKeyRef"):
            if kind in source and not (kind == "fieldRef" and source[kind].get("fieldPath") in FIELD_REFS):
                fields.append(f"spec.env[{item.get('name')}].valueFrom.{kind}")
    return fields


def misplaced_backend(raw: dict[str, Any] | None, env: Mapping[str, str], in_workspace_pods: bool) -> SpecIssue | None:
    """A file:// backend (spec.env's PULUMI_BACKEND_URL) where its state would not last: inside a volume only
    PKO's pod has, under the process executor (PKO's e2e keeps state at /state, a PVC); on no volume of the
    pod, under the pod executor, where it would go with the pod."""
    backend = env.get("PULUMI_BACKEND_URL", "")
    if not backend.startswith("file://"):
        return None
    found = file_backend_mount(backend, {"spec": raw or {}})
    if in_workspace_pods:
        return None if found is not None else SpecIssue(
            "spec.env[PULUMI_BACKEND_URL]", f"the file:// backend {backend!r} is on no volume of the workspace pod: "
            "its state would be lost with the pod", "mount a PersistentVolumeClaim there through spec.podTemplate.spec "
            "(volumes, and volumeMounts of the container named 'pulumi'), or use a cloud backend")
    if found is None:
        return None
    mount, volume = found
    return SpecIssue("spec.env[PULUMI_BACKEND_URL]",
                     f"the file:// backend {backend!r} is inside the volume {volume!r} that spec.podTemplate "
                     f"mounts at {mount} in PKO's workspace pod; the process executor runs on the operator's host, "
                     "which has no such volume", "use a backend the operator's host can reach (a file:// directory "
                     "of its own, or a cloud backend), or run the operator with --executor pod")


def literal_env(spec: WorkspaceSpec) -> dict[str, str]:
    """spec.env's plain values: what the operator knows of a pod executor's workspace environment."""
    return {var.name: var.value for var in spec.env if not (var.secret or var.config_map or var.field_path)}


def workspace_ready(workspace: dict[str, Any] | None) -> bool:
    """PKO's isWorkspaceReady: not being deleted, status for the current generation, Ready=True."""
    if not workspace or workspace.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = workspace.get("status") or {}
    return status.get("observedGeneration") == workspace["metadata"].get("generation") and is_true(status, READY)
