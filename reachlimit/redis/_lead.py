"""The cold lead: a cold request's second and last round trip before its build or refusal.

design:

    A cold request on Redis used to make five round trips from its thread before its 429 (the
    cache GET, the flight's join, the leader's recheck GET, the acquire, and the refusal
    published to followers who could not exist) and four before its build. The cold lead puts
    the three middle ones into one script (``lua.COLD_LEAD``), so a cold request costs its
    cache miss and then this:

        a claim exists        follow it, or take its outcome (the flight's join, unchanged)
        no claim, cache hit   answer the entry (another process has just built it)
        no claim, miss        acquire: granted or queued -> claim the flight and lead it;
                              refused -> claim nothing, so nobody can follow it and nothing
                              is ever published for it

    Who runs what: ``RedisSingleFlight.do_cold`` (the flight, fused with its path's
    ``RedisCache`` and ``RedisColdLimiter`` by ``fuse``) sends the script through
    ``RedisColdLimiter.lead`` (which owns the token, the settings and the lost-reply
    bookkeeping of the acquire inside it), then runs ColdPath's leader step as it always has.
    That step rechecks the cache and acquires through whatever wraps them (the fallback, the
    metrics); what the script found is handed to the two Redis objects for this thread only
    (a :class:`HandOver` each), so the recheck answers "miss" without a GET and the acquire
    answers the script's admission without a script. Metrics and the fallback see the same
    calls in the same order as before.

    An admission handed over and never taken (the step found the value in the first level,
    the fallback took over, the caller's client left) is undone when the step ends: its token
    is given up at once (the slot or queue place freed), or at the next round trip if Redis
    fails then.

    On a Cluster the three keys live in different slots: no cold lead there (the flight's
    join, the recheck and the acquire are sent one by one, as before).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, NamedTuple, TypeVar

from redis.commands.core import Script

from . import lua

__all__ = ["HandOver", "LeadReply", "LEAD", "FOLLOW", "DONE", "HIT", "UNCLAIMED", "lead_scripts"]

T = TypeVar("T")

# Replies of the cold lead script (cold_lead_head.lua): the first three are the join's.
LEAD, FOLLOW, DONE, HIT, UNCLAIMED = 0, 1, 2, 3, 4


class LeadReply(NamedTuple):
    """What the cold lead found: its ``status`` (above), the ``flight`` number (claimed,
    followed or ended), the ``data`` (the ended flight's outcome, or the cache entry),
    the limiter ``token`` it acquired with, the acquire's answer (``admitted``, or None
    where it did not acquire) and, queued, how long its wait lasts (``wait_ms``: the
    budget's wait, from Redis)."""

    status: int
    flight: int
    data: Any
    token: str
    admitted: int | None
    wait_ms: int = 0

    @classmethod
    def of(cls, reply: Any, token: str) -> LeadReply:
        """The script's ``reply`` to an acquire made with ``token``."""
        status = int(reply[0])
        if status in (LEAD, UNCLAIMED):
            wait_ms = int(reply[3]) if len(reply) > 3 else 0
            return cls(status, int(reply[1]), None, token, int(reply[2]), wait_ms)
        return cls(status, int(reply[1]), reply[2] if len(reply) > 2 else None, token, None)


def lead_scripts(client: Any) -> tuple[Script, Script]:
    """The cold lead, registered on ``client``: the one sent after an admission, and the one
    sent after a refusal (as the acquire's two). The same for every limiter: each reads its
    budget's settings from Redis."""
    return (
        client.register_script(lua.COLD_LEAD),
        client.register_script(lua.COLD_LEAD_AFTER_REFUSAL),
    )


class _Slot(threading.local):
    value: Any = None


class HandOver(Generic[T]):
    """One value handed to the next call in the same thread: ``give(value)`` for the length
    of a ``with`` block, ``take()`` inside it (once; None when nothing is handed over). At the
    block's end a value not taken goes to ``undo``."""

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
