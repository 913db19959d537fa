"""Stack spec validation: every bad spec names its field; the CRD schema agrees with the models."""

from pathlib import Path

import pytest
import yaml

from strata_operator.api.program import ProgramBody, parse_program
from strata_operator.api.stack import (StackSpec, misplaced_file_backend, not_applicable_fields, operator_ref_issues,
                                       parse_stack_spec, unused_sources)
from strata_operator.api.validation import SpecInvalid, parse_duration

CRDS = Path(__file__).resolve().parents[3] / "operator" / "strata_operator" / "api" / "crds"
GIT = {"stack": "dev", "projectRepo": "https://example.com/repo.git", "commit": "a" * 40}
SECRET = {"type": "Secret", "secret": {"name": "creds", "key": "token"}}


def with_(**changes):
    spec = dict(GIT)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


BAD_SPECS = [
    ("missing stack", with_(stack=None), "spec.stack"),
    ("stack name with spaces", with_(stack="my stack"), "spec.stack"),
    ("stack with four parts", with_(stack="a/b/c/d"), "spec.stack"),
    ("no source", {"stack": "dev"}, "spec"),
    ("commit and branch", with_(branch="main"), "spec.commit"),
    ("neither commit nor branch", with_(commit=None), "spec.branch"),
    ("commit not a sha", with_(commit="main"), "spec.commit"),
    ("repo not a url", with_(projectRepo="not a url"), "spec.projectRepo"),
    ("escaping repoDir", with_(repoDir="../x"), "spec.repoDir"),
    ("escaping repoDir behind a leading /", with_(repoDir="/../x"), "spec.repoDir"),
    ("branch without repo", {"stack": "dev", "programRef": {"name": "p"}, "branch": "main"}, "spec.branch"),
    ("gitAuth without repo", {"stack": "dev", "programRef": {"name": "p"}, "gitAuth": {"accessToken": SECRET}},
     "spec.gitAuth"),
    ("two git auth modes", with_(gitAuth={"accessToken": SECRET, "basicAuth": {"userName": SECRET, "password": SECRET}}),
     "spec.gitAuth"),
    ("empty gitAuth", with_(gitAuth={}), "spec.gitAuth"),
    ("githubApp and accessToken", with_(gitAuth={"accessToken": SECRET, "githubApp": {
        "appID": SECRET, "installationID": SECRET, "privateKey": SECRET}}), "spec.gitAuth"),
    ("githubApp without privateKey", with_(gitAuth={"githubApp": {"appID": SECRET, "installationID": SECRET}}),
     "spec.gitAuth.githubApp.privateKey"),
    ("githubApp key ref missing its selector", with_(gitAuth={"githubApp": {
        "appID": SECRET, "installationID": SECRET, "privateKey": {"type": "Secret"}}}),
     "spec.gitAuth.githubApp.privateKey.secret"),
    ("gitAuth and gitAuthSecret", with_(gitAuth={"accessToken": SECRET}, gitAuthSecret="s"), "spec.gitAuthSecret"),
    ("basicAuth without password", with_(gitAuth={"basicAuth": {"userName": SECRET}}), "spec.gitAuth.basicAuth.password"),
    ("ref type unknown", with_(envRefs={"TOKEN": {"type": "Vault"}}), "spec.envRefs.TOKEN.type"),
    ("ref missing its selector", with_(envRefs={"TOKEN": {"type": "Secret"}}), "spec.envRefs.TOKEN.secret"),
    ("ref with mismatched selector", with_(envRefs={"TOKEN": {"type": "Literal", "literal": {"value": "x"},
                                                             "env": {"name": "X"}}}), "spec.envRefs.TOKEN.env"),
    ("ref without type", with_(envRefs={"TOKEN": {"literal": {"value": "x"}}}), "spec.envRefs.TOKEN.type"),
    ("bad env var name", with_(envRefs={"1BAD": {"type": "Literal", "literal": {"value": "x"}}}), "spec.envRefs.1BAD"),
    ("cross-namespace secret", with_(secretsRef={"pw": {"type": "Secret", "secret": {
        "name": "s", "key": "k", "namespace": "other"}}}), "spec.secretsRef.pw.secret.namespace"),
    ("secret without key", with_(secretsRef={"pw": {"type": "Secret", "secret": {"name": "s"}}}),
     "spec.secretsRef.pw.secret.key"),
    ("relative FS path", with_(envRefs={"X": {"type": "FS", "filesystem": {"path": "rel"}}}),
     "spec.envRefs.X.filesystem.path"),
    ("bad config key", with_(config={"a b": "x"}), "spec.config.a b"),
    ("config key also secret", with_(config={"pw": "x"}, secretsRef={"pw": {"type": "Literal", "literal": {"value": "y"}}}),
     "spec.secretsRef.pw"),
    ("flux kind not a kind", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "helm chart", "name": "r"}}}, "spec.fluxSource.sourceRef.kind"),
    ("flux api not flux", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "apps/v1", "kind": "GitRepository", "name": "r"}}}, "spec.fluxSource.sourceRef.apiVersion"),
    ("flux without sourceRef", {"stack": "dev", "fluxSource": {"dir": "x"}}, "spec.fluxSource.sourceRef"),
    ("flux escaping dir", {"stack": "dev", "fluxSource": {"dir": "../..", "sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}}, "spec.fluxSource.dir"),
    ("programRef bad name", {"stack": "dev", "programRef": {"name": "Not_A_Name"}}, "spec.programRef.name"),
    ("programRef without name", {"stack": "dev", "programRef": {}}, "spec.programRef.name"),
    ("target not a URN", with_(targets=["bucket"]), "spec.targets[0]"),
    ("runProgram without destroyOnFinalize", with_(runProgram=True), "spec.runProgram"),
    ("targetDependents without targets", with_(targetDependents=True), "spec.targetDependents"),
    ("prerequisite bad duration", with_(prerequisites=[{"name": "a", "requirement": {"succeededWithinDuration": "1 hour"}}]),
     "spec.prerequisites[0].requirement.succeededWithinDuration"),
    ("prerequisite twice", with_(prerequisites=[{"name": "a"}, {"name": "a"}]), "spec.prerequisites[1].name"),
    ("prerequisite without name", with_(prerequisites=[{}]), "spec.prerequisites[0].name"),
    ("negative resync", with_(resyncFrequencySeconds=-5), "spec.resyncFrequencySeconds"),
    ("resync not a number", with_(resyncFrequencySeconds="often"), "spec.resyncFrequencySeconds"),
    ("backoff too long", with_(retryMaxBackoffDurationSeconds=100000), "spec.retryMaxBackoffDurationSeconds"),
    ("refresh not bool", with_(refresh="maybe"), "spec.refresh"),
    ("unknown field", with_(destroyOnFinalise=True), "spec.destroyOnFinalise"),
    ("bad serviceAccountName", with_(serviceAccountName="Bad Name"), "spec.serviceAccountName"),
    ("preview with destroyOnFinalize", with_(preview=True, destroyOnFinalize=True), "spec.destroyOnFinalize"),
    ("configRef bad name", with_(configRef={"k": {"name": "Bad_Name", "key": "k"}}), "spec.configRef.k.name"),
    ("envs not a list", with_(envs="cm"), "spec.envs"),
    ("outputsSecret bad name", with_(outputsSecret={"name": "Bad_Name"}), "spec.outputsSecret.name"),
    ("outputsSecret name too long", with_(outputsSecret={"name": "a" * 254}), "spec.outputsSecret.name"),
    ("outputsSecret without name", with_(outputsSecret={}), "spec.outputsSecret.name"),
    ("outputsSecret on a preview Stack", with_(preview=True, outputsSecret={"name": "out"}), "spec.outputsSecret"),
    ("prerequisite outputs empty", with_(prerequisites=[{"name": "a", "outputs": []}]), "spec.prerequisites[0].outputs"),
    ("prerequisite output twice", with_(prerequisites=[{"name": "a", "outputs": ["x", "x"]}]),
     "spec.prerequisites[0].outputs[1]"),
    ("prerequisite output empty", with_(prerequisites=[{"name": "a", "outputs": [""]}]),
     "spec.prerequisites[0].outputs[0]"),
]


@pytest.mark.parametrize("spec,field", [(s, f) for _, s, f in BAD_SPECS], ids=[n for n, _, _ in BAD_SPECS])
def test_bad_spec_is_rejected_naming_its_field(spec, field):
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec(spec, namespace="team")
    assert field in caught.value.fields, f"{field} not among {caught.value.fields}"
    assert "fix:" in str(caught.value)


@pytest.mark.parametrize("repo", ["file:///srv/git/other-team.git", "FILE:///srv/git/other-team.git",
                                  "/srv/git/other-team.git", "./other-team.git", "~/repos/other-team.git"])
def test_a_repository_on_the_operators_own_filesystem_is_refused_naming_the_field(repo):
    """file:// and local paths would have the operator read any repository on its host or pod for a team."""
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec(with_(projectRepo=repo), namespace="team")
    assert caught.value.fields == ["spec.projectRepo"]
    assert f"spec.projectRepo: {repo!r} is a repository on the operator's own filesystem" in str(caught.value)
    assert "fix: serve the repository from a git server" in str(caught.value)


def test_a_git_servers_urls_are_accepted():
    for repo in ("https://h/r.git", "http://127.0.0.1:8398/r.git", "ssh://git@h:2222/r.git", "git://h/r.git",
                 "git@github.com:org/r.git"):
        assert parse_stack_spec(with_(projectRepo=repo), namespace="team").project_repo == repo


def test_pko_v1_manifest_parses_with_defaults():
    spec = parse_stack_spec({
        "stack": "org/k8s-nginx/dev", "projectRepo": "https://github.com/pulumi/examples",
        "repoDir": "kubernetes-ts-nginx", "commit": "e2e5eb426dbf5b57c50bba0f8eb54fe982ceddb1",
        "envRefs": {"PULUMI_ACCESS_TOKEN": {"type": "Secret", "secret": {"name": "tok", "key": "accessToken"}}},
        "config": {"aws:region": "us-east-1"}, "destroyOnFinalize": True, "resyncFrequencySeconds": 30,
    }, namespace="default")
    assert spec.source_kind == "git"
    assert spec.resync_seconds() == 60  # below the minimum means the minimum (PKO)
    assert spec.resync_seconds(floor=5) == 30
    assert spec.env_refs["PULUMI_ACCESS_TOKEN"].secret.key == "accessToken"
    assert spec.destroy_on_finalize and not spec.use_local_stack_only


def test_pko_v2_fields_are_accepted_and_inapplicable_ones_listed():
    raw = {"stack": "dev", "programRef": {"name": "p"}, "serviceAccountName": "deployer", "preview": True,
           "config": {"app:tags": {"team": "a"}}, "configRef": {"app:x": {"name": "cm", "key": "x", "json": True}},
           "retryMaxBackoffDurationSeconds": 300, "workspaceTemplate": {"spec": {"image": "x"}},
           "workspaceReclaimPolicy": "Delete"}
    spec = parse_stack_spec(raw, namespace="default")
    assert spec.config["app:tags"] == {"team": "a"}
    assert spec.config_ref["app:x"].json_ is True
    assert not_applicable_fields(raw) == ["workspaceTemplate", "workspaceReclaimPolicy"]
    # A workspace pod honours the template (its image too) and the reclaim policy.
    assert not_applicable_fields(raw, in_workspace_pods=True) == []


def test_program_requires_resource_types():
    with pytest.raises(SpecInvalid) as caught:
        parse_program({"resources": {"a": {"properties": {}}}})
    assert caught.value.fields == ["program.resources.a.type"]
    assert parse_program({"resources": {"a": {"type": "pulumi:index:Stash"}}}).resources["a"]["type"] == "pulumi:index:Stash"


def test_crd_spec_fields_match_the_model():
    crd = yaml.safe_load((CRDS / "pulumi.com_stacks.yaml").read_text())
    version = crd["spec"]["versions"][0]
    crd_fields = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    model_fields = {f.alias or name for name, f in StackSpec.model_fields.items()}
    assert crd_fields == model_fields
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:3] == ["Ready", "Reason", "Last commit"] and "Age" in columns
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
    assert [r["message"] for r in rules] == ["a git source needs exactly one of .spec.commit and .spec.branch"]


def test_crd_serves_v1alpha1_as_deprecated_v1():
    crd = yaml.safe_load((CRDS / "pulumi.com_stacks.yaml").read_text())
    v1, v1alpha1 = crd["spec"]["versions"]
    assert (v1["name"], v1["storage"], v1alpha1["name"], v1alpha1["storage"]) == ("v1", True, "v1alpha1", False)
    assert v1alpha1["served"] and v1alpha1["deprecated"] and "deprecated" in v1alpha1["deprecationWarning"]
    assert v1alpha1["schema"] == v1["schema"] and v1alpha1["subresources"] == v1["subresources"]


def test_crd_program_fields_match_the_model():
    crd = yaml.safe_load((CRDS / "pulumi.com_programs.yaml").read_text())
    version = crd["spec"]["versions"][0]
    crd_fields = set(version["schema"]["openAPIV3Schema"]["properties"]["program"]["properties"])
    assert crd_fields == set(ProgramBody.model_fields)
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "artifact"} <= set(status)


