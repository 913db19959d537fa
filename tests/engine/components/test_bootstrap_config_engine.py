"""The bootstrap program's config handling, fed real stack config by the engine.

The program body below is what __main__.py does with config, minus the components (they need the
kubernetes provider plugin): read `strata:*` with pulumi.Config and turn it into args with
strata_components.bootstrap_config. Config comes from the repository's own Pulumi.dev.yaml, and from
`set_all_config` with paths as `pulumi config set --path` writes it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pulumi import automation as auto

from tests.engine.workspace import inline_stack

ROOT = Path(__file__).resolve().parents[3]
BUNDLE_URL = "http://127.0.0.1:41001"
GIT_URL = "http://127.0.0.1:41002"
PUBLISHED = (f"{GIT_URL}/strata.git", "a" * 40)


def bootstrap_config_program():
    import pulumi

    from strata_components.bootstrap_config import (cluster_args, flux_args, operator_args, platform_stack_spec,
                                                    project_repo_args)
    from strata_components.layers import this_stack
    from strata_components.stack import build_stack_spec

    config = pulumi.Config()
    cluster = cluster_args(config.get_object("cluster") or {})
    local = cluster["mode"] == "local"
    flux = flux_args(config.get_object("flux") or {}, None, cluster, bundle_url=BUNDLE_URL if local else None)
    operator = operator_args(config.get_object("operator") or {}, None, cluster, server="https://127.0.0.1:6443",
                             command=["python", "-m", "strata_operator"])
    platform = config.get_object("platform") or {}
    repo = project_repo_args(platform, cluster, GIT_URL if local else None, "/srv/strata")
    spec = platform_stack_spec(platform, this_stack(), config.get_object("teams") or [],
                               PUBLISHED if repo is not None else None)
    pulumi.export("projectRepo", repo)
    pulumi.export("cluster", cluster)
    pulumi.export("flux", {key: value for key, value in flux.items() if key != "provider"})
    pulumi.export("operator", {key: value for key, value in operator.items() if key != "provider"})
    pulumi.export("platformStack", build_stack_spec(spec))


def test_the_dev_stack_file_configures_the_local_embedded_default(toolchain, pulumi_env, file_backend, tmp_path):
    shutil.copy(ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
    stack = inline_stack(toolchain, pulumi_env, file_backend, "strata", "dev", bootstrap_config_program,
                         work_dir=tmp_path)
    out = {name: value.value for name, value in stack.up().outputs.items()}

    assert out["cluster"] == {"mode": "local", "local": {
        "state_dir": "~/.local/state/strata/platform", "nodes": 1,
        "host_controllers": ["source-controller", "kustomize-controller"]}}
    # No fixed ports in the stack file: the bundle URL is the platform's.
    assert out["flux"] == {"version": "v2.9.5", "components": ["source-controller", "kustomize-controller"],
                           "baseurl": BUNDLE_URL, "host_controllers": ["source-controller", "kustomize-controller"]}
    assert out["operator"]["mode"] == "local" and out["operator"]["namespace"] == "strata-system"
    assert out["operator"]["local"]["state_dir"] == "~/.local/state/strata/platform"
    # No repo configured: the program's own directory is published to the platform's git server.
    assert out["projectRepo"] == {"state_dir": "~/.local/state/strata/platform", "git_url": GIT_URL,
                                  "source_dir": "/srv/strata"}
    spec = out["platformStack"]
    assert (spec["projectRepo"], spec["commit"]) == PUBLISHED and "branch" not in spec
    assert spec["repoDir"] == "programs/platform" and spec["stack"] == "organization/strata-platform/dev"
    # The name the engine gives this stack is the one the platform layer references.
    assert spec["config"]["strata-platform:bootstrapStack"] == "organization/strata/dev"
    assert spec["config"]["strata-platform:teams"] == '[{"name": "alpha", "readNamespaces": []}, ' \
                                                      '{"name": "beta", "readNamespaces": []}]'
    # `~` expanded for the user running the bootstrap: the operator's updates have a HOME of their own.
    assert spec["backend"] == f"file://{Path.home()}/.local/state/strata/pulumi"
    assert spec["secretsProvider"] == "passphrase"
    assert "127.0.0.1:" not in (ROOT / "Pulumi.dev.yaml").read_text()  # no fixed loopback ports


def test_path_config_for_an_existing_cluster(toolchain, pulumi_env, file_backend):
    stack = inline_stack(toolchain, pulumi_env, file_backend, "strata", "prod", bootstrap_config_program)
    stack.set_all_config({"cluster.mode": auto.ConfigValue("existing"),
                          "cluster.existing.kubeconfigPath": auto.ConfigValue("~/.kube/config"),
                          "operator.image": auto.ConfigValue("ghcr.io/acme/strata-operator:0.1.0"),
                          "platform.repo": auto.ConfigValue("https://git.example/strata.git"),
                          "teams[0].name": auto.ConfigValue("alpha")}, path=True)
    out = {name: value.value for name, value in stack.up().outputs.items()}

    assert out["cluster"] == {"mode": "existing", "existing": {"kubeconfig_path": "~/.kube/config"}}
    assert out["flux"] == {"version": "v2.9.5"}  # GitHub releases, every controller as a Deployment
    assert out["operator"] == {"namespace": "strata-system", "mode": "in-cluster",
                               "image": "ghcr.io/acme/strata-operator:0.1.0"}
    assert out.get("projectRepo") is None  # a configured repo is used as is
    spec = out["platformStack"]
    assert spec["projectRepo"] == "https://git.example/strata.git" and spec["branch"] == "main"
    assert spec["config"]["strata-platform:bootstrapStack"] == "organization/strata/prod"


def test_outside_local_mode_a_missing_platform_repo_is_named(toolchain, pulumi_env, file_backend):
    stack = inline_stack(toolchain, pulumi_env, file_backend, "strata", "prod", bootstrap_config_program)
    stack.set_all_config({"cluster.mode": auto.ConfigValue("existing"),
                          "cluster.existing.kubeconfig": auto.ConfigValue("apiVersion: v1"),
                          "platform.dir": auto.ConfigValue("programs/platform")}, path=True)
    with pytest.raises(auto.errors.CommandError, match=r"strata:platform\.repo is required outside local"):
        stack.up()
