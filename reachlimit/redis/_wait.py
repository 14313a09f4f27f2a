"""A queued waiter of the Redis limiter: ``wait_for_slot``, the loop it runs until promoted,
timed out, cancelled, displaced or dropped (``RedisColdLimiter._wait_for_slot``).

design:

    Who wakes whom: a waiter blocks in ``BLPOP`` on its own doorbell for at most
    ``POLL_EVERY`` seconds (``CANCEL_POLL_INTERVAL`` with a cancel token); whichever script
    promotes it (a release, a reap found by anybody's script) pushes the doorbell. No one polls
    for a free slot: a waiter's regular poll only proves it is alive and checks its deadline.
    Redis ends a ``BLPOP`` that timed out only when its event loop next runs: on a server
    with no other traffic, at its cron tick, every ``1 / hz`` seconds (100 ms by default),
    which would make a 50 ms slice last up to 100 ms. So one daemon thread per limiter object
    (``Waker``, started with the first wait) sends a ``PING`` just after each slice's end,
    which makes the loop run and the ``BLPOP`` end on time: a waiter notices a cancel within
    a slice and its deadline within a few milliseconds, as the local limiter does
    (``benchmarks/redis_handoff.py`` measures both).

    One pass of the loop: the cancel token set -> a giving-up poll (displaced or refused late
    meanwhile is counted as such) and Cancelled; else block on the doorbell for the slice;
    "d" -> displaced; "l<s>" -> refused late (no wasted waits: its place could no longer start
    within its wait), s its Retry-After; a ring, the next poll's time or the deadline -> the
    poll script, whose outcome (granted, timeout, gone, displaced, late, or waiting with the
    milliseconds left) decides. A slot a waiter was promoted to is timed in Redis. On any other
    exception the waiter leaves with an abandoning poll (or, Redis unreachable, its token is
    given up at the next round trip).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from .._cancel import CancelToken
from .._errors import Busy, Cancelled
from .._limiter import Grant
from ._common import REDIS_ERRORS
from ._replies import (
    _ABANDON,
    _DISPLACED,
    _DISPLACED_BELL,
    _GIVE_UP,
    _GRANTED,
    _LATE,
    _LATE_BELL,
    _STAY,
    _WAITING,
)
from ._waker import Waker

__all__ = ["wait_for_slot"]


class Waiting(Protocol):
    """What the loop uses of its limiter (a RedisColdLimiter, or a test's subclass of it)."""

    POLL_EVERY: float
    CANCEL_POLL_INTERVAL: float
    _bell: str
    _block_cap: float
    _waker: Waker
    _client: Any
    _retry_after: int

    def _poll(self, token: str, leaving: int) -> tuple[int, int]: ...

    def _lose(self, token: str) -> None: ...

    def _granted(self, token: str, timed: bool = False) -> Grant: ...


def wait_for_slot(
    self: Waiting, token: str, remaining: float, cancel: CancelToken | None
) -> Grant:
    """Wait as a queued waiter until promoted, timed out, cancelled or dropped. Runs in
    the requesting thread. The local clock only schedules the next poll; whether the wait
    is over is decided by the poll script, on Redis's clock."""
    bell = self._bell + token
    slice_cap = self.CANCEL_POLL_INTERVAL if cancel is not None else self.POLL_EVERY
    slice_cap = min(slice_cap, self._block_cap)
    retry = 0  # a late refusal's Retry-After (s), from Redis
    try:
        now = time.monotonic()
        next_poll = now + self.POLL_EVERY
        deadline = now + remaining
        while True:
            if cancel is not None and cancel.is_set():
                # Cancelled, or already gone: either way; displaced or late is counted as such.
                outcome, retry = self._poll(token, _GIVE_UP)
                if outcome in (_DISPLACED, _LATE):
                    break
                raise Cancelled()
            now = time.monotonic()
            block = max(0.001, min(slice_cap, next_poll - now, deadline - now + 0.001))
            self._waker.wake_at(time.monotonic() + block)
            rang = self._client.blpop([bell], timeout=block)
            if rang is not None and rang[1] in _DISPLACED_BELL:
                outcome = _DISPLACED  # the displacer took us out of the queue
                break
            if rang is not None and rang[1][:1] in _LATE_BELL:
                outcome, retry = _LATE, int(rang[1][1:] or 1)  # its refuser took us out
                break
            now = time.monotonic()
            if rang is None and now < next_poll and now < deadline:
                continue
            outcome, remaining_ms = self._poll(token, _STAY)
            if outcome != _WAITING:
                retry = remaining_ms  # (for _LATE: its Retry-After in s)
                break
            now = time.monotonic()
            next_poll = now + self.POLL_EVERY
            deadline = now + remaining_ms / 1000
    except Cancelled:
        raise
    except BaseException:
        # A Redis error, or an exception thrown into this thread: leave the queue (or pass
        # on a slot handed over meanwhile). If Redis cannot be reached, it drops us anyway
        # one presence period after our last poll.
        try:
            self._poll(token, _ABANDON)
        except REDIS_ERRORS:
            self._lose(token)  # Redis drops us anyway, a presence period later
        raise
    if outcome == _GRANTED:
        return self._granted(token, timed=True)
    if outcome == _DISPLACED:
        raise Busy(Busy.DISPLACED, self._retry_after)
    if outcome == _LATE:
        raise Busy(Busy.DEADLINE, max(self._retry_after, retry))
    raise Busy(Busy.TIMEOUT, self._retry_after)  # _TIMEOUT, or _GONE: the place was lost
