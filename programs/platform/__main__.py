"""Layer 1 (platform): one TeamEnvironment per team on the cluster the bootstrap stack made, and per
team a hand-off stack that gives the team its kubeconfig under a passphrase of its own.

Config (set by the bootstrap's platform Stack):
  bootstrapStack   fully qualified name of the bootstrap stack (its kubeconfig/server outputs)
  teams            JSON list of {name, namespace?, readNamespaces?, repo?, branch?, dir?, stack?, path?}; a
                   team with `repo` or `dir` gets an app Stack running its program under its own identity,
                   and a team whose `path` (default: `<syncPath>/team-<name>` of this project) is synced
                   gets a Flux Kustomization applying it as the team
  statePassphrase  (secret) the shared state passphrase; each team's passphrase is derived from it
  namespace        the platform Stack's namespace, where the teams' hand-off Stacks run
  backend          the platform's state backend; each team's state goes under it, in `teams/<name>`
  projectRepo      git URL of this project (and projectBranch): where a team with only `dir` finds its program
  syncPath         the directory of this project Flux syncs for the platform; each team's is under it
Environment: with an s3:// backend at an S3-compatible endpoint, the object store's credentials
(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the platform Stack's envRefs) give each team a bucket of its
own, `<bucket>-team-<name>`, and credentials that reach only it (strata_components.team_state); without
them a team's state is `teams/<name>` under the platform's backend.
Outputs: teamKubeconfigs / teamTokens / teamPassphrases (secret maps team -> value), teamNamespaces,
teamHandoffStacks (team -> the stack its app stack references), teamBackends (team -> its state backend).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

import pulumi
import pulumi_kubernetes as k8s

from strata_components import s3
from strata_components.handoff import TeamHandoff, TeamHandoffArgs, build_handoff_program
from strata_components.layers import (HANDOFF_PROJECT, PASSPHRASE_SECRET, ClusterAccess, handoff_stack,
                                     read_cluster_access, team_backend, team_passphrase)
from strata_components.stack import Program
from strata_components.team import TeamEnvironment, TeamEnvironmentArgs, TeamOperatorArgs, TeamStateArgs
from strata_components.team_state import STATE_CREDENTIALS_SECRET, credential_env_refs
from strata_components.team_entries import team_names, team_sync_path, validate_teams


def team_state(team: dict, field: str, backend: str | None,
               store_credentials: pulumi.Input[dict[str, str]] | None) -> TeamStateArgs | None:
    """A bucket of the team's own (`field` names its entry in errors), when the platform's backend is an
    s3:// bucket at an S3-compatible endpoint and the object store's credentials are here to mint the
    team's; else None (the team's state is a prefix of the platform's backend)."""
    endpoint = s3.backend_endpoint(backend) if backend and backend.startswith("s3://") else None
    if endpoint is None or store_credentials is None:
        return None
    return {"endpoint": endpoint, "bucket": s3.team_bucket(s3.backend_bucket(backend), team["name"], field),
            "store_credentials": store_credentials}


