"""Outcomes a flight's leader could not publish, published as soon as Redis answers again.

design:

    A leader that ends its build while Redis is away (paused, failing over, restarting)
    cannot publish the outcome: its followers in other processes still see the claim, and
    without this they would wait for the claim's lease to end (seconds: ``lease``) and then
    build the key again, although the value was there. So the flight hands the outcome it
    could not publish to a ``Republisher``: one daemon thread per flight object, started by
    the first such outcome, that tries every ``interval`` seconds (``POLL_EVERY`` of the
    flight: a quarter of a second) to publish every outcome it holds, each with the very
    script and arguments of the first try - the first outcome of a flight wins and the
    claim is dropped only if it is still ours, so a late publish after a follower took the
    flight over changes nothing but ringing its followers' doorbells with a value that is
    as good. An outcome is given up ``keep`` seconds after its first try failed (the flight's
    lease: by then the claim has ended and a follower has taken the flight over), and when
    the flight closes.

    The flight also hands it the claims a lost reply may have left (``_claiming``): a try
    that finds no such claim yet answers False, and the item is tried again next time (the
    lost script may run later), until it is found and dropped or ``keep`` has passed.

    Idle: with nothing held the thread waits untimed until an outcome is added (``add``
    notifies it) or ``close``. A try that fails with a Redis error keeps the outcome for the
    next interval; other errors are not expected (the script's arguments were fine the first
    time) and drop it, logged. No Redis call is made under the lock.

    After a fork (``_daemon``): the child holds none of the parent's outcomes (the parent
    publishes them) and has no thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from ._common import REDIS_ERRORS
from ._daemon import Daemon

__all__ = ["Republisher"]

log = logging.getLogger("reachlimit")

T = TypeVar("T")


class Republisher(Daemon, Generic[T]):
    """Publishes the outcomes handed to :meth:`add` once Redis answers (module design).

    ``publish(item)`` sends one outcome (raising a Redis error when Redis is still away;
    returning False when Redis answered but the item is to be tried again next time);
    ``interval`` is how often the thread tries, ``keep`` how long an outcome is tried for;
    ``describe(item)`` says what a try that worked did, for the log."""

    def __init__(
        self,
        thread_name: str,
        publish: Callable[[T], object],
        *,
        interval: float,
        keep: float,
        clock: Callable[[], float] = time.monotonic,
        describe: Callable[[T], str] = lambda item: "published a flight outcome",
    ) -> None:
        super().__init__(thread_name)
        self._publish = publish
        self._describe = describe
        self._interval = interval
        self._keep = keep
        self._clock = clock
        self._held: list[tuple[float, T]] = []  # (give up at, item); guarded by lock

    def add(self, item: T) -> None:
        """Publish ``item`` as soon as Redis answers, for up to ``keep`` seconds."""
        with self.lock:
            if self._closed:
                return
            self._held.append((self._clock() + self._keep, item))
            self._wake_locked()
            self._start_locked()

    def _after_fork(self) -> None:
        self._held = []  # the parent's outcomes: the parent publishes them

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self._next_round_locked(bool(self._held), self._interval):
                    return
                held, self._held = self._held, []
            kept = self._try(held)
            with self.lock:
                self._held = kept + self._held

    def _try(self, held: list[tuple[float, T]]) -> list[tuple[float, T]]:
        """Publish each of ``held`` once (in the thread, outside the lock); what to keep.
        They are in the order they were added, so those given up come first."""
        now = self._clock()
        again: list[tuple[float, T]] = []
        for index, (until, item) in enumerate(held):
            if now >= until:
                log.debug("reachlimit: gave up publishing a flight outcome (Redis away)")
                continue
            try:
                done = self._publish(item)
            except REDIS_ERRORS:
                # Redis is still away: the rest would fail the same way, so all are kept.
                return again + held[index:]
            except Exception:
                log.exception("reachlimit: a flight outcome could not be published")
                continue
            if done is False:  # Redis answered; the item is for a later try
                again.append((until, item))
                continue
            log.info("reachlimit: %s late (Redis answers again)", self._describe(item))
        return again
