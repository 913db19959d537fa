"""PKO v2's Workspace (`auto.pulumi.com/v1alpha1`) for the process executor: pure parsing, then what a
pass needs (env from Secrets and ConfigMaps, the stacks' config, the program fetched into a workdir).

`parse_workspace` turns a spec into a `WorkspaceSpec` (source, env references, stacks, and the pod fields
PKO puts on its workspace pod, kept as given), so a pod executor can build its pod from the same
dataclass. Under the process executor the program runs on the operator's host: the pod fields, a
`securityProfile` other than the schema's default, and env sources only a pod has (`fieldRef` other than
the namespace and ServiceAccount, `resourceFieldRef`, `fileKeyRef`) are listed by `not_applicable`.
`local.dir` (a directory in PKO's workspace image) is read from the operator's host only where operator
refs are allowed (as FS refs are: `--no-operator-refs` forbids both), and is copied, never run in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from . import AUTO_GROUP, AUTO_VERSION
from .redaction import REDACTOR
from .resolve import RefError
from .sources import (FluxArtifact, GitCredentials, GitHubApp, SourceError, download_artifact, git_branch_head,
                      git_checkout, safe_extract, subdir)
from .spec import SpecInvalid, SpecIssue, file_backend_mount
from .workspace_config import ConfigItem, ConfigUnavailable, config_values

DEFAULT_SECURITY_PROFILE = "restricted"  # the CRD's default: on every Workspace, set or not
# What PKO puts on its workspace pod, and only there.
POD_FIELDS = ("image", "imagePullPolicy", "resources", "podTemplate", "serviceTemplate", "pulumiLogLevel")
# fieldRef paths a Workspace's env may use here: what PKO's pod would read from itself.
FIELD_REFS = ("metadata.namespace", "spec.serviceAccountName")
# The engine's own secrets, wherever they come from.
SECRET_VARIABLES = frozenset({"PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN"})
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

ReadMap = Callable[[str, str], Awaitable[dict[str, str] | None]]


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


# --- parsing (pure) ----------------------------------------------------------------------------


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


# --- env and config ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkspaceEnv:
    env: dict[str, str]
    secret_env: frozenset[str]


async def resolve_env(spec: WorkspaceSpec, namespace: str, read_secret: ReadMap,
                      read_configmap: ReadMap) -> WorkspaceEnv:
    """The workspace's environment as a pod would get it (envFrom, then env over it, plus PKO's
    POD_NAMESPACE and POD_SA_NAME). Secret values are registered with the redactor as they are read;
    RefError names the field of a missing Secret, ConfigMap or key."""
    env: dict[str, str] = {"POD_NAMESPACE": namespace, "POD_SA_NAME": spec.service_account_name}
    secret: set[str] = set()

    def put(name: str, value: str, is_secret: bool) -> None:
        env[name] = value
        (secret.add if is_secret else secret.discard)(name)

    for index, source in enumerate(spec.env_from):
        read = read_secret if source.kind == "Secret" else read_configmap
        data = await read(namespace, source.name)
        if data is None:
            if source.optional:
                continue
            key = "secretRef" if source.kind == "Secret" else "configMapRef"
            raise RefError(f"spec.envFrom[{index}].{key}: {source.kind} {source.name!r} not found in namespace "
                           f"{namespace!r}")
        if source.kind == "Secret":
            REDACTOR.add(*data.values())
        for key, value in data.items():
            put(source.prefix + key, value, source.kind == "Secret")
    for var in spec.env:
        ref, kind = (var.secret, "Secret") if var.secret else (var.config_map, "ConfigMap")
        if var.field_path:
            put(var.name, namespace if var.field_path == "metadata.namespace" else spec.service_account_name, False)
        elif ref is None:
            put(var.name, var.value, False)
        else:
            data = await (read_secret if kind == "Secret" else read_configmap)(namespace, ref.name)
            key = "secretKeyRef" if kind == "Secret" else "configMapKeyRef"
            if data is None or ref.key not in data:
                if ref.optional:
                    continue
                what = f"{kind} {ref.name!r} not found in namespace {namespace!r}" if data is None else \
                    f"{kind} {ref.name!r} has no key {ref.key!r}"
                raise RefError(f"spec.env[{var.name}].valueFrom.{key}: {what}")
            if kind == "Secret":
                REDACTOR.add(data[ref.key])
            put(var.name, data[ref.key], kind == "Secret")
    for name in sorted(SECRET_VARIABLES):
        if name in env:
            REDACTOR.add(env[name])
            secret.add(name)
    return WorkspaceEnv(env, frozenset(secret))


async def git_credentials(auth: GitAuthRefs | None, namespace: str, read_secret: ReadMap) -> GitCredentials | None:
    """spec.git.auth's Secrets, in PKO's order (ssh key, token, username/password, GitHub App)."""
    if auth is None:
        return None

    async def value(ref: KeyRef | None, field: str) -> str:
        if ref is None:
            return ""
        data = await read_secret(namespace, ref.name)
        if data is None or ref.key not in data:
            if ref.optional:
                return ""
            raise RefError(f"spec.git.auth.{field}: Secret {ref.name!r} with key {ref.key!r} not found in namespace "
                           f"{namespace!r}")
        REDACTOR.add(data[ref.key])
        return data[ref.key]

    if auth.ssh_private_key:
        creds = GitCredentials(ssh_private_key=await value(auth.ssh_private_key, "sshPrivateKey"),
                               ssh_passphrase=await value(auth.password, "password"))
    elif auth.token:
        creds = GitCredentials(token=await value(auth.token, "token"))
    elif auth.username:
        creds = GitCredentials(username=await value(auth.username, "username"),
                               password=await value(auth.password, "password"))
    elif auth.github_app:
        app_id, installation, key = auth.github_app
        creds = GitCredentials(github_app=GitHubApp(await value(app_id, "githubApp.appID"),
                                                    await value(installation, "githubApp.installationID"),
                                                    await value(key, "githubApp.privateKey")))
    else:
        return None
    creds.register_secrets()
    return creds


def stack_config(stack: WorkspaceStack | None, env: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(config, secret config) of a Workspace's stack, with valueFrom.env read from the workspace's
    environment as PKO's agent does; RefError names the item."""
    try:
        return config_values(stack.config if stack else (), env)
    except ConfigUnavailable as err:
        raise RefError(str(err)) from None


