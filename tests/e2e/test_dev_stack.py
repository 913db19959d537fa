"""e2e: the README's `make up` and `make down`, exactly as a user types them, with a throw-away home.

`make up` (the preflight, `make setup`, then `strata dev up`) runs the bootstrap dev stack: the local
platform, Flux, the operator, the platform layer, each team's hand-off and alpha's app. Then every
layer is checked from outside, as a user would look at it. Then `make down` meets a Stack it cannot
destroy: it stops, naming it, and stops every local process; `make down FORCE=1` destroys the rest
and leaves nothing behind but what it says it leaves (one `make up` for both: it is the tier's
slowest step; a plain `make down` to the end is the cluster stack's e2e test). Needs a pulumi CLI with the Python language host
and the kubernetes/flux provider plugins (tests/run.py reports the tier NOT RUN without them).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from requirements import missing_e2e_requirements

from hostile_team import (assert_nothing_reached, assert_refused_beyond_its_own, assert_stalled, hostile_stack,
                          run_hostile_stack, secret_values, wait_ready)

from strata_components.console.models import layer_edges
from strata_components.local.gitserver import GitRepos
from strata_components.local.processes import descendants, running_pid

ROOT = Path(__file__).resolve().parents[2]
MISSING = missing_e2e_requirements()
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"e2e needs: {'; '.join(MISSING)}"),
              pytest.mark.timeout(3600)]
OPERATOR_NAMESPACE = "strata-system"
STACKS = ("pulumi.com", "v1", "stacks")


def make(target: str, home: Path, *variables: str, timeout: float = 2400) -> subprocess.CompletedProcess:
    """`make <target>` in the repository, as typed, with STRATA_HOME pointing at the throw-away home."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_BACKEND_URL", "KUBECONFIG", "MAKEFLAGS", "MFLAGS",
                          "MAKELEVEL")}
    env["STRATA_HOME"] = str(home)
    return subprocess.run(["make", "--no-print-directory", target, *variables], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def platform_pids(state: Path) -> list[int]:
    """The running platform processes (the operator included) and everything they started."""
    pids = []
    for record in sorted((state / "run").glob("*.json")):
        pid = running_pid(state / "run", record.stem)
        if pid is not None:
            pids += [pid, *descendants(pid)]
    return pids


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def survivors(pids: list[int], grace: float = 30) -> list[str]:
    """The command lines of `pids` still running after `grace` seconds."""
    deadline = time.monotonic() + grace
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.5)
    lines = []
    for pid in (pid for pid in pids if alive(pid)):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        lines.append(f"{pid}: {command}")
    return lines


def stack_resources(backend: Path, project: str, stack: str) -> list[str]:
    """Types of what a stack holds in the file:// backend ([] once destroyed or removed)."""
    for checkpoint in (backend / ".pulumi" / "stacks" / project).glob(f"{stack}.json*"):
        if checkpoint.name.endswith((".attrs", ".bak")):
            continue
        raw = checkpoint.read_bytes()
        data = json.loads(gzip.decompress(raw) if checkpoint.name.endswith(".gz") else raw)
        return [resource["type"] for resource in (data.get("checkpoint", {}).get("latest") or {}).get("resources") or []]
    return []


@pytest.fixture
def home(tmp_path):
    """A throw-away dev home; whatever happens, no platform process outlives the test."""
    base = tmp_path / "strata-home"
    try:
        yield base
    finally:
        for pid in platform_pids(base / "platform"):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config_dict(yaml.safe_load(kubeconfig))


