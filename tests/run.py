"""Run the test tiers and report each one: unit, integration, engine, realnode, cluster, e2e.

unit, integration and engine always run, in one pytest session (so the local platform starts once),
and each must have collected tests: an empty tier is a broken tier, not a green one. Two tiers run
in sessions of their own where the machine allows, else they are reported NOT RUN with the reason
and counted neither as passed nor as failed: e2e needs the Python language host and the
kubernetes/flux provider plugins; realnode and cluster need root, containerd and the image tools (their
platforms have real nodes, and only one such platform can run on a host: one session after the other).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALWAYS = ("unit", "integration", "engine")


def _tier_of(testcase: ElementTree.Element) -> str:
    classname = testcase.get("classname", "")
    parts = classname.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" else "?"


def _outcome(testcase: ElementTree.Element) -> str:
    for child in testcase:
        if child.tag in ("failure", "error"):
            return "failed"
        if child.tag == "skipped":
            return "skipped"
    return "passed"


# The slowest tests, printed before the tiers' lines so a run's tail says where its time went.
SLOWEST_SHOWN = 12


def run_pytest(paths: list[str], extra: list[str],
               durations: list[tuple[float, str]]) -> tuple[int, dict[str, Counter]]:
    """pytest's exit code and each tier's outcomes; appends each test's (seconds, tier::name) to `durations`
    (setup and teardown included: a slow fixture is time spent too)."""
    with tempfile.TemporaryDirectory(prefix="strata-tests-") as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", *paths, "-p", "no:cacheprovider", f"--junitxml={junit}",
                   "-o", "junit_family=xunit1", *extra]
        code = subprocess.call(command, cwd=ROOT)
        counts: dict[str, Counter] = {}
        if junit.exists():
            for testcase in ElementTree.parse(junit).iter("testcase"):
                counts.setdefault(_tier_of(testcase), Counter())[_outcome(testcase)] += 1
                durations.append((float(testcase.get("time", 0)),
                                  f"{testcase.get('classname', '')}::{testcase.get('name', '')}"))
    return code, counts


def tier_line(tier: str, tally: Counter, durations: list[tuple[float, str]]) -> str:
    """A tier's line of the report: its outcomes, and the minutes its tests took (setup and teardown
    included; the pytest session's own start is not)."""
    minutes = sum(seconds for seconds, name in durations if name.startswith(f"tests.{tier}.")) / 60
    return (f"{tier:12} {tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped"
            f" ({minutes:.1f} min in its tests)")


def missing_requirements(tier: str) -> list[str]:
    """What this machine lacks for a tier that needs more than the others (tests/<tier>/requirements.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{tier}_requirements", ROOT / "tests" / tier / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"missing_{tier}_requirements")()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="unit,integration,engine,realnode,cluster,e2e")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (e.g. -k NAME)")
    args = parser.parse_args()
    tiers = args.tiers.split(",")

    always = [tier for tier in ALWAYS if tier in tiers]
    failed = False
    counts: dict[str, Counter] = {}
    durations: list[tuple[float, str]] = []
    if always:
        code, counts = run_pytest([f"tests/{tier}" for tier in always], ["-q", *args.pytest_args], durations)
        if code not in (0, 1):
            print(f"pytest exited with code {code} (5 = no tests collected, 2-4 = usage or internal error)")
            failed = True
        failed |= code != 0

    report = []
    for tier in always:
        tally = counts.get(tier, Counter())
        if sum(tally.values()) == 0:
            failed = True
            report.append(f"{tier:12} FAILED: no tests ran in tests/{tier} (an empty tier proves nothing)")
        else:
            failed |= tally["failed"] > 0
            report.append(tier_line(tier, tally, durations))

    for tier in ("realnode", "cluster", "e2e"):
        if tier not in tiers:
            continue
        missing = missing_requirements(tier)
        if missing:
            report.append(f"{tier:12} NOT RUN (not counted as passed): missing {'; '.join(missing)}")
            continue
        code, tier_counts = run_pytest([f"tests/{tier}"], ["-q", *args.pytest_args], durations)
        tally = tier_counts.get(tier, Counter())
        failed |= code != 0 or tally["passed"] == 0
        counts[tier] = tally
        report.append(tier_line(tier, tally, durations))

    total = Counter()
    for tally in counts.values():
        total.update(tally)
    print(f"\n==> slowest tests (of {len(durations)}, {sum(d for d, _ in durations) / 60:.1f} min in all)")
    for seconds, name in sorted(durations, reverse=True)[:SLOWEST_SHOWN]:
        print(f"  {seconds:7.1f}s  {name}")
    modules: Counter = Counter()
    for seconds, name in durations:
        modules[name.split("::")[0]] += seconds
    print("\n==> slowest modules")
    for name, seconds in modules.most_common(SLOWEST_SHOWN):
        print(f"  {seconds:7.1f}s  {name}")
    print("\n==> test tiers")
    for line in report:
        print(f"  {line}")
    print(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
