"""A team's workspace pod template cannot switch off the pod's hardening: what Pod Security Standards'
`restricted` forbids, or what places the pod, is refused naming the field as typed (the Stack stalls
WorkspaceTemplateForbidden before any pod exists); what is accepted builds a pod that `restricted`
admits (checked by a reading of the standard written here, independent of the validator), its
resources merged with the defaults and its emptyDirs sized."""

from __future__ import annotations

import asyncio
import copy
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata_operator.api.stack import not_applicable_fields, parse_stack_spec, workspace_template_issues
from strata_operator.api.validation import STALLED_TEMPLATE_FORBIDDEN, SpecInvalid
from strata_operator.api.workspace_limits import TEMPLATE_EMPTY_DIR_CAP, merged_resources, parse_quantity
from strata_operator.api.workspace_template import template_issues
from strata_operator.controllers.auto_state import AutoState
from strata_operator.controllers.context import Context, OperatorSettings
from strata_operator.controllers.stack import reconcile_stack
from strata_operator.controllers.workspace import reconcile_workspace
from strata_operator.engine.pod.executor import PodEngine, WorkspaceSettings
from strata_operator.engine.pod.workspace_pod import (RUN_AS, WorkspaceNames, WorkspacePodArgs, build_workspace_pod,
                                                      container_security)
from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import EngineSettings

PKO = Path(__file__).parents[2] / "integration" / "operator" / "pko_v2.9.0"
STACK = "spec.workspaceTemplate.spec"
POD = f"{STACK}.podTemplate.spec"
# The operator's placement, as --workspace-node-selector type=real --workspace-toleration dedicated=updates:NoSchedule.
NODE_SELECTOR = {"type": "real"}
TOLERATIONS = ({"key": "dedicated", "operator": "Equal", "value": "updates", "effect": "NoSchedule"},)
SETTINGS = WorkspaceSettings(image="strata:1", node_selector=NODE_SELECTOR, tolerations=TOLERATIONS)
RESERVED = SETTINGS.reserved


