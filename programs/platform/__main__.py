"""Layer 1 (platform): one TeamEnvironment per team on the cluster the bootstrap stack made, and per
team a hand-off stack that gives the team its kubeconfig under a passphrase of its own.

Config (set by the bootstrap's platform Stack):
  bootstrapStack   fully qualified name of the bootstrap stack (its kubeconfig/server outputs)
  teams            JSON list of {name, readNamespaces?, repo?, branch?, dir?, stack?}; a team with `repo`
                   or `dir` gets an app Stack running its program under its own identity
  statePassphrase  (secret) the shared state passphrase; each team's passphrase is derived from it
  namespace        the platform Stack's namespace, where the teams' hand-off Stacks run
  backend          state backend of the hand-off and team stacks (default: the operator's)
  projectRepo      git URL of this project (and projectBranch): where a team with only `dir` finds its program
Outputs: teamKubeconfigs / teamTokens / teamPassphrases (secret maps team -> value), teamNamespaces,
teamHandoffStacks (team -> the stack its app stack references).
"""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as k8s

from strata_components.handoff import TeamHandoff, TeamHandoffArgs, build_handoff_program
from strata_components.layers import (HANDOFF_PROJECT, PASSPHRASE_SECRET, ClusterAccess, handoff_stack,
                                     read_cluster_access, team_passphrase)
from strata_components.stack import Program
from strata_components.team import TeamEnvironment, TeamEnvironmentArgs, team_names


def team_args(team: dict, provider: k8s.Provider, server: pulumi.Input[str],
              backend: str | None, project_repo: tuple[str, str] | None) -> TeamEnvironmentArgs:
    """A team runs an app when it names a `repo`, or a `dir` of this project's repository (`project_repo`:
    url, branch)."""
    args: TeamEnvironmentArgs = {"provider": provider, "team": team["name"], "server": server,
                                 "read_namespaces": team.get("readNamespaces", [])}
    source = ((team["repo"], team.get("branch", "main")) if "repo" in team
              else project_repo if "dir" in team else None)
    if "dir" in team and source is None:
        raise ValueError(f"team {team['name']}: `dir` names a program in this project's repository, but the platform "
                         "Stack has no strata-platform:projectRepo; give the team a `repo`")
    if source is not None:
        args["source"] = {"url": source[0], "branch": source[1]}
        # The team's own passphrase: it decrypts the team's hand-off stack and app stack, nothing else.
        passphrase = {"type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}
        args["stack"] = {
            "stack": team.get("stack", f"organization/strata-app-team/{team['name']}"),
            "dir": team.get("dir", "programs/app-team"),
            "config": {"strata-app-team:handoffStack": handoff_stack(team["name"]),
                       "strata-app-team:team": team["name"]},
            "extra": {"env_refs": {"PULUMI_CONFIG_PASSPHRASE": passphrase}, "destroy_on_finalize": True},
        }
        if backend:
            args["stack"]["backend"] = backend
            args["stack"]["secrets_provider"] = "passphrase"
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


def read_settings(config: pulumi.Config) -> PlatformSettings:
    """Every config value this layer reads, and the bootstrap stack by reference (the engine tier runs
    this function on the real engine; the resources below need the kubernetes plugin)."""
    teams = config.get_object("teams") or []
    if isinstance(teams, str):  # Stack config values arrive as strings
        teams = json.loads(teams)
    return PlatformSettings(
        cluster=read_cluster_access(config.require("bootstrapStack")), teams=teams, backend=config.get("backend"),
        project_repo=((config.get("projectRepo"), config.get("projectBranch") or "main")
                      if config.get("projectRepo") else None),
        shared_passphrase=config.require_secret("statePassphrase") if teams else None,
        namespace=config.require("namespace") if teams else None)


def main() -> None:
    settings = read_settings(pulumi.Config())
    provider = k8s.Provider("cluster", kubeconfig=settings.cluster.kubeconfig)
    server = settings.cluster.server
    backend, project_repo = settings.backend, settings.project_repo

    environments: dict[str, TeamEnvironment] = {}
    passphrases: dict[str, pulumi.Output[str]] = {}
    handoffs: dict[str, TeamHandoff] = {}
    if settings.teams:
        # One Program for every hand-off stack: the operator names its project after the object.
        program = Program("team-handoff", {"namespace": settings.namespace, "name": HANDOFF_PROJECT,
                                           "program": build_handoff_program()},
                          pulumi.ResourceOptions(provider=provider))
    for team in settings.teams:
        name = team["name"]
        environment_args = team_args(team, provider, server, backend, project_repo)
        environment = TeamEnvironment(name, environment_args)
        environments[name] = environment
        passphrases[name] = team_passphrase(settings.shared_passphrase, name)
        handoff_args: TeamHandoffArgs = {
            "provider": provider, "team": name, "namespace": settings.namespace,
            "team_namespace": team_names(name)["namespace"], "kubeconfig": environment.kubeconfig,
            "passphrase": passphrases[name], "program": program}
        if backend:
            handoff_args["backend"] = backend
        handoffs[name] = TeamHandoff(f"{name}-handoff", handoff_args,
                                     pulumi.ResourceOptions(depends_on=[environment]))
        # The team's own passphrase, for its app Stacks whoever creates them (this layer from `dir`/`repo`, or Flux).
        k8s.core.v1.Secret(f"{name}-passphrase",
                           metadata={"name": PASSPHRASE_SECRET, "namespace": environment.namespace},
                           string_data={"passphrase": passphrases[name]},
                           opts=pulumi.ResourceOptions(provider=provider, parent=environment))

    pulumi.export("teamKubeconfigs", pulumi.Output.secret({name: env.kubeconfig for name, env in environments.items()}))
    pulumi.export("teamTokens", pulumi.Output.secret({name: env.token for name, env in environments.items()}))
    pulumi.export("teamPassphrases", pulumi.Output.secret(passphrases))
    pulumi.export("teamNamespaces", {name: env.namespace for name, env in environments.items()})
    pulumi.export("teamHandoffStacks", {name: handoff.stack for name, handoff in handoffs.items()})


# The Python host runs this file as __main__; the engine tier imports it to call read_settings and team_args.
if __name__ == "__main__":
    main()
