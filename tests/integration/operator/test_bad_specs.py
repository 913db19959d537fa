"""Invalid Stacks: each is rejected by the CRD schema naming its field, or Stalled/SpecInvalid naming it.

The operator must keep running through all of them (same process, healthy, no crash loop).
"""

import json

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.kube import http_ok

from .conftest import GROUP, VERSION, condition

SECRET_REF = {"type": "Secret", "secret": {"name": "app", "key": "token"}}
REPO = "https://git.example.com/org/repo.git"
SHA = "0123456789abcdef0123456789abcdef01234567"
PROGRAM = {"programRef": {"name": "prog"}}

# (case, spec, text the 422 must contain: the field path as the apiserver names it)
REJECTED_BY_SCHEMA = [
    ("no stack", {**PROGRAM}, "spec.stack: Required value"),
    ("empty stack", {"stack": "", **PROGRAM}, "spec.stack"),
    ("commit not a sha", {"stack": "dev", "projectRepo": REPO, "commit": "main"}, "spec.commit"),
    ("envRefs unknown type", {"stack": "dev", **PROGRAM, "envRefs": {"A": {"type": "Vault"}}}, "spec.envRefs.A.type"),
    ("envRefs Secret without secret", {"stack": "dev", **PROGRAM, "envRefs": {"A": {"type": "Secret"}}},
     "spec.envRefs[A]"),
    ("envRefs secret without key", {"stack": "dev", **PROGRAM,
                                    "envRefs": {"A": {"type": "Secret", "secret": {"name": "s"}}}},
     "spec.envRefs.A.secret.key"),
    ("negative resync", {"stack": "dev", **PROGRAM, "resyncFrequencySeconds": -5}, "spec.resyncFrequencySeconds"),
    ("backoff cap too large", {"stack": "dev", **PROGRAM, "retryMaxBackoffDurationSeconds": 100000},
     "spec.retryMaxBackoffDurationSeconds"),
    ("target not a urn", {"stack": "dev", **PROGRAM, "targets": ["res"]}, "spec.targets[0]"),
    ("prerequisite without name", {"stack": "dev", **PROGRAM, "prerequisites": [{}]}, "spec.prerequisites[0].name"),
    ("prerequisite bad duration", {"stack": "dev", **PROGRAM,
                                   "prerequisites": [{"name": "a", "requirement": {"succeededWithinDuration": "soon"}}]},
     "spec.prerequisites[0].requirement.succeededWithinDuration"),
    ("two sources", {"stack": "dev", **PROGRAM, "projectRepo": REPO, "commit": SHA}, "exactly one source"),
    ("no source", {"stack": "dev"}, "exactly one source"),
    ("commit and branch", {"stack": "dev", "projectRepo": REPO, "commit": SHA, "branch": "main"},
     "exactly one of .spec.commit and .spec.branch"),
    ("git without commit or branch", {"stack": "dev", "projectRepo": REPO},
     "exactly one of .spec.commit and .spec.branch"),
    ("refresh not boolean", {"stack": "dev", **PROGRAM, "refresh": "yes"}, "spec.refresh"),
    ("destroyOnFinalize not boolean", {"stack": "dev", **PROGRAM, "destroyOnFinalize": "true"},
     "spec.destroyOnFinalize"),
    ("secretsRef without type", {"stack": "dev", **PROGRAM, "secretsRef": {"pw": {"literal": {"value": "x"}}}},
     "spec.secretsRef.pw.type"),
    ("basicAuth without password", {"stack": "dev", "projectRepo": REPO, "commit": SHA,
                                    "gitAuth": {"basicAuth": {"userName": {"type": "Literal",
                                                                           "literal": {"value": "u"}}}}},
     "spec.gitAuth.basicAuth.password"),
    ("gitAuth two modes", {"stack": "dev", "projectRepo": REPO, "commit": SHA,
                           "gitAuth": {"accessToken": SECRET_REF,
                                       "sshAuth": {"sshPrivateKey": SECRET_REF}}}, "spec.gitAuth"),
    ("configRef without key", {"stack": "dev", **PROGRAM, "configRef": {"c": {"name": "cm"}}},
     "spec.configRef.c.key"),
    ("flux kind not a source", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmChart", "name": "x"}}},
     "spec.fluxSource.sourceRef.kind"),
    ("programRef without name", {"stack": "dev", "programRef": {}}, "spec.programRef.name"),
    ("config not a map", {"stack": "dev", **PROGRAM, "config": ["a"]}, "spec.config"),
]

