"""The Program API (`pulumi.com/v1`): its body, a Pulumi YAML program, validated naming the field; the
Pulumi.yaml it renders to, its revision, and its `.status` as PKO v2 writes it (pure)."""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from pydantic import Field, ValidationError

from .validation import ApiModel, SpecInvalid, SpecIssue, pydantic_issues


class ProgramBody(ApiModel):
    """`Program.program`: a Pulumi YAML program (configuration, resources, variables, outputs)."""

    configuration: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # PKO v2.9: package name -> source (a plugin or Git/registry ref, as Pulumi.yaml's `packages`).
    packages: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, dict[str, Any]] = Field(default_factory=dict)
    variables: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, Any] = Field(default_factory=dict)


def parse_program(raw: dict[str, Any] | None) -> ProgramBody:
    try:
        body = ProgramBody.model_validate(raw or {})
    except ValidationError as err:
        raise SpecInvalid(pydantic_issues(err, "program")) from None
    issues = []
    for name, res in body.resources.items():
        if not isinstance(res.get("type"), str) or not res.get("type"):
            issues.append(SpecIssue(f"program.resources.{name}.type", "missing resource type",
                                    "set type to a Pulumi type token like pulumi:index:Stash"))
    for name, conf in body.configuration.items():
        if "type" not in conf and "default" not in conf:
            issues.append(SpecIssue(f"program.configuration.{name}", "needs a type or a default",
                                    "set type (String, Number, List<String>, ...) or default"))
    if issues:
        raise SpecInvalid(issues)
    return body


def program_revision(program: dict[str, Any]) -> str:
    meta = program.get("metadata", {})
    return f"{meta.get('name', '')}/{meta.get('generation', 0)}"


def program_project(program: dict[str, Any]) -> str:
    """A Program object as the text of a Pulumi YAML project file (Pulumi.yaml)."""
    body = parse_program(program.get("program"))
    project: dict[str, Any] = {"name": program["metadata"]["name"], "runtime": "yaml"}
    for section in ("configuration", "packages", "variables", "resources", "outputs"):
        value = getattr(body, section)
        if value:
            # `configuration` (String, Number, List<String>) is Pulumi YAML's program-level config block;
            # the project-level `config` block has a different, lowercase type schema.
            project[section] = value
    return yaml.safe_dump(project, sort_keys=False)


def program_status(program: dict[str, Any], previous: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """A Program's `.status` as PKO v2 writes it: observedGeneration, and the artifact Stacks run (its
    generation as the revision, the digest of the project it renders to). Nothing serves Programs over
    HTTP here (Stacks read them from the API), so the artifact has no `url`. An invalid Program has no
    artifact: the Stacks that use it say why."""
    meta = program.get("metadata", {})
    generation = int(meta.get("generation", 0))
    status: dict[str, Any] = {"observedGeneration": generation}
    try:
        text = program_project(program)
    except SpecInvalid:
        return status
    artifact = {"path": f"programs/{meta.get('namespace', '')}/{meta.get('name', '')}/{generation}",
                "revision": str(generation), "digest": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
                "lastUpdateTime": now}
    before = (previous or {}).get("artifact") or {}
    if all(before.get(k) == artifact[k] for k in ("path", "revision", "digest")):
        artifact["lastUpdateTime"] = before.get("lastUpdateTime", now)  # unchanged: keep its time, write nothing
    status["artifact"] = artifact
    if (previous or {}).get("rollout"):
        status["rollout"] = previous["rollout"]  # the Stacks' to write (decisions/rollout.rollout_progress)
    return status
