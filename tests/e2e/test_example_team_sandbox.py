"""e2e: `examples/team-sandbox`, run as its README says, against the local platform with Strata's CRDs
and a running operator: a fresh virtualenv from its requirements.txt, `pulumi up`, its Stack Ready
(on a backend directory that does not exist yet: the operator creates it), the team's kubeconfig
allowed in its namespace and refused elsewhere, then `pulumi destroy`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from requirements import missing_e2e_requirements

from strata_components.local.preflight import find_pulumi_with_python_host
from strata_components.local.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]
MISSING = missing_e2e_requirements()
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"e2e needs: {'; '.join(MISSING)}"),
              pytest.mark.timeout(1800)]


def test_the_example_runs_end_to_end_on_a_fresh_operator_host(python_operator, local_platform, tmp_path):
    example = tmp_path / "team-sandbox"
    shutil.copytree(ROOT / "examples" / "team-sandbox", example)
    # The only change: its requirements name this checkout by absolute path, since the copy moved.
    requirements = (example / "requirements.txt").read_text().replace("../..", str(ROOT))
    (example / "requirements.txt").write_text(requirements)
    subprocess.run([sys.executable, "-m", "venv", str(example / "venv")], check=True)
    subprocess.run([str(example / "venv" / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    "-r", "requirements.txt"], cwd=example, check=True, timeout=900)

    state = tmp_path / "example-state" / "not-yet"  # the operator creates it
    env = {**os.environ, "PULUMI_BACKEND_URL": (tmp_path / "bootstrap-state").as_uri(),
           "PULUMI_CONFIG_PASSPHRASE": "example-passphrase", "PULUMI_SKIP_UPDATE_CHECK": "true"}
    (tmp_path / "bootstrap-state").mkdir()
    cli = str(find_pulumi_with_python_host())

    def pulumi(*args: str) -> str:
        done = subprocess.run([cli, *args, "--non-interactive"], cwd=example, env=env, text=True,
                              capture_output=True, timeout=900)
        assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    pulumi("stack", "init", "dev", "--secrets-provider", "passphrase")
    pulumi("config", "set", "kubeconfigPath", str(local_platform.kubeconfig_path))
    pulumi("config", "set", "team", "demo")
    pulumi("config", "set", "backend", state.as_uri())
    subprocess.run([cli, "config", "set", "--secret", "statePassphrase", "--non-interactive"], input="sandbox-pp",
                   cwd=example, env=env, text=True, check=True)
    pulumi("up", "--yes", "--skip-preview")

    api = config.new_client_from_config(config_file=str(local_platform.kubeconfig_path))
    custom = client.CustomObjectsApi(api)

    def ready():
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", "team-demo", "stacks", "hello")
        conditions = {c["type"]: c["status"] for c in (stack.get("status") or {}).get("conditions", [])}
        return conditions.get("Ready") == "True" and stack

    stack = wait_until(ready, 300, "the example's Stack Ready", log=python_operator.log, interval=2)
    assert stack["status"]["outputs"] == {"greeting": "hello from strata"}
    assert state.is_dir() and state.stat().st_mode & 0o077 == 0

    kubeconfig = json.loads(pulumi("stack", "output", "--json", "--show-secrets"))["teamKubeconfig"]
    team = config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    try:
        assert [s["metadata"]["name"] for s in client.CustomObjectsApi(team).list_namespaced_custom_object(
            "pulumi.com", "v1", "team-demo", "stacks")["items"]] == ["hello"]
        client.AppsV1Api(team).create_namespaced_deployment("team-demo", {
            "metadata": {"name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
        with pytest.raises(client.ApiException) as refused:
            client.CoreV1Api(team).list_namespaced_secret("default")
        assert refused.value.status == 403
    finally:
        team.close()
        api.close()
    pulumi("destroy", "--yes", "--skip-preview")
