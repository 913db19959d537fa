"""Crafted tarballs against `safe_extract`, with what each must come to: the cases of
test_archive_safety.py, and a check that runs them with no test framework, so that they can also run on
the operator image's own Python (Debian's 3.11.2, without tarfile's extraction filter): copy this file
into an operator pod and run it there with the image's `python` (exit status 0: every case held).

Each case is unpacked into DIR/dest beside DIR/sentinel (a directory holding one file, `keep`), so that a
link may aim at the sentinel as `../sentinel`; nothing may appear in the sentinel, nor at OUTSIDE.
Only the standard library and strata_operator are imported.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from strata_operator.sources.archive import SizeCap, SourceError, safe_extract

CASE_MAX_BYTES = 1024 * 1024
OUTSIDE = "/tmp/strata-crafted-archive-pwned"  # what an absolute name or a link to / would write

Member = tuple[tarfile.TarInfo, bytes | None]
# A refusal: a SourceError whose message contains this text (it names the entry), or one of these texts; or an
# archive that unpacks: these paths under the destination (read through its links) hold these bytes.
Expected = str | tuple[str, ...] | dict[str, bytes]


def _file(name: str, data: bytes, mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _entry(name: str, kind: bytes, linkname: str = "", mode: int = 0o755) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info, None


def _link(name: str, target: str) -> Member:
    return _entry(name, tarfile.SYMTYPE, target)


def _tarball(*members: Member) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _header(info: tarfile.TarInfo, size_field: bytes | None = None) -> bytes:
    """A raw header block, its size field replaced as given (the checksum made right again)."""
    block = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    if size_field is not None:
        block[124:136] = size_field
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % tarfile.calc_chksums(bytes(block))[0]
    return bytes(block)


def _pax_bomb() -> bytes:
    big = tarfile.TarInfo("big-header")
    big.pax_headers = {"comment": "x" * 200_000}
    return _tarball(_file("ok.txt", b"fine\n"), (big, b""))


def crafted_archive_cases() -> dict[str, tuple[bytes, Expected]]:
    """name -> (a gzipped tarball, what unpacking it must come to), capped at CASE_MAX_BYTES."""
    end = b"\0" * 1024
    claims_data = tarfile.TarInfo("dir")
    claims_data.type, claims_data.size = tarfile.DIRTYPE, 10 * 1024 * 1024
    liar, big = tarfile.TarInfo("liar"), tarfile.TarInfo("big")
    big.size = 1024 * 1024
    return {
        # Links made in this order each resolve inside when made; together x leads to ../sentinel/pwned.
        "link-chain": (_tarball(_link("x", "y/sentinel/pwned"), _link("y", "a/.."), _link("a", ".")),
                       "archive link 'x' -> 'y/sentinel/pwned' points outside"),
        # The same chain, then a regular member of x's name: written through the chain before this rewrite.
        "link-swap": (_tarball(_link("x", "y/sentinel/pwned"), _link("y", "a/.."), _link("a", "."),
                               _file("x", b"pwned\n")), "archive entry 'x' appears twice"),
        "link-chain-then-file": (_tarball(_link("a", "."), _link("a/b", ".."), _file("a/b/sentinel/pwned", b"pwned\n")),
                                 "archive entry 'a' collides"),
        "link-through-link": (_tarball(_link("esc", "../sentinel"), _link("esc/planted", "keep")),
                              "archive entry 'esc/planted' is written through 'esc'"),
        "link-to-root-then-file": (_tarball(_link("root", "/"), _file("root" + OUTSIDE, b"pwned\n")),
                                   "archive link 'root' -> '/' points outside"),
        "link-loop": (_tarball(_link("loop1", "loop2"), _link("loop2", "loop1")),
                      "archive link 'loop1' -> 'loop2' is a loop"),
        # Each link resolved alone would walk the whole chain: 100,000 of them cost hours, not seconds.
        "long-link-chain": (_tarball(*(_link(f"l{i}", f"l{i + 1}") for i in range(50)), _file("l50", b"end\n")),
                            "archive link 'l0' -> 'l1' is a loop or a chain of more than 40 links"),
        "hardlink-to-passwd": (_tarball(_entry("passwd", tarfile.LNKTYPE, "/etc/passwd")),
                               "archive entry 'passwd' is a hard link"),
        "hardlink-in-tree": (_tarball(_file("a", b"a\n"), _entry("b", tarfile.LNKTYPE, "a")),
                             "archive entry 'b' is a hard link"),
        "duplicate-dot": (_tarball(_file("a/b", b"first\n"), _file("a/./b", b"second\n")),
                          "archive entry 'a/./b' appears twice"),
        "duplicate-slashes": (_tarball(_file("a/b", b"first\n"), _file("a//b", b"second\n")),
                              "archive entry 'a//b' appears twice"),
        "absolute-name": (_tarball(_file(OUTSIDE, b"pwned\n")), f"archive entry {OUTSIDE!r} escapes"),
        "dotdot-name": (_tarball(_file("../sentinel/pwned", b"pwned\n")),
                        "archive entry '../sentinel/pwned' escapes"),
        "dotdot-inside-name": (_tarball(_file("a/../../sentinel/pwned", b"pwned\n")),
                               "archive entry 'a/../../sentinel/pwned' escapes"),
        "device": (_tarball(_entry("null", tarfile.CHRTYPE)), "archive entry 'null' is a device or fifo"),
        "fifo": (_tarball(_entry("pipe", tarfile.FIFOTYPE)), "archive entry 'pipe' is a device or fifo"),
        # Debian's Python 3.11.2 (the operator image's) refuses the header itself, before the size is read.
        "negative-size": (gzip.compress(_header(liar, b"\xff" * 12) + b"data".ljust(512, b"\0") + end),
                          ("archive entry 'liar' has a size of -1 bytes", "artifact is not a readable tarball")),
        "directory-claims-data": (gzip.compress(_header(claims_data) + b"\0" * claims_data.size + end),
                                  "archive entry 'dir' has a size of 10485760 bytes"),
        "size-beyond-the-data": (gzip.compress(_header(big) + b"x" * 100), "(entry 'big'): unexpected end of data"),
        "pax-header-bomb": (_pax_bomb(), "archive has a header after entry 'ok.txt' larger than"),
        "bomb": (_tarball(_file("zeros", b"\0" * (2 * CASE_MAX_BYTES))),
                 "the source: the archive, unpacked (at entry 'zeros'), exceeds the operator's source size cap of "
                 "1 MiB"),
        # What a git repository holds: relative links inside the tree, through a parent, chained, dangling.
        "legitimate": (_tarball(_entry("./", tarfile.DIRTYPE), _entry("proj", tarfile.DIRTYPE),
                                _file("proj/Pulumi.yaml", b"name: p\n"), _file("proj/run.sh", b"#!/bin/sh\n", 0o6777),
                                _file("shared/lib.txt", b"shared\n"), _link("proj/shared", "../shared"),
                                _link("proj/link.yaml", "Pulumi.yaml"), _link("proj/chain.yaml", "link.yaml"),
                                _link("proj/later", "not-yet")),
                       {"proj/Pulumi.yaml": b"name: p\n", "proj/shared/lib.txt": b"shared\n",
                        "proj/chain.yaml": b"name: p\n", "proj/run.sh": b"#!/bin/sh\n"}),
    }


def check_case(data: bytes, expected: Expected, workdir: Path) -> list[str]:
    """Unpack one case into workdir/dest beside workdir/sentinel; what went wrong (nothing: [])."""
    sentinel, dest, archive = workdir / "sentinel", workdir / "dest", workdir / "case.tar.gz"
    sentinel.mkdir()
    (sentinel / "keep").write_text("keep\n")
    archive.write_bytes(data)
    problems = []
    try:
        safe_extract(archive, dest, SizeCap(CASE_MAX_BYTES))
        if not isinstance(expected, dict):
            problems.append(f"unpacked, expected a refusal saying {expected!r}")
        else:
            problems += [f"{path}: {(dest / path).read_bytes()!r} != {content!r}"
                         for path, content in expected.items() if (dest / path).read_bytes() != content]
    except SourceError as err:
        said = (expected,) if isinstance(expected, str) else expected
        if isinstance(said, dict) or not any(text in str(err) for text in said):
            problems.append(f"refused with {str(err)!r}, expected {expected!r}")
        if list(dest.iterdir()):
            problems.append(f"refused but left {sorted(p.name for p in dest.iterdir())} in the destination")
    if sorted(p.name for p in sentinel.iterdir()) != ["keep"] or (sentinel / "keep").read_text() != "keep\n":
        problems.append(f"the sentinel beside the destination changed: {sorted(p.name for p in sentinel.iterdir())}")
    if os.path.lexists(OUTSIDE):
        problems.append(f"{OUTSIDE} was written")
    return problems


def main() -> int:
    failed = 0
    print(f"Python {sys.version.split()[0]}, tarfile extraction filter: {hasattr(tarfile, 'data_filter')}")
    for name, (data, expected) in crafted_archive_cases().items():
        with tempfile.TemporaryDirectory() as workdir:
            problems = check_case(data, expected, Path(workdir))
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {name}" + "".join(f"\n     {p}" for p in problems))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
