"""The Stack and Program APIs (`pulumi.com/v1`) as typed models, with validation that names the field.

Field names, nesting and defaults follow the Pulumi Kubernetes Operator: every v1 field, and the
v2 fields applied unchanged. `parse_stack_spec` turns a `.spec` dict into a `StackSpec` or raises
`SpecInvalid` whose issues each name the field path (``spec.gitAuth.basicAuth.password``) and the
fix. The CRD schema rejects most of these up front; this is the same contract for whatever gets
past it (older CRDs, `x-kubernetes-preserve-unknown-fields` parts, cross-field rules).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from .validation import ApiModel, SpecInvalid, SpecIssue, parse_duration, pydantic_issues
from .workspace_template import ReservedPlacement, template_issues

# Fields PKO v2 accepts that describe its pod-per-workspace machinery. They have no meaning for
# how Strata runs updates; they are accepted and reported once as an Event.
NOT_APPLICABLE_FIELDS = ("workspaceTemplate", "workspaceReclaimPolicy", "updateTemplate")
MIN_RESYNC_SECONDS = 60

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STACK_NAME = re.compile(r"^(?:[A-Za-z0-9_.-]+/){0,2}[A-Za-z0-9_.-]+$")
_CONFIG_KEY = re.compile(r"^(?:[A-Za-z0-9_.-]+:)?[A-Za-z0-9_.\-\[\]\"]+$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# A DNS subdomain (RFC 1123), as Secret names are; the CRD has the same pattern.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_REPO_URL = re.compile(r"^(?:(?:https?|ssh|git)://\S+|[\w.-]+@[\w.-]+:\S+)$")
# Flux source kinds whose objects the operator watches, so a new artifact wakes the Stack at once. Any
# other kind with an artifact (HelmChart, ExternalArtifact, ...) is accepted too, and polled.
WATCHED_FLUX_KINDS = ("GitRepository", "OCIRepository", "Bucket")
# PKO's order when a Stack names several sources: the first present is used, the rest are ignored.
SOURCE_ORDER = (("git", "projectRepo"), ("flux", "fluxSource"), ("program", "programRef"),
                # PKO v2: a directory of the workspace pod (its image, or a volume), used when nothing else is named.
                ("local", "workspaceTemplate.spec.local"))


class LiteralRef(ApiModel):
    value: str


class EnvSelector(ApiModel):
    name: str


class FSSelector(ApiModel):
    path: str


class SecretSelector(ApiModel):
    name: str
    key: str
    namespace: str = ""


class ResourceRef(ApiModel):
    """Where a value comes from: a literal, a Secret key, or the operator's env or filesystem."""

    type: Literal["Literal", "Secret", "Env", "FS"]
    literal: LiteralRef | None = None
    secret: SecretSelector | None = None
    env: EnvSelector | None = None
    filesystem: FSSelector | None = None


class ConfigMapRef(ApiModel):
    name: str
    key: str
    json_: bool = Field(default=False, alias="json")


class BasicAuth(ApiModel):
    user_name: ResourceRef = Field(alias="userName")
    password: ResourceRef


class SSHAuth(ApiModel):
    ssh_private_key: ResourceRef = Field(alias="sshPrivateKey")
    password: ResourceRef | None = None


class GitHubAppAuth(ApiModel):
    """PKO v2.7: a GitHub App's credentials, exchanged at api.github.com for an installation token."""

    app_id: ResourceRef = Field(alias="appID")
    installation_id: ResourceRef = Field(alias="installationID")
    private_key: ResourceRef = Field(alias="privateKey")


class GitAuth(ApiModel):
    access_token: ResourceRef | None = Field(default=None, alias="accessToken")
    ssh_auth: SSHAuth | None = Field(default=None, alias="sshAuth")
    basic_auth: BasicAuth | None = Field(default=None, alias="basicAuth")
    github_app: GitHubAppAuth | None = Field(default=None, alias="githubApp")

    @property
    def modes(self) -> list[str]:
        return [alias for alias, value in (("accessToken", self.access_token), ("sshAuth", self.ssh_auth),
                                           ("basicAuth", self.basic_auth), ("githubApp", self.github_app))
                if value is not None]


