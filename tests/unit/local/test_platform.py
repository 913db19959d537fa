"""The local platform's process plan and port bookkeeping, without starting anything."""

import json

import pytest

from strata_components.local.platform import (DEFAULT_HOST_CONTROLLERS, HOST_CONTROLLERS, PORTS, LocalPlatform,
                                              PlatformConfig, PlatformError, build_git_server_rbac,
                                              start_waves)
from strata_components.local.toolchain import Toolchain


@pytest.fixture
def toolchain(tmp_path):
    entries = {}
    for tool, binaries in {"kubernetes": ["kube-apiserver", "kube-controller-manager", "kube-scheduler"],
                           "etcd": ["etcd"], "kwok": ["kwok"], "source-controller": ["source-controller"],
                           "kustomize-controller": ["kustomize-controller"],
                           "notification-controller": ["notification-controller"]}.items():
        (tmp_path / "tc" / tool / "bin").mkdir(parents=True)
        for binary in binaries:
            (tmp_path / "tc" / tool / "bin" / binary).write_text("")
        entries[tool] = tmp_path / "tc" / tool
    return Toolchain(entries)


def plan(tmp_path, toolchain, controllers):
    platform = LocalPlatform(PlatformConfig(state_dir=tmp_path / "state", host_controllers=controllers), toolchain)
    ports = platform._ports()
    return {process.name: process.argv for process, _ in platform._processes(ports, tmp_path / "bundle")}, ports


def test_notification_controller_runs_first_of_flux_and_receives_the_others_events(tmp_path, toolchain):
    argv, ports = plan(tmp_path, toolchain, HOST_CONTROLLERS)
    names = list(argv)
    assert names.index("notification-controller") < names.index("source-controller")
    events = f"127.0.0.1:{ports['notification_events']}"
    assert f"--events-addr={events}" in argv["notification-controller"]
    assert f"--receiverAddr=127.0.0.1:{ports['notification_receiver']}" in argv["notification-controller"]
    for controller in ("source-controller", "kustomize-controller"):
        assert f"--events-addr=http://{events}/" in argv[controller]
    assert LocalPlatform(PlatformConfig(state_dir=tmp_path / "state"), toolchain).info().flux_events_url == \
        f"http://{events}/"


def test_without_notification_controller_flux_sends_no_events(tmp_path, toolchain):
    argv, _ = plan(tmp_path, toolchain, DEFAULT_HOST_CONTROLLERS)
    assert "notification-controller" not in argv
    assert "--events-addr=" in argv["source-controller"] and "--events-addr=" in argv["kustomize-controller"]


def test_a_platform_from_before_a_new_component_keeps_its_ports(tmp_path, toolchain):
    state = tmp_path / "state"
    state.mkdir()
    old = {name: 20000 + index for index, name in enumerate(PORTS) if not name.startswith("notification_")}
    (state / "platform.json").write_text(json.dumps({"ports": old}))
    ports = LocalPlatform(PlatformConfig(state_dir=state), toolchain)._ports()
    assert set(ports) == set(PORTS) and {k: ports[k] for k in old} == old
    assert len(set(ports.values())) == len(PORTS)  # the new ones collide with none
    assert json.loads((state / "platform.json").read_text())["ports"] == ports


def test_the_operator_gets_free_ports_of_its_own_kept_across_restarts_and_shown_with_its_state(tmp_path, toolchain):
    state = tmp_path / "state"
    state.mkdir()
    # A platform from before the operator's ports were kept: they are added, the others stay.
    old = {name: 21000 + index for index, name in enumerate(PORTS) if not name.startswith("operator_")}
    (state / "platform.json").write_text(json.dumps({"ports": old}))
    platform = LocalPlatform(PlatformConfig(state_dir=state), toolchain)
    ports = platform.controller_ports("strata-operator")
    assert set(ports) == {"operator_metrics", "operator_health"}
    assert not set(ports.values()) & {8383, 8384} and not set(ports.values()) & set(old.values())
    again = LocalPlatform(PlatformConfig(state_dir=state), toolchain)
    assert again.controller_ports("strata-operator") == ports and again.ports() == {**old, **ports}
    assert "strata-operator" not in again.status()  # never started here: not a process of this platform
    (again.run_dir).mkdir(parents=True)
    (again.run_dir / "strata-operator.json").write_text(json.dumps({"pid": 2 ** 22 + 1, "argv0": "/bin/false"}))
    assert again.status()["strata-operator"] is False  # started, now dead: shown


