"""Tests of ColdLimiter (SPEC §2; acceptance scenarios 1–4, 8 and 11 at library level).

The key properties are written once, as plain ``check_*`` functions taking a limiter factory
and the ``kit`` of helpers; the normal tests run them against ``ColdLimiter`` and the mutant
tests (scenario 8) run them against monkeypatched limiters and show that they fail.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import random
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, Grant, LimiterStats, ReachLimitError
from reachlimit import _limiter as _limiter_module
from tests.helpers import LIMITER_FIELDS as SPEC_STATS_FIELDS

pytestmark = pytest.mark.timeout(30)

MakeLimiter = Callable[..., ColdLimiter]


# -- small helpers ----------------------------------------------------------------------------


def gate_size(lim: ColdLimiter) -> int:
    """Gate places taken. Read under the limiter's lock, where the library touches the gate."""
    assert lim._gate is not None
    with lim._lock:
        return lim._gate.qsize()


def try_acquire_now(lim: ColdLimiter, kit: Any) -> Grant | None:
    """A grant if a slot is free right now, else None. Never blocks (see ProbeCancel)."""
    try:
        return lim.acquire(kit.ProbeCancel())
    except (Busy, Cancelled):
        return None


def assert_exact_capacity(lim: ColdLimiter, kit: Any) -> None:
    """With nobody else around: exactly ``capacity_active`` slots can be taken at once, no
    fewer (a slot lost) and no more (a slot double counted); then they are given back."""
    grants = [try_acquire_now(lim, kit) for _ in range(lim.capacity_active)]
    taken = [g for g in grants if g is not None]
    assert len(taken) == lim.capacity_active, (
        f"slot lost: only {len(taken)} of {lim.capacity_active} slots could be taken"
    )
    extra = try_acquire_now(lim, kit)
    if extra is not None:
        extra.release()
    assert extra is None, "slot double counted: one more grant than capacity_active"
    for grant in taken:
        grant.release()
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)


def stats_diff(before: LimiterStats, after: LimiterStats) -> dict[str, tuple[Any, Any]]:
    b, a = before.as_dict(), after.as_dict()
    return {k: (b[k], a[k]) for k in b if b[k] != a[k]}


# -- the key checks (used by the normal tests and by the mutant tests) -------------------------


def check_queue_bound(make_limiter: MakeLimiter, kit: Any) -> None:
    """2 active grants + 8 admitted waiters: the 11th caller is refused at once with
    ``queue_full``, and never more than 8 callers are admitted."""
    lim = make_limiter(active=2, queue=8, clock=kit.Clock())
    holders = [lim.acquire(), lim.acquire()]
    cancels: list[threading.Event] = []
    try:
        for i in range(8):
            cancel = threading.Event()
            cancels.append(cancel)
            kit.start_acquire(lim, cancel, name=f"waiter-{i}")
            kit.wait_until(lambda i=i: lim.stats().queued == i + 1, message=f"waiter {i} queued")
        probe = kit.ProbeCancel()  # cannot block, even in a limiter that admits it
        try:
            grant = lim.acquire(probe)
        except (Busy, Cancelled) as exc:
            outcome: Any = exc
        else:
            grant.release()
            outcome = grant
        s = lim.stats()
        assert s.peak_queued <= 8 and s.queued <= 8, (
            f"queue bound broken: {s.peak_queued} callers admitted with queue=8"
        )
        assert isinstance(outcome, Busy) and outcome.reason == "queue_full", (
            f"queue bound broken: the 11th caller got {outcome!r}, not Busy(queue_full)"
        )
        assert probe.calls == 1, "the refusal looked at the cancel object again"
    finally:
        for cancel in cancels:
            cancel.set()
        kit.threads.join_all()
        for grant in holders:
            grant.release()


def check_gate_place_returned_after_timeout(make_limiter: MakeLimiter, kit: Any) -> None:
    """queue=1: a waiter that times out gives its gate place back; the next caller is admitted
    (and times out too, rather than being refused with ``queue_full``)."""
    # Each clock read moves 10 s on: the first read fixes the deadline, the next is past it.
    lim = make_limiter(active=1, queue=1, wait=1.0, clock=kit.Clock(step=10.0))
    holder = lim.acquire()
    try:
        for attempt in range(3):
            with pytest.raises(Busy) as info:
                lim.acquire()
            assert info.value.reason == "timeout", (
                f"gate place not returned after timeout: attempt {attempt} got "
                f"{info.value.reason!r} instead of being admitted"
            )
            assert gate_size(lim) == 0, "gate place not returned after timeout (qsize != 0)"
            assert lim.stats().queued == 0
        assert lim.stats().rejected_timeout == 3
    finally:
        holder.release()


