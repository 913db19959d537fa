from strata_components.local import preflight


def test_everything_missing_is_named_with_the_exact_command_that_installs_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(preflight, "plugin_hosts_reachable", lambda: False)
    missing = preflight.missing_dev_stack_requirements()
    assert len(missing) == 3
    assert "pulumi-language-python" in missing[0] and "https://get.pulumi.com" in missing[0]
    assert missing[1].endswith("pulumi plugin install resource kubernetes v4.34.2")
    # pulumi-flux's plugin is not on Pulumi's default server: the advice names the one its package does.
    assert missing[2].endswith("pulumi plugin install resource flux v1.0.1 --server github://api.github.com/oun")
    assert preflight.main() == 1


def test_offline_a_missing_plugin_is_an_error_online_a_warning():
    plugins = ["the flux provider plugin: pulumi plugin install resource flux v1.0.1 --server x"]
    code, lines = preflight.report([], plugins, online=False)
    assert code == 1 and "(offline)" in lines[0] and plugins[0] in lines[1]
    code, lines = preflight.report([], plugins, online=True)
    assert code == 0 and lines[0].startswith("warning:") and "online" in lines[0] and plugins[0] in lines[1]


def test_a_missing_language_host_stops_make_up_even_online():
    code, lines = preflight.report(["the Pulumi Python language host: install it"], [], online=True)
    assert code == 1 and lines[0].startswith("error:") and "(online)" in lines[0]


def test_a_complete_install_never_probes_the_network(monkeypatch, tmp_path):
    bin_dir = _official_install(tmp_path)
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(bin_dir))

    def probed():
        raise AssertionError("the network was probed")

    monkeypatch.setattr(preflight, "plugin_hosts_reachable", probed)
    assert preflight.main() == 0


def test_an_official_install_satisfies_the_preflight(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("pulumi", "pulumi-language-python"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for plugin in ("resource-kubernetes-v4.34.2", "resource-flux-v1.0.1"):
        (tmp_path / "plugins" / plugin).mkdir(parents=True)
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(bin_dir))
    assert preflight.missing_dev_stack_requirements() == []
    assert preflight.main() == 0


def _official_install(tmp_path, plugins=("resource-kubernetes-v4.34.2", "resource-flux-v1.0.1")):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("pulumi", "pulumi-language-python"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for plugin in plugins:
        (tmp_path / "plugins" / plugin).mkdir(parents=True)
    return bin_dir


def test_operator_engine_flags_hand_the_local_operator_this_pulumi_install(monkeypatch, tmp_path):
    bin_dir = _official_install(tmp_path, ("resource-kubernetes-v4.34.2", "resource-kubernetes-v4.9.0",
                                           "resource-flux-v1.0.1"))
    (tmp_path / "plugins" / "resource-kubernetes-v4.34.2.lock").write_text("")  # pulumi's lock files are no dirs
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(bin_dir))
    assert preflight.operator_engine_flags() == [
        "--pulumi", str(bin_dir / "pulumi"), "--plugin-dir", str(bin_dir),
        "--plugin-dir", str(tmp_path / "plugins" / "resource-kubernetes-v4.34.2"),
        "--plugin-dir", str(tmp_path / "plugins" / "resource-flux-v1.0.1")]


def test_plugin_dirs_fall_back_to_the_newest_installed_version(monkeypatch, tmp_path):
    _official_install(tmp_path, ("resource-kubernetes-v4.9.0", "resource-kubernetes-v4.30.1"))
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    assert preflight.plugin_dirs() == [tmp_path / "plugins" / "resource-kubernetes-v4.30.1"]


def test_no_operator_engine_flags_without_a_python_host(monkeypatch, tmp_path):
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert preflight.operator_engine_flags() == []


def test_without_bubblewrap_a_user_who_cannot_install_it_is_told_how(monkeypatch):
    """As root `make setup` installs it; anyone else learns before anything long starts."""
    monkeypatch.setattr(preflight.shutil, "which", lambda name, *args, **kwargs: None if name == "bwrap" else "/x")
    monkeypatch.setattr(preflight.os, "geteuid", lambda: 1000)
    (missing,) = preflight.missing_sandbox()
    assert "apt-get install -y bubblewrap" in missing
    monkeypatch.setattr(preflight.os, "geteuid", lambda: 0)
    assert preflight.missing_sandbox() == []
