"""The cluster profile's registry: its configuration, the nodes' pull configuration, image references."""

from __future__ import annotations

import tomllib

import pytest

from strata_components.local import realnode, registry
from strata_components.local.toolchain import load_specs


def test_the_registry_is_the_reference_one_built_on_first_use_of_the_cluster_profile():
    spec = load_specs()["registry"]
    assert (spec.module, spec.version, spec.profile) == ("github.com/distribution/distribution/v3", "v3.0.0", "cluster")
    assert spec.packages == {"cmd/registry": "registry"}


def test_the_registry_listens_on_the_bridge_only_and_keeps_its_storage_in_the_state_directory(tmp_path):
    config = registry.build_registry_config(tmp_path / "registry", 35000)
    assert config["http"] == {"addr": f"{realnode.NODE_ADDRESS}:35000"}
    assert config["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "registry")}
    process = registry.registry_process(tmp_path / "registry-bin", tmp_path / "config.yml")
    assert process.argv[1:] == ["serve", str(tmp_path / "config.yml")]


def test_every_node_pulls_from_it_in_plain_http_through_its_registry_host_configuration(tmp_path):
    node = realnode.RealNode(name="real-0", index=0, directory=tmp_path, kubelet_port=1, healthz_port=2)
    containerd = tomllib.loads(realnode.build_containerd_config(node))
    assert containerd["plugins"]["io.containerd.grpc.v1.cri"]["registry"] == {"config_path": str(node.certs_dir)}
    registry.write_containerd_hosts(node.certs_dir, 35000)
    hosts = tomllib.loads((node.certs_dir / f"{realnode.NODE_ADDRESS}:35000" / "hosts.toml").read_text())
    server = f"http://{realnode.NODE_ADDRESS}:35000"
    assert hosts == {"server": server, "host": {server: {"capabilities": ["pull", "resolve"]}}}


def test_image_references_split_into_registry_repository_and_tag():
    assert registry.split_reference("10.88.0.1:5000/fluxcd/source-controller:v1.9.6") == (
        "10.88.0.1:5000", "fluxcd/source-controller", "v1.9.6")
    for bad in ("10.88.0.1:5000/no-tag", "just-a-name:1", "host:1/"):
        with pytest.raises(registry.RegistryError, match="expected HOST:PORT/REPOSITORY:TAG"):
            registry.split_reference(bad)


def test_an_unreachable_registry_names_the_fix():
    with pytest.raises(registry.RegistryError, match=r"registry 127\.0\.0\.1:1 unreachable .*strata local up --profile cluster"):
        registry.manifest_exists("127.0.0.1:1/x/y:1")
