import json
import os
from pathlib import Path

import pytest

from strata_components.local import toolchain
from strata_components.local.toolchain import ToolchainError, check_entry, load_specs, render_kustomization


def test_versions_file_pins_every_tool_the_platform_runs():
    specs = load_specs()
    assert {"kubernetes", "etcd", "kwok", "pulumi", "pulumi-yaml", "source-controller",
            "kustomize-controller"} <= set(specs)
    assert specs["pulumi"].version == "v3.259.0"
    # The Automation API parses `pulumi version`: the stamp must carry the version.
    assert any("version.Version={version}" in flag for flag in specs["pulumi"].ldflags)
    assert specs["kubernetes"].staging == "v0.34.4"
    for spec in specs.values():
        assert spec.version.startswith("v"), spec
        assert spec.packages, spec


def test_notification_controller_is_the_served_version_the_flux_bundle_renders():
    from strata_components.local.fluxbundle import bundle_settings

    spec = load_specs()["notification-controller"]
    # flux2 v2.9.5 pins v1.9.4, which the proxy refuses: the bundle and the host process use v1.9.3 alike.
    assert spec.version == bundle_settings()["config_versions"]["notification-controller"] == "v1.9.3"
    assert spec.crds == ("config/crd/bases",) and spec.packages == {".": "notification-controller"}


def test_pulumi_python_sdk_pin_matches_the_cli():
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    assert f'"pulumi=={load_specs()["pulumi"].version[1:]}"' in pyproject


def test_fingerprint_changes_with_build_settings():
    spec = load_specs()["kwok"]
    changed = type(spec)(**{**spec.__dict__, "tags": "other"})
    assert spec.fingerprint != changed.fingerprint


def _built_entry(tmp_path: Path):
    spec = load_specs()["kwok"]
    entry = tmp_path / spec.key
    (entry / "bin").mkdir(parents=True)
    (entry / "bin" / "kwok").write_bytes(b"\x7fELF binary")
    toolchain._write_manifest(entry, spec)
    return spec, entry


def test_intact_entry_is_a_cache_hit(tmp_path):
    spec, entry = _built_entry(tmp_path)
    assert check_entry(entry, spec) is None


def test_missing_and_unfinished_entries_are_rebuilt(tmp_path):
    spec = load_specs()["kwok"]
    assert check_entry(tmp_path / "absent", spec) == "not built yet"
    (tmp_path / "partial").mkdir()
    assert check_entry(tmp_path / "partial", spec) == "an earlier build did not finish"


def test_corrupt_binary_is_one_clear_error_with_the_fix(tmp_path):
    spec, entry = _built_entry(tmp_path)
    binary = entry / "bin" / "kwok"
    binary.write_bytes(b"\x7fELF other!")  # same size, other content, new mtime
    with pytest.raises(ToolchainError) as error:
        check_entry(entry, spec)
    message = str(error.value)
    assert "corrupt" in message and "bin/kwok" in message and "sha256" in message
    assert "strata local toolchain --rebuild kwok" in message
    assert "\n" not in message


def test_truncated_binary_and_broken_manifest_are_corrupt(tmp_path):
    spec, entry = _built_entry(tmp_path)
    (entry / "bin" / "kwok").write_bytes(b"\x7f")
    with pytest.raises(ToolchainError, match="has size 1"):
        check_entry(entry, spec)
    (entry / toolchain.MANIFEST).write_text("{not json")
    with pytest.raises(ToolchainError, match="unreadable manifest"):
        check_entry(entry, spec)


def test_changed_build_settings_rebuild(tmp_path):
    spec, entry = _built_entry(tmp_path)
    manifest = json.loads((entry / toolchain.MANIFEST).read_text())
    manifest["fingerprint"] = "0" * 16
    (entry / toolchain.MANIFEST).write_text(json.dumps(manifest))
    assert check_entry(entry, spec) == "its build settings changed"


def test_missing_go_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError) as error:
        toolchain._go_version()
    assert "Go toolchain is not installed" in str(error.value) and "fix: install Go" in str(error.value)


def test_old_go_is_refused(monkeypatch, tmp_path):
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\necho go1.19.3\n")
    fake_go.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match="too old"):
        toolchain._go_version()


def test_unknown_tool_names_are_refused():
    with pytest.raises(ToolchainError, match="unknown toolchain entries"):
        toolchain.ensure(["no-such-tool"])


def test_proxy_refusal_names_the_module_and_the_fix(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("go: k8s.io/api@v0.33.5: reading https://proxy/k8s.io/api/@v/v0.33.5.zip: 403 Forbidden\n")
    build = toolchain._Build(load_specs()["kubernetes"], tmp_path, log)
    message = build._explain(("get", "k8s.io/kubernetes"))
    assert "refuses k8s.io/api@v0.33.5" in message and "pick a served version" in message


def test_kwok_stages_flatten_nested_kustomizations(tmp_path):
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "kustomization.yaml").write_text("resources:\n- a.yaml\n")
    (tmp_path / "node" / "a.yaml").write_text("kind: Stage\nmetadata: {name: a}\n")
    (tmp_path / "b.yaml").write_text("kind: Stage\nmetadata: {name: b}\n")
    (tmp_path / "kustomization.yaml").write_text("resources:\n- node\n- b.yaml\n")
    assert render_kustomization(tmp_path) == ["kind: Stage\nmetadata: {name: a}", "kind: Stage\nmetadata: {name: b}"]


