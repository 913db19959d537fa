"""Operator overhead: the same one-resource YAML program through the operator vs a bare `pulumi up`.

    .venv/bin/python benchmarks/overhead.py [--rounds 5]

Both sides use the toolchain's CLI 3.259 + YAML host and a file:// backend with a passphrase; the
rounds alternate so machine noise hits both alike. Operator: Stack created -> Ready=True (fresh
stack each round). Bare: `pulumi up --yes --skip-preview` of a fresh stack (its `stack init` is timed
apart). Goal: operator <= 1.10x bare. The peer, PKO v1.16, measured 4.8 s vs 1.0 s (4.7x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import yaml

from harness import PASSPHRASE, is_ready, platform_with_operator, stash_program
from strata_components.local.processes import wait_until
from strata_components.local.toolchain import installed


def bare_round(project, env, name: str) -> tuple[float, float]:
    started = time.monotonic()
    subprocess.run(["pulumi", "stack", "init", name], cwd=project, env=env, check=True, capture_output=True)
    init = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(["pulumi", "up", "--yes", "--skip-preview", "--stack", name], cwd=project, env=env, check=True,
                   capture_output=True)
    return init, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    toolchain = installed()
    with platform_with_operator() as bench:
        bench.create_program("one-stash", stash_program(1))
        project = bench.scratch / "bare"
        project.mkdir()
        (project / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "bare", "runtime": "yaml", **stash_program(1)}))
        env = {**os.environ, "PULUMI_BACKEND_URL": bench.backend("bare"), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
               "PULUMI_HOME": str(bench.scratch / "pulumi-home"), "PULUMI_SKIP_UPDATE_CHECK": "true",
               "PATH": os.pathsep.join([*(str(d) for d in toolchain.bin_dirs), os.environ["PATH"]])}
        bare, inits, operator = [], [], []
        for index in range(args.rounds):
            init, up = bare_round(project, env, f"bare{index}")
            inits.append(init)
            bare.append(up)
            name = f"op{index}"
            started = time.monotonic()
            bench.create_stack(name, "one-stash", bench.backend(name))
            wait_until(lambda: is_ready(bench.get_stack(name)), 120, f"Stack {name} Ready", interval=0.05)
            operator.append(time.monotonic() - started)
            print(f"  round {index + 1}: bare up {up:5.2f}s (stack init {init:4.2f}s)   operator apply->Ready "
                  f"{operator[-1]:5.2f}s", flush=True)
        bare_median, operator_median = statistics.median(bare), statistics.median(operator)
        print(f"bare `pulumi up` median:          {bare_median:5.2f}s  (+ stack init {statistics.median(inits):4.2f}s)")
        print(f"operator apply -> Ready median:   {operator_median:5.2f}s")
        print(f"ratio operator / bare up:         {operator_median / bare_median:5.2f}x   (goal <= 1.10x; PKO v1.16: 4.7x)")
        print(f"ratio operator / bare init+up:    "
              f"{operator_median / (bare_median + statistics.median(inits)):5.2f}x")


if __name__ == "__main__":
    main()
