"""The pod executor's workspace: one pod per Stack, in the Stack's namespace, that runs its updates (pure builders).

The pod runs `python -m strata_operator.engine.pod.agent` from the operator image under the Stack's ServiceAccount;
the operator drives it over HTTPS with a per-workspace token and a self-signed certificate it pins
(`WorkspaceCredentials`, kept in a Secret the Stack owns). Values from Secrets reach the pod as its own
environment (`secretKeyRef`, `envFrom`), read by the kubelet: the operator never reads them
(`MountedRefs`). A bare pod rather than a StatefulSet: the operator serializes each Stack's operations
and must know which incarnation of the pod ran an update, so it alone replaces the pod, between
updates (a StatefulSet's rolling update could kill one mid-run), and needs no controller's latency.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime
import hashlib
import json
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...api import RESOURCES_FIELD_ENV
from ...api.workspace_limits import CONTAINER, merged_resources, resource_layers, sized_volume
from ...api.workspace_values import MountedRefs
from .bundle import BUNDLE_DIR, BUNDLE_ENV, launcher

AGENT_PORT = 8443
AGENT_DIR = "/var/run/strata/agent"
WORKSPACE_DIR = "/workspace"
SPEC_HASH_ANNOTATION = "strata.dev/workspace-spec"
COMPONENT_LABEL = "auto.pulumi.com/component"
WORKSPACE_LABEL = "auto.pulumi.com/workspace-name"
# Variables the pod gets from Secrets: the agent reads them, the update sees them under their real names.
ENV_REF_PREFIX = "STRATA_ENV__"
CONFIG_REF_PREFIX = "STRATA_CONFIG__"
ENV_FROM_PREFIX = "STRATA_ENVFROM_{index}__"
READINESS_PERIOD_SECONDS = 10
RUN_AS = 65532  # the operator image's user
# Copying the agent's runtime (bundle.py) for an image of the template's.
BOOTSTRAP_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
CERT_VALIDITY = datetime.timedelta(days=3650)
# The operator's emptyDirs' sizes: the workspace holds the program, its dependencies and each stack's PULUMI_HOME
# (the plugins are the image's, linked); the runtime bundle is 89 MB (bundle.py).
WORKSPACE_SIZE, TMP_SIZE, RUNTIME_SIZE = "4Gi", "1Gi", "512Mi"


def config_variable(mounted: MountedRefs, key: str) -> str:
    return f"{CONFIG_REF_PREFIX}{sorted(mounted.secret_config).index(key)}"


def pod_secret_env(mounted: MountedRefs) -> list[dict[str, Any]]:
    """The pod's env entries that the kubelet fills from Secrets."""
    entries = []
    for name, ref in sorted(mounted.env.items()):
        if "secret" in ref:
            entries.append({"name": ENV_REF_PREFIX + name, "valueFrom": {"secretKeyRef": dict(ref["secret"])}})
    for key, ref in sorted(mounted.secret_config.items()):
        if "secret" in ref:
            entries.append({"name": config_variable(mounted, key), "valueFrom": {"secretKeyRef": dict(ref["secret"])}})
    return entries


def pod_env_from(mounted: MountedRefs) -> list[dict[str, Any]]:
    return [{"prefix": ENV_FROM_PREFIX.format(index=i), "secretRef": {"name": name}}
            for i, name in enumerate(mounted.env_from)]


class RefUnavailable(Exception):
    """The workspace cannot resolve a reference (an Env variable or file it does not have)."""


def resolve_in_workspace(mounted: MountedRefs, environ: Mapping[str, str], env: Mapping[str, str]
                         ) -> tuple[dict[str, str], dict[str, str], set[str]]:
    """(the update's env, its secret config, the env names that are secret) from what the kubelet put
    in the pod's environment and files, layered as the process executor layers them: envSecrets, then
    the operator's values (ConfigMaps, literals, the backend), then each env ref. Run by the agent."""
    merged: dict[str, str] = {}
    secret: set[str] = set()
    for i in range(len(mounted.env_from)):
        prefix = ENV_FROM_PREFIX.format(index=i)
        found = {name[len(prefix):]: value for name, value in environ.items() if name.startswith(prefix)}
        merged.update(found)
        secret.update(found)
    merged.update(env)
    secret.difference_update(env)

    def value(field: str, ref: Mapping[str, Any], variable: str) -> str:
        if "secret" in ref:
            return environ[variable]
        if "env" in ref:
            if ref["env"] not in environ:
                raise RefUnavailable(f"{field}.env.name: the workspace has no environment variable {ref['env']!r}")
            return environ[ref["env"]]
        try:
            with open(ref["file"]) as handle:
                return handle.read()
        except OSError as err:
            raise RefUnavailable(f"{field}.filesystem.path: cannot read {ref['file']!r} in the workspace: "
                                 f"{err.strerror}") from None

    for name, ref in sorted(mounted.env.items()):
        merged[name] = value(f"spec.envRefs.{name}", ref, ENV_REF_PREFIX + name)
        secret.add(name)
    config = {key: value(f"spec.secretsRef.{key}", ref, config_variable(mounted, key))
              for key, ref in sorted(mounted.secret_config.items())}
    return merged, config, secret