class FluxSourceRef(ApiModel):
    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str


def _inside_source(value: str) -> str:
    # PKO reads repoDir and fluxSource.dir relative to the source whatever their leading '/' (its
    # stack-examples use repoDir: /kubernetes-ts-nginx): a leading '/' is the source's root, not the host's.
    return value.lstrip("/")


class FluxSource(ApiModel):
    source_ref: FluxSourceRef = Field(alias="sourceRef")
    dir: str = ""

    _dir_inside_source = field_validator("dir")(_inside_source)


class ProgramRef(ApiModel):
    name: str


class Requirement(ApiModel):
    succeeded_within_duration: str | None = Field(default=None, alias="succeededWithinDuration")


class Prerequisite(ApiModel):
    name: str
    requirement: Requirement | None = None
    # Strata: the prerequisite's outputs this Stack consumes; only a change of these re-runs it (all when unset).
    outputs: list[str] | None = None


class OutputsSecret(ApiModel):
    """Strata: the Secret (in the Stack's namespace) that receives every output's real value."""

    name: str


class Approval(ApiModel):
    """Strata: `Manual` previews and saves a plan on every change and applies it only once approved."""

    mode: Literal["Auto", "Manual"] = "Auto"


class DriftDetection(ApiModel):
    """Strata: a refresh preview every `interval` finds changes made outside Pulumi; `remediate` runs an
    update (with refresh) when it finds some."""

    interval: str = "1h"
    remediate: bool = False


