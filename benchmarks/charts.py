"""Charts of the fleet benchmark's JSON results: latency distribution, time to all Ready against the
Stack count (with the floor, bare `pulumi up` runs of the same updates, where a run measured it), memory
over time. One PNG beside the results.

    .venv/bin/python -m pip install '.[bench]'       # matplotlib
    for n in 10 25 50; do .venv/bin/python benchmarks/fleet.py --stacks $n --idle 30 \\
        --json benchmarks/results/fleet-$n.json; done
    .venv/bin/python benchmarks/charts.py             # -> benchmarks/results/fleet.png
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load_runs(directory: Path) -> list[dict]:
    """Every fleet-<N>.json (the README's 10, 25, 50; not fleet-scale-*, fleet-memory-*, fleet-pod-*), smallest
    fleet first."""
    runs = [json.loads(path.read_text()) for path in sorted(directory.glob("fleet-*.json"))
            if re.fullmatch(r"fleet-\d+\.json", path.name)]
    return sorted(runs, key=lambda run: run["stacks"])


def cumulative(values: list[float]) -> tuple[list[float], list[float]]:
    """Sorted values and the fraction of Stacks Ready by each (an empirical CDF)."""
    ordered = sorted(values)
    return ordered, [(index + 1) / len(ordered) for index in range(len(ordered))]


def draw(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    figure, (latency, scale, memory) = plt.subplots(1, 3, figsize=(15, 4.5))
    for run in runs:
        xs, ys = cumulative(run["latency_seconds"])
        latency.step(xs, ys, where="post", label=f"{run['stacks']} Stacks")
    latency.set(title="create -> Ready latency", xlabel="seconds", ylabel="fraction of Stacks Ready")
    latency.legend()

    counts = [run["stacks"] for run in runs]
    scale.plot(counts, [run["all_ready_seconds"] for run in runs], marker="o", label="Strata")
    floors = [run for run in runs if "floor_seconds" in run]  # older results have none
    if floors:
        scale.plot([run["stacks"] for run in floors], [run["floor_seconds"] for run in floors], marker="s",
                   linestyle="--", color="tab:green",
                   label="floor: bare `pulumi up` runs, same run")
        for run in floors:
            scale.annotate(f"{run['all_ready_seconds'] / run['floor_seconds']:.2f}x", (run["stacks"], run["all_ready_seconds"]),
                           textcoords="offset points", xytext=(-8, 0), ha="right", va="center")
    scale.plot([50], [80], marker="x", linestyle="", color="grey", label="PKO v1.16: 50 in 80 s (recorded, quiet machine)")
    scale.set(title="time to all Ready", xlabel="Stacks", ylabel="seconds")
    scale.set_xlim(left=0)
    scale.set_ylim(bottom=0)
    scale.legend(loc="upper left", fontsize="small")

    largest = runs[-1]
    seconds = [sample[0] for sample in largest["memory_mb"]]
    memory.plot(seconds, [sample[1] for sample in largest["memory_mb"]], label="operator process")
    memory.plot(seconds, [sample[2] for sample in largest["memory_mb"]], label="its workers and pulumi CLIs")
    memory.axvline(largest["all_ready_seconds"], color="grey", linestyle=":", label="all Ready")
    memory.set(title=f"RSS over time, {largest['stacks']} Stacks", xlabel="seconds", ylabel="MB")
    memory.legend()

    load = ", ".join(f"{run['stacks']}: {run['load_average_1m']}" for run in runs if "load_average_1m" in run)
    figure.suptitle(f"benchmarks/fleet.py on the real engine, measured {largest['measured_at']}"
                    + (f" (1-minute load at the end, {largest.get('cpus')} CPUs: {load})" if load else ""))
    figure.tight_layout()
    figure.savefig(out, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs = load_runs(args.results)
    if not runs:
        print(f"no fleet-*.json in {args.results}: run benchmarks/fleet.py --json first (see --help)", file=sys.stderr)
        return 2
    try:
        draw(runs, args.results / "fleet.png")
    except ImportError:
        print("charts need matplotlib: .venv/bin/python -m pip install '.[bench]'", file=sys.stderr)
        return 2
    print(args.results / "fleet.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
