"""The bootstrap program's config -> component args, alone (the engine tier feeds them real stack config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_components.bootstrap_config import (cluster_args, flux_args, flux_sync_args, operator_args,
                                                platform_stack_spec, project_repo_args, resolve_backend_url,
                                                validate_team_buckets)

PROVIDER = None  # carried through untouched; the component tests cover what a provider does


def test_local_defaults_take_the_bundle_url_of_the_platform_and_leave_host_controllers_out():
    cluster = cluster_args({})
    assert cluster == {"mode": "local", "local": {"state_dir": "~/.local/state/strata/platform", "nodes": 1,
                                                  "host_controllers": ["source-controller", "kustomize-controller"]}}
    flux = flux_args({"components": ["source-controller"]}, PROVIDER, cluster, bundle_url="http://127.0.0.1:5")
    assert flux["baseurl"] == "http://127.0.0.1:5" and flux["version"] == "v2.9.5"
    assert flux["host_controllers"] == ["source-controller", "kustomize-controller"]
    assert flux_args({"baseurl": "http://mirror"}, PROVIDER, cluster, bundle_url="http://127.0.0.1:5")["baseurl"] \
        == "http://mirror"
    operator = operator_args({}, PROVIDER, cluster, server="https://127.0.0.1:6", command=["py", "-m", "op"])
    assert operator["mode"] == "local" and operator["namespace"] == "strata-system"
    assert operator["local"] == {"state_dir": "~/.local/state/strata/platform", "server": "https://127.0.0.1:6",
                                 "command": ["py", "-m", "op"]}


def test_existing_cluster_runs_the_operator_in_cluster_and_flux_from_github():
    cluster = cluster_args({"mode": "existing", "existing": {"kubeconfigPath": "~/.kube/config", "context": "prod"}})
    assert cluster["existing"] == {"kubeconfig_path": "~/.kube/config", "context": "prod"}
    flux = flux_args({}, PROVIDER, cluster)
    assert "baseurl" not in flux and "host_controllers" not in flux
    air_gapped = flux_args({"registry": "10.88.0.1:5000/fluxcd", "imagePullSecret": "regcred"}, PROVIDER, cluster)
    assert (air_gapped["registry"], air_gapped["image_pull_secret"]) == ("10.88.0.1:5000/fluxcd", "regcred")
    operator = operator_args({"image": "ghcr.io/acme/op:1"}, PROVIDER, cluster, server="s", command=["x"])
    assert operator["mode"] == "in-cluster" and operator["image"] == "ghcr.io/acme/op:1" and "local" not in operator
    scaled = operator_args({"image": "i", "replicas": 2, "shards": ["shard1", "shard2"]}, PROVIDER, cluster,
                           server="s", command=["x"])
    assert (scaled["replicas"], scaled["shards"]) == (2, ["shard1", "shard2"])


def test_platform_stack_follows_a_configured_repo_or_pins_the_published_commit():
    configured = platform_stack_spec({"repo": "https://git.example/strata.git"}, "organization/strata/prod", [])
    assert configured["project_repo"] == "https://git.example/strata.git" and configured["branch"] == "main"
    assert "commit" not in configured
    published = platform_stack_spec({"backend": "file:///s"}, "organization/strata/dev", [{"name": "alpha"}],
                                    ("http://127.0.0.1:7/strata.git", "abc123"))
    assert (published["project_repo"], published["commit"]) == ("http://127.0.0.1:7/strata.git", "abc123")
    assert "branch" not in published and published["secrets_provider"] == "passphrase"
    assert published["config"]["strata-platform:backend"] == "file:///s"


def test_platform_stack_without_a_source_names_the_key_to_set():
    with pytest.raises(ValueError, match=r"strata:platform\.repo is required"):
        platform_stack_spec({}, "organization/strata/prod", [])


def test_flux_sync_without_url_names_the_field():
    with pytest.raises(ValueError, match=r"strata:flux\.sync needs `url`"):
        flux_sync_args({"sync": {"branch": "main"}}, PROVIDER, None, {})


def test_flux_sync_defaults_to_this_projects_repository():
    args = flux_sync_args({"sync": {"path": "clusters/dev"}}, PROVIDER, "http://git/strata.git", {"A": "b"})
    assert args == {"provider": PROVIDER, "url": "http://git/strata.git", "branch": "main", "path": "clusters/dev",
                    "namespace": "flux-system", "substitute": {"A": "b"}}
    assert flux_sync_args({}, PROVIDER, "http://git/strata.git", {}) is None


def test_the_project_is_published_only_for_a_local_cluster_without_a_configured_repo():
    local, existing = cluster_args({}), cluster_args({"mode": "existing", "existing": {"kubeconfig": "k"}})
    assert project_repo_args({}, local, "http://127.0.0.1:9", "/src") == {
        "state_dir": "~/.local/state/strata/platform", "git_url": "http://127.0.0.1:9", "source_dir": "/src"}
    assert project_repo_args({"sourceDir": "/elsewhere"}, local, "http://g", "/src")["source_dir"] == "/elsewhere"
    assert project_repo_args({"repo": "https://git.example/s.git"}, local, "http://g", "/src") is None
    assert project_repo_args({}, existing, None, "/src") is None


def test_a_home_relative_file_backend_is_expanded_for_the_operator(monkeypatch, tmp_path):
    # The operator runs updates with HOME set to the Stack's own directory: `~` must mean the
    # bootstrap user's home before it reaches the Stack, or the platform cannot find this stack.
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = platform_stack_spec({"backend": "file://~/.local/state/strata/pulumi"}, "organization/strata/dev", [],
                               ("http://127.0.0.1:7/strata.git", "abc123"))
    expected = f"file://{tmp_path}/.local/state/strata/pulumi"
    assert spec["backend"] == expected and spec["config"]["strata-platform:backend"] == expected
    assert Path(spec["backend"].removeprefix("file://")).is_absolute()
    for unchanged in ("file:///srv/state", "s3://bucket/state", "https://api.pulumi.com"):
        assert resolve_backend_url(unchanged) == unchanged


def test_the_cluster_stack_template_becomes_an_in_cluster_pod_executor_and_placed_flux():
    """Pulumi.cluster.yaml as committed: every key it sets reaches the components' args."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[3] / "Pulumi.cluster.yaml").read_text())["config"]
    cluster = cluster_args(config["strata:cluster"])
    flux = flux_args(config["strata:flux"], PROVIDER, cluster)
    assert flux["node_selector"] == {"type": "real"} and flux["tolerations"][0]["key"] == "strata.dev/real-node"
    operator = operator_args(config["strata:operator"], PROVIDER, cluster, server="s", command=["x"])
    assert (operator["mode"], operator["replicas"], operator["executor"]) == ("in-cluster", 2, "pod")
    assert operator["node_selector"] == operator["workspace_node_selector"] == {"type": "real"}
    assert operator["tolerations"] and operator["workspace_tolerations"]