class StackSpec(ApiModel):
    """`Stack.spec`: PKO v1 fields plus the v2 fields Strata honours or accepts."""

    stack: str
    backend: str = ""
    secrets_provider: str = Field(default="", alias="secretsProvider")
    use_local_stack_only: bool = Field(default=False, alias="useLocalStackOnly")
    # git source
    project_repo: str = Field(default="", alias="projectRepo")
    commit: str = ""
    branch: str = ""
    repo_dir: str = Field(default="", alias="repoDir")
    git_auth: GitAuth | None = Field(default=None, alias="gitAuth")
    git_auth_secret: str = Field(default="", alias="gitAuthSecret")
    shallow: bool = False
    # other sources
    flux_source: FluxSource | None = Field(default=None, alias="fluxSource")
    program_ref: ProgramRef | None = Field(default=None, alias="programRef")
    # environment and config
    env_refs: dict[str, ResourceRef] = Field(default_factory=dict, alias="envRefs")
    envs: list[str] = Field(default_factory=list)
    env_secrets: list[str] = Field(default_factory=list, alias="envSecrets")
    access_token_secret: str = Field(default="", alias="accessTokenSecret")
    config: dict[str, Any] = Field(default_factory=dict)
    config_ref: dict[str, ConfigMapRef] = Field(default_factory=dict, alias="configRef")
    secrets_ref: dict[str, ResourceRef] = Field(default_factory=dict, alias="secretsRef")
    secrets: dict[str, str] = Field(default_factory=dict)
    environment: list[str] = Field(default_factory=list)
    # lifecycle
    refresh: bool = False
    expect_no_refresh_changes: bool = Field(default=False, alias="expectNoRefreshChanges")
    targets: list[str] = Field(default_factory=list)
    target_dependents: bool = Field(default=False, alias="targetDependents")
    prerequisites: list[Prerequisite] = Field(default_factory=list)
    continue_resync_on_commit_match: bool = Field(default=False, alias="continueResyncOnCommitMatch")
    resync_frequency_seconds: int = Field(default=0, alias="resyncFrequencySeconds")
    destroy_on_finalize: bool = Field(default=False, alias="destroyOnFinalize")
    # PKO v2: run the program during the destroy on finalize (pulumi destroy --run-program).
    run_program: bool = Field(default=False, alias="runProgram")
    retry_on_update_conflict: bool = Field(default=False, alias="retryOnUpdateConflict")
    retry_max_backoff_duration_seconds: int = Field(default=0, alias="retryMaxBackoffDurationSeconds")
    preview: bool = False
    # Strata, Flux's convention: no runs while true (deletion still destroys).
    suspend: bool = False
    # Strata: write every output (secret ones with their real values) into this Secret after each update.
    outputs_secret: OutputsSecret | None = Field(default=None, alias="outputsSecret")
    # Strata: approve exactly the plan a preview saved (decisions/approval.py).
    approval: Approval | None = None
    drift_detection: DriftDetection | None = Field(default=None, alias="driftDetection")
    service_account_name: str = Field(default="", alias="serviceAccountName")
    # accepted, not applicable (see NOT_APPLICABLE_FIELDS)
    workspace_template: dict[str, Any] | None = Field(default=None, alias="workspaceTemplate")
    workspace_reclaim_policy: str = Field(default="", alias="workspaceReclaimPolicy")
    update_template: dict[str, Any] | None = Field(default=None, alias="updateTemplate")

    _repo_dir_inside_source = field_validator("repo_dir")(_inside_source)

    @property
    def sources(self) -> list[str]:
        """The sources the spec names, in PKO's order of preference (git, Flux, Program)."""
        present = {"git": bool(self.project_repo), "flux": self.flux_source is not None,
                   "program": self.program_ref is not None, "local": bool(self.local_dir)}
        return [kind for kind, _ in SOURCE_ORDER if present[kind]]

    @property
    def local_dir(self) -> str:
        """spec.workspaceTemplate.spec.local.dir: the program's directory inside the workspace pod."""
        local = ((self.workspace_template or {}).get("spec") or {}).get("local") or {}
        return str(local.get("dir") or "") if isinstance(local, dict) else ""

    @property
    def source_kind(self) -> Literal["git", "flux", "program", "local"]:
        """The source used: the first in PKO's order (parse_stack_spec ensures there is one)."""
        return self.sources[0] if self.sources else "git"  # type: ignore[return-value]

    @property
    def polled(self) -> bool:
        """Whether the source must be polled every resync period: a branch (ls-remote) or a Flux source of a
        kind the operator does not watch. Other sources wake the Stack through their watch events."""
        if self.source_kind == "git":
            return bool(self.branch)
        if self.source_kind == "flux" and self.flux_source is not None:
            return self.flux_source.source_ref.kind not in WATCHED_FLUX_KINDS
        return False

    @property
    def manual_approval(self) -> bool:
        return self.approval is not None and self.approval.mode == "Manual"

    def resync_seconds(self, floor: int = MIN_RESYNC_SECONDS) -> int:
        """PKO semantics: unset or below the minimum (`floor`, 60 s unless the operator lowers it) means it."""
        return max(self.resync_frequency_seconds, floor)


# PKO v1's reason for a Secret ref into another namespace.
STALLED_CROSS_NAMESPACE_REF = "CrossNamespaceRefForbidden"


def _ref_issues(path: str, ref: ResourceRef, namespace: str) -> list[SpecIssue]:
    selector = {"Literal": "literal", "Secret": "secret", "Env": "env", "FS": "filesystem"}[ref.type]
    present = [k for k in ("literal", "secret", "env", "filesystem") if getattr(ref, k) is not None]
    issues = []
    if selector not in present:
        issues.append(SpecIssue(f"{path}.{selector}", f"type is {ref.type!r} but {selector!r} is missing",
                                f"add {selector}: {{...}} or change type"))
    extra = [k for k in present if k != selector]
    if extra:
        issues.append(SpecIssue(f"{path}.{extra[0]}", f"{extra[0]!r} does not match type {ref.type!r}",
                                f"remove {extra[0]!r} or set type accordingly"))
    if ref.secret is not None:
        if not ref.secret.name or not _DNS_NAME.match(ref.secret.name):
            issues.append(SpecIssue(f"{path}.secret.name", "not a valid Secret name",
                                    "use the name of a Secret in the Stack's namespace"))
        if not ref.secret.key:
            issues.append(SpecIssue(f"{path}.secret.key", "empty key", "name a key of the Secret"))
        if ref.secret.namespace and ref.secret.namespace != namespace:
            issues.append(SpecIssue(f"{path}.secret.namespace", "cross-namespace refs are not allowed",
                                    f"remove namespace or set it to {namespace!r}", STALLED_CROSS_NAMESPACE_REF))
    if ref.env is not None and not _ENV_NAME.match(ref.env.name):
        issues.append(SpecIssue(f"{path}.env.name", "not an environment variable name",
                                "use letters, digits and underscores"))
    if ref.filesystem is not None and not ref.filesystem.path.startswith("/"):
        issues.append(SpecIssue(f"{path}.filesystem.path", "not an absolute path", "use an absolute path"))
    return issues