def test_several_sources_use_pkos_order_and_list_the_rest():
    flux = {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}
    every = parse_stack_spec(with_(programRef={"name": "p"}, fluxSource=flux), namespace="team")
    assert every.source_kind == "git" and unused_sources(every) == ["fluxSource", "programRef"]
    flux_and_program = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "fluxSource": flux}, "team")
    assert flux_and_program.source_kind == "flux" and unused_sources(flux_and_program) == ["programRef"]
    assert unused_sources(parse_stack_spec(GIT, "team")) == []


def test_no_source_is_invalid_naming_the_fields_that_give_one():
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec({"stack": "dev", "workspaceTemplate": {"spec": {"image": "app:1"}}}, "team")
    assert caught.value.fields == ["spec"] and caught.value.reason == "SpecInvalid"
    assert "spec.projectRepo, spec.fluxSource, spec.programRef" in str(caught.value)
    assert "spec.workspaceTemplate.spec.local.dir" in str(caught.value)


def test_pko_relaxations_are_accepted():
    spec = parse_stack_spec(with_(repoDir="/kubernetes-ts-nginx", targets=["**", "urn:pulumi:dev::p::*"],
                                  prerequisites=[{"name": "a", "requirement": {"succeededWithinDuration": "0"}}],
                                  destroyOnFinalize=True, runProgram=True), "team")
    assert spec.repo_dir == "kubernetes-ts-nginx"  # PKO reads it relative to the checkout
    flux = parse_stack_spec({"stack": "dev", "fluxSource": {"dir": "/infra", "sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}}, "team")
    assert flux.flux_source.dir == "infra"
    assert spec.targets == ["**", "urn:pulumi:dev::p::*"] and spec.run_program
    assert parse_duration("0") == 0.0
    helm = parse_stack_spec({"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmChart", "name": "c"}}}, "team")
    watched = parse_stack_spec({"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository", "name": "c"}}}, "team")
    assert helm.polled and not watched.polled  # no watch on HelmCharts: polled every resync period
    assert parse_stack_spec(with_(commit=None, branch="main"), "team").polled
    assert not parse_stack_spec(GIT, "team").polled


