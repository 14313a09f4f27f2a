"""A slot handed to a waiter at the very moment its wait ends otherwise (a cancel, its
deadline, an error): whichever side wins, exactly one does, and the slot is never lost.

The first tests pin the instant (the waiter is held between two wait slices, outside the
lock, while the hand-off happens); the last two let release and cancel or timeout run free
from a Barrier, many rounds with a seeded jitter.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, Grant
from tests.support.clock import FakeClock
from tests.support.limiter import (
    Attempt,
    PausingCancel,
    assert_exact_capacity,
    gate_size,
    start_acquire,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def hand_off_to_a_paused_waiter(
    threads: ThreadRunner, lim: ColdLimiter, with_second: bool = True
) -> tuple[Attempt, PausingCancel, Attempt | None]:
    """The test holds the one slot; ``first`` queues with a PausingCancel and, if
    ``with_second``, ``second`` queues behind it. ``first`` is then paused between two wait
    slices, outside the lock, and the test's release hands it the slot it cannot see yet."""
    holder = lim.acquire()
    cancel = PausingCancel()
    first = start_acquire(threads, lim, cancel, name="first")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    second = None
    if with_second:
        second = start_acquire(threads, lim, threading.Event(), name="second")
        wait_until("2 queued", lambda: lim.stats().queued == 2)
    cancel.pause.set()
    assert cancel.paused.wait(5.0)  # first is between two slices, outside the lock
    holder.release()  # hands the slot to first, which cannot see it yet
    return first, cancel, second


def assert_drained(lim: ColdLimiter, context: str = "") -> None:
    """Nothing held, nobody queued, no gate place taken, and every slot usable again."""
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), f"{context}{s}"
    assert gate_size(lim) == 0
    assert_exact_capacity(lim)


def test_exception_after_promotion_passes_the_slot_on(threads: ThreadRunner) -> None:
    """The waiter is promoted, then raises before it can take its grant: the slot goes to the
    next waiter, never lost."""
    lim = ColdLimiter(active=1, queue=2, clock=FakeClock())
    first, first_cancel, second = hand_off_to_a_paused_waiter(threads, lim)
    assert second is not None
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
    first, cancel, second = hand_off_to_a_paused_waiter(threads, lim, with_second=next_waiter)
    cancel.result = True  # ... whose client leaves at the very instant of the hand-off
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
    assert_drained(lim)


def test_deadline_seen_together_with_a_hand_off_loses_no_slot(threads: ThreadRunner) -> None:
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=2, wait=1.0, clock=clock)
    first, cancel, second = hand_off_to_a_paused_waiter(threads, lim)
    assert second is not None
    clock.advance(5.0)  # ... and both waiters' deadlines pass at the very instant of it
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
    assert_drained(lim)


RACE_ROUNDS = 64
RACE_SEED = int(os.environ.get("REACHTEST_SEED", "20240611"))


def jitter(yields: int) -> None:
    """Shift one side of a race by a few scheduler turns. It only varies the interleaving;
    every outcome it can produce is one the test accepts."""
    for _ in range(yields):
        time.sleep(0)


def race_jitter(rng: random.Random) -> int:
    return rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 21])


def race_a_release(
    threads: ThreadRunner, grant: Grant, rng: random.Random, name: str, end_wait: Callable[[], Any]
) -> None:
    """Release ``grant`` in another thread while this one calls ``end_wait()`` (a cancel, a
    clock moved past the deadline): both start from one Barrier, each after its own jitter."""
    barrier = threading.Barrier(2, timeout=5.0)
    release_delay, end_delay = race_jitter(rng), race_jitter(rng)

    def release_at_barrier() -> None:
        barrier.wait()
        jitter(release_delay)
        grant.release()

    threads.start(release_at_barrier, name=name)
    barrier.wait()
    jitter(end_delay)
    end_wait()


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
        race_a_release(threads, releasing, rng, f"releaser-{round_no}", cancel.set)
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
        assert_drained(lim, f"round {round_no}: ")
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
        past_the_deadline = functools.partial(clock.advance, 2.0)
        race_a_release(threads, holder, rng, f"releaser-{round_no}", past_the_deadline)
        waiter.wait_done()
        if waiter.grant is not None:
            outcomes["promoted"] += 1
            waiter.release()
        else:
            assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout"
            outcomes["timeout"] += 1
        threads.join_all()
        assert_drained(lim, f"round {round_no}: ")
    assert sum(outcomes.values()) == RACE_ROUNDS
    assert lim.stats().rejected_timeout == outcomes["timeout"]