def git_url_issues(path: str, url: str) -> list[SpecIssue]:
    """A repository the operator may fetch for a team: a git server's, never one on the operator's own
    filesystem (file://, a local path), where a team could make it read any repository of the host or pod."""
    if url.lower().startswith("file:") or url.startswith(("/", ".", "~")):
        return [SpecIssue(path, f"{url!r} is a repository on the operator's own filesystem, which it never reads "
                                "for a team", "serve the repository from a git server (https://, ssh:// or "
                                "user@host:path)")]
    if not _REPO_URL.match(url):
        return [SpecIssue(path, "not a git URL", "use https://, ssh://, git:// or user@host:path")]
    return []


def _relative_dir_issue(path: str, value: str) -> list[SpecIssue]:
    if ".." in value.split("/"):
        return [SpecIssue(path, "must be a path inside the source", "remove '..'")]
    return []


def _semantic_issues(spec: StackSpec, namespace: str) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    if not _STACK_NAME.match(spec.stack):
        issues.append(SpecIssue("spec.stack", f"{spec.stack!r} is not a stack name",
                                "use <stack>, <org>/<stack> or <org>/<project>/<stack>"))
    git = bool(spec.project_repo)  # first in PKO's order: used whenever given
    if not spec.sources:
        issues.append(SpecIssue("spec", "no program source",
                                "set one of spec.projectRepo, spec.fluxSource, spec.programRef, or (with the pod "
                                "executor) spec.workspaceTemplate.spec.local.dir"))
    if spec.local_dir and not spec.local_dir.startswith("/"):
        issues.append(SpecIssue("spec.workspaceTemplate.spec.local.dir", f"{spec.local_dir!r} is not an absolute path",
                                "name the program's directory in the workspace pod from its root, e.g. /program"))
    if not git:
        for name, value in (("commit", spec.commit), ("branch", spec.branch), ("repoDir", spec.repo_dir),
                            ("gitAuthSecret", spec.git_auth_secret)):
            if value:
                issues.append(SpecIssue(f"spec.{name}", "only applies to a git source (spec.projectRepo)",
                                        f"remove spec.{name} or set spec.projectRepo"))
        if spec.git_auth is not None:
            issues.append(SpecIssue("spec.gitAuth", "only applies to a git source (spec.projectRepo)",
                                    "remove spec.gitAuth or set spec.projectRepo"))
    else:
        issues += git_url_issues("spec.projectRepo", spec.project_repo)
        if bool(spec.commit) == bool(spec.branch):
            issues.append(SpecIssue("spec.commit" if spec.commit else "spec.branch",
                                    "exactly one of commit and branch must be set",
                                    "set spec.commit to a SHA or spec.branch to a branch name, not both"))
        if spec.commit and not re.fullmatch(r"[0-9a-fA-F]{7,64}", spec.commit):
            issues.append(SpecIssue("spec.commit", "not a commit SHA", "use a hex commit SHA (7-64 digits)"))
        issues += _relative_dir_issue("spec.repoDir", spec.repo_dir)
    if spec.git_auth is not None:
        modes = spec.git_auth.modes
        if len(modes) != 1:
            issues.append(SpecIssue("spec.gitAuth", f"exactly one auth mode must be set, found {modes or 'none'}",
                                    "set one of accessToken, sshAuth, basicAuth, githubApp"))
        for field, ref in git_auth_refs(spec.git_auth):
            issues += _ref_issues(field, ref, namespace)
    if spec.git_auth is not None and spec.git_auth_secret:
        issues.append(SpecIssue("spec.gitAuthSecret", "conflicts with spec.gitAuth",
                                "remove the deprecated spec.gitAuthSecret"))
    if spec.flux_source is not None:
        ref = spec.flux_source.source_ref
        group = ref.api_version.split("/")[0]
        if group != "source.toolkit.fluxcd.io" or "/" not in ref.api_version:
            issues.append(SpecIssue("spec.fluxSource.sourceRef.apiVersion", f"{ref.api_version!r} is not a Flux source API",
                                    "use source.toolkit.fluxcd.io/v1 (or v1beta2)"))
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", ref.kind):
            issues.append(SpecIssue("spec.fluxSource.sourceRef.kind", f"{ref.kind!r} is not a Kubernetes kind",
                                    "use the kind of a Flux source, e.g. GitRepository, OCIRepository, HelmChart"))
        if not _DNS_NAME.match(ref.name):
            issues.append(SpecIssue("spec.fluxSource.sourceRef.name", "not an object name",
                                    "use the name of the source object in the Stack's namespace"))
        issues += _relative_dir_issue("spec.fluxSource.dir", spec.flux_source.dir)
    if spec.program_ref is not None and not _DNS_NAME.match(spec.program_ref.name):
        issues.append(SpecIssue("spec.programRef.name", "not an object name",
                                "use the name of a Program in the Stack's namespace"))
    for key, ref in spec.env_refs.items():
        if not _ENV_NAME.match(key):
            issues.append(SpecIssue(f"spec.envRefs.{key}", "not an environment variable name",
                                    "use letters, digits and underscores, not starting with a digit"))
        issues += _ref_issues(f"spec.envRefs.{key}", ref, namespace)
    for key, ref in spec.secrets_ref.items():
        issues += _ref_issues(f"spec.secretsRef.{key}", ref, namespace)
    for field, keys in (("config", spec.config), ("secrets", spec.secrets), ("configRef", spec.config_ref),
                        ("secretsRef", spec.secrets_ref)):
        for key in keys:
            if not _CONFIG_KEY.match(key):
                issues.append(SpecIssue(f"spec.{field}.{key}", "not a config key", "use [namespace:]key"))
    for key, cref in spec.config_ref.items():
        if not _DNS_NAME.match(cref.name):
            issues.append(SpecIssue(f"spec.configRef.{key}.name", "not a ConfigMap name",
                                    "use the name of a ConfigMap in the Stack's namespace"))
    overlap = (set(spec.config) | set(spec.config_ref)) & (set(spec.secrets) | set(spec.secrets_ref))
    for key in sorted(overlap):
        issues.append(SpecIssue(f"spec.secretsRef.{key}", "key is also set as plain config",
                                "set each config key once, either in config or in secretsRef"))
    for i, target in enumerate(spec.targets):
        # pulumi --target takes URNs and URN globs ("**", "urn:pulumi:dev::app::*"), as PKO passes them on.
        if not (target.startswith("urn:pulumi:") or "*" in target):
            issues.append(SpecIssue(f"spec.targets[{i}]", "not a resource URN or URN glob",
                                    "use a URN like urn:pulumi:<stack>::<project>::<type>::<name>, or a glob such as **"))
    names = set()
    for i, prereq in enumerate(spec.prerequisites):
        if not _DNS_NAME.match(prereq.name):
            issues.append(SpecIssue(f"spec.prerequisites[{i}].name", "not a Stack name",
                                    "use the name of a Stack in the same namespace"))
        if prereq.name in names:
            issues.append(SpecIssue(f"spec.prerequisites[{i}].name", "listed twice", "list each prerequisite once"))
        names.add(prereq.name)
        for j, output in enumerate(prereq.outputs or []):
            if not output:
                issues.append(SpecIssue(f"spec.prerequisites[{i}].outputs[{j}]", "empty output name",
                                        "name an output of the prerequisite Stack"))
            elif output in (prereq.outputs or [])[:j]:
                issues.append(SpecIssue(f"spec.prerequisites[{i}].outputs[{j}]", "listed twice",
                                        "list each output once"))
        if prereq.outputs is not None and not prereq.outputs:
            issues.append(SpecIssue(f"spec.prerequisites[{i}].outputs", "empty list",
                                    "name the outputs this Stack consumes, or remove the field to consume all"))
        within = prereq.requirement.succeeded_within_duration if prereq.requirement else None
        if within is not None:
            try:
                parse_duration(within)
            except ValueError:
                issues.append(SpecIssue(f"spec.prerequisites[{i}].requirement.succeededWithinDuration",
                                        f"{within!r} is not a duration", "use a Go duration like 1h or 90s"))
    if spec.resync_frequency_seconds < 0:
        issues.append(SpecIssue("spec.resyncFrequencySeconds", "negative", f"use 0 (default) or >= {MIN_RESYNC_SECONDS}"))
    if not 0 <= spec.retry_max_backoff_duration_seconds <= 86400:
        issues.append(SpecIssue("spec.retryMaxBackoffDurationSeconds", "out of range", "use 0 (default) to 86400"))
    if spec.service_account_name and not _DNS_NAME.match(spec.service_account_name):
        issues.append(SpecIssue("spec.serviceAccountName", "not a ServiceAccount name",
                                "use the name of a ServiceAccount in the Stack's namespace"))
    if spec.outputs_secret is not None:
        name = spec.outputs_secret.name
        if not name or len(name) > 253 or not _SUBDOMAIN.match(name):
            issues.append(SpecIssue("spec.outputsSecret.name", f"{name!r} is not a Secret name",
                                    "use lowercase letters, digits, '-' and '.', starting and ending with a letter "
                                    "or digit (at most 253)"))
        if spec.preview:
            issues.append(SpecIssue("spec.outputsSecret", "a preview Stack has no outputs to write",
                                    "remove spec.outputsSecret or spec.preview"))
    if spec.drift_detection is not None:
        try:
            if parse_duration(spec.drift_detection.interval) <= 0:
                raise ValueError(spec.drift_detection.interval)
        except ValueError:
            issues.append(SpecIssue("spec.driftDetection.interval", f"{spec.drift_detection.interval!r} is not a "
                                    "positive duration", "use a Go duration such as 30m or 1h"))
        if spec.preview and spec.drift_detection.remediate:
            issues.append(SpecIssue("spec.driftDetection.remediate", "a preview Stack never updates",
                                    "remove remediate or preview"))
    if spec.preview and spec.manual_approval:
        issues.append(SpecIssue("spec.approval.mode", "a preview Stack never applies anything to approve",
                                "remove approval or preview"))
    if spec.preview and spec.destroy_on_finalize:
        issues.append(SpecIssue("spec.destroyOnFinalize", "a preview Stack never creates resources to destroy",
                                "remove destroyOnFinalize or preview"))
    if spec.run_program and not spec.destroy_on_finalize:
        issues.append(SpecIssue("spec.runProgram", "only applies to the destroy of spec.destroyOnFinalize",
                                "set spec.destroyOnFinalize or remove spec.runProgram"))
    if spec.target_dependents and not spec.targets:
        issues.append(SpecIssue("spec.targetDependents", "only applies with spec.targets", "set spec.targets or remove it"))
    return issues


