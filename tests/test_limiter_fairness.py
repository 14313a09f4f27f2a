"""Fair admission in ColdLimiter: the rules of ``tests/support/fairness.py`` in one process,
and the races of a displacement against a promotion, a timeout and a cancel."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import Busy, ColdLimiter
from tests.support import fairness
from tests.support.clock import FakeClock
from tests.support.limiter import PausingCancel, assert_exact_capacity, gate_size, start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def make(active: int, queue: int) -> ColdLimiter:
    return ColdLimiter(active, queue, wait=30.0, clock=FakeClock())


@pytest.mark.parametrize(
    "check",
    fairness.RULES,
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_fair_admission_rule(threads: ThreadRunner, check: Any) -> None:
    check(threads, make)


def test_any_hashable_names_a_client(threads: ThreadRunner) -> None:
    lim = make(1, 2)
    holder = lim.acquire(None, ("user", 7))
    first = start_acquire(threads, lim, threading.Event(), name="first", client=("user", 7))
    wait_until("first queued", lambda: lim.stats().queued == 1)
    second = start_acquire(threads, lim, threading.Event(), name="second", client=("user", 7))
    wait_until("second queued", lambda: lim.stats().queued == 2)
    other = start_acquire(threads, lim, threading.Event(), name="other", client=b"\x00")
    second.wait_done()
    assert isinstance(second.error, Busy) and second.error.reason == Busy.DISPLACED
    holder.release()
    first.wait_done()
    first.release()
    other.wait_done()
    other.release()
    assert_exact_capacity(lim)


def _displacement_race(threads: ThreadRunner, other_end: str) -> dict[str, str]:
    """One round: a's newest waiter ``victim`` is held between two wait slices (outside the
    lock) while its wait also ends another way (``other_end``), and a newcomer of b displaces
    it. Exactly one outcome; every place and slot back. Returns the outcomes by name."""
    clock = FakeClock(start=1005.0)
    lim = ColdLimiter(active=1, queue=2, wait=10.0, clock=clock)
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]
    holder = lim.acquire(None, "a")
    oldest = start_acquire(threads, lim, threading.Event(), name="oldest", client="a")
    wait_until("oldest queued", lambda: lim.stats().queued == 1)
    # oldest's deadline is 1015; the clock goes back so that victim's is 1010, before it.
    wait_until("oldest's deadline fixed", lambda: clock.calls >= 1)
    clock.now = 1000.0
    pause = PausingCancel()
    victim = start_acquire(threads, lim, pause, name="victim", client="a")
    wait_until("victim queued", lambda: lim.stats().queued == 2)
    pause.pause.set()
    assert pause.paused.wait(5.0)  # victim's deadline is fixed: it is in its wait loop
    clock.now = 1003.0  # the newcomer's deadline: 1013
    newcomer = start_acquire(threads, lim, threading.Event(), name="newcomer", client="b")
    wait_until("newcomer queued", lambda: lim.stats().displaced == 1)
    if other_end == "promotion":
        # Promote "oldest" and then b's newcomer (round-robin): victim is out already.
        holder.release()
        oldest.wait_done()
    elif other_end == "timeout":
        clock.now = 1011.0  # past victim's deadline, not the others'
    else:
        pause.result = True  # the cancel object now says "set"
    pause.resume.set()
    victim.wait_done()
    outcomes: dict[str, str] = {}
    error = victim.error
    outcomes["victim"] = error.reason if isinstance(error, Busy) else type(error).__name__
    if other_end != "promotion":
        holder.release()
        oldest.wait_done()
    assert oldest.grant is not None
    oldest.release()
    newcomer.wait_done()
    assert newcomer.grant is not None, f"the newcomer lost the place: {newcomer.error!r}"
    newcomer.release()
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), s
    assert gate_size(lim) == 0
    assert s.displaced == 1 and s.rejected_timeout == 0 and s.cancelled == 0, s
    assert s.acquired == 3, s
    assert_exact_capacity(lim)
    return outcomes


@pytest.mark.parametrize("other_end", ["promotion", "timeout", "cancel"])
def test_a_displacement_racing_another_end_of_the_wait(
    threads: ThreadRunner, other_end: str
) -> None:
    """The displacement is decided under the lock first, so the victim always reports it:
    64 rounds, each with every place and slot back and each outcome counted once."""
    for _ in range(64):
        assert _displacement_race(threads, other_end) == {"victim": Busy.DISPLACED}
