"""Stack spec validation: every bad spec names its field; the CRD schema agrees with the models."""

from pathlib import Path

import pytest
import yaml

from strata_operator.spec import SpecInvalid, StackSpec, not_applicable_fields, parse_program, parse_stack_spec

CRDS = Path(__file__).resolve().parents[3] / "operator" / "strata_operator" / "crds"
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
    ("two sources", with_(programRef={"name": "p"}), "spec"),
    ("three sources", with_(programRef={"name": "p"}, fluxSource={"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}), "spec"),
    ("commit and branch", with_(branch="main"), "spec.commit"),
    ("neither commit nor branch", with_(commit=None), "spec.branch"),
    ("commit not a sha", with_(commit="main"), "spec.commit"),
    ("repo not a url", with_(projectRepo="not a url"), "spec.projectRepo"),
    ("absolute repoDir", with_(repoDir="/etc"), "spec.repoDir"),
    ("escaping repoDir", with_(repoDir="../x"), "spec.repoDir"),
    ("branch without repo", {"stack": "dev", "programRef": {"name": "p"}, "branch": "main"}, "spec.branch"),
    ("gitAuth without repo", {"stack": "dev", "programRef": {"name": "p"}, "gitAuth": {"accessToken": SECRET}},
     "spec.gitAuth"),
    ("two git auth modes", with_(gitAuth={"accessToken": SECRET, "basicAuth": {"userName": SECRET, "password": SECRET}}),
     "spec.gitAuth"),
    ("empty gitAuth", with_(gitAuth={}), "spec.gitAuth"),
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
    ("flux kind unknown", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmChart", "name": "r"}}}, "spec.fluxSource.sourceRef.kind"),
    ("flux api not flux", {"stack": "dev", "fluxSource": {"sourceRef": {
        "apiVersion": "apps/v1", "kind": "GitRepository", "name": "r"}}}, "spec.fluxSource.sourceRef.apiVersion"),
    ("flux without sourceRef", {"stack": "dev", "fluxSource": {"dir": "x"}}, "spec.fluxSource.sourceRef"),
    ("flux escaping dir", {"stack": "dev", "fluxSource": {"dir": "../..", "sourceRef": {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}}, "spec.fluxSource.dir"),
    ("programRef bad name", {"stack": "dev", "programRef": {"name": "Not_A_Name"}}, "spec.programRef.name"),
    ("programRef without name", {"stack": "dev", "programRef": {}}, "spec.programRef.name"),
    ("target not a URN", with_(targets=["bucket"]), "spec.targets[0]"),
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
]


@pytest.mark.parametrize("spec,field", [(s, f) for _, s, f in BAD_SPECS], ids=[n for n, _, _ in BAD_SPECS])
def test_bad_spec_is_rejected_naming_its_field(spec, field):
    with pytest.raises(SpecInvalid) as caught:
        parse_stack_spec(spec, namespace="team")
    assert field in caught.value.fields, f"{field} not among {caught.value.fields}"
    assert "fix:" in str(caught.value)


def test_there_are_at_least_30_bad_specs():
    assert len(BAD_SPECS) >= 30


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
    assert any("exactly one source" in r["message"] for r in rules)
