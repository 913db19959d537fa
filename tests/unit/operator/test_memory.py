"""The heap-trim thread: a burst that leaves free heap behind is given back; an idle process is left alone."""

import threading
import time

import pytest

from strata_operator import memory

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
    stop = threading.Event()
    thread = threading.Thread(target=memory.trim_after_growth, args=(libc, stop, 0.2, 16 << 20), daemon=True)
    thread.start()
    try:
        before = memory.resident_bytes()
        kept = _fragment(96)
        assert memory.resident_bytes() - before > 64 << 20, "the burst should have grown the RSS"
        deadline = time.monotonic() + 5
        while memory.resident_bytes() - before > 32 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert memory.resident_bytes() - before <= 32 << 20, "the free heap was not given back"
        assert kept
    finally:
        stop.set()
        thread.join()


def test_no_trim_without_growth(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "resident_bytes", lambda: 100 << 20)
    fake = type("Libc", (), {"malloc_trim": lambda self, pad: calls.append(pad),
                             "mallinfo2": lambda self: type("M", (), {"fordblks": 64 << 20})()})()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    memory.trim_after_growth(fake, stop, every=0.05)
    assert calls == []
