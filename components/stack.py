"""Typed `pulumi.com/v1` Stack and Program objects, so programs get checked arguments instead of raw dicts.

Field names follow the Pulumi Kubernetes Operator (v1, plus the v2 fields Strata honours), written
in snake_case here and rendered in the CRD's camelCase by the pure `build_*` functions. User keys
(config keys, environment variable names, YAML resource names) are passed through unchanged.
"""

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from typing_extensions import NotRequired

API_VERSION = "pulumi.com/v1"


class SecretKeyRef(TypedDict):
    name: str
    """Secret name, in the Stack's namespace."""
    key: str
    """Key inside the Secret."""


class ResourceRefType(str, Enum):
    """Where a ResourceRef's value comes from. Plain strings ("Secret", ...) are accepted too."""

    LITERAL = "Literal"
    """The value itself, under `literal`."""
    SECRET = "Secret"
    """A key of a Secret in the Stack's namespace, under `secret`."""
    ENV = "Env"
    """A variable of the operator's environment, under `env` (only with an operator started with
    --operator-refs; under the pod executor, of the workspace pod's)."""
    FS = "FS"
    """A file on the operator's filesystem, under `filesystem` (only with an operator started with
    --operator-refs; under the pod executor, in the workspace pod)."""


class ResourceRef(TypedDict):
    type: ResourceRefType
    """Where the value comes from."""
    literal: NotRequired[Mapping[str, str]]
    """For type Literal: {"value": ...}."""
    secret: NotRequired[SecretKeyRef]
    """For type Secret."""
    env: NotRequired[Mapping[str, str]]
    """For type Env: {"name": VARIABLE} of the operator's environment."""
    filesystem: NotRequired[Mapping[str, str]]
    """For type FS: {"path": ...} on the operator's filesystem."""


class BasicAuth(TypedDict):
    user_name: ResourceRef
    """User name."""
    password: ResourceRef
    """Password or token."""


class SshAuth(TypedDict):
    ssh_private_key: ResourceRef
    """Private key."""
    password: NotRequired[ResourceRef]
    """Passphrase of the key."""


class GitAuth(TypedDict):
    access_token: NotRequired[ResourceRef]
    """Token for https git."""
    basic_auth: NotRequired[BasicAuth]
    """User name and password."""
    ssh_auth: NotRequired[SshAuth]
    """SSH key."""


class FluxSourceRef(TypedDict):
    api_version: str
    """e.g. source.toolkit.fluxcd.io/v1."""
    kind: str
    """e.g. GitRepository."""
    name: str
    """Source name, in the Stack's namespace."""


class FluxSource(TypedDict):
    source_ref: FluxSourceRef
    """The Flux source whose artifact holds the program."""
    dir: NotRequired[str]
    """Directory of the program inside the artifact."""


class PrerequisiteRequirement(TypedDict):
    succeeded_within_duration: str
    """e.g. "1h": the prerequisite's last success must be at most this old."""


class Prerequisite(TypedDict):
    name: str
    """Name of a Stack in the same namespace."""
    requirement: NotRequired[PrerequisiteRequirement]
    """How recent its success must be."""
    outputs: NotRequired[Sequence[str]]
    """The prerequisite's outputs this Stack consumes: when the prerequisite runs again, this Stack re-runs
    only if one of them changed (all of its outputs when unset)."""


class OutputsSecret(TypedDict):
    name: str
    """Name of the Secret (in the Stack's namespace) that receives the outputs."""


class Approval(TypedDict):
    mode: str
    """Auto (PKO's behaviour) or Manual: preview and save a plan on every change, apply it once approved."""


class DriftDetection(TypedDict):
    interval: NotRequired[str]
    """How often a refresh preview looks for changes made outside Pulumi (Go duration, default 1h)."""
    remediate: NotRequired[bool]
    """Run an update that refreshes first when drift is found."""


