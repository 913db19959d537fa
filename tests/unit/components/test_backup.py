"""Backups of file:// backends: what is found, what waits, what is refused, what a restore puts back.
Plain files here; tests/integration/operator/test_backup_restore.py restores real engine state."""

import io
import json
import shutil
import tarfile
import threading
import time

import pytest

from strata_components import backup
from strata_components.cli import main


def _backend(root, stacks, project="proj"):
    for stack, content in stacks.items():
        path = root / ".pulumi" / "stacks" / project / f"{stack}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (root / ".pulumi" / "meta.yaml").write_text("version: 1\n")
    return root


@pytest.fixture
def home(tmp_path):
    root = _backend(tmp_path / "pulumi", {"dev": "bootstrap", "platform": "platform"})
    _backend(root / "teams" / "alpha", {"alpha": "handoff"}, project="strata-team-handoff")
    _backend(root / "teams" / "alpha", {"app": "app"}, project="app")
    return root


def _lock(backend, stack="proj/dev"):
    lock = backend / ".pulumi" / "locks" / "organization" / stack / "0c1d.json"
    lock.parent.mkdir(parents=True)
    lock.write_text("{}")
    return lock


def test_every_backend_below_the_root_is_found_with_its_stacks(home):
    assert backup.find_backends(home) == [home, home / "teams" / "alpha"]
    assert backup.stacks_of(backup.state_files(home / "teams" / "alpha")) == ["app/app",
                                                                              "strata-team-handoff/alpha"]


def test_a_deleted_teams_state_comes_back_exactly_and_the_others_are_untouched(home, tmp_path):
    manifest = backup.create([home], tmp_path / "b.tar.gz")
    assert [len(backup.stacks_of(e["files"])) for e in manifest["backends"]] == [2, 2]
    before = backup.state_files(home / "teams" / "alpha")
    shutil.rmtree(home / "teams" / "alpha" / ".pulumi")
    (home / ".pulumi" / "stacks" / "proj" / "dev.json").write_text("changed since")
    restored = backup.restore(tmp_path / "b.tar.gz", ["teams/alpha"])
    assert [entry.path for entry in restored] == [str(home / "teams" / "alpha")]
    assert backup.state_files(home / "teams" / "alpha") == before
    assert (home / ".pulumi" / "stacks" / "proj" / "dev.json").read_text() == "changed since"
    # Restoring all of it removes what was written since.
    (home / "teams" / "alpha" / ".pulumi" / "stacks" / "app" / "extra.json").write_text("new")
    backup.restore(tmp_path / "b.tar.gz")
    assert (home / ".pulumi" / "stacks" / "proj" / "dev.json").read_text() == "bootstrap"
    assert not (home / "teams" / "alpha" / ".pulumi" / "stacks" / "app" / "extra.json").exists()


def test_a_backup_waits_for_a_running_update_and_never_copies_its_lock(home, tmp_path):
    lock = _lock(home)
    said = []
    threading.Timer(1.5, lock.unlink).start()
    started = time.monotonic()
    manifest = backup.create([home], tmp_path / "b.tar.gz", wait_seconds=30, say=said.append)
    assert time.monotonic() - started >= 1.4
    assert said[0] == f"  {home}: waiting for the running update(s) of proj/dev to finish"
    assert not any(name.startswith("locks/") for entry in manifest["backends"] for name in entry["files"])


def test_a_copy_an_update_wrote_into_is_thrown_away_and_taken_again(home, tmp_path, monkeypatch):
    checkpoint = home / ".pulumi" / "stacks" / "proj" / "dev.json"
    real = backup.build_manifest
    calls = []

    def update_meanwhile(roots, entries):  # an update writes between the digests and the copy
        calls.append(1)
        if len(calls) == 1:
            checkpoint.write_text("written during the copy")
        return real(roots, entries)

    monkeypatch.setattr(backup, "build_manifest", update_meanwhile)
    said = []
    manifest = backup.create([home], tmp_path / "b.tar.gz", say=said.append)
    assert len(calls) == 2 and any("state changed during the copy" in line for line in said)
    checkpoint.write_text("later")
    backup.restore(tmp_path / "b.tar.gz")
    assert checkpoint.read_text() == "written during the copy"
    assert manifest["backends"][0]["files"]["stacks/proj/dev.json"] == backup.state_files(home)["stacks/proj/dev.json"]


def test_a_backup_gives_up_naming_the_locked_stack_and_a_restore_refuses_under_a_lock(home, tmp_path):
    backup.create([home], tmp_path / "b.tar.gz")
    _lock(home / "teams" / "alpha", "app/app")
    with pytest.raises(backup.BackupError, match=r"teams/alpha: updates still hold locks \(app/app\)"):
        backup.create([home], tmp_path / "c.tar.gz", wait_seconds=0)
    with pytest.raises(backup.BackupError, match=r"an update is running \(app/app hold a lock\); suspend the Stacks"):
        backup.restore(tmp_path / "b.tar.gz")
    assert not (tmp_path / "c.tar.gz").exists()


def test_a_damaged_backup_is_refused_before_anything_is_replaced(home, tmp_path):
    backup.create([home], tmp_path / "b.tar.gz")
    with tarfile.open(tmp_path / "b.tar.gz", "r:gz") as archive:
        members = [(m, archive.extractfile(m).read() if m.isfile() else None) for m in archive.getmembers()]
    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as archive:
        for member, data in members:
            if member.name.endswith("dev.json"):
                data = b"tampered"
                member.size = len(data)
            archive.addfile(member, io.BytesIO(data) if data is not None else None)
    (home / ".pulumi" / "stacks" / "proj" / "dev.json").write_text("current")
    with pytest.raises(backup.BackupError, match="does not match the manifest; the backup is damaged"):
        backup.restore(tmp_path / "bad.tar.gz")
    assert (home / ".pulumi" / "stacks" / "proj" / "dev.json").read_text() == "current"


def test_unknown_backends_and_other_schemes_are_named(home, tmp_path):
    backup.create([home], tmp_path / "b.tar.gz")
    with pytest.raises(backup.BackupError, match="--backend teams/beta: not in this backup"):
        backup.restore(tmp_path / "b.tar.gz", ["teams/beta"])
    with pytest.raises(backup.BackupError, match="only file:// backends"):
        backup.backend_dir("s3://bucket/state")
    with pytest.raises(backup.BackupError, match="no Pulumi state"):
        backup.create([tmp_path / "empty"], tmp_path / "d.tar.gz")


def test_the_cli_backs_up_the_dev_homes_backend_and_restores_it(home, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STRATA_HOME", str(home.parent))  # the dev home's backend is <home>/pulumi
    assert main(["backup", "create", "--out", str(tmp_path / "b.tar.gz")]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path / 'b.tar.gz'}: 2 backend(s), 4 stack(s)"
    (home / ".pulumi" / "stacks" / "proj" / "dev.json").unlink()
    assert main(["backup", "restore", str(tmp_path / "b.tar.gz")]) == 0
    assert (home / ".pulumi" / "stacks" / "proj" / "dev.json").read_text() == "bootstrap"
    assert main(["backup", "restore", str(tmp_path / "missing.tar.gz")]) == 1
    assert "not a strata backup" in capsys.readouterr().err
    assert json.loads(tarfile.open(tmp_path / "b.tar.gz").extractfile("strata-backup.json").read())["format"] == 1
