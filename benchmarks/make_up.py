"""`make up` as a user types it, from a fresh home with the toolchain and package caches warm: every layer
Ready, and where the time went (the bootstrap's `pulumi up`, each Stack's environment and update).

    .venv/bin/python benchmarks/make_up.py [--rounds 2] [--json benchmarks/results/make-up.json]

A first, unmeasured round warms the caches (uv's, the plugin cache; the toolchain is warm after `make
setup`) unless --no-warm-up. Each round runs `make up` with a new STRATA_HOME, reads the times of its
progress lines as they come, each Stack's last-update.json from the operator's state directory (the
worker records the environment's seconds and the run's), and ends with `make down`. Needs what `make
up` needs (the Pulumi install with the Python language host and the kubernetes/flux plugins).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `make up`'s progress lines: where the bootstrap's pulumi up starts and ends, and a Stack turning Ready.
BOOTSTRAP_START = "==> pulumi up of the dev stack"
BOOTSTRAP_END = "==> waiting until every Stack and Kustomization is Ready"
READY_LINE = re.compile(r"^\s*((?:kustomization )?\S+/[^\s:]+): Ready\b")
DONE = "==> the dev stack is up in"


def make(target: str, home: Path, timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run `make <target>` as the README says, with this home; its output lines with their times."""
    env = {**os.environ, "STRATA_HOME": str(home)}
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    process = subprocess.Popen(["make", target], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
        print(f"  [{lines[-1][0]:6.1f}s] {lines[-1][1]}", flush=True)
    return process.wait(timeout=timeout), lines


def at(lines: list[tuple[float, str]], prefix: str) -> float | None:
    return next((when for when, line in lines if line.startswith(prefix)), None)


def stack_runs(home: Path) -> dict[str, dict[str, float]]:
    """Each Stack's last run, as its worker recorded it: namespace/name -> seconds (environment, total)."""
    found = {}
    for log in sorted((home / "platform" / "operator" / "stacks").glob("*/*/last-update.json")):
        record = json.loads(log.read_text())
        found[f"{log.parent.parent.name}/{log.parent.name}"] = record.get("seconds") or {}
    return found


def measure(home: Path, timeout: float) -> dict:
    code, lines = make("up", home, timeout)
    if code != 0:
        raise SystemExit(f"make up failed (exit {code}); its output is above")
    ready: dict[str, float] = {}
    for when, line in lines:
        match = READY_LINE.match(line)
        if match and match.group(1) not in ready:
            ready[match.group(1)] = when
    # The machine is shared: how busy it was as the round ended, beside its figures.
    result = {"total_seconds": at(lines, DONE), "bootstrap_up_seconds": None, "ready_at": ready,
              "stack_runs": stack_runs(home), "load_average_1m": round(os.getloadavg()[0], 2)}
    start, end = at(lines, BOOTSTRAP_START), at(lines, BOOTSTRAP_END)
    if start is not None and end is not None:
        result["bootstrap_up_seconds"] = round(end - start, 1)
    code, _ = make("down", home, timeout)
    if code != 0:
        raise SystemExit(f"make down failed (exit {code}); its output is above")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-warm-up", action="store_true", help="measure the first round too (caches as they are)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="strata-make-up-") as scratch:
        if not args.no_warm_up:
            print("== warm-up round (not measured)", flush=True)
            measure(Path(scratch) / "warm-up", args.timeout)
        for index in range(args.rounds):
            print(f"== round {index + 1} of {args.rounds}: make up from a fresh home", flush=True)
            rounds.append(measure(Path(scratch) / f"round-{index}", args.timeout))
    print("\n== make up, warm caches, fresh home")
    for index, figures in enumerate(rounds, 1):
        print(f"round {index}: every layer Ready in {figures['total_seconds']:.1f} s "
              f"(bootstrap pulumi up {figures['bootstrap_up_seconds']} s; load {figures['load_average_1m']})")
        for key, when in sorted(figures["ready_at"].items(), key=lambda item: item[1]):
            run = figures["stack_runs"].get(key, {})
            detail = (f"   environment {run['environment']:.1f} s, run {run['total']:.1f} s" if "total" in run
                      and "environment" in run else f"   run {run['total']:.1f} s" if "total" in run else "")
            print(f"  {key:45} Ready at {when:6.1f} s{detail}")
    totals = [figures["total_seconds"] for figures in rounds]
    print(f"median {statistics.median(totals):.1f} s over {len(totals)} round(s); goal 45 s: "
          f"{'met' if statistics.median(totals) <= 45 else 'missed'}; machine: {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "cores": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
