"""A small thread-safe TTL cache: the default warm cache of :class:`ColdPath`.

design: one ``threading.Lock`` guards an insertion-ordered dict of ``key -> (expires, value)``.
All entries share one TTL, so insertion order is also expiry order: the front of the dict is
both the oldest and the first to expire. A put into a full cache first drops the expired
entries at the front, then, if still full, the single oldest entry; the cache is never wiped
to make room. The clock is injected so tests never sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["TTLCache"]

V = TypeVar("V")


class TTLCache(Generic[V]):
    """``get(key)`` returns the value or ``None``; ``set(key, value)`` stores it for ``ttl``
    seconds. At most ``maxsize`` entries are kept."""

    def __init__(
        self,
        maxsize: int = 256,
        ttl: float = 300.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError("maxsize >= 1")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ValueError("ttl > 0")
        self.maxsize = maxsize
        self.ttl = float(ttl)
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[Hashable, tuple[float, V]] = {}  # guarded by _lock

    def get(self, key: Hashable) -> V | None:
        if key not in self._data:
            # Racy read, on purpose: a miss needs neither the clock nor the lock (a dict
            # lookup is atomic), and an entry being set this instant is found by the next
            # caller as if this one had come a moment earlier. Every cold request asks twice.
            return None
        now = self._clock()
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            if entry[0] <= now:
                del self._data[key]
                return None
            return entry[1]

    def set(self, key: Hashable, value: V) -> None:
        now = self._clock()
        with self._lock:
            self._data.pop(key, None)  # a re-set key moves to the back
            if len(self._data) >= self.maxsize:
                self._evict(now)
            self._data[key] = (now + self.ttl, value)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        """Racy read: the number of entries, expired ones included."""
        return len(self._data)

    def _evict(self, now: float) -> None:
        """Make room for one entry. Called with _lock held."""
        data = self._data
        while data:
            oldest = next(iter(data))
            if data[oldest][0] > now:
                break
            del data[oldest]
        if len(data) >= self.maxsize:
            del data[next(iter(data))]
