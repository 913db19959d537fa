"""The bootstrap program and the layered platform / app-team programs, under mocks.

StackReference hand-off: each layer reads the previous one's outputs through a mocked
`pulumi:pulumi:StackReference` and must keep secret values secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from strata_mocks import (FLUX_BUNDLE_URL, GIT_URL, Harness, admin_kubeconfig, fake_token, published_commit,
                          secret_value)

ROOT = Path(__file__).resolve().parents[3]
BOOTSTRAP_STACK = "organization/strata/dev"
PLATFORM_STACK = "organization/strata-platform/dev"
HANDOFF_ALPHA = "organization/strata-team-handoff/alpha"


def dev_config() -> dict:
    """Pulumi.dev.yaml's config, as the engine would pass it."""
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    assert document["secretsprovider"] == "passphrase"
    return {key.split(":", 1)[1]: value for key, value in document["config"].items()}


def fake_pulumi_install(monkeypatch, root: Path) -> Path:
    """A pulumi CLI with its Python host on PATH and the kubernetes plugin in PULUMI_HOME (empty files)."""
    bin_dir = root / "pulumi-bin"
    bin_dir.mkdir()
    for name in ("pulumi", "pulumi-language-python"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    (root / "pulumi-home" / "plugins" / "resource-kubernetes-v4.34.2").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PULUMI_HOME", str(root / "pulumi-home"))
    return bin_dir


def test_bootstrap_dev_stack_composes_cluster_flux_operator_and_platform_stack(monkeypatch, tmp_path):
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "dev-passphrase")
    pulumi_bin = fake_pulumi_install(monkeypatch, tmp_path)
    harness = Harness(config=dev_config(), project="strata", stack="dev")
    out = harness.run_program(ROOT / "__main__.py")

    assert out["kubeconfig"].secret and yaml.safe_load(out["kubeconfig"].value)["kind"] == "Config"
    assert out["operatorNamespace"].value == "strata-system" and out["fluxNamespace"].value == "flux-system"
    cluster = harness.one("strata:index:Cluster")
    flux = harness.one("strata:index:Flux")
    operator = harness.one("strata:index:Operator")
    platform = harness.one("pulumi-python:dynamic:Resource", "strata-platform")
    assert platform.inputs["host_controllers"] == ["source-controller", "kustomize-controller"]
    # The operator's process starts once Flux's CRDs exist (it watches Flux sources); the operator itself
    # and its identity do not wait for Flux's install, which comes up meanwhile.
    crds = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-crds")
    assert crds.parent == flux.urn and not {r.urn for r in harness.children(flux)} & set(operator.dependencies)
    assert crds.urn in harness.one("pulumi-python:dynamic:Resource", "operator-process").dependencies
    identity = [r for r in harness.children(operator) if r.type.startswith("kubernetes:")]
    assert identity and not any(crds.urn in r.dependencies for r in identity)
    provider = harness.one("pulumi:providers:kubernetes")
    assert provider.parent == cluster.urn
    install = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-install")
    # Host controllers in local mode: no Deployment, and no Service that would wait for their pods.
    assert not {"Deployment", "Service"} & {o["kind"] for o in install.inputs["objs"]}
    # The bundle URL is the platform's output (a port picked on first start), not a fixed one.
    invoke = next(c for c in harness.mocks.calls if c.token.startswith("flux:index/getFluxInstall"))
    assert invoke.args["baseurl"] == FLUX_BUNDLE_URL and invoke.args["version"] == "v2.9.5"
    process = harness.one("pulumi-python:dynamic:Resource", "operator-process")
    command = process.inputs["command"]
    assert command[1:3] == ["-m", "strata_operator"]
    # Its updates run with a clean PATH and an empty PULUMI_HOME: they get the CLI, Python host and
    # kubernetes plugin this program runs with, and keep their state in the platform's directory.
    assert command[command.index("--pulumi") + 1] == str(pulumi_bin / "pulumi")
    plugin_dirs = [command[i + 1] for i, flag in enumerate(command) if flag == "--plugin-dir"]
    assert plugin_dirs == [str(pulumi_bin), str(tmp_path / "pulumi-home" / "plugins" / "resource-kubernetes-v4.34.2")]
    assert f"--state-dir={Path('~/.local/state/strata/platform').expanduser() / 'operator'}" in process.inputs["flags"]
    # No fixed metrics/health port (another operator on the host may hold 8383): the platform's kept ones.
    assert not process.inputs.get("requested_ports") and not any("-port" in arg for arg in command)

    # This project is published to the platform's git server; the Stack pins the published commit.
    repo = harness.one("pulumi-python:dynamic:Resource", "project-repo")
    assert repo.inputs["git_url"] == GIT_URL and repo.inputs["source_dir"] == str(ROOT)
    assert {"programs", "components", "pyproject.toml"} <= set(repo.inputs["include"])
    assert platform.urn in repo.dependencies
    stack = harness.one("kubernetes:pulumi.com/v1:Stack")
    spec = stack.inputs["spec"]
    assert spec["projectRepo"] == f"{GIT_URL}/strata.git" and spec["repoDir"] == "programs/platform"
    assert spec["commit"] == published_commit(repo.inputs["digest"]) and "branch" not in spec
    # `~` is the bootstrap user's home: the operator's updates run with a HOME of their own.
    assert spec["backend"] == spec["config"]["strata-platform:backend"] == \
        f"file://{Path.home()}/.local/state/strata/pulumi"
    assert spec["config"]["strata-platform:bootstrapStack"] == BOOTSTRAP_STACK
    # The platform program puts the teams' hand-off Stacks into its own Stack's namespace.
    assert spec["config"]["strata-platform:namespace"] == stack.inputs["metadata"]["namespace"] == "strata-system"
    assert [t["name"] for t in json.loads(spec["config"]["strata-platform:teams"])] == ["alpha", "beta"]
    assert spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]["secret"]["name"] == "strata-pulumi-passphrase"
    assert process.urn in stack.dependencies  # the operator is running before its first Stack exists
    passphrase = harness.one("kubernetes:core/v1:Secret", "platform-passphrase")
    assert passphrase.urn in stack.dependencies
    # The passphrase reaches the cluster only inside a Secret, never in the Stack object.
    assert "dev-passphrase" not in json.dumps(stack.inputs)

    # Flux syncs clusters/dev of the published project; the sync comes last, so it comes down first
    # (the Stacks it synced are destroyed while the operator and the platform still run).
    sync = harness.one("strata:index:FluxSync")
    assert stack.urn in sync.dependencies
    assert {r.urn for r in [*harness.children(flux), *harness.children(operator)]} <= set(sync.dependencies)
    call = next(c for c in harness.mocks.calls if c.token.startswith("flux:index/getFluxSync"))
    assert call.args["url"] == f"{GIT_URL}/strata.git" and call.args["targetPath"] == "clusters/dev"
    kustomization = harness.one("kubernetes:yaml/v2:ConfigGroup", "flux-sync").inputs["objs"][1]
    assert kustomization["spec"]["postBuild"]["substitute"] == {
        "STRATA_PROJECT_REPO": f"{GIT_URL}/strata.git", "STRATA_PROJECT_BRANCH": "main",
        "STRATA_BACKEND": f"file://{Path.home()}/.local/state/strata/pulumi"}
    assert "clusters" in repo.inputs["include"]


