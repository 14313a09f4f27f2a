"""Strict FIFO in ColdLimiter: a freed slot goes to the oldest waiter, and no newcomer takes a
slot while anybody is queued.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import ColdLimiter
from tests.support.clock import FakeClock
from tests.support.limiter import PausingCancel, start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("capacity", [1, 2])
def test_waiters_are_promoted_in_arrival_order(threads: ThreadRunner, capacity: int) -> None:
    lim = ColdLimiter(active=capacity, queue=8, clock=FakeClock())
    holders = [lim.acquire() for _ in range(capacity)]
    order: list[str] = []
    order_lock = threading.Lock()

    def record(attempt: Any) -> None:
        with order_lock:
            order.append(attempt.name)

    waiters = []
    for i in range(8):
        waiters.append(
            start_acquire(threads, lim, threading.Event(), name=f"w{i}", on_grant=record)
        )
        wait_until(f"w{i} queued", lambda i=i: lim.stats().queued == i + 1)
    assert not any(w.done.is_set() for w in waiters)
    # Free the slots one at a time; each freed slot goes to the oldest waiter.
    to_release = list(holders)
    for i, waiter in enumerate(waiters):
        to_release.pop(0).release()
        waiter.wait_done()
        assert waiter.grant is not None
        with order_lock:
            assert order == [f"w{j}" for j in range(i + 1)]
        assert not any(w.done.is_set() for w in waiters[i + 1 :])
        s = lim.stats()
        assert (s.active, s.queued) == (capacity, 7 - i)
        to_release.append(waiter.grant)
    for grant in to_release:
        grant.release()
    assert lim.stats().active == 0


def test_a_newcomer_never_overtakes_a_waiter_the_slot_was_handed_to(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=8, clock=FakeClock())
    holder = lim.acquire()
    waiter_cancel = PausingCancel()
    waiter = start_acquire(threads, lim, waiter_cancel, name="waiter")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    # Hold the waiter between two wait slices, outside the lock, so it cannot take the slot
    # the holder is about to free before the newcomer arrives.
    waiter_cancel.pause.set()
    assert waiter_cancel.paused.wait(5.0)
    holder.release()
    assert lim.stats().active == 1  # handed over, not freed
    newcomer_cancel = threading.Event()
    newcomer = start_acquire(threads, lim, newcomer_cancel, name="newcomer")
    wait_until(
        "newcomer refused or queued", lambda: newcomer.done.is_set() or lim.stats().queued == 1
    )
    assert not newcomer.done.is_set(), f"newcomer barged: got {newcomer.grant or newcomer.error!r}"
    assert not waiter.done.is_set()
    waiter_cancel.resume.set()
    waiter.wait_done()
    assert waiter.grant is not None
    s = lim.stats()
    assert (s.active, s.queued) == (1, 1)
    assert not newcomer.done.is_set()  # still queued behind
    waiter.release()
    newcomer.wait_done()
    assert newcomer.grant is not None
    newcomer.release()
    assert lim.stats().active == 0


def test_a_newcomer_queues_while_a_waiter_is_queued(threads: ThreadRunner) -> None:
    """The fast path is closed while anyone is admitted and waiting."""
    lim = ColdLimiter(active=1, queue=8, clock=FakeClock())
    holder = lim.acquire()
    first = start_acquire(threads, lim, threading.Event(), name="first")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    holder.release()
    second = start_acquire(threads, lim, threading.Event(), name="second")
    first.wait_done()
    assert first.grant is not None
    wait_until("second refused or queued", lambda: second.done.is_set() or lim.stats().queued == 1)
    assert not second.done.is_set()
    first.release()
    second.wait_done()
    assert second.grant is not None
    second.release()
    assert lim.stats().active == 0
