"""Layer 1 (platform): one TeamEnvironment per team on the cluster the bootstrap stack made.

Config (set by the bootstrap's platform Stack):
  bootstrapStack   fully qualified name of the bootstrap stack (its kubeconfig/server outputs)
  teams            JSON list of {name, readNamespaces?, repo?, branch?, dir?, stack?}
  statePassphrase  (secret) passphrase of the shared file backend, handed to each team's Stack
Outputs: teamKubeconfigs / teamTokens (secret maps team -> value), teamNamespaces.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_kubernetes as k8s

from strata_components.layers import PASSPHRASE_SECRET, read_cluster_access, this_stack
from strata_components.team import TeamEnvironment, TeamEnvironmentArgs


def team_args(team: dict, provider: k8s.Provider, server: pulumi.Input[str], platform_stack: str,
              backend: str | None) -> TeamEnvironmentArgs:
    args: TeamEnvironmentArgs = {"provider": provider, "team": team["name"], "server": server,
                                 "read_namespaces": team.get("readNamespaces", [])}
    if "repo" in team:
        args["source"] = {"url": team["repo"], "branch": team.get("branch", "main")}
        passphrase = {"type": "Secret", "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"}}
        args["stack"] = {
            "stack": team.get("stack", f"organization/strata-app-team/{team['name']}"),
            "dir": team.get("dir", "programs/app-team"),
            "config": {"strata-app-team:platformStack": platform_stack, "strata-app-team:team": team["name"]},
            "extra": {"env_refs": {"PULUMI_CONFIG_PASSPHRASE": passphrase}, "destroy_on_finalize": True},
        }
        if backend:
            args["stack"]["backend"] = backend
            args["stack"]["secrets_provider"] = "passphrase"
    return args


config = pulumi.Config()
cluster = read_cluster_access(config.require("bootstrapStack"))
teams = config.get_object("teams") or []
if isinstance(teams, str):  # Stack config values arrive as strings
    teams = json.loads(teams)
provider = k8s.Provider("cluster", kubeconfig=cluster.kubeconfig)
server = cluster.server
platform_stack = this_stack()
backend = config.get("backend")
passphrase = config.get_secret("statePassphrase")

environments = {}
for team in teams:
    environment = TeamEnvironment(team["name"], team_args(team, provider, server, platform_stack, backend))
    environments[team["name"]] = environment
    if passphrase is not None and "repo" in team:
        k8s.core.v1.Secret(f"{team['name']}-passphrase",
                           metadata={"name": PASSPHRASE_SECRET, "namespace": environment.namespace},
                           string_data={"passphrase": passphrase},
                           opts=pulumi.ResourceOptions(provider=provider, parent=environment))

pulumi.export("teamKubeconfigs", pulumi.Output.secret({name: env.kubeconfig for name, env in environments.items()}))
pulumi.export("teamTokens", pulumi.Output.secret({name: env.token for name, env in environments.items()}))
pulumi.export("teamNamespaces", {name: env.namespace for name, env in environments.items()})
