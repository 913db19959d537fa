"""Flux: CRDs applied before everything else, host-run controllers lose their Deployment, optional sync."""

from __future__ import annotations

import pulumi_kubernetes as k8s
import pytest
import pulumi
import yaml
from strata_mocks import FLUX_INSTALL

from strata_components.flux import Flux, build_flux_manifests, build_sync_manifests, validate_flux_args


def _provider():
    return k8s.Provider("k8s", kubeconfig="apiVersion: v1\nkind: Config\n")


def test_install_splits_crds_from_the_rest_and_orders_them(harness):
    def program():
        flux = Flux("flux", {"provider": _provider(), "version": "v2.9.5", "baseurl": "http://127.0.0.1:8099"})
        return {"namespace": flux.namespace, "host_run": flux.host_run}

    out = harness.run(program)
    assert out["namespace"].value == "flux-system" and out["host_run"].value == []
    component = harness.one("strata:index:Flux")
    crds = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-crds")
    install = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-install")
    assert crds.parent == component.urn and install.parent == component.urn
    assert crds.urn in install.dependencies
    assert {o["kind"] for o in crds.inputs["objs"]} == {"CustomResourceDefinition"}
    assert "CustomResourceDefinition" not in {o["kind"] for o in install.inputs["objs"]}
    deployments = [o["metadata"]["name"] for o in install.inputs["objs"] if o["kind"] == "Deployment"]
    assert deployments == ["source-controller", "kustomize-controller"]
    provider = harness.one("pulumi:providers:kubernetes")
    assert harness.provider_urn(crds.provider) == provider.urn == harness.provider_urn(install.provider)
    invoke = next(call for call in harness.mocks.calls if call.token.startswith("flux:index/getFluxInstall"))
    assert invoke.args["version"] == "v2.9.5" and invoke.args["baseurl"] == "http://127.0.0.1:8099"
    assert invoke.args["components"] == ["source-controller", "kustomize-controller", "helm-controller",
                                         "notification-controller"]


def test_an_air_gapped_install_pulls_the_controllers_from_the_registry_with_the_pull_secret(harness):
    def program():
        Flux("flux", {"provider": _provider(), "version": "v2.9.5", "registry": "10.88.0.1:5000/fluxcd",
                      "image_pull_secret": "regcred"})
        return {}

    harness.run(program)
    invoke = next(call for call in harness.mocks.calls if call.token.startswith("flux:index/getFluxInstall"))
    assert invoke.args["registry"] == "10.88.0.1:5000/fluxcd" and invoke.args["imagePullSecrets"] == "regcred"
    validate_flux_args({"version": "v2.9.5", "registry": "registry.internal/fluxcd"})  # no port is fine


def test_local_mode_runs_controllers_on_the_host_not_as_deployments(harness):
    def program():
        flux = Flux("flux", {"provider": _provider(), "version": "v2.9.5",
                             "components": ["source-controller", "kustomize-controller"],
                             "host_controllers": ["source-controller", "kustomize-controller"]})
        return {"host_run": flux.host_run}

    out = harness.run(program)
    assert sorted(out["host_run"].value) == ["kustomize-controller", "source-controller"]
    install = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-install")
    kinds = [o["kind"] for o in install.inputs["objs"]]
    assert "Deployment" not in kinds
    # Nor the Services selecting their pods: pulumi-kubernetes would wait for an endpoint that never
    # comes (10 minutes, then the install fails). NetworkPolicies select nothing that waits.
    assert "Service" not in kinds and "NetworkPolicy" in kinds
    # Identities and RBAC stay: host controllers can be pointed at their ServiceAccounts.
    assert kinds.count("ServiceAccount") == 2 and "ClusterRoleBinding" in kinds


def test_sync_comes_after_the_controllers(harness):
    def program():
        Flux("flux", {"provider": _provider(), "version": "v2.9.5",
                      "sync": {"url": "http://127.0.0.1:9418/fleet.git", "branch": "main", "path": "clusters/dev"}})

    harness.run(program)
    install = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-install")
    component = harness.one("strata:index:FluxSync", "flux-sync")
    assert install.urn in component.dependencies and component.parent == harness.one("strata:index:Flux").urn
    sync = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-sync")
    assert sync.parent == component.urn
    assert [o["kind"] for o in sync.inputs["objs"]] == ["GitRepository", "Kustomization"]
    assert "secretRef" not in sync.inputs["objs"][0]["spec"]  # no credentials given, none referenced
    spec = sync.inputs["objs"][1]["spec"]
    assert "postBuild" not in spec
    # What it synced is pruned, waited for, and on deletion waited out (Stacks get destroyed first).
    assert (spec["prune"], spec["wait"], spec["deletionPolicy"], spec["timeout"]) == (
        True, True, "WaitForTermination", "5m")
    call = next(c for c in harness.mocks.calls if c.token.startswith("flux:index/getFluxSync"))
    assert call.args["url"] == "http://127.0.0.1:9418/fleet.git" and call.args["targetPath"] == "clusters/dev"


