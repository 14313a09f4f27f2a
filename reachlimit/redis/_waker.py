"""The waker: ends a waiter's timed-out ``BLPOP`` on time (see :class:`Waker`)."""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

from ._common import REDIS_ERRORS
from ._daemon import Daemon

__all__ = ["Waker"]


class Waker(Daemon):
    """Ends a waiter's timed-out ``BLPOP`` on time: sends Redis a ``PING`` when it is due.

    Redis notices a blocking command that timed out only when its event loop runs: at once
    on a busy server, but on a server with no other traffic at its next cron tick (every
    100 ms at the default ``hz 10``), so a 50 ms slice could last 100 ms. Any command makes
    the loop run, so a ``PING`` on another connection just after the slice's end makes the
    ``BLPOP`` end then. One daemon thread per limiter object, started with the first wait
    (afresh in a forked child: ``_daemon``); a ``PING`` that comes when the ``BLPOP`` has
    already ended is harmless. A failing ``PING`` is ignored: the waiter then ends on
    Redis's tick, as it would without this.

    On a Redis Cluster the nudge must reach the node the waiters block on, which a ``PING``
    would not (redis-py sends it to a node of its choice): given ``key`` (a key of the
    waiters' hash tag), the nudge is an ``EXISTS`` of it, which goes to that key's node.
    """

    #: After a slice's end: the first nudge, and a second in case the first came too early
    #: for Redis's clock (the BLPOP's timeout starts when Redis reads it).
    NUDGES = (0.001, 0.005)

    def __init__(self, client: Any, key: str | None = None) -> None:
        super().__init__("reachlimit-blpop-waker")
        self._client = client
        self._key = key
        self._due: list[float] = []  # guarded by lock: a heap of monotonic times

    def wake_at(self, end: float) -> None:
        """A ``BLPOP`` sent now times out at ``end`` (monotonic): nudge Redis just after."""
        with self._cond:
            if self._closed:
                return
            earliest = self._due[0] if self._due else math.inf
            for nudge in self.NUDGES:
                heapq.heappush(self._due, end + nudge)
            if self._due[0] < earliest:
                self._cond.notify()  # a running thread sleeps until a later time
            self._start_locked()

    def _after_fork(self) -> None:
        self._due = []  # the parent's waiters' times: none of them is here

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due:
                    self._cond.wait()
                if self._closed:
                    return
                wait = self._due[0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                now = time.monotonic()
                while self._due and self._due[0] <= now:
                    heapq.heappop(self._due)
            try:
                if self._key is None:
                    self._client.ping()
                else:
                    self._client.exists(self._key)
            except REDIS_ERRORS:
                pass
