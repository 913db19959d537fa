"""Per-Stack virtualenvs for Python programs, keyed by the hash of what declares their dependencies: real
environments, built by the real uv (or pip, where a program asks for it), with no network."""

import os
import subprocess
import sys

import pytest
from uv import find_uv_bin
import yaml

from strata_operator.engine.process.virtualenvs import (PythonEnvError, ensure_virtualenv, local_requirement_dirs,
                                                        local_source_dirs, planned_virtualenv, requirements_key,
                                                        use_virtualenv, uv_environment)


def _project(path, runtime, requirements: str | None = "# nothing to install\n"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "app", "runtime": runtime, "description": "keep me"}))
    if requirements is not None:
        (path / "requirements.txt").write_text(requirements)
    return path


def test_key_follows_requirements_and_interpreter_only():
    assert requirements_key(b"pulumi==3.259.0\n", "3.11.7") == requirements_key(b"pulumi==3.259.0\n", "3.11.7")
    assert requirements_key(b"pulumi==3.259.0\n", "3.11.7") != requirements_key(b"pulumi==3.258.0\n", "3.11.7")
    assert requirements_key(b"pulumi==3.259.0\n", "3.11.7") != requirements_key(b"pulumi==3.259.0\n", "3.12.1")


def test_only_python_projects_with_requirements_get_one(tmp_path):
    assert planned_virtualenv(_project(tmp_path / "yaml", "yaml"), tmp_path / "venvs", "3.11") is None
    assert planned_virtualenv(_project(tmp_path / "bare", "python", None), tmp_path / "venvs", "3.11") is None
    assert planned_virtualenv(tmp_path / "empty", tmp_path / "venvs", "3.11") is None
    planned = planned_virtualenv(_project(tmp_path / "py", {"name": "python"}), tmp_path / "venvs", "3.11")
    assert planned is not None and planned.parent == tmp_path / "venvs"


def test_project_is_pointed_at_the_virtualenv_keeping_its_other_settings(tmp_path):
    project = _project(tmp_path / "p", {"name": "python", "options": {"toolchain": "uv", "typechecker": "mypy"}})
    use_virtualenv(project / "Pulumi.yaml", tmp_path / "venv")
    written = yaml.safe_load((project / "Pulumi.yaml").read_text())
    assert written["runtime"] == {"name": "python", "options": {"toolchain": "pip", "typechecker": "mypy",
                                                                 "virtualenv": str(tmp_path / "venv")}}
    assert written["description"] == "keep me"


def test_virtualenv_is_built_once_reused_and_replaced_when_requirements_change(tmp_path):
    venvs = tmp_path / "venvs"
    first = ensure_virtualenv(_project(tmp_path / "v1", "python"), venvs, tmp_path / "uv-cache")
    assert (first / "bin" / "python").exists() and (first / ".strata-complete").exists()
    marker_time = (first / ".strata-complete").stat().st_mtime_ns
    again = ensure_virtualenv(_project(tmp_path / "v1-again", "python"), venvs, tmp_path / "uv-cache")
    assert again == first and (first / ".strata-complete").stat().st_mtime_ns == marker_time
    changed = ensure_virtualenv(_project(tmp_path / "v2", "python", "# another comment\n"), venvs,
                                tmp_path / "uv-cache")
    assert changed != first and changed.exists() and not first.exists()
    assert yaml.safe_load((tmp_path / "v2" / "Pulumi.yaml").read_text())["runtime"]["options"]["virtualenv"] == str(changed)