def test_kustomizations_with_patches_are_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: []\n")
    with pytest.raises(ToolchainError, match="patches"):
        render_kustomization(tmp_path)


def test_cache_root_follows_strata_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path))
    assert toolchain.cache_root() == tmp_path
    monkeypatch.delenv("STRATA_CACHE")
    assert toolchain.cache_root() == Path(os.path.expanduser("~/.cache/strata"))


def test_binaries_keep_the_names_go_gives_them_or_are_renamed():
    assert toolchain.default_binary_name("k8s.io/kubernetes/cmd/kubelet") == "kubelet"
    assert toolchain.default_binary_name("github.com/fluxcd/source-controller") == "source-controller"
    # A module root with a major version suffix is named after the element before it.
    assert toolchain.default_binary_name("go.etcd.io/etcd/server/v3") == "server"
    assert toolchain.default_binary_name("example.com/tools/v1") == "v1"


def test_stripping_is_part_of_the_fingerprint(monkeypatch):
    spec = load_specs()["kwok"]
    before = spec.fingerprint
    monkeypatch.setattr(toolchain, "STRIP_LDFLAGS", ())
    assert spec.fingerprint != before


def test_link_times_come_from_the_build_trace(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([
        {"name": "Executing action (build k8s.io/x/cmd/a)", "ph": "B", "ts": 0, "tid": 1},
        {"name": "Executing action (link k8s.io/x/cmd/a)", "ph": "B", "ts": 1_000_000, "tid": 2},
        {"name": "Executing action (link k8s.io/x/cmd/b)", "ph": "B", "ts": 2_000_000, "tid": 3},
        {"name": "Executing action (link k8s.io/x/cmd/a)", "ph": "E", "ts": 13_500_000, "tid": 2},
        {"name": "Executing action (link k8s.io/x/cmd/b)", "ph": "E", "ts": 4_000_000, "tid": 3},
    ]))
    assert toolchain.link_seconds(trace) == {"k8s.io/x/cmd/a": 12.5, "k8s.io/x/cmd/b": 2.0}
    assert toolchain.link_seconds(tmp_path / "absent.json") == {}


def test_compile_progress_counts_packages_not_errors():
    progress = toolchain.CompileProgress(total=4)
    for line in ["internal/goarch\n", "k8s.io/api/core/v1\n", "# k8s.io/broken\n", "x.go:1: undefined: y\n"]:
        progress.saw(line)
    assert progress.compiled == 2
    assert progress.line().startswith("2 of 4 packages compiled (50%)")


def test_phases_read_as_one_line_per_entry():
    line = toolchain.format_phases("kubernetes-v1.34.4", {
        "download_seconds": 14.2, "compile_seconds": 545.0, "packages_compiled": 2890,
        "link_seconds": {"kube-apiserver": 21.4, "kubectl": 9.0}})
    assert line == ("  kubernetes-v1.34.4: modules 14.2s, compile and link 9m05s (2890 packages; "
                    "links: kube-apiserver 21s, kubectl 9s)")


def test_profile_tools_are_built_on_that_profiles_first_use_not_by_make_setup():
    specs = load_specs()
    defaults = toolchain.default_tools(specs)
    assert not {"kube-proxy", "coredns", "registry", "minio"} & set(defaults)
    assert {"kubernetes", "etcd", "kwok", "pulumi"} <= set(defaults)
    assert {"kube-proxy", "coredns", "registry", "minio", *defaults} == set(toolchain.profile_tools("cluster", specs))
    assert toolchain.profile_tools("dev", specs) == defaults


def test_a_tool_like_another_shares_its_build_settings_and_its_build_cache():
    specs = load_specs()
    proxy, kubernetes = specs["kube-proxy"], specs["kubernetes"]
    assert (proxy.module, proxy.version, proxy.staging, proxy.tags, proxy.ldflags) == (
        kubernetes.module, kubernetes.version, kubernetes.staging, kubernetes.tags, kubernetes.ldflags)
    assert proxy.packages == {"cmd/kube-proxy": "kube-proxy"} and proxy.profile == "cluster"
    assert specs["coredns"].version == "v1.15.0" and specs["coredns"].module == "github.com/coredns/coredns"


def test_a_profile_does_not_change_the_fingerprint_so_existing_entries_stay_cache_hits():
    spec = load_specs()["kwok"]
    assert type(spec)(**{**spec.__dict__, "profile": "cluster"}).fingerprint == spec.fingerprint


def test_an_unbuilt_profile_tool_names_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_CACHE", str(tmp_path))
    with pytest.raises(ToolchainError) as error:
        toolchain.installed(["coredns"])
    assert "coredns-v1.15.0 is not built" in str(error.value)
    assert "strata local up --profile cluster" in str(error.value) and "strata local toolchain coredns" in str(error.value)
