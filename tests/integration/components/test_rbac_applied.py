"""The RBAC the components render, applied to the real apiserver and checked rule by rule.

The team and operator objects come from the same pure build_* functions the components register
with Pulumi; they are server-side applied here, and each identity's allowed and refused actions are
asked of the apiserver with a SelfSubjectAccessReview made with a token of that ServiceAccount.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.kube_objects import token_from_secret_data
from strata_components.kubeconfig import build_token_kubeconfig
from strata_components.layers import list_status
from strata_components.local import processes
from strata_components.local.kube import api_client, server_side_apply, write_private
from strata_components.operator import build_operator_objects, load_packaged_manifests
from strata_components.team import build_team_objects, team_names

pytestmark = pytest.mark.platform

# The operator's identity as shipped: the same one the operator integration tests run under.
OPERATOR_NAMESPACE = "strata-system"
OPERATOR_SERVICE_ACCOUNT = "strata-operator"


def can(kubeconfig: Path, verb: str, resource: str, namespace: str = "", group: str = "",
        subresource: str = "", name: str = "") -> bool:
    """Whether the kubeconfig's identity may do this, as the apiserver's authorizer answers."""
    attributes = {"verb": verb, "resource": resource, "group": group, "namespace": namespace,
                  "subresource": subresource, "name": name}
    with api_client(kubeconfig) as api:
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
             "spec": {"resourceAttributes": {key: value for key, value in attributes.items() if value}}})
    return review.status.allowed


@pytest.fixture(scope="module")
def applied(platform, local_platform, kube_client, tmp_path_factory):
    """Two teams (alpha may view a shared namespace) and the operator, applied; a token kubeconfig each."""
    suffix = uuid.uuid4().hex[:5]
    alpha, beta, shared = f"alpha-{suffix}", f"beta-{suffix}", f"shared-{suffix}"
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": shared}})
    crds = load_packaged_manifests("crds")
    operator_objects = build_operator_objects(
        {"provider": None, "mode": "local", "namespace": OPERATOR_NAMESPACE,
         "service_account": OPERATOR_SERVICE_ACCOUNT}, load_packaged_manifests("rbac"))
    server_side_apply(local_platform.kubeconfig_path, [
        *crds, *operator_objects,
        *build_team_objects(alpha, read_namespaces=[shared]), *build_team_objects(beta)])

    directory = tmp_path_factory.mktemp("kubeconfigs")

    def token_kubeconfig(namespace: str, service_account: str) -> Path:
        return write_private(directory / f"{namespace}-{service_account}",
                             platform.token_kubeconfig(namespace, service_account))

    names = {team: team_names(team) for team in (alpha, beta)}
    yield {
        "alpha": names[alpha], "beta": names[beta], "shared": shared,
        "alpha_kubeconfig": token_kubeconfig(names[alpha]["namespace"], names[alpha]["service_account"]),
        "beta_kubeconfig": token_kubeconfig(names[beta]["namespace"], names[beta]["service_account"]),
        "operator_kubeconfig": token_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT),
        "directory": directory, "crds": crds,
    }
    for namespace in (shared, names[alpha]["namespace"], names[beta]["namespace"]):
        core.delete_namespace(namespace)


def test_the_crds_are_accepted_and_established(applied, kube_client):
    extensions = client.ApiextensionsV1Api(kube_client)

    def established() -> bool:
        for crd in applied["crds"]:
            conditions = extensions.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    processes.wait_until(established, timeout=30, what="Strata CRDs")


def test_a_team_deploys_in_its_own_namespace(applied):
    kubeconfig, own = applied["alpha_kubeconfig"], applied["alpha"]["namespace"]
    assert can(kubeconfig, "create", "deployments", own, group="apps")
    assert can(kubeconfig, "patch", "deployments", own, group="apps")
    assert can(kubeconfig, "create", "configmaps", own)
    assert can(kubeconfig, "create", "secrets", own)
    assert can(kubeconfig, "get", "secrets", own)
    assert can(kubeconfig, "create", "jobs", own, group="batch")
    assert can(kubeconfig, "list", "pods", own)
    assert can(kubeconfig, "get", "pods", own, subresource="log")
    # Its GitOps, applied as the team: its Stacks, Programs and the Flux sources they name.
    assert can(kubeconfig, "update", "stacks", own, group="pulumi.com")
    assert can(kubeconfig, "create", "programs", own, group="pulumi.com")
    assert can(kubeconfig, "create", "gitrepositories", own, group="source.toolkit.fluxcd.io")
    assert can(kubeconfig, "get", "kustomizations", own, group="kustomize.toolkit.fluxcd.io")


def test_a_team_cannot_escalate_or_change_its_own_guard_rails(applied):
    kubeconfig, own = applied["alpha_kubeconfig"], applied["alpha"]["namespace"]
    assert not can(kubeconfig, "create", "roles", own, group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "create", "rolebindings", own, group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "create", "clusterroles", group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "create", "clusterrolebindings", group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "update", "resourcequotas", own)
    assert not can(kubeconfig, "delete", "namespaces", name=own)
    assert not can(kubeconfig, "create", "pods", own, subresource="exec")
    # The platform owns the team's sync: the team reads it, never rewrites what it applies as or where from.
    assert not can(kubeconfig, "update", "kustomizations", own, group="kustomize.toolkit.fluxcd.io")
    assert not can(kubeconfig, "create", "serviceaccounts", own, subresource="token")


def test_a_team_cannot_touch_another_team(applied):
    for kubeconfig, other in ((applied["alpha_kubeconfig"], applied["beta"]["namespace"]),
                              (applied["beta_kubeconfig"], applied["alpha"]["namespace"])):
        assert not can(kubeconfig, "get", "secrets", other)
        assert not can(kubeconfig, "list", "secrets", other)
        assert not can(kubeconfig, "list", "pods", other)
        assert not can(kubeconfig, "create", "deployments", other, group="apps")
        assert not can(kubeconfig, "create", "stacks", other, group="pulumi.com")
    assert not can(applied["alpha_kubeconfig"], "list", "secrets")  # cluster-wide
    assert not can(applied["alpha_kubeconfig"], "list", "stacks", group="pulumi.com")


def test_a_granted_read_namespace_is_viewable_without_secrets_or_writes(applied):
    alpha, shared = applied["alpha_kubeconfig"], applied["shared"]
    assert can(alpha, "list", "pods", shared)
    assert can(alpha, "get", "deployments", shared, group="apps")
    assert not can(alpha, "get", "secrets", shared)
    assert not can(alpha, "create", "configmaps", shared)
    assert not can(alpha, "delete", "deployments", shared, group="apps")
    assert not can(applied["beta_kubeconfig"], "list", "pods", shared)


def test_no_team_reaches_the_operator_namespace(applied):
    for kubeconfig in (applied["alpha_kubeconfig"], applied["beta_kubeconfig"]):
        assert not can(kubeconfig, "get", "secrets", OPERATOR_NAMESPACE)
        assert not can(kubeconfig, "list", "pods", OPERATOR_NAMESPACE)
        assert not can(kubeconfig, "create", "deployments", OPERATOR_NAMESPACE, group="apps")
        assert not can(kubeconfig, "create", "serviceaccounts", OPERATOR_NAMESPACE, subresource="token",
                       name=OPERATOR_SERVICE_ACCOUNT)
        assert not can(kubeconfig, "patch", "stacks", OPERATOR_NAMESPACE, group="pulumi.com")


def test_the_team_kubeconfig_from_the_token_secret_authenticates_as_the_team(applied, kube_client, local_platform):
    """What TeamEnvironment exports: a kubeconfig from the token Secret the token controller fills."""
    names = applied["alpha"]
    core = client.CoreV1Api(kube_client)
    secret = processes.wait_until(
        lambda: (core.read_namespaced_secret(names["token_secret"], names["namespace"]).data or {}).get("token")
        and core.read_namespaced_secret(names["token_secret"], names["namespace"]),
        timeout=30, what="team token Secret")
    kubeconfig = write_private(applied["directory"] / "alpha-from-secret", build_token_kubeconfig(
        cluster="strata", server=local_platform.server, ca_data=secret.data["ca.crt"],
        user=names["service_account"], token=token_from_secret_data(secret.data), namespace=names["namespace"]))
    assert can(kubeconfig, "create", "deployments", names["namespace"], group="apps")
    assert not can(kubeconfig, "get", "secrets", applied["beta"]["namespace"])


def test_the_operator_can_do_its_job(applied):
    kubeconfig, team = applied["operator_kubeconfig"], applied["alpha"]["namespace"]
    for verb in ("list", "watch", "patch"):
        assert can(kubeconfig, verb, "stacks", group="pulumi.com"), verb
    assert can(kubeconfig, "patch", "stacks", team, group="pulumi.com", subresource="status")
    assert can(kubeconfig, "get", "programs", team, group="pulumi.com")
    assert can(kubeconfig, "create", "events", team)
    assert can(kubeconfig, "create", "events", team, group="events.k8s.io")
    assert can(kubeconfig, "get", "secrets", team, name="strata-pulumi-passphrase")
    assert can(kubeconfig, "get", "configmaps", team)
    for kind in ("gitrepositories", "ocirepositories", "buckets"):
        assert can(kubeconfig, "get", kind, team, group="source.toolkit.fluxcd.io"), kind
    for verb in ("get", "create", "update"):
        assert can(kubeconfig, verb, "leases", OPERATOR_NAMESPACE, group="coordination.k8s.io"), verb
    # A Stack with serviceAccountName runs its update with a token of that ServiceAccount.
    assert can(kubeconfig, "create", "serviceaccounts", team, subresource="token",
               name=applied["alpha"]["service_account"])


def test_the_operator_can_do_nothing_more(applied):
    kubeconfig, team = applied["operator_kubeconfig"], applied["alpha"]["namespace"]
    assert not can(kubeconfig, "delete", "namespaces", name=team)
    assert not can(kubeconfig, "create", "namespaces")
    assert not can(kubeconfig, "create", "clusterrolebindings", group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "create", "clusterroles", group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "create", "rolebindings", team, group="rbac.authorization.k8s.io")
    assert not can(kubeconfig, "list", "secrets", team)  # reads the Secrets a Stack names, never lists
    # It writes the Secrets it owns (approval plans, spec.outputsSecret) by name; it never deletes one.
    assert not can(kubeconfig, "delete", "secrets", team)
    assert not can(kubeconfig, "create", "deployments", team, group="apps")
    assert not can(kubeconfig, "create", "pods", team, subresource="exec")
    assert not can(kubeconfig, "patch", "gitrepositories", team, group="source.toolkit.fluxcd.io")
    assert not can(kubeconfig, "delete", "customresourcedefinitions", group="apiextensions.k8s.io")


def test_list_status_says_what_the_apiserver_answers_each_identity(applied, local_platform):
    """The app layer's boundary proof (layers.list_status, the standard library's HTTPS): a team's token is
    answered 200 in its namespace and 403 outside it; the admin's client certificate, 200 anywhere."""
    alpha = applied["alpha_kubeconfig"].read_text()
    assert list_status(alpha, applied["alpha"]["namespace"]) == "200 OK"
    assert list_status(alpha, applied["beta"]["namespace"]) == "403 Forbidden"
    assert list_status(alpha, OPERATOR_NAMESPACE) == "403 Forbidden"
    assert list_status(local_platform.kubeconfig_path.read_text(), applied["beta"]["namespace"]) == "200 OK"
