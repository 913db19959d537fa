"""Strata bootstrap: Cluster -> Flux -> Operator -> the platform Stack -> Flux's sync, all from config.

Only this program reads config; strata_components.bootstrap_config turns it into typed component
args. See Pulumi.dev.yaml for the keys.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from strata_components.bootstrap_config import (BACKEND_CREDENTIAL_KEYS, cluster_args, flux_args, flux_sync_args,
                                                operator_args, platform_stack_spec, project_repo_args,
                                                validate_team_buckets)
from strata_components.cluster import Cluster
from strata_components.flux import Flux, FluxSync
from strata_components.layers import PASSPHRASE_SECRET, this_stack
from strata_components.local.preflight import operator_engine_flags
from strata_components.operator import Operator
from strata_components.project_repo import ProjectRepo
from strata_components.stack import Stack
from strata_components.team_entries import validate_teams

config = pulumi.Config()
platform_settings = config.get_object("platform")
teams = config.get_object("teams") or []
flux_settings = config.get_object("flux") or {}
sync_path = (flux_settings.get("sync") or {}).get("path")

cluster_config = cluster_args(config.get_object("cluster") or {})
cluster = Cluster("strata", cluster_config)
flux = Flux("flux", flux_args(flux_settings, cluster.provider, cluster_config,
                              bundle_url=cluster.flux_bundle_url))
operator_config = operator_args(config.get_object("operator") or {}, cluster.provider, cluster_config,
                                server=cluster.server,
                                # The interpreter running this program is the project's virtualenv; the
                                # operator's updates use the Pulumi CLI, Python host and plugins running it.
                                command=[sys.executable, "-m", "strata_operator", *operator_engine_flags()])
# The operator waits for Flux's CRDs only (it watches Flux sources): its identity, and the platform Stack
# after it, are created while Flux's controllers still come up.
operator = Operator("operator", operator_config, start_after=[flux.crds])

# What the sync must outlive: it comes down first, so the Stacks Flux synced are destroyed by the
# operator while the operator and the team environments they run in are still there.
before_sync: list[pulumi.Resource] = [flux, operator]
project_repo: pulumi.Input[str] | None = None
substitute: dict[str, pulumi.Input[str]] = {}
if platform_settings:
    published = None
    repo_args = project_repo_args(platform_settings, cluster_config, cluster.git_url,
                                  program_dir=str(Path(__file__).resolve().parent))
    # Each team's GitOps directory must be in the repository Flux syncs: a missing one is named here, not
    # found later as a failing Kustomization.
    validate_teams(teams, "strata:teams", repo_args["source_dir"] if repo_args else None, sync_path)
    validate_team_buckets(platform_settings, teams)
    if repo_args is not None:
        # The operator runs programs/platform from git: publish this project to the platform's git server.
        repo = ProjectRepo("project-repo", repo_args)
        published = (repo.url, repo.commit)
    namespace = operator_config["namespace"]
    spec = platform_stack_spec(platform_settings, this_stack(), teams, published, namespace=namespace,
                               sync_path=sync_path, operator_executor=operator_config.get("executor", "process"))
    # The platform stack shares this stack's backend and passphrase (it reads this stack by reference);
    # it derives each team's own passphrase from it and never hands it to a team.
    passphrase = config.get_secret("statePassphrase") or (
        pulumi.Output.secret(os.environ["PULUMI_CONFIG_PASSPHRASE"]) if "PULUMI_CONFIG_PASSPHRASE" in os.environ
        else None)
    if passphrase is None:
        raise ValueError("strata:platform needs the state passphrase: set PULUMI_CONFIG_PASSPHRASE or "
                         "`pulumi config set --secret statePassphrase ...`")
    kube = pulumi.ResourceOptions(provider=cluster.provider, depends_on=[operator])
    secret = k8s.core.v1.Secret("platform-passphrase", metadata={"name": PASSPHRASE_SECRET, "namespace": namespace},
                                string_data={"passphrase": passphrase}, opts=kube)
    platform_needs: list[pulumi.Resource] = [operator, secret]
    if "backendSecret" in platform_settings:
        # The object store's credentials, the ones this program's own CLI uses for the s3:// backend (its
        # environment), in a Secret only the platform Stack references.
        missing = [key for key in BACKEND_CREDENTIAL_KEYS if not os.environ.get(key)]
        if missing:
            raise ValueError(f"strata:platform.backendSecret needs the object store's credentials in {', '.join(missing)} "
                             "(the environment `pulumi up` runs with, as for the s3:// backend itself)")
        platform_needs.append(k8s.core.v1.Secret(
            "platform-backend-credentials", metadata={"name": platform_settings["backendSecret"], "namespace": namespace},
            string_data={key: pulumi.Output.secret(os.environ[key]) for key in BACKEND_CREDENTIAL_KEYS}, opts=kube))
    platform_stack = Stack("platform", {"namespace": namespace, "name": "strata-platform", "spec": spec},
                           pulumi.ResourceOptions(provider=cluster.provider, depends_on=platform_needs))
    before_sync.append(platform_stack)
    project_repo = spec["project_repo"]
    # What differs per cluster stays out of the synced manifests: Flux fills it in.
    substitute = {"STRATA_PROJECT_REPO": spec["project_repo"],
                  "STRATA_PROJECT_BRANCH": platform_settings.get("branch", "main")}
    if "backend" in spec:
        substitute["STRATA_BACKEND"] = spec["backend"]

sync_args = flux_sync_args(flux_settings, cluster.provider, project_repo, substitute)
if sync_args is not None:
    FluxSync("flux-sync", sync_args, pulumi.ResourceOptions(depends_on=before_sync))

pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("server", cluster.server)
pulumi.export("clusterName", cluster.name)
pulumi.export("fluxNamespace", flux.namespace)
pulumi.export("operatorNamespace", operator.namespace)