def check_gate_place_returned_after_cancel(make_limiter: MakeLimiter, kit: Any) -> None:
    """queue=1: a waiter cancelled while it waits gives its gate place back; the next caller
    is admitted and really waits."""
    lim = make_limiter(active=1, queue=1, clock=kit.Clock())
    holder = lim.acquire()
    cancels: list[threading.Event] = []
    try:
        for attempt in range(3):
            cancel = threading.Event()
            cancels.append(cancel)
            waiter = kit.start_acquire(lim, cancel, name=f"waiter-{attempt}")
            kit.wait_until(lambda waiter=waiter: waiter.done.is_set() or lim.stats().queued == 1)
            assert not waiter.done.is_set(), (
                f"gate place not returned after cancel: attempt {attempt} got {waiter.error!r}"
                " instead of being admitted"
            )
            cancel.set()
            waiter.wait_done()
            assert isinstance(waiter.error, Cancelled)
            assert gate_size(lim) == 0, "gate place not returned after cancel (qsize != 0)"
            assert lim.stats().queued == 0
        assert lim.stats().cancelled == 3
    finally:
        for cancel in cancels:
            cancel.set()
        kit.threads.join_all()
        holder.release()


def check_gate_place_returned_after_promotion(make_limiter: MakeLimiter, kit: Any) -> None:
    """queue=1: a promoted waiter's gate place is given back at promotion; while it holds the
    slot, the next caller is admitted and really waits."""
    lim = make_limiter(active=1, queue=1, clock=kit.Clock())
    holder: Grant | None = lim.acquire()
    cancels: list[threading.Event] = []
    try:
        for attempt in range(3):
            cancel = threading.Event()
            cancels.append(cancel)
            waiter = kit.start_acquire(lim, cancel, name=f"waiter-{attempt}")
            kit.wait_until(lambda waiter=waiter: waiter.done.is_set() or lim.stats().queued == 1)
            assert not waiter.done.is_set(), (
                f"gate place not returned after promotion: attempt {attempt} got "
                f"{waiter.error!r} instead of being admitted"
            )
            assert holder is not None
            holder.release()
            holder = None
            waiter.wait_done()
            assert waiter.grant is not None, f"not promoted: {waiter.error!r}"
            holder = waiter.grant
            assert gate_size(lim) == 0, "gate place not returned after promotion (qsize != 0)"
            s = lim.stats()
            assert (s.active, s.queued) == (1, 0)
    finally:
        for cancel in cancels:
            cancel.set()
        kit.threads.join_all()
        if holder is not None:
            holder.release()


