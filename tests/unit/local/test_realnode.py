"""What a real node is configured with: pure builders, no host changes."""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest
import yaml

from strata_components.local import realnode


def _node(tmp_path: Path, index: int = 0) -> realnode.RealNode:
    return realnode.RealNode(name=f"real-{index}", index=index, directory=tmp_path / "nodes" / f"real-{index}",
                             kubelet_port=40001, healthz_port=40002)


def test_containerd_owns_nothing_outside_its_node_and_runs_sandboxes_without_cap_sys_resource(tmp_path):
    node = _node(tmp_path)
    config = realnode.build_containerd_config(node)
    paths = [line.split('"')[1] for line in config.splitlines() if '= "/' in line]
    assert paths and all(p.startswith((str(node.directory), str(node.runtime_dir), "/usr/lib/cni")) for p in paths)
    assert "restrict_oom_score_adj = true" in config and "SystemdCgroup = false" in config
    assert f'sandbox_image = "{realnode.PAUSE_IMAGE}"' in config
    # A unix socket path may not exceed 107 bytes however deep the state directory is.
    deep = realnode.RealNode(name="real-0", index=0, directory=tmp_path / ("x" * 200), kubelet_port=1, healthz_port=2)
    assert len(str(deep.containerd_socket) + ".ttrpc") < 108


def test_each_node_hands_out_pod_addresses_from_its_own_range_on_the_shared_bridge(tmp_path):
    ranges = []
    for index in range(3):
        (plugin, loopback) = realnode.build_cni_config(_node(tmp_path, index))["plugins"]
        assert plugin["bridge"] == realnode.BRIDGE and loopback == {"type": "loopback"}
        (subnet,) = plugin["ipam"]["ranges"][0]
        assert subnet["gateway"] == realnode.NODE_ADDRESS
        start, end = ipaddress.ip_address(subnet["rangeStart"]), ipaddress.ip_address(subnet["rangeEnd"])
        assert start in ipaddress.ip_network(subnet["subnet"]) and end in ipaddress.ip_network(subnet["subnet"])
        ranges.append((start, end))
        assert plugin["ipam"]["dataDir"].startswith(str(tmp_path))
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), ranges


def test_kubelet_lets_in_only_certificate_or_rbac_checked_callers_and_taints_its_node(tmp_path):
    node = _node(tmp_path)
    config = realnode.build_kubelet_config(node, tmp_path / "ca.crt")
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"} and config["readOnlyPort"] == 0
    assert config["cgroupDriver"] == "cgroupfs" and config["cgroupRoot"] == "/strata-real-0"
    assert config["failCgroupV1"] is False and config["makeIPTablesUtilChains"] is False
    assert config["registerWithTaints"] == [realnode.TAINT]
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    argv = realnode.kubelet_process(node, Path("/bin/kubelet")).argv
    assert f"--node-ip={realnode.NODE_ADDRESS}" in argv and f"--root-dir={node.directory / 'kubelet'}" in argv


def test_every_pod_on_a_real_node_has_a_pid_limit(tmp_path):
    """The kubelet's podPidsLimit, as the node's kubelet.yaml says it: Kubernetes has no per-pod field."""
    rendered = yaml.safe_load(yaml.safe_dump(realnode.build_kubelet_config(_node(tmp_path), tmp_path / "ca.crt")))
    assert rendered["podPidsLimit"] == realnode.POD_PIDS_LIMIT == 4096


def test_the_toleration_matches_the_taint():
    taint, toleration = realnode.TAINT, realnode.TOLERATION
    assert (toleration["key"], toleration["value"], toleration["effect"]) == (taint["key"], taint["value"],
                                                                               taint["effect"])


def test_missing_requirements_name_the_fix(monkeypatch):
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(realnode.shutil, "which", lambda tool: None if tool in ("containerd", "ctr") else "/bin/x")
    missing = realnode.missing_requirements(None)
    assert any("root" in line for line in missing)
    assert any("apt-get install -y containerd" in line for line in missing)
    assert any("make setup" in line for line in missing)


@pytest.mark.parametrize("count", [0, 8])
def test_real_node_count_bounds_are_accepted(count):
    from strata_components.cluster import validate_cluster_args

    validate_cluster_args({"mode": "local", "local": {"state_dir": "/tmp/x", "real_nodes": count}})


def test_too_many_real_nodes_is_refused_naming_the_field():
    from strata_components.cluster import validate_cluster_args

    with pytest.raises(ValueError, match="real_nodes"):
        validate_cluster_args({"mode": "local", "local": {"state_dir": "/tmp/x", "real_nodes": 9}})


def test_a_state_directory_too_long_for_kubelets_sockets_is_named_with_the_length_that_fits():
    assert realnode.socket_path_problem(Path("/root/.local/state/strata/platform"), 2) is None
    state = Path("/tmp/" + "x" * 80)
    problem = realnode.socket_path_problem(state, 2)
    assert problem and str(state) in problem and "STRATA_HOME" in problem and "at most 107" in problem
    fits = int(problem.split("use one of at most ")[1].split()[0])
    assert realnode.socket_path_problem(Path("/" + "x" * (fits - 1)), 2) is None
    assert realnode.socket_path_problem(Path("/" + "x" * fits), 2) is not None
