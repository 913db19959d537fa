"""What a team's workspace pod template may ask for (pure): PKO v2's `resources` and `podTemplate`, in a
Stack's spec.workspaceTemplate.spec or a Workspace's spec, checked before the pod executor builds a pod
from them (engine/pod/workspace_pod.py).

The operator creates the workspace pod with its own rights and a team writes the template, so the
template gets no more than Pod Security Standards' `restricted` profile allows (host namespaces,
privileged, capabilities, host paths and the other volume types, host ports, /proc, seccomp, AppArmor,
SELinux, sysctls, root), nothing that places the pod (its node, priority, runtime, scheduler, the
platform's taints, the operator's node selector) and nothing that changes its identity. Each such field
is named as typed, with the fix, under the Stalled reason WorkspaceTemplateForbidden; a value of the
wrong type is SpecInvalid (the builder trusts what passes). The fields of the pod spec, of its
securityContexts and of its containers are allow-listed: one a later Kubernetes adds is refused until
it is known to be harmless. Containers and init containers of the template's own are allowed: they
satisfy `restricted`, and what their securityContext leaves out is the workspace container's hardening.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .validation import STALLED_TEMPLATE_FORBIDDEN, SpecIssue
from .workspace_limits import TEMPLATE_EMPTY_DIR_CAP, merged_resources, parse_quantity, resource_layers

POD_FIELDS = frozenset({
    "activeDeadlineSeconds", "affinity", "containers", "dnsConfig", "dnsPolicy", "enableServiceLinks", "hostAliases",
    "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "imagePullSecrets", "initContainers", "nodeSelector",
    "os", "preemptionPolicy", "readinessGates", "resources", "restartPolicy", "schedulingGates", "securityContext",
    "setHostnameAsFQDN", "subdomain", "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints",
    "volumes"})
CONTAINER_FIELDS = frozenset({
    "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle", "livenessProbe", "name", "ports",
    "readinessProbe", "resizePolicy", "resources", "restartPolicy", "securityContext", "startupProbe", "stdin",
    "stdinOnce", "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts",
    "workingDir"})
_SECURITY_FIELDS = frozenset({"appArmorProfile", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions",
                              "seccompProfile", "windowsOptions"})
POD_SECURITY_FIELDS = _SECURITY_FIELDS | {"fsGroup", "fsGroupChangePolicy", "seLinuxChangePolicy",
                                          "supplementalGroups", "supplementalGroupsPolicy", "sysctls"}
CONTAINER_SECURITY_FIELDS = _SECURITY_FIELDS | {"allowPrivilegeEscalation", "capabilities", "privileged",
                                                "procMount", "readOnlyRootFilesystem"}
VOLUME_SOURCES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                  "secret")
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
HOST_NAMESPACES = {"hostNetwork": "puts the pod in its node's network namespace",
                   "hostPID": "shows the pod every process of its node",
                   "hostIPC": "shares its node's IPC namespace with the pod"}
# Pod fields that place the pod or change its identity: the operator's to give, with what to do instead.
_OPERATORS = {
    "nodeName": ("binds the pod to a node past the scheduler and the nodes' taints",
                 "remove it; nodeSelector or affinity on node labels of your own choose among the nodes"),
    "priorityClassName": ("gives the pod a priority: it could preempt other teams' pods",
                          "remove it; workspace pods run at the cluster's default priority"),
    "priority": ("gives the pod a priority: it could preempt other teams' pods",
                 "remove it; workspace pods run at the cluster's default priority"),
    "runtimeClassName": ("picks the container runtime the pod runs under",
                         "remove it; workspace pods run under their nodes' default runtime"),
    "schedulerName": ("hands the pod to another scheduler", "remove it; the default scheduler places workspace pods"),
    "overhead": ("is set from a RuntimeClass, not by a pod", "remove it"),
    "shareProcessNamespace": ("lets each container of the pod see the others' processes and their environment "
                              "(the agent's, the update's secrets)",
                              "remove it; a sidecar shares volumes, not processes"),
    "serviceAccountName": ("would change the pod's identity", "remove it; name the pod's ServiceAccount with "
                           "serviceAccountName beside podTemplate"),
    "serviceAccount": ("would change the pod's identity", "remove it; name the pod's ServiceAccount with "
                       "serviceAccountName beside podTemplate"),
    "automountServiceAccountToken": ("is the operator's: the workspace agent runs updates with the pod's token",
                                     "remove it"),
    "ephemeralContainers": ("are added to a running pod by kubectl debug, never by its template", "remove it"),
}
# Taint keys of the domains Kubernetes and the platform keep (the control plane, node conditions such as
# node.kubernetes.io/not-ready, cloud providers; strata.dev's real nodes), with their subdomains.
RESERVED_TAINT_DOMAINS = ("kubernetes.io", "k8s.io", "strata.dev")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_SECCOMP_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/")


@dataclasses.dataclass(frozen=True)
class ReservedPlacement:
    """What places every workspace pod and is the operator's alone: the keys of its --workspace-node-selector
    and of its --workspace-toleration."""

    node_selector_keys: frozenset[str] = frozenset()
    toleration_keys: frozenset[str] = frozenset()


def _reserved_taint(key: str, reserved: ReservedPlacement) -> bool:
    """The rule for a template's tolerations: a team tolerates only taints it names by key (a toleration with
    no key tolerates every taint), outside the domains of RESERVED_TAINT_DOMAINS and other than the
    operator's own --workspace-toleration keys (which the operator adds to every workspace pod itself)."""
    domain = key.split("/", 1)[0] if "/" in key else ""
    return key in reserved.toleration_keys or any(
        domain == kept or domain.endswith("." + kept) for kept in RESERVED_TAINT_DOMAINS)


