"""A fake monotonic clock, for every deadline and TTL a test controls."""

from __future__ import annotations

import threading
from collections import Counter


class FakeClock:
    """A monotonic clock that moves only when told (``advance`` or setting ``now``), or by
    ``step`` after each read. Counts its reads, in all and per thread, so a test can prove a
    path never read it."""

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self._now = start
        self.step = step
        self._lock = threading.Lock()
        self.calls = 0  # guarded by _lock
        self._calls_by_thread: Counter[int] = Counter()  # guarded by _lock

    def __call__(self) -> float:
        with self._lock:
            self.calls += 1
            self._calls_by_thread[threading.get_ident()] += 1
            now = self._now
            self._now += self.step
            return now

    @property
    def now(self) -> float:
        """What the next read returns (reading this does not count as a read)."""
        with self._lock:
            return self._now

    @now.setter
    def now(self, value: float) -> None:
        with self._lock:
            self._now = value

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def calls_from_this_thread(self) -> int:
        with self._lock:
            return self._calls_by_thread[threading.get_ident()]