# (case, spec that passes the schema, field the Stalled message must name)
STALLED_SPEC_INVALID = [
    ("stack name too deep", {"stack": "a/b/c/d", **PROGRAM}, "spec.stack"),
    ("repo not a url", {"stack": "dev", "projectRepo": "not a url", "branch": "main"}, "spec.projectRepo"),
    ("repoDir escapes", {"stack": "dev", "projectRepo": REPO, "branch": "main", "repoDir": "../other"},
     "spec.repoDir"),
    ("flux apiVersion not flux", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "v1", "kind": "GitRepository", "name": "x"}}}, "spec.fluxSource.sourceRef.apiVersion"),
    ("flux dir absolute", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "x"}, "dir": "/etc"}},
     "spec.fluxSource.dir"),
    ("programRef bad name", {"stack": "dev", "programRef": {"name": "Bad_Name"}}, "spec.programRef.name"),
    ("env var name", {"stack": "dev", **PROGRAM, "envRefs": {"1BAD": {"type": "Literal", "literal": {"value": "v"}}}},
     "spec.envRefs.1BAD"),
    ("cross-namespace secret", {"stack": "dev", **PROGRAM, "secretsRef": {
        "pw": {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "kube-system"}}}},
     "spec.secretsRef.pw.secret.namespace"),
    ("ref with two selectors", {"stack": "dev", **PROGRAM, "envRefs": {
        "A": {"type": "Literal", "literal": {"value": "v"}, "secret": {"name": "s", "key": "k"}}}},
     "spec.envRefs.A.secret"),
    ("config key", {"stack": "dev", **PROGRAM, "config": {"bad key!": "v"}}, "spec.config.bad key!"),
    ("config and secret same key", {"stack": "dev", **PROGRAM, "config": {"pw": "plain"},
                                    "secretsRef": {"pw": SECRET_REF}}, "spec.secretsRef.pw"),
    ("prerequisite twice", {"stack": "dev", **PROGRAM, "prerequisites": [{"name": "a"}, {"name": "a"}]},
     "spec.prerequisites[1].name"),
    ("prerequisite bad name", {"stack": "dev", **PROGRAM, "prerequisites": [{"name": "Not_A_Name"}]},
     "spec.prerequisites[0].name"),
    ("service account name", {"stack": "dev", **PROGRAM, "serviceAccountName": "Bad_SA"}, "spec.serviceAccountName"),
    ("preview with destroyOnFinalize", {"stack": "dev", **PROGRAM, "preview": True, "destroyOnFinalize": True},
     "spec.destroyOnFinalize"),
    ("targetDependents alone", {"stack": "dev", **PROGRAM, "targetDependents": True}, "spec.targetDependents"),
    ("branch without git", {"stack": "dev", **PROGRAM, "branch": "main"}, "spec.branch"),
    ("gitAuth without git", {"stack": "dev", **PROGRAM, "gitAuth": {"accessToken": SECRET_REF}}, "spec.gitAuth"),
    ("gitAuthSecret and gitAuth", {"stack": "dev", "projectRepo": REPO, "commit": SHA, "gitAuthSecret": "old",
                                   "gitAuth": {"accessToken": SECRET_REF}}, "spec.gitAuthSecret"),
    ("env ref variable name", {"stack": "dev", **PROGRAM, "envRefs": {"A": {"type": "Env", "env": {"name": "a-b"}}}},
     "spec.envRefs.A.env.name"),
    ("fs ref relative", {"stack": "dev", **PROGRAM, "envRefs": {
        "A": {"type": "FS", "filesystem": {"path": "etc/passwd"}}}}, "spec.envRefs.A.filesystem.path"),
    ("secret name", {"stack": "dev", **PROGRAM, "secretsRef": {
        "pw": {"type": "Secret", "secret": {"name": "Bad_Secret", "key": "k"}}}}, "spec.secretsRef.pw.secret.name"),
]


def _create(stacks, name, spec):
    return stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "stacks", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": name}, "spec": spec})


def test_enough_bad_specs():
    assert len(REJECTED_BY_SCHEMA) + len(STALLED_SPEC_INVALID) >= 30


def test_schema_rejects_invalid_specs_naming_the_field(stacks):
    wrong = []
    for index, (case, spec, field) in enumerate(REJECTED_BY_SCHEMA):
        try:
            _create(stacks, f"rejected-{index}", spec)
        except client.ApiException as error:
            message = json.loads(error.body).get("message", "")
            if error.status != 422 or field not in message:
                wrong.append(f"{case}: {error.status} {message}")
        else:
            wrong.append(f"{case}: accepted")
    assert not wrong, "\n".join(wrong)


def test_unknown_field_rejected_with_strict_validation(stacks):
    """What `kubectl apply` does by default: a typo is an error, not silently pruned."""
    with pytest.raises(client.ApiException) as raised:
        stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": "typo"},
            "spec": {"stack": "dev", **PROGRAM, "destroyOnFinalise": True}}, field_validation="Strict")
    assert raised.value.status == 400
    assert 'unknown field "spec.destroyOnFinalise"' in json.loads(raised.value.body)["message"]


def test_semantically_invalid_specs_stall_naming_the_field(stacks, operator):
    pid = operator.pid()
    for index, (_, spec, _) in enumerate(STALLED_SPEC_INVALID):
        _create(stacks, f"invalid-{index}", spec)
    wrong = []
    for index, (case, _, field) in enumerate(STALLED_SPEC_INVALID):
        obj = stacks.wait(f"invalid-{index}", lambda o: condition(o, "Stalled") is not None, 60, case)
        stalled = condition(obj, "Stalled")
        ready = condition(obj, "Ready")
        if stalled["reason"] != "SpecInvalid" or field not in stalled["message"] or ready["status"] != "False":
            wrong.append(f"{case}: {stalled['reason']}: {stalled['message']}")
        if obj["status"].get("lastUpdate"):
            wrong.append(f"{case}: an engine run was recorded")
    assert not wrong, "\n".join(wrong)
    # Kopf posts Events from a queue: they may trail the status by a moment.
    processes.wait_until(lambda: all(stacks.events(f"invalid-{i}", "StackConfigInvalid")
                                     for i in range(len(STALLED_SPEC_INVALID))), 30, "a StackConfigInvalid Event each")
    assert operator.pid() == pid, "the operator restarted"
    assert http_ok(operator.health_url)

    # Fixing the spec un-stalls it (here: to a missing Program, which the operator then waits for).
    stacks.patch("invalid-5", {"spec": {"programRef": {"name": "prog"}}})
    fixed = stacks.wait("invalid-5", lambda o: condition(o, "Stalled")["reason"] != "SpecInvalid"
                        if condition(o, "Stalled") else True, 60, "no longer SpecInvalid")
    assert "spec.programRef.name" not in json.dumps(fixed["status"]["conditions"])