# --- Pod Security Standards, `restricted` (v1.34), as kubernetes.io's table says it -------------------------
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What of `pod` (as the operator would create it) the `restricted` profile refuses."""
    spec, found = pod["spec"], []
    pod_security = spec.get("securityContext") or {}
    found += [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    found += [f"volume {v['name']}: {sorted(set(v) - {'name'})}" for v in spec.get("volumes") or []
              if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    found += [f"sysctl {s['name']}" for s in pod_security.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS]
    for name, value in (pod["metadata"].get("annotations") or {}).items():
        if name.startswith("container.apparmor.security.beta.kubernetes.io/") and value != "runtime/default" \
                and not value.startswith("localhost/"):
            found.append(f"annotation {name}")
    if pod_security.get("runAsUser") == 0 or pod_security.get("runAsNonRoot") is False:
        found.append("pod runs as root")
    for context, where in ((pod_security, "pod"),):
        found += _shared_violations(context, where)
    containers = [*spec["containers"], *(spec.get("initContainers") or []), *(spec.get("ephemeralContainers") or [])]
    for container in containers:
        security, where = container.get("securityContext") or {}, f"container {container['name']}"
        found += _shared_violations(security, where)
        if security.get("privileged"):
            found.append(f"{where}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        capabilities = security.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []) or set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: capabilities {capabilities}")
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is not True:
            found.append(f"{where}: runAsNonRoot is not true")
        if security.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser 0")
        seccomp = (security.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccomp {seccomp}")
        if security.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount")
        found += [f"{where}: hostPort" for port in container.get("ports") or [] if port.get("hostPort")]
        lifecycle = container.get("lifecycle") or {}
        handlers = [container.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        for handler in [*handlers, lifecycle.get("postStart"), lifecycle.get("preStop")]:
            for action in ("httpGet", "tcpSocket"):
                if ((handler or {}).get(action) or {}).get("host"):
                    found.append(f"{where}: {action}.host")
    return found


def _shared_violations(security: dict[str, Any], where: str) -> list[str]:
    found = []
    selinux = security.get("seLinuxOptions") or {}
    if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{where}: seLinuxOptions")
    if (security.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"{where}: appArmorProfile")
    if (security.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"{where}: seccompProfile")
    if (security.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}: hostProcess")
    return found


def _pod(template: dict[str, Any] | None = None, names: str = "team/app", **overrides: Any) -> dict[str, Any]:
    args = {"names": WorkspaceNames.of(names), "owner": None, "image": "strata:1", "service_account": "app-workspace",
            "template": template or {}, "node_selector": NODE_SELECTOR, "tolerations": TOLERATIONS, **overrides}
    return build_workspace_pod(WorkspacePodArgs(**args))


def _stack_issues(pod_spec: dict[str, Any], **template: Any) -> list:
    return template_issues({**template, "podTemplate": {"spec": pod_spec}}, STACK, RESERVED)


# --- refused, each naming its field as typed ---------------------------------------------------------------
SIDECAR = {"name": "side", "image": "busybox"}


def _sidecar(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "pulumi"}, {**SIDECAR, **fields}]}


FORBIDDEN = [
    ({"hostNetwork": True}, f"{POD}.hostNetwork"),
    ({"hostPID": True}, f"{POD}.hostPID"),
    ({"hostIPC": True}, f"{POD}.hostIPC"),
    ({"nodeName": "control-plane"}, f"{POD}.nodeName"),
    ({"priorityClassName": "system-node-critical"}, f"{POD}.priorityClassName"),
    ({"priority": 2000001000}, f"{POD}.priority"),
    ({"runtimeClassName": "unconfined"}, f"{POD}.runtimeClassName"),
    ({"schedulerName": "mine"}, f"{POD}.schedulerName"),
    ({"overhead": {"cpu": "10"}}, f"{POD}.overhead"),
    ({"shareProcessNamespace": True}, f"{POD}.shareProcessNamespace"),
    ({"serviceAccountName": "flux-admin"}, f"{POD}.serviceAccountName"),
    ({"serviceAccount": "flux-admin"}, f"{POD}.serviceAccount"),
    ({"automountServiceAccountToken": False}, f"{POD}.automountServiceAccountToken"),
    ({"ephemeralContainers": [{"name": "debug", "image": "busybox"}]}, f"{POD}.ephemeralContainers"),
    ({"resourceClaims": [{"name": "gpu"}]}, f"{POD}.resourceClaims"),  # not allow-listed: unknown is refused
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, f"{POD}.volumes[0].hostPath"),
    ({"volumes": [{"name": "share", "nfs": {"server": "x", "path": "/"}}]}, f"{POD}.volumes[0].nfs"),
    ({"volumes": [{"name": "big", "emptyDir": {"sizeLimit": "100Gi"}}]}, f"{POD}.volumes[0].emptyDir.sizeLimit"),
    ({"tolerations": [{"operator": "Exists"}]}, f"{POD}.tolerations[0]"),
    ({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]},
     f"{POD}.tolerations[0].key"),
    ({"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]},
     f"{POD}.tolerations[0].key"),
    ({"tolerations": [{"key": "strata.dev/real-node", "operator": "Exists"}]}, f"{POD}.tolerations[0].key"),
    ({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, f"{POD}.tolerations[0].key"),  # the operator's
    ({"nodeSelector": {"type": "kwok"}}, f"{POD}.nodeSelector.type"),
    ({"securityContext": {"runAsUser": 0}}, f"{POD}.securityContext.runAsUser"),
    ({"securityContext": {"runAsNonRoot": False}}, f"{POD}.securityContext.runAsNonRoot"),
    ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, f"{POD}.securityContext.sysctls"),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, f"{POD}.securityContext.seccompProfile.type"),
    ({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, f"{POD}.securityContext.appArmorProfile.type"),
    ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, f"{POD}.securityContext.seLinuxOptions.type"),
    ({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}, f"{POD}.securityContext.seLinuxOptions.user"),
    ({"securityContext": {"windowsOptions": {"hostProcess": True}}},
     f"{POD}.securityContext.windowsOptions.hostProcess"),
    ({"securityContext": {"privileged": True}}, f"{POD}.securityContext.privileged"),  # no pod-level field
    (_sidecar(securityContext={"privileged": True}), f"{POD}.containers[1].securityContext.privileged"),
    ({"containers": [{"name": "pulumi", "securityContext": {"allowPrivilegeEscalation": True}}]},
     f"{POD}.containers[0].securityContext.allowPrivilegeEscalation"),
    (_sidecar(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}),
     f"{POD}.containers[1].securityContext.capabilities.add[1]"),
    (_sidecar(securityContext={"capabilities": {"drop": ["NET_RAW"]}}),
     f"{POD}.containers[1].securityContext.capabilities.drop"),
    (_sidecar(securityContext={"procMount": "Unmasked"}), f"{POD}.containers[1].securityContext.procMount"),
    (_sidecar(securityContext={"runAsUser": 0}), f"{POD}.containers[1].securityContext.runAsUser"),
    (_sidecar(securityContext={"runAsNonRoot": False}), f"{POD}.containers[1].securityContext.runAsNonRoot"),
    (_sidecar(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     f"{POD}.containers[1].securityContext.seccompProfile.type"),
    (_sidecar(securityContext={"sysctls": []}), f"{POD}.containers[1].securityContext.sysctls"),
    (_sidecar(ports=[{"containerPort": 80, "hostPort": 80}]), f"{POD}.containers[1].ports[0].hostPort"),
    (_sidecar(livenessProbe={"httpGet": {"host": "10.88.0.1", "port": 10250}}),
     f"{POD}.containers[1].livenessProbe.httpGet.host"),
    (_sidecar(lifecycle={"preStop": {"tcpSocket": {"host": "169.254.169.254", "port": 80}}}),
     f"{POD}.containers[1].lifecycle.preStop.tcpSocket.host"),
    (_sidecar(restartPolicyRules=[]), f"{POD}.containers[1].restartPolicyRules"),
    ({"initContainers": [{"name": "extra", "image": "busybox", "securityContext": {"privileged": True}}]},
     f"{POD}.initContainers[0].securityContext.privileged"),
]


@pytest.mark.parametrize(("pod_spec", "path"), FORBIDDEN, ids=[path.removeprefix(POD + ".") for _, path in FORBIDDEN])
def test_each_forbidden_field_is_refused_naming_it_as_typed(pod_spec, path):
    issues = _stack_issues(copy.deepcopy(pod_spec))
    assert [issue.path for issue in issues] == [path]
    (issue,) = issues
    assert issue.reason == STALLED_TEMPLATE_FORBIDDEN and issue.fix
    assert SpecInvalid(issues).reason == STALLED_TEMPLATE_FORBIDDEN
    assert str(issue).startswith(f"{path}: ") and "(fix: " in str(issue)


def test_a_workspaces_template_is_named_from_its_own_spec():
    issues = template_issues({"podTemplate": {"spec": {"hostPID": True, "volumes": [{"name": "r", "hostPath": {}}]}}},
                             "spec", RESERVED)
    assert [i.path for i in issues] == ["spec.podTemplate.spec.hostPID", "spec.podTemplate.spec.volumes[0].hostPath"]


def test_apparmor_and_seccomp_annotations_that_lift_the_profile_are_refused():
    annotations = {"container.apparmor.security.beta.kubernetes.io/pulumi": "unconfined",
                   "container.apparmor.security.beta.kubernetes.io/side": "localhost/mine",
                   "seccomp.security.alpha.kubernetes.io/pod": "unconfined", "team": "alpha"}
    issues = template_issues({"podTemplate": {"metadata": {"annotations": annotations}}}, STACK, RESERVED)
    assert [i.path for i in issues] == [
        f"{STACK}.podTemplate.metadata.annotations.container.apparmor.security.beta.kubernetes.io/pulumi",
        f"{STACK}.podTemplate.metadata.annotations.seccomp.security.alpha.kubernetes.io/pod"]


def test_values_of_the_wrong_type_are_named_not_crashed_on():
    issues = template_issues({"podTemplate": {"spec": {"containers": "pulumi", "volumes": [7],
                                                       "securityContext": {"runAsUser": "root"}}},
                              "resources": {"limits": {"memory": "lots"}}}, STACK, RESERVED)
    assert [(i.path, i.reason) for i in issues] == [
        (f"{STACK}.resources.limits.memory", "SpecInvalid"), (f"{POD}.securityContext.runAsUser", "SpecInvalid"),
        (f"{POD}.volumes[0]", "SpecInvalid"), (f"{POD}.containers", "SpecInvalid")]
    assert template_issues("a string", STACK, RESERVED)[0].path == STACK
    assert template_issues({"podTemplate": []}, STACK, RESERVED)[0].path == f"{STACK}.podTemplate"


def test_a_request_above_a_limit_both_set_by_the_template_is_refused_naming_both():
    issues = template_issues({"resources": {"requests": {"memory": "4Gi"}},
                              "podTemplate": {"spec": {"containers": [{"name": "pulumi", "resources": {
                                  "limits": {"memory": "1Gi"}}}]}}}, STACK, RESERVED)
    assert [i.path for i in issues] == [f"{STACK}.resources.requests.memory"]
    assert f"above its limit 1Gi ({POD}.containers[0].resources.limits.memory)" in issues[0].problem


# --- accepted: PKO's own manifests, unchanged ----------------------------------------------------------------
def _pko_templates() -> list[tuple[str, dict[str, Any], str, str]]:
    """(file, template, field, engine key) of each Stack's workspaceTemplate and Workspace in PKO's examples and e2e."""
    found = []
    for path in sorted(PKO.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            name = f"{path.relative_to(PKO)}:{doc.get('metadata', {}).get('name')}"
            if doc.get("kind") == "Stack" and (doc.get("spec") or {}).get("workspaceTemplate"):
                found.append((name, doc["spec"]["workspaceTemplate"], STACK, "team/app"))
            elif doc.get("kind") == "Workspace" and doc.get("apiVersion", "").startswith("auto.pulumi.com"):
                found.append((name, {"spec": doc["spec"]}, "spec", "team/app@workspace"))
    return found


PKO_TEMPLATES = _pko_templates()


def test_pkos_manifests_are_all_read():
    files = {name.split(":")[0] for name, *_ in PKO_TEMPLATES}
    assert "examples/custom-workspace/workspace.yaml" in files and len(PKO_TEMPLATES) >= 15, sorted(files)


@pytest.mark.parametrize(("name", "template", "field", "key"), PKO_TEMPLATES, ids=[t[0] for t in PKO_TEMPLATES])
def test_pkos_legitimate_templates_are_accepted_and_build_a_restricted_pod(name, template, field, key):
    assert template_issues(template.get("spec"), field, RESERVED) == []
    pod = _pod(template, names=key)
    assert restricted_violations(pod) == []


def test_pkos_custom_workspace_keeps_what_it_asks_for():
    """Its extension points: labels, its own toleration, an init container (NET_BIND_SERVICE added), volumes
    and mounts, and resources; hardened where it says nothing."""
    (template,) = [t for n, t, *_ in PKO_TEMPLATES if n.startswith("examples/custom-workspace/")]
    spec = _pod(template, names="team/random-yaml-1e2fc47@workspace")["spec"]
    assert {"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (extra,) = [c for c in spec["initContainers"] if c["name"] == "extra"]
    assert extra["securityContext"] == {**container_security(), "allowPrivilegeEscalation": False,
                                        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}}
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": 1, "memory": "512Mi"},
                                                  "limits": {"cpu": 1, "memory": "512Mi"}}
    assert {"name": "oidc-token", "mountPath": "/var/run/secrets/pulumi"} in spec["containers"][0]["volumeMounts"]


# --- the pod built from what is accepted -----------------------------------------------------------------------
def test_template_resources_merge_with_the_defaults():
    def resources(**template: Any) -> dict[str, Any]:
        assert template_issues(template, STACK, RESERVED) == []
        return _pod({"spec": template})["spec"]["containers"][0]["resources"]

    # Requests only: the memory limit stays.
    assert resources(resources={"requests": {"memory": "512Mi"}}) == {
        "requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    # A request above the default limit raises the limit with it; a limit below the default request lowers it.
    assert resources(resources={"requests": {"memory": "4Gi"}})["limits"] == {"memory": "4Gi"}
    assert resources(resources={"limits": {"memory": "128Mi"}})["requests"] == {"cpu": "100m", "memory": "128Mi"}
    # The podTemplate's `pulumi` container merges over spec.resources, key by key.
    assert resources(resources={"requests": {"cpu": "1"}}, podTemplate={"spec": {"containers": [
        {"name": "pulumi", "resources": {"limits": {"cpu": "2"}}}]}}) == {
        "requests": {"cpu": "1", "memory": "192Mi"}, "limits": {"memory": "2Gi", "cpu": "2"}}
    assert merged_resources() == resources()


@pytest.mark.parametrize(("text", "value"), [("500m", "0.5"), ("512Mi", str(512 * 2 ** 20)), ("1.5Gi", str(3 * 2 ** 29)),
                                             ("1e3", "1000"), ("2E", str(2 * 10 ** 18)), (1, "1"), ("0.1", "0.1")])
def test_quantities_read_as_kubernetes_reads_them(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["1GB", "-1", "", "Mi", True, None, "1 Gi"])
def test_what_is_no_quantity_is_named(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_every_empty_dir_has_a_size_limit():
    template = {"spec": {"image": "team/pulumi:3", "podTemplate": {"spec": {"volumes": [
        {"name": "state", "emptyDir": {}}, {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
        {"name": "bare"}, {"name": "claim", "persistentVolumeClaim": {"claimName": "state"}}]}}}}
    assert template_issues(template["spec"], STACK, RESERVED) == []
    volumes = {v["name"]: v for v in _pod(template)["spec"]["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"sizeLimit": "4Gi"}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "1Gi"}
    assert volumes["runtime"]["emptyDir"] == {"sizeLimit": "512Mi"}  # the bundle it holds is 89 MB
    assert volumes["state"]["emptyDir"] == {"sizeLimit": "1Gi"}  # the template's, given the default
    assert volumes["cache"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    assert volumes["bare"]["emptyDir"] == {"sizeLimit": "1Gi"}  # what the API server would make an emptyDir
    assert volumes["claim"] == {"name": "claim", "persistentVolumeClaim": {"claimName": "state"}}
    assert all("sizeLimit" in v["emptyDir"] for v in volumes.values() if "emptyDir" in v)
    at_cap = {"podTemplate": {"spec": {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": TEMPLATE_EMPTY_DIR_CAP}}]}}}
    assert template_issues(at_cap, STACK, RESERVED) == []


def test_a_templates_containers_are_hardened_where_they_say_nothing():
    template = {"spec": {"podTemplate": {"spec": {
        "containers": [{"name": "pulumi", "securityContext": {"runAsUser": 1000, "readOnlyRootFilesystem": False}},
                       {"name": "side", "image": "busybox"},
                       {"name": "web", "image": "nginx",
                        "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}],
        "initContainers": [{"name": "extra", "image": "busybox"}]}}}}
    assert template_issues(template["spec"], STACK, RESERVED) == []
    spec = _pod(template)["spec"]
    pulumi, side, web = spec["containers"]
    assert pulumi["securityContext"] == {**container_security(), "runAsUser": 1000, "readOnlyRootFilesystem": False}
    assert side["securityContext"] == spec["initContainers"][0]["securityContext"] == container_security()
    assert web["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert spec["securityContext"]["runAsUser"] == RUN_AS and restricted_violations(_pod(template)) == []


def test_the_operators_node_selector_wins_and_its_tolerations_come_first():
    pod = _pod({"spec": {"podTemplate": {"spec": {"nodeSelector": {"pool": "updates", "type": "kwok"},
                                                  "tolerations": [{"key": "example.com/gpu", "operator": "Exists"}]}}}})
    assert pod["spec"]["nodeSelector"] == {"pool": "updates", "type": "real"}
    assert pod["spec"]["tolerations"] == [*TOLERATIONS, {"key": "example.com/gpu", "operator": "Exists"}]


# Fragments of templates, (benign, hostile), that the property test below combines at random.
POD_SECURITY = ([{}, {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}, {"supplementalGroups": [3000]},
                 {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
                 {"seLinuxOptions": {"level": "s0:c123,c456"}}, {"runAsNonRoot": True}],
                [{"runAsUser": 0}, {"runAsNonRoot": False}, {"seccompProfile": {"type": "Unconfined"}},
                 {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]},
                 {"appArmorProfile": {"type": "Unconfined"}}])
CONTAINER_SECURITY = ([None, {}, {"runAsUser": 1000}, {"readOnlyRootFilesystem": False},
                       {"capabilities": {"add": ["NET_BIND_SERVICE"]}}, {"capabilities": {"drop": ["ALL", "NET_RAW"]}},
                       {"allowPrivilegeEscalation": False}, {"seccompProfile": {"type": "RuntimeDefault"}},
                       {"runAsNonRoot": True}, {"seLinuxOptions": {"type": "container_t"}}],
                      [{"capabilities": {"drop": []}}, {"privileged": True}, {"allowPrivilegeEscalation": True},
                       {"runAsNonRoot": False}, {"runAsUser": 0}, {"seccompProfile": {"type": "Unconfined"}},
                       {"procMount": "Unmasked"}, {"seLinuxOptions": {"type": "spc_t"}},
                       {"capabilities": {"add": ["SYS_ADMIN"]}}])
VOLUMES = ([{"name": "state", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "claim", "persistentVolumeClaim": {"claimName": "state"}}, {"name": "cm", "configMap": {"name": "c"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "a"}}]}},
            {"name": "bare"}],
           [{"name": "huge", "emptyDir": {"sizeLimit": "64Gi"}}, {"name": "root", "hostPath": {"path": "/"}},
            {"name": "git", "gitRepo": {"repository": "x"}}])
EXTRAS = ([{"hostNetwork": False}, {"affinity": {}}, {"terminationGracePeriodSeconds": 30},
           {"tolerations": [{"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}]},
           {"nodeSelector": {"pool": "x"}}, {"ports": [{"containerPort": 8080, "hostPort": 0}]}],
          [{"hostNetwork": True}, {"hostPID": True}, {"nodeName": "n"}, {"tolerations": [{"operator": "Exists"}]},
           {"nodeSelector": {"type": "kwok"}}, {"priorityClassName": "high"},
           {"ports": [{"containerPort": 8080, "hostPort": 8080}]}])


def _pick(rng: random.Random, fragments: tuple[list[Any], list[Any]]) -> Any:
    """Mostly a benign fragment, sometimes a hostile one."""
    return copy.deepcopy(rng.choice(fragments[rng.random() < 0.1]))


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox"}
    security = _pick(rng, CONTAINER_SECURITY)
    if security is not None:
        container["securityContext"] = security
    return container


def _random_template(rng: random.Random) -> dict[str, Any]:
    containers = [_container(rng, "pulumi")] + [_container(rng, f"side{i}") for i in range(rng.randint(0, 2))]
    pod: dict[str, Any] = {"securityContext": _pick(rng, POD_SECURITY),
                           "volumes": [{**_pick(rng, VOLUMES), "name": f"v{i}"} for i in range(rng.randint(0, 3))],
                           "containers": containers,
                           "initContainers": [_container(rng, f"init{i}") for i in range(rng.randint(0, 2))]}
    for _ in range(rng.randint(0, 2)):
        extra = _pick(rng, EXTRAS)
        if "ports" in extra:
            rng.choice(containers).update(extra)
        else:
            pod.update(extra)
    return {"image": rng.choice(["", "team/pulumi:3"]), "podTemplate": {"spec": pod},
            "resources": rng.choice([{}, {"requests": {"memory": "1Gi"}}, {"limits": {"memory": "64Mi"}}])}


def test_every_pod_built_from_an_accepted_template_satisfies_restricted():
    rng = random.Random(45)
    accepted = refused = 0
    for _ in range(3000):
        template = _random_template(rng)
        issues = template_issues(copy.deepcopy(template), STACK, RESERVED)
        if issues:
            refused += 1
            continue
        accepted += 1
        pod = _pod({"spec": template})
        assert restricted_violations(pod) == [], template
        assert all("sizeLimit" in v["emptyDir"] for v in pod["spec"]["volumes"] if "emptyDir" in v), template
        resources = pod["spec"]["containers"][0]["resources"]
        assert parse_quantity(resources["limits"]["memory"]) >= parse_quantity(resources["requests"]["memory"])
    assert accepted > 200 and refused > 200, (accepted, refused)


def test_the_checker_here_sees_what_the_builder_alone_would_let_through():
    """The property above means something: the builder does not check; unchecked, a hostile template's pod is
    what the issue found (privileged, hostPID, the node's / mounted) and the checker says so."""
    violations = restricted_violations(_pod(HOSTILE["workspaceTemplate"]))
    assert violations == ["hostPID", "volume node: ['hostPath']", "container pulumi: privileged",
                          "container pulumi: runAsUser 0"]


# --- where the refusal happens: before any pod exists ---------------------------------------------------------
HOSTILE = {"stack": "dev", "programRef": {"name": "app"}, "workspaceTemplate": {"spec": {"podTemplate": {"spec": {
    "hostPID": True, "containers": [{"name": "pulumi", "securityContext": {"privileged": True, "runAsUser": 0}}],
    "volumes": [{"name": "node", "hostPath": {"path": "/"}}]}}}}}


def test_the_stack_check_applies_under_the_pod_executor_only():
    spec = parse_stack_spec(copy.deepcopy(HOSTILE), "team-alpha")
    assert [i.path for i in workspace_template_issues(spec, True, RESERVED)] == [
        f"{POD}.hostPID", f"{POD}.volumes[0].hostPath", f"{POD}.containers[0].securityContext.runAsUser",
        f"{POD}.containers[0].securityContext.privileged"]
    # The process executor builds no pod from it: accepted and reported as not applicable, as before.
    assert workspace_template_issues(spec, False, RESERVED) == []
    assert not_applicable_fields(copy.deepcopy(HOSTILE)) == ["workspaceTemplate"]


def test_a_profile_other_than_restricted_is_reported_as_not_applied_under_the_pod_executor():
    raw = {"stack": "dev", "workspaceTemplate": {"spec": {"securityProfile": "baseline"}}}
    assert not_applicable_fields(raw, in_workspace_pods=True) == ["workspaceTemplate.spec.securityProfile"]
    raw["workspaceTemplate"]["spec"]["securityProfile"] = "restricted"
    assert not_applicable_fields(raw, in_workspace_pods=True) == []


class _NoPods:
    """The cluster as the pod executor sees it: no pod yet, and a pod created would fail the test."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def get_pod(self, namespace: str, name: str) -> None:
        return None

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        self.created.append(pod)
        raise AssertionError("a workspace pod was created from a forbidden template")


@pytest.mark.parametrize(("key", "template", "field"), [
    ("team-alpha/app", HOSTILE["workspaceTemplate"], POD),
    ("team-alpha/ws@workspace", {"spec": HOSTILE["workspaceTemplate"]["spec"]}, "spec.podTemplate.spec")])
def test_the_pod_executor_itself_refuses_a_forbidden_template_before_any_pod(tmp_path, key, template, field):
    """Whatever reaches the executor (a Stack deleted before its spec was checked, a PKO Update)."""
    kube = _NoPods()
    settings = EngineSettings(state_dir=tmp_path, pulumi_command="/bin/true")
    engine = PodEngine(settings, SETTINGS, kube)  # type: ignore[arg-type]
    failure = asyncio.run(engine.prepare(UpdateRequest(stack_key=key, stack_name="dev", project_dir="",
                                                                     workspace_template=template)))
    assert kube.created == []
    assert f"{field}.hostPID: shows the pod every process of its node" in failure
    assert f"{field}.containers[0].securityContext.privileged" in failure


class _StatusOnly:
    """The API server as a pass that stalls uses it: status patches, recorded; anything else fails the test."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch_stack_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.patches.append(status)

    async def patch_custom_status(self, group: str, version: str, plural: str, namespace: str, name: str,
                                  status: dict[str, Any]) -> bool:
        self.patches.append(status)
        return True


class _PodEngineUntouched:
    """The pod executor's engine, which a stalled pass never asks for anything (no pod, no run)."""

    in_workspace_pods = True


def _stalled(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    (stalled,) = [c for c in conditions if c["type"] == "Stalled"]
    return stalled


PLACED = {"stack": "dev", "programRef": {"name": "app"},
          "workspaceTemplate": {"spec": {"podTemplate": {"spec": {"nodeSelector": {"type": "kwok"}}}}}}


@pytest.mark.parametrize(("spec", "message"), [
    (HOSTILE, f"{POD}.hostPID: shows the pod every process of its node (fix: remove it); {POD}.volumes[0].hostPath"),
    # The operator's own --workspace-node-selector key, from its settings.
    (PLACED, f"{POD}.nodeSelector.type: is the operator's to set (--workspace-node-selector)")])
def test_a_stack_with_a_forbidden_template_stalls_before_anything_is_run(monkeypatch, tmp_path, spec, message):
    events: list[tuple[str, str]] = []
    monkeypatch.setattr("kopf.event", lambda body, type, reason, message: events.append((reason, message)))
    kube = _StatusOnly()
    ctx = Context(kube=kube, engine=_PodEngineUntouched(),  # type: ignore[arg-type]
                  settings=OperatorSettings(engine=EngineSettings(state_dir=tmp_path), workspace=SETTINGS))
    body = {"apiVersion": "pulumi.com/v1", "kind": "Stack",
            "metadata": {"namespace": "team-alpha", "name": "app", "uid": "u", "generation": 1},
            "spec": copy.deepcopy(spec)}
    assert asyncio.run(reconcile_stack(ctx, body, logger=None)) is None
    stalled = _stalled(kube.patches[-1]["conditions"])
    assert stalled["reason"] == "WorkspaceTemplateForbidden" and stalled["message"].startswith(message)
    assert [reason for reason, _ in events] == ["StackConfigInvalid"]


def test_a_workspace_with_a_forbidden_template_stalls_before_its_pod(monkeypatch, tmp_path):
    monkeypatch.setattr("kopf.event", lambda body, type, reason, message: None)
    kube = _StatusOnly()
    ctx = Context(kube=kube, engine=_PodEngineUntouched(),  # type: ignore[arg-type]
                  settings=OperatorSettings(engine=EngineSettings(state_dir=tmp_path), workspace=SETTINGS))
    body = {"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace",
            "metadata": {"namespace": "team-alpha", "name": "ws", "uid": "u", "generation": 1},
            "spec": {"local": {"dir": "/program"}, "podTemplate": {"spec": {"nodeName": "control-plane"}}}}
    assert asyncio.run(reconcile_workspace(ctx, AutoState(), body, logger=None)) is None
    stalled = _stalled(kube.patches[-1]["conditions"])
    assert stalled["reason"] == "WorkspaceTemplateForbidden"
    assert stalled["message"].startswith("spec.podTemplate.spec.nodeName: binds the pod to a node")
