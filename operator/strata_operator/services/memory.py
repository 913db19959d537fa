"""Hand the C allocator's free heap back to the system once a burst of work is over.

Many Stacks at once (each one's first pass, the watch events, the API answers, all in flight together)
leave glibc's heap holding tens of MB that are free but never returned: it gives back only the top of
the heap, and a few live objects keep the rest in place. Measured at 200 Stacks before Kopf's
connections were bounded (kopf_login.py): the RSS went from a 119.8 MB peak to 102.7 MB at the first
trim; with a diagnostic dump running, 37 of 162 MB were free heap at 200 and 56 of 190 MB at 1000.
A thread looks every CHECK_SECONDS and trims when the allocator holds more than FREE_BYTES free and the RSS moved by
more than MOVED_BYTES since the last trim, so an idle operator does nothing but read two numbers (a
trim does not make the free chunks go away, it gives back their pages: the free figure alone would
trim an idle process forever). Not glibc (musl, macOS): no thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

CHECK_SECONDS = 30.0
FREE_BYTES = 16 << 20
MOVED_BYTES = 4 << 20

logger = logging.getLogger(__name__)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    return libc


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_heap_bytes(libc: ctypes.CDLL) -> int:
    """What the allocator holds as free chunks (also those whose pages a trim already gave back)."""
    return libc.mallinfo2().fordblks


def trim_when_free(libc: ctypes.CDLL, stop: threading.Event, every: float = CHECK_SECONDS,
                   free: int = FREE_BYTES, moved: int = MOVED_BYTES) -> None:
    trimmed_at: int | None = None  # the RSS right after the last trim
    while not stop.wait(every):
        now = resident_bytes()
        if (trimmed_at is None or abs(now - trimmed_at) > moved) and free_heap_bytes(libc) > free:
            libc.malloc_trim(0)
            trimmed_at = resident_bytes()
            logger.debug("returned free heap to the system: RSS %d MB -> %d MB", now >> 20, trimmed_at >> 20)


def start_trimming() -> threading.Event | None:
    """Start the trimming thread (a daemon); returns the Event that stops it, None where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return None
    stop = threading.Event()
    threading.Thread(target=trim_when_free, args=(libc, stop), name="heap-trim", daemon=True).start()
    return stop
