"""The heap-trim thread: a burst that leaves free heap behind is given back; an idle process is left alone."""

import threading
import time

import pytest

from strata_operator.services import memory

libc = memory._glibc()
pytestmark = pytest.mark.skipif(libc is None, reason="not glibc: no malloc_trim")


def _fragment(mb: int) -> list[bytearray]:
    """Allocate `mb` MB in small blocks and free all but one in fifty: free heap the allocator keeps."""
    kept, freed = [], []
    for index in range(mb * 1024):
        freed.append(bytearray(1000))
        if index % 50 == 0:
            kept.append(bytearray(1000))
    del freed
    return kept


def test_free_heap_left_by_a_burst_goes_back_to_the_system():
    # The trimmer starts after the burst: on a loaded host it would otherwise give pages back while the
    # burst is still being made, and the burst would never show.
    stop = threading.Event()
    thread = threading.Thread(target=memory.trim_when_free, args=(libc, stop, 0.2), daemon=True)
    before = memory.resident_bytes()
    kept = _fragment(96)
    assert memory.resident_bytes() - before > 64 << 20, "the burst should have grown the RSS"
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while memory.resident_bytes() - before > 32 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert memory.resident_bytes() - before <= 32 << 20, "the free heap was not given back"
        assert kept
    finally:
        stop.set()
        thread.join()


def test_an_idle_process_is_trimmed_once_however_much_free_heap_stays(monkeypatch):
    """A trim leaves the free chunks (only their pages go), so the free figure stays high: what says
    there is something to give back again is the RSS moving."""
    calls, rss = [], [100 << 20]
    monkeypatch.setattr(memory, "resident_bytes", lambda: rss[0])
    fake = type("Libc", (), {"malloc_trim": lambda self, pad: calls.append(pad),
                             "mallinfo2": lambda self: type("M", (), {"fordblks": 64 << 20})()})()
    stop = threading.Event()
    thread = threading.Thread(target=memory.trim_when_free, args=(fake, stop, 0.02), daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        assert calls == [0]
        rss[0] += 8 << 20  # a burst: the RSS moved, the allocator holds free heap
        time.sleep(0.3)
        assert calls == [0, 0]
    finally:
        stop.set()
        thread.join()