# -- argument validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active": 0}, "active >= 1"),
        ({"active": -1}, "active >= 1"),
        ({"active": True}, "active >= 1"),
        ({"active": 1.5}, "active >= 1"),
        ({"active": "2"}, "active >= 1"),
        ({"queue": -1}, "queue >= 0"),
        ({"queue": True}, "queue >= 0"),
        ({"queue": 2.0}, "queue >= 0"),
        ({"wait": 0}, "wait > 0"),
        ({"wait": -0.5}, "wait > 0"),
        ({"wait": float("nan")}, "wait > 0"),
        ({"wait": float("inf")}, "wait > 0"),
        ({"wait": True}, "wait > 0"),
        ({"wait": "3"}, "wait > 0"),
        ({"retry_after": 0}, "retry_after >= 1"),
        ({"retry_after": -2}, "retry_after >= 1"),
        ({"retry_after": 1.5}, "retry_after >= 1"),
        ({"retry_after": True}, "retry_after >= 1"),
    ],
)
def test_invalid_arguments_raise_value_error_with_exact_message(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        ColdLimiter(**kwargs)
    assert str(info.value) == message


def test_defaults_and_valid_edges() -> None:
    lim = ColdLimiter()
    s = lim.stats()
    assert (s.capacity_active, s.capacity_queue, s.wait) == (2, 8, 3.0)
    assert lim.retry_after == 2
    assert (lim.capacity_active, lim.capacity_queue, lim.wait) == (2, 8, 3.0)
    edge = ColdLimiter(active=1, queue=0, wait=0.001, retry_after=1)
    assert (edge.capacity_active, edge.capacity_queue, edge.retry_after) == (1, 0, 1)
    assert isinstance(ColdLimiter(wait=2).wait, float)
    assert "active=0/2" in repr(lim) and "queued=0/8" in repr(lim)


def test_cancel_poll_interval_is_at_most_50ms() -> None:
    assert 0 < ColdLimiter.CANCEL_POLL_INTERVAL <= 0.05


# -- exceptions -------------------------------------------------------------------------------


def test_busy_and_cancelled_share_the_package_base() -> None:
    assert issubclass(Busy, ReachLimitError) and issubclass(Cancelled, ReachLimitError)
    assert issubclass(ReachLimitError, Exception)
    busy = Busy("queue_full", 2)
    assert (busy.reason, busy.retry_after) == ("queue_full", 2)
    assert (Busy.QUEUE_FULL, Busy.TIMEOUT) == ("queue_full", "timeout")
    assert "queue_full" in str(busy) and "2" in str(busy)
    assert str(Cancelled())


def test_busy_carries_the_limiters_retry_after(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=0, retry_after=7)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
    assert (info.value.reason, info.value.retry_after) == ("queue_full", 7)
    lim = ColdLimiter(active=1, queue=1, wait=1.0, retry_after=5, clock=kit.Clock(step=10.0))
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
    assert (info.value.reason, info.value.retry_after) == ("timeout", 5)


# -- fast path, grants, stats -----------------------------------------------------------------


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
    with pytest.raises(RuntimeError):
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


def test_acquired_counts_fast_path_and_promotions(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=2, clock=kit.Clock())
    holder = lim.acquire()
    assert lim.stats().acquired == 1
    waiter = kit.start_acquire(lim, threading.Event())
    kit.wait_until(lambda: lim.stats().queued == 1)
    assert lim.stats().acquired == 1  # admitted, not yet granted
    holder.release()
    waiter.wait_done()
    assert waiter.grant is not None
    assert lim.stats().acquired == 2
    waiter.release()
    with lim.acquire():
        pass
    assert lim.stats().acquired == 3


def test_peaks_record_the_highest_figures(kit: Any) -> None:
    lim = ColdLimiter(active=2, queue=3, clock=kit.Clock())
    g1, g2 = lim.acquire(), lim.acquire()
    cancels = [threading.Event() for _ in range(3)]
    for i, cancel in enumerate(cancels):
        kit.start_acquire(lim, cancel)
        kit.wait_until(lambda i=i: lim.stats().queued == i + 1)
    for cancel in cancels:
        cancel.set()
    kit.threads.join_all()
    g1.release()
    g2.release()
    s = lim.stats()
    assert (s.active, s.queued, s.peak_active, s.peak_queued) == (0, 0, 2, 3)


def test_stats_is_a_frozen_snapshot_with_the_spec_fields() -> None:
    lim = ColdLimiter(active=3, queue=4, wait=1.5)
    grant = lim.acquire()
    s = lim.stats()
    grant.release()
    assert s.active == 1 and lim.stats().active == 0  # a snapshot, not a live view
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.active = 0  # type: ignore[misc]
    d = s.as_dict()
    assert SPEC_STATS_FIELDS <= set(d)
    assert d["capacity_active"] == 3 and d["capacity_queue"] == 4 and d["wait"] == 1.5
    assert d["acquired"] == 1 and d["active"] == 1


# -- queue=0 ----------------------------------------------------------------------------------


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


# -- cancellation -----------------------------------------------------------------------------


def test_cancel_already_set_raises_cancelled_and_changes_nothing(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=kit.Clock())
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


def test_cancel_while_waiting_raises_cancelled_and_returns_the_place(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=kit.Clock())
    holder = lim.acquire()
    cancel = threading.Event()
    waiter = kit.start_acquire(lim, cancel)
    kit.wait_until(lambda: lim.stats().queued == 1)
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


def test_scenario2_gate_place_reusable_after_promotion(kit: Any) -> None:
    check_gate_place_returned_after_promotion(ColdLimiter, kit)


def test_scenario2_gate_place_reusable_after_timeout(kit: Any) -> None:
    check_gate_place_returned_after_timeout(ColdLimiter, kit)


def test_scenario2_gate_place_reusable_after_cancel(kit: Any) -> None:
    check_gate_place_returned_after_cancel(ColdLimiter, kit)


# -- timeouts ---------------------------------------------------------------------------------


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


def test_timeout_when_the_clock_passes_the_deadline_while_waiting(kit: Any) -> None:
    clock = kit.Clock()
    lim = ColdLimiter(active=1, queue=2, wait=3.0, clock=clock)
    holder = lim.acquire()
    cancel = threading.Event()  # never set: it only makes the wait run in short slices
    waiter = kit.start_acquire(lim, cancel)
    kit.wait_until(lambda: lim.stats().queued == 1)
    kit.wait_until(lambda: clock.calls >= 2, message="deadline fixed")
    assert not waiter.done.is_set()
    clock.advance(2.9)
    clock.advance(0.2)  # now past the deadline
    waiter.wait_done()
    assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout"
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout, s.cancelled) == (1, 0, 1, 0)
    holder.release()
    assert lim.stats().active == 0