class _Issues:
    """The issues found so far, and readers of the template's parts that say where a type is wrong."""

    def __init__(self) -> None:
        self.found: list[SpecIssue] = []

    def forbid(self, path: str, problem: str, fix: str) -> None:
        self.found.append(SpecIssue(path, problem, fix, STALLED_TEMPLATE_FORBIDDEN))

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.found.append(SpecIssue(path, f"a {type(value).__name__}, not an object", "use a map of field: value"))
            return {}
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.found.append(SpecIssue(path, f"a {type(value).__name__}, not a list", "use a list"))
            return []
        return value

    def mappings(self, value: Any, path: str) -> list[tuple[str, Mapping[str, Any]]]:
        """Each object of a list, with its path; an item that is no object is an issue, and skipped."""
        found = []
        for index, item in enumerate(self.sequence(value, path)):
            if isinstance(item, dict):
                found.append((f"{path}[{index}]", item))
            else:
                self.mapping(item, f"{path}[{index}]")
        return found

    def only(self, body: Mapping[str, Any], allowed: frozenset[str], path: str, what: str) -> None:
        for key in body:
            if key not in allowed:
                self.forbid(f"{path}.{key}", f"not a field a workspace pod template may set in {what}", "remove it")


def template_issues(template: Any, field: str, reserved: ReservedPlacement) -> list[SpecIssue]:
    """Every field of a workspace pod template (`template`, the spec at `field`: spec.workspaceTemplate.spec,
    or a Workspace's spec) that a team may not set or that the builder cannot read; [] when it may be built."""
    issues = _Issues()
    spec = issues.mapping(template, field)
    for name in ("env", "envFrom"):
        issues.sequence(spec.get(name), f"{field}.{name}")
    _resources(issues, spec.get("resources"), f"{field}.resources")
    pod_template = issues.mapping(spec.get("podTemplate"), f"{field}.podTemplate")
    metadata = issues.mapping(pod_template.get("metadata"), f"{field}.podTemplate.metadata")
    issues.mapping(metadata.get("labels"), f"{field}.podTemplate.metadata.labels")
    _annotations(issues, issues.mapping(metadata.get("annotations"), f"{field}.podTemplate.metadata.annotations"),
                 f"{field}.podTemplate.metadata.annotations")
    path = f"{field}.podTemplate.spec"
    pod = issues.mapping(pod_template.get("spec"), path)
    for key in pod:
        if key in _OPERATORS:
            issues.forbid(f"{path}.{key}", *_OPERATORS[key])
        elif key not in POD_FIELDS:
            issues.forbid(f"{path}.{key}", "not a field a workspace pod template may set", "remove it")
    for key, problem in HOST_NAMESPACES.items():
        if pod.get(key) not in (None, False):
            issues.forbid(f"{path}.{key}", problem, "remove it")
    security = issues.mapping(pod.get("securityContext"), f"{path}.securityContext")
    issues.only(security, POD_SECURITY_FIELDS, f"{path}.securityContext", "the pod's securityContext")
    _security(issues, security, f"{path}.securityContext")
    if security.get("sysctls"):
        issues.forbid(f"{path}.securityContext.sysctls", "sets kernel parameters for the pod", "remove it")
    for volume_path, volume in issues.mappings(pod.get("volumes"), f"{path}.volumes"):
        _volume(issues, volume, volume_path)
    for kind in ("containers", "initContainers"):
        for container_path, container in issues.mappings(pod.get(kind), f"{path}.{kind}"):
            _container(issues, container, container_path)
    for toleration_path, toleration in issues.mappings(pod.get("tolerations"), f"{path}.tolerations"):
        key = toleration.get("key") or ""
        if not key:
            issues.forbid(toleration_path, "has no key: it tolerates every taint of the nodes, the control plane's "
                          "and the platform's included", "name the key of the taint to tolerate")
        elif _reserved_taint(str(key), reserved):
            issues.forbid(f"{toleration_path}.key", f"{key!r} is a taint the platform keeps for itself",
                          "remove this toleration; the operator gives every workspace pod the tolerations it needs "
                          "(--workspace-toleration)")
    node_selector = issues.mapping(pod.get("nodeSelector"), f"{path}.nodeSelector")
    for key in sorted(set(node_selector) & reserved.node_selector_keys):
        issues.forbid(f"{path}.nodeSelector.{key}", "is the operator's to set (--workspace-node-selector)",
                      "remove it; the operator sets it on every workspace pod")
    if not issues.found:  # all of it as merged_resources reads it
        _resource_conflicts(issues, spec, field)
    return issues.found