def test_unknown_host_controllers_are_refused(tmp_path, toolchain):
    with pytest.raises(PlatformError, match="unknown host controllers \\['helm-controller'\\]"):
        LocalPlatform(PlatformConfig(state_dir=tmp_path, host_controllers=("helm-controller",)), toolchain)


def test_flux_runs_locked_down_and_the_git_server_under_an_identity_of_its_own(tmp_path, toolchain):
    argv, _ = plan(tmp_path, toolchain, HOST_CONTROLLERS)
    assert {"--no-cross-namespace-refs=true", "--no-remote-bases=true", "--default-service-account=default"} <= set(
        argv["kustomize-controller"])
    assert "--no-cross-namespace-refs=true" in argv["notification-controller"]
    # Not the admin kubeconfig: a client certificate whose RBAC patches GitRepositories and nothing else.
    assert f"--kubeconfig={tmp_path / 'state' / 'kubeconfigs' / 'git-server.kubeconfig'}" in argv["git-server"]
    role, binding = build_git_server_rbac()
    assert role["rules"] == [{"apiGroups": ["source.toolkit.fluxcd.io"], "resources": ["gitrepositories"],
                              "verbs": ["list", "patch"]}]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "strata:git-server"}]


def test_an_unknown_profile_is_refused_naming_the_choices(tmp_path, toolchain):
    with pytest.raises(PlatformError, match=r"unknown profile 'prod'; choose from \['dev', 'cluster'\]"):
        LocalPlatform(PlatformConfig(state_dir=tmp_path, profile="prod"), toolchain)


def test_the_cluster_profile_has_at_least_two_real_nodes_and_dev_none_unless_asked():
    assert PlatformConfig(profile="cluster").real_node_count == 2
    assert PlatformConfig(profile="cluster", real_nodes=3).real_node_count == 3
    assert PlatformConfig().real_node_count == 0 and PlatformConfig(real_nodes=1).real_node_count == 1


def test_a_taken_kube_proxy_port_is_one_error_naming_the_port_and_the_fix(tmp_path, toolchain):
    import socket

    platform = LocalPlatform(PlatformConfig(state_dir=tmp_path, profile="cluster"), toolchain)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PlatformError) as error:
            platform._check_port_free(port, "kube-proxy", tmp_path / "nodes" / "kube-proxy.json")
    message = str(error.value)
    assert f"port {port} (kube-proxy) is already in use on 127.0.0.1" in message
    assert str(tmp_path / "nodes" / "kube-proxy.json") in message and "\n" not in message


def test_the_control_plane_starts_one_by_one_and_everything_else_at_once(tmp_path, toolchain):
    argv, _ = plan(tmp_path, toolchain, HOST_CONTROLLERS)
    waves = start_waves(list(argv))
    assert waves[:2] == [["etcd"], ["kube-apiserver"]]
    assert waves[2] == [name for name in argv if name not in ("etcd", "kube-apiserver")]
    assert len(waves) == 3 and waves[2].index("notification-controller") < waves[2].index("source-controller")


def test_start_waves_keep_only_the_processes_given():
    assert start_waves(["etcd", "kube-apiserver"]) == [["etcd"], ["kube-apiserver"]]
    assert start_waves(["kwok", "git-server"]) == [["kwok", "git-server"]]
