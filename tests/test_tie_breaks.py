"""What wins when two things reach a waiting request at the same instant, pinned.

Each test forces one interleaving deterministically (a cancel token or a limiter that acts at
the exact moment the code looks at it, a fake clock, a poll slice too long to fire) so that
the outcome the code documents is the only one the test accepts. The README's "Decisions"
section states each rule in words.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, ColdPath, Grant, SingleFlight
from tests.support.clock import FakeClock
from tests.support.limiter import start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def in_condition_wait(limiter: ColdLimiter, position: int = 0) -> bool:
    """White box: the queued waiter at ``position`` is parked inside its Condition's wait,
    so nothing reaches it but a notify or the end of its timed wait."""
    with limiter._lock:
        if len(limiter._waiters) <= position:
            return False
        return bool(limiter._waiters[position].cond._waiters)  # type: ignore[attr-defined]


def test_a_cancel_seen_together_with_the_promotion_wins_and_passes_the_slot_on(
    threads: ThreadRunner,
) -> None:
    lim = ColdLimiter(active=1, queue=2, wait=30.0)
    holder = lim.acquire()

    class CancelAtPromotion:
        """Reads "not set" until armed; the armed read first hands the waiter its slot (the
        holder releases) and then says "set": both arrive at the same look."""

        armed = False

        def is_set(self) -> bool:
            if not self.armed:
                return False
            self.armed = False
            holder.release()  # the slot goes to the oldest waiter: the one asking right now
            return True

    cancel = CancelAtPromotion()
    first = start_acquire(threads, lim, cancel=cancel, name="first")
    wait_until("one waiter queued", lambda: lim.stats().queued == 1)
    second = start_acquire(threads, lim, name="second")
    wait_until("two waiters queued", lambda: lim.stats().queued == 2)
    cancel.armed = True
    first.wait_done()
    second.wait_done()
    assert isinstance(first.error, Cancelled) and first.grant is None
    assert isinstance(second.grant, Grant)  # the slot first was handed went on to second
    s = lim.stats()
    assert (s.active, s.queued, s.cancelled, s.acquired) == (1, 0, 1, 2)
    second.release()
    assert (lim.stats().active, lim.stats().queued) == (0, 0)


def test_a_promotion_that_lands_before_the_waiter_sees_its_deadline_is_a_grant(
    threads: ThreadRunner,
) -> None:
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=1, wait=3.0, clock=clock)
    holder = lim.acquire()
    waiter = start_acquire(threads, lim, name="waiter")
    wait_until("the waiter parked", lambda: in_condition_wait(lim))
    clock.advance(10.0)  # its deadline has passed, but it has not looked at the clock since
    holder.release()  # ... and the hand-off reaches it first
    waiter.wait_done()
    assert waiter.error is None and isinstance(waiter.grant, Grant)
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout, s.acquired) == (1, 0, 0, 2)
    waiter.release()
    assert lim.stats().active == 0


def test_a_waiter_that_sees_its_deadline_before_any_promotion_times_out(
    threads: ThreadRunner,
) -> None:
    """The other side of the rule above: no hand-off yet, deadline passed -> Busy(timeout)."""
    clock = FakeClock()
    lim = ColdLimiter(active=1, queue=1, wait=3.0, clock=clock)
    lim.CANCEL_POLL_INTERVAL = 0.001  # type: ignore[misc]  # wake often to re-read the clock
    holder = lim.acquire()
    waiter = start_acquire(threads, lim, cancel=threading.Event(), name="waiter")
    wait_until("one waiter queued", lambda: lim.stats().queued == 1)
    clock.advance(10.0)
    waiter.wait_done()
    assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout"
    holder.release()
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout) == (0, 0, 1)


def test_a_flight_forgets_its_key_before_anyone_sees_its_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reachlimit import _flight

    flight: SingleFlight[str] = SingleFlight()
    key_present_when_done: list[bool] = []

    class RecordingEvent(threading.Event):
        def set(self) -> None:
            key_present_when_done.append("k" in flight._calls)
            super().set()

    class RecordingCall(_flight._Call[str]):
        """A call that has its Event from the start, as if a follower had already come."""

        def __init__(self) -> None:
            super().__init__()
            self.done = RecordingEvent()

    monkeypatch.setattr(_flight, "_Call", RecordingCall)
    runs = []

    def fn() -> str:
        runs.append(1)
        return f"run {len(runs)}"

    assert flight.do("k", fn) == ("run 1", False)
    # The outcome was published only after the key was gone, so a caller arriving after
    # anyone has seen it starts a new call instead of inheriting a finished one.
    assert key_present_when_done == [False]
    assert flight.do("k", fn) == ("run 2", False)


def test_a_leader_cancelled_by_a_limiter_without_a_cancel_token_raises_once() -> None:
    class CancellingLimiter:
        """Duck-typed: says Cancelled although nobody gave it a token."""

        calls = 0

        def acquire(self, cancel: Any = None, client: Any = None) -> Grant:
            self.calls += 1
            if self.calls > 1:
                raise AssertionError("the leader went round again")
            raise Cancelled()

        def stats(self) -> Any:
            return ColdLimiter().stats()

    limiter = CancellingLimiter()
    path = ColdPath(limiter)
    builds: list[int] = []
    with pytest.raises(Cancelled):
        path.get("k", lambda: builds.append(1))
    assert limiter.calls == 1 and builds == []
    assert path.stats().coalesced == 0 and path.stats().builds == 0


def test_a_follower_whose_own_client_left_with_its_leaders_raises_and_is_not_coalesced(
    threads: ThreadRunner,
) -> None:
    in_acquire = threading.Event()
    leader_may_go = threading.Event()
    follower_cancel = threading.Event()

    class LeaderCancelledLimiter:
        calls = 0

        def acquire(self, cancel: Any = None, client: Any = None) -> Grant:
            self.calls += 1
            in_acquire.set()
            assert leader_may_go.wait(5.0)
            follower_cancel.set()  # the follower's client leaves as the leader's does
            raise Cancelled()

        def stats(self) -> Any:
            return ColdLimiter().stats()

    limiter = LeaderCancelledLimiter()
    flight: SingleFlight[Any] = SingleFlight()
    # The follower's wait never times out into a look at its token: it sees its token only
    # after its leader's outcome, which is the instant under test.
    flight.CANCEL_POLL_INTERVAL = 3600.0  # type: ignore[misc]
    path = ColdPath(limiter, flight=flight)
    errors: dict[str, BaseException] = {}

    def get(name: str, cancel: Any) -> None:
        try:
            path.get("k", lambda: pytest.fail("nobody may build"), cancel)
        except BaseException as exc:
            errors[name] = exc

    threads.start(get, "leader", None, name="leader")
    assert in_acquire.wait(5.0)
    threads.start(get, "follower", follower_cancel, name="follower")

    def follower_joined() -> bool:
        with flight._lock:
            call = flight._calls.get("k")
            return call is not None and call.followers == 1

    wait_until("the follower joined the leader's call", follower_joined)
    leader_may_go.set()
    threads.join_all()
    assert isinstance(errors.get("leader"), Cancelled)
    assert isinstance(errors.get("follower"), Cancelled)
    assert limiter.calls == 1  # the follower did not go round to lead
    assert path.stats().coalesced == 0