def _resources(issues: _Issues, value: Any, path: str) -> None:
    """Requests and limits of quantities, as merged_resources reads them."""
    resources = issues.mapping(value, path)
    for key in resources:
        if key not in ("requests", "limits"):
            issues.forbid(f"{path}.{key}", "not a field a workspace pod template may set in resources", "remove it")
    for part in ("requests", "limits"):
        for name, quantity in issues.mapping(resources.get(part), f"{path}.{part}").items():
            try:
                parse_quantity(quantity)
            except ValueError:
                issues.found.append(SpecIssue(f"{path}.{part}.{name}", f"{quantity!r} is not a quantity",
                                              "use a Kubernetes quantity such as 500m, 512Mi or 2Gi"))


def _resource_conflicts(issues: _Issues, spec: Mapping[str, Any], field: str) -> None:
    """A request above its limit that both the template sets (merged_resources settles the rest)."""
    layers = resource_layers(spec)
    merged = merged_resources(*(resources for _, resources in layers))
    for name in sorted(set(merged["requests"]) & set(merged["limits"])):
        request, limit = merged["requests"][name], merged["limits"][name]
        if parse_quantity(request) > parse_quantity(limit):
            requested = next(path for path, resources in reversed(layers) if name in (resources.get("requests") or {}))
            limited = next(path for path, resources in reversed(layers) if name in (resources.get("limits") or {}))
            issues.found.append(SpecIssue(f"{field}.{requested}.requests.{name}",
                                          f"{request} is above its limit {limit} ({field}.{limited}.limits.{name})",
                                          "lower the request or raise the limit"))


def _annotations(issues: _Issues, annotations: Mapping[str, Any], path: str) -> None:
    """The annotations that would lift AppArmor or seccomp (older kubelets read them)."""
    for key, value in annotations.items():
        if key.startswith(_APPARMOR_ANNOTATION) and not (value == "runtime/default"
                                                         or str(value).startswith("localhost/")):
            issues.forbid(f"{path}.{key}", f"{value!r} lifts the container's AppArmor profile",
                          "remove it (runtime/default applies) or name a localhost/ profile")
        if key.startswith(_SECCOMP_ANNOTATIONS) and not (value in ("runtime/default", "docker/default")
                                                         or str(value).startswith("localhost/")):
            issues.forbid(f"{path}.{key}", f"{value!r} lifts the seccomp filter", "remove it")


def _security(issues: _Issues, security: Mapping[str, Any], path: str) -> None:
    """What a pod's or a container's securityContext shares: never root, no profile lifted."""
    if security.get("runAsNonRoot") not in (None, True):
        issues.forbid(f"{path}.runAsNonRoot", "would let the container run as root", "remove it, or set true")
    user = security.get("runAsUser")
    if user is not None and (isinstance(user, bool) or not isinstance(user, int)):
        issues.found.append(SpecIssue(f"{path}.runAsUser", f"{user!r} is not a user ID", "use a whole number"))
    elif user == 0:
        issues.forbid(f"{path}.runAsUser", "runs the container as root", "use a user ID other than 0, or remove it")
    selinux = issues.mapping(security.get("seLinuxOptions"), f"{path}.seLinuxOptions")
    for key in ("user", "role"):
        if selinux.get(key):
            issues.forbid(f"{path}.seLinuxOptions.{key}", "sets the SELinux user or role", "remove it")
    if selinux.get("type", "") not in SELINUX_TYPES:
        issues.forbid(f"{path}.seLinuxOptions.type", f"{selinux['type']!r} is not a container's SELinux type",
                      f"remove it, or use one of {', '.join(t for t in SELINUX_TYPES if t)}")
    for key, what in (("seccompProfile", "seccomp filter"), ("appArmorProfile", "AppArmor profile")):
        profile = issues.mapping(security.get(key), f"{path}.{key}")
        if profile.get("type") not in (None, "RuntimeDefault", "Localhost"):
            issues.forbid(f"{path}.{key}.type", f"{profile['type']!r} lifts the {what}",
                          "remove it (RuntimeDefault applies), or use Localhost")
    if issues.mapping(security.get("windowsOptions"), f"{path}.windowsOptions").get("hostProcess") not in (None, False):
        issues.forbid(f"{path}.windowsOptions.hostProcess", "runs the container on its node, as the node",
                      "remove it")


