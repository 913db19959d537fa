"""The agent's runtime for a workspace image of the template's (bundle.py): what it copies, read from ldd
and from what the agent imports."""

from __future__ import annotations

from pathlib import Path

from strata_operator.engine.pod.bundle import LOADER, launcher, parse_ldd, top_level_entries

LDD = """\tlinux-vdso.so.1 (0x00007ffd1d9f2000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f8c1c6a0000)
\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f8c1c681000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f8c1c4a0000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f8c1c7a5000)
"""


def test_ldd_gives_each_library_by_its_soname_and_the_loader():
    assert parse_ldd(LDD) == {"libm.so.6": Path("/lib/x86_64-linux-gnu/libm.so.6"),
                              "libz.so.1": Path("/lib/x86_64-linux-gnu/libz.so.1"),
                              "libc.so.6": Path("/lib/x86_64-linux-gnu/libc.so.6"),
                              LOADER: Path("/lib64/ld-linux-x86-64.so.2")}
    assert parse_ldd("\tstatically linked\n") == {}


def test_whole_top_level_packages_are_copied_for_what_was_imported(tmp_path):
    site = tmp_path / "site-packages"
    for path in ("aiohttp/web.py", "aiohttp/_http.so", "yaml/__init__.py", "six.py", "kopf/__init__.py"):
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text("")
    imported = [site / "aiohttp/web.py", site / "six.py", site / "yaml/__init__.py", Path("/usr/lib/python3.11/os.py")]
    assert top_level_entries(imported, [site]) == {site / "aiohttp", site / "six.py", site / "yaml"}


def test_the_bundled_python_starts_through_its_own_loader_and_libraries():
    root = Path("/var/run/strata/runtime")
    assert launcher(root) == [f"{root}/lib/{LOADER}", "--library-path", f"{root}/lib", f"{root}/bin/python3"]