def test_huge_finite_wait_is_refused_at_construction_or_honoured(kit: Any) -> None:
    """A ``wait`` beyond ``threading.TIMEOUT_MAX`` must not turn every queued request into
    an ``OverflowError``: either the constructor refuses it, or a waiter really waits."""
    huge = threading.TIMEOUT_MAX * 2
    try:
        lim = ColdLimiter(active=1, queue=1, wait=huge)
    except ValueError as exc:
        assert str(exc) == "wait > 0"
        return
    holder = lim.acquire()
    waiter = kit.start_acquire(lim)  # no cancel object: one timed wait

    # Wait until the waiter is inside Condition.wait (white box: the Condition's own waiter
    # list), so that the release below cannot reach it before it waits.
    def inside_condition_wait() -> bool:
        with lim._lock:  # the Condition's lock: its waiter list is stable while we hold it
            return any(w.cond._waiters for w in lim._waiters)  # type: ignore[attr-defined]

    kit.wait_until(lambda: waiter.done.is_set() or inside_condition_wait())
    holder.release()
    waiter.wait_done()
    assert waiter.error is None, f"queued waiter failed with {waiter.error!r}"
    assert waiter.grant is not None
    waiter.release()
    assert lim.stats().active == 0


# -- errors escaping the wait -----------------------------------------------------------------


class ExplodingCancel:
    """Reads "not set" until ``armed``; then ``is_set()`` raises."""

    def __init__(self) -> None:
        self.armed = threading.Event()

    def is_set(self) -> bool:
        if self.armed.is_set():
            raise RuntimeError("cancel object broke")
        return False


def test_exception_from_cancel_is_set_while_queued_leaks_no_place(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=1, clock=kit.Clock())
    holder = lim.acquire()
    cancel = ExplodingCancel()
    waiter = kit.start_acquire(lim, cancel)
    kit.wait_until(lambda: lim.stats().queued == 1)
    cancel.armed.set()
    waiter.wait_done()
    assert isinstance(waiter.error, RuntimeError)
    s = lim.stats()
    assert (s.active, s.queued, s.cancelled, s.rejected_timeout) == (1, 0, 0, 0)
    assert gate_size(lim) == 0
    # The place is really usable again.
    again = threading.Event()
    second = kit.start_acquire(lim, again)
    kit.wait_until(lambda: second.done.is_set() or lim.stats().queued == 1)
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
def test_exception_from_the_clock_while_queued_leaks_no_place(kit: Any, fail_from: int) -> None:
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
    assert_exact_capacity(lim, kit)


class PausingCancel:
    """Reads "not set"; once ``pause`` is set, the next ``is_set()`` call blocks (``paused``
    is set) until ``resume``; it then returns ``result`` or raises ``error``."""

    def __init__(self) -> None:
        self.pause = threading.Event()
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.result = False
        self.error: BaseException | None = None

    def is_set(self) -> bool:
        if self.pause.is_set() and not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(5.0), "PausingCancel never resumed"
            if self.error is not None:
                raise self.error
            return self.result
        return False


def test_exception_after_promotion_passes_the_slot_on(kit: Any) -> None:
    """The waiter is promoted, then raises before it can take its grant: the slot goes to the
    next waiter, never lost."""
    lim = ColdLimiter(active=1, queue=2, clock=kit.Clock())
    holder = lim.acquire()
    first_cancel = PausingCancel()
    first = kit.start_acquire(lim, first_cancel, name="first")
    kit.wait_until(lambda: lim.stats().queued == 1)
    second = kit.start_acquire(lim, threading.Event(), name="second")
    kit.wait_until(lambda: lim.stats().queued == 2)
    first_cancel.pause.set()
    assert first_cancel.paused.wait(5.0)  # first is between two slices, outside the lock
    holder.release()  # hands the slot to first, which cannot see it yet
    s = lim.stats()
    assert (s.active, s.queued) == (1, 1)
    first_cancel.error = RuntimeError("client handler broke")
    first_cancel.resume.set()
    first.wait_done()
    assert isinstance(first.error, RuntimeError)
    second.wait_done()
    assert second.grant is not None, f"the slot was dropped: {second.error!r}"
    s = lim.stats()
    assert (s.active, s.queued) == (1, 0)
    second.release()
    assert_exact_capacity(lim, kit)