def test_github_app_is_one_auth_mode_of_three_refs():
    spec = parse_stack_spec(with_(gitAuth={"githubApp": {"appID": {"type": "Literal", "literal": {"value": "1"}},
                                                          "installationID": SECRET, "privateKey": SECRET}}), "team")
    assert spec.git_auth.modes == ["githubApp"] and spec.git_auth.github_app.private_key.secret.name == "creds"


def test_a_cross_namespace_ref_stalls_with_pkos_reason():
    cross = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "other"}}
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec(with_(envRefs={"X": cross}), namespace="team")
    assert caught.value.reason == "CrossNamespaceRefForbidden"
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec(with_(stack="a b"), namespace="team")
    assert caught.value.reason == "SpecInvalid"


def test_a_file_backend_inside_a_pko_workspace_volume_is_named():
    template = {"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"}]}]}}}}
    spec = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "workspaceTemplate": template,
                             "envRefs": {"PULUMI_BACKEND_URL": {"type": "Literal",
                                                                "literal": {"value": "file:///state/"}}}}, "team")
    issue = misplaced_file_backend(spec, "file:///state/", in_workspace_pods=False)
    assert issue.path == "spec.envRefs.PULUMI_BACKEND_URL" and "'state'" in issue.problem and "/state" in issue.problem
    assert "--executor pod" in issue.fix
    assert misplaced_file_backend(spec, "file:///state/sub", in_workspace_pods=False) is not None
    assert misplaced_file_backend(spec, "file:///stateful", in_workspace_pods=False) is None
    assert misplaced_file_backend(spec, "s3://bucket", in_workspace_pods=False) is None
    without_template = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}}, "team")
    assert misplaced_file_backend(without_template, "file:///state/", in_workspace_pods=False) is None