def test_make_up_brings_every_layer_to_ready_and_make_down_stops_at_what_it_cannot_destroy_then_force_cleans_up(home):
    committed = (ROOT / "Pulumi.dev.yaml").read_text()
    started = time.monotonic()
    up = make("up", home)
    print(up.stdout[-6000:])
    assert up.returncode == 0, up.stdout[-6000:]
    up_seconds = time.monotonic() - started
    print(f"make up took {up_seconds:.0f}s")
    # The tracked stack file is only read; this user's salt and paths live in the home.
    assert (ROOT / "Pulumi.dev.yaml").read_text() == committed
    assert "encryptionsalt" in (home / "Pulumi.dev.yaml").read_text()
    # The summary says what runs and how to reach it.
    for expected in (f"export KUBECONFIG={home / 'platform' / 'kubeconfig'}", "kubectl get stacks -A", "make down",
                     f"backend:    file://{home / 'pulumi'}", f"passphrase: {home / 'passphrase'}"):
        assert expected in up.stdout

    state, backend = home / "platform", home / "pulumi"
    api = config.new_client_from_config(config_file=str(state / "kubeconfig"))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom, coordination = client.CustomObjectsApi(api), client.CoordinationV1Api(api)

    # Flux's controllers answer; Flux syncs clusters/dev of the published project for the platform, and each
    # team's directory for that team, as that team (alpha's app included).
    status = json.loads(subprocess.run([str(ROOT / ".venv" / "bin" / "strata"), "local", "status", "--state-dir",
                                        str(state)], capture_output=True, text=True).stdout)
    assert status["source-controller"] and status["kustomize-controller"]
    syncs = {"flux-system": ("clusters/dev", "kustomize-controller"),
             "team-alpha": ("clusters/dev/team-alpha", "team-alpha"),
             "team-beta": ("clusters/dev/team-beta", "team-beta")}
    syncs_seen = []
    for namespace, (path, service_account) in syncs.items():
        name = namespace  # each sync's GitRepository and Kustomization are named after its namespace
        source = custom.get_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", namespace, "gitrepositories",
                                                     name)
        assert {c["type"]: c["status"] for c in source["status"]["conditions"]}["Ready"] == "True", source
        kustomization = custom.get_namespaced_custom_object("kustomize.toolkit.fluxcd.io", "v1", namespace,
                                                            "kustomizations", name)
        assert {c["type"]: c["status"] for c in kustomization["status"]["conditions"]}["Ready"] == "True"
        assert kustomization["spec"]["path"].removeprefix("./") == path
        assert kustomization["spec"]["serviceAccountName"] == service_account
        assert f"kustomization {namespace}/{name}" in up.stdout
        syncs_seen.append(kustomization)
    # The operator leads.
    lease = coordination.read_namespaced_lease("strata-operator-leader", OPERATOR_NAMESPACE)
    assert lease.spec.holder_identity

    # Every layer's Stack is Ready: platform, both hand-offs, alpha's app (from Flux).
    stacks = {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s
              for s in custom.list_cluster_custom_object(*STACKS)["items"]}
    assert set(stacks) == {f"{OPERATOR_NAMESPACE}/strata-platform", f"{OPERATOR_NAMESPACE}/team-alpha-handoff",
                           f"{OPERATOR_NAMESPACE}/team-beta-handoff", "team-alpha/app"}
    for key, stack in stacks.items():
        conditions = {c["type"]: c["status"] for c in stack["status"]["conditions"]}
        assert conditions["Ready"] == "True", (key, stack["status"])
    # The platform Stack made each team's sync, as its annotation says and the console's Layers page draws.
    edges = layer_edges({"Stack": list(stacks.values()), "Kustomization": syncs_seen})
    assert {edge.target for edge in edges if edge.why == "created"
            and edge.source == f"Stack/{OPERATOR_NAMESPACE}/strata-platform"} == {
        "Kustomization/team-alpha/team-alpha", "Kustomization/team-beta/team-beta"}, edges
    platform_outputs = stacks[f"{OPERATOR_NAMESPACE}/strata-platform"]["status"]["outputs"]
    assert platform_outputs["teamNamespaces"] == {"alpha": "team-alpha", "beta": "team-beta"}
    assert platform_outputs["teamKubeconfigs"] == "[secret]" and platform_outputs["teamPassphrases"] == "[secret]"
    for team in ("alpha", "beta"):
        assert stacks[f"{OPERATOR_NAMESPACE}/team-{team}-handoff"]["status"]["outputs"] == {
            "kubeconfig": "[secret]", "namespace": f"team-{team}"}

    # alpha's app runs in its namespace, deployed through alpha's own kubeconfig.
    app = stacks["team-alpha/app"]
    assert app["metadata"]["labels"]["kustomize.toolkit.fluxcd.io/name"] == "team-alpha"  # alpha's sync owns it
    assert app["spec"]["serviceAccountName"] == "team-alpha"
    deployment = apps.read_namespaced_deployment(app["status"]["outputs"]["deployment"], "team-alpha")
    assert deployment.status.ready_replicas == 2
    assert core.read_namespaced_service(app["status"]["outputs"]["service"], "team-alpha")
    # The boundary, as the app saw it and as a user sees it with alpha's kubeconfig.
    assert app["status"]["outputs"]["outsideAccess"] == "list configmaps in default: 403 Forbidden"
    handoff = core.read_namespaced_secret("team-alpha-handoff", OPERATOR_NAMESPACE).data
    alpha = api_client(base64.b64decode(handoff["kubeconfig"]).decode())
    try:
        assert client.AppsV1Api(alpha).list_namespaced_deployment("team-alpha").items
        with pytest.raises(client.ApiException) as refused:
            client.CoreV1Api(alpha).create_namespaced_config_map("default", {"metadata": {"name": "alpha-was-here"}})
        assert refused.value.status == 403
    finally:
        alpha.close()

    # No team namespace holds the shared passphrase: each team gets its own, and no other's.
    shared = (home / "passphrase").read_text().strip()
    passphrases = {team: base64.b64decode(core.read_namespaced_secret(
        "strata-pulumi-passphrase", f"team-{team}").data["passphrase"]).decode() for team in ("alpha", "beta")}
    assert len({shared, *passphrases.values()}) == 3
    for namespace in ("team-alpha", "team-beta"):
        for secret in core.list_namespaced_secret(namespace).items:
            for value in (secret.data or {}).values():
                assert shared not in base64.b64decode(value).decode(errors="replace")

    hostile_team_gets_nothing(home, custom, core, shared, passphrases["beta"])

    # beta's hand-off Stack can no longer be destroyed: the Secret its destroy needs is gone.
    core.delete_namespaced_secret("team-beta-handoff", OPERATOR_NAMESPACE)
    api.close()
    pids = platform_pids(state)
    assert pids, "no platform process was recorded"

    started = time.monotonic()
    blocked = make("down", home, timeout=1200)
    print(blocked.stdout[-4000:])
    assert blocked.returncode != 0
    assert f"Stack {OPERATOR_NAMESPACE}/team-beta-handoff could not be destroyed (DestroyBlocked)" in blocked.stdout
    assert "make down FORCE=1" in blocked.stdout
    assert time.monotonic() - started < 900
    assert survivors(pids) == [], "a blocked make down left local processes running"

    forced = make("down", home, "FORCE=1", timeout=1200)
    print(forced.stdout[-4000:])
    assert forced.returncode == 0, forced.stdout[-6000:]
    assert f"forced: removing the finalizer of Stack {OPERATOR_NAMESPACE}/team-beta-handoff" in forced.stdout
    assert "team-alpha/app: Deleting" in blocked.stdout + forced.stdout  # each Stack's destroy is shown
    assert not platform_pids(state) and not state.exists(), "make down left the platform or its state"
    # Each team's stacks were in its own backend, beside the platform's; all destroyed but the one forced
    # out, whose stack stays in its backend, as the forced line said (a hand-off holds outputs only).
    for state_backend, project, stack in ((backend, "strata", "dev"), (backend, "strata-platform", "dev"),
                                          (backend / "teams" / "alpha", "strata-app-team", "alpha"),
                                          (backend / "teams" / "alpha", "strata-team-handoff", "alpha")):
        assert not [kind for kind in stack_resources(state_backend, project, stack)
                    if not kind.startswith("pulumi:")], (project, stack)
    assert list((backend / "teams" / "beta" / ".pulumi" / "stacks" / "strata-team-handoff").glob("beta.json*"))
    assert (ROOT / "Pulumi.dev.yaml").read_text() == committed
    assert not subprocess.run(["git", "status", "--porcelain", "--", "Pulumi.dev.yaml"], cwd=ROOT,
                              capture_output=True, text=True).stdout


