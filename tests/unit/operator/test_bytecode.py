"""Bytecode shared by the environments of one requirements key: compiled once from a real environment
(real uv, real py_compile), then copied into the next; Python itself says which .pyc files it used."""

import os
import subprocess
import sys
import time

from strata_operator.engine.process import bytecode
from strata_operator.engine.process.bytecode import compile_store, install_store, prune, site_packages
from strata_operator.engine.process.virtualenvs import ensure_virtualenv


def _imports(site, module: str) -> tuple[str, str]:
    """What `import module` prints, and Python's verbose lines about that module's bytecode."""
    done = subprocess.run([sys.executable, "-v", "-c", f"import {module}; print({module}.VALUE)"],
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.defpath})
    return done.stdout.strip(), "\n".join(line for line in done.stderr.splitlines() if f"{module}." in line)


def test_an_environment_gets_the_bytecode_of_its_key_and_python_uses_it(tmp_path):
    def project(stack: str):  # each Stack's own copy of the same program
        path = tmp_path / stack / "src"
        path.mkdir(parents=True)
        (path / "Pulumi.yaml").write_text("name: app\nruntime: python\n")
        (path / "requirements.txt").write_text("# nothing beyond the seeded pip\n")
        return path
    cache = tmp_path / "uv-bytecode"
    first = ensure_virtualenv(project("stack-a"), tmp_path / "stack-a" / "venvs", tmp_path / "uv", bytecode=cache)
    store = cache / first.name
    deadline = time.monotonic() + 120  # compiled in the background, at the lowest priority
    while not store.is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.is_dir(), "the key's bytecode was never compiled"
    assert not list(cache.glob(".*.partial"))
    # Another Stack's environment of the same key: its pip comes with bytecode Python accepts as is.
    second = ensure_virtualenv(project("stack-b"), tmp_path / "stack-b" / "venvs", tmp_path / "uv", bytecode=cache)
    assert second.name == first.name and second != first
    pyc = next((site_packages(second) / "pip" / "__pycache__").glob("__init__.*.pyc"))
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11  # checked-hash
    verbose = subprocess.run([str(second / "bin" / "python"), "-v", "-c", "import pip"], capture_output=True,
                             text=True, check=True, env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": os.defpath}).stderr
    assert f"{pyc} matches" in verbose


def test_bytecode_of_a_rewritten_source_is_not_used_by_another_environment(tmp_path):
    original, rewritten = tmp_path / "a", tmp_path / "b"
    for site in (original, rewritten):
        site.mkdir()
        (site / "kept.py").write_text("VALUE = 'kept'\n")
    (original / "changed.py").write_text("VALUE = 'compiled in the store'\n")
    (rewritten / "changed.py").write_text("VALUE = 'this environment'\n")
    store = compile_store(original, tmp_path / "cache" / "key")
    install_store(store, rewritten)
    assert (rewritten / "__pycache__" / f"changed.{sys.implementation.cache_tag}.pyc").exists()
    # The store's bytecode is rejected for the source that differs, used for the one that does not.
    assert _imports(rewritten, "changed")[0] == "this environment"
    value, verbose = _imports(rewritten, "kept")
    assert value == "kept" and "matches" in verbose


def test_the_compile_runs_once_per_key_without_the_stacks_environment(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(bytecode.subprocess, "Popen", lambda args, **kwargs: started.append((args, kwargs)))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "not-for-the-compile")
    venv, cache = tmp_path / "venvs" / "key1", tmp_path / "uv-bytecode"
    assert bytecode.share_bytecode(venv, cache) is False
    (args, kwargs), = started
    assert args[-2:] == [str(site_packages(venv)), str(cache / "key1")]
    assert set(kwargs["env"]) == {"PATH", "PYTHONPATH"} and kwargs["start_new_session"]
    # While that compile runs (its partial store is there), another environment of the key starts none.
    (cache / f".key1.{12345}.partial").mkdir()
    assert bytecode.share_bytecode(tmp_path / "other" / "key1", cache) is False
    assert len(started) == 1


def test_only_the_most_recently_used_stores_are_kept(tmp_path):
    for age, name in enumerate(["newest", "older", "oldest"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - age * 60,) * 2)
    (tmp_path / ".compiling.1.partial").mkdir()
    prune(tmp_path, kept=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".compiling.1.partial", "newest", "older"]
