"""The bootstrap program's config (the `strata:*` keys of Pulumi.<stack>.yaml) turned into typed component args.

The program reads `pulumi.Config` and passes the plain values here; these functions never read
config themselves, so they are tested with real stack config through the engine and alone.
Config keys are camelCase as written in the stack file; args are the components' snake_case.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from .cluster import DEFAULT_HOST_CONTROLLERS, ClusterArgs
from .flux import FluxArgs, FluxSyncComponentArgs
from . import s3
from .s3 import BACKEND_CREDENTIAL_KEYS
from .layers import PASSPHRASE_SECRET
from .operator import OperatorArgs
from .project_repo import ProjectRepoArgs
from .stack import StackSpec

DEFAULT_STATE_DIR = "~/.local/state/strata/platform"
DEFAULT_FLUX_VERSION = "v2.9.5"


def cluster_args(settings: dict[str, Any]) -> ClusterArgs:
    """`strata:cluster` -> ClusterArgs (mode local by default)."""
    mode = settings.get("mode", "local")
    args: ClusterArgs = {"mode": mode}
    if mode == "local":
        local = settings.get("local", {})
        args["local"] = {"state_dir": local.get("stateDir", DEFAULT_STATE_DIR), "nodes": int(local.get("nodes", 1)),
                         "host_controllers": list(local.get("hostControllers", DEFAULT_HOST_CONTROLLERS))}
        if "realNodes" in local:
            args["local"]["real_nodes"] = int(local["realNodes"])
    elif mode == "existing":
        existing = settings.get("existing", {})
        args["existing"] = ({"kubeconfig_path": existing["kubeconfigPath"]} if "kubeconfigPath" in existing
                            else {"kubeconfig": existing.get("kubeconfig", "")})
        if "context" in existing:
            args["existing"]["context"] = existing["context"]
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


def flux_args(settings: dict[str, Any], provider: k8s.Provider, cluster: ClusterArgs,
              bundle_url: pulumi.Input[str] | None = None) -> FluxArgs:
    """`strata:flux` -> FluxArgs. In local mode the platform's host controllers are left out of the
    install and, unless `baseurl` is configured, the bundle comes from the platform (`bundle_url`)."""
    args: FluxArgs = {"provider": provider, "version": settings.get("version", DEFAULT_FLUX_VERSION)}
    for key in ("components", "namespace", "registry"):
        if key in settings:
            args[key] = settings[key]
    if "imagePullSecret" in settings:
        args["image_pull_secret"] = settings["imagePullSecret"]
    if "nodeSelector" in settings:
        args["node_selector"] = dict(settings["nodeSelector"])
    if "tolerations" in settings:
        args["tolerations"] = list(settings["tolerations"])
    baseurl = settings.get("baseurl", bundle_url)
    if baseurl is not None:
        args["baseurl"] = baseurl
    if cluster["mode"] == "local":
        args["host_controllers"] = cluster["local"]["host_controllers"]
    return args


def flux_sync_args(settings: dict[str, Any], provider: k8s.Provider, project_repo: pulumi.Input[str] | None,
                   substitute: dict[str, pulumi.Input[str]]) -> FluxSyncComponentArgs | None:
    """`strata:flux.sync` -> what Flux syncs after the bootstrap: `path` of `url` (default: this project's
    repository, `project_repo`, as the platform Stack gets it), with `substitute` filled into the
    manifests. None without `sync`."""
    sync = settings.get("sync")
    if sync is None:
        return None
    url = sync.get("url", project_repo)
    if url is None:
        raise ValueError("strata:flux.sync needs `url` (the git repository Flux syncs from) unless the local "
                         "platform publishes this project (local cluster mode with strata:platform)")
    return {"provider": provider, "url": url, "branch": sync.get("branch", "main"), "path": sync.get("path", "./"),
            "namespace": settings.get("namespace", "flux-system"), "substitute": substitute}


def operator_args(settings: dict[str, Any], provider: k8s.Provider, cluster: ClusterArgs,
                  server: pulumi.Input[str], command: Sequence[str]) -> OperatorArgs:
    """`strata:operator` -> OperatorArgs: a host process of the local platform (running `command`)
    in local cluster mode unless `mode` says otherwise, a Deployment elsewhere."""
    local_cluster = cluster["mode"] == "local"
    args: OperatorArgs = {"provider": provider, "namespace": settings.get("namespace", "strata-system"),
                          "mode": settings.get("mode", "local" if local_cluster else "in-cluster")}
    for key in ("image", "args", "replicas", "shards", "executor"):
        if key in settings:
            args[key] = settings[key]
    for key, arg in (("imagePullPolicy", "image_pull_policy"), ("nodeSelector", "node_selector"),
                     ("tolerations", "tolerations"), ("workspaceImage", "workspace_image"),
                     ("workspaceNodeSelector", "workspace_node_selector"),
                     ("workspaceTolerations", "workspace_tolerations")):
        if key in settings:
            args[arg] = settings[key]
    if args["mode"] == "local":
        state_dir = cluster["local"]["state_dir"] if local_cluster else settings.get("stateDir", DEFAULT_STATE_DIR)
        args["local"] = {"state_dir": state_dir, "server": server, "command": list(command)}
    return args


def project_repo_args(settings: dict[str, Any], cluster: ClusterArgs, git_url: pulumi.Input[str] | None,
                      program_dir: str) -> ProjectRepoArgs | None:
    """`strata:platform` -> what to publish to the local platform's git server (at `git_url`) for the
    platform Stack: the project at `sourceDir` (default: the bootstrap program's directory). None when
    `repo` is configured or the cluster is not local (the Stack then needs `repo`)."""
    if "repo" in settings or cluster["mode"] != "local" or git_url is None:
        return None
    return {"state_dir": cluster["local"]["state_dir"], "git_url": git_url,
            "source_dir": settings.get("sourceDir", program_dir)}


def resolve_backend_url(url: str) -> str:
    """A file:// backend URL with `~` expanded here, where it means the user running the bootstrap.

    The operator runs each Stack's update with HOME set to that Stack's own directory, so a `~` left
    in `spec.backend` would name another, empty backend there: the platform stack would not find
    the bootstrap stack it references. Other URLs are returned unchanged."""
    prefix = "file://"
    if url.startswith(prefix + "~"):
        return prefix + os.path.expanduser(url[len(prefix):])
    return url


def backend_credentials_env_refs(secret_name: str) -> dict[str, Any]:
    """The envRefs that hand a Stack's updates the object store's credentials from the Secret `secret_name`
    of its namespace (never their values: the Stack names the Secret, the kubelet or operator reads it)."""
    return {key: {"type": "Secret", "secret": {"name": secret_name, "key": key}} for key in BACKEND_CREDENTIAL_KEYS}


def validate_team_buckets(settings: dict[str, Any], teams: list[dict[str, Any]]) -> None:
    """With the object store's credentials for the platform (`backendSecret`, an s3:// backend at an
    S3-compatible endpoint) the platform layer gives each team a bucket named after it: a team name that
    makes a bucket name S3 refuses is an error here, naming the entry (strata:teams[i]), not later in the
    platform Stack."""
    backend = settings.get("backend", "")
    if "backendSecret" not in settings or not backend.startswith("s3://") or not s3.backend_endpoint(backend):
        return
    for index, team in enumerate(teams):
        s3.team_bucket(s3.backend_bucket(backend), team["name"], f"strata:teams[{index}] ({team['name']})")


def platform_stack_spec(settings: dict[str, Any], bootstrap_stack: str, teams: list[dict[str, Any]],
                        published: tuple[pulumi.Input[str], pulumi.Input[str]] | None = None,
                        namespace: str | None = None, sync_path: str | None = None,
                        operator_executor: str = "process") -> StackSpec:
    """`strata:platform` -> the Stack running programs/platform (layer 1), which reads `bootstrap_stack`
    by reference. Its git source is `repo` + `branch` when configured, else `published` (url, commit).
    `namespace` is the platform Stack's own (the operator's), where it puts the teams' hand-off Stacks;
    `sync_path` the directory of this project Flux syncs, under which each team's own is (`team-<name>`);
    `operator_executor` what the operator is given in each team's namespace."""
    spec: StackSpec = {
        "stack": settings.get("stack", "organization/strata-platform/dev"),
        "repo_dir": settings.get("dir", "programs/platform"),
        "config": {"strata-platform:bootstrapStack": bootstrap_stack,
                   "strata-platform:teams": json.dumps(teams)},
        "secrets_ref": {"strata-platform:statePassphrase": {
            "type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}},
        "env_refs": {"PULUMI_CONFIG_PASSPHRASE": {
            "type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}},
        "destroy_on_finalize": True,
    }
    if namespace:
        spec["config"]["strata-platform:namespace"] = namespace
    if operator_executor != "process":
        spec["config"]["strata-platform:operatorExecutor"] = operator_executor
    if sync_path:
        spec["config"]["strata-platform:syncPath"] = sync_path.strip("/").removeprefix("./")
    if "repo" in settings:
        spec["project_repo"] = settings["repo"]
        spec["branch"] = settings.get("branch", "main")
    elif published is not None:
        spec["project_repo"], spec["commit"] = published
    else:
        raise ValueError("strata:platform.repo is required outside local cluster mode: set it to the git URL of "
                         "this repository (local mode publishes it to the platform's git server instead)")
    # Teams with a program `dir` and no `repo` of their own run it from this project's repository.
    spec["config"]["strata-platform:projectRepo"] = spec["project_repo"]
    spec["config"]["strata-platform:projectBranch"] = settings.get("branch", "main")
    if "backendSecret" in settings:
        # An object-store backend: its credentials from that Secret, beside the passphrase.
        spec["env_refs"].update(backend_credentials_env_refs(settings["backendSecret"]))
        # With them the platform mints each team's state credentials, re-minted at half their lifetime (30
        # days) by a platform run: one a day, whether or not its commit changed.
        spec["continue_resync_on_commit_match"] = True
        spec["resync_frequency_seconds"] = 86400
    if "backend" in settings:
        backend = resolve_backend_url(settings["backend"])
        spec["backend"] = backend
        spec["config"]["strata-platform:backend"] = backend
        spec["secrets_provider"] = "passphrase"
    return spec