def _container_security(issues: _Issues, security: Mapping[str, Any], path: str) -> None:
    issues.only(security, CONTAINER_SECURITY_FIELDS, path, "a container's securityContext")
    _security(issues, security, path)
    if security.get("privileged") not in (None, False):
        issues.forbid(f"{path}.privileged", "a privileged container has its node's devices and every capability",
                      "remove it")
    if security.get("allowPrivilegeEscalation") not in (None, False):
        issues.forbid(f"{path}.allowPrivilegeEscalation", "lets a process gain privileges its parent lacks "
                      "(setuid programs)", "remove it, or set false")
    if security.get("procMount") not in (None, "Default"):
        issues.forbid(f"{path}.procMount", "unmasks the container's /proc", "remove it")
    capabilities = issues.mapping(security.get("capabilities"), f"{path}.capabilities")
    for index, capability in enumerate(issues.sequence(capabilities.get("add"), f"{path}.capabilities.add")):
        if capability != "NET_BIND_SERVICE":
            issues.forbid(f"{path}.capabilities.add[{index}]", f"adds {capability!r}: only NET_BIND_SERVICE may be "
                          "added", "remove it")
    drop = issues.sequence(capabilities.get("drop"), f"{path}.capabilities.drop")
    if "drop" in capabilities and "ALL" not in drop:
        issues.forbid(f"{path}.capabilities.drop", "keeps capabilities: every container drops ALL",
                      "add ALL, or remove drop (ALL is dropped by default)")


def _container(issues: _Issues, container: Mapping[str, Any], path: str) -> None:
    issues.only(container, CONTAINER_FIELDS, path, "a container")
    if not isinstance(container.get("name"), str):
        issues.found.append(SpecIssue(f"{path}.name", "missing or not a string", "name the container"))
    for name in ("env", "envFrom", "volumeMounts"):
        issues.sequence(container.get(name), f"{path}.{name}")
    for port_path, port in issues.mappings(container.get("ports"), f"{path}.ports"):
        if port.get("hostPort") not in (None, 0):
            issues.forbid(f"{port_path}.hostPort", "opens a port on the pod's node",
                          "remove it; a Service reaches the pod")
    handlers = [(f"{path}.{probe}", container.get(probe)) for probe in _PROBES]
    lifecycle = issues.mapping(container.get("lifecycle"), f"{path}.lifecycle")
    handlers += [(f"{path}.lifecycle.{hook}", lifecycle.get(hook)) for hook in ("postStart", "preStop")]
    for handler_path, handler in handlers:
        actions = issues.mapping(handler, handler_path)
        for action in ("httpGet", "tcpSocket"):
            if issues.mapping(actions.get(action), f"{handler_path}.{action}").get("host"):
                issues.forbid(f"{handler_path}.{action}.host", "has the kubelet connect to a host other than the pod",
                              "remove it; probes and hooks reach the pod itself")
    _container_security(issues, issues.mapping(container.get("securityContext"), f"{path}.securityContext"),
                        f"{path}.securityContext")
    _resources(issues, container.get("resources"), f"{path}.resources")


def _volume(issues: _Issues, volume: Mapping[str, Any], path: str) -> None:
    sources = [key for key in volume if key != "name"]
    if len(sources) > 1:
        issues.found.append(SpecIssue(path, f"several sources ({', '.join(sources)})", "keep one"))
    for source in sources:
        if source not in VOLUME_SOURCES:
            problem = "mounts its node's own files" if source == "hostPath" else \
                "is not a volume type restricted allows"
            issues.forbid(f"{path}.{source}", problem, f"use one of {', '.join(VOLUME_SOURCES)} (a "
                          "persistentVolumeClaim for storage that lasts)")
    size = issues.mapping(volume.get("emptyDir"), f"{path}.emptyDir").get("sizeLimit")
    if size is None:
        return
    try:
        too_big = parse_quantity(size) > parse_quantity(TEMPLATE_EMPTY_DIR_CAP)
    except ValueError:
        issues.found.append(SpecIssue(f"{path}.emptyDir.sizeLimit", f"{size!r} is not a quantity",
                                      "use a Kubernetes quantity such as 512Mi or 2Gi"))
        return
    if too_big:
        issues.forbid(f"{path}.emptyDir.sizeLimit", f"{size} is above the {TEMPLATE_EMPTY_DIR_CAP} a workspace pod's "
                      "emptyDir may have", f"use at most {TEMPLATE_EMPTY_DIR_CAP}, or a persistentVolumeClaim")