# A PKO v2 Workspace's engine key (controllers/auto_state.workspace_key): '@' is in no name.
WORKSPACE_SUFFIX = "@workspace"


@dataclasses.dataclass(frozen=True)
class WorkspaceNames:
    """The objects of one workspace pod. A Stack's: `<stack>-workspace`, its agent Secret and default
    ServiceAccount beside it. A PKO v2 Workspace's: `<name>-workspace-0`, the pod PKO's StatefulSet
    makes (its logs are where PKO's docs look), running as spec.serviceAccountName (PKO's default
    `default`), so no ServiceAccount of its own."""

    namespace: str
    owner: str
    """The Stack's or Workspace's name."""
    pod: str
    agent_secret: str
    service_account: str
    """The ServiceAccount the operator creates when none is named ('' for a Workspace: none)."""

    @classmethod
    def of(cls, engine_key: str) -> "WorkspaceNames":
        """From the engine's key: `<namespace>/<stack>`, or `<namespace>/<workspace>@workspace`."""
        namespace, name = engine_key.split("/", 1)
        if name.endswith(WORKSPACE_SUFFIX):
            name = name.removesuffix(WORKSPACE_SUFFIX)
            return cls(namespace, name, f"{name}-workspace-0", f"{name}-workspace-0-agent", "")
        return cls(namespace, name, f"{name}-workspace", f"{name}-workspace-agent", f"{name}-workspace")

    @property
    def is_workspace_object(self) -> bool:
        return not self.service_account

    @property
    def template_field(self) -> str:
        """The field the pod is built from (PKO's WorkspaceSpec), for messages that name its fields."""
        return "spec" if self.is_workspace_object else "spec.workspaceTemplate.spec"

    @property
    def resources_field(self) -> str:
        """The field that sets the pod's resources, for messages that say what to raise."""
        return f"{self.template_field}.resources"

    @property
    def server_name(self) -> str:
        """The name the agent's certificate is for; the operator connects to the pod's IP expecting it."""
        return f"{self.pod}.{self.namespace}.workspace.strata"


@dataclasses.dataclass(frozen=True)
class WorkspaceCredentials:
    """What the operator and the workspace agent share: the bearer token and the agent's TLS key pair."""

    token: str = dataclasses.field(repr=False)
    certificate: str
    private_key: str = dataclasses.field(repr=False)

    def secret_data(self) -> dict[str, bytes]:
        return {"token": self.token.encode(), "tls.crt": self.certificate.encode(), "tls.key": self.private_key.encode()}

    @classmethod
    def from_secret_data(cls, data: Mapping[str, bytes]) -> "WorkspaceCredentials | None":
        try:
            return cls(data["token"].decode(), data["tls.crt"].decode(), data["tls.key"].decode())
        except KeyError:
            return None


def mint_credentials(server_name: str) -> WorkspaceCredentials:
    """A fresh token and a self-signed certificate for `server_name` (the operator pins it, no CA)."""
    # Imported here: the agent, which imports this module in every workspace pod, never mints.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + CERT_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return WorkspaceCredentials(
        token=secrets.token_urlsafe(32),
        certificate=cert.public_bytes(serialization.Encoding.PEM).decode(),
        private_key=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode())


