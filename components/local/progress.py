"""Progress lines for long steps: nobody should stare at a silent terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Callable

Say = Callable[[str], None]


def stderr_say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


@contextlib.contextmanager
def step(title: str, say: Say = stderr_say, heartbeat: float = 30.0,
         detail: Callable[[], str] | None = None) -> Iterator[None]:
    """Announce a step, repeat a 'still ...' line every `heartbeat` seconds (with `detail()`: how far
    it got), then say how long it took."""
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(heartbeat):
            progress = f": {detail()}" if detail else ""
            say(f"  ... still {title} ({format_seconds(time.monotonic() - started)}){progress}")

    say(f"==> {title}")
    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    say(f"  done: {title} in {format_seconds(time.monotonic() - started)}")


def tail(path: str | os.PathLike[str], lines: int = 25) -> str:
    """The last lines of a log file, for error messages."""
    try:
        with open(path, errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return ""
