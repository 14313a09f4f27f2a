"""Admission and refusal in ColdLimiter: a free slot is taken at once, a leader beyond the
queue is refused at once, and neither path reads the clock or leaves any waiting state.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter
from tests.support.clock import FakeClock
from tests.support.limiter import gate_size, start_acquire, stats_diff
from tests.support.limiter_checks import check_queue_bound
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def test_fast_path_and_refusal_path_never_read_the_clock(fake_clock: Any) -> None:
    lim = ColdLimiter(active=2, queue=0, clock=fake_clock)
    for _ in range(5):
        with lim.acquire(), lim.acquire(threading.Event()):
            for _ in range(3):
                with pytest.raises(Busy) as info:
                    lim.acquire()
                assert info.value.reason == "queue_full"
    assert fake_clock.calls == 0
    s = lim.stats()
    assert (s.acquired, s.rejected_full, s.active) == (10, 15, 0)


def test_queue_zero_builds_no_gate_and_refuses_at_once(fake_clock: Any) -> None:
    lim = ColdLimiter(active=1, queue=0, clock=fake_clock)
    assert lim._gate is None
    with lim.acquire():
        for _ in range(3):
            with pytest.raises(Busy) as info:
                lim.acquire(threading.Event())
            assert info.value.reason == "queue_full"
    s = lim.stats()
    assert (s.rejected_full, s.queued, s.peak_queued, s.active) == (3, 0, 0, 0)
    assert fake_clock.calls == 0


def test_cancel_already_set_raises_cancelled_and_changes_nothing(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=FakeClock())
    cancel = threading.Event()
    cancel.set()
    before = lim.stats()
    with pytest.raises(Cancelled):  # even with a free slot
        lim.acquire(cancel)
    assert lim.stats() == before
    with lim.acquire():
        before = lim.stats()
        with pytest.raises(Cancelled):  # and with a full one
            lim.acquire(cancel)
        assert lim.stats() == before
        assert gate_size(lim) == 0


def test_with_the_queue_full_the_next_leader_is_refused_with_queue_full(
    threads: ThreadRunner,
) -> None:
    check_queue_bound(ColdLimiter, threads)


def test_a_leader_beyond_the_queue_is_refused_at_once_without_any_waiting_state(
    threads: ThreadRunner,
) -> None:
    clock = FakeClock()
    lim = ColdLimiter(active=2, queue=8, clock=clock)
    holders = [lim.acquire(), lim.acquire()]
    assert clock.calls == 0
    cancels = [threading.Event() for _ in range(8)]
    waiters = []
    for i, cancel in enumerate(cancels):
        waiters.append(start_acquire(threads, lim, cancel, name=f"waiter-{i}"))
        wait_until(f"{i + 1} queued", lambda i=i: lim.stats().queued == i + 1)
    assert not any(w.done.is_set() for w in waiters)  # all really blocked
    before = lim.stats()
    records = list(lim._waiters)
    assert clock.calls_from_this_thread() == 0
    for n in range(1, 4):
        with pytest.raises(Busy) as info:
            lim.acquire()  # no cancel object: a plain call that would wait if admitted
        assert (info.value.reason, info.value.retry_after) == ("queue_full", 2)
        # No deadline: this thread never read the clock. No waiter record, no gate place.
        assert clock.calls_from_this_thread() == 0
        assert list(lim._waiters) == records
        assert gate_size(lim) == 8
        assert stats_diff(before, lim.stats()) == {"rejected_full": (0, n)}
    for cancel in cancels:
        cancel.set()
    threads.join_all()
    assert all(isinstance(w.error, Cancelled) for w in waiters)
    for grant in holders:
        grant.release()
    s = lim.stats()
    assert (s.active, s.queued, s.peak_active, s.peak_queued) == (0, 0, 2, 8)
    assert gate_size(lim) == 0
