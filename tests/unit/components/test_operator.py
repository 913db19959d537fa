"""Operator: packaged CRDs and RBAC (least privilege, rule by rule), in-cluster Deployment, local host process."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml
from strata_mocks import FAKE_CA, fake_token

from strata_components.local import processes
from strata_components.operator import (Operator, OperatorProcessProvider, build_executor_flags, build_local_ports,
                                        build_operator_deployment, build_operator_objects, build_operator_rbac,
                                        build_served_namespace_rbac, load_packaged_manifests, operator_code_digest)
from strata_operator.api import SHUTDOWN_DRAIN_SECONDS
from strata_operator.api.label_selector import parse_label_selector

READ = {"get", "list", "watch"}


def _grants(rules):
    grants = {}
    for rule in rules:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def test_packaged_operator_rbac_is_least_privilege_rule_by_rule():
    (role,) = [o for o in build_operator_rbac("strata-system", "strata-operator", load_packaged_manifests("rbac"))
               if o["kind"] == "ClusterRole"]
    assert _grants(role["rules"]) == {
        ("pulumi.com", "stacks"): {"get", "list", "watch", "patch", "update"},
        ("pulumi.com", "stacks/status"): {"get", "patch", "update"},
        ("pulumi.com", "programs"): READ,
        ("pulumi.com", "programs/status"): {"get", "patch"},
        # PKO v2's Workspace and Update; delete: only an Update, after its spec.ttlAfterCompleted.
        ("auto.pulumi.com", "workspaces"): READ, ("auto.pulumi.com", "updates"): READ | {"delete"},
        ("auto.pulumi.com", "workspaces/status"): {"get", "patch"}, ("auto.pulumi.com", "updates/status"): {"get", "patch"},
        ("source.toolkit.fluxcd.io", "gitrepositories"): READ,
        ("source.toolkit.fluxcd.io", "ocirepositories"): READ,
        ("source.toolkit.fluxcd.io", "buckets"): READ,
        ("source.toolkit.fluxcd.io", "helmcharts"): {"get"},
        ("source.toolkit.fluxcd.io", "externalartifacts"): {"get"},
        ("", "events"): {"create", "patch"}, ("events.k8s.io", "events"): {"create", "patch"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"get", "list", "watch"},
        # --metrics-auth kubernetes: a scraper's token, and whether its user may get /metrics.
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }


def _roles(objects, name):
    return [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == name]


def test_leader_election_lease_is_granted_in_the_operator_namespace_only():
    objects = build_operator_rbac("ops", "op", load_packaged_manifests("rbac"))
    (role,) = _roles(objects, "strata-operator-leader-election")
    (binding,) = [o for o in objects
                  if o["kind"] == "RoleBinding" and o["metadata"]["name"] == role["metadata"]["name"]]
    assert role["metadata"]["namespace"] == "ops"
    assert _grants(role["rules"]) == {("coordination.k8s.io", "leases"): {"get", "create", "update"},
                                      ("", "pods"): {"get"}}  # why its container last stopped
    assert binding["metadata"]["namespace"] == "ops"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    # Nothing cluster-wide about Leases.
    (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    assert not any("leases" in rule["resources"] for rule in cluster_role["rules"])


def test_secrets_and_tokens_are_the_operators_only_in_the_namespaces_it_serves():
    """A stolen operator token is worth the namespaces the operator serves, not the cluster: Secrets, ConfigMaps
    and ServiceAccount tokens are granted by Roles, in its own namespace and in each team's (never for the
    leader-election Role, which stays in its own)."""
    packaged = load_packaged_manifests("rbac")
    own = build_operator_rbac("ops", "op", packaged)
    served = build_served_namespace_rbac("team-a", "ops", "op", packaged)
    for objects, namespace in ((own, "ops"), (served, "team-a")):
        (role,) = _roles(objects, "strata-operator-served")
        assert role["metadata"]["namespace"] == namespace
        # create and update: spec.outputsSecret's Secret and approval plans (only ones its Stack owns).
        assert _grants(role["rules"]) == {("", "secrets"): {"get", "create", "update"}, ("", "configmaps"): {"get"}}
        (tokens,) = _roles(objects, "strata-operator-tokens")
        assert _grants(tokens["rules"]) == {("", "serviceaccounts/token"): {"create"}}
    assert {o["metadata"]["name"] for o in served} == {"strata-operator-served", "strata-operator-tokens"}
    assert {o["kind"] for o in served} == {"Role", "RoleBinding"}
    for binding in (o for o in served if o["kind"] == "RoleBinding"):
        assert binding["metadata"]["namespace"] == "team-a"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    pod = build_served_namespace_rbac("team-a", "ops", "op", packaged, executor="pod")
    assert {o["metadata"]["name"] for o in pod} == {"strata-operator-served", "strata-operator-workspaces"}


def test_no_cluster_role_the_project_ships_opens_a_namespace():
    """Every ClusterRole rendered anywhere (the operator's package, the operator and team components, the local
    platform and its add-ons): no token requests, no wildcard, and no Secret read across the cluster."""
    from strata_components.local.cluster_addons import build_coredns_objects
    from strata_components.local.platform import build_git_server_rbac
    from strata_components.team import build_team_objects

    packaged = load_packaged_manifests("rbac")
    rendered = [*packaged, *build_git_server_rbac(), *build_coredns_objects("coredns:1", 2),
                *build_team_objects("alpha", "team-alpha", read_namespaces=["shared"])]
    for executor in ("process", "pod"):
        rendered += build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i",
                                            "executor": executor}, packaged)
    cluster_roles = [o for o in rendered if o.get("kind") == "ClusterRole"]
    assert {o["metadata"]["name"] for o in cluster_roles} >= {"strata-operator", "strata-metrics-reader"}
    for role in cluster_roles:
        for rule in role.get("rules") or []:
            where = f"ClusterRole {role['metadata']['name']}: {rule}"
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", []), where
            assert "serviceaccounts/token" not in rule.get("resources", []), where
            if "" in rule.get("apiGroups", []) and "secrets" in rule["resources"]:
                assert not {"get", "list", "watch"} & set(rule["verbs"]), where
            if "" in rule.get("apiGroups", []) and {"secrets", "pods", "serviceaccounts"} & set(rule["resources"]):
                assert "create" not in rule["verbs"], where


def test_operator_rbac_never_grants_wildcards_deletes_or_escalation():
    objects = build_operator_rbac("ops", "op", load_packaged_manifests("rbac"))
    for role in (o for o in objects if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            if "delete" in rule["verbs"]:  # PKO's ttlAfterCompleted: a completed Update, and nothing else
                assert (rule["apiGroups"], rule["resources"], rule["verbs"]) == (["auto.pulumi.com"], ["updates"],
                                                                                 ["delete"])
            assert "rbac.authorization.k8s.io" not in rule["apiGroups"]
            # Secrets are read one by one (refs) and written by name (approval plans, spec.outputsSecret), never
            # listed or watched.
            if "secrets" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "create", "update"}


def test_only_a_pod_executor_operator_may_create_workspace_pods():
    packaged = load_packaged_manifests("rbac")
    process = build_operator_objects({"provider": None, "mode": "in-cluster", "image": "img:1"}, packaged)
    pod = build_operator_objects({"provider": None, "mode": "in-cluster", "image": "img:1", "executor": "pod",
                                  "workspace_node_selector": {"pool": "updates"},
                                  "workspace_tolerations": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
                                 packaged)
    grants = {name: _grants([r for o in objects if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"]
                             not in ("strata-metrics-reader", "strata-operator-leader-election") for r in o["rules"]])
              for name, objects in (("process", process), ("pod", pod))}
    assert ("", "pods") not in grants["process"] and ("", "serviceaccounts") not in grants["process"]
    # patch and delete: a Stack's own workspace objects, disowned while its destroy runs and removed after.
    assert grants["pod"][("", "pods")] == {"get", "create", "delete", "patch"}
    assert grants["pod"][("", "serviceaccounts")] == {"get", "create", "delete", "patch"}
    assert grants["pod"][("", "secrets")] == {"get", "create", "update", "delete", "patch"}
    # A pod's identity is the Stack's ServiceAccount itself: no token is minted.
    assert ("", "serviceaccounts/token") not in grants["pod"] and ("", "serviceaccounts/token") in grants["process"]
    # None of it cluster-wide: only Roles, in the namespaces the operator serves.
    for objects in (process, pod):
        for role in (o for o in objects if o["kind"] == "ClusterRole"):
            resources = {r for rule in role["rules"] for r in rule.get("resources", [])}
            assert not {"pods", "secrets", "serviceaccounts"} & resources


def test_operator_rbac_binds_only_the_given_service_account():
    objects = build_operator_rbac("ops", "op", load_packaged_manifests("rbac"))
    bindings = [o for o in objects if o["kind"].endswith("Binding")]
    assert bindings and all(b["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
                            for b in bindings)
    # The package's own ServiceAccount / binding (fixed to strata-system) are not applied.
    assert not [o for o in objects if o["kind"] == "ServiceAccount"]


def test_in_cluster_metrics_answer_only_authorized_scrapers_and_a_role_for_them_ships_unbound():
    packaged = load_packaged_manifests("rbac")
    objects = build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i", "metrics_port": 9000},
                                     packaged)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # On the pod's address, for its Service; each request's token reviewed (the operator's default is loopback).
    assert {"--metrics-port=9000", "--metrics-bind-address=0.0.0.0",
            "--metrics-auth=kubernetes"} <= set(container["args"])
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9000, "targetPort": "metrics"}]
    (reader,) = [o for o in objects if o["metadata"]["name"] == "strata-metrics-reader"]
    assert reader["kind"] == "ClusterRole" and reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # Prometheus's to bind, not the operator's: no binding of it, and the operator's own roles are as before.
    assert not [o for o in objects if o["kind"].endswith("Binding") and o["roleRef"]["name"] == "strata-metrics-reader"]
    assert reader not in build_operator_rbac("ops", "op", packaged)
    # The local operator (a host process) keeps the operator's default: loopback, no review.
    local = build_operator_objects({"provider": None, "mode": "local"}, packaged)
    assert not [o for o in local if o["metadata"]["name"] == "strata-metrics-reader"]
    assert not [f for f in build_executor_flags({"provider": None, "mode": "local"}) if f.startswith("--metrics")]


def test_packaged_crds_define_pulumi_com_stack_and_program_and_auto_workspace_and_update():
    crds = load_packaged_manifests("crds")
    assert {(c["spec"]["group"], c["spec"]["names"]["kind"]) for c in crds} == {
        ("pulumi.com", "Stack"), ("pulumi.com", "Program"), ("auto.pulumi.com", "Workspace"),
        ("auto.pulumi.com", "Update")}


def test_deployment_is_hardened_with_probes_and_ports():
    deployment = build_operator_deployment("ops", "op", "registry/strata:1", metrics_port=9000, health_port=9001,
                                           args=["--concurrency=4"], env={"X": "1"})
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pod["serviceAccountName"] == "op" and pod["securityContext"]["runAsNonRoot"] is True
    assert container["command"] == ["python", "-m", "strata_operator"]
    assert container["args"] == ["--metrics-port=9000", "--health-port=9001", "--metrics-bind-address=0.0.0.0",
                                 "--metrics-auth=kubernetes", "--concurrency=4"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9000, "health": 9001}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["resources"]["limits"]["memory"]
    # The operator names this field when an update runs its container out of memory.
    assert container["env"] == [{"name": "STRATA_RESOURCES_FIELD", "value": "the Operator component's resources"},
                                {"name": "X", "value": "1"}]
    with pytest.raises(ValueError, match="image"):
        build_operator_deployment("ops", "op", "")


def test_deployment_replicas_stand_by_behind_one_leader():
    deployment = build_operator_deployment("ops", "op", "registry/strata:1", replicas=3)
    assert deployment["spec"]["replicas"] == 3
    # No flag turns leader election off: every replica takes part.
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert not [arg for arg in container["args"] if "leader-election" in arg]
    with pytest.raises(ValueError, match="replicas"):
        build_operator_deployment("ops", "op", "registry/strata:1", replicas=0)
    (rendered,) = [o for o in build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i",
                                                      "replicas": 2}, load_packaged_manifests("rbac"))
                   if o["kind"] == "Deployment"]
    assert rendered["spec"]["replicas"] == 2


def test_a_pod_going_in_a_rollout_has_time_to_let_its_running_updates_finish():
    pod = build_operator_deployment("ops", "op", "registry/strata:1")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > SHUTDOWN_DRAIN_SECONDS


def test_objects_per_mode():
    packaged = load_packaged_manifests("rbac")
    incluster = [o["kind"] for o in build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i"},
                                                           packaged)]
    local = [o["kind"] for o in build_operator_objects({"provider": None, "mode": "local"}, packaged)]
    rbac = ["ClusterRole", "ClusterRoleBinding", *["Role", "RoleBinding"] * 3]
    assert incluster == ["Namespace", "ServiceAccount", *rbac, "ClusterRole", "Deployment", "Service"]
    assert local == ["Namespace", "ServiceAccount", *rbac, "Secret"]
    with pytest.raises(ValueError, match="in-cluster or local"):
        build_operator_objects({"provider": None, "mode": "docker"}, packaged)


def test_shards_are_deployments_of_their_own_splitting_every_object_between_them():
    objects = build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i", "replicas": 2,
                                      "shards": ["shard1", "shard2"], "args": ["--concurrency=20"]},
                                     load_packaged_manifests("rbac"))
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    assert sorted(deployments) == ["strata-operator", "strata-operator-shard1", "strata-operator-shard2"]
    assert sorted(services) == [f"{name}-metrics" for name in sorted(deployments)]
    selectors = {}
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "--concurrency=20" in container["args"] and deployment["spec"]["replicas"] == 2
        (flag,) = [arg for arg in container["args"] if arg.startswith("--watch-label-selector=")]
        selectors[name] = parse_label_selector(flag.partition("=")[2])
        # Each Deployment selects its own pods only, and its metrics Service the same pods.
        match = deployment["spec"]["selector"]["matchLabels"]
        assert services[f"{name}-metrics"]["spec"]["selector"] == match
        assert services[f"{name}-metrics"]["metadata"]["annotations"] == {
            "pulumi.com/waitFor": "jsonpath={.spec.clusterIP}"}  # the Deployment's rollout is awaited
        for other in deployments.values():
            pod_labels = other["spec"]["template"]["metadata"]["labels"]
            assert (match.items() <= pod_labels.items()) is (other is deployment)
    # The main operator's Deployment keeps the selector it always had (immutable once created).
    assert deployments["strata-operator"]["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "strata-operator"}
    for labels in ({}, {"sharding.fluxcd.io/key": "shard1"}, {"sharding.fluxcd.io/key": "shard2"}):
        assert sum(selector.matches(labels) for selector in selectors.values()) == 1
    # Without shards: one operator, no selector, as before.
    (single,) = [o for o in build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i"},
                                                   load_packaged_manifests("rbac")) if o["kind"] == "Deployment"]
    assert not [a for a in single["spec"]["template"]["spec"]["containers"][0]["args"] if "label-selector" in a]


@pytest.mark.parametrize("shards, message", [
    (["Shard1"], "shard 'Shard1' in `shards` is not a name"),
    (["a" * 40], "at most 39 characters"),
    (["one", "one"], "`shards` names one twice"),
])
def test_bad_shard_names_are_refused_naming_the_field(shards, message):
    with pytest.raises(ValueError, match=message):
        build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i", "shards": shards},
                               load_packaged_manifests("rbac"))


def test_shards_need_in_cluster_mode():
    with pytest.raises(ValueError, match="`shards` need in-cluster mode"):
        build_operator_objects({"provider": None, "mode": "local", "shards": ["shard1"]},
                               load_packaged_manifests("rbac"))


def test_in_cluster_operator_graph(harness):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="apiVersion: v1\nkind: Config\n")
        watched = k8s.core.v1.ConfigMap("watched-crds", opts=pulumi.ResourceOptions(provider=provider))
        operator = Operator("operator", {"provider": provider, "mode": "in-cluster", "image": "registry/strata:1"},
                            start_after=[watched])
        return {"namespace": operator.namespace}

    out = harness.run(program)
    assert out["namespace"].value == "strata-system"
    component = harness.one("strata:index:Operator")
    crds = harness.all("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    deployment = harness.one("kubernetes:apps/v1:Deployment")
    binding = harness.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    lease_binding = harness.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
                                "operator-rolebinding-strata-system-strata-operator-leader-election")
    lease_role = harness.one("kubernetes:rbac.authorization.k8s.io/v1:Role",
                             "operator-role-strata-system-strata-operator-leader-election")
    namespace = harness.one("kubernetes:core/v1:Namespace")
    service = harness.one("kubernetes:core/v1:Service")
    assert len(crds) == 4
    for child in [*crds, deployment, binding, lease_role, lease_binding, namespace, service]:
        assert child.parent == component.urn
    assert {c.urn for c in crds} <= set(deployment.dependencies)
    assert binding.urn in deployment.dependencies and namespace.urn in service.dependencies
    # The Lease grant exists before the operator starts, in a namespace that exists by then.
    assert lease_binding.urn in deployment.dependencies and namespace.urn in lease_role.dependencies
    # `start_after` (e.g. Flux's CRDs) holds back the operator's start alone, not its identity.
    watched = harness.one("kubernetes:core/v1:ConfigMap", "watched-crds")
    assert watched.urn in deployment.dependencies
    assert not any(watched.urn in child.dependencies for child in [binding, lease_role, lease_binding, namespace, service])
    assert not harness.all("pulumi-python:dynamic:Resource")


def test_local_operator_runs_on_the_host_with_its_own_service_account_token(harness):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="apiVersion: v1\nkind: Config\n")
        operator = Operator("operator", {
            "provider": provider, "mode": "local", "health_port": 18384,
            "local": {"state_dir": "/tmp/strata-state", "server": "https://127.0.0.1:6443",
                      "command": ["/venv/bin/python", "-m", "strata_operator"]}})
        return {"kubeconfig": operator.kubeconfig}

    out = harness.run(program)
    assert out["kubeconfig"].secret
    config = yaml.safe_load(out["kubeconfig"].value)
    assert config["users"][0]["user"] == {"token": fake_token("strata-system", "strata-operator")}
    assert config["clusters"][0]["cluster"]["certificate-authority-data"] == FAKE_CA
    assert not harness.all("kubernetes:apps/v1:Deployment")
    process = harness.one("pulumi-python:dynamic:Resource", "operator-process")
    assert process.parent == harness.one("strata:index:Operator").urn
    # Its per-Stack state stays inside the platform's state directory, not the user's ~/.cache.
    assert process.inputs["command"] == ["/venv/bin/python", "-m", "strata_operator"]
    assert process.inputs["flags"] == ["--state-dir=/tmp/strata-state/operator"]
    # No fixed metrics port (None is dropped on the way): the provider takes the platform's own, picked free
    # and kept.
    assert process.inputs["requested_ports"] == {"health_port": 18384}
    assert "kubeconfig" in process.additional_secret_outputs
    secret = harness.one("kubernetes:core/v1:Secret")
    binding = harness.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    assert secret.urn in process.dependencies and binding.urn in process.dependencies
    # Its Lease and the rights of the namespace it serves exist before it starts.
    for binding in harness.all("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"):
        assert binding.urn in process.dependencies
    assert all(c.urn in process.dependencies
               for c in harness.all("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"))


def test_deployment_places_pods_by_node_labels_and_tolerations_and_writes_only_to_volumes():
    deployment = build_operator_deployment("ops", "op", "registry/strata:1", node_selector={"pool": "ops"},
                                           tolerations=[{"key": "dedicated", "operator": "Exists"}])
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "ops"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    (container,) = pod["containers"]
    # Read-only root: the image's HOME (state dir, PULUMI_HOMEs) and /tmp are volumes.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/home/strata": "home", "/tmp": "tmp"}
    assert {v["name"] for v in pod["volumes"]} == {"home", "tmp"}
    plain = build_operator_deployment("ops", "op", "registry/strata:1")["spec"]["template"]["spec"]
    assert "nodeSelector" not in plain and "tolerations" not in plain


def test_flux_events_address_becomes_the_operator_flag_in_both_modes(harness):
    deployment = build_operator_deployment("ops", "op", "registry/strata:1",
                                           flux_events_address="http://nc.flux-system.svc./")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--flux-events-address=http://nc.flux-system.svc./" in container["args"]
    assert not any(a.startswith("--flux-events-address") for a in
                   build_operator_deployment("ops", "op", "registry/strata:1")["spec"]["template"]["spec"]
                   ["containers"][0]["args"])

    def program():
        provider = k8s.Provider("k8s", kubeconfig="apiVersion: v1\nkind: Config\n")
        Operator("operator", {
            "provider": provider, "mode": "local", "flux_events_address": "http://127.0.0.1:9090/",
            "local": {"state_dir": "/tmp/strata-state", "server": "https://127.0.0.1:6443",
                      "command": ["/venv/bin/python", "-m", "strata_operator"]}})

    harness.run(program)
    process = harness.one("pulumi-python:dynamic:Resource", "operator-process")
    assert "--flux-events-address=http://127.0.0.1:9090/" in process.inputs["flags"]


def test_local_operator_ports_are_the_platforms_kept_ones_unless_the_args_give_them():
    kept = {"operator_metrics": 40111, "operator_health": 40112}
    assert build_local_ports({"metrics_port": None, "health_port": None}, kept) == {
        "metrics_port": 40111, "health_port": 40112}
    assert build_local_ports({"metrics_port": 9000.0}, kept) == {"metrics_port": 9000, "health_port": 40112}


def test_a_new_version_of_the_operator_restarts_the_local_process_and_nothing_else_does(monkeypatch, tmp_path):
    """An upgrade on the host is `git pull && make up`: the process runs the code it was started with, so a
    changed operator package is an update of the process (stopped letting its updates finish, started again)."""
    monkeypatch.setattr(processes, "running_pid", lambda *_: 4242)
    props = {"state_dir": str(tmp_path), "name": "strata-operator", "code": operator_code_digest(),
             "command": ["python", "-m", "strata_operator"], "flags": [], "requested_ports": {}, "env": {},
             "kubeconfig": "k"}
    assert operator_code_digest() == props["code"] and len(props["code"]) == 16
    assert not OperatorProcessProvider().diff("id", props, dict(props)).changes
    assert OperatorProcessProvider().diff("id", {**props, "code": "0123456789abcdef"}, props).changes
    assert OperatorProcessProvider().diff("id", {k: v for k, v in props.items() if k != "code"}, props).changes


def test_served_and_trusted_namespaces_are_named_by_the_component():
    """A PKO user's own namespaces: served (the operator's Roles there) and, for a single-team operator,
    trusted (programs unsandboxed); nothing of either by default."""
    packaged = load_packaged_manifests("rbac")
    plain = build_operator_objects({"provider": None, "mode": "in-cluster", "image": "i"}, packaged)
    args = {"provider": None, "mode": "in-cluster", "image": "i", "served_namespaces": ["apps", "infra"],
            "trusted_namespaces": ["apps"]}
    objects = build_operator_objects(args, packaged)
    served = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects} - {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in plain}
    assert served == {(kind, namespace, name) for namespace in ("apps", "infra") for kind in ("Role", "RoleBinding")
                      for name in ("strata-operator-served", "strata-operator-tokens")}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert "--trusted-namespace=apps" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_executor_flags({"mode": "local"}) == []
