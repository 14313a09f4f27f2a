"""How a queued waiter's wait ends in ColdLimiter: timeout, cancellation, or an error from its
cancel object or the clock. Every ending gives the gate place back exactly once.
"""

from __future__ import annotations

import threading

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter
from tests.support.clock import FakeClock
from tests.support.limiter import assert_exact_capacity, gate_size, start_acquire, stats_diff
from tests.support.limiter_checks import (
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_gate_place_returned_after_timeout,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def test_cancel_while_waiting_raises_cancelled_and_returns_the_place(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=FakeClock())
    holder = lim.acquire()
    cancel = threading.Event()
    waiter = start_acquire(threads, lim, cancel)
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    assert not waiter.done.is_set()  # really blocked
    before = lim.stats()
    cancel.set()
    waiter.wait_done()
    assert isinstance(waiter.error, Cancelled)
    after = lim.stats()
    assert stats_diff(before, after) == {"cancelled": (0, 1), "queued": (1, 0)}
    assert gate_size(lim) == 0
    holder.release()
    assert lim.stats().active == 0


def test_a_gate_place_given_back_at_promotion_is_reusable(threads: ThreadRunner) -> None:
    check_gate_place_returned_after_promotion(ColdLimiter, threads)


def test_a_gate_place_given_back_after_a_timeout_is_reusable(threads: ThreadRunner) -> None:
    check_gate_place_returned_after_timeout(ColdLimiter, threads)


def test_a_gate_place_given_back_after_a_cancel_is_reusable(threads: ThreadRunner) -> None:
    check_gate_place_returned_after_cancel(ColdLimiter, threads)


def test_timeout_without_cancel_small_real_wait() -> None:
    # Nothing will ever free the slot, so the outcome is certain; only its moment is real time.
    lim = ColdLimiter(active=1, queue=1, wait=0.05)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
        assert info.value.reason == "timeout"
        s = lim.stats()
        assert (s.active, s.queued, s.rejected_timeout, s.peak_queued) == (1, 0, 1, 1)
        assert gate_size(lim) == 0
    assert lim.stats().active == 0


def test_timeout_when_the_clock_passes_the_deadline_while_waiting(threads: ThreadRunner) -> None:
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=2, wait=3.0, clock=clock)
    holder = lim.acquire()
    cancel = threading.Event()  # never set: it only makes the wait run in short slices
    waiter = start_acquire(threads, lim, cancel)
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    wait_until("deadline fixed", lambda: clock.calls >= 2)
    assert not waiter.done.is_set()
    clock.advance(2.9)
    clock.advance(0.2)  # now past the deadline
    waiter.wait_done()
    assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout"
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout, s.cancelled) == (1, 0, 1, 0)
    holder.release()
    assert lim.stats().active == 0


def test_huge_finite_wait_is_refused_at_construction_or_honoured(threads: ThreadRunner) -> None:
    """A ``wait`` beyond ``threading.TIMEOUT_MAX`` must not turn every queued request into
    an ``OverflowError``: either the constructor refuses it, or a waiter really waits."""
    huge = threading.TIMEOUT_MAX * 2
    try:
        lim = ColdLimiter(active=1, queue=1, wait=huge)
    except ValueError as exc:
        assert str(exc) == "wait > 0"
        return
    holder = lim.acquire()
    waiter = start_acquire(threads, lim)  # no cancel object: one timed wait

    # Wait until the waiter is inside Condition.wait (white box: the Condition's own waiter
    # list), so that the release below cannot reach it before it waits.
    def inside_condition_wait() -> bool:
        with lim._lock:  # the Condition's lock: its waiter list is stable while we hold it
            return any(w.cond._waiters for w in lim._waiters)  # type: ignore[attr-defined]

    wait_until(
        "the waiter inside its Condition wait",
        lambda: waiter.done.is_set() or inside_condition_wait(),
    )
    holder.release()
    waiter.wait_done()
    assert waiter.error is None, f"queued waiter failed with {waiter.error!r}"
    assert waiter.grant is not None
    waiter.release()
    assert lim.stats().active == 0


class ExplodingCancel:
    """Reads "not set" until ``armed``; then ``is_set()`` raises."""

    def __init__(self) -> None:
        self.armed = threading.Event()

    def is_set(self) -> bool:
        if self.armed.is_set():
            raise RuntimeError("cancel object broke")
        return False


def test_exception_from_cancel_is_set_while_queued_leaks_no_place(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=FakeClock())
    holder = lim.acquire()
    cancel = ExplodingCancel()
    waiter = start_acquire(threads, lim, cancel)
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    cancel.armed.set()
    waiter.wait_done()
    assert isinstance(waiter.error, RuntimeError)
    s = lim.stats()
    assert (s.active, s.queued, s.cancelled, s.rejected_timeout) == (1, 0, 0, 0)
    assert gate_size(lim) == 0
    # The place is really usable again.
    again = threading.Event()
    second = start_acquire(threads, lim, again)
    wait_until("second refused or queued", lambda: second.done.is_set() or lim.stats().queued == 1)
    assert not second.done.is_set(), f"not admitted: {second.error!r}"
    holder.release()
    second.wait_done()
    assert second.grant is not None
    second.release()
    assert (lim.stats().active, gate_size(lim)) == (0, 0)


class ExplodingClock:
    """A frozen clock whose reads raise from the ``fail_from``-th read on (counting from 1)."""

    def __init__(self, fail_from: int) -> None:
        self.fail_from = fail_from
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls >= self.fail_from:
            raise RuntimeError("clock broke")
        return 50.0


@pytest.mark.parametrize(
    "fail_from",
    [1, 2, 3],
    ids=["deadline-read", "first-remaining-read", "read-after-a-slice"],
)
def test_exception_from_the_clock_while_queued_leaks_no_place(
    threads: ThreadRunner, fail_from: int
) -> None:
    """The fast path never reads the clock, so read 1 is the queued caller fixing its
    deadline, read 2 the first "time remaining", read 3 the one after a 50 ms slice."""
    clock = ExplodingClock(fail_from)
    lim = ColdLimiter(active=1, queue=1, clock=clock)
    holder = lim.acquire()
    assert clock.calls == 0
    with pytest.raises(RuntimeError, match="clock broke"):
        lim.acquire(threading.Event())  # a cancel object: the wait runs in slices
    assert clock.calls == fail_from
    s = lim.stats()
    assert (s.active, s.queued) == (1, 0), f"the failed acquire left a waiter behind: {s}"
    assert gate_size(lim) == 0, "the failed acquire kept its gate place"
    holder.release()
    assert lim.stats().active == 0
    clock.fail_from = 10**9  # mended, so that the capacity probe can queue
    assert_exact_capacity(lim)


def test_a_wait_without_a_cancel_token_is_one_timed_wait(threads: ThreadRunner) -> None:
    """Only a wait that watches a cancel token runs in slices: without one, the waiter reads
    the clock once for its deadline and once for what remains, then sleeps until notified.
    (A "did it really stay asleep" check: the real pause below can only hide a regression on a
    very slow machine, never fail a correct limiter.)"""
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=1, wait=3600.0, clock=clock)
    holder = lim.acquire()
    waiter = start_acquire(threads, lim, name="waiter")
    wait_until("the waiter read its clock twice", lambda: clock.calls >= 2)
    wait_until("the waiter parked", lambda: lim.stats().queued == 1)
    threading.Event().wait(4 * lim.CANCEL_POLL_INTERVAL)  # several slices, had it sliced
    assert clock.calls == 2 and not waiter.done.is_set()
    holder.release()
    waiter.wait_done()
    assert waiter.grant is not None
    waiter.release()