class StackSpec(TypedDict):
    stack: str
    """Fully qualified stack name (e.g. organization/project/dev)."""
    backend: NotRequired[str]
    """State backend URL (e.g. file:///state, s3://bucket)."""
    secrets_provider: NotRequired[str]
    """Secrets provider (e.g. passphrase, awskms://...)."""
    use_local_stack_only: NotRequired[bool]
    """Do not create the stack in the backend."""
    project_repo: NotRequired[pulumi.Input[str]]
    """Git repository of the program (source: git)."""
    commit: NotRequired[pulumi.Input[str]]
    """Commit to deploy (with project_repo; exclusive with branch)."""
    branch: NotRequired[str]
    """Branch to follow (with project_repo; exclusive with commit)."""
    repo_dir: NotRequired[str]
    """Directory of the program inside the repository."""
    git_auth: NotRequired[GitAuth]
    """Credentials for project_repo."""
    git_auth_secret: NotRequired[str]
    """Deprecated: Secret with git credentials."""
    flux_source: NotRequired[FluxSource]
    """Program from a Flux source artifact (source: flux)."""
    program_ref: NotRequired[Mapping[str, str]]
    """{"name": ...} of a Program in the same namespace (source: program)."""
    env_refs: NotRequired[Mapping[str, ResourceRef]]
    """Environment variables of the update, by name."""
    envs: NotRequired[Sequence[str]]
    """Deprecated: ConfigMaps whose data become environment variables."""
    env_secrets: NotRequired[Sequence[str]]
    """Deprecated: Secrets whose data become environment variables."""
    access_token_secret: NotRequired[str]
    """Deprecated: Secret with the Pulumi access token."""
    config: NotRequired[Mapping[str, str]]
    """Stack configuration (plain values), by key."""
    secrets_ref: NotRequired[Mapping[str, ResourceRef]]
    """Secret stack configuration, by key."""
    secrets: NotRequired[Mapping[str, str]]
    """Deprecated: secret configuration given inline."""
    refresh: NotRequired[bool]
    """Refresh before each update."""
    expect_no_refresh_changes: NotRequired[bool]
    """Fail when the refresh finds changes."""
    targets: NotRequired[Sequence[str]]
    """Only update these URNs."""
    prerequisites: NotRequired[Sequence[Prerequisite]]
    """Stacks that must have succeeded first."""
    continue_resync_on_commit_match: NotRequired[bool]
    """Keep re-running on the resync interval even when the commit did not change."""
    resync_frequency_seconds: NotRequired[int]
    """How often to check the source (minimum 60)."""
    destroy_on_finalize: NotRequired[bool]
    """Destroy the stack's resources when the Stack is deleted."""
    retry_on_update_conflict: NotRequired[bool]
    """Retry when another update holds the stack's lock."""
    service_account_name: NotRequired[str]
    """Run the update with a token of this ServiceAccount (least privilege per Stack)."""
    preview: NotRequired[bool]
    """Only preview, never update."""
    approval: NotRequired[Approval]
    """Manual approval of the exact plan (`strata approve stack NAME`)."""
    drift_detection: NotRequired[DriftDetection]
    """Look for drift on a schedule, and optionally remediate it."""
    suspend: NotRequired[bool]
    """Run nothing while true (Flux's convention); false again runs what changed meanwhile."""
    outputs_secret: NotRequired[OutputsSecret]
    """{"name": ...}: a Secret that receives every output with its real value (secret ones included) after
    each successful update, labelled and owned by the Stack, for other workloads to mount. A Secret of that
    name the Stack does not own is never overwritten (the Stack stalls naming the field)."""
    retry_max_backoff_duration_seconds: NotRequired[int]
    """Cap of the retry backoff."""


class StackArgs(TypedDict):
    namespace: pulumi.Input[str]
    """Namespace of the Stack object (an input: e.g. a TeamEnvironment's `namespace`)."""
    spec: StackSpec
    """What to run and how."""
    name: NotRequired[str]
    """Object name (default: the Pulumi resource name)."""
    labels: NotRequired[Mapping[str, str]]
    """Labels of the object."""