# -- scenario 1 -------------------------------------------------------------------------------


def test_scenario1_queue_bound(kit: Any) -> None:
    check_queue_bound(ColdLimiter, kit)


def test_scenario1_eleventh_leader_refused_at_once_without_any_waiting_state(kit: Any) -> None:
    clock = kit.Clock()
    lim = ColdLimiter(active=2, queue=8, clock=clock)
    holders = [lim.acquire(), lim.acquire()]
    assert clock.calls == 0
    cancels = [threading.Event() for _ in range(8)]
    waiters = []
    for i, cancel in enumerate(cancels):
        waiters.append(kit.start_acquire(lim, cancel, name=f"waiter-{i}"))
        kit.wait_until(lambda i=i: lim.stats().queued == i + 1)
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
    kit.threads.join_all()
    assert all(isinstance(w.error, Cancelled) for w in waiters)
    for grant in holders:
        grant.release()
    s = lim.stats()
    assert (s.active, s.queued, s.peak_active, s.peak_queued) == (0, 0, 2, 8)
    assert gate_size(lim) == 0


# -- scenario 3 -------------------------------------------------------------------------------

RACE_ROUNDS = 64
RACE_SEED = int(os.environ.get("REACHLIMIT_SEED", "20240611"))


def jitter(yields: int) -> None:
    """Shift one side of a race by a few scheduler turns. It only varies the interleaving;
    every outcome it can produce is one the test accepts."""
    for _ in range(yields):
        time.sleep(0)


def race_jitter(rng: random.Random) -> int:
    return rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21])


def test_scenario3_cancel_racing_promotion(kit: Any) -> None:
    rng = random.Random(RACE_SEED)
    lim = ColdLimiter(active=2, queue=8, clock=kit.Clock())
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # the waiter wakes often: more interleavings
    outcomes: Counter[str] = Counter()
    for round_no in range(RACE_ROUNDS):
        releasing, staying = lim.acquire(), lim.acquire()
        cancel = threading.Event()
        waiter = kit.start_acquire(lim, cancel, name=f"waiter-{round_no}")
        kit.wait_until(lambda: lim.stats().queued == 1)
        barrier = threading.Barrier(2, timeout=5.0)
        release_delay, cancel_delay = race_jitter(rng), race_jitter(rng)

        def release_at_barrier(
            grant: Grant = releasing, b: threading.Barrier = barrier, delay: int = release_delay
        ) -> None:
            b.wait()
            jitter(delay)
            grant.release()

        kit.threads.start(release_at_barrier, name=f"releaser-{round_no}")
        barrier.wait()
        jitter(cancel_delay)
        cancel.set()
        waiter.wait_done()
        if waiter.grant is not None:
            outcomes["promoted"] += 1
            assert lim.stats().active == 2
            waiter.release()
        else:
            assert isinstance(waiter.error, Cancelled), repr(waiter.error)
            outcomes["cancelled"] += 1
        staying.release()
        kit.threads.join_all()
        s = lim.stats()
        assert (s.active, s.queued) == (0, 0), f"round {round_no}: {s}"
        assert gate_size(lim) == 0
        assert_exact_capacity(lim, kit)
    assert sum(outcomes.values()) == RACE_ROUNDS
    s = lim.stats()
    assert s.peak_active == 2
    # 2 fast-path grants + 2 capacity probes per round, plus every promotion.
    assert s.acquired == 4 * RACE_ROUNDS + outcomes["promoted"]


