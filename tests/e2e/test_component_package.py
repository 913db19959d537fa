"""e2e: Strata's components as a Pulumi component package, used from another language as its README
says: `pulumi package add <checkout>/package` in a Pulumi YAML project that creates a TeamEnvironment,
a Program and a Stack on the local platform, the operator runs the Stack to Ready, the team's
kubeconfig (a typed output) works in its namespace; then `pulumi destroy`. And the TypeScript SDK
`pulumi package gen-sdk` writes, type-checked with tsc against @pulumi/pulumi and @pulumi/kubernetes
from npm. The plugin needs the Python language host, hence this tier."""

import json
import os
import shutil
import subprocess
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

# The Kubernetes provider reads the kubeconfig kubectl would ($KUBECONFIG): given properties, it would
# need the kubernetes plugin's schema, which a plugin built from source leaves empty. (A Cluster's
# `provider` output cannot be used from YAML: pulumi-yaml 1.38 reads provider references back under
# the type "_", which the Go SDK refuses.) Pulumi YAML's own `${...}` inside the Program body is
# escaped (`$${...}`).
PROGRAM = """\
name: strata-from-yaml
runtime: yaml
config:
  server: {type: string}
  backend: {type: string}
resources:
  k8s:
    type: pulumi:providers:kubernetes
  team:
    type: strata:TeamEnvironment
    properties:
      provider: ${k8s}
      team: yaml
      server: ${server}
      fileBackend: ${backend}
  hello:
    type: strata:Program
    properties:
      provider: ${k8s}
      namespace: ${team.namespace}
      name: hello
      program:
        resources:
          note: {type: "pulumi:index:Stash", properties: {input: hello from yaml}}
        outputs:
          greeting: $${note.input}
  helloStack:
    type: strata:Stack
    properties:
      provider: ${k8s}
      namespace: ${team.namespace}
      name: hello
      spec:
        stack: dev
        programRef: {name: hello}
        backend: ${backend}
        envRefs:
          PULUMI_CONFIG_PASSPHRASE: {type: Literal, literal: {value: yaml-team-passphrase}}
        destroyOnFinalize: true
    options: {dependsOn: ["${hello}"]}
outputs:
  teamNamespace: ${team.namespace}
  teamKubeconfig: ${team.kubeconfig}
  stackName: ${helloStack.name}
"""


def _package_copy(tmp_path: Path) -> Path:
    """The plugin directory as a user has it, pointing at this checkout (the copy moved away from it)."""
    package = tmp_path / "strata-package"
    shutil.copytree(ROOT / "package", package, ignore=shutil.ignore_patterns("venv"))
    requirements = (package / "requirements.txt").read_text().replace("-e ..", f"-e {ROOT}")
    (package / "requirements.txt").write_text(requirements)
    return package


def _runner(cwd: Path, env: dict[str, str]):
    cli = str(find_pulumi_with_python_host())

    def pulumi(*args: str, timeout: float = 900) -> str:
        done = subprocess.run([cli, *args, "--non-interactive"], cwd=cwd, env=env, text=True, capture_output=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done.stdout
    return pulumi


def test_a_yaml_program_creates_a_team_environment_and_a_stack(python_operator, local_platform, tmp_path):
    package = _package_copy(tmp_path)
    project = tmp_path / "yaml-project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(PROGRAM)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "PULUMI_BACKEND_URL": state.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "yaml-bootstrap",
           "PULUMI_SKIP_UPDATE_CHECK": "true", "KUBECONFIG": str(local_platform.kubeconfig_path)}
    pulumi = _runner(project, env)

    pulumi("package", "add", str(package))
    assert yaml.safe_load((project / "Pulumi.yaml").read_text())["packages"]["strata"] == str(package)
    pulumi("stack", "init", "dev")
    pulumi("config", "set", "server", local_platform.server)
    pulumi("config", "set", "backend", (tmp_path / "team-state").as_uri())
    pulumi("up", "--yes", "--skip-preview")

    outputs = json.loads(pulumi("stack", "output", "--json", "--show-secrets"))
    assert (outputs["teamNamespace"], outputs["stackName"]) == ("team-yaml", "hello")
    api = config.new_client_from_config(config_file=str(local_platform.kubeconfig_path))
    custom = client.CustomObjectsApi(api)

    def ready():
        stack = custom.get_namespaced_custom_object("pulumi.com", "v1", "team-yaml", "stacks", "hello")
        conditions = {c["type"]: c["status"] for c in (stack.get("status") or {}).get("conditions", [])}
        return conditions.get("Ready") == "True" and stack

    stack = wait_until(ready, 300, "the YAML-made Stack Ready", log=python_operator.log, interval=2)
    assert stack["status"]["outputs"] == {"greeting": "hello from yaml"}
    assert stack["spec"]["envRefs"]["PULUMI_CONFIG_PASSPHRASE"] == {
        "type": "Literal", "literal": {"value": "yaml-team-passphrase"}}

    team = config.new_client_from_config_dict(yaml.safe_load(outputs["teamKubeconfig"]))
    try:
        assert [s["metadata"]["name"] for s in client.CustomObjectsApi(team).list_namespaced_custom_object(
            "pulumi.com", "v1", "team-yaml", "stacks")["items"]] == ["hello"]
        with pytest.raises(client.ApiException) as refused:
            client.CoreV1Api(team).list_namespaced_secret("default")
        assert refused.value.status == 403
    finally:
        team.close()
        api.close()
    pulumi("destroy", "--yes", "--skip-preview")


NPM_PACKAGES = ["typescript@5", "@pulumi/pulumi@3", "@pulumi/kubernetes@4.34.2", "@types/node@20"]


def _nodejs_host_missing() -> str | None:
    cli = find_pulumi_with_python_host()
    if shutil.which("npm") is None:
        return "npm (for typescript and @pulumi/pulumi)"
    if cli is None or not ((cli.parent / "pulumi-language-nodejs").exists() or shutil.which("pulumi-language-nodejs")):
        return ("the Node.js language host pulumi-language-nodejs beside the pulumi CLI or on PATH (gen-sdk's "
                "TypeScript codegen lives in it): `pulumi plugin install language nodejs`, or the full Pulumi install")
    return None


def test_the_generated_typescript_sdk_type_checks(tmp_path):
    missing = _nodejs_host_missing()
    if missing:
        pytest.skip(f"NOT RUN: needs {missing}")
    package = _package_copy(tmp_path)
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    _runner(tmp_path, env)("package", "gen-sdk", str(package), "--language", "nodejs", "--out", str(tmp_path / "sdk"))
    sdk = tmp_path / "sdk" / "nodejs"
    assert {"cluster.ts", "flux.ts", "operator.ts", "stack.ts", "program.ts", "teamEnvironment.ts"} <= \
        {entry.name for entry in sdk.iterdir()}
    # Typed from the TypedDict (a plain list: the component reads it while it builds its children).
    assert "readNamespaces?: string[];" in (sdk / "teamEnvironment.ts").read_text()
    # The SDK's dependencies from the npm registry (npm's own cache keeps later runs quick), then tsc.
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", *NPM_PACKAGES], cwd=sdk, check=True,
                   capture_output=True, timeout=900)
    checked = subprocess.run(["npx", "--no-install", "tsc", "--noEmit", "-p", "."], cwd=sdk, text=True,
                             capture_output=True, timeout=600, check=False)
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-4000:]