@dataclasses.dataclass(frozen=True)
class WorkspacePodArgs:
    names: WorkspaceNames
    owner: Mapping[str, Any] | None
    """The Stack's (or Workspace's) ownerReference: the pod, its Secret and its ServiceAccount go with it.
    None while the owner is being deleted (see `owned_by`)."""
    image: str
    """The operator image: the agent's, and the updates' unless the template names an image."""
    service_account: str
    mounted: MountedRefs = MountedRefs()
    template: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """spec.workspaceTemplate (PKO v2)."""
    image_pull_policy: str = "IfNotPresent"
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def secured(ours: Mapping[str, Any], theirs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A template's container securityContext over ours (container_security()): what it leaves out stays
    hardened, and its capabilities add to our dropping of ALL (template_issues refused what `restricted`
    forbids, a drop without ALL included)."""
    theirs = copy.deepcopy(dict(theirs or {}))
    capabilities = {**(ours.get("capabilities") or {}), **(theirs.get("capabilities") or {})}
    return {**ours, **theirs, "capabilities": capabilities}


def _merge_container(ours: dict[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """A podTemplate container named `pulumi` adds to ours: mounts, env, envFrom, ports, its securityContext
    over ours (its resources: merged_resources)."""
    merged = copy.deepcopy(ours)
    for field in ("volumeMounts", "env", "envFrom", "ports"):
        merged[field] = [*merged.get(field, []), *copy.deepcopy(theirs.get(field) or [])]
    merged["securityContext"] = secured(merged["securityContext"], theirs.get("securityContext"))
    for field in ("workingDir", "lifecycle"):
        if theirs.get(field):
            merged[field] = copy.deepcopy(theirs[field])
    return merged


def build_workspace_pod(args: WorkspacePodArgs) -> dict[str, Any]:
    """The workspace pod, with a hash of its spec (a different hash: the pod is replaced between updates)."""
    template = (args.template or {}).get("spec") or {}
    pod_template = template.get("podTemplate") or {}
    their_spec = copy.deepcopy(pod_template.get("spec") or {})
    names = args.names
    # An image of the template's (PKO: one holding `pulumi`) runs the updates; the agent comes along
    # from the operator image, as PKO's init container brings its agent (bundle.py).
    foreign = bool(template.get("image")) and template["image"] != args.image
    agent_command = [*launcher(Path(BUNDLE_DIR)), "-m", "strata_operator.engine.pod.agent"] if foreign \
        else ["python", "-m", "strata_operator.engine.pod.agent"]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template["image"] if foreign else args.image,
        "imagePullPolicy": template.get("imagePullPolicy") or args.image_pull_policy,
        "command": agent_command,
        "env": [{"name": "STRATA_AGENT_DIR", "value": AGENT_DIR},
                {"name": "STRATA_AGENT_PORT", "value": str(AGENT_PORT)},
                {"name": "STRATA_WORKSPACE", "value": WORKSPACE_DIR},
                {"name": RESOURCES_FIELD_ENV,
                 "value": names.resources_field},
                *([{"name": BUNDLE_ENV, "value": BUNDLE_DIR}] if foreign else []),
                # As on PKO's workspace pod: programs and config (valueFrom.env) may read them.
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_SA_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                *pod_secret_env(args.mounted), *copy.deepcopy(template.get("env") or [])],
        "envFrom": [*pod_env_from(args.mounted), *copy.deepcopy(template.get("envFrom") or [])],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        # The operator asks a starting agent itself (executor._wait_ready); the kubelet's probe only keeps
        # the pod's Ready up to date. Each probe is a TLS handshake on both sides: every 2 s, 50 pods had
        # the kubelet and their agents make 25 a second.
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": AGENT_PORT, "scheme": "HTTPS"},
                           "periodSeconds": READINESS_PERIOD_SECONDS, "failureThreshold": 3},
        "resources": merged_resources(*(resources for _, resources in resource_layers(template))),
        "securityContext": container_security(),
        "volumeMounts": [{"name": "agent", "mountPath": AGENT_DIR, "readOnly": True},
                         {"name": "workspace", "mountPath": WORKSPACE_DIR},
                         {"name": "tmp", "mountPath": "/tmp"},
                         *([{"name": "runtime", "mountPath": BUNDLE_DIR, "readOnly": True}] if foreign else [])],
    }
    containers = their_spec.pop("containers", None) or []
    for theirs in containers:
        if theirs.get("name") == CONTAINER:
            container = _merge_container(container, theirs)
    # The template's own containers and init containers: allowed as `restricted` allows them
    # (template_issues), hardened as ours where their securityContext says nothing.
    sidecars = [{**c, "securityContext": secured(container_security(), c.get("securityContext"))}
                for c in containers if c.get("name") != CONTAINER]
    volumes = [{"name": "agent", "secret": {"secretName": names.agent_secret, "defaultMode": 0o440}},
               {"name": "workspace", "emptyDir": {"sizeLimit": WORKSPACE_SIZE}},
               {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
               *([{"name": "runtime", "emptyDir": {"sizeLimit": RUNTIME_SIZE}}] if foreign else []),
               *map(sized_volume, their_spec.pop("volumes", None) or [])]
    init_containers = [{**c, "securityContext": secured(container_security(), c.get("securityContext"))}
                       for c in their_spec.pop("initContainers", None) or []]
    if foreign:
        init_containers = [{
            "name": "bootstrap", "image": args.image, "imagePullPolicy": args.image_pull_policy,
            "command": ["python", "-m", "strata_operator.engine.pod.bundle", BUNDLE_DIR],
            "securityContext": container_security(), "resources": BOOTSTRAP_RESOURCES,
            "volumeMounts": [{"name": "runtime", "mountPath": BUNDLE_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
        }, *init_containers]
    spec: dict[str, Any] = {
        **their_spec,
        "serviceAccountName": args.service_account,
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": their_spec.get("terminationGracePeriodSeconds", 60),
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}, **(their_spec.get("securityContext") or {})},
        "containers": [container, *sidecars],
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if args.node_selector:
        spec["nodeSelector"] = {**(their_spec.get("nodeSelector") or {}), **args.node_selector}
    if args.tolerations:
        spec["tolerations"] = [*map(dict, args.tolerations), *(their_spec.get("tolerations") or [])]
    metadata = pod_template.get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), COMPONENT_LABEL: "workspace", WORKSPACE_LABEL: names.owner}
    digest = hashlib.sha256(json.dumps([spec, labels], sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": names.pod, "namespace": names.namespace, "labels": labels,
                     "annotations": {**(metadata.get("annotations") or {}), SPEC_HASH_ANNOTATION: digest},
                     **owned_by(args.owner)},
        "spec": spec,
    }


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "capabilities": {"drop": ["ALL"]}}


def owned_by(owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """The metadata that makes an object its owner's. None while the owner is being deleted: a foreground
    delete (pulumi-kubernetes deletes so) has the garbage collector remove the owner's dependents at
    once, and the destroy its finalizer runs needs the pod, its Secret and its ServiceAccount; the
    operator removes them itself once the destroy is done."""
    return {"ownerReferences": [dict(owner)]} if owner is not None else {}


def build_service_account(names: WorkspaceNames, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """The default workspace identity: no RoleBinding names it, so its token grants nothing."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": names.service_account, "namespace": names.namespace,
                         "labels": {COMPONENT_LABEL: "workspace", WORKSPACE_LABEL: names.owner},
                         **owned_by(owner)}}