def test_sync_fills_per_cluster_values_into_the_manifests(harness):
    def program():
        Flux("flux", {"provider": _provider(), "version": "v2.9.5",
                      "sync": {"url": "http://127.0.0.1:9418/fleet.git", "path": "clusters/dev",
                               "substitute": {"STRATA_BACKEND": pulumi.Output.from_input("file:///state")}}})

    harness.run(program)
    kustomization = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-sync").inputs["objs"][1]
    assert kustomization["spec"]["postBuild"] == {"substitute": {"STRATA_BACKEND": "file:///state"}}


def test_build_flux_manifests_keeps_every_document_exactly_once():
    manifests = build_flux_manifests(FLUX_INSTALL, host_controllers=["source-controller"])
    names = [(o["kind"], o["metadata"]["name"]) for o in manifests.crds + manifests.resources]
    documents = [d for d in yaml.safe_load_all(FLUX_INSTALL) if d]
    assert len(names) == len(set(names)) == len(documents) - 2
    assert ("Deployment", "source-controller") not in names and ("Deployment", "kustomize-controller") in names
    assert ("Service", "source-controller") not in names
    assert manifests.host_run == ["source-controller"] and manifests.host_services == ["source-controller"]
    # Without host controllers every Service stays (in-cluster controllers back them).
    everything = build_flux_manifests(FLUX_INSTALL)
    assert ("Service", "source-controller") in [(o["kind"], o["metadata"]["name"]) for o in everything.resources]
    # Their Deployments' rollouts are awaited; the Services wait for their IPs only, not the provider's 10 s settle.
    services = [o for o in everything.resources if o["kind"] == "Service"]
    assert services and all(o["metadata"]["annotations"]["pulumi.com/waitFor"] == "jsonpath={.spec.clusterIP}"
                            for o in services)
    assert everything.host_services == []
    with pytest.raises(ValueError, match="no CustomResourceDefinitions"):
        build_flux_manifests("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")


@pytest.mark.parametrize("args, message", [
    ({"version": "2.9.5"}, "leading v"),
    ({"version": "latest"}, "leading v"),
    ({"version": "v2.9.5", "components": ["image-reflector-controller2"]}, "unknown"),
    ({"version": "v2.9.5", "host_controllers": ["source-controller"]}, "kwok"),
    ({"version": "v2.9.5", "components": ["source-controller"], "host_controllers": ["source-controller"],
      "multi_tenancy": False}, "always run locked down"),
    ({"version": "v2.9.5", "registry": "http://10.88.0.1:5000/fluxcd"}, "flux registry .* without a scheme"),
    ({"version": "v2.9.5", "registry": "10.88.0.1:5000/fluxcd/"}, "flux registry .* trailing"),
])
def test_bad_flux_args_are_rejected_with_the_field(args, message):
    with pytest.raises(ValueError, match=message):
        validate_flux_args(args)


def test_sync_keeps_the_git_credentials_only_when_given():
    rendered = yaml.safe_dump_all([
        {"kind": "GitRepository", "spec": {"url": "https://git/x.git", "secretRef": {"name": "flux-system"}}},
        {"kind": "Kustomization", "spec": {"path": "./"}}])
    assert "secretRef" not in build_sync_manifests(rendered)[0]["spec"]
    assert build_sync_manifests(rendered, secret_name="flux-system")[0]["spec"]["secretRef"] == {"name": "flux-system"}


def test_the_controllers_run_locked_down_for_multi_tenancy_unless_told_not_to():
    def args_of(manifests, name):
        deployment = next(o for o in manifests.resources if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
        return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager")["args"]

    locked = build_flux_manifests(FLUX_INSTALL)
    kustomize = args_of(locked, "kustomize-controller")
    assert {"--no-cross-namespace-refs=true", "--no-remote-bases=true", "--default-service-account=default"} <= set(
        kustomize)
    assert "--watch-all-namespaces=true" in kustomize  # the install's own flags stay
    assert not {a for a in args_of(locked, "source-controller") if "cross-namespace" in a or "service-account" in a}
    open_ = build_flux_manifests(FLUX_INSTALL, multi_tenancy=False)
    assert not [a for a in args_of(open_, "kustomize-controller") if "cross-namespace" in a]


def test_the_cluster_wide_sync_runs_as_kustomize_controller_not_as_the_default_service_account():
    rendered = yaml.safe_dump_all([{"kind": "GitRepository", "spec": {"url": "https://git/x.git"}},
                                   {"kind": "Kustomization", "spec": {"path": "./"}}])
    assert build_sync_manifests(rendered)[1]["spec"]["serviceAccountName"] == "kustomize-controller"


def test_the_controllers_are_placed_on_the_nodes_selected_and_tolerate_their_taint():
    """A cluster whose system pool is tainted (the cluster profile's real nodes): every controller's pod says so."""
    toleration = {"key": "strata.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    placed = build_flux_manifests(FLUX_INSTALL, node_selector={"type": "real"}, tolerations=[toleration])
    deployments = [d for d in placed.resources if d["kind"] == "Deployment"]
    assert deployments
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["type"] == "real"
        assert pod["tolerations"][-1] == toleration
    anywhere = build_flux_manifests(FLUX_INSTALL)
    assert all("tolerations" not in d["spec"]["template"]["spec"] for d in anywhere.resources if d["kind"] == "Deployment")