# --- the program on disk ----------------------------------------------------------------------


def resolve_git_ref(url: str, ref: str, creds: GitCredentials | None) -> str:
    """The commit to check out for spec.git.ref: a SHA as given, else the branch, else the tag."""
    if _COMMIT.match(ref):
        return ref
    if ref.startswith("refs/"):
        return git_branch_head(url, ref, creds)
    try:
        return git_branch_head(url, ref, creds)
    except SourceError as err:
        if "not found" not in str(err):
            raise
    try:
        return git_branch_head(url, f"refs/tags/{ref}", creds)
    except SourceError as err:
        if "not found" not in str(err):
            raise
    raise SourceError(f"spec.git.ref: {ref!r} is neither a branch nor a tag of {url}")


def materialise(spec: WorkspaceSpec, dest: Path, creds: GitCredentials | None,
                allow_host_dirs: bool) -> tuple[Path, str]:
    """Write the workspace's program into `dest` (blocking: run it in a thread). Returns (project
    directory, revision); SourceError says why not, naming the field."""
    source = spec.source
    if isinstance(source, ProjectInfoSource):
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "Pulumi.yaml").write_text(json.dumps({"name": source.name, "runtime": source.runtime}) + "\n")
        return dest, f"projectInfo:{source.name}"
    if isinstance(source, GitSource):
        commit = resolve_git_ref(source.url, source.ref, creds)
        revision = git_checkout(source.url, commit, dest, creds)
        return subdir(dest, source.dir.lstrip("/"), "spec.git.dir"), revision
    if isinstance(source, FluxSource):
        dest.mkdir(parents=True, exist_ok=True)
        archive = dest.parent / (dest.name + ".tar.gz")
        try:
            download_artifact(FluxArtifact(source.url, "", source.digest), archive)
            safe_extract(archive, dest)
        finally:
            archive.unlink(missing_ok=True)
        return subdir(dest, source.dir.lstrip("/"), "spec.flux.dir"), source.digest
    if not allow_host_dirs:
        raise SourceError(f"spec.local.dir: {source.dir!r} would be read from the operator's own files, which "
                          "--no-operator-refs forbids here (fix: use spec.git or spec.flux)")
    if not os.path.isfile(os.path.join(source.dir, "Pulumi.yaml")) and \
            not os.path.isfile(os.path.join(source.dir, "Pulumi.yml")):
        raise SourceError(f"spec.local.dir: {source.dir!r} holds no Pulumi project on the operator's host (PKO reads "
                          "it from its workspace image, which the process executor does not run) (fix: put the "
                          "project there, or use spec.git or spec.flux)")
    shutil.copytree(source.dir, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return dest, f"local:{source.dir}"