def hostile_team_gets_nothing(home: Path, custom: client.CustomObjectsApi, core: client.CoreV1Api, shared: str,
                              beta_passphrase: str) -> None:
    """A commit under team-alpha's path adds a Stack whose Python program looks around the machine it runs on
    (the process executor's: this host) for what made a team cluster-admin before: the platform's admin
    kubeconfig and the controller-manager's, the operator's token, the state passphrase, beta's state, the
    operator's processes, etcd, a push into the platform's program. It runs, sandboxed, and gets none of it."""
    state, backend = home / "platform", home / "pulumi"
    ports = json.loads((state / "platform.json").read_text())["ports"]
    targets = {
        "files": {"admin kubeconfig": str(state / "kubeconfig"),
                  "controller-manager kubeconfig": str(state / "kubeconfigs" / "controller-manager.kubeconfig"),
                  "operator kubeconfig": str(state / "kubeconfigs" / "strata-operator.kubeconfig"),
                  "state passphrase": str(home / "passphrase"),
                  "git push credential": str(state / "git-push.credentials"),
                  "CA key": str(state / "pki" / "ca.key")},
        "directories": {"beta's state": str(backend / "teams" / "beta"), "the platform's state": str(backend),
                        "the operator's state": str(state / "operator" / "stacks"), "home": str(home)},
        "writable": {"beta's state": str(backend / "teams" / "beta"), "the operator's state": str(state / "operator")},
        "etcd": f"127.0.0.1:{ports['etcd_client']}", "git": f"http://127.0.0.1:{ports['git']}/strata.git",
        "apiserver": f"https://127.0.0.1:{ports['apiserver']}", "otherNamespace": "team-beta"}
    # What those files hold that would open something: tokens, private keys, passphrases, the push credential.
    secrets = [shared, beta_passphrase, *secret_values(state, targets["files"].values())]
    # Beside it, two Stacks asking the operator itself for what is not alpha's: the platform's repository read
    # from the operator's own filesystem, and state written into beta's directory.
    platform_repo = hostile_stack({}, "platform-repo")
    platform_repo["spec"] = {**{k: v for k, v in platform_repo["spec"].items() if k != "fluxSource"},
                             "projectRepo": (state / "git" / "strata.git").as_uri(), "branch": "main",
                             "repoDir": "programs/platform", "destroyOnFinalize": False}
    beta_state = hostile_stack({}, "beta-state")
    beta_state["spec"].update(backend=(backend / "teams" / "beta").as_uri(), destroyOnFinalize=False)
    status = run_hostile_stack(custom, GitRepos(state / "git", f"http://127.0.0.1:{ports['git']}"), "clusters/dev",
                               hostile_stack(targets), platform_repo, beta_state)
    assert_stalled(custom, "platform-repo", "SpecInvalid", "spec.projectRepo", "operator's own filesystem")
    assert_stalled(custom, "beta-state", "SpecInvalid", "spec.backend", "not inside the file:// state the platform gave")
    probes = status["outputs"]["probes"]
    for name in targets["files"]:
        assert probes[f"read {name}"].startswith("denied: FileNotFoundError"), (name, probes[f"read {name}"])
    # A listing shows at most the directories leading to alpha's own (the sandbox's mount points), never what
    # lies beside them.
    assert probes["list beta's state"].startswith("denied: FileNotFoundError")
    for name, leading in (("the platform's state", ["teams"]), ("the operator's state", ["team-alpha"]),
                          ("home", ["platform", "pulumi"])):
        assert probes[f"list {name}"] == f"GOT {leading}", (name, probes[f"list {name}"])
    # It sees only its own sandbox's processes: its worker, the CLI, the language host, itself.
    for process in ("kube-apiserver", "etcd", "-m strata_operator ", "kustomize-controller", "git-server"):
        assert process not in probes["processes"], (process, probes["processes"])
    assert_refused_beyond_its_own(probes)
    assert_nothing_reached(core, status, secrets)
    # A write is refused, or lands in the sandbox's own scratch (a directory made to hold its mounts: under /tmp,
    # the sandbox's own tmpfs), never on the host.
    assert not list((backend / "teams" / "beta").rglob("planted-by-another-team"))
    assert not list((state / "operator").rglob("planted-by-another-team"))
    wait_ready(custom, "team-alpha", "app")  # alpha's app runs the new commit too, and is Ready again
