"""A small thread-safe TTL cache: the default warm cache of :class:`ColdPath`.

design: an insertion-ordered dict of ``key -> (fresh_until, value, gone_at, build_time)``,
written only under one ``threading.Lock`` (a put, a forget, a clear, an eviction, the drop
of an entry past its stale window) and read without it (``get``, ``lookup``): a dict read is
atomic and an entry is a tuple that never changes, so a reader sees an entry whole, as it
was before or after a write, and a warm hit takes no lock. An entry being set that very
instant is found by the next reader, as if this one had come a moment earlier. All entries
share one TTL and one stale window, so insertion order is also expiry order: the front of the
dict is both the oldest and the first to expire. A put into a full cache first drops the
entries at the front whose stale window has ended, then, if still full, the single oldest
entry; the cache is never wiped to make room. The clock is injected so tests never sleep.

Stale entries (``stale`` > 0): an entry stops being fresh ``ttl`` seconds after it was set
and is dropped ``stale`` seconds later. ``get`` answers fresh entries only (what a cache
without a stale window does); :meth:`TTLCache.lookup` answers stale ones too, with how much
freshness is left and how long the value took to build - what ColdPath needs to serve a
stale answer while it refreshes, and to refresh a popular entry early.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["TTLCache", "Entry", "lookup_in", "put_into", "forget_in"]

V = TypeVar("V")


class Entry(NamedTuple):
    """What :meth:`TTLCache.lookup` answers (and any cache with a stale window).

    ``fresh_for``: seconds of freshness left; 0 or less once stale (minus how long ago it
    went stale); infinite when the cache does not know (a shared cache without a stale
    window). ``build_time``: how long the value took to build, in seconds (0 when not
    known), which scales the early-refresh chance."""

    value: Any
    fresh_for: float
    build_time: float


#: tuple.__new__, to make an Entry on the warm path without NamedTuple's Python-level __new__.
_new = tuple.__new__


class TTLCache(Generic[V]):
    """``get(key)`` returns the value or ``None``; ``set(key, value)`` stores it for ``ttl``
    seconds. At most ``size`` entries are kept. With ``stale`` > 0 an entry is kept that
    many seconds past its TTL, for :meth:`lookup` (``get`` never answers it).

    ``TTLCache(ttl=60, size=1000)`` takes the keywords of ``RedisCache``; the older
    ``TTLCache(1000, 60)`` and ``maxsize=`` still work (``maxsize`` is ``size``'s old name:
    giving both is a ``TypeError``). ``size`` and ``maxsize`` are the same attribute."""

    def __init__(
        self,
        maxsize: int | None = None,
        ttl: float = 300.0,
        *,
        size: int | None = None,
        stale: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The arguments are sorted out here only: get, lookup and put read plain attributes.
        if maxsize is not None and size is not None:
            raise TypeError(
                "TTLCache() takes size or maxsize (its old name, or the first positional "
                "argument), not both"
            )
        label, entries = ("size", size) if size is not None else ("maxsize", maxsize)
        if entries is None:
            entries = 256
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
            raise ValueError(f"{label} >= 1")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ValueError("ttl > 0")
        self.maxsize = entries
        self.ttl = float(ttl)
        self.stale = check_stale(stale)
        self._clock = clock
        self._lock = threading.Lock()
        # guarded by _lock: key -> (fresh_until, value, gone_at, build_time)
        self._data: dict[Hashable, tuple[float, V, float, float]] = {}

    @property
    def size(self) -> int:
        """How many entries are kept at most (``maxsize`` is the same number)."""
        return self.maxsize

    def get(self, key: Hashable) -> V | None:
        entry = self._data.get(key)  # no lock (the module's design note); a miss: no clock
        if entry is None:
            return None
        now = self._clock()
        if entry[0] > now:
            return entry[1]
        if entry[2] <= now:
            self._drop(key, entry)
        return None

    def lookup(self, key: Hashable) -> Entry | None:
        """The entry of ``key``, fresh or stale (within its stale window), or None."""
        fields = self.lookup_fields(key)
        return None if fields is None else _new(Entry, fields)

    def lookup_fields(self, key: Hashable) -> tuple[V, float, float] | None:
        """:meth:`lookup`'s answer as a plain tuple, the fields of its Entry: what ColdPath's
        warm read asks (making the Entry would cost a warm hit about as much as the rest of
        the read)."""
        entry = self._data.get(key)  # as get()
        if entry is None:
            return None
        fresh_until, value, gone_at, build_time = entry
        now = self._clock()
        if gone_at <= now:
            self._drop(key, entry)
            return None
        return value, fresh_until - now, build_time

    def _drop(self, key: Hashable, entry: tuple[float, V, float, float]) -> None:
        """Drop ``key``'s ``entry``, past its stale window, unless it was set again since."""
        with self._lock:
            if self._data.get(key) is entry:
                del self._data[key]

    def set(self, key: Hashable, value: V) -> None:
        self.put(key, value, 0.0)

    def put(self, key: Hashable, value: V, build_time: float) -> None:
        """``set``, remembering that the value took ``build_time`` seconds to build."""
        now = self._clock()
        fresh_until = now + self.ttl
        with self._lock:
            self._data.pop(key, None)  # a re-set key moves to the back
            if len(self._data) >= self.maxsize:
                self._evict(now)
            self._data[key] = (fresh_until, value, fresh_until + self.stale, build_time)

    def forget(self, key: Hashable) -> bool:
        """Drop ``key``'s entry, fresh or stale; True if there was one (an expired entry
        that was still held counts: it was there until now)."""
        with self._lock:
            return self._data.pop(key, None) is not None

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
            if data[oldest][2] > now:
                break
            del data[oldest]
        if len(data) >= self.maxsize:
            del data[next(iter(data))]


def check_stale(stale: Any, label: str = "stale") -> float:
    """A stale window in seconds: a finite number >= 0 (``ValueError`` naming ``label``)."""
    if isinstance(stale, bool) or not isinstance(stale, (int, float)) or not 0 <= stale < math.inf:
        raise ValueError(f"{label} >= 0 (seconds a stale entry may still be served)")
    return float(stale)


def lookup_in(cache: Any, key: Hashable) -> Entry | None:
    """``cache.lookup(key)``; for a cache without one (a plain ``get``/``set`` cache), its
    ``get`` as a fresh entry whose freshness is not known (``fresh_for`` infinite)."""
    lookup = getattr(cache, "lookup", None)
    if lookup is not None:
        found: Entry | None = lookup(key)
        return found
    value = cache.get(key)
    return None if value is None else _new(Entry, (value, math.inf, 0.0))


def put_into(cache: Any, key: Hashable, value: Any, build_time: float) -> None:
    """``cache.put(key, value, build_time)``; for a cache without one, its ``set``."""
    put = getattr(cache, "put", None)
    if put is not None:
        put(key, value, build_time)
    else:
        cache.set(key, value)


def forget_in(cache: Any, key: Hashable) -> bool:
    """``cache.forget(key)``: True if an entry was dropped. A cache without ``forget`` (a
    plain ``get``/``set`` cache) cannot drop one key: ``TypeError`` naming its type, so the
    caller is never told a key is gone that is not."""
    forget = getattr(cache, "forget", None)
    if forget is None:
        raise TypeError(
            f"{type(cache).__name__} has no forget(key): this cache cannot drop one key"
        )
    return bool(forget(key))
