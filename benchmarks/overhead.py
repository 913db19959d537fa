"""Operator overhead: the same YAML program through the operator vs a bare `pulumi up`, side by side.

    .venv/bin/python benchmarks/overhead.py [--rounds 5]

Both sides use the toolchain's CLI 3.259 + YAML host and a file:// backend with a passphrase; the
rounds alternate so machine noise hits both alike. Two cases, each against what a user would type:
- a new Stack: apply -> Ready, vs a bare `pulumi stack init` + `pulumi up` of a new stack;
- a config change to an existing Stack: patch -> Ready with that generation, vs a bare
  `pulumi up -c greeting=...` of an existing stack.
Goal: operator <= 1.10x bare. The peer, PKO v1.16, measured 4.8 s from apply to Ready vs 1.0 s for a
bare `pulumi up` (4.7x) on this machine kind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import yaml

from harness import PASSPHRASE, NAMESPACE, GROUP, VERSION, is_ready, platform_with_operator
from kubernetes import watch
from strata_components.local.toolchain import installed

PROGRAM = {
    "configuration": {"greeting": {"type": "String", "default": "hello"}},
    "resources": {"note0": {"type": "pulumi:index:Stash", "properties": {"input": "${greeting}"}}},
    "outputs": {"said": "${note0.input}"},
}


def timed(command: list[str], **kwargs: Any) -> float:
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, **kwargs)
    return time.monotonic() - started


def updated(stack: dict[str, Any]) -> bool:
    """Ready, and the last update ran for the current generation."""
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return is_ready(stack) and last.get("generation") == stack["metadata"]["generation"] and \
        last.get("state") == "succeeded"


def wait_for(bench: Any, name: str, done: Callable[[dict[str, Any]], bool], timeout: float = 120) -> None:
    """Block until the Stack satisfies `done`, on a watch: polling would load the apiserver the bare
    side does not share."""
    stream = watch.Watch()
    for event in stream.stream(bench.custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, "stacks",
                               field_selector=f"metadata.name={name}", timeout_seconds=int(timeout)):
        if done(event["object"]):
            stream.stop()
            return
    raise TimeoutError(f"Stack {name} not done after {timeout:.0f}s")


def report(case: str, bare: list[float], operator: list[float], bare_label: str) -> None:
    bare_median, operator_median = statistics.median(bare), statistics.median(operator)
    print(f"{case}: bare {bare_label} median {bare_median:5.2f}s   operator median {operator_median:5.2f}s   "
          f"ratio {operator_median / bare_median:4.2f}x   (goal <= 1.10x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    toolchain = installed()
    with platform_with_operator() as bench:
        bench.create_program("greeting", PROGRAM)
        project = bench.scratch / "bare"
        project.mkdir()
        (project / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "bare", "runtime": "yaml", **PROGRAM}))
        env = {**os.environ, "PULUMI_BACKEND_URL": bench.backend("bare"), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
               "PULUMI_HOME": str(bench.scratch / "pulumi-home"), "PULUMI_SKIP_UPDATE_CHECK": "true",
               "PATH": os.pathsep.join([*(str(d) for d in toolchain.bin_dirs), os.environ["PATH"]])}
        bare_new, bare_change, operator_new, operator_change = [], [], [], []
        for index in range(args.rounds):
            stack = f"bare{index}"
            bare_new.append(timed(["pulumi", "stack", "init", stack], cwd=project, env=env) +
                            timed(["pulumi", "up", "--yes", "--skip-preview", "--stack", stack], cwd=project, env=env))
            bare_change.append(timed(["pulumi", "up", "--yes", "--skip-preview", "--stack", stack, "-c",
                                      f"greeting=round{index}"], cwd=project, env=env))

            name = f"op{index}"
            started = time.monotonic()
            bench.create_stack(name, "greeting", bench.backend(name))
            wait_for(bench, name, is_ready)
            operator_new.append(time.monotonic() - started)
            started = time.monotonic()
            bench.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "stacks", name,
                                                        {"spec": {"config": {"greeting": f"round{index}"}}})
            wait_for(bench, name, updated)
            operator_change.append(time.monotonic() - started)
            print(f"  round {index + 1}: new stack: bare {bare_new[-1]:5.2f}s operator {operator_new[-1]:5.2f}s   "
                  f"config change: bare {bare_change[-1]:5.2f}s operator {operator_change[-1]:5.2f}s", flush=True)
        report("new stack    ", bare_new, operator_new, "init+up")
        report("config change", bare_change, operator_change, "up -c  ")
        print("PKO v1.16 on this machine kind: 4.8 s apply -> Ready vs 1.0 s bare (4.7x)")


if __name__ == "__main__":
    main()
