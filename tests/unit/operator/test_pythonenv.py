"""Per-Stack virtualenvs for Python programs, keyed by the requirements' hash (real venvs, no network)."""

import sys

import pytest
import yaml

from strata_operator.engine.process.virtualenvs import (PythonEnvError, ensure_virtualenv, local_requirement_dirs,
                                                        planned_virtualenv, requirements_key, use_virtualenv)


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
    assert written["runtime"] == {"name": "python", "options": {"typechecker": "mypy", "virtualenv": str(tmp_path / "venv")}}
    assert written["description"] == "keep me"


def test_virtualenv_is_built_once_reused_and_replaced_when_requirements_change(tmp_path):
    venvs = tmp_path / "venvs"
    first = ensure_virtualenv(_project(tmp_path / "v1", "python"), venvs)
    assert (first / "bin" / "python").exists() and (first / ".strata-complete").exists()
    marker_time = (first / ".strata-complete").stat().st_mtime_ns
    again = ensure_virtualenv(_project(tmp_path / "v1-again", "python"), venvs)
    assert again == first and (first / ".strata-complete").stat().st_mtime_ns == marker_time
    changed = ensure_virtualenv(_project(tmp_path / "v2", "python", "# another comment\n"), venvs)
    assert changed != first and changed.exists() and not first.exists()
    assert yaml.safe_load((tmp_path / "v2" / "Pulumi.yaml").read_text())["runtime"]["options"]["virtualenv"] == str(changed)


def test_failed_install_names_requirements_and_leaves_nothing_half_built(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no network: the requirement cannot be found
    project = _project(tmp_path / "bad", "python", "surely-not-a-real-package-strata==0.0.1\n")
    with pytest.raises(PythonEnvError, match="installing requirements.txt failed") as error:
        ensure_virtualenv(project, tmp_path / "venvs")
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
    (library / "mod.py").write_text("VALUE = 2\n")
    assert planned_virtualenv(project, tmp_path / "venvs", "3.11") != first  # a new commit of the library does


def test_local_requirement_forms(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    text = f"./a\n-e ./b\nfile://{tmp_path / 'c'}\nrequests==2.0\n./missing\n# ./a\n"
    assert local_requirement_dirs(text, tmp_path) == [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
