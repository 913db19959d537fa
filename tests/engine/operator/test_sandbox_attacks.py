"""The process executor's sandbox, attacked by a real program run by the real engine (pulumi CLI + YAML host).

A Pulumi YAML program's `fn::readFile` reads any path the language host can open: it is how a team's program
(a PKO Program object is YAML) reaches for files it should not. Each case points it at something of the
operator's or of another namespace's, once in a namespace the operator trusts (no sandbox: the read works,
which is the attack) and once in a team's namespace (sandboxed: nothing of it can be read). Needs bubblewrap,
which `make setup` installs as root (`strata local host-packages`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from strata_operator.api.status import EXECUTOR_CANNOT_ISOLATE
from strata_operator.api.validation import STALLED_SPEC_INVALID
from strata_operator.engine.port import UpdateRequest
from strata_operator.engine.process.executor import AutomationEngine, EngineSettings
from strata_operator.engine.process.sandbox import INSTALL_HINT
from tests.engine.workspace import PULUMI, YAML_HOST

pytestmark = pytest.mark.engine

PASSPHRASE = "sandbox-pass-phrase"
READER = """name: reader
runtime: yaml
configuration:
  target:
    type: String
outputs:
  read:
    fn::readFile: ${target}
"""


class Host:
    """A host with an operator's state directory, another team's files and the operator's own secrets."""

    def __init__(self, root: Path):
        self.root = root
        self.state = root / "state"
        self.backends = root / "backends"
        self.canaries: dict[str, Path] = {}
        self.secrets: dict[str, str] = {}
        self._plant("the operator's kubeconfig", root / "operator" / "kubeconfig")
        self._plant("the platform's admin kubeconfig", root / "platform" / "kubeconfigs" / "admin.kubeconfig")
        self._plant("beta's state", self.backends / "beta" / ".pulumi" / "stacks" / "app" / "dev.json")
        self._plant("beta's ServiceAccount token", self.state / "stacks" / "team-beta" / "app" / "runs" / "r1" / "kubeconfig")
        self._plant("beta's program's HOME", self.state / "sandboxes" / "team-beta" / "app" / "home" / ".netrc")
        self._plant("the trusted namespace's run", self.state / "stacks" / "strata-system" / "platform" / "runs" / "r1"
                    / "kubeconfig")
        # A process of the operator's user holding a credential in its environment (an update of another team's).
        what = "another update's environment"
        self.secrets[what] = "canary-environ-beta"
        self.neighbour = subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin",
                                                                 "PULUMI_CONFIG_PASSPHRASE": self.secrets[what]})
        self.canaries[what] = Path(f"/proc/{self.neighbour.pid}/environ")

    def _plant(self, what: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.secrets[what] = f"canary-{len(self.canaries)}-{what.replace(' ', '-')}"
        path.write_text(self.secrets[what])
        self.canaries[what] = path

    def canary(self, what: str) -> str:
        return self.secrets[what]

    def engine(self, trusted: frozenset[str], bwrap: str = "") -> AutomationEngine:
        return AutomationEngine(EngineSettings(pulumi_command=str(PULUMI), plugin_dirs=(str(YAML_HOST),),
                                               state_dir=self.state, trusted_namespaces=trusted, bwrap=bwrap))

    def request(self, namespace: str, target: str, backend: Path | None = None, **fields) -> UpdateRequest:
        """A run of the reader as the operator lays it out: its source fetched into the Stack's run directory."""
        source = self.state / "stacks" / namespace / "reader" / "runs" / "r1" / "src"
        source.mkdir(parents=True, exist_ok=True)
        (source / "Pulumi.yaml").write_text(READER)
        backend = backend or self.backends / namespace
        backend.mkdir(parents=True, exist_ok=True)
        return UpdateRequest(stack_key=f"{namespace}/reader", stack_name="dev", project_dir=str(source),
                             source_root=str(source), config={"target": target},
                             env={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE},
                             secret_env=("PULUMI_CONFIG_PASSPHRASE",), file_backend_root=str(self.backends / namespace),
                             **fields)


@pytest.fixture
def host(tmp_path):
    if not PULUMI.exists() or not YAML_HOST.exists():
        pytest.fail(f"toolchain missing: build it with `make setup` ({PULUMI}, {YAML_HOST})")
    if not shutil.which("bwrap"):
        pytest.fail(f"bubblewrap is missing: {INSTALL_HINT} (or `make setup` as root)")
    found = Host(tmp_path)
    yield found
    found.neighbour.kill()
    found.neighbour.wait()


TARGETS = ["the operator's kubeconfig", "the platform's admin kubeconfig", "beta's state",
           "beta's ServiceAccount token", "beta's program's HOME", "the trusted namespace's run",
           "another update's environment"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_teams_program_reads_nothing_of_the_operators_or_another_teams(host, target):
    canary = host.canary(target)
    assert canary, target
    # Unsandboxed (the namespace trusted, as the operator's own is), the read is the attack.
    exposed = asyncio.run(host.engine(frozenset({"team-alpha"})).up(
        host.request("team-alpha", str(host.canaries[target]))))
    assert exposed.ok, exposed.message
    assert canary in str(exposed.outputs["read"][0])

    sandboxed = asyncio.run(host.engine(frozenset({"strata-system"})).up(
        host.request("team-alpha", str(host.canaries[target]))))
    assert sandboxed.outcome == "failed", sandboxed
    assert "Error reading file" in sandboxed.message and "no such file or directory" in sandboxed.message
    assert canary not in sandboxed.message and canary not in str(sandboxed.outputs)


def test_a_sandboxed_program_keeps_its_own_state_and_files(host):
    """What a team's program needs still works in its sandbox: its own backend, its own source, and a second
    run that finds its stack there."""
    engine = host.engine(frozenset({"strata-system"}))
    own = host.state / "stacks" / "team-alpha" / "reader" / "runs" / "r1" / "src" / "Pulumi.yaml"
    first = asyncio.run(engine.up(host.request("team-alpha", str(own))))
    assert first.ok, first.message
    assert "name: reader" in first.outputs["read"][0]
    assert list((host.backends / "team-alpha").rglob("dev.json")), "its state is in its own backend"
    again = asyncio.run(engine.up(host.request("team-alpha", str(own))))
    assert again.ok and again.summary.get("same") == 1, again.message
    assert (host.state / "stacks" / "team-alpha" / "reader" / "last-update.json").is_file(), \
        "the operator keeps the run's log where no program writes"
    assert not list((host.state / "sandboxes" / "team-alpha").rglob("last-update.json"))


def test_a_file_backend_outside_the_namespaces_directory_is_refused(host):
    engine = host.engine(frozenset({"strata-system"}))
    stolen = host.backends / "beta"
    refused = asyncio.run(engine.up(host.request("team-alpha", "/dev/null", backend=stolen)))
    assert refused.outcome == "blocked" and refused.reason == STALLED_SPEC_INVALID, refused
    assert "spec.backend" in refused.message and str(host.backends / "team-alpha") in refused.message
    assert not (stolen / ".pulumi" / "stacks" / "reader").exists(), "nothing was written there"
    assert host.canaries["beta's state"].read_text() == host.canary("beta's state")


def test_without_bubblewrap_a_teams_program_is_refused_not_run_unisolated(host):
    engine = host.engine(frozenset({"strata-system"}), bwrap=str(host.root / "no-such-bwrap"))
    refused = asyncio.run(engine.up(host.request("team-alpha", str(host.canaries["the operator's kubeconfig"]))))
    assert refused.outcome == "blocked" and refused.reason == EXECUTOR_CANNOT_ISOLATE, refused
    assert "--executor pod" in refused.message and "--trusted-namespace" in refused.message
    assert not list((host.backends / "team-alpha").rglob("dev.json")), "nothing ran"
    trusted = asyncio.run(engine.up(host.request("strata-system", str(host.canaries["the operator's kubeconfig"]))))
    assert trusted.ok, "the operator's own namespace needs no sandbox"


def test_sandboxed_namespaces_have_a_fork_server_and_a_python_cache_each(host):
    engine = host.engine(frozenset({"strata-system"}))

    async def both() -> dict[str, int]:
        for namespace in ("team-alpha", "team-beta"):
            own = host.state / "stacks" / namespace / "reader" / "runs" / "r1" / "src" / "Pulumi.yaml"
            assert (await engine.up(host.request(namespace, str(own)))).ok
        return {domain.namespace: server.process.pid for domain, server in engine._forkservers.items()}

    servers = asyncio.run(both())
    assert set(servers) == {"team-alpha", "team-beta"} and len(set(servers.values())) == 2
    caches = {engine.python_cache(domain) for domain in engine._forkservers}
    assert len(caches) == 2 and engine.settings.python_cache not in caches