def test_scenario3_timeout_racing_promotion(kit: Any) -> None:
    rng = random.Random(RACE_SEED + 1)
    clock = kit.Clock()
    lim = ColdLimiter(active=1, queue=8, wait=1.0, clock=clock)
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # the waiter re-reads the clock often
    outcomes: Counter[str] = Counter()
    for round_no in range(RACE_ROUNDS):
        holder = lim.acquire()
        reads = clock.calls
        waiter = kit.start_acquire(lim, threading.Event(), name=f"waiter-{round_no}")
        kit.wait_until(lambda reads=reads: lim.stats().queued == 1 and clock.calls >= reads + 1)
        barrier = threading.Barrier(2, timeout=5.0)
        release_delay, expire_delay = race_jitter(rng), race_jitter(rng)

        def release_at_barrier(
            grant: Grant = holder, b: threading.Barrier = barrier, delay: int = release_delay
        ) -> None:
            b.wait()
            jitter(delay)
            grant.release()

        kit.threads.start(release_at_barrier, name=f"releaser-{round_no}")
        barrier.wait()
        jitter(expire_delay)
        clock.advance(2.0)  # past the deadline
        waiter.wait_done()
        if waiter.grant is not None:
            outcomes["promoted"] += 1
            waiter.release()
        else:
            assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout"
            outcomes["timeout"] += 1
        kit.threads.join_all()
        s = lim.stats()
        assert (s.active, s.queued) == (0, 0), f"round {round_no}: {s}"
        assert gate_size(lim) == 0
        assert_exact_capacity(lim, kit)
    assert sum(outcomes.values()) == RACE_ROUNDS
    assert lim.stats().rejected_timeout == outcomes["timeout"]


# The same instant, made deterministic: the waiter is held between two wait slices, outside
# the lock, while the hand-off happens; then it sees its cancel (or its deadline) as well.


@pytest.mark.parametrize("next_waiter", [False, True], ids=["slot-freed", "slot-passed-on"])
def test_cancel_seen_together_with_a_hand_off_passes_the_slot_on(
    kit: Any, next_waiter: bool
) -> None:
    lim = ColdLimiter(active=1, queue=2, clock=kit.Clock())
    holder = lim.acquire()
    cancel = PausingCancel()
    first = kit.start_acquire(lim, cancel, name="first")
    kit.wait_until(lambda: lim.stats().queued == 1)
    second = None
    if next_waiter:
        second = kit.start_acquire(lim, threading.Event(), name="second")
        kit.wait_until(lambda: lim.stats().queued == 2)
    cancel.pause.set()
    assert cancel.paused.wait(5.0)
    holder.release()  # hands the slot to ``first``
    cancel.result = True  # ... whose client leaves at that very instant
    cancel.resume.set()
    first.wait_done()
    outcome = first.grant if first.grant is not None else first.error
    if first.grant is not None:  # allowed: the hand-off won
        first.release()
    else:
        assert isinstance(outcome, Cancelled), repr(outcome)
    if second is not None:
        second.wait_done()
        assert second.grant is not None, f"the slot was dropped: {second.error!r}"
        second.release()
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)
    assert gate_size(lim) == 0
    assert_exact_capacity(lim, kit)


def test_deadline_seen_together_with_a_hand_off_loses_no_slot(kit: Any) -> None:
    clock = kit.Clock()
    lim = ColdLimiter(active=1, queue=2, wait=1.0, clock=clock)
    holder = lim.acquire()
    cancel = PausingCancel()
    first = kit.start_acquire(lim, cancel, name="first")
    kit.wait_until(lambda: lim.stats().queued == 1)
    second = kit.start_acquire(lim, threading.Event(), name="second")
    kit.wait_until(lambda: lim.stats().queued == 2)
    cancel.pause.set()
    assert cancel.paused.wait(5.0)
    holder.release()  # hands the slot to ``first``
    clock.advance(5.0)  # ... and both waiters' deadlines pass at that very instant
    cancel.resume.set()
    first.wait_done()
    second.wait_done()
    # Either the hand-off or the timeout may win for ``first``; ``second`` may time out too.
    # What matters: the slot is held by exactly whoever got a grant, or is free.
    grants = [w.grant for w in (first, second) if w.grant is not None]
    for w in (first, second):
        if w.grant is None:
            assert isinstance(w.error, Busy) and w.error.reason == "timeout", repr(w.error)
    assert len(grants) <= 1
    assert lim.stats().active == len(grants)
    for grant in grants:
        grant.release()
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)
    assert gate_size(lim) == 0
    assert_exact_capacity(lim, kit)


# -- scenario 4 -------------------------------------------------------------------------------


