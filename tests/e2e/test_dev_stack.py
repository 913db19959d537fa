"""e2e: `pulumi up` of the dev stack (local platform, Flux, operator, platform Stack), then destroy.

Needs a pulumi CLI with the Python language host and the kubernetes/flux provider plugins
(tests/e2e/requirements.py names what is missing; tests/run.py reports the tier NOT RUN then).
Runs against a throw-away file:// backend, passphrase and platform state directory.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from requirements import missing_e2e_requirements

from strata_components.local.platform import LocalPlatform, PlatformConfig
from strata_components.local.preflight import find_pulumi_with_python_host
from strata_components.local.processes import descendants, running_pid

ROOT = Path(__file__).resolve().parents[2]
MISSING = missing_e2e_requirements()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"e2e needs: {'; '.join(MISSING)}")


def _pulumi(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    cli = find_pulumi_with_python_host()
    result = subprocess.run([str(cli), *args, "--non-interactive", "--cwd", env["STRATA_E2E_PROJECT"]], env=env,
                            text=True, capture_output=True, timeout=timeout)
    assert result.returncode == 0, f"pulumi {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture
def dev_stack(tmp_path):
    """A copy of the bootstrap project whose backend and platform state live in tmp_path (the
    repository's Pulumi.*.yaml stay untouched)."""
    backend, state, project = tmp_path / "backend", tmp_path / "platform", tmp_path / "project"
    backend.mkdir()
    project.mkdir()
    settings = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    settings["backend"] = {"url": f"file://{backend}"}
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(settings))
    dev = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    dev["config"]["strata:cluster"]["local"]["stateDir"] = str(state)
    dev["config"]["strata:platform"]["backend"] = f"file://{backend}"
    dev["config"]["strata:platform"]["sourceDir"] = str(ROOT)  # published to the platform's git server
    (project / "Pulumi.dev.yaml").write_text(yaml.safe_dump(dev))
    (project / "__main__.py").write_text((ROOT / "__main__.py").read_text())
    (project / ".venv").symlink_to(Path(sys.prefix))  # the interpreter running the tests has strata installed
    env = {**os.environ, "STRATA_E2E_PROJECT": str(project), "PULUMI_CONFIG_PASSPHRASE": "e2e-passphrase",
           "PULUMI_SKIP_UPDATE_CHECK": "true",
           # An exported PULUMI_BACKEND_URL would win over Pulumi.yaml's backend: pin the throw-away one.
           "PULUMI_BACKEND_URL": f"file://{backend}"}
    _pulumi(env, "stack", "select", "--create", "dev", "--secrets-provider", "passphrase")
    try:
        yield env, state, backend
        _pulumi(env, "destroy", "--yes", "--stack", "dev", "--skip-preview")
        _pulumi(env, "stack", "rm", "--yes", "dev", "--force")
    finally:
        # Whatever failed above, leave no platform process (etcd, apiserver, operator, ...) running.
        LocalPlatform(PlatformConfig(state_dir=state)).down(say=lambda _line: None)


def _platform_pids(state: Path) -> list[int]:
    """The running platform processes (the operator included) and everything they started."""
    pids = []
    for record in sorted((state / "run").glob("*.json")):
        pid = running_pid(state / "run", record.stem)
        if pid is not None:
            pids += [pid, *descendants(pid)]
    return pids


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _survivors(pids: list[int], grace: float = 30) -> list[str]:
    """The command lines of `pids` still running after `grace` seconds (an operator's spare update
    worker exits on its own once the operator is gone, not at once)."""
    deadline = time.monotonic() + grace
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    lines = []
    for pid in alive:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            lines.append(f"{pid}: {command}")
        except OSError:
            pass
    return lines


def _platform_stack_resources(backend: Path) -> list[str]:
    """Types of what the operator's platform stack holds in the shared file:// backend ([] once gone)."""
    for checkpoint in (backend / ".pulumi" / "stacks" / "strata-platform").glob("dev.json*"):
        if checkpoint.name.endswith((".attrs", ".bak")):
            continue
        raw = checkpoint.read_bytes()
        data = json.loads(gzip.decompress(raw) if checkpoint.name.endswith(".gz") else raw)
        latest = data.get("checkpoint", {}).get("latest") or {}
        return [resource["type"] for resource in latest.get("resources") or []]
    return []


