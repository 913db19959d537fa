"""Invalid Stacks: each is rejected by the CRD schema naming its field, or Stalled naming it.

One test per case, so the run's own count says how many were shown (nothing asserts a list's length).
The operator must keep running through all of them (same process, healthy, no crash loop).
"""

import json
import uuid

import pytest
from kubernetes import client

from strata_components.local import processes
from strata_components.local.kube import http_ok
from strata_components.local.operator_host import serve_namespace
from strata_operator.api import FILE_BACKEND_ANNOTATION

from .conftest import GROUP, VERSION, Stacks, condition

SECRET_REF = {"type": "Secret", "secret": {"name": "app", "key": "token"}}
REPO = "https://git.example.com/org/repo.git"
SHA = "0123456789abcdef0123456789abcdef01234567"
PROGRAM = {"programRef": {"name": "prog"}}

# (case, spec, text the 422 must contain: the field path as the apiserver names it)
REJECTED_BY_SCHEMA = [
    ("no stack", {**PROGRAM}, "spec.stack: Required value"),
    ("empty stack", {"stack": "", **PROGRAM}, "spec.stack"),
    ("envRefs unknown type", {"stack": "dev", **PROGRAM, "envRefs": {"A": {"type": "Vault"}}}, "spec.envRefs.A.type"),
    ("envRefs Secret without secret", {"stack": "dev", **PROGRAM, "envRefs": {"A": {"type": "Secret"}}},
     "spec.envRefs[A]"),
    ("envRefs secret without key", {"stack": "dev", **PROGRAM,
                                    "envRefs": {"A": {"type": "Secret", "secret": {"name": "s"}}}},
     "spec.envRefs.A.secret.key"),
    ("negative resync", {"stack": "dev", **PROGRAM, "resyncFrequencySeconds": -5}, "spec.resyncFrequencySeconds"),
    ("backoff cap too large", {"stack": "dev", **PROGRAM, "retryMaxBackoffDurationSeconds": 100000},
     "spec.retryMaxBackoffDurationSeconds"),
    ("empty target", {"stack": "dev", **PROGRAM, "targets": [""]}, "spec.targets[0]"),
    ("prerequisite without name", {"stack": "dev", **PROGRAM, "prerequisites": [{}]}, "spec.prerequisites[0].name"),
    ("approval unknown mode", {"stack": "dev", **PROGRAM, "approval": {"mode": "Sometimes"}}, "spec.approval.mode"),
    ("suspend not boolean", {"stack": "dev", **PROGRAM, "suspend": "yes"}, "spec.suspend"),
    ("drift interval not a duration", {"stack": "dev", **PROGRAM, "driftDetection": {"interval": "hourly"}},
     "spec.driftDetection.interval"),
    ("prerequisite bad duration", {"stack": "dev", **PROGRAM,
                                   "prerequisites": [{"name": "a", "requirement": {"succeededWithinDuration": "soon"}}]},
     "spec.prerequisites[0].requirement.succeededWithinDuration"),
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
    ("flux kind empty", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "", "name": "x"}}},
     "spec.fluxSource.sourceRef.kind"),
    ("githubApp without privateKey", {"stack": "dev", "projectRepo": REPO, "commit": SHA, "gitAuth": {
        "githubApp": {"appID": SECRET_REF, "installationID": SECRET_REF}}}, "spec.gitAuth.githubApp.privateKey"),
    ("githubApp and accessToken", {"stack": "dev", "projectRepo": REPO, "commit": SHA, "gitAuth": {
        "accessToken": SECRET_REF, "githubApp": {"appID": SECRET_REF, "installationID": SECRET_REF,
                                                 "privateKey": SECRET_REF}}},
     "set exactly one of accessToken, sshAuth, basicAuth, githubApp"),
    ("programRef without name", {"stack": "dev", "programRef": {}}, "spec.programRef.name"),
    ("config not a map", {"stack": "dev", **PROGRAM, "config": ["a"]}, "spec.config"),
]

# (case, spec that passes the schema, field the Stalled message must name[, reason if not SpecInvalid])
STALLED_SPEC_INVALID = [
    ("no source", {"stack": "dev"}, "spec: no program source"),
    ("commit not a sha", {"stack": "dev", "projectRepo": REPO, "commit": "main"}, "spec.commit"),
    ("target not a urn", {"stack": "dev", **PROGRAM, "targets": ["res"]}, "spec.targets[0]"),
    ("runProgram without destroyOnFinalize", {"stack": "dev", **PROGRAM, "runProgram": True}, "spec.runProgram"),
    ("stack name too deep", {"stack": "a/b/c/d", **PROGRAM}, "spec.stack"),
    ("repo not a url", {"stack": "dev", "projectRepo": "not a url", "branch": "main"}, "spec.projectRepo"),
    ("repoDir escapes", {"stack": "dev", "projectRepo": REPO, "branch": "main", "repoDir": "../other"},
     "spec.repoDir"),
    ("flux apiVersion not flux", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "v1", "kind": "GitRepository", "name": "x"}}}, "spec.fluxSource.sourceRef.apiVersion"),
    ("flux dir escapes", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "x"}, "dir": "/../etc"}},
     "spec.fluxSource.dir"),
    ("programRef bad name", {"stack": "dev", "programRef": {"name": "Bad_Name"}}, "spec.programRef.name"),
    ("env var name", {"stack": "dev", **PROGRAM, "envRefs": {"1BAD": {"type": "Literal", "literal": {"value": "v"}}}},
     "spec.envRefs.1BAD"),
    ("cross-namespace secret", {"stack": "dev", **PROGRAM, "secretsRef": {
        "pw": {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "kube-system"}}}},
     "spec.secretsRef.pw.secret.namespace", "CrossNamespaceRefForbidden"),
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
    ("preview with drift remediation", {"stack": "dev", **PROGRAM, "preview": True,
                                        "driftDetection": {"remediate": True}}, "spec.driftDetection.remediate"),
    ("preview with manual approval", {"stack": "dev", **PROGRAM, "preview": True, "approval": {"mode": "Manual"}},
     "spec.approval.mode"),
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


