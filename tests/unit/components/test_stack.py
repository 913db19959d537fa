"""Stack and Program: typed args rendered to the pulumi.com/v1 wire format; invalid specs rejected."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pytest

from strata_components.stack import Program, Stack, build_program_body, build_stack_spec


def test_stack_spec_camelcases_fields_but_keeps_user_keys():
    spec = build_stack_spec({
        "stack": "org/app/dev", "project_repo": "https://git.example/app.git", "branch": "main",
        "repo_dir": "infra", "git_auth": {"basic_auth": {"user_name": {"type": "Literal", "literal": {"value": "u"}},
                                                         "password": {"type": "Secret",
                                                                      "secret": {"name": "git", "key": "pw"}}}},
        "config": {"aws:region": "eu-west-1", "app:replica_count": "2"},
        "env_refs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pp", "key": "passphrase"}}},
        "secrets_ref": {"app:db_password": {"type": "Secret", "secret": {"name": "db", "key": "password"}}},
        "prerequisites": [{"name": "base", "requirement": {"succeeded_within_duration": "1h"}}],
        "destroy_on_finalize": True, "resync_frequency_seconds": 120, "service_account_name": "team-a",
    })
    assert spec == {
        "stack": "org/app/dev", "projectRepo": "https://git.example/app.git", "branch": "main", "repoDir": "infra",
        "gitAuth": {"basicAuth": {"userName": {"type": "Literal", "literal": {"value": "u"}},
                                  "password": {"type": "Secret", "secret": {"name": "git", "key": "pw"}}}},
        "config": {"aws:region": "eu-west-1", "app:replica_count": "2"},
        "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {"name": "pp", "key": "passphrase"}}},
        "secretsRef": {"app:db_password": {"type": "Secret", "secret": {"name": "db", "key": "password"}}},
        "prerequisites": [{"name": "base", "requirement": {"succeededWithinDuration": "1h"}}],
        "destroyOnFinalize": True, "resyncFrequencySeconds": 120, "serviceAccountName": "team-a",
    }


def test_flux_source_and_program_ref_render():
    flux = build_stack_spec({"stack": "s", "flux_source": {"source_ref": {"api_version": "source.toolkit.fluxcd.io/v1",
                                                                          "kind": "GitRepository", "name": "r"},
                                                           "dir": "app"}})
    assert flux["fluxSource"] == {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
                                                "name": "r"}, "dir": "app"}
    assert build_stack_spec({"stack": "s", "program_ref": {"name": "p"}})["programRef"] == {"name": "p"}


@pytest.mark.parametrize("spec, message", [
    ({"project_repo": "r", "branch": "b"}, "`stack` is required"),
    ({"stack": "s"}, "exactly one source"),
    ({"stack": "s", "project_repo": "r", "program_ref": {"name": "p"}, "branch": "b"}, "exactly one source"),
    ({"stack": "s", "project_repo": "r"}, "commit` or `branch"),
    ({"stack": "s", "project_repo": "r", "commit": "c", "branch": "b"}, "commit` or `branch"),
    ({"stack": "s", "program_ref": {"name": "p"}, "branch": "b"}, "only apply with project_repo"),
    ({"stack": "s", "program_ref": {"name": "p"}, "resync_frequency_seconds": 30}, "at least 60"),
])
def test_invalid_stack_specs_name_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        build_stack_spec(spec)


def test_program_body_keeps_pulumi_yaml_names():
    body = build_program_body({"resources": {"myBucket": {"type": "pulumi:index:Stash", "properties": {"input": 1}}},
                               "outputs": {"bucketName": "${myBucket.output}"}})
    assert body == {"resources": {"myBucket": {"type": "pulumi:index:Stash", "properties": {"input": 1}}},
                    "outputs": {"bucketName": "${myBucket.output}"}}
    with pytest.raises(ValueError, match="unknown sections"):
        build_program_body({"resources": {"a": {}}, "imports": {}})
    with pytest.raises(ValueError, match="at least one"):
        build_program_body({"variables": {}})


def test_stack_and_program_register_pulumi_com_objects(harness):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="apiVersion: v1\nkind: Config\n")
        code = Program("hello", {"namespace": "apps", "program": {"resources": {"s": {"type": "pulumi:index:Stash",
                                                                                       "properties": {"input": "x"}}}}},
                       pulumi.ResourceOptions(provider=provider))
        Stack("hello", {"namespace": "apps", "name": "hello-dev", "labels": {"team": "a"},
                        "spec": {"stack": "dev", "program_ref": {"name": "hello"}, "backend": "file:///state"}},
              pulumi.ResourceOptions(provider=provider, depends_on=[code]))

    harness.run(program)
    stack = harness.one("kubernetes:pulumi.com/v1:Stack")
    code = harness.one("kubernetes:pulumi.com/v1:Program")
    assert stack.inputs["apiVersion"] == "pulumi.com/v1" and stack.inputs["kind"] == "Stack"
    assert stack.inputs["metadata"] == {"name": "hello-dev", "namespace": "apps", "labels": {"team": "a"}}
    assert stack.inputs["spec"] == {"stack": "dev", "programRef": {"name": "hello"}, "backend": "file:///state"}
    assert code.inputs["program"]["resources"]["s"]["type"] == "pulumi:index:Stash"
    assert "spec" not in code.inputs and code.inputs["metadata"]["name"] == "hello"
    assert code.urn in stack.dependencies