class TimedCancel:
    """Becomes set at a given real time. Remembers what its first read (the "already
    cancelled?" check) said, so the test knows which ``Cancelled`` the counter must show."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.first: bool | None = None

    def is_set(self) -> bool:
        value = time.monotonic() >= self.at
        if self.first is None:
            self.first = value
        return value


@pytest.mark.stress
def test_scenario4_randomized_run_never_exceeds_the_bounds(kit: Any) -> None:
    seed = int(os.environ.get("REACHLIMIT_SEED", "20240611"))
    long_form = os.environ.get("REACHLIMIT_STRESS") == "long"
    workers, ops = 16, (400 if long_form else 40)
    lim = ColdLimiter(active=2, queue=8, wait=0.02)
    start = threading.Barrier(workers + 1, timeout=5.0)
    stop = threading.Event()
    violations: list[str] = []
    samples = [0]
    tallies: list[Counter[str]] = [Counter() for _ in range(workers)]

    def sampler() -> None:
        while not stop.is_set():
            s = lim.stats()
            if not (0 <= s.active <= 2 and 0 <= s.queued <= 8):
                violations.append(f"out of bounds: {s}")
            with lim._lock:
                assert lim._gate is not None
                if lim._gate.qsize() != len(lim._waiters):
                    violations.append(
                        f"gate places {lim._gate.qsize()} != waiters {len(lim._waiters)}"
                    )
            samples[0] += 1

    def worker(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        tally = tallies[index]
        start.wait()
        for _ in range(ops):
            kind = rng.choice(["plain", "plain", "cancel", "cancel", "preset"])
            cancel: Any = None
            if kind == "cancel":
                cancel = TimedCancel(time.monotonic() + rng.uniform(0.0, 0.03))
            elif kind == "preset":
                cancel = threading.Event()
                cancel.set()
            try:
                grant = lim.acquire(cancel)
            except Busy as exc:
                tally[exc.reason] += 1
                continue
            except Cancelled:
                if isinstance(cancel, TimedCancel) and cancel.first is False:
                    tally["cancelled_waiting"] += 1
                else:
                    tally["cancelled_at_once"] += 1
                continue
            tally["granted"] += 1
            hold = rng.choice([0.0, 0.0, 0.001, 0.003])  # the "build"; not a synchronisation
            style = rng.randrange(3)
            if style == 0:
                time.sleep(hold)
                grant.release()
            elif style == 1:
                with grant:
                    time.sleep(hold)
            else:
                try:
                    with grant:
                        time.sleep(hold)
                        raise ValueError("build failed")
                except ValueError:
                    pass

    kit.threads.start(sampler)
    worker_threads = [kit.threads.start(worker, i, name=f"worker-{i}") for i in range(workers)]
    start.wait()
    deadline = time.monotonic() + 25.0
    for thread in worker_threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    assert not any(t.is_alive() for t in worker_threads), "workers did not finish"
    kit.threads.join_all()
    total: Counter[str] = sum(tallies, Counter())
    assert not violations, violations[:5]
    assert samples[0] > 0
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)
    assert s.peak_active <= 2 and s.peak_queued <= 8
    assert sum(total.values()) == workers * ops
    assert s.acquired == total["granted"]
    assert s.rejected_full == total["queue_full"]
    assert s.rejected_timeout == total["timeout"]
    assert s.cancelled == total["cancelled_waiting"]
    assert total["granted"] > 0 and total["queue_full"] + total["timeout"] > 0
    assert gate_size(lim) == 0
    assert_exact_capacity(lim, kit)


# -- scenario 11 ------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 2])
def test_scenario11_waiters_promoted_in_arrival_order(kit: Any, capacity: int) -> None:
    lim = ColdLimiter(active=capacity, queue=8, clock=kit.Clock())
    holders = [lim.acquire() for _ in range(capacity)]
    order: list[str] = []
    order_lock = threading.Lock()

    def record(attempt: Any) -> None:
        with order_lock:
            order.append(attempt.name)

    waiters = []
    for i in range(8):
        waiters.append(kit.start_acquire(lim, threading.Event(), name=f"w{i}", on_grant=record))
        kit.wait_until(lambda i=i: lim.stats().queued == i + 1, message=f"w{i} queued")
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


def test_scenario11_no_barging_newcomer_queues_behind_a_promoted_waiter(kit: Any) -> None:
    lim = ColdLimiter(active=1, queue=8, clock=kit.Clock())
    holder = lim.acquire()
    waiter_cancel = PausingCancel()
    waiter = kit.start_acquire(lim, waiter_cancel, name="waiter")
    kit.wait_until(lambda: lim.stats().queued == 1)
    # Hold the waiter between two wait slices, outside the lock, so it cannot take the slot
    # the holder is about to free before the newcomer arrives.
    waiter_cancel.pause.set()
    assert waiter_cancel.paused.wait(5.0)
    holder.release()
    assert lim.stats().active == 1  # handed over, not freed
    newcomer_cancel = threading.Event()
    newcomer = kit.start_acquire(lim, newcomer_cancel, name="newcomer")
    kit.wait_until(lambda: newcomer.done.is_set() or lim.stats().queued == 1)
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


def test_scenario11_newcomer_waits_while_a_waiter_is_queued(kit: Any) -> None:
    """The fast path is closed while anyone is admitted and waiting."""
    lim = ColdLimiter(active=1, queue=8, clock=kit.Clock())
    holder = lim.acquire()
    first = kit.start_acquire(lim, threading.Event(), name="first")
    kit.wait_until(lambda: lim.stats().queued == 1)
    holder.release()
    second = kit.start_acquire(lim, threading.Event(), name="second")
    first.wait_done()
    assert first.grant is not None
    kit.wait_until(lambda: second.done.is_set() or lim.stats().queued == 1)
    assert not second.done.is_set()
    first.release()
    second.wait_done()
    assert second.grant is not None
    second.release()
    assert lim.stats().active == 0


# -- scenario 8: mutants ----------------------------------------------------------------------


def test_scenario8_checks_pass_on_the_real_limiter(kit: Any) -> None:
    check_queue_bound(ColdLimiter, kit)
    check_gate_place_returned_after_timeout(ColdLimiter, kit)
    check_gate_place_returned_after_cancel(ColdLimiter, kit)
    check_gate_place_returned_after_promotion(ColdLimiter, kit)


class _GatelessQueue(queue.Queue):  # type: ignore[type-arg]
    """What the mutant builds for its gate: a queue that ignores ``maxsize``, so that no
    caller is ever refused. (``queue.Queue(maxsize=0)`` is unbounded.)"""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(0)


def test_scenario8_mutant_without_gate_fails(monkeypatch: pytest.MonkeyPatch, kit: Any) -> None:
    # The limiter module's view of the ``queue`` module, with Queue swapped for a gate that
    # admits everyone: the limiter code itself is unchanged, it just has no bound any more.
    gateless = types.SimpleNamespace(Queue=_GatelessQueue, Full=queue.Full, Empty=queue.Empty)
    monkeypatch.setattr(_limiter_module, "_queue", gateless)
    with pytest.raises(AssertionError, match="queue bound broken"):
        check_queue_bound(ColdLimiter, kit)


def _leave_queue_keeping_the_place(self: ColdLimiter, waiter: Any) -> None:
    self._waiters.remove(waiter)  # mutant: forgets self._return_gate_place()


def _hand_off_keeping_the_place(self: ColdLimiter) -> None:
    if self._waiters:
        waiter = self._waiters.popleft()  # mutant: forgets self._return_gate_place()
        waiter.granted = True
        waiter.cond.notify()
    else:
        self._active -= 1


def test_scenario8_mutant_leave_queue_without_returning_place_fails(
    monkeypatch: pytest.MonkeyPatch, kit: Any
) -> None:
    monkeypatch.setattr(ColdLimiter, "_leave_queue", _leave_queue_keeping_the_place)
    with pytest.raises(AssertionError, match="gate place not returned after timeout"):
        check_gate_place_returned_after_timeout(ColdLimiter, kit)
    with pytest.raises(AssertionError, match="gate place not returned after cancel"):
        check_gate_place_returned_after_cancel(ColdLimiter, kit)
    # The mutant is caught for the right reason: the promotion path is intact.
    check_gate_place_returned_after_promotion(ColdLimiter, kit)


def test_scenario8_mutant_hand_off_without_returning_place_fails(
    monkeypatch: pytest.MonkeyPatch, kit: Any
) -> None:
    monkeypatch.setattr(ColdLimiter, "_hand_off_or_free", _hand_off_keeping_the_place)
    with pytest.raises(AssertionError, match="gate place not returned after promotion"):
        check_gate_place_returned_after_promotion(ColdLimiter, kit)
    # The timeout and cancel paths are intact, so those checks still pass.
    check_gate_place_returned_after_timeout(ColdLimiter, kit)
    check_gate_place_returned_after_cancel(ColdLimiter, kit)