@pytest.fixture(scope="module")
def bad_specs(operator, kube_client, tmp_path_factory):
    """One namespace for every case; the semantically invalid Stacks are all created up front, so the
    operator handles them side by side, and each case's test reads its own."""
    core = client.CoreV1Api(kube_client)
    namespace = f"t-bad-specs-{uuid.uuid4().hex[:5]}"
    backend = tmp_path_factory.mktemp("backend")
    core.create_namespace({"metadata": {"name": namespace, "annotations": {FILE_BACKEND_ANNOTATION: str(backend)}}})
    serve_namespace(operator.platform.kubeconfig_path, namespace)
    stacks = Stacks(kube_client, namespace, backend.as_uri(), operator)
    pid = operator.pid()
    for index, (_, spec, *_) in enumerate(STALLED_SPEC_INVALID):
        _create(stacks, f"invalid-{index}", spec)
    yield stacks, pid
    core.delete_namespace(namespace)


@pytest.mark.parametrize("index", range(len(REJECTED_BY_SCHEMA)), ids=[c for c, _, _ in REJECTED_BY_SCHEMA])
def test_schema_rejects_the_spec_naming_the_field(bad_specs, index):
    stacks, _ = bad_specs
    _, spec, field = REJECTED_BY_SCHEMA[index]
    with pytest.raises(client.ApiException) as raised:
        _create(stacks, f"rejected-{index}", spec)
    message = json.loads(raised.value.body).get("message", "")
    assert raised.value.status == 422 and field in message, message


def test_unknown_field_rejected_with_strict_validation(stacks):
    """What `kubectl apply` does by default: a typo is an error, not silently pruned."""
    with pytest.raises(client.ApiException) as raised:
        stacks.custom.create_namespaced_custom_object(GROUP, VERSION, stacks.namespace, "stacks", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Stack", "metadata": {"name": "typo"},
            "spec": {"stack": "dev", **PROGRAM, "destroyOnFinalise": True}}, field_validation="Strict")
    assert raised.value.status == 400
    assert 'unknown field "spec.destroyOnFinalise"' in json.loads(raised.value.body)["message"]


@pytest.mark.parametrize("index", range(len(STALLED_SPEC_INVALID)), ids=[c[0] for c in STALLED_SPEC_INVALID])
def test_the_spec_stalls_naming_the_field(bad_specs, index):
    stacks, _ = bad_specs
    case, _, field, *reason = STALLED_SPEC_INVALID[index]
    obj = stacks.wait(f"invalid-{index}", lambda o: condition(o, "Stalled") is not None, 60, case)
    stalled, ready = condition(obj, "Stalled"), condition(obj, "Ready")
    assert (stalled["reason"], ready["status"]) == ((reason or ["SpecInvalid"])[0], "False")
    assert field in stalled["message"] and "fix:" in stalled["message"]
    assert not obj["status"].get("lastUpdate"), "an engine run was recorded"
    # Kopf posts Events from a queue: they may trail the status by a moment.
    processes.wait_until(lambda: stacks.events(f"invalid-{index}", "StackConfigInvalid"), 30,
                         "a StackConfigInvalid Event")


def test_the_operator_survives_every_bad_spec_and_a_fix_unstalls(bad_specs):
    stacks, pid = bad_specs
    for index in range(len(STALLED_SPEC_INVALID)):
        stacks.wait(f"invalid-{index}", lambda o: condition(o, "Stalled") is not None, 60, "stalled")
    assert stacks.operator.pid() == pid, "the operator restarted"
    assert http_ok(stacks.operator.health_url)

    # Fixing the spec un-stalls it (here: to a missing Program, which the operator then waits for).
    broken = next(i for i, case in enumerate(STALLED_SPEC_INVALID) if case[0] == "programRef bad name")
    stacks.patch(f"invalid-{broken}", {"spec": {"programRef": {"name": "prog"}}})
    fixed = stacks.wait(f"invalid-{broken}", lambda o: condition(o, "Stalled")["reason"] != "SpecInvalid"
                        if condition(o, "Stalled") else True, 60, "no longer SpecInvalid")
    assert "spec.programRef.name" not in json.dumps(fixed["status"]["conditions"])