def parse_stack_spec(raw: dict[str, Any] | None, namespace: str) -> StackSpec:
    """Validate a Stack's `.spec`; raise SpecInvalid naming every bad field."""
    try:
        spec = StackSpec.model_validate(raw or {})
    except ValidationError as err:
        raise SpecInvalid(pydantic_issues(err)) from None
    issues = _semantic_issues(spec, namespace)
    if issues:
        raise SpecInvalid(issues)
    return spec


# With the pod executor: the parts of workspaceTemplate that Strata's workspace pod cannot honour (the
# Stack's own fields say what the program is and which stack it runs).
POD_NOT_APPLICABLE_FIELDS = ("serviceTemplate", "stacks", "pulumiLogLevel", "git", "flux")
# PKO's default (the CRD's, on every Workspace, set or not), and the only profile of Strata's workspace pods.
DEFAULT_SECURITY_PROFILE = "restricted"


def not_applicable_fields(raw: dict[str, Any], in_workspace_pods: bool = False) -> list[str]:
    if not in_workspace_pods:
        return [f for f in NOT_APPLICABLE_FIELDS if raw.get(f) not in (None, "", {}, [])]
    template = ((raw.get("workspaceTemplate") or {}).get("spec") or {})
    return [*(f"workspaceTemplate.spec.{f}" for f in POD_NOT_APPLICABLE_FIELDS
              if template.get(f) not in (None, "", {}, [])),
            # The pod is hardened to `restricted` whatever the template's profile (PKO's `baseline` loosens it).
            *(["workspaceTemplate.spec.securityProfile"]
              if template.get("securityProfile") not in (None, "", DEFAULT_SECURITY_PROFILE) else []),
            *(f for f in ("updateTemplate",) if raw.get(f) not in (None, "", {}, []))]