def _wait_ready(custom, name: str, deadline: float) -> dict:
    """The status of Stack `name` in strata-system once Ready after a successful update."""
    while True:
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", "strata-system", "stacks", name)
        status = stack.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        if conditions.get("Ready", {}).get("status") == "True":
            break
        assert time.monotonic() < deadline, \
            f"Stack {name} not Ready in time: {conditions}; last update: {status.get('lastUpdate')}"
        time.sleep(5)
    assert status["lastUpdate"]["state"] == "succeeded"
    return status


def test_dev_stack_up_is_idempotent_and_destroy_leaves_nothing(dev_stack):
    env, state, backend = dev_stack
    _pulumi(env, "up", "--yes", "--stack", "dev", "--skip-preview")
    outputs = json.loads(_pulumi(env, "stack", "output", "--json", "--stack", "dev").stdout)
    assert outputs["kubeconfig"] == "[secret]"  # never shown without --show-secrets
    kubeconfig = json.loads(_pulumi(env, "stack", "output", "--json", "--show-secrets", "--stack", "dev").stdout)[
        "kubeconfig"]
    kubeconfig_file = state / "e2e.kubeconfig"
    kubeconfig_file.write_text(kubeconfig)

    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig_file))
    extensions = client.ApiextensionsV1Api(api)
    crds = {crd.metadata.name for crd in extensions.list_custom_resource_definition().items}
    assert {"stacks.pulumi.com", "programs.pulumi.com", "gitrepositories.source.toolkit.fluxcd.io"} <= crds
    custom = client.CustomObjectsApi(api)
    # The first run of the platform Stack clones this project from the platform's git server and
    # pip-installs its requirements (strata from the checkout, the Pulumi SDKs from PyPI) first.
    status = _wait_ready(custom, "strata-platform", time.monotonic() + 900)
    # The platform layer read the bootstrap stack by reference and made one environment per team;
    # the team kubeconfigs and passphrases stay secret even in the Stack's status.
    assert status["outputs"]["teamNamespaces"] == {"alpha": "team-alpha", "beta": "team-beta"}
    assert status["outputs"]["teamKubeconfigs"] == "[secret]"
    assert status["outputs"]["teamPassphrases"] == "[secret]"
    assert status["outputs"]["teamHandoffStacks"] == {team: f"organization/strata-team-handoff/{team}"
                                                      for team in ("alpha", "beta")}
    core = client.CoreV1Api(api)
    namespaces = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"team-alpha", "team-beta"} <= namespaces
    assert core.read_namespaced_service_account("team-alpha", "team-alpha").metadata.name == "team-alpha"
    # Each team's kubeconfig is handed over by a hand-off stack of its own, run by the operator in the
    # platform's namespace under the team's passphrase (a YAML Program: no dependencies to install).
    assert custom.get_namespaced_custom_object("pulumi.com", "v1", "strata-system", "programs",
                                               "strata-team-handoff")["program"]["outputs"]
    for team in ("alpha", "beta"):
        handoff = _wait_ready(custom, f"team-{team}-handoff", time.monotonic() + 300)
        assert handoff["outputs"] == {"kubeconfig": "[secret]", "namespace": f"team-{team}"}
        secret = core.read_namespaced_secret(f"team-{team}-handoff", "strata-system")
        assert set(secret.data) == {"kubeconfig", "passphrase"}
        assert list((backend / ".pulumi" / "stacks" / "strata-team-handoff").glob(f"{team}.json*"))
        # Teams without a program get no passphrase in their namespace; none ever gets the shared one.
        assert "strata-pulumi-passphrase" not in {s.metadata.name for s in
                                                  core.list_namespaced_secret(f"team-{team}").items}
    # In the shared backend, next to the bootstrap stack.
    assert "kubernetes:core/v1:Namespace" in _platform_stack_resources(backend)

    _pulumi(env, "preview", "--stack", "dev", "--expect-no-changes")

    pids = _platform_pids(state)
    assert pids, "no platform process was recorded"
    _pulumi(env, "destroy", "--yes", "--stack", "dev", "--skip-preview")
    assert _survivors(pids) == [], "destroy left local platform processes running"
    # The platform Stack was finalized with destroyOnFinalize before the operator went away.
    assert not [kind for kind in _platform_stack_resources(backend) if kind.startswith("kubernetes:")]