def test_failed_install_names_requirements_and_leaves_nothing_half_built(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network: the requirement cannot be found
    project = _project(tmp_path / "bad", "python", "surely-not-a-real-package-strata==0.0.1\n")
    with pytest.raises(PythonEnvError, match="installing requirements.txt failed") as error:
        ensure_virtualenv(project, tmp_path / "venvs", tmp_path / "uv-cache")
    assert "surely-not-a-real-package-strata" in str(error.value)
    planned = planned_virtualenv(project, tmp_path / "venvs", sys.version)
    assert not (planned / ".strata-complete").exists()


def test_a_local_directory_requirement_is_part_of_the_key(tmp_path):
    repo = tmp_path / "repo"
    library = repo / "lib"
    library.mkdir(parents=True)
    (library / "pyproject.toml").write_text("[project]\nname = 'lib'\n")
    project = _project(repo / "programs" / "platform", "python", "pulumi==3.259.0\n../../lib  # the library\n")
    first = planned_virtualenv(project, tmp_path / "venvs", "3.11")
    (library / "__pycache__").mkdir()
    (library / "__pycache__" / "x.pyc").write_bytes(b"cache")
    assert planned_virtualenv(project, tmp_path / "venvs", "3.11") == first  # caches do not count
    # The program's own directory inside the installed tree: the stack's settings the operator writes
    # there do not count either.
    tree = _project(repo / "programs" / "app", "python", "pulumi==3.259.0\n../..  # the whole repository\n")
    whole = planned_virtualenv(tree, tmp_path / "venvs", "3.11")
    (tree / "Pulumi.dev.yaml").write_text("config:\n  app:backend: file:///home/a\n")
    assert planned_virtualenv(tree, tmp_path / "venvs", "3.11") == whole
    (library / "mod.py").write_text("VALUE = 2\n")
    assert planned_virtualenv(project, tmp_path / "venvs", "3.11") != first  # a new commit of the library does
    assert planned_virtualenv(tree, tmp_path / "venvs", "3.11") != whole


def test_local_requirement_forms(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    text = f"./a\n-e ./b\nfile://{tmp_path / 'c'}\nrequests==2.0\n./missing\n# ./a\n"
    assert local_requirement_dirs(text, tmp_path) == [tmp_path / "a", tmp_path / "b", tmp_path / "c"]


def _uv_project(path, dependencies=(), sources=""):
    """A Python program that asks for the uv toolchain, with its lock file (uv locks a project with no
    dependencies, or only local ones, without any network)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "app", "runtime": {"name": "python",
                                                                                 "options": {"toolchain": "uv"}}}))
    (path / "pyproject.toml").write_text(
        f"[project]\nname = 'app'\nversion = '0.1.0'\nrequires-python = '>=3.11'\ndependencies = {list(dependencies)!r}\n"
        f"[tool.uv]\npackage = false\n{sources}")
    subprocess.run([find_uv_bin(), "lock", "--offline", "--python", sys.executable], cwd=path, check=True,
                   capture_output=True, env={**os.environ, "UV_CACHE_DIR": str(path.parent / "lock-cache")})
    return path


def test_a_uv_project_is_synced_from_its_lock_into_the_stacks_environment(tmp_path):
    library = tmp_path / "lib"
    library.mkdir()
    (library / "pyproject.toml").write_text("[project]\nname = 'lib'\nversion = '1.0'\n[build-system]\n"
                                            "requires = []\nbuild-backend = 'backend'\nbackend-path = ['.']\n")
    (library / "backend.py").write_text(BACKEND)
    project = _uv_project(tmp_path / "app", ["lib"], "[tool.uv.sources]\nlib = { path = '../lib' }\n")
    assert local_source_dirs((project / "pyproject.toml").read_text(), project) == [library]
    venvs, cache = tmp_path / "venvs", tmp_path / "uv-cache"
    venv = ensure_virtualenv(project, venvs, cache)
    assert "uv = " in (venv / "pyvenv.cfg").read_text() and cache.is_dir()
    assert subprocess.run([venv / "bin" / "python", "-c", "import lib_marker"], capture_output=True).returncode == 0
    # Hard-linked from the shared cache and read-only: a program opening it to write is refused rather
    # than rewriting what the other Stacks install (as any user but root).
    installed = next(venv.glob("lib/python*/site-packages/lib_marker.py"))
    assert installed.stat().st_nlink > 1 and any(cache.rglob("lib_marker.py"))
    assert installed.stat().st_mode & 0o222 == 0
    assert (venv / "pyvenv.cfg").stat().st_mode & 0o200  # uv's own files, not the cache's, stay writable
    runtime = yaml.safe_load((project / "Pulumi.yaml").read_text())["runtime"]
    # pulumi manages nothing itself: pip over this environment (which has pip), not uv for its uv.lock.
    assert runtime == {"name": "python", "options": {"toolchain": "pip", "virtualenv": str(venv)}}
    assert (venv / "bin" / "pip").exists()
    # The lock, the project file and the local library it installs are the key; nothing else is.
    (project / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "app", "runtime": {"name": "python",
                                                                                    "options": {"toolchain": "uv"}}}))
    assert planned_virtualenv(project, venvs, sys.version) == venv
    (library / "lib_marker.py").write_text("VALUE = 2\n")
    assert planned_virtualenv(project, venvs, sys.version) != venv


BACKEND = """\
import os, zipfile

def build_wheel(directory, config_settings=None, metadata_directory=None):
    name = "lib-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as wheel:
        wheel.writestr("lib_marker.py", "VALUE = 1\\n")
        wheel.writestr("lib-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: lib\\nVersion: 1.0\\n")
        wheel.writestr("lib-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        wheel.writestr("lib-1.0.dist-info/RECORD", "")
    return name
"""


def test_requirements_are_installed_by_uv_unless_the_program_asks_for_pip(tmp_path):
    by_uv = ensure_virtualenv(_project(tmp_path / "default", "python"), tmp_path / "a", tmp_path / "uv-cache")
    assert "uv = " in (by_uv / "pyvenv.cfg").read_text() and (by_uv / "bin" / "pip").exists()  # seeded with pip
    pip = {"name": "python", "options": {"toolchain": "pip"}}
    by_pip = ensure_virtualenv(_project(tmp_path / "pip", pip), tmp_path / "b", tmp_path / "uv-cache")
    assert "uv = " not in (by_pip / "pyvenv.cfg").read_text()


def test_a_uv_toolchain_without_pyproject_names_the_fix(tmp_path):
    project = _project(tmp_path / "p", {"name": "python", "options": {"toolchain": "uv"}})
    with pytest.raises(PythonEnvError, match="no pyproject.toml declaring its dependencies"):
        ensure_virtualenv(project, tmp_path / "venvs", tmp_path / "uv-cache")


def test_uv_reaches_the_index_the_way_pip_is_told_to_and_trusts_the_hosts_certificates(tmp_path):
    env = uv_environment({"PIP_INDEX_URL": "https://mirror/simple", "PIP_NO_INDEX": "1", "PIP_CERT": "/ca.pem",
                          "UV_INDEX": "https://kept/simple", "PIP_EXTRA_INDEX_URL": "https://ignored/simple"},
                         tmp_path / "cache")
    assert env["UV_DEFAULT_INDEX"] == "https://mirror/simple" and env["UV_NO_INDEX"] == "1"
    assert env["SSL_CERT_FILE"] == "/ca.pem" and env["UV_SYSTEM_CERTS"] == "1"
    assert env["UV_INDEX"] == "https://kept/simple"  # uv's own setting wins over pip's
    assert env["UV_CACHE_DIR"] == str(tmp_path / "cache") and env["UV_LINK_MODE"] == "hardlink"