class ProgramBody(TypedDict):
    resources: Mapping[str, Any]
    """Pulumi YAML resources, by name."""
    configuration: NotRequired[Mapping[str, Any]]
    """Pulumi YAML configuration declarations."""
    variables: NotRequired[Mapping[str, Any]]
    """Pulumi YAML variables."""
    outputs: NotRequired[Mapping[str, Any]]
    """Pulumi YAML stack outputs."""


class ProgramArgs(TypedDict):
    namespace: pulumi.Input[str]
    """Namespace of the Program object (an input: e.g. a TeamEnvironment's `namespace`)."""
    program: ProgramBody
    """The Pulumi YAML program."""
    name: NotRequired[str]
    """Object name (default: the Pulumi resource name)."""


# Keys whose values are maps of user-chosen names: the names are data, never renamed.
_USER_KEYED = {"config", "secrets", "env_refs", "secrets_ref"}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _camelize(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {_camel(key): _camelize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_camelize(item) for item in value]
    return value


def build_stack_spec(spec: StackSpec) -> dict[str, Any]:
    """The `spec` of a pulumi.com/v1 Stack; rejects what the operator would mark Stalled/SpecInvalid."""
    if not spec.get("stack"):
        raise ValueError("stack spec: `stack` is required (e.g. organization/project/dev)")
    sources = [key for key in ("project_repo", "flux_source", "program_ref") if key in spec]
    if len(sources) != 1:
        raise ValueError(f"stack spec: give exactly one source of project_repo, flux_source, program_ref "
                         f"(got {sources or 'none'})")
    if "project_repo" in spec and ("commit" in spec) == ("branch" in spec):
        raise ValueError("stack spec: with project_repo give exactly one of `commit` or `branch`")
    if "project_repo" not in spec and ({"commit", "branch", "repo_dir", "git_auth"} & set(spec)):
        raise ValueError("stack spec: commit, branch, repo_dir and git_auth only apply with project_repo")
    if spec.get("resync_frequency_seconds", 60) < 60:
        raise ValueError("stack spec: `resync_frequency_seconds` must be at least 60")
    rendered: dict[str, Any] = {}
    for key, value in spec.items():
        if key in _USER_KEYED:
            rendered[_camel(key)] = {name: _camelize(item) for name, item in value.items()}
        else:
            rendered[_camel(key)] = _camelize(value)
    return rendered


def build_program_body(program: ProgramBody) -> dict[str, Any]:
    """The top-level `program` of a pulumi.com/v1 Program (Pulumi YAML, names kept as written)."""
    if not program.get("resources") and not program.get("outputs"):
        raise ValueError("program: give at least one of `resources` or `outputs`")
    unknown = set(program) - {"resources", "configuration", "variables", "outputs"}
    if unknown:
        raise ValueError(f"program: unknown sections {sorted(unknown)}; "
                         "use resources, configuration, variables, outputs")
    return {key: dict(value) for key, value in program.items()}


def _metadata(resource_name: str, args: StackArgs | ProgramArgs) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": args.get("name", resource_name), "namespace": args["namespace"]}
    if args.get("labels"):
        metadata["labels"] = dict(args["labels"])
    return metadata


class Stack(k8s.apiextensions.CustomResource):
    """A pulumi.com/v1 Stack: the operator runs `spec.stack` from its source until it is Ready."""

    def __init__(self, resource_name: str, args: StackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(resource_name, api_version=API_VERSION, kind="Stack",
                         metadata=_metadata(resource_name, args), spec=build_stack_spec(args["spec"]), opts=opts)


class Program(pulumi.CustomResource):
    """A pulumi.com/v1 Program: a Pulumi YAML program stored in the cluster (top-level `program`, no spec)."""

    metadata: pulumi.Output[dict]
    program: pulumi.Output[dict]

    def __init__(self, resource_name: str, args: ProgramArgs, opts: pulumi.ResourceOptions | None = None):
        # apiextensions.CustomResource only carries `spec`; Program's body is top-level, so register
        # the object under the same kubernetes type token directly.
        props = {"apiVersion": API_VERSION, "kind": "Program", "metadata": _metadata(resource_name, args),
                 "program": build_program_body(args["program"])}
        super().__init__(f"kubernetes:{API_VERSION}:Program", resource_name, props, opts)
