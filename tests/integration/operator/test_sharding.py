"""Shards, Flux's convention, on the real apiserver: a main operator (`!sharding.fluxcd.io/key`) and two
shards (`sharding.fluxcd.io/key=<shard>`) split one namespace's Stacks, each Stack run by exactly one of
them and held by that one's finalizer only; a Stack relabelled into another shard is let go by the
first and run by the second; a shard destroys its own Stacks on delete; a Stack of one shard waits for
its prerequisite in another, and runs as soon as that one is Ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from strata_components.local import processes
from strata_components.local.operator_host import operator_host
from strata_operator.api import FINALIZER
from strata_operator.api.sharding import MAIN_SELECTOR, SHARD_KEY, Shard

from .conftest import MIN_RESYNC_SECONDS, STALL_AFTER_FAILURES, Operator, has_condition, stash_program, unique

SHARDS = ("shard1", "shard2")


@pytest.fixture
def sharded(operator: Operator, platform, toolchain, plugin_cache, tmp_path) -> Iterator[dict[str | None, Operator]]:
    """The session's operator (which owns every object) stopped; in its place the main operator and two shards,
    each leading on its own Lease. The session's operator comes back afterwards."""
    operator.stop()
    running: dict[str | None, Operator] = {}
    try:
        for shard in (None, *SHARDS):
            selector = MAIN_SELECTOR if shard is None else f"{SHARD_KEY}={shard}"
            host = operator_host(platform, toolchain, tmp_path / (shard or "main"),
                                 name=f"strata-operator-{shard or 'main'}", extra_args=("--stall-after-failures", str(STALL_AFTER_FAILURES),
                                             "--min-resync-seconds", str(MIN_RESYNC_SECONDS),
                                             "--plugin-cache", str(plugin_cache),
                                             "--watch-label-selector", selector))
            running[shard] = Operator(**{name: getattr(host, name) for name in host.__dataclass_fields__})
            running[shard].start()
        yield running
    finally:
        for each in running.values():
            each.stop()
        operator.start()


def _labels(shard: str | None) -> dict[str, str]:
    return {SHARD_KEY: shard} if shard else {}


def _finalizers(obj) -> list[str]:
    return obj["metadata"].get("finalizers") or []


def _ran(operator: Operator, namespace: str, name: str) -> bool:
    """Whether this operator ran the Stack: its per-Stack workdir exists only in the state of the one that did."""
    return (operator.state_dir / "stacks" / namespace / name).is_dir()


def _finalizer(shard: str | None) -> str:
    return Shard.of(MAIN_SELECTOR if shard is None else f"{SHARD_KEY}={shard}").finalizer


def test_shards_split_the_stacks_each_run_by_exactly_one(sharded, stacks):
    stacks.program("stash", stash_program(value="sharded"))
    names: dict[str, str | None] = {}
    for shard in (None, *SHARDS):
        for _ in range(2):
            name = unique(shard or "main")
            names[name] = shard
            body = stacks.spec(stack=name, programRef={"name": "stash"})
            stacks.custom.create_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks", {
                "apiVersion": "pulumi.com/v1", "kind": "Stack",
                "metadata": {"name": name, "labels": _labels(shard)}, "spec": body})
    for name, shard in names.items():
        ready = stacks.wait_ready(name, timeout=120)
        # Held by its own operator's finalizer only: the main one keeps PKO's, a shard its own.
        assert _finalizers(ready) == [_finalizer(shard)], (name, shard)
        assert stacks.runs(name) == 1, f"{name} ran {stacks.runs(name)} times"
    for name, owner in names.items():
        assert [shard for shard, each in sharded.items() if _ran(each, stacks.namespace, name)] == [owner], name
    assert _finalizer(None) == FINALIZER


def test_a_relabelled_stack_moves_to_the_other_shard_and_is_destroyed_by_it(sharded, stacks):
    stacks.program("stash", stash_program(value="moving"))
    name = unique("moving")
    stacks.custom.create_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name, "labels": _labels("shard1")},
        "spec": stacks.spec(stack=name, programRef={"name": "stash"}, destroyOnFinalize=True)})
    stacks.wait_ready(name, timeout=120)
    assert _ran(sharded["shard1"], stacks.namespace, name) and not _ran(sharded["shard2"], stacks.namespace, name)
    stacks.patch(name, {"metadata": {"labels": {SHARD_KEY: "shard2"}}})
    moved = stacks.wait(name, lambda o: _finalizers(o) == [_finalizer("shard2")], 60,
                        "shard1's finalizer gone, shard2's in its place")
    assert has_condition(moved, "Ready")
    # A new spec now runs on shard2, once; shard1 no longer acts on it.
    stacks.program("stash-2", stash_program(value="moved"))
    stacks.patch(name, {"spec": {"programRef": {"name": "stash-2"}}})
    done = stacks.wait(name, lambda o: has_condition(o, "Ready") and
                       (o["status"].get("outputs") or {}).get("value") == "moved", 120, "the new spec ran")
    assert done["status"]["lastUpdate"]["state"] == "succeeded"
    assert _ran(sharded["shard2"], stacks.namespace, name)
    assert stacks.runs(name) == 2, f"ran {stacks.runs(name)} times for two specs"
    # The Program's name is the project's: the stack lives under stash-2 now.
    state = Path(stacks.backend.removeprefix("file://")) / ".pulumi" / "stacks" / "stash-2" / f"{name}.json"
    assert state.is_file(), "the stack's state file, where the backend keeps it"
    stacks.delete(name)
    # Only shard2's finalizer held it: gone means shard2's delete handler destroyed it and let go.
    processes.wait_until(lambda: stacks.get(name) is None, 120, "shard2 destroyed and released it",
                         log=sharded["shard2"].log)
    # destroyOnFinalize: destroyed and removed from the backend, nothing of it left there.
    assert not state.exists(), "the stack is still in the backend"


def test_a_stack_waits_for_its_prerequisite_in_another_shard(sharded, stacks):
    stacks.program("stash", stash_program(value="ordered"))
    first, second = unique("first"), unique("second")
    stacks.custom.create_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": second, "labels": _labels("shard2")},
        "spec": stacks.spec(stack=second, programRef={"name": "stash"}, prerequisites=[{"name": first}])})
    stacks.wait(second, lambda o: not has_condition(o, "Ready"), 30, "waits for its prerequisite")
    stacks.custom.create_namespaced_custom_object("pulumi.com", "v1", stacks.namespace, "stacks", {
        "apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": first, "labels": _labels("shard1")},
        "spec": stacks.spec(stack=first, programRef={"name": "stash"})})
    stacks.wait_ready(first, timeout=120)
    # Woken by shard1's Stack turning Ready (every operator sees every Stack's events), not by a resync.
    stacks.wait_ready(second, timeout=60)
