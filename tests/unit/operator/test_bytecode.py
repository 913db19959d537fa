"""Bytecode shared by the environments of one requirements key: compiled once from a real environment
(real uv, real py_compile), then copied into the next; Python itself says which .pyc files it used."""

import os
import subprocess
import sys
import time

from strata_operator.engine.process import bytecode
from strata_operator.engine.process.bytecode import (compile_store, imported_list, install_store, prune, record_imported,
                                                    site_packages)
from strata_operator.engine.process.virtualenvs import ensure_virtualenv


def _imports(site, module: str) -> tuple[str, str]:
    """What `import module` prints, and Python's verbose lines about that module's bytecode."""
    done = subprocess.run([sys.executable, "-v", "-c", f"import {module}; print({module}.VALUE)"],
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.defpath})
    return done.stdout.strip(), "\n".join(line for line in done.stderr.splitlines() if f"{module}." in line)


def test_an_environment_gets_the_bytecode_its_key_imported_and_python_uses_it(tmp_path):
    def project(stack: str):  # each Stack's own copy of the same program
        path = tmp_path / stack / "src"
        path.mkdir(parents=True)
        (path / "Pulumi.yaml").write_text("name: app\nruntime: python\n")
        (path / "requirements.txt").write_text("# nothing beyond the seeded pip\n")
        return path

    def run(venv, code: str) -> str:  # the program's run: Python writes the bytecode of what it imports
        return subprocess.run([str(venv / "bin" / "python"), "-v", "-c", code], capture_output=True, text=True,
                              check=True, env={"PATH": os.defpath}).stderr

    cache = tmp_path / "uv-bytecode"
    first = ensure_virtualenv(project("stack-a"), tmp_path / "stack-a" / "venvs", tmp_path / "uv", bytecode=cache)
    store = cache / first.name
    deadline = time.monotonic() + 120  # compiled in the background, at the lowest priority
    while not store.is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.is_dir(), "the key's bytecode was never compiled"
    assert not list(cache.glob(".*.partial"))
    run(first, "import pip")
    record_imported(first, cache)
    imported = imported_list(cache, first.name)
    assert any(name.startswith("pip/__pycache__/__init__.") for name in imported)
    assert not any(name.startswith("pip/_internal/commands/") for name in imported)
    # Another Stack's environment of the same key gets the store's bytecode of those modules, no other,
    # and Python accepts it as it is.
    second = ensure_virtualenv(project("stack-b"), tmp_path / "stack-b" / "venvs", tmp_path / "uv", bytecode=cache)
    assert second.name == first.name and second != first
    site = site_packages(second)
    assert not list((site / "pip" / "_internal" / "commands").glob("__pycache__/*.pyc"))
    pyc = next((site / "pip" / "__pycache__").glob("__init__.*.pyc"))
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11  # checked-hash, from the store
    assert f"{pyc} matches" in run(second, "import pip")
    # What its program imports beyond the list joins it.
    run(second, "import pip._internal.commands.download")
    record_imported(second, cache)
    assert any(name.startswith("pip/_internal/commands/") for name in imported_list(cache, first.name))


def test_an_environment_given_the_whole_store_records_nothing(tmp_path):
    site = tmp_path / "venvs" / "key1" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (site / "mod.py").write_text("VALUE = 1\n")
    compile_store(site, tmp_path / "cache" / "key1")
    assert bytecode.share_bytecode(tmp_path / "venvs" / "key1", tmp_path / "cache") == "all"
    assert (site / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc").is_file()
    # Every module's bytecode is there, imported or not: nothing can be learnt from it.
    record_imported(tmp_path / "venvs" / "key1", tmp_path / "cache")
    assert imported_list(tmp_path / "cache", "key1") == set()


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


def test_a_pyc_a_wheel_shipped_is_replaced_not_written_through_its_link_into_the_cache(tmp_path):
    site, cached = tmp_path / "site", tmp_path / "uv-cache" / "mod.pyc"
    (site / "__pycache__").mkdir(parents=True)
    cached.parent.mkdir()
    (site / "mod.py").write_text("VALUE = 1\n")
    store = compile_store(site, tmp_path / "cache" / "key")
    shipped = site / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc"
    cached.write_bytes(b"the wheel's own bytecode")
    os.link(cached, shipped)  # as uv installs it
    cached.chmod(0o444)
    for only in (None, {f"__pycache__/{shipped.name}"}):
        install_store(store, site, only)
        assert cached.read_bytes() == b"the wheel's own bytecode" and cached.stat().st_nlink == 1
        assert shipped.read_bytes() == (store / "__pycache__" / shipped.name).read_bytes()
        os.unlink(shipped)
        os.link(cached, shipped)


def test_the_compile_runs_once_per_key_without_the_stacks_environment(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(bytecode.subprocess, "Popen", lambda args, **kwargs: started.append((args, kwargs)))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "not-for-the-compile")
    venv, other, cache = tmp_path / "venvs" / "key1", tmp_path / "other" / "key1", tmp_path / "uv-bytecode"
    venv.mkdir(parents=True)
    other.mkdir(parents=True)
    assert bytecode.share_bytecode(venv, cache) == "none"
    (args, kwargs), = started
    assert args[-2:] == [str(site_packages(venv)), str(cache / "key1")]
    assert set(kwargs["env"]) == {"PATH", "PYTHONPATH"} and kwargs["start_new_session"]
    # While that compile runs (its partial store is there), another environment of the key starts none.
    (cache / f".key1.{12345}.partial").mkdir()
    assert bytecode.share_bytecode(other, cache) == "none"
    assert len(started) == 1


def test_only_the_most_recently_used_stores_are_kept(tmp_path):
    for age, name in enumerate(["newest", "older", "oldest"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - age * 60,) * 2)
    (tmp_path / ".compiling.1.partial").mkdir()
    prune(tmp_path, kept=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".compiling.1.partial", "newest", "older"]
