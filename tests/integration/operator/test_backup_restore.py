"""`strata backup create|restore` on state the real operator and engine wrote: a layer's state deleted and
restored from the backup, the next update of each Stack changes nothing, as the engine's own change summary
in the backend's update history says (not the operator's account of it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import has_condition, stash_program

REQUEST = "pulumi.com/reconciliation-request"


def _history(backend: Path) -> list[dict]:
    """The engine's update records of a file:// backend, oldest first."""
    files = sorted((backend / ".pulumi" / "history").rglob("*.history.json"), key=lambda p: p.name)
    return [json.loads(path.read_text()) for path in files]


def _strata(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "strata_components.cli", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_deleted_layers_state_restored_from_a_backup_updates_as_a_no_op(stacks, tmp_path):
    root = Path(stacks.backend.removeprefix("file://"))  # the platform layer's backend
    team = root / "teams" / "alpha"  # a team's own, nested as the platform's teams/<team>
    team.mkdir(parents=True)
    stacks.program("layer", stash_program(kubeconfig="k", namespace="team-alpha"))
    layers = {"platform-layer": root, "team-layer": team}
    for name, backend in layers.items():
        stacks.create(name, stacks.spec(programRef={"name": "layer"}, backend=backend.as_uri()))
    for name in layers:
        stacks.wait_ready(name, 120)
    created = {name: _history(backend) for name, backend in layers.items()}
    assert all(set(h[-1]["resourceChanges"]) == {"create"} for h in created.values()), created

    archive = tmp_path / "backup.tar.gz"
    assert _strata("backup", "create", "--backend", root.as_uri(), "--out", str(archive)).strip() == \
        f"{archive}: 2 backend(s), 2 stack(s)"
    shutil.rmtree(team / ".pulumi")  # the team layer's state is lost
    _strata("backup", "restore", str(archive), "--backend", "teams/alpha")
    assert _history(team) == created["team-layer"]

    for name in layers:
        stacks.patch(name, {"metadata": {"annotations": {REQUEST: "after-restore"}}})
    for name, backend in layers.items():
        obj = stacks.wait(name, lambda o: has_condition(o, "Ready")
                          and (o["status"].get("lastUpdate") or {}).get("reconcileRequest") == "after-restore",
                          120, "the update after the restore")
        assert obj["status"]["lastUpdate"]["state"] == "succeeded"
        history = _history(backend)
        assert len(history) == len(created[name]) + 1
        # The engine found every resource as the state said: nothing created, updated or deleted.
        assert history[-1]["result"] == "succeeded", history[-1]
        assert history[-1]["resourceChanges"] == {"same": created[name][-1]["resourceChanges"]["create"]}
