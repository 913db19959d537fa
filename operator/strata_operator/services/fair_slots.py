"""Slots shared fairly between namespaces: `next_holder` decides who gets a free slot (pure: no I/O, no
asyncio), `FairSlots` applies it, a semaphore for asyncio tasks.

The operator has a few kinds of slots: the engine's run slots (`--concurrency`), its reconcile passes in
flight, its source threads. Each is held from when a namespace's work gets it until that work ends; none
is taken back. Handed out first come, first served, one team's 50 slow Stacks queued ahead of another
team's one would hold every slot until the last of the 50 had had its turn.

So a free slot goes to the namespace that holds the fewest slots among those with work waiting (ties:
the one whose oldest waiter came first), and within a namespace to its oldest waiter. Then:
- a namespace alone, or the only one waiting, may take every slot (nothing is left idle);
- while others wait, a namespace is never handed a slot while it holds its fair share (the capacity
  split evenly between the namespaces with work, rounded up) or more: each slot freed goes to one
  holding less. A namespace that held every slot before the others came keeps them until its work ends
  (slots are not preempted), so the shares are reached as slots free, each to the namespace furthest
  below its share.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping


def next_holder(capacity: int, held: Mapping[str, int], oldest_waiter: Mapping[str, int]) -> str | None:
    """The namespace a free slot goes to, or None when no slot is free or nobody waits.

    `held`: slots each namespace holds; `oldest_waiter`: for each namespace with work waiting, when its
    oldest waiter came (any increasing count). The namespace holding fewest, then the one waiting longest."""
    if not oldest_waiter or sum(held.values()) >= capacity:
        return None
    return min(oldest_waiter, key=lambda namespace: (held.get(namespace, 0), oldest_waiter[namespace]))


class FairSlots:
    """At most `capacity` holders at once; a waiter is handed a slot as `next_holder` says (the namespace
    holding fewest first, then first come first served), never by whoever asks once one frees."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._held: Counter[str] = Counter()
        # Each namespace's waiters, oldest first: (arrival, future set once the slot is the waiter's).
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def held(self, namespace: str) -> AsyncIterator[None]:
        await self.acquire(namespace)
        try:
            yield
        finally:
            self.release(namespace)

    async def acquire(self, namespace: str) -> None:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append((next(self._arrivals), granted))
        self._hand_out()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(namespace)  # handed the slot as the waiter was cancelled: it goes on
            raise

    def release(self, namespace: str) -> None:
        self._held[namespace] -= 1
        if self._held[namespace] <= 0:
            del self._held[namespace]
        self._hand_out()

    def _hand_out(self) -> None:
        while True:
            for namespace in list(self._waiting):  # cancelled waiters leave no claim behind
                queue = self._waiting[namespace]
                while queue and queue[0][1].cancelled():
                    queue.popleft()
                if not queue:
                    del self._waiting[namespace]
            namespace = next_holder(self.capacity, self._held,
                                    {name: queue[0][0] for name, queue in self._waiting.items()})
            if namespace is None:
                return
            _, granted = self._waiting[namespace].popleft()
            self._held[namespace] += 1
            granted.set_result(None)
