"""ColdLimiter's grants and figures: a grant is released exactly once whatever the body does,
and ``stats()`` counts every outcome and records the peaks.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from reachlimit import Busy, ColdLimiter
from tests.support.clock import FakeClock
from tests.support.limiter import LIMITER_FIELDS, start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def test_grant_released_when_the_body_raises() -> None:
    lim = ColdLimiter(active=1, queue=0)
    with pytest.raises(KeyError):
        with lim.acquire() as grant:
            assert grant.held
            assert lim.stats().active == 1
            raise KeyError("build failed")
    assert not grant.held
    assert lim.stats().active == 0
    with lim.acquire():  # the slot really is free again
        assert lim.stats().active == 1


def test_release_twice_raises_and_creates_no_capacity() -> None:
    lim = ColdLimiter(active=1, queue=0)
    first = lim.acquire()
    first.release()
    second = lim.acquire()
    with pytest.raises(RuntimeError, match="^grant released twice$"):
        first.release()
    assert lim.stats().active == 1
    with pytest.raises(Busy) as info:  # the bad release did not free second's slot
        lim.acquire()
    assert info.value.reason == "queue_full"
    second.release()
    with pytest.raises(RuntimeError):
        second.release()
    assert lim.stats().active == 0


def test_with_exit_after_explicit_release_is_a_noop() -> None:
    lim = ColdLimiter(active=1, queue=0)
    with lim.acquire() as grant:
        grant.release()
        other = lim.acquire()  # the slot went back and was taken again
    # Leaving the block must not have released ``other``'s slot.
    assert lim.stats().active == 1
    with pytest.raises(Busy):
        lim.acquire()
    other.release()
    assert lim.stats().active == 0


def test_acquired_counts_fast_path_and_promotions(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=2, clock=FakeClock())
    holder = lim.acquire()
    assert lim.stats().acquired == 1
    waiter = start_acquire(threads, lim, threading.Event())
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    assert lim.stats().acquired == 1  # admitted, not yet granted
    holder.release()
    waiter.wait_done()
    assert waiter.grant is not None
    assert lim.stats().acquired == 2
    waiter.release()
    with lim.acquire():
        pass
    assert lim.stats().acquired == 3


def test_peaks_record_the_highest_figures(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=2, queue=3, clock=FakeClock())
    g1, g2 = lim.acquire(), lim.acquire()
    cancels = [threading.Event() for _ in range(3)]
    for i, cancel in enumerate(cancels):
        start_acquire(threads, lim, cancel)
        wait_until(f"{i + 1} queued", lambda i=i: lim.stats().queued == i + 1)
    for cancel in cancels:
        cancel.set()
    threads.join_all()
    g1.release()
    g2.release()
    s = lim.stats()
    assert (s.active, s.queued, s.peak_active, s.peak_queued) == (0, 0, 2, 3)


def test_stats_is_a_frozen_snapshot_with_every_promised_field() -> None:
    lim = ColdLimiter(active=3, queue=4, wait=1.5)
    grant = lim.acquire()
    s = lim.stats()
    grant.release()
    assert s.active == 1 and lim.stats().active == 0  # a snapshot, not a live view
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.active = 0  # type: ignore[misc]
    d = s.as_dict()
    assert LIMITER_FIELDS <= set(d)
    assert d["capacity_active"] == 3 and d["capacity_queue"] == 4 and d["wait"] == 1.5
    assert d["acquired"] == 1 and d["active"] == 1