def team_args(team: dict, provider: k8s.Provider, server: pulumi.Input[str], backend: str | None,
              project_repo: tuple[str, str] | None, sync_path: str | None = None,
              state_args: TeamStateArgs | None = None,
              operator: TeamOperatorArgs | None = None) -> TeamEnvironmentArgs:
    """A team runs an app when it names a `repo`, or a `dir` of this project's repository (`project_repo`:
    url, branch); its GitOps is `path` of its source (default: `<sync_path>/team-<name>` of this project),
    applied as the team, with its own state backend filled in: its bucket (`state_args`, with credentials
    for it alone), else `teams/<name>` under `backend`. `operator` serves the team's Stacks."""
    name = team["name"]
    args: TeamEnvironmentArgs = {"provider": provider, "team": name, "server": server,
                                 "read_namespaces": team.get("readNamespaces", []), "operator": operator or {}}
    if "namespace" in team:
        args["namespace"] = team["namespace"]
    if "dir" in team and "repo" not in team and project_repo is None:
        raise ValueError(f"team {name}: `dir` names a program in this project's repository, but the platform "
                         "Stack has no strata-platform:projectRepo; give the team a `repo`")
    source = (team["repo"], team.get("branch", "main")) if "repo" in team else project_repo
    if state_args is not None:
        args["state"] = state_args
        state = s3.with_bucket(backend, state_args["bucket"])
    else:
        state = team_backend(backend, name) if backend else None
    if state and state.startswith("file://"):
        # The only directory of the operator's host its programs may write (the process executor's sandbox).
        args["file_backend"] = state
    runs_app = "repo" in team or "dir" in team
    path = team_sync_path(team, sync_path)
    if source is not None and (runs_app or path):
        args["source"] = {"url": source[0], "branch": source[1]}
    if runs_app:
        # The team's own passphrase: it decrypts the team's hand-off stack and app stack, nothing else.
        env_refs = {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret",
                                                 "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}}
        if state_args is not None:
            env_refs.update(credential_env_refs(STATE_CREDENTIALS_SECRET))
        args["stack"] = {
            "stack": team.get("stack", f"organization/strata-app-team/{name}"),
            "dir": team.get("dir", "programs/app-team"),
            "config": {"strata-app-team:handoffStack": handoff_stack(name),
                       "strata-app-team:team": name},
            "extra": {"env_refs": env_refs, "destroy_on_finalize": True},
        }
        if state:
            args["stack"]["backend"] = state
            args["stack"]["secrets_provider"] = "passphrase"
    if path and "source" in args:
        # What differs per cluster stays out of the team's manifests: Flux fills it in, the team's own backend.
        substitute: dict[str, pulumi.Input[str]] = {}
        if project_repo is not None:
            substitute.update(STRATA_PROJECT_REPO=project_repo[0], STRATA_PROJECT_BRANCH=project_repo[1])
        if state:
            substitute["STRATA_BACKEND"] = state
        args["sync"] = {"path": path, "substitute": substitute}
    return args


@dataclasses.dataclass(frozen=True)
class PlatformSettings:
    """This layer's config, read: what the bootstrap's platform Stack set, and the bootstrap stack's outputs."""

    cluster: ClusterAccess
    teams: list[dict]
    backend: str | None
    project_repo: tuple[str, str] | None
    shared_passphrase: pulumi.Output[str] | None
    """The shared state passphrase (secret); only needed, and required, when there are teams."""
    namespace: str | None
    sync_path: str | None
    """The directory of this project Flux syncs for the platform; each team's directory is under it."""
    store_credentials: pulumi.Output[dict[str, str]] | None
    """The object store's credentials (secret) from this update's environment, when there are any."""
    operator_executor: str
    """The operator's executor ("process" or "pod"): what it is given in each team's namespace."""


def read_settings(config: pulumi.Config) -> PlatformSettings:
    """Every config value this layer reads, and the bootstrap stack by reference (the engine tier runs
    this function on the real engine; the resources below need the kubernetes plugin)."""
    teams = config.get_object("teams") or []
    if isinstance(teams, str):  # Stack config values arrive as strings
        teams = json.loads(teams)
    validate_teams(teams, "strata-platform:teams")
    return PlatformSettings(
        cluster=read_cluster_access(config.require("bootstrapStack")), teams=teams, backend=config.get("backend"),
        project_repo=((config.get("projectRepo"), config.get("projectBranch") or "main")
                      if config.get("projectRepo") else None),
        shared_passphrase=config.require_secret("statePassphrase") if teams else None,
        namespace=config.require("namespace") if teams else None, sync_path=config.get("syncPath"),
        store_credentials=read_store_credentials(os.environ),
        operator_executor=config.get("operatorExecutor") or "process")


def read_store_credentials(environ: Mapping[str, str]) -> pulumi.Output[dict[str, str]] | None:
    """The object store's credentials the platform Stack's envRefs put in its environment, kept secret."""
    keys = s3.BACKEND_CREDENTIAL_KEYS
    if not all(environ.get(key) for key in keys):
        return None
    access_key_id, secret_access_key = (environ[key] for key in keys)
    return pulumi.Output.secret({"access_key_id": access_key_id, "secret_access_key": secret_access_key})


def main() -> None:
    settings = read_settings(pulumi.Config())
    provider = k8s.Provider("cluster", kubeconfig=settings.cluster.kubeconfig)
    server = settings.cluster.server
    backend, project_repo = settings.backend, settings.project_repo

    environments: dict[str, TeamEnvironment] = {}
    passphrases: dict[str, pulumi.Output[str]] = {}
    handoffs: dict[str, TeamHandoff] = {}
    backends: dict[str, str] = {}
    if settings.teams:
        # One Program for every hand-off stack: the operator names its project after the object.
        program = Program("team-handoff", {"namespace": settings.namespace, "name": HANDOFF_PROJECT,
                                           "program": build_handoff_program()},
                          pulumi.ResourceOptions(provider=provider))
    for index, team in enumerate(settings.teams):
        name = team["name"]
        passphrases[name] = team_passphrase(settings.shared_passphrase, name)
        state_args = team_state(team, f"strata-platform:teams[{index}] ({name})", backend, settings.store_credentials)
        # The team's own passphrase, for its app Stacks whoever creates them (this layer from `dir`/`repo`, or Flux).
        # The operator runs in the platform's namespace, where this Stack and the hand-off Stacks are.
        operator: TeamOperatorArgs = {"namespace": settings.namespace, "executor": settings.operator_executor}
        environment = TeamEnvironment(name, {**team_args(team, provider, server, backend, project_repo,
                                                         settings.sync_path, state_args, operator),
                                             "passphrase": passphrases[name]})
        environments[name] = environment
        handoff_args: TeamHandoffArgs = {
            "provider": provider, "team": name, "namespace": settings.namespace,
            "team_namespace": team_names(name, team.get("namespace"))["namespace"],
            "kubeconfig": environment.kubeconfig, "passphrase": passphrases[name], "program": program}
        if backend:
            # In the team's backend, beside its app stacks, which read it by reference.
            backends[name] = s3.with_bucket(backend, state_args["bucket"]) if state_args else team_backend(backend, name)
            handoff_args["backend"] = backends[name]
        if environment.state_credentials is not None:
            handoff_args["state_credentials"] = environment.state_credentials
        handoffs[name] = TeamHandoff(f"{name}-handoff", handoff_args,
                                     pulumi.ResourceOptions(depends_on=[environment]))

    pulumi.export("teamKubeconfigs", pulumi.Output.secret({name: env.kubeconfig for name, env in environments.items()}))
    pulumi.export("teamTokens", pulumi.Output.secret({name: env.token for name, env in environments.items()}))
    pulumi.export("teamPassphrases", pulumi.Output.secret(passphrases))
    pulumi.export("teamNamespaces", {name: env.namespace for name, env in environments.items()})
    pulumi.export("teamHandoffStacks", {name: handoff.stack for name, handoff in handoffs.items()})
    if backend:
        pulumi.export("teamBackends", backends)


# The Python host runs this file as __main__; the engine tier imports it to call read_settings and team_args.
if __name__ == "__main__":
    main()
