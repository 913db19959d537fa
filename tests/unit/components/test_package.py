"""The component package's schema, as Pulumi infers it from the components' typed args and outputs
(the same analysis `pulumi package add` runs through the plugin), and the enums other languages send."""

import pytest
from pulumi.provider.experimental.analyzer import Analyzer

from strata_components.cluster import ClusterMode, validate_cluster_args
from strata_components.operator import OperatorMode, build_operator_objects
from strata_components.package import COMPONENTS, PACKAGE_NAME
from strata_components.stack import ResourceRefType, build_stack_spec

KUBERNETES_PROVIDER = "/kubernetes/v4.34.2/schema.json#/resources/pulumi:providers:kubernetes"


@pytest.fixture(scope="module")
def analyzed():
    return Analyzer(PACKAGE_NAME).analyze(COMPONENTS)


def test_the_six_components_are_the_package(analyzed):
    assert sorted(analyzed["component_definitions"]) == ["Cluster", "Flux", "Operator", "Program", "Stack",
                                                         "TeamEnvironment"]
    assert [(d.name, d.version) for d in analyzed["dependencies"]] == [("kubernetes", "4.34.2")]


def test_args_are_typed_with_their_docs(analyzed):
    team = analyzed["component_definitions"]["TeamEnvironment"]
    assert team.inputs["provider"].ref == KUBERNETES_PROVIDER and not team.inputs["provider"].optional
    assert team.inputs["team"].type.value == "string" and not team.inputs["team"].optional
    assert team.inputs["readNamespaces"].optional and team.inputs["readNamespaces"].type.value == "array"
    assert team.inputs["server"].description == "API server URL written into the team's kubeconfig."
    assert sorted(team.outputs) == ["kubeconfig", "namespace", "serviceAccount", "stateCredentials", "token"]

    stack = analyzed["component_definitions"]["Stack"]
    assert stack.inputs["spec"].ref == "#/types/strata:index:StackSpec"
    assert stack.inputs["namespace"].plain is None, "a namespace may come from another resource's output"
    spec = analyzed["type_definitions"]["StackSpec"]
    assert spec.properties_mapping["programRef"] == "program_ref"
    assert spec.properties["envRefs"].additional_properties.ref == "#/types/strata:index:ResourceRef"
    assert [m.value for m in analyzed["type_definitions"]["ResourceRefType"].enum] == ["Literal", "Secret", "Env",
                                                                                        "FS"]


def test_cluster_outputs_carry_the_provider_and_the_local_platforms_urls(analyzed):
    cluster = analyzed["component_definitions"]["Cluster"]
    assert cluster.inputs["mode"].ref == "#/types/strata:index:ClusterMode"
    assert cluster.outputs["provider"].ref == KUBERNETES_PROVIDER
    assert cluster.outputs["gitUrl"].optional and cluster.outputs["fluxBundleUrl"].optional


def test_enum_members_from_other_languages_work_like_the_strings_python_callers_pass():
    validate_cluster_args({"mode": ClusterMode.EXISTING, "existing": {"kubeconfig": "x"}})
    with pytest.raises(ValueError, match="cluster mode 'local' needs its settings under `local`"):
        validate_cluster_args({"mode": ClusterMode.LOCAL})
    spec = build_stack_spec({"stack": "dev", "program_ref": {"name": "p"},
                             "env_refs": {"TOKEN": {"type": ResourceRefType.SECRET,
                                                    "secret": {"name": "s", "key": "k"}}}})
    assert spec["envRefs"]["TOKEN"] == {"type": "Secret", "secret": {"name": "s", "key": "k"}}
    assert type(spec["envRefs"]["TOKEN"]["type"]) is str
    objects = build_operator_objects({"provider": None, "mode": OperatorMode.LOCAL}, [
        {"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": []}])
    assert objects[-1]["kind"] == "Secret"
