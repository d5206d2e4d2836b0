"""The demo's progress lines: each stage printed as it starts, with the seconds since the start, and while a
stage runs long, a "still ..." line at least every `every` seconds, so a person watching never waits more
than a few seconds for a sign of life (setup alone takes about half a minute on 2 cores).

    with Progress(print) as progress:
        progress.stage("starting the control plane")
        ...                                   # a heartbeat thread says "... still starting" every 3 s
"""

from __future__ import annotations

import threading
import time
from typing import Callable

HEARTBEAT_SECONDS = 3.0  # under the promised 5 s: a loaded 2-core machine once woke the 4-s heartbeat 2.3 s late
TICK_SECONDS = 0.25


class Progress:
    """Timestamped lines through `emit`. `clock` is injectable so tests drive time by hand."""

    def __init__(
        self,
        emit: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        every: float = HEARTBEAT_SECONDS,
    ) -> None:
        self.emit, self.clock, self.every = emit, clock, every
        self.started = self.last = self.stage_started = clock()
        self.current = "starting"
        self.lines: list[tuple[float, str]] = []  # (seconds since start, line) of everything said
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def say(self, text: str) -> None:
        """A line (or a block, e.g. the live table), prefixed with the elapsed seconds."""
        with self._lock:
            now = self.clock()
            line = f"[{now - self.started:5.1f}s] {text}"
            self.emit(line)
            self.lines.append((now - self.started, line))
            self.last = now

    def stage(self, name: str) -> None:
        with self._lock:
            self.current, self.stage_started = name, self.clock()
        self.say(name)

    def tick(self) -> None:
        """Says the current stage again if nothing was said for `every` seconds (the heartbeat calls it)."""
        now = self.clock()
        if now - self.last >= self.every:
            self.say(f"  ... still {self.current} ({now - self.stage_started:.0f} s in this stage)")

    def _beat(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self.tick()

    def __enter__(self) -> "Progress":
        self._thread = threading.Thread(target=self._beat, daemon=True, name="demo-progress")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)


def longest_silence(times: list[float], until: float) -> float:
    """The longest stretch without a line, from 0 (the start) to `until`, over the lines' elapsed times."""
    edges = [0.0, *sorted(times), until]
    return max(b - a for a, b in zip(edges, edges[1:]))
