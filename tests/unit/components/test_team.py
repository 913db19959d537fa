"""TeamEnvironment: namespace-scoped least privilege, rule by rule, and a secret kubeconfig of the team's SA."""

from __future__ import annotations

import pulumi_kubernetes as k8s
import pytest
import yaml
from strata_mocks import FAKE_CA, fake_token

from strata_components.team import (TeamEnvironment, build_team_objects, build_team_rules, build_team_stack_spec,
                                    build_team_sync, build_viewer_rules)
from strata_components.team_entries import CREATED_BY_STACK, team_names, validate_teams

READ = ["get", "list", "watch"]
WRITE = ["get", "list", "watch", "create", "update", "patch", "delete"]


def _grants(rules):
    """{(apiGroup, resource): verbs} of a rule list."""
    grants = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in grants, f"{group}/{resource} granted twice"
                grants[(group, resource)] = rule["verbs"]
    return grants


def test_team_rules_rule_by_rule():
    assert _grants(build_team_rules()) == {
        ("", "configmaps"): WRITE, ("", "secrets"): WRITE, ("", "services"): WRITE, ("", "serviceaccounts"): WRITE,
        ("", "persistentvolumeclaims"): WRITE,
        ("", "pods"): READ, ("", "pods/log"): READ, ("", "events"): READ, ("", "endpoints"): READ,
        ("apps", "deployments"): WRITE, ("apps", "statefulsets"): WRITE, ("apps", "replicasets"): READ,
        ("batch", "jobs"): WRITE, ("batch", "cronjobs"): WRITE,
        ("networking.k8s.io", "ingresses"): WRITE, ("autoscaling", "horizontalpodautoscalers"): WRITE,
        ("events.k8s.io", "events"): READ,
        # The team's GitOps, applied as the team: its Stacks, Programs and sources; its own sync read-only.
        ("pulumi.com", "stacks"): WRITE, ("pulumi.com", "programs"): WRITE,
        ("source.toolkit.fluxcd.io", "gitrepositories"): WRITE, ("source.toolkit.fluxcd.io", "ocirepositories"): WRITE,
        ("source.toolkit.fluxcd.io", "buckets"): WRITE, ("kustomize.toolkit.fluxcd.io", "kustomizations"): READ,
    }


def test_no_rule_can_escalate():
    for rule in build_team_rules() + build_viewer_rules():
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert "rbac.authorization.k8s.io" not in rule["apiGroups"]
        assert "resourcequotas" not in rule["resources"] and "namespaces" not in rule["resources"]
        assert "nonResourceURLs" not in rule


def test_viewer_rules_are_read_only_and_never_secrets():
    grants = _grants(build_viewer_rules())
    assert all(verbs == READ for verbs in grants.values())
    assert ("", "secrets") not in grants


def test_team_objects_are_namespace_scoped():
    objects = build_team_objects("alpha", read_namespaces=["shared"])
    kinds = [(o["kind"], o["metadata"].get("namespace")) for o in objects]
    assert kinds == [("Namespace", None), ("ServiceAccount", "team-alpha"), ("Secret", "team-alpha"),
                     ("Role", "team-alpha"), ("RoleBinding", "team-alpha"), ("Role", "shared"),
                     ("RoleBinding", "shared"), *[("Role", "team-alpha"), ("RoleBinding", "team-alpha")] * 2]
    assert not any(o["kind"].startswith("Cluster") for o in objects)
    team_bindings = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"].startswith("team-")]
    assert len(team_bindings) == 2
    for binding in team_bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "team-alpha", "namespace": "team-alpha"}]


def test_the_operator_is_given_the_team_namespace_and_its_file_state_directory():
    """The operator serving the team's Stacks gets its Roles there (nothing cluster-wide gives them), and the
    namespace says which host directory the team's file:// state may use (the process executor's sandbox)."""
    objects = build_team_objects("alpha", operator={"namespace": "ops", "service_account": "op", "executor": "pod"},
                                 file_backend="file:///home/u/.local/state/strata/pulumi/teams/alpha")
    operator_bindings = [o for o in objects
                         if o["kind"] == "RoleBinding" and o["metadata"]["name"].startswith("strata-")]
    assert {b["roleRef"]["name"] for b in operator_bindings} == {"strata-operator-served", "strata-operator-workspaces"}
    for binding in operator_bindings:
        assert binding["metadata"]["namespace"] == "team-alpha"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["annotations"] == {
        "strata.dev/file-backend": "file:///home/u/.local/state/strata/pulumi/teams/alpha"}
    assert "annotations" not in [o for o in build_team_objects("alpha") if o["kind"] == "Namespace"][0]["metadata"]
    secret = objects[2]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "team-alpha"}