def test_with_workspace_pods_a_file_backend_must_be_on_a_workspace_volume():
    template = {"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": "/state"}]}]}}}}
    spec = parse_stack_spec({"stack": "dev", "programRef": {"name": "p"}, "workspaceTemplate": template,
                             "backend": "file:///state/team"}, "team")
    assert misplaced_file_backend(spec, "file:///state/team", in_workspace_pods=True) is None
    lost = misplaced_file_backend(spec, "file:///home/strata/state", in_workspace_pods=True)
    assert lost.path == "spec.backend" and "lost with the pod" in lost.problem
    assert "PersistentVolumeClaim" in lost.fix and "'pulumi'" in lost.fix
    assert misplaced_file_backend(spec, "s3://bucket", in_workspace_pods=True) is None


def test_outputs_secret_and_consumed_outputs_parse():
    parsed = parse_stack_spec(with_(outputsSecret={"name": "app.outputs"},
                                    prerequisites=[{"name": "base", "outputs": ["url"]}, {"name": "db"}]), "ns")
    assert parsed.outputs_secret.name == "app.outputs"
    assert [p.outputs for p in parsed.prerequisites] == [["url"], None]


def test_crd_validates_the_outputs_fields_as_the_model_does():
    import re

    crd = yaml.safe_load((CRDS / "pulumi.com_stacks.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    name = schema["properties"]["spec"]["properties"]["outputsSecret"]["properties"]["name"]
    for good in ("out", "app.outputs", "a-1"):
        assert re.fullmatch(name["pattern"], good)
    for bad in ("Bad_Name", "-x", "x-", "a..b"):
        assert not re.fullmatch(name["pattern"], bad)
        with pytest.raises(SpecInvalid):
            parse_stack_spec(with_(outputsSecret={"name": bad}), "ns")
    prereq = schema["properties"]["spec"]["properties"]["prerequisites"]["items"]["properties"]
    assert prereq["outputs"]["minItems"] == 1
    status = schema["properties"]["status"]["properties"]
    assert {"outputsDigest", "outputDigests"} <= set(status)
    assert "prerequisiteDigests" in status["lastUpdate"]["properties"]


def test_env_and_fs_refs_name_their_field_where_the_operator_would_read_its_own_files():
    spec = parse_stack_spec({
        "stack": "dev", "projectRepo": "https://h/r.git", "branch": "main",
        "gitAuth": {"accessToken": {"type": "FS", "filesystem": {"path": "/var/run/token"}}},
        "envRefs": {"A": {"type": "Env", "env": {"name": "HOME"}},
                    "B": {"type": "Secret", "secret": {"name": "s", "key": "k"}}},
        "secretsRef": {"app:key": {"type": "FS", "filesystem": {"path": "/"}}}}, "ns")
    fields = [issue.path for issue in operator_ref_issues(spec, in_workspace_pods=False)]
    assert fields == ["spec.gitAuth.accessToken.type", "spec.envRefs.A.type", "spec.secretsRef.app:key.type"]
    issue = operator_ref_issues(spec, in_workspace_pods=False)[1]
    assert "reads the operator's own environment" in issue.problem and "--operator-refs" in issue.fix
    # In a workspace pod they read the pod's own (PKO v2); the operator still fetches the source itself.
    assert [i.path for i in operator_ref_issues(spec, in_workspace_pods=True)] == ["spec.gitAuth.accessToken.type"]


def test_a_stack_no_operator_has_seen_reads_as_in_progress_to_kstatus():
    crd = yaml.safe_load((CRDS / "pulumi.com_stacks.yaml").read_text())
    for version in crd["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        # observedGeneration -1 never equals a generation: a Kustomization waits for the operator's first verdict.
        assert status["default"] == {"observedGeneration": -1}
