"""The cold lead: a cold request's one round trip before its build or refusal.

design:

    A cold request on Redis used to make five round trips from its thread before its 429 (the
    cache GET, the flight's join, the leader's recheck GET, the acquire, and the refusal
    published to followers who could not exist) and four before its build. The cold lead
    puts them into one operation of the limiter's script (``lead`` in ``lua/limiter.lua``),
    sent once the cache's in-process first level has missed:

        cache entry        answer it (fresh or stale: its PTTL says), nothing claimed or
                           acquired; the path answers it as a hit (or a stale answer)
        a claim exists     answer that: the flight's join follows it (or takes its outcome,
                           or claims anew if it has just ended), a second round trip
        neither            acquire: granted or queued -> claim the flight and lead it;
                           refused -> claim nothing, so nobody can follow it and nothing is
                           ever published for it

    Who runs what: ``ColdPath`` asks only the cache's first level when the flight reads the
    shared cache itself (``RedisSingleFlight.reads_cache``); ``RedisSingleFlight.do_cold``
    (the flight, given its path's ``RedisCache`` and ``RedisColdLimiter`` by
    ``use_cold_lead``)
    sends the script through ``RedisColdLimiter.lead`` (which owns the token, the settings
    and the lost-reply bookkeeping of the acquire inside it), answers an entry as
    ``reachlimit._path.Found`` (counted and answered as the path's warm read would), and
    otherwise runs ColdPath's leader step as it always has. That step rechecks the cache and
    acquires through whatever wraps them (the fallback, the metrics); what the script found
    is handed to the two Redis objects for this thread only (``RedisCache.known_miss``,
    ``RedisColdLimiter.known_admission``: a :class:`NextCallAnswer` each), so the recheck
    answers "miss" without a GET and the acquire answers the script's admission without a
    script. Metrics and the fallback see the same calls in the same order as
    before.

    An admission handed over and never taken (the step found the value in the first level,
    the fallback took over, the caller's client left) is undone when the step ends: its token
    is given up at once (the slot or queue place freed), or at the next round trip if Redis
    fails then.

    On a Cluster the three keys live in different slots: no cold lead there (the cache read,
    the flight's join, the recheck and the acquire are sent one by one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["LeadReply", "NextCallAnswer", "LEAD", "FOLLOW", "DONE", "CLAIMED", "HIT", "UNCLAIMED"]

T = TypeVar("T")

#: Replies of the flight's join and check (``lua/flight.lua``): lead, follow, ended.
LEAD, FOLLOW, DONE = 0, 1, 2
#: Replies of the cold lead (``lua/limiter.lua``) besides LEAD: a flight is claimed (join
#: it), a cache entry, refused (nothing claimed).
CLAIMED, HIT, UNCLAIMED = 1, 3, 4


class LeadReply(NamedTuple):
    """What the cold lead found: its ``status`` (above), the ``flight`` number it claimed
    (LEAD; else 0), the cache entry it read (HIT: ``data``, and its ``pttl``, Redis's PTTL
    of it), the limiter ``token`` it acquired with, the acquire's answer (``admitted``, or
    None where it did not acquire) and, queued, how long its wait lasts (``wait_ms``: the
    budget's wait, from Redis; refused late, the Retry-After in s)."""

    status: int
    flight: int
    data: Any
    token: str
    admitted: int | None
    wait_ms: int = 0
    pttl: int = 0

    @classmethod
    def of(cls, reply: Any, token: str) -> LeadReply:
        """The script's ``reply`` to a lead made with ``token``."""
        status = int(reply[0])
        if status in (LEAD, UNCLAIMED):
            return cls(status, int(reply[1]), None, token, int(reply[2]), int(reply[3]))
        if status == HIT:
            return cls(status, 0, reply[1], token, None, 0, int(reply[2]))
        return cls(status, 0, None, token, None)


class _Slot(threading.local):
    value: Any = None


class NextCallAnswer(Generic[T]):
    """An answer known already, for the next call in the same thread to give instead of
    asking Redis: ``give(value)`` for the length of a ``with`` block, ``take()`` inside it
    (once; None when nothing is known). At the block's end a value not taken goes to
    ``undo``."""

    __slots__ = ("_slot", "_undo")

    def __init__(self, undo: Callable[[T], None] | None = None) -> None:
        self._slot = _Slot()
        self._undo = undo

    def take(self) -> T | None:
        slot = self._slot
        value: T | None = slot.value
        if value is not None:
            slot.value = None
        return value

    @contextmanager
    def give(self, value: T) -> Iterator[None]:
        self._slot.value = value
        try:
            yield
        finally:
            left = self.take()
            if left is not None and self._undo is not None:
                self._undo(left)
