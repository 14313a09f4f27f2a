"""The rules of fair admission, as checks any cold limiter must pass: ``ColdLimiter`` in
``tests/test_limiter_fairness.py``, ``RedisColdLimiter`` in ``tests/test_redis_fairness.py``.

Each check takes ``make(active, queue)``, which builds a fresh limiter (with a wait far
longer than any check), and the ``threads`` fixture. Waiters are queued one at a time, each
only once the limiter counts the one before, so arrival order is the order of the calls.
A check fails with ``AssertionError``, so the mutant tests can expect exactly that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from reachlimit import Busy
from tests.support.limiter import Attempt, start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

Make = Callable[[int, int], Any]


class Queue:
    """Waiters queued by a check, each named ``<client><n>`` ("a1", "b2"...)."""

    def __init__(self, threads: ThreadRunner, lim: Any) -> None:
        self.threads = threads
        self.lim = lim
        self.attempts: dict[str, Attempt] = {}
        self.promoted: list[str] = []  # in promotion order
        self._lock = threading.Lock()

    def join(self, name: str, *, release_at_once: bool = True) -> Attempt:
        """Queue waiter ``name`` of client ``name[0]``; promoted, it records its name and
        (``release_at_once``) releases its slot, which promotes the next one."""
        def on_grant(attempt: Attempt) -> None:
            with self._lock:
                self.promoted.append(attempt.name)
            if release_at_once:
                attempt.release()

        before = self.lim.stats()
        attempt = start_acquire(
            self.threads, self.lim, threading.Event(), name=name, on_grant=on_grant,
            client=name[0],
        )
        self.attempts[name] = attempt

        def queued() -> bool:  # a place of its own, one it took over (displacing), or refused
            now = self.lim.stats()
            return (
                now.queued == before.queued + 1
                or now.displaced == before.displaced + 1
                or attempt.done.is_set()
            )

        wait_until(f"{name} queued", queued)
        return attempt

    def join_all(self, names: str) -> None:
        for name in names.split():
            self.join(name)

    def reason(self, name: str) -> str | None:
        attempt = self.attempts[name]
        attempt.wait_done()
        return attempt.error.reason if isinstance(attempt.error, Busy) else None

    def still_waiting(self) -> list[str]:
        return [n for n, a in self.attempts.items() if not a.done.is_set()]


@contextmanager
def full_queue(threads: ThreadRunner, make: Make, names: str,
               active: int = 1) -> Iterator[tuple[Any, Queue, list[Any]]]:
    """A limiter whose slots the check holds and whose queue holds ``names`` (all its
    places: the queue is made that long). Yields (limiter, queue, the held grants); at the
    end the grants are released and every waiter left is promoted and gone."""
    count = len(names.split())
    lim = make(active, count)
    grants = [lim.acquire() for _ in range(active)]
    queue = Queue(threads, lim)
    queue.join_all(names)
    try:
        yield lim, queue, grants
    finally:
        for grant in grants:
            if grant.held:
                grant.release()
        for attempt in queue.attempts.values():
            attempt.wait_done()
        wait_until("drained", lambda: (lim.stats().active, lim.stats().queued) == (0, 0))


def refused_at_once(lim: Any, client: str) -> str:
    """A leader of ``client`` that must not wait: the reason it is refused with."""
    try:
        grant = lim.acquire(None, client)
    except Busy as busy:
        return busy.reason
    grant.release()
    raise AssertionError(f"a leader of {client!r} was granted a slot")


def check_one_client_alone(threads: ThreadRunner, make: Make) -> None:
    """Rule 1: one client may take every place; the next leader is refused at once, and its
    waiters are promoted first-in first-out."""
    with full_queue(threads, make, "a1 a2 a3 a4 a5 a6 a7 a8", active=2) as (lim, queue, grants):
        assert refused_at_once(lim, "a") == Busy.QUEUE_FULL
        assert queue.still_waiting() == [f"a{i}" for i in range(1, 9)]
        s = lim.stats()
        assert (s.active, s.queued, s.displaced) == (2, 8, 0)
        grants[0].release()
        wait_until("all promoted", lambda: len(queue.promoted) == 8)
        assert queue.promoted == [f"a{i}" for i in range(1, 9)], "not FIFO"


def check_newest_of_the_biggest_is_displaced(threads: ThreadRunner, make: Make) -> None:
    """Rule 2: a newcomer of a client with no place displaces the newest waiter of the client
    holding most; the displaced one is told so (not a timeout) and the newcomer waits."""
    with full_queue(threads, make, "a1 a2 a3 b1 a4") as (lim, queue, grants):
        queue.join("c1")
        assert queue.reason("a4") == Busy.DISPLACED, "the newest waiter of a was not displaced"
        assert queue.still_waiting() == ["a1", "a2", "a3", "b1", "c1"]
        s = lim.stats()
        assert (s.queued, s.displaced, s.rejected_full, s.rejected_timeout) == (5, 1, 0, 0)
        grants[0].release()
        wait_until("all promoted", lambda: len(queue.promoted) == 5)
        assert queue.promoted == ["a1", "b1", "c1", "a2", "a3"]


def check_two_more_places_not_one(threads: ThreadRunner, make: Make) -> None:
    """Rule 2's margin: the biggest client holding one place more than the newcomer's is not
    displaced (queue_full); two more is."""
    with full_queue(threads, make, "a1 a2 a3 b1 b2 c1") as (lim, queue, _):
        # b holds 2, the biggest (a) 3: one more only.
        assert refused_at_once(lim, "b") == Busy.QUEUE_FULL
        assert lim.stats().displaced == 0
        # c holds 1: a's 3 is two more.
        queue.join("c2")
        assert queue.reason("a3") == Busy.DISPLACED
        # Now a 2, b 2, c 2: nobody holds two more than anybody.
        for client in "abc":
            assert refused_at_once(lim, client) == Busy.QUEUE_FULL
        s = lim.stats()
        assert (s.displaced, s.rejected_full) == (1, 4)


def check_ties_go_to_the_newest_waiter(threads: ThreadRunner, make: Make) -> None:
    """Rule 2's tie: of two clients holding most places, the one whose newest waiter joined
    last is displaced."""
    with full_queue(threads, make, "a1 b1 b2 a2") as (lim, queue, _):
        queue.join("c1")
        assert queue.reason("a2") == Busy.DISPLACED
        assert queue.still_waiting() == ["a1", "b1", "b2", "c1"]
    with full_queue(threads, make, "a1 b1 a2 b2") as (lim, queue, _):
        queue.join("c1")
        assert queue.reason("b2") == Busy.DISPLACED
        assert queue.still_waiting() == ["a1", "b1", "a2", "c1"]


def check_round_robin_across_clients(threads: ThreadRunner, make: Make) -> None:
    """Rule 3: freed slots go to the waiting clients in turn, in the order their waits began,
    and each client's waiters first-in first-out."""
    with full_queue(threads, make, "a1 a2 a3 b1 c1 b2") as (_, queue, grants):
        grants[0].release()
        wait_until("all promoted", lambda: len(queue.promoted) == 6)
        assert queue.promoted == ["a1", "b1", "c1", "a2", "b2", "a3"]