def test_a_team_namespace_enforces_pod_security_restricted():
    """Whoever creates a pod there (the team, its Deployments, the operator's workspace pods), the API server
    refuses one that asks for more than `restricted`; it also warns and audits."""
    (namespace,) = [o for o in build_team_objects("alpha") if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"] == {
        "strata.dev/team": "alpha",
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/warn-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/audit-version": "latest"}


@pytest.mark.parametrize("bad", ["Alpha", "a_b", "-a", "x" * 51, ""])
def test_team_names_must_be_dns_labels(bad):
    with pytest.raises(ValueError, match="DNS label"):
        team_names(bad)


def test_team_cannot_read_its_own_namespace_as_viewer():
    with pytest.raises(ValueError, match="own namespace"):
        build_team_objects("alpha", read_namespaces=["team-alpha"])


def test_team_environment_graph_and_secret_kubeconfig(harness):
    def program():
        provider = k8s.Provider("admin", kubeconfig="apiVersion: v1\nkind: Config\n")
        team = TeamEnvironment("alpha", {"provider": provider, "team": "alpha", "server": "https://127.0.0.1:6443",
                                         "source": {"url": "http://127.0.0.1:9418/alpha.git"},
                                         "stack": {"stack": "organization/app/alpha", "dir": "programs/app-team",
                                                   "backend": "file:///state"},
                                         "sync": {"path": "clusters/dev/team-alpha"}})
        return {"kubeconfig": team.kubeconfig, "token": team.token, "namespace": team.namespace}

    out = harness.run(program)
    assert out["namespace"].value == "team-alpha"
    assert out["token"].secret and out["token"].value == fake_token("team-alpha", "team-alpha")
    assert out["kubeconfig"].secret
    config = yaml.safe_load(out["kubeconfig"].value)
    assert config["users"][0]["user"] == {"token": fake_token("team-alpha", "team-alpha")}
    assert config["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:6443",
                                                "certificate-authority-data": FAKE_CA}
    assert config["contexts"][0]["context"]["namespace"] == "team-alpha"

    component = harness.one("strata:index:TeamEnvironment")
    provider = harness.one("pulumi:providers:kubernetes")
    namespace = harness.one("kubernetes:core/v1:Namespace")
    account = harness.one("kubernetes:core/v1:ServiceAccount")
    secret = harness.one("kubernetes:core/v1:Secret")
    role = harness.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "alpha-role-team-alpha-team-alpha")
    binding = harness.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
                          "alpha-rolebinding-team-alpha-team-alpha")
    # The operator's rights in the team's namespace exist before the team's Stack does.
    served = harness.one("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
                         "alpha-rolebinding-team-alpha-strata-operator-served")
    source = harness.one("kubernetes:source.toolkit.fluxcd.io/v1:GitRepository")
    stack = harness.one("kubernetes:pulumi.com/v1:Stack")
    for child in (namespace, account, secret, role, binding, source, stack):
        assert child.parent == component.urn, child.name
        assert harness.provider_urn(child.provider) == provider.urn, child.name
    for child in (account, secret, role, binding, source):
        assert namespace.urn in child.dependencies, child.name
    assert namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert account.urn in secret.dependencies and account.urn in binding.dependencies
    assert role.inputs["rules"] == build_team_rules()
    assert not harness.all("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert not harness.all("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    assert source.urn in stack.dependencies and binding.urn in stack.dependencies and served.urn in stack.dependencies
    assert stack.inputs["spec"]["serviceAccountName"] == "team-alpha"
    assert stack.inputs["spec"]["fluxSource"]["sourceRef"]["name"] == "team-alpha"
    # The team's sync objects name the stack that created them (the harness runs organization/strata/dev).
    sync = harness.one("kubernetes:kustomize.toolkit.fluxcd.io/v1:Kustomization")
    for created in (source, sync):
        assert created.inputs["metadata"]["annotations"] == {CREATED_BY_STACK: "organization/strata/dev"}


@pytest.mark.parametrize("needs_source", [{"stack": {"stack": "s"}}, {"sync": {"path": "p"}}])
def test_team_stack_or_sync_without_source_is_rejected(harness, needs_source):
    def program():
        provider = k8s.Provider("admin", kubeconfig="apiVersion: v1\nkind: Config\n")
        TeamEnvironment("a", {"provider": provider, "team": "a", "server": "https://x", **needs_source})

    with pytest.raises(ValueError, match=f"`{next(iter(needs_source))}` reads the team's `source`; add `source`"):
        harness.run(program)


def test_team_stack_spec_runs_as_the_team():
    spec = build_team_stack_spec("beta", "team-beta", {"stack": "o/p/beta", "config": {"app:replicas": "2"},
                                                       "extra": {"refresh": True}})
    assert spec["service_account_name"] == "team-beta" and spec["refresh"] is True
    assert spec["config"] == {"app:replicas": "2"}


def test_a_teams_sync_applies_its_directory_as_the_team_in_its_namespace():
    sync = build_team_sync("alpha", "team-alpha", "team-alpha", {"path": "clusters/dev/team-alpha",
                                                                 "substitute": {"STRATA_BACKEND": "file:///s/teams/alpha"}})
    assert sync["apiVersion"] == "kustomize.toolkit.fluxcd.io/v1" and sync["kind"] == "Kustomization"
    assert sync["metadata"]["namespace"] == "team-alpha"
    spec = sync["spec"]
    assert spec["serviceAccountName"] == "team-alpha" and spec["path"] == "clusters/dev/team-alpha"
    assert spec["sourceRef"] == {"kind": "GitRepository", "name": "team-alpha"}
    assert spec["postBuild"] == {"substitute": {"STRATA_BACKEND": "file:///s/teams/alpha"}}
    assert "postBuild" not in build_team_sync("b", "team-b", "team-b", {"path": "x"})["spec"]


def test_a_teams_sync_path_must_be_in_the_repository_flux_syncs(tmp_path):
    (tmp_path / "clusters" / "dev" / "team-alpha").mkdir(parents=True)
    validate_teams([{"name": "alpha"}], "strata:teams", str(tmp_path), "clusters/dev")
    with pytest.raises(ValueError, match=r"strata:teams\[1\] \(gamma\): its sync applies clusters/dev/team-gamma "
                                         r"of this project's repository, which does not exist"):
        validate_teams([{"name": "alpha"}, {"name": "gamma"}], "strata:teams", str(tmp_path), "clusters/dev")
    # A team of its own repository, or one with a `path` that exists, is fine.
    validate_teams([{"name": "gamma", "repo": "https://git/gamma.git"}, {"name": "delta", "path": "clusters/dev"}],
                   "strata:teams", str(tmp_path), "clusters/dev")
    with pytest.raises(ValueError, match="must be a list"):
        validate_teams({"name": "alpha"}, "strata:teams")
