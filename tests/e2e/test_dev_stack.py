"""e2e: `pulumi up` of the dev stack (local platform, Flux, operator, platform Stack), then destroy.

Needs a pulumi CLI with the Python language host and the kubernetes/flux provider plugins
(tests/e2e/requirements.py names what is missing; tests/run.py reports the tier NOT RUN then).
Runs against a throw-away file:// backend, passphrase and platform state directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from requirements import missing_e2e_requirements

from strata_components.local.preflight import find_pulumi_with_python_host

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
           "PULUMI_SKIP_UPDATE_CHECK": "true"}
    _pulumi(env, "stack", "select", "--create", "dev", "--secrets-provider", "passphrase")
    yield env, state
    _pulumi(env, "destroy", "--yes", "--stack", "dev", "--skip-preview")
    _pulumi(env, "stack", "rm", "--yes", "dev", "--force")


def _platform_pids(state: Path) -> list[int]:
    pids = []
    for record in (state / "run").glob("*.json"):
        pid = json.loads(record.read_text())["pid"]
        if Path(f"/proc/{pid}").exists():
            pids.append(pid)
    return pids


def test_dev_stack_up_is_idempotent_and_destroy_leaves_nothing(dev_stack):
    env, state = dev_stack
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
    deadline = time.monotonic() + 600
    while True:
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", "strata-system", "stacks", "strata-platform")
        conditions = {c["type"]: c for c in stack.get("status", {}).get("conditions", [])}
        if conditions.get("Ready", {}).get("status") == "True":
            break
        assert time.monotonic() < deadline, f"platform Stack not Ready in 10 min: {conditions}"
        time.sleep(5)
    namespaces = {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}
    assert {"team-alpha", "team-beta"} <= namespaces

    second = _pulumi(env, "preview", "--stack", "dev", "--expect-no-changes")
    assert second.returncode == 0

    _pulumi(env, "destroy", "--yes", "--stack", "dev", "--skip-preview")
    assert _platform_pids(state) == [], "destroy left local platform processes running"