def test_bootstrap_rejects_an_unknown_cluster_mode():
    harness = Harness(config={"cluster": {"mode": "kind"}}, project="strata", stack="dev")
    with pytest.raises(ValueError, match="cluster mode 'kind'"):
        harness.run_program(ROOT / "__main__.py")


def platform_harness(**overrides) -> Harness:
    """The platform program's config as the bootstrap's platform Stack sets it (None drops a key)."""
    config = {"bootstrapStack": BOOTSTRAP_STACK, "backend": "file:///state", "namespace": "strata-system",
              "teams": json.dumps([{"name": "alpha", "repo": "http://127.0.0.1:8398/alpha.git"},
                                   {"name": "beta", "readNamespaces": ["shared"]}]),
              "statePassphrase": "pp", **overrides}
    return Harness(
        project="strata-platform", stack="dev",
        config={key: value for key, value in config.items() if value is not None},
        stack_outputs={BOOTSTRAP_STACK: {"kubeconfig": admin_kubeconfig(), "server": "https://127.0.0.1:6443"}},
        secret_outputs={BOOTSTRAP_STACK: ["kubeconfig"]})


def test_platform_layer_reads_the_bootstrap_stack_and_exports_secret_team_credentials():
    harness = platform_harness()
    out = harness.run_program(ROOT / "programs" / "platform" / "__main__.py")

    reference = harness.one("pulumi:pulumi:StackReference")
    assert reference.inputs["name"] == BOOTSTRAP_STACK
    provider = harness.one("pulumi:providers:kubernetes", "cluster")
    assert secret_value(provider.inputs["kubeconfig"]) == admin_kubeconfig()
    assert reference.urn in provider.dependencies
    assert out["teamKubeconfigs"].secret and out["teamTokens"].secret and out["teamPassphrases"].secret
    assert not out["teamNamespaces"].secret
    assert out["teamNamespaces"].value == {"alpha": "team-alpha", "beta": "team-beta"}
    assert out["teamHandoffStacks"].value == {"alpha": HANDOFF_ALPHA, "beta": "organization/strata-team-handoff/beta"}
    alpha = yaml.safe_load(out["teamKubeconfigs"].value["alpha"])
    assert alpha["users"][0]["user"]["token"] == fake_token("team-alpha", "team-alpha")
    assert alpha["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    # alpha has a program: source + Stack running as the team, reading its hand-off stack; beta has none.
    stack = next(s for s in harness.all("kubernetes:pulumi.com/v1:Stack")
                 if s.inputs["metadata"]["namespace"] == "team-alpha")
    assert [s.inputs["metadata"]["namespace"] for s in harness.all("kubernetes:pulumi.com/v1:Stack")].count(
        "team-alpha") == 1
    assert stack.inputs["spec"]["serviceAccountName"] == "team-alpha"
    assert stack.inputs["spec"]["config"] == {"strata-app-team:handoffStack": HANDOFF_ALPHA,
                                              "strata-app-team:team": "alpha"}
    # Each team's state is its own: its app stacks and its hand-off stack in `teams/<team>`.
    assert stack.inputs["spec"]["backend"] == "file:///state/teams/alpha"
    assert out["teamBackends"].value == {"alpha": "file:///state/teams/alpha", "beta": "file:///state/teams/beta"}
    assert stack.inputs["spec"]["envRefs"]["PULUMI_CONFIG_PASSPHRASE"] == {
        "type": "Secret", "secret": {"name": "strata-pulumi-passphrase", "key": "passphrase"}}
    roles = {r.inputs["metadata"]["namespace"] for r in harness.all("kubernetes:rbac.authorization.k8s.io/v1:Role")}
    assert roles == {"team-alpha", "team-beta", "shared"}
    # Every team gets its own passphrase in its namespace, for its app Stacks however they arrive.
    assert sorted(s.name for s in harness.all("kubernetes:core/v1:Secret") if "passphrase" in s.name) == [
        "alpha-passphrase", "beta-passphrase"]


def test_platform_layer_hands_each_team_its_kubeconfig_through_a_handoff_stack_of_its_own():
    from strata_components.layers import derive_team_passphrase

    harness = platform_harness()
    out = harness.run_program(ROOT / "programs" / "platform" / "__main__.py")
    kubeconfigs = out["teamKubeconfigs"].value

    # One hand-off Program (its name is the project of every hand-off stack), in the platform's namespace.
    program = harness.one("kubernetes:pulumi.com/v1:Program")
    assert program.inputs["metadata"] == {"name": "strata-team-handoff", "namespace": "strata-system"}
    assert program.inputs["program"]["outputs"] == {"kubeconfig": {"fn::secret": "${kubeconfig}"},
                                                    "namespace": "${namespace}"}
    stacks = {s.inputs["metadata"]["name"]: s for s in harness.all("kubernetes:pulumi.com/v1:Stack")}
    secrets = {s.inputs["metadata"]["name"]: s for s in harness.all("kubernetes:core/v1:Secret")
               if s.inputs["metadata"]["namespace"] == "strata-system"}
    assert set(secrets) == {"team-alpha-handoff", "team-beta-handoff"}
    passphrases = {}
    for team in ("alpha", "beta"):
        handoff = harness.one("strata:index:TeamHandoff", f"{team}-handoff")
        stack, secret = stacks[f"team-{team}-handoff"], secrets[f"team-{team}-handoff"]
        assert stack.parent == secret.parent == handoff.urn
        assert stack.inputs["metadata"]["namespace"] == "strata-system"
        spec = stack.inputs["spec"]
        assert spec["stack"] == f"organization/strata-team-handoff/{team}"
        assert spec["programRef"] == {"name": "strata-team-handoff"}
        assert spec["config"] == {"namespace": f"team-{team}"}
        assert spec["secretsRef"] == {"kubeconfig": {"type": "Secret", "secret": {
            "name": f"team-{team}-handoff", "key": "kubeconfig"}}}
        assert spec["envRefs"] == {"PULUMI_CONFIG_PASSPHRASE": {"type": "Secret", "secret": {
            "name": f"team-{team}-handoff", "key": "passphrase"}}}
        assert spec["destroyOnFinalize"] is True
        assert spec["backend"] == f"file:///state/teams/{team}" and spec["secretsProvider"] == "passphrase"
        assert {secret.urn, program.urn} <= set(stack.dependencies)
        # The kubeconfig and the team passphrase reach the cluster only as secrets, in a Secret.
        data = secret_value(secret.inputs["stringData"])
        assert data["kubeconfig"] == kubeconfigs[team]
        passphrases[team] = data["passphrase"]
        assert passphrases[team] == derive_team_passphrase("pp", team)
        assert "pp" not in json.dumps(stack.inputs) and passphrases[team] not in json.dumps(stack.inputs)
    # Each team's passphrase is its own: not the shared one, not another team's.
    assert len({"pp", *passphrases.values()}) == 3
    assert out["teamPassphrases"].value == passphrases
    # The team's namespace gets only its own passphrase, as a secret.
    team_secret = harness.one("kubernetes:core/v1:Secret", "alpha-passphrase")
    assert team_secret.inputs["metadata"] == {"name": "strata-pulumi-passphrase", "namespace": "team-alpha"}
    assert secret_value(team_secret.inputs["stringData"]) == {"passphrase": passphrases["alpha"]}


def test_platform_layer_with_teams_needs_its_namespace():
    harness = platform_harness(namespace=None)
    with pytest.raises(Exception, match="strata-platform:namespace"):
        harness.run_program(ROOT / "programs" / "platform" / "__main__.py")


@pytest.fixture
def api_answers(monkeypatch):
    """What the API server answers the app-team program's boundary probe, by (server, namespace)."""
    import strata_components.layers

    asked = []

    def list_status(kubeconfig: str, namespace: str) -> str:
        asked.append((yaml.safe_load(kubeconfig)["users"][0]["user"]["token"], namespace))
        return "403 Forbidden"

    monkeypatch.setattr(strata_components.layers, "list_status", list_status)
    return asked


def test_platform_layer_runs_a_team_dir_from_the_project_repository():
    harness = platform_harness(teams=json.dumps([{"name": "alpha", "dir": "programs/app-team"}]),
                               projectRepo="http://127.0.0.1:8398/strata.git", projectBranch="main")
    harness.run_program(ROOT / "programs" / "platform" / "__main__.py")
    source = harness.one("kubernetes:source.toolkit.fluxcd.io/v1:GitRepository")
    assert source.inputs["spec"]["url"] == "http://127.0.0.1:8398/strata.git"
    assert source.inputs["spec"]["ref"] == {"branch": "main"}
    stack = next(s for s in harness.all("kubernetes:pulumi.com/v1:Stack")
                 if s.inputs["metadata"]["namespace"] == "team-alpha")
    assert stack.inputs["spec"]["fluxSource"]["dir"] == "programs/app-team"


def test_platform_layer_gives_each_team_a_sync_of_its_own_directory_applied_as_the_team():
    harness = platform_harness(teams=json.dumps([{"name": "alpha"}, {"name": "beta", "namespace": "beta-apps"}]),
                               projectRepo="http://127.0.0.1:8398/strata.git", projectBranch="main",
                               syncPath="clusters/dev")
    harness.run_program(ROOT / "programs" / "platform" / "__main__.py")
    syncs = {k.inputs["metadata"]["namespace"]: k for k in
             harness.all("kubernetes:kustomize.toolkit.fluxcd.io/v1:Kustomization")}
    assert set(syncs) == {"team-alpha", "beta-apps"}
    for team, namespace in (("alpha", "team-alpha"), ("beta", "beta-apps")):
        spec = syncs[namespace].inputs["spec"]
        # In the team's namespace, as the team: Flux impersonates its ServiceAccount.
        assert spec["serviceAccountName"] == f"team-{team}"
        assert spec["path"] == f"clusters/dev/team-{team}"
        assert spec["sourceRef"] == {"kind": "GitRepository", "name": f"team-{team}"}
        assert spec["prune"] is True and spec["deletionPolicy"] == "WaitForTermination"
        assert spec["postBuild"]["substitute"] == {
            "STRATA_PROJECT_REPO": "http://127.0.0.1:8398/strata.git", "STRATA_PROJECT_BRANCH": "main",
            "STRATA_BACKEND": f"file:///state/teams/{team}"}
    # No app of the platform's: the teams' Stacks come through their syncs only.
    assert {s.inputs["metadata"]["namespace"] for s in harness.all("kubernetes:pulumi.com/v1:Stack")} == {
        "strata-system"}


@pytest.mark.parametrize("teams, message", [
    ([{"readNamespaces": []}], r"strata-platform:teams\[0\]: a team needs a `name`"),
    ([{"name": "alpha"}, {"name": "beta", "namespace": "team-alpha"}],
     r"teams\[1\] \(beta\): namespace team-alpha is already the namespace of team alpha"),
    ([{"name": "alpha"}, {"name": "alpha"}], r"teams\[1\] \(alpha\): team 'alpha' is listed twice"),
    ([{"name": "alpha", "namespaces": ["x"]}], r"teams\[0\] \(alpha\): unknown keys \['namespaces'\]"),
    ([{"name": "Alpha"}], r"teams\[0\] \(Alpha\): team name 'Alpha' must be a DNS label"),
])
def test_platform_layer_names_a_bad_team_entry_and_the_fix(teams, message):
    harness = platform_harness(teams=json.dumps(teams))
    with pytest.raises(Exception, match=message):
        harness.run_program(ROOT / "programs" / "platform" / "__main__.py")


def test_platform_layer_refuses_a_team_dir_without_any_repository():
    harness = platform_harness(teams=json.dumps([{"name": "alpha", "dir": "programs/app-team"}]))
    with pytest.raises(Exception, match="team alpha: `dir` names a program"):
        harness.run_program(ROOT / "programs" / "platform" / "__main__.py")


def test_app_team_layer_deploys_with_the_team_kubeconfig_only(api_answers):
    team_kubeconfig = admin_kubeconfig().replace("admin-secret-token", "alpha-token")
    harness = Harness(
        project="strata-app-team", stack="alpha",
        config={"handoffStack": HANDOFF_ALPHA, "team": "alpha"},
        stack_outputs={HANDOFF_ALPHA: {"kubeconfig": team_kubeconfig, "namespace": "team-alpha"}},
        secret_outputs={HANDOFF_ALPHA: ["kubeconfig"]})
    out = harness.run_program(ROOT / "programs" / "app-team" / "__main__.py")

    reference = harness.one("pulumi:pulumi:StackReference")
    assert reference.inputs["name"] == HANDOFF_ALPHA
    provider = harness.one("pulumi:providers:kubernetes", "team")
    assert secret_value(provider.inputs["kubeconfig"]) == team_kubeconfig
    assert provider.inputs["namespace"] == "team-alpha"
    deployment = harness.one("kubernetes:apps/v1:Deployment")
    service = harness.one("kubernetes:core/v1:Service")
    for resource in (deployment, service):
        assert harness.provider_urn(resource.provider) == provider.urn
        assert resource.inputs["metadata"]["namespace"] == "team-alpha"
    # Its pods satisfy Pod Security `restricted`, which the team's namespace enforces: not root, no privilege
    # escalation, every capability dropped, the runtime's seccomp profile; the image serves as a user of its own.
    pod = deployment.inputs["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert container["image"] == "nginxinc/nginx-unprivileged:1.27" and container["ports"][0]["containerPort"] == 8080
    # The Deployment's rollout is awaited; the Service waits for its IP only (not the provider's 10 s settle).
    assert service.inputs["metadata"]["annotations"] == {"pulumi.com/waitFor": "jsonpath={.spec.clusterIP}"}
    assert service.inputs["spec"]["selector"] == deployment.inputs["spec"]["selector"]["matchLabels"]
    assert out["namespace"].value == "team-alpha"
    # The boundary probe runs as the team (its token), and its answer is plain, not secret.
    assert api_answers == [("alpha-token", "default")]
    assert out["outsideAccess"].value == "list configmaps in default: 403 Forbidden"
    assert not out["outsideAccess"].secret


def test_app_team_reads_its_own_handoff_stack_by_default(api_answers):
    harness = Harness(
        project="strata-app-team", stack="beta", config={"team": "beta"},
        stack_outputs={"organization/strata-team-handoff/beta": {"kubeconfig": admin_kubeconfig(),
                                                                 "namespace": "team-beta"}},
        secret_outputs={"organization/strata-team-handoff/beta": ["kubeconfig"]})
    out = harness.run_program(ROOT / "programs" / "app-team" / "__main__.py")
    assert harness.one("pulumi:pulumi:StackReference").inputs["name"] == "organization/strata-team-handoff/beta"
    assert out["namespace"].value == "team-beta"


def test_app_team_fails_naming_a_handoff_stack_its_passphrase_cannot_decrypt(api_answers):
    # The engine elides secrets it cannot decrypt: the kubeconfig arrives as an empty object.
    harness = Harness(
        project="strata-app-team", stack="alpha", config={"team": "alpha", "handoffStack": HANDOFF_ALPHA},
        stack_outputs={HANDOFF_ALPHA: {"kubeconfig": {}, "namespace": "team-alpha"}},
        secret_outputs={HANDOFF_ALPHA: ["kubeconfig"]})
    with pytest.raises(Exception, match=f"cannot decrypt output 'kubeconfig' of stack {HANDOFF_ALPHA}"):
        harness.run_program(ROOT / "programs" / "app-team" / "__main__.py")


def test_example_program_uses_the_library_from_outside(tmp_path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(admin_kubeconfig())
    harness = Harness(project="strata-example-team-sandbox", stack="dev",
                      config={"kubeconfigPath": str(kubeconfig), "team": "demo", "statePassphrase": "sandbox-pp"})
    out = harness.run_program(ROOT / "examples" / "team-sandbox" / "__main__.py")
    assert out["teamKubeconfig"].secret
    stack = harness.one("kubernetes:pulumi.com/v1:Stack")
    assert stack.inputs["metadata"]["namespace"] == "team-demo"
    assert stack.inputs["spec"]["serviceAccountName"] == "team-demo"
    assert harness.one("kubernetes:pulumi.com/v1:Program").urn in stack.dependencies
    # The Stack's file:// state directory is the team's own: the one its sandboxed programs may write.
    namespace = harness.one("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["annotations"] == {
        "strata.dev/file-backend": stack.inputs["spec"]["backend"]}
    # A file:// backend needs a passphrase: from a Secret in the Stack's namespace, never inline.
    secret = harness.one("kubernetes:core/v1:Secret", "hello-passphrase")
    assert secret.urn in stack.dependencies and secret.inputs["metadata"]["namespace"] == "team-demo"
    ref = stack.inputs["spec"]["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]
    assert ref == {"type": "Secret", "secret": {"name": "hello-passphrase", "key": "passphrase"}}
    assert "sandbox-pp" not in json.dumps(stack.inputs)


@pytest.mark.parametrize("layer", ["platform", "app-team"])
def test_each_layers_lock_file_is_current_with_its_own_and_the_projects_dependencies(layer, tmp_path):
    """The layers ask for uv (`uv sync --locked` fails on a stale lock): a change to their pyproject.toml or
    to this project's dependencies needs `uv lock` beside it. Checked offline: a current lock needs no index."""
    from uv import find_uv_bin

    project = ROOT / "programs" / layer
    assert yaml.safe_load((project / "Pulumi.yaml").read_text())["runtime"]["options"] == {"toolchain": "uv"}
    check = subprocess.run([find_uv_bin(), "lock", "--check", "--offline", "--python", sys.executable], cwd=project,
                           capture_output=True, text=True, env={**os.environ, "UV_CACHE_DIR": str(tmp_path)})
    assert check.returncode == 0, f"run `uv lock` in programs/{layer}: {check.stderr[-800:]}"