def workspace_template_issues(spec: StackSpec, in_workspace_pods: bool, reserved: ReservedPlacement) -> list[SpecIssue]:
    """What spec.workspaceTemplate asks of the workspace pod that a team may not have (workspace_template.py).
    The process executor builds no pod from it: it is only reported as not applicable there."""
    if not in_workspace_pods or spec.workspace_template is None:
        return []
    return template_issues(spec.workspace_template.get("spec"), "spec.workspaceTemplate.spec", reserved)


def workspace_mounts(workspace_template: dict[str, Any] | None) -> dict[str, str]:
    """Mount path -> volume name of the containers of PKO v2's workspace pod (spec.workspaceTemplate)."""
    pod = (((workspace_template or {}).get("spec") or {}).get("podTemplate") or {}).get("spec") or {}
    mounts: dict[str, str] = {}
    for container in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]:
        for mount in (container or {}).get("volumeMounts") or []:
            if isinstance(mount, dict) and isinstance(mount.get("mountPath"), str):
                mounts[mount["mountPath"].rstrip("/") or "/"] = str(mount.get("name", ""))
    return mounts


def file_backend_mount(backend_url: str, workspace_template: dict[str, Any] | None) -> tuple[str, str] | None:
    """(mount path, volume name) of PKO v2's workspace pod that holds a file:// backend's directory, if any."""
    path = backend_url.removeprefix("file://").rstrip("/") or "/"
    mounts = workspace_mounts(workspace_template)
    mount = next((m for m in sorted(mounts, key=len, reverse=True)
                  if path == m or path.startswith(m.rstrip("/") + "/")), None)
    return (mount, mounts[mount]) if mount is not None else None


