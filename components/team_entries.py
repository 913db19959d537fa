"""The teams of a stack's config (`strata:teams`, and the platform layer's `teams`): each entry validated,
its objects' names and the annotation naming the stack that made them, and the directory of git its sync
applies. Pure and light (no Pulumi import): `strata dev up` and `strata console` read them too.
"""

import re
from pathlib import Path
from typing import Any


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The fully qualified name of the stack whose program created a team's sync objects: the console draws
# the edge from the Stack running that stack (the platform's) to them, which no Flux label records.
CREATED_BY_STACK = "strata.dev/created-by-stack"


def team_names(team: str, namespace: str | None = None) -> dict[str, str]:
    """Object names of a team environment."""
    if not DNS_LABEL.match(team) or len(team) > 50:
        raise ValueError(f"team name {team!r} must be a DNS label of at most 50 characters (a-z, 0-9, -)")
    return {"namespace": namespace or f"team-{team}", "service_account": f"team-{team}",
            "token_secret": f"team-{team}-token", "role": f"team-{team}", "viewer_role": f"team-{team}-viewer"}


TEAM_KEYS = {"name", "namespace", "readNamespaces", "repo", "branch", "dir", "stack", "path"}


def validate_teams(teams: Any, field: str, project_dir: str | None = None,
                   sync_path: str | None = None) -> None:
    """The teams of a stack's config (`field`, e.g. strata:teams), each a clear ValueError naming the entry
    and the fix: a team needs a name that is a DNS label, names and namespaces are each one team's, no
    unknown keys; with `project_dir` (this project, as published for Flux), the directory each team's
    sync applies must exist in it (`path`, else `<sync_path>/team-<name>`)."""
    if not isinstance(teams, list):
        raise ValueError(f"{field} must be a list of teams such as [{{name: alpha}}]")
    names: dict[str, str] = {}
    namespaces: dict[str, str] = {}
    for index, team in enumerate(teams):
        where = f"{field}[{index}]"
        if not isinstance(team, dict) or not team.get("name"):
            raise ValueError(f"{where}: a team needs a `name` (a DNS label, e.g. gamma)")
        name = str(team["name"])
        where = f"{where} ({name})"
        unknown = sorted(set(team) - TEAM_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; a team takes {sorted(TEAM_KEYS)}")
        try:
            namespace = team_names(name, team.get("namespace"))["namespace"]
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if name in names:
            raise ValueError(f"{where}: team {name!r} is listed twice; list each team once")
        if namespace in namespaces:
            raise ValueError(f"{where}: namespace {namespace} is already the namespace of team "
                             f"{namespaces[namespace]}; give each team a namespace of its own (a team can reach "
                             "everything in its namespace)")
        names[name], namespaces[namespace] = name, name
        path = team_sync_path(team, sync_path)
        if project_dir and path and "repo" not in team and not (Path(project_dir) / path).is_dir():
            raise ValueError(f"{where}: its sync applies {path} of this project's repository, which does not exist; "
                             f"commit that directory (a kustomization.yaml listing the team's Stacks, or none yet) "
                             f"or set the team's `path`")


def team_sync_path(team: dict[str, Any], sync_path: str | None) -> str | None:
    """The directory of git a team's sync applies: its `path`, else `<sync_path>/team-<name>` of this
    project's repository (not for a team with a `repo` of its own); None: the team has no sync."""
    if team.get("path"):
        return str(team["path"])
    return f"{sync_path.strip('/').removeprefix('./')}/team-{team['name']}" if sync_path and "repo" not in team else None
