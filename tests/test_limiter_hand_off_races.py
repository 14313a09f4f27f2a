"""A slot handed to a waiter at the very moment its wait ends otherwise (a cancel, its
deadline, an error): whichever side wins, exactly one does, and the slot is never lost.

The first tests pin the instant (the waiter is held between two wait slices, outside the
lock, while the hand-off happens); the last two let release and cancel or timeout run free
from a Barrier, many rounds with a seeded jitter.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, Grant
from tests.support.clock import FakeClock
from tests.support.limiter import (
    PausingCancel,
    assert_exact_capacity,
    gate_size,
    start_acquire,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def test_exception_after_promotion_passes_the_slot_on(threads: ThreadRunner) -> None:
    """The waiter is promoted, then raises before it can take its grant: the slot goes to the
    next waiter, never lost."""
    lim = ColdLimiter(active=1, queue=2, clock=FakeClock())
    holder = lim.acquire()
    first_cancel = PausingCancel()
    first = start_acquire(threads, lim, first_cancel, name="first")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    second = start_acquire(threads, lim, threading.Event(), name="second")
    wait_until("2 queued", lambda: lim.stats().queued == 2)
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
    assert_exact_capacity(lim)


# The same instant, made deterministic: the waiter is held between two wait slices, outside
# the lock, while the hand-off happens; then it sees its cancel (or its deadline) as well.
@pytest.mark.parametrize("next_waiter", [False, True], ids=["slot-freed", "slot-passed-on"])
def test_cancel_seen_together_with_a_hand_off_passes_the_slot_on(
    threads: ThreadRunner, next_waiter: bool
) -> None:
    lim = ColdLimiter(active=1, queue=2, clock=FakeClock())
    holder = lim.acquire()
    cancel = PausingCancel()
    first = start_acquire(threads, lim, cancel, name="first")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    second = None
    if next_waiter:
        second = start_acquire(threads, lim, threading.Event(), name="second")
        wait_until("2 queued", lambda: lim.stats().queued == 2)
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
    assert_exact_capacity(lim)


def test_deadline_seen_together_with_a_hand_off_loses_no_slot(threads: ThreadRunner) -> None:
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=2, wait=1.0, clock=clock)
    holder = lim.acquire()
    cancel = PausingCancel()
    first = start_acquire(threads, lim, cancel, name="first")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    second = start_acquire(threads, lim, threading.Event(), name="second")
    wait_until("2 queued", lambda: lim.stats().queued == 2)
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
    assert_exact_capacity(lim)


RACE_ROUNDS = 64


RACE_SEED = int(os.environ.get("REACHLIMIT_SEED", "20240611"))


def jitter(yields: int) -> None:
    """Shift one side of a race by a few scheduler turns. It only varies the interleaving;
    every outcome it can produce is one the test accepts."""
    for _ in range(yields):
        time.sleep(0)


def race_jitter(rng: random.Random) -> int:
    return rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21])


def test_a_cancel_racing_a_promotion_loses_no_slot(threads: ThreadRunner) -> None:
    rng = random.Random(RACE_SEED)
    lim = ColdLimiter(active=2, queue=8, clock=FakeClock())
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # the waiter wakes often: more interleavings
    outcomes: Counter[str] = Counter()
    for round_no in range(RACE_ROUNDS):
        releasing, staying = lim.acquire(), lim.acquire()
        cancel = threading.Event()
        waiter = start_acquire(threads, lim, cancel, name=f"waiter-{round_no}")
        wait_until("1 queued", lambda: lim.stats().queued == 1)
        barrier = threading.Barrier(2, timeout=5.0)
        release_delay, cancel_delay = race_jitter(rng), race_jitter(rng)

        def release_at_barrier(
            grant: Grant = releasing, b: threading.Barrier = barrier, delay: int = release_delay
        ) -> None:
            b.wait()
            jitter(delay)
            grant.release()

        threads.start(release_at_barrier, name=f"releaser-{round_no}")
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
        threads.join_all()
        s = lim.stats()
        assert (s.active, s.queued) == (0, 0), f"round {round_no}: {s}"
        assert gate_size(lim) == 0
        assert_exact_capacity(lim)
    assert sum(outcomes.values()) == RACE_ROUNDS
    s = lim.stats()
    assert s.peak_active == 2
    # 2 fast-path grants + 2 capacity probes per round, plus every promotion.
    assert s.acquired == 4 * RACE_ROUNDS + outcomes["promoted"]


def test_a_timeout_racing_a_promotion_loses_no_slot(threads: ThreadRunner) -> None:
    rng = random.Random(RACE_SEED + 1)
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=8, wait=1.0, clock=clock)
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # the waiter re-reads the clock often
    outcomes: Counter[str] = Counter()
    for round_no in range(RACE_ROUNDS):
        holder = lim.acquire()
        reads = clock.calls
        waiter = start_acquire(threads, lim, threading.Event(), name=f"waiter-{round_no}")
        wait_until(
            "the waiter queued, its deadline fixed",
            lambda reads=reads: lim.stats().queued == 1 and clock.calls >= reads + 1,
        )
        barrier = threading.Barrier(2, timeout=5.0)
        release_delay, expire_delay = race_jitter(rng), race_jitter(rng)

        def release_at_barrier(
            grant: Grant = holder, b: threading.Barrier = barrier, delay: int = release_delay
        ) -> None:
            b.wait()
            jitter(delay)
            grant.release()

        threads.start(release_at_barrier, name=f"releaser-{round_no}")
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
        threads.join_all()
        s = lim.stats()
        assert (s.active, s.queued) == (0, 0), f"round {round_no}: {s}"
        assert gate_size(lim) == 0
        assert_exact_capacity(lim)
    assert sum(outcomes.values()) == RACE_ROUNDS
    assert lim.stats().rejected_timeout == outcomes["timeout"]