def misplaced_file_backend(spec: StackSpec, backend_url: str, in_workspace_pods: bool) -> SpecIssue | None:
    """A file:// backend where its state would not last. PKO keeps file state on a volume of its workspace
    pod (its e2e Stacks: a PersistentVolumeClaim at /state). The process executor runs updates on the
    operator's host, which has no such volume: the state would land in the host's directory instead.
    The pod executor has the volumes, but state anywhere else in the pod goes with the pod. Named, never run."""
    if not backend_url.startswith("file://"):
        return None
    found = file_backend_mount(backend_url, spec.workspace_template)
    field = "spec.backend" if spec.backend else "spec.envRefs.PULUMI_BACKEND_URL"
    if in_workspace_pods and found is None:
        return SpecIssue(field, f"the file:// backend {backend_url!r} is on no volume of the workspace pod "
                                "(spec.workspaceTemplate): its state would be lost with the pod",
                         "mount a PersistentVolumeClaim there through spec.workspaceTemplate.spec.podTemplate.spec "
                         "(volumes, and volumeMounts of the container named 'pulumi'), or use a cloud backend")
    if in_workspace_pods or found is None:
        return None
    mount, volume = found
    return SpecIssue(field, f"the file:// backend {backend_url!r} is inside the volume {volume!r} that PKO "
                            f"mounts at {mount} in its workspace pod (spec.workspaceTemplate); this operator runs "
                            "updates on its own host (--executor process), which has no such volume",
                     "use a backend the operator's host can reach (a file:// directory of its own, or a cloud "
                     "backend), or run the operator with --executor pod")


