"""Unpacking crafted tarballs (crafted_archives.py) with tarfile as the operator image's Python 3.11.2
has it, and the pod executor's tarball of a checkout that holds links out of it."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from crafted_archives import check_case, crafted_archive_cases
from strata_operator.engine.pod.executor import source_archive
from strata_operator.sources.archive import UnsafeArchive, safe_extract

CASES = crafted_archive_cases()


@pytest.fixture(autouse=True)
def tarfile_without_its_extraction_filter(monkeypatch):
    """This host's Python (3.11.7) has tarfile's filter, the operator image's (3.11.2) has not: the
    filter's names are taken away, and tarfile's own extraction fails if anything uses it."""
    for name in ("data_filter", "tar_filter", "fully_trusted_filter"):
        monkeypatch.delattr(tarfile, name, raising=False)
    monkeypatch.delattr(tarfile.TarFile, "extraction_filter", raising=False)

    def not_used(*args, **kwargs):
        raise AssertionError("tarfile's own extraction was used")

    for name in ("extract", "extractall", "makefile", "makelink"):
        monkeypatch.setattr(tarfile.TarFile, name, not_used)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_crafted_archive_is_refused_naming_its_entry_with_nothing_written_outside(tmp_path: Path, name: str):
    data, expected = CASES[name]
    assert check_case(data, expected, tmp_path) == []


def test_a_legitimate_archive_keeps_its_relative_links_and_no_mode_above_0o755(tmp_path: Path):
    data, expected = CASES["legitimate"]
    assert check_case(data, expected, tmp_path) == []
    dest = tmp_path / "dest"
    assert os.readlink(dest / "proj/shared") == "../shared"
    assert (dest / "proj/later").is_symlink() and not (dest / "proj/later").exists()
    assert (dest / "proj/run.sh").stat().st_mode & 0o7777 == 0o755  # archived as 0o6777
    assert (dest / "proj/Pulumi.yaml").stat().st_mode & 0o7777 == 0o644


def test_an_archive_is_unpacked_only_into_a_directory_of_its_own(tmp_path: Path):
    (tmp_path / "case.tar.gz").write_bytes(CASES["legitimate"][0])
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest/mine").write_text("the caller's\n")
    with pytest.raises(ValueError, match="is not empty"):
        safe_extract(tmp_path / "case.tar.gz", tmp_path / "dest")
    assert (tmp_path / "dest/mine").read_text() == "the caller's\n"


def test_the_pod_executors_tarball_of_a_checkout_holds_its_links_never_what_they_lead_to(tmp_path: Path):
    operator_files = tmp_path / "operator"
    operator_files.mkdir()
    (operator_files / "token").write_text("the operator's token\n")
    checkout = tmp_path / "checkout"
    (checkout / "shared").mkdir(parents=True)
    (checkout / "shared/lib.txt").write_text("shared\n")
    (checkout / "Pulumi.yaml").write_text("name: p\n")
    (checkout / "lib").symlink_to("shared")
    (checkout / "token").symlink_to(operator_files / "token")
    (checkout / "state").symlink_to("../operator")

    source_archive(checkout, tmp_path / "source.tar.gz")
    data = (tmp_path / "source.tar.gz").read_bytes()
    assert b"the operator's token" not in gzip.decompress(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
    assert links == {"lib": "shared", "state": "../operator", "token": str(operator_files / "token")}

    # The workspace agent unpacks it: the in-tree link works, the ones out of the tree are refused.
    with pytest.raises(UnsafeArchive, match="archive link 'token' -> '/.*' points outside"):
        safe_extract(tmp_path / "source.tar.gz", tmp_path / "pod")
    (checkout / "token").unlink()
    source_archive(checkout, tmp_path / "source.tar.gz")
    with pytest.raises(UnsafeArchive, match="archive link 'state' -> '../operator' points outside"):
        safe_extract(tmp_path / "source.tar.gz", tmp_path / "pod")
    (checkout / "state").unlink()
    source_archive(checkout, tmp_path / "source.tar.gz")
    safe_extract(tmp_path / "source.tar.gz", tmp_path / "pod")
    assert (tmp_path / "pod/lib/lib.txt").read_text() == "shared\n"


def test_entries_cost_no_memory_once_unpacked(tmp_path: Path):
    """tarfile keeps every entry it read (with its pax records, up to 64 KiB each): 100,000 of them would
    hold gigabytes of the operator's memory. 400 entries of 60 KiB of records each: 24 MB if kept."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for index in range(400):
            info = tarfile.TarInfo(f"f{index}")
            info.pax_headers = {"comment": "x" * 60_000}
            tar.addfile(info, io.BytesIO(b""))
    (tmp_path / "many.tar.gz").write_bytes(buffer.getvalue())
    tracemalloc.start()
    try:
        safe_extract(tmp_path / "many.tar.gz", tmp_path / "dest")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(list((tmp_path / "dest").iterdir())) == 400
    assert peak < 4_000_000
