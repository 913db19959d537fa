"""ProjectRepo: which files are published, and that publishing is idempotent (real git, no server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from strata_components.local.gitserver import GitRepos
from strata_components.project_repo import DEFAULT_INCLUDE, collect_files, files_digest, publish

ROOT = Path(__file__).resolve().parents[3]


def test_the_default_include_holds_what_programs_platform_installs():
    files = collect_files(ROOT, DEFAULT_INCLUDE)
    assert {"pyproject.toml", "programs/platform/__main__.py", "programs/platform/uv.lock",
            "components/team.py", "operator/strata_operator/__init__.py"} <= set(files)
    assert not [path for path in files if "__pycache__" in path or path.endswith(".pyc")]


def test_collect_skips_build_leftovers_and_names_a_missing_include(tmp_path):
    (tmp_path / "programs" / "p" / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "programs" / "p" / "venv" / "lib" / "x.py").write_text("x")
    (tmp_path / "programs" / "p" / "__main__.py").write_text("print(1)\n")
    (tmp_path / "programs" / "p" / "__main__.cpython-311.pyc").write_bytes(b"\0\1")
    assert collect_files(tmp_path, ["programs"]) == {"programs/p/__main__.py": "print(1)\n"}
    with pytest.raises(ValueError, match="'nothing' does not exist"):
        collect_files(tmp_path, ["programs", "nothing"])


def test_digest_changes_with_content_and_paths():
    base = {"a.py": "1", "b/c.py": "2"}
    assert files_digest(base) == files_digest(dict(reversed(base.items())))
    assert files_digest(base) != files_digest({**base, "a.py": "3"})
    assert files_digest(base) != files_digest({"a2.py": "1", "b/c.py": "2"})


def test_publish_commits_once_per_content_and_removes_dropped_files(tmp_path):
    repos = GitRepos(tmp_path / "git", "http://127.0.0.1:1")
    first = publish(repos, "strata", {"programs/p/__main__.py": "v1\n", "old.txt": "gone soon\n"})
    assert publish(repos, "strata", {"programs/p/__main__.py": "v1\n", "old.txt": "gone soon\n"}) == first
    second = publish(repos, "strata", {"programs/p/__main__.py": "v2\n"})
    assert second != first and repos.head("strata") == second
    assert set(repos.tree("strata")) == {"programs/p/__main__.py"}
    shown = subprocess.run(["git", "--git-dir", str(tmp_path / "git" / "strata.git"), "show",
                            f"{second}:programs/p/__main__.py"], capture_output=True, text=True, check=True)
    assert shown.stdout == "v2\n"
    count = subprocess.run(["git", "--git-dir", str(tmp_path / "git" / "strata.git"), "rev-list", "--count", "main"],
                           capture_output=True, text=True, check=True)
    assert count.stdout.strip() == "2"