def git_auth_refs(auth: GitAuth | None) -> list[tuple[str, ResourceRef]]:
    """spec.gitAuth's references, each with its field path."""
    if auth is None:
        return []
    found: list[tuple[str, ResourceRef | None]] = [("spec.gitAuth.accessToken", auth.access_token)]
    if auth.basic_auth is not None:
        found += [("spec.gitAuth.basicAuth.userName", auth.basic_auth.user_name),
                  ("spec.gitAuth.basicAuth.password", auth.basic_auth.password)]
    if auth.ssh_auth is not None:
        found += [("spec.gitAuth.sshAuth.sshPrivateKey", auth.ssh_auth.ssh_private_key),
                  ("spec.gitAuth.sshAuth.password", auth.ssh_auth.password)]
    if auth.github_app is not None:
        found += [(f"spec.gitAuth.githubApp.{field}", ref) for field, ref in (
            ("appID", auth.github_app.app_id), ("installationID", auth.github_app.installation_id),
            ("privateKey", auth.github_app.private_key))]
    return [(field, ref) for field, ref in found if ref is not None]


def operator_ref_issues(spec: StackSpec, in_workspace_pods: bool) -> list[SpecIssue]:
    """The Env and FS refs that would read the operator's own environment or files, for an operator that
    does not allow them (the default): every one under the process executor; under the pod executor only
    spec.gitAuth's, since the operator fetches the source (the others are read in the workspace pod, PKO
    v2's meaning). A team that may write Stacks must not read the operator's credentials through them."""
    refs = git_auth_refs(spec.git_auth)
    if not in_workspace_pods:
        refs += [(f"spec.envRefs.{key}", ref) for key, ref in sorted(spec.env_refs.items())]
        refs += [(f"spec.secretsRef.{key}", ref) for key, ref in sorted(spec.secrets_ref.items())]
    return [SpecIssue(f"{field}.type", f"an {ref.type} ref reads the operator's own "
                                       f"{'environment' if ref.type == 'Env' else 'files'}, which this operator "
                                       "does not allow", "use a Secret ref (or Literal); an operator started with "
                                       "--operator-refs allows them (PKO v1's meaning)")
            for field, ref in refs if ref.type in ("Env", "FS")]


def local_source_issue(spec: StackSpec, in_workspace_pods: bool) -> SpecIssue | None:
    """A program in the workspace pod (spec.workspaceTemplate.spec.local.dir) needs the pod executor."""
    if spec.source_kind != "local" or in_workspace_pods:
        return None
    return SpecIssue("spec.workspaceTemplate.spec.local.dir",
                     f"the program is the directory {spec.local_dir!r} of a workspace pod, and this operator runs "
                     "updates on its own host (--executor process)",
                     "run the operator with --executor pod (the Operator component's executor: \"pod\"), or name "
                     "spec.projectRepo, spec.fluxSource or spec.programRef")


def unused_sources(spec: StackSpec) -> list[str]:
    """The source fields PKO's order leaves unused when a spec names several (git, then Flux, then Program)."""
    aliases = dict(SOURCE_ORDER)
    return [aliases[kind] for kind in spec.sources[1:]]
