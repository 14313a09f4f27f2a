"""No wasted waits in ColdLimiter: the estimate of build time (a low percentile of timed
promoted grants, none before ``ESTIMATE_AFTER``), a leader refused at once with
``Busy("deadline")`` when its place cannot start within its wait (and admitted exactly at it),
a waiter refused as soon as the estimate grows past its deadline, round-robin places with two
clients, ``deadline=False``, and every place returned once with deadline refusals mixed in.

design:

    Every limiter runs on a ``FakeClock``: the estimate is taught with
    ``tests.support.deadline.learn`` (promoted grants held a given time on the clock), and
    nobody's wait ever runs out, because the clock never passes a deadline. So a leader that
    finishes was refused by the limiter's own decision, not by a timeout: a waiter that would
    wait, waits for ever (until the test cancels it). Waiters are started one by one, each
    awaited until the limiter counts it, so the queue's order is the test's.

    Places are worked out in the tests' comments with the module's formula:
    start(p) = now + free[p % active] + (p // active) * E.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, ColdPath, TTLCache
from tests.support.clock import FakeClock
from tests.support.deadline import learn, promote
from tests.support.limiter import (
    Attempt,
    assert_exact_capacity,
    check_white_box,
    gate_size,
    start_acquire,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def limiter(active: int = 1, queue: int = 8, wait: float = 3.0, retry_after: int = 1,
            **options: Any) -> tuple[ColdLimiter, FakeClock]:
    clock = FakeClock()
    return ColdLimiter(active, queue, wait, retry_after, clock=clock, **options), clock


class Queued:
    """A leader queued by :func:`queue_up` (its :class:`Attempt`'s figures are read through)
    and the Event that cancels it."""

    def __init__(self, attempt: Attempt, cancel: threading.Event) -> None:
        self.attempt = attempt
        self.cancel = cancel

    def __getattr__(self, name: str) -> Any:
        return getattr(self.attempt, name)


def queue_up(lim: ColdLimiter, threads: ThreadRunner, name: str, client: Any = None,
             pushes_out: int = 0) -> Queued:
    """A leader that must end up waiting: returns once the limiter counts it queued (and
    ``pushes_out`` waiters it put behind their deadline refused)."""
    before = lim.stats()
    cancel = threading.Event()
    attempt = start_acquire(threads, lim, cancel, name=name, client=client)

    def queued() -> bool:
        s = lim.stats()
        return (s.queued, s.deadline) == (
            before.queued + 1 - pushes_out, before.deadline + pushes_out)

    wait_until(f"{name} queued", queued)
    return Queued(attempt, cancel)


def cancel_all(threads: ThreadRunner, waiting: list[Queued]) -> None:
    for queued in waiting:
        queued.cancel.set()
    threads.join_all()


def refused_at_once(lim: ColdLimiter, threads: ThreadRunner, name: str, client: Any = None
                    ) -> Busy:
    """A leader that must be refused with "deadline" without waiting (the clock never
    moves, so a leader that waited would wait for ever)."""
    attempt = start_acquire(threads, lim, threading.Event(), name=name, client=client)
    attempt.wait_done()
    assert isinstance(attempt.error, Busy), (name, attempt.error, attempt.value)
    assert attempt.error.reason == "deadline"
    return attempt.error


# -- the estimate ---------------------------------------------------------------------------


def test_no_estimate_before_four_timed_grants_and_none_from_the_fast_path(
    threads: ThreadRunner,
) -> None:
    lim, clock = limiter()
    for _ in range(5):  # fast-path grants held long are never timed
        with lim.acquire():
            clock.advance(10.0)
    assert lim.build_estimate is None
    learn(lim, clock, threads, [2.0, 2.0, 2.0])
    assert lim.build_estimate is None  # three timings: still none
    learn(lim, clock, threads, [2.0])
    assert lim.build_estimate == 2.0


@pytest.mark.parametrize(
    ("durations", "estimate"),
    [
        ([4.0, 1.0, 3.0, 2.0], 1.0),  # four: the smallest
        ([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 2.0),  # eight: the second smallest
        ([float(n) for n in range(16, 0, -1)], 4.0),  # sixteen: the fourth smallest
        # Only the last sixteen count: the four shortest (1..4) are the oldest, gone.
        ([1.0, 2.0, 3.0, 4.0, *(float(n) for n in range(20, 4, -1))], 8.0),
    ],
    ids=["4", "8", "16", "last-16"],
)
def test_the_estimate_is_a_low_percentile_of_the_latest_timings(
    threads: ThreadRunner, durations: list[float], estimate: float
) -> None:
    lim, clock = limiter(wait=100.0)  # every timing within the wait: nobody is refused
    learn(lim, clock, threads, durations)
    assert lim.build_estimate == estimate


def test_a_grant_left_by_an_exception_is_timed_too(threads: ThreadRunner) -> None:
    lim, clock = limiter()
    learn(lim, clock, threads, [3.0, 3.0, 3.0])
    grant = promote(lim, threads, lim.acquire())
    clock.advance(0.5)
    with pytest.raises(ZeroDivisionError), grant:
        _ = 1 / 0
    assert lim.build_estimate == 0.5  # the build that failed fast held its slot 0.5 s


# -- a leader refused at once ---------------------------------------------------------------


def test_a_leader_that_cannot_start_in_time_is_refused_at_once_and_one_exactly_in_time_waits(
    threads: ThreadRunner,
) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [1.5] * 4)  # E = 1.5
    holder = lim.acquire()  # a fast-path grant: its start is unknown, counted as ending now
    # free = [0]: p = 0, 1, 2 start 0, 1.5 and 3.0 s from now; 3.0 is exactly the wait.
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(3)]
    reads = clock.calls
    busy = refused_at_once(lim, threads, "w3")  # p = 3: 4.5 s > 3 s
    assert busy.retry_after == 2  # ceil(4.5 - 3.0)
    assert clock.calls == reads + 1  # the newcomer's one reading, for its deadline
    s = lim.stats()
    assert (s.queued, s.deadline, s.rejected_timeout, s.rejected_full) == (3, 1, 0, 0)
    assert gate_size(lim) == 3
    check_white_box(lim)
    assert not any(w.done.is_set() for w in waiting)  # the three really wait
    # The line drains in order and nobody else is refused.
    for p, attempt in enumerate(waiting):
        holder.release()
        attempt.wait_done()
        assert attempt.grant is not None, (p, attempt.error)
        holder = attempt.grant
    holder.release()
    assert lim.stats().deadline == 1
    assert_exact_capacity(lim)


def test_the_retry_after_is_never_below_the_limiters_own(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=4, wait=3.0, retry_after=5)
    learn(lim, clock, threads, [2.0] * 4)
    holder = lim.acquire()
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(2)]  # 0 and 2.0 s
    assert refused_at_once(lim, threads, "late").retry_after == 5  # ceil(4 - 3) = 1 < 5
    cancel_all(threads, waiting)
    holder.release()
    assert_exact_capacity(lim)


def test_a_holder_promoted_earlier_counts_what_it_still_needs(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [1.5] * 4)
    holder = promote(lim, threads, lim.acquire())  # timed: started now
    clock.advance(1.0)  # it needs 0.5 s more: free = [0.5]
    # p = 0, 1 start 0.5 and 2.0 s from now; p = 2 at 3.5 s is late (with a fast-path
    # holder, free = [0], it would start at exactly 3.0 and wait: the test above).
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(2)]
    assert refused_at_once(lim, threads, "w2").retry_after == 1  # ceil(3.5 - 3.0)
    cancel_all(threads, waiting)
    holder.release()
    assert_exact_capacity(lim)


def test_without_the_estimate_nothing_is_refused(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [5.0] * 3)  # three timings of builds longer than the wait
    holder = lim.acquire()
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(8)]
    s = lim.stats()
    assert (s.queued, s.deadline) == (8, 0)
    cancel_all(threads, waiting)
    holder.release()
    assert_exact_capacity(lim)


def test_deadline_false_waits_as_before(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0, deadline=False)
    learn(lim, clock, threads, [5.0] * 8)
    assert lim.build_estimate is None
    holder = lim.acquire()
    reads = clock.calls
    holder.release()
    holder = promote(lim, threads, lim.acquire())
    clock.advance(5.0)
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(8)]
    s = lim.stats()
    assert (s.queued, s.deadline) == (8, 0)
    cancel_all(threads, waiting)
    holder.release()
    assert lim.stats().deadline == 0
    del reads


def test_deadline_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="deadline is True or False"):
        ColdLimiter(deadline="no")  # type: ignore[arg-type]


# -- a waiter refused when the estimate grows --------------------------------------------


def test_a_waiter_is_refused_at_once_when_the_estimate_grows_past_its_deadline(
    threads: ThreadRunner,
) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [0.5, 2.0, 2.0, 2.0])  # E = 0.5, the smallest of four
    holder = promote(lim, threads, lim.acquire())  # timed, from now (t)
    # free = [0.5]: p = 0..5 start 0.5 .. 3.0 s from now: all six in time.
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(6)]
    assert lim.stats().deadline == 0
    clock.advance(2.0)
    # The holder took 2.0 s: timings 0.5, 2, 2, 2, 2 -> E = 2.0 (the second smallest of
    # five). w0 gets the slot (free = [2.0]); w1 would start at t + 4, past its deadline
    # t + 3: refused now, woken, not at the end of its wait; then w2 is first in line (the
    # refused count for nobody), also at t + 4; and so on.
    holder.release()
    waiting[0].wait_done()
    assert waiting[0].grant is not None
    for p, attempt in enumerate(waiting[1:], start=1):
        attempt.wait_done()
        assert isinstance(attempt.error, Busy), (p, attempt.error)
        assert (attempt.error.reason, attempt.error.retry_after) == ("deadline", 1)
    s = lim.stats()
    assert (s.queued, s.deadline, s.rejected_timeout, s.cancelled) == (0, 5, 0, 0)
    assert gate_size(lim) == 0
    waiting[0].release()
    assert_exact_capacity(lim)


def test_a_waiter_whose_deadline_passed_times_out_instead(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [1.0] * 4)
    holder = promote(lim, threads, lim.acquire())
    waiting = [queue_up(lim, threads, f"w{p}") for p in range(3)]  # 1, 2, 3 s: in time
    clock.advance(3.5)  # every deadline passed: theirs to see, whatever the walk finds
    holder.release()
    waiting[0].wait_done()
    assert waiting[0].grant is not None  # the slot handed over before it looked is kept
    for attempt in waiting[1:]:
        attempt.wait_done(timeout=10)
        assert isinstance(attempt.error, Busy) and attempt.error.reason == "timeout"
    s = lim.stats()
    assert (s.deadline, s.rejected_timeout) == (0, 2)
    waiting[0].release()
    assert_exact_capacity(lim)


# -- round-robin places ----------------------------------------------------------------------


def test_places_are_round_robin_across_clients(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=8, wait=3.0)
    learn(lim, clock, threads, [1.0] * 4)  # E = 1.0
    holder = lim.acquire()  # free = [0]: place p starts p seconds from now
    crawler = [queue_up(lim, threads, f"a{i}", client="a") for i in range(4)]  # 0..3 s
    # As a FIFO b0 would start 4th (4 s, refused); round-robin serves it second (1 s), so it
    # waits, and a3 (pushed from 3 to 4 s) is refused in its favour, at once.
    b0 = queue_up(lim, threads, "b0", client="b", pushes_out=1)
    crawler[3].wait_done()
    assert isinstance(crawler[3].error, Busy) and crawler[3].error.reason == "deadline"
    # b1: a0 b0 a1 b1 a2 -> 3 s, exactly in time; a2 goes to 4 s and is refused.
    b1 = queue_up(lim, threads, "b1", client="b", pushes_out=1)
    crawler[2].wait_done()
    assert isinstance(crawler[2].error, Busy) and crawler[2].error.reason == "deadline"
    # b2: a0 b0 a1 b1 b2 -> 4 s: refused at once, and nobody else.
    assert refused_at_once(lim, threads, "b2", client="b").retry_after == 1
    s = lim.stats()
    assert (s.queued, s.deadline) == (4, 3)
    check_white_box(lim)
    # The slots go round: a0, b0, a1, b1.
    order = []
    for attempt in (crawler[0], b0, crawler[1], b1):
        holder.release()
        attempt.wait_done()
        assert attempt.grant is not None, attempt.name
        order.append(attempt.name)
        holder = attempt.grant
    holder.release()
    assert order == ["a0", "b0", "a1", "b1"]
    assert lim.stats().deadline == 3
    assert_exact_capacity(lim)


def test_a_displacing_newcomer_that_cannot_start_in_time_is_refused(
    threads: ThreadRunner,
) -> None:
    lim, clock = limiter(active=1, queue=4, wait=3.0)
    learn(lim, clock, threads, [1.0] * 4)
    holder = promote(lim, threads, lim.acquire())  # timed, free = [1.0]: p starts at p + 1
    crawler = [queue_up(lim, threads, f"a{i}", client="a") for i in range(2)]  # 1, 2 s
    # b's newcomer finds room and round-robin puts it second (2 s): a1 is pushed to 3 s.
    b0 = queue_up(lim, threads, "b0", client="b")
    # The queue holds a0 b0 a1 and one free place; a2 takes it (p = 3: 4 s): refused at once.
    assert refused_at_once(lim, threads, "a2", client="a").retry_after == 1
    s = lim.stats()
    assert (s.queued, s.deadline, s.displaced) == (3, 1, 0)
    cancel_all(threads, [*crawler, b0])
    holder.release()
    assert_exact_capacity(lim)


# -- every place returned once, deadline refusals mixed in -------------------------------


def test_every_place_comes_back_with_deadline_refusals_timeouts_and_cancels_mixed(
    threads: ThreadRunner,
) -> None:
    lim, clock = limiter(active=2, queue=4, wait=2.5)
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # a wait re-reads the clock often
    untimed = lim.acquire()  # held throughout: the slot counted as ending now
    learn(lim, clock, threads, [2.0] * 4)  # on the other slot: E = 2.0
    timed = promote(lim, threads, lim.acquire())  # from now (t): free = [0, 2.0]
    # p = 0, 1, 2 start 0, 2 and 2 s from now (in time); p = 3 at 4 s is late.
    a = [queue_up(lim, threads, f"a{p}", client="a") for p in range(3)]
    at_once = [refused_at_once(lim, threads, f"late{i}", client="a") for i in range(2)]
    assert [b.retry_after for b in at_once] == [2, 2]  # ceil(4 - 2.5)
    # b0 is served second (a0 b0 a1 a2): a2 goes to 4 s, refused and woken.
    b0 = queue_up(lim, threads, "b0", client="b", pushes_out=1)
    a[2].wait_done()
    assert isinstance(a[2].error, Busy)
    assert (a[2].error.reason, a[2].error.retry_after) == ("deadline", 2)
    check_white_box(lim)
    a[1].cancel.set()  # a1 leaves: cancelled
    a[1].wait_done()
    assert isinstance(a[1].error, Cancelled)
    clock.advance(1.0)
    # The timed holder took 1.0 s (E stays 2.0: 1, 2, 2, 2, 2): a0 gets its slot, and b0
    # (t + 1, p = 0 behind the untimed slot) is still in time.
    timed.release()
    a[0].wait_done()
    assert a[0].grant is not None
    assert not b0.done.is_set()
    clock.advance(2.0)  # t + 3: past b0's deadline (t + 2.5): it times out by itself
    b0.wait_done()
    assert isinstance(b0.error, Busy) and b0.error.reason == "timeout"
    a[0].release()
    untimed.release()
    s = lim.stats()
    # Granted: the untimed slot, learn's 1 + 4, promote's 1 + 1, a0. Refused: 3 "deadline"
    # (two at once, one woken), 1 timeout; 1 cancelled. Each call ended once.
    assert (s.acquired, s.deadline, s.rejected_timeout, s.cancelled, s.rejected_full) == (
        9, 3, 1, 1, 0)
    assert (s.active, s.queued, s.peak_active) == (0, 0, 2)
    assert gate_size(lim) == 0
    check_white_box(lim)
    assert_exact_capacity(lim)


class ClockBroken(Exception):
    pass


class BreakingClock(FakeClock):
    """A fake clock that raises ``ClockBroken`` while ``broken`` is set."""

    broken = False

    def __call__(self) -> float:
        if self.broken:
            raise ClockBroken()
        return super().__call__()


def test_a_clock_that_raises_leaves_no_slot_and_no_place_behind(threads: ThreadRunner) -> None:
    clock = BreakingClock()
    lim = ColdLimiter(1, 4, 3.0, clock=clock)
    learn(lim, clock, threads, [1.0] * 4)
    grant = promote(lim, threads, lim.acquire())  # a timed grant
    clock.broken = True
    # The newcomer's reading (for its deadline and the walk) raises: its place comes back.
    with pytest.raises(ClockBroken):
        lim.acquire()
    assert (lim.stats().queued, gate_size(lim)) == (0, 0)
    # The timed release's reading raises: the slot comes back all the same, untimed.
    with pytest.raises(ClockBroken):
        grant.release()
    clock.broken = False
    assert lim.stats().active == 0 and not lim._holding
    assert lim.build_estimate == 1.0  # nothing recorded for it
    assert_exact_capacity(lim)


# -- the path's figures ----------------------------------------------------------------------


def test_cold_path_stats_count_deadline_refusals(threads: ThreadRunner) -> None:
    lim, clock = limiter(active=1, queue=4, wait=1.0)
    path = ColdPath(lim, TTLCache(16, 60.0))
    learn(lim, clock, threads, [2.0] * 4)
    holder = promote(lim, threads, lim.acquire())  # free = [2.0] > the wait
    with pytest.raises(Busy) as info:
        path.get("k", lambda: "built")
    assert (info.value.reason, info.value.retry_after) == ("deadline", 1)
    figures = path.stats().as_dict()
    assert figures["deadline"] == 1 and figures["misses"] == 1 and figures["builds"] == 0
    holder.release()
