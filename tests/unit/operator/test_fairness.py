"""One team stops nobody: the engine's run slots, the reconcile passes and the source threads go to namespaces
fairly (services/fair_slots.py), and source work runs on threads of its own, so that a
team's slow git server never makes the operator's Kubernetes API calls wait (sources/work.py)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter, deque

import pytest

from strata_operator.engine.port import SerializedEngine, UpdateRequest, UpdateResult
from strata_operator.services.fair_slots import FairSlots, next_holder
from strata_operator.services.kube import Kube
from strata_operator.sources.work import SourceWork


def test_a_namespace_alone_may_take_every_slot():
    assert next_holder(3, {}, {"a": 0}) == "a"
    assert next_holder(3, {"a": 2}, {"a": 7}) == "a"
    assert next_holder(3, {"a": 3}, {"a": 7}) is None  # none free
    assert next_holder(3, {"a": 1}, {}) is None  # nobody waits


def test_a_free_slot_goes_to_the_namespace_holding_fewest_then_to_the_one_waiting_longest():
    assert next_holder(4, {"a": 3}, {"a": 0, "b": 9}) == "b"  # a's waiters came first: b holds fewer
    assert next_holder(4, {"a": 2, "b": 1}, {"a": 0, "b": 9}) == "b"
    assert next_holder(4, {"a": 1, "b": 1}, {"a": 5, "b": 2}) == "b"  # a tie: b's waiter is older
    assert next_holder(4, {"a": 1, "b": 1}, {"a": 2, "b": 5}) == "a"


def test_while_others_wait_no_namespace_is_handed_a_slot_at_or_above_its_share():
    """Team a's 20 slow operations took all 4 slots before b (3) and c (1) came. Slots free one at a time,
    the longest held first: none goes to a namespace already holding its share (4 slots between the
    namespaces with work, rounded up) while another waits, and b's and c's first operations start with the
    first slots freed."""
    capacity = 4
    waiting = {"a": deque(range(20)), "b": deque(range(100, 103)), "c": deque([200])}
    held: Counter[str] = Counter()
    running: deque[str] = deque()
    started: list[str] = []

    def hand_out() -> None:
        while (namespace := next_holder(capacity, held, {n: q[0] for n, q in waiting.items() if q})) is not None:
            with_work = {n for n, q in waiting.items() if q} | {n for n, count in held.items() if count}
            others_wait = any(q for n, q in waiting.items() if n != namespace)
            assert not others_wait or held[namespace] < math.ceil(capacity / len(with_work)), (namespace, held)
            waiting[namespace].popleft()
            held[namespace] += 1
            running.append(namespace)
            started.append(namespace)

    for _ in range(capacity):  # a, alone, takes every slot
        waiting["a"].popleft()
        held["a"] += 1
        running.append("a")
        started.append("a")
    while running:
        held[running.popleft()] -= 1
        hand_out()
    assert started[:6] == ["a", "a", "a", "a", "b", "c"], started
    assert Counter(started) == {"a": 20, "b": 3, "c": 1}


def test_fair_slots_hand_a_freed_slot_to_the_waiting_namespace_that_holds_fewest():
    async def scenario() -> list[str]:
        slots, order = FairSlots(2), []

        async def operation(namespace: str, done: asyncio.Event) -> None:
            async with slots.held(namespace):
                order.append(namespace)
                await done.wait()

        done = {key: asyncio.Event() for key in ("a0", "a1", "a2", "a3", "b0")}
        tasks = [asyncio.create_task(operation(key[0], event)) for key, event in done.items()]
        await asyncio.sleep(0.01)
        assert order == ["a", "a"]  # a's first two; a2, a3 and b0 wait
        done["a0"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "a", "b"]  # b0 came last, and starts first
        for event in done.values():
            event.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a", "a", "b", "a", "a"]


def test_a_cancelled_waiter_leaves_no_claim_and_a_granted_one_gives_its_slot_back():
    async def scenario() -> None:
        slots = FairSlots(1)
        await slots.acquire("a")
        waiter = asyncio.create_task(slots.acquire("b"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slots.release("a")
        await asyncio.wait_for(slots.acquire("c"), 1)  # b's claim did not keep the slot
        granted = asyncio.create_task(slots.acquire("d"))
        await asyncio.sleep(0.01)
        slots.release("c")  # handed to d, whose task is cancelled before it runs again
        granted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await granted
        await asyncio.wait_for(slots.acquire("e"), 1)

    asyncio.run(scenario())


class HeldRuns(SerializedEngine):
    """Each operation runs until the test lets it end (`finish`); the order they started in."""

    def __init__(self, concurrency: int):
        super().__init__(concurrency)
        self.started: list[str] = []
        self.finish: dict[str, asyncio.Event] = {}

    async def _run_locked(self, operation, request):
        self.started.append(request.stack_key)
        await self.finish.setdefault(request.stack_key, asyncio.Event()).wait()
        return UpdateResult("succeeded")


def test_one_namespaces_many_stacks_hold_no_more_than_their_share_of_run_slots_while_another_waits():
    """Team a's 6 slow Stacks came first and took both run slots (--concurrency 2); team b's one Stack
    starts as soon as one of a's runs ends, not after all of a's: first come first served, it would wait
    for 3 rounds of a's runs."""
    async def scenario() -> list[str]:
        engine = HeldRuns(concurrency=2)
        keys = [f"team-a/s{index}" for index in range(6)] + ["team-b/app"]
        runs = []
        for key in keys:
            engine.finish[key] = asyncio.Event()
            runs.append(asyncio.create_task(engine.up(UpdateRequest(stack_key=key, stack_name="dev",
                                                                   project_dir="/tmp/p"))))
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert engine.started == ["team-a/s0", "team-a/s1"]
        engine.finish["team-a/s0"].set()
        await asyncio.sleep(0.01)
        assert engine.started[2] == "team-b/app", engine.started
        for event in engine.finish.values():
            event.set()
        await asyncio.gather(*runs)
        return engine.started

    assert sorted(asyncio.run(scenario())) == sorted([*(f"team-a/s{index}" for index in range(6)), "team-b/app"])