def build_agent_secret(names: WorkspaceNames, owner: Mapping[str, Any] | None,
                       credentials: WorkspaceCredentials) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": names.agent_secret, "namespace": names.namespace,
                         "labels": {COMPONENT_LABEL: "workspace", WORKSPACE_LABEL: names.owner},
                         **owned_by(owner)},
            "data": {k: base64.b64encode(v).decode() for k, v in credentials.secret_data().items()}}


def spec_hash(pod: Mapping[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION, "")


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def agent_started(pod: Mapping[str, Any]) -> bool:
    """The workspace container runs, the pod has its IP and every other container is ready: the agent is
    worth asking directly, ahead of the kubelet's readiness probe (every READINESS_PERIOD_SECONDS) and its
    status write."""
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    containers = status.get("containerStatuses") or []
    ours = [c for c in containers if c.get("name") == CONTAINER]
    return bool(ours) and (ours[0].get("state") or {}).get("running") is not None \
        and all(c.get("ready") for c in containers if c.get("name") != CONTAINER)


# Waiting reasons of a container that will not start without a change (not worth waiting out).
_STUCK_WAITING = frozenset({"CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
                            "InvalidImageName", "CreateContainerError", "CrashLoopBackOff"})


def pod_problem(pod: Mapping[str, Any], mounted: MountedRefs) -> str:
    """Why the workspace pod is not starting, naming the Stack's field where one is at fault; "" if none yet."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable":
            return f"the workspace pod cannot be scheduled: {condition.get('message', '')}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            message = waiting.get("message", "")
            return f"the workspace pod cannot start ({waiting['reason']}): {message}{_field_hint(message, mounted)}"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"the workspace pod ended ({status.get('phase')}): {status.get('reason', '')} {status.get('message', '')}".strip()
    return ""


def _field_hint(message: str, mounted: MountedRefs) -> str:
    """The Stack fields that name the Secret the kubelet could not find."""
    fields = [f"spec.envRefs.{name}" for name, ref in sorted(mounted.env.items())
              if "secret" in ref and f'"{ref["secret"]["name"]}"' in message]
    fields += [f"spec.secretsRef.{key}" for key, ref in sorted(mounted.secret_config.items())
               if "secret" in ref and f'"{ref["secret"]["name"]}"' in message]
    fields += ["spec.envSecrets" for name in mounted.env_from if f'"{name}"' in message][:1]
    return f" (named by {', '.join(fields)}: create it, or fix the reference)" if fields else ""


def restarted(pod: Mapping[str, Any]) -> int:
    """How often the workspace container restarted (an OOM kill, a node restart)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == CONTAINER:
            return int(container.get("restartCount") or 0)
    return 0


def last_termination(pod: Mapping[str, Any]) -> str:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") == CONTAINER:
            terminated = (container.get("lastState") or {}).get("terminated") or {}
            if terminated:
                return f"{terminated.get('reason', 'terminated')} (exit code {terminated.get('exitCode')})"
    return ""
