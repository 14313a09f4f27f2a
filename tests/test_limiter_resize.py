"""``ColdLimiter.resize``: capacities changed at run time (what the Redis fallback uses to admit
only its process's share of a budget).

design:

    invariants  the key checks of ``tests/support/limiter_checks.py`` and the fairness rules
                of ``tests/support/fairness.py`` run on limiters that were built with other
                figures and resized before use: grown (from ``queue=0``, so the gate is
                built by ``resize``) and shrunk (so the gate's ``maxsize`` is lowered). Each
                place and slot comes back exactly once, as on a limiter built that way.
    growing     promotes the waiters a new slot can serve at once, oldest first, each gate
                place returned; newcomers find the new places.
    shrinking   evicts nobody: running builds go on, queued waiters keep their places; a
                release hands its slot over only once no more slots are held than there
                are; the queue takes newcomers again only below its new size; ``queue=0``
                keeps the waiters already queued and takes none.
    deadline    after a shrink, the walk counts as freeing a slot for a waiter only the
                last ``active`` of the slots held.
    checks      bad figures are refused with construction's messages, and change nothing.

Every limiter runs on a ``FakeClock`` that never passes a deadline: a waiter that is not
promoted waits until the test cancels it, so every outcome is the limiter's decision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Busy, ColdLimiter
from tests.support.clock import FakeClock
from tests.support.deadline import learn, promote
from tests.support.fairness import RULES
from tests.support.limiter import (
    Attempt,
    ProbeCancel,
    assert_exact_capacity,
    check_white_box,
    gate_size,
    start_acquire,
)
from tests.support.limiter_checks import (
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_gate_place_returned_after_timeout,
    check_queue_bound,
    check_slots_come_back,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def grown(active: int = 2, queue: int = 8, *args: Any, **options: Any) -> ColdLimiter:
    """A limiter built with one slot and no queue (no gate), then grown to its figures."""
    lim = ColdLimiter(1, 0, *args, **options)
    lim.resize(active=active, queue=queue)
    return lim


def shrunk(active: int = 2, queue: int = 8, *args: Any, **options: Any) -> ColdLimiter:
    """A limiter built three times as large (plus one), then shrunk to its figures."""
    lim = ColdLimiter(3 * active + 1, 3 * queue + 1, *args, **options)
    lim.resize(active=active, queue=queue)
    return lim


CHECKS = (
    check_queue_bound,
    check_gate_place_returned_after_timeout,
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_slots_come_back,
)


@pytest.mark.parametrize("make", [grown, shrunk], ids=["grown", "shrunk"])
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_a_resized_limiter_keeps_every_key_property(
    threads: ThreadRunner, make: Callable[..., ColdLimiter], check: Callable[..., None]
) -> None:
    check(make, threads)


@pytest.mark.parametrize("make", [grown, shrunk], ids=["grown", "shrunk"])
@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_a_resized_limiter_keeps_every_fairness_rule(
    threads: ThreadRunner, make: Callable[..., ColdLimiter], rule: Callable[..., None]
) -> None:
    rule(threads, lambda active, queue: make(active, queue, 60.0))


def waiting(threads: ThreadRunner, lim: ColdLimiter, name: str) -> tuple[Attempt, threading.Event]:
    """A leader that must end up queued (awaited until the limiter counts it)."""
    before = lim.stats().queued
    cancel = threading.Event()
    attempt = start_acquire(threads, lim, cancel, name=name)
    wait_until(f"{name} queued", lambda: lim.stats().queued == before + 1)
    assert not attempt.done.is_set(), attempt.error
    return attempt, cancel


def refused(lim: ColdLimiter) -> str:
    """The reason a newcomer is refused at once (a newcomer admitted gives up at its first
    look at its cancel object, and the test fails: ``Cancelled``, not ``Busy``)."""
    with pytest.raises(Busy) as info:
        lim.acquire(ProbeCancel())
    return info.value.reason


def assert_all_back(lim: ColdLimiter) -> None:
    """Every slot and every queue place given back: exactly ``capacity_active`` slots can be
    taken (none lost, none double counted) and no gate place is taken."""
    assert_exact_capacity(lim)
    assert gate_size(lim) == 0


def test_growing_promotes_the_oldest_waiters_at_once(threads: ThreadRunner) -> None:
    lim = ColdLimiter(1, 4, clock=FakeClock())
    holder = lim.acquire()
    queued = [waiting(threads, lim, f"w{i}") for i in range(3)]
    lim.resize(active=3)
    for attempt, _ in queued[:2]:
        attempt.wait_done()
        assert attempt.grant is not None, attempt.error
    assert not queued[2][0].done.is_set()
    s = lim.stats()
    assert (s.active, s.queued, s.peak_active, s.capacity_active) == (3, 1, 3, 3)
    assert gate_size(lim) == 1  # the promoted waiters' places came back
    check_white_box(lim)
    lim.resize(queue=6)
    more = [waiting(threads, lim, f"x{i}") for i in range(5)]  # 1 + 5 places of 6
    assert refused(lim) == "queue_full"
    for _, cancel in [queued[2], *more]:
        cancel.set()
    threads.join_all()
    for attempt, _ in queued[:2]:
        attempt.release()
    holder.release()
    assert_all_back(lim)


def test_shrinking_evicts_nobody_and_hands_slots_over_only_below_the_new_size(
    threads: ThreadRunner,
) -> None:
    lim = ColdLimiter(3, 4, clock=FakeClock())
    holders = [lim.acquire() for _ in range(3)]
    (first, first_cancel), (second, second_cancel) = (
        waiting(threads, lim, "first"), waiting(threads, lim, "second"))
    lim.resize(active=1, queue=1)
    s = lim.stats()
    # Nothing taken away: three builds run, two waiters wait (above the new figures).
    assert (s.active, s.queued, s.capacity_active, s.capacity_queue) == (3, 2, 1, 1)
    assert refused(lim) == "queue_full"  # two places taken of one: nobody more
    holders[0].release()  # 3 held of 1: the slot goes back, not to a waiter
    holders[1].release()  # 2 held of 1: the same
    assert (lim.stats().active, lim.stats().queued) == (1, 2)
    assert not first.done.is_set() and not second.done.is_set()
    holders[2].release()  # 1 held of 1: handed over, in turn
    first.wait_done()
    assert first.grant is not None, first.error
    assert (lim.stats().active, lim.stats().queued) == (1, 1)
    assert refused(lim) == "queue_full"  # one place taken of one
    check_white_box(lim)
    first.release()
    second.wait_done()
    assert second.grant is not None, second.error
    newcomer, newcomer_cancel = waiting(threads, lim, "newcomer")  # the one place is free
    assert refused(lim) == "queue_full"
    newcomer_cancel.set()
    first_cancel.set()
    second_cancel.set()
    threads.join_all()
    second.release()
    s = lim.stats()
    assert (s.active, s.queued, s.acquired, s.cancelled, s.rejected_full) == (0, 0, 5, 1, 3)
    assert_all_back(lim)


def test_an_occupied_slot_counts_as_running_and_is_given_back_as_a_grant_is(
    threads: ThreadRunner,
) -> None:
    # occupy(): a build admitted elsewhere (the Redis fallback's shared grants) - taken at
    # once over the capacity, never counted as acquired, released like any slot.
    lim = ColdLimiter(1, 2, clock=FakeClock())
    own = lim.acquire()
    elsewhere = lim.occupy()  # over the capacity: never refused, never waits
    s = lim.stats()
    assert (s.active, s.acquired, s.peak_active, s.queued) == (2, 1, 1, 0)
    waiter, cancel = waiting(threads, lim, "waiter")
    own.release()  # 2 held of 1: back to the pool, not to the waiter
    assert (lim.stats().active, lim.stats().queued) == (1, 1)
    assert not waiter.done.is_set()
    elsewhere.release()  # 1 held of 1: handed over
    waiter.wait_done()
    assert waiter.grant is not None, waiter.error
    with pytest.raises(RuntimeError, match="twice"):
        elsewhere.release()
    waiter.release()
    cancel.set()
    threads.join_all()
    s = lim.stats()
    assert (s.active, s.queued, s.acquired) == (0, 0, 2)
    assert_all_back(lim)


def test_no_queue_keeps_the_waiters_queued_and_takes_none(threads: ThreadRunner) -> None:
    lim = ColdLimiter(1, 2, clock=FakeClock())
    holder = lim.acquire()
    (first, first_cancel), (second, second_cancel) = (
        waiting(threads, lim, "first"), waiting(threads, lim, "second"))
    lim.resize(queue=0)
    assert refused(lim) == "queue_full"
    holder.release()
    first.wait_done()
    assert first.grant is not None, first.error
    assert refused(lim) == "queue_full"  # one still queued, and no place for anybody
    first.release()
    second.wait_done()
    assert second.grant is not None, second.error
    assert gate_size(lim) == 0  # both places came back to the gate that takes no one now
    second.release()
    first_cancel.set()
    second_cancel.set()
    assert_exact_capacity(lim)
    lim.resize(queue=1)  # and back: the same gate takes one again
    holder = lim.acquire()
    again, again_cancel = waiting(threads, lim, "again")
    assert refused(lim) == "queue_full"
    holder.release()
    again.wait_done()
    assert again.grant is not None, again.error
    again.release()
    again_cancel.set()


def test_after_a_shrink_a_waiter_starts_when_the_last_slot_held_frees(
    threads: ThreadRunner,
) -> None:
    """Two timed builds with 0.1 s and 1.0 s left by the estimate (1.0 s), shrunk to one
    slot: the first build's end only brings the count down, so waiters start at 1.0, 2.0,
    3.0 s; with a wait of 2.5 s the third is refused at once. (Counting the first build's
    end as a slot for a waiter would say 0.1, 1.1, 2.1: all three in time.)"""
    clock = FakeClock()
    lim = ColdLimiter(2, 8, 2.5, 1, clock=clock)
    spare = lim.acquire()
    learn(lim, clock, threads, [1.0, 1.0, 1.0, 1.0])
    assert lim.build_estimate == 1.0
    timed = [promote(lim, threads, lim.acquire())]
    clock.advance(0.9)
    timed.append(promote(lim, threads, spare))  # its 1.0 s from now; the other's 0.1
    lim.resize(active=1)
    queued = [waiting(threads, lim, f"w{i}") for i in range(2)]
    assert refused(lim) == "deadline"
    assert lim.stats().deadline == 1
    for _, cancel in queued:
        cancel.set()
    threads.join_all()
    for grant in timed:
        grant.release()
    assert_exact_capacity(lim)


@pytest.mark.parametrize(
    ("figures", "message"),
    [
        ({"active": 0}, "active >= 1"),
        ({"active": True}, "active >= 1"),
        ({"active": 1.5}, "active >= 1"),
        ({"queue": -1}, "queue >= 0"),
        ({"queue": "8"}, "queue >= 0"),
        ({"active": 3, "queue": -1}, "queue >= 0"),
    ],
)
def test_bad_figures_are_refused_and_change_nothing(
    figures: dict[str, Any], message: str
) -> None:
    lim = ColdLimiter(2, 8)
    with pytest.raises(ValueError, match=f"^{message}$"):
        lim.resize(**figures)
    s = lim.stats()
    assert (s.capacity_active, s.capacity_queue) == (2, 8)
    assert_exact_capacity(lim)
