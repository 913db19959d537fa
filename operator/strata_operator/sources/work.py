"""Where the operator's source work runs: git, Flux artifact downloads, unpacking, a workspace pod's tarball.

On threads of its own, never the event loop's default pool, which every Kubernetes API call uses
(services/kube.py): a team's slow git server or huge archive cannot make the operator's API calls wait.
The threads are few (each holds a git process, an unpacking or a download) and shared fairly between
namespaces (services/fair_slots.py): while another namespace's source work waits, each thread freed goes
to the namespace holding fewest, so one team's slow sources hold at most its share of them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..services.fair_slots import FairSlots
from .archive import DEFAULT_MAX_SOURCE_BYTES, SizeCap

SOURCE_THREADS = 4

T = TypeVar("T")


class SourceWork:
    """The source threads, and the operator's cap on a source's size (--max-source-bytes)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_SOURCE_BYTES, threads: int = SOURCE_THREADS):
        self.max_bytes = max_bytes
        self._threads = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="source")
        self._slots = FairSlots(threads)

    def cap(self, field: str) -> SizeCap:
        """The cap as a source of `field` (e.g. spec.projectRepo) is held to it."""
        return SizeCap(self.max_bytes, field)

    async def run(self, namespace: str, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`work(*args, **kwargs)` on a source thread, in `namespace`'s turn. A thread is `namespace`'s until
        the work ends, even if whoever awaits it is cancelled (a git process is not stopped by that)."""
        await self._slots.acquire(namespace)
        loop = asyncio.get_running_loop()

        def release(_: concurrent.futures.Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the thread
                loop.call_soon_threadsafe(self._slots.release, namespace)

        job = self._threads.submit(functools.partial(work, *args, **kwargs))
        job.add_done_callback(release)
        return await asyncio.wrap_future(job)