def test_an_object_store_backend_gives_the_platform_stack_its_credentials_by_secret_reference_only():
    spec = platform_stack_spec({"repo": "https://git.example/strata.git", "backend": "s3://state?region=eu-west-1",
                                "backendSecret": "strata-object-store"}, "organization/strata/cluster", [])
    assert spec["backend"] == "s3://state?region=eu-west-1"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert spec["env_refs"][key] == {"type": "Secret", "secret": {"name": "strata-object-store", "key": key}}
    assert "AWS_ACCESS_KEY_ID" not in platform_stack_spec({"repo": "r"}, "o/s/p", [])["env_refs"]
    # It runs daily, so the teams' state credentials it mints are rotated in time.
    assert spec["continue_resync_on_commit_match"] is True and spec["resync_frequency_seconds"] == 86400


def test_a_team_name_too_long_for_its_state_bucket_is_named_at_the_bootstrap():
    settings = {"backend": "s3://pulumi-state?endpoint=http://10.88.0.1:9000", "backendSecret": "strata-object-store"}
    validate_team_buckets(settings, [{"name": "alpha"}, {"name": "beta"}])
    with pytest.raises(ValueError, match=r"^strata:teams\[1\] \(a{50}\): the team's state bucket .*fix: give the "
                                         r"team a name of at most 45 characters"):
        validate_team_buckets(settings, [{"name": "alpha"}, {"name": "a" * 50}])
    # Without the store's credentials for the platform, teams keep a prefix of its bucket: no bucket to name.
    validate_team_buckets({"backend": settings["backend"]}, [{"name": "a" * 50}])