def check_a_client_that_comes_back_waits_its_turn(threads: ThreadRunner, make: Make) -> None:
    """Rule 3: a client whose waiters all left starts again at the back of the turn."""
    lim = make(1, 8)
    holder = lim.acquire()
    queue = Queue(threads, lim)
    queue.join("a1", release_at_once=False)
    queue.join_all("b1 b2")
    holder.release()  # a1 holds the slot now
    wait_until("a1 promoted", lambda: queue.promoted == ["a1"])
    queue.join_all("a2 c1")
    queue.attempts["a1"].release()
    wait_until("all promoted", lambda: len(queue.promoted) == 5)
    # After a1: b's turn; a waits again, behind b, and c behind a.
    assert queue.promoted == ["a1", "b1", "a2", "c1", "b2"]
    # Each waiter's thread releases its slot as soon as it is promoted: the last release
    # may still be reading its reply when the figures show the limiter drained, so the
    # threads are waited for too (a limiter's client is closed once the check is over).
    for attempt in queue.attempts.values():
        attempt.wait_done()
    wait_until("drained", lambda: (lim.stats().active, lim.stats().queued) == (0, 0))


#: Every rule above, in order, for a test that runs them all on one kind of limiter.
RULES = (
    check_one_client_alone,
    check_newest_of_the_biggest_is_displaced,
    check_two_more_places_not_one,
    check_ties_go_to_the_newest_waiter,
    check_round_robin_across_clients,
    check_a_client_that_comes_back_waits_its_turn,
)
