"""Strata bootstrap: Cluster -> Flux -> Operator -> the platform Stack, all from config.

Only this program reads config; components get typed arguments. See Pulumi.dev.yaml for the keys.
"""

from __future__ import annotations

import json
import os
import sys

import pulumi
import pulumi_kubernetes as k8s

from strata_components.cluster import Cluster, ClusterArgs
from strata_components.flux import Flux, FluxArgs
from strata_components.operator import Operator, OperatorArgs
from strata_components.stack import Stack, StackSpec

PASSPHRASE_SECRET = "strata-pulumi-passphrase"
# The organization of every stack on a file:// (DIY) backend.
DIY_ORGANIZATION = "organization"


def cluster_args(settings: dict) -> ClusterArgs:
    mode = settings.get("mode", "local")
    local = settings.get("local", {})
    existing = settings.get("existing", {})
    args: ClusterArgs = {"mode": mode}
    if mode == "local":
        args["local"] = {"state_dir": local.get("stateDir", "~/.local/state/strata/platform"),
                         "nodes": int(local.get("nodes", 1)),
                         "host_controllers": local.get("hostControllers",
                                                       ["source-controller", "kustomize-controller"])}
    elif mode == "existing":
        args["existing"] = ({"kubeconfig_path": existing["kubeconfigPath"]} if "kubeconfigPath" in existing
                            else {"kubeconfig": existing.get("kubeconfig", "")})
    elif mode == "gke":
        gke = settings.get("gke", {})
        args["gke"] = {"project": gke.get("project", ""), "region": gke.get("region", ""),
                       "node_count": int(gke.get("nodeCount", 1))}
    elif mode == "eks":
        eks = settings.get("eks", {})
        args["eks"] = {"region": eks.get("region", ""), "node_count": int(eks.get("nodeCount", 2))}
        if "subnetIds" in eks:
            args["eks"]["subnet_ids"] = eks["subnetIds"]
    return args


def platform_stack_spec(settings: dict, bootstrap_stack: str, teams: list) -> StackSpec:
    """The Stack that runs programs/platform (layer 1) from git, reading this stack by reference."""
    spec: StackSpec = {
        "stack": settings.get("stack", "organization/strata-platform/dev"),
        "project_repo": settings["repo"], "branch": settings.get("branch", "main"),
        "repo_dir": settings.get("dir", "programs/platform"),
        "config": {"strata-platform:bootstrapStack": bootstrap_stack,
                   "strata-platform:teams": json.dumps(teams)},
        "secrets_ref": {"strata-platform:statePassphrase": {
            "type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}},
        "env_refs": {"PULUMI_CONFIG_PASSPHRASE": {
            "type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}},
        "destroy_on_finalize": True,
    }
    if "backend" in settings:
        spec["backend"] = settings["backend"]
        spec["secrets_provider"] = "passphrase"
    return spec


config = pulumi.Config()
cluster_settings = config.get_object("cluster") or {"mode": "local"}
flux_settings = config.get_object("flux") or {}
operator_settings = config.get_object("operator") or {}
platform_settings = config.get_object("platform")
teams = config.get_object("teams") or []

cluster = Cluster("strata", cluster_args(cluster_settings))
local = cluster_settings.get("mode", "local") == "local"
host_controllers = cluster_args(cluster_settings)["local"]["host_controllers"] if local else []

flux_args: FluxArgs = {"provider": cluster.provider, "version": flux_settings.get("version", "v2.9.5")}
for key in ("components", "baseurl", "namespace"):
    if key in flux_settings:
        flux_args[key] = flux_settings[key]
if local:
    flux_args["host_controllers"] = host_controllers
if "sync" in flux_settings:
    flux_args["sync"] = {"url": flux_settings["sync"]["url"], "branch": flux_settings["sync"].get("branch", "main"),
                         "path": flux_settings["sync"].get("path", "./")}
flux = Flux("flux", flux_args)

operator_namespace = operator_settings.get("namespace", "strata-system")
operator_args: OperatorArgs = {"provider": cluster.provider, "namespace": operator_namespace,
                               "mode": operator_settings.get("mode", "local" if local else "in-cluster")}
for key in ("image", "args"):
    if key in operator_settings:
        operator_args[key] = operator_settings[key]
if operator_args["mode"] == "local":
    operator_args["local"] = {"state_dir": cluster_args(cluster_settings)["local"]["state_dir"] if local
                              else operator_settings.get("stateDir", "~/.local/state/strata/platform"),
                              "server": cluster.server,
                              # The interpreter running this program is the project's virtualenv.
                              "command": [sys.executable, "-m", "strata_operator"]}
operator = Operator("operator", operator_args, pulumi.ResourceOptions(depends_on=[flux]))

if platform_settings:
    bootstrap_stack = f"{pulumi.get_organization() or DIY_ORGANIZATION}/{pulumi.get_project()}/{pulumi.get_stack()}"
    # The platform stack shares this stack's backend and passphrase (it reads this stack by reference).
    passphrase = config.get_secret("statePassphrase") or (
        pulumi.Output.secret(os.environ["PULUMI_CONFIG_PASSPHRASE"]) if "PULUMI_CONFIG_PASSPHRASE" in os.environ
        else None)
    if passphrase is None:
        raise ValueError("strata:platform needs the state passphrase: set PULUMI_CONFIG_PASSPHRASE or "
                         "`pulumi config set --secret statePassphrase ...`")
    kube = pulumi.ResourceOptions(provider=cluster.provider, depends_on=[operator])
    secret = k8s.core.v1.Secret("platform-passphrase", metadata={"name": PASSPHRASE_SECRET,
                                                                 "namespace": operator_namespace},
                                string_data={"passphrase": passphrase}, opts=kube)
    Stack("platform", {"namespace": operator_namespace, "name": "strata-platform",
                       "spec": platform_stack_spec(platform_settings, bootstrap_stack, teams)},
          pulumi.ResourceOptions(provider=cluster.provider, depends_on=[operator, secret]))

pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("server", cluster.server)
pulumi.export("clusterName", cluster.name)
pulumi.export("fluxNamespace", flux.namespace)
pulumi.export("operatorNamespace", operator.namespace)