def test_a_namespace_alone_uses_every_run_slot():
    async def scenario() -> list[str]:
        engine = HeldRuns(concurrency=3)
        runs = [asyncio.create_task(engine.up(UpdateRequest(stack_key=f"team-a/s{index}", stack_name="dev",
                                                            project_dir="/tmp/p"))) for index in range(5)]
        await asyncio.sleep(0.01)
        started = list(engine.started)
        for index in range(5):
            engine.finish.setdefault(f"team-a/s{index}", asyncio.Event()).set()
        await asyncio.gather(*runs)
        return started

    assert len(asyncio.run(scenario())) == 3


def test_the_operators_api_calls_never_wait_behind_source_work():
    """Every source thread busy with a slow git server's fetch (more of them than the event loop's default
    pool has threads on any machine): an API call, which runs on that default pool, still answers at once."""
    sources = SourceWork(threads=40)
    release = threading.Event()

    async def scenario() -> float:
        jobs = [asyncio.create_task(sources.run(f"team-{index % 3}", release.wait, 30)) for index in range(80)]
        await asyncio.sleep(0.2)  # the source threads all blocked, the other jobs waiting their turn
        started = time.monotonic()
        assert await asyncio.wait_for(Kube(api=None)._call(lambda: "answered"), 5) == "answered"
        took = time.monotonic() - started
        release.set()
        await asyncio.gather(*jobs)
        return took

    try:
        assert asyncio.run(scenario()) < 1.0
    finally:
        release.set()


def test_source_threads_go_to_the_namespace_holding_fewest():
    """Team a's slow git server holds both source threads; team b's fetch runs on the next one freed."""
    sources = SourceWork(threads=2)
    gates = {name: threading.Event() for name in ("a0", "a1", "a2", "a3", "b0")}
    started: list[str] = []

    def fetch(name: str) -> None:
        started.append(name)
        gates[name].wait(30)

    async def scenario() -> None:
        jobs = [asyncio.create_task(sources.run(name[0], fetch, name)) for name in gates]
        await asyncio.sleep(0.2)
        assert sorted(started) == ["a0", "a1"]
        gates["a0"].set()
        await asyncio.sleep(0.2)
        assert started[2] == "b0", started
        for gate in gates.values():
            gate.set()
        await asyncio.gather(*jobs)

    try:
        asyncio.run(scenario())
    finally:
        for gate in gates.values():
            gate.set()
