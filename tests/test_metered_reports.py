"""What the metered classes (``reachlimit.prometheus``'s limiters and cold path) report to their
meter, checked against a meter that records every report: each admission by its result with
the time it waited, each build's duration, and when the figures are published (after each
request, with the gauges only after one that built; when a leader joins the queue), in the
several-process mode that publishes them and in the one-process mode that does not. A
duration is checked against the time the test measured around the call (never against a
speed): it is never negative and never more than the call took.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, SingleFlight, TTLCache
from reachlimit.prometheus import MeteredColdPath, MeteredLimiter, MeteredSharedLimiter
from tests.support.clock import FakeClock
from tests.support.threads import Outcome, ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Reports:
    """A meter recording every report (``events``) and every build's duration (``builds``);
    ``per_process``: whether it keeps its figures per process (publishes them)."""

    def __init__(self, per_process: bool = True) -> None:
        self.per_process = per_process
        self.events: list[tuple[Any, ...]] = []
        self.builds: list[float] = []
        self._lock = threading.Lock()

    def _add(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def granted(self, seconds: float) -> None:
        self._add("granted", seconds)

    def refused(self, reason: str, seconds: float) -> None:
        self._add("refused", reason, seconds)

    def cancelled(self) -> None:
        self._add("cancelled")

    def publish(self, gauges: bool = True) -> None:
        self._add("publish", gauges)

    def instruments(self) -> Reports:
        return self

    @property
    def build(self) -> Reports:
        return self

    def observe(self, amount: float) -> None:
        with self._lock:
            self.builds.append(amount)

    def taken(self) -> list[tuple[Any, ...]]:
        """The events so far, forgotten."""
        with self._lock:
            events, self.events = self.events, []
        return events


def metered_limiter(reports: Reports, active: int = 1, queue: int = 1) -> MeteredLimiter:
    """A metered limiter wired to ``reports`` as ``ReachMetrics`` wires its own."""
    return MeteredLimiter(active, queue, wait=5.0, metrics=reports)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()``'s value and how long the call took, as the test measured it."""
    started = perf_counter()
    value = call()
    return value, perf_counter() - started


def within(seconds: float, elapsed: float) -> bool:
    return 0.0 <= seconds <= elapsed


def test_a_build_is_timed_and_only_a_request_that_built_publishes_the_gauges() -> None:
    reports = Reports()
    path = MeteredColdPath(reports, metered_limiter(reports), TTLCache(4, 60.0))
    answer, elapsed = timed(lambda: path.fetch("k", lambda: "v"))
    assert answer.status == "stored"
    (granted, waited), publish = reports.taken()
    assert granted == "granted" and within(waited, elapsed)
    assert publish == ("publish", True)
    [build] = reports.builds
    assert within(build, elapsed)
    assert path.fetch("k", lambda: "unused").status == "hit"
    assert reports.taken() == [("publish", False)]
    assert reports.builds == [build]


def test_in_the_one_process_mode_nothing_is_published() -> None:
    reports = Reports(per_process=False)
    limiter = metered_limiter(reports)
    path = MeteredColdPath(reports, limiter, TTLCache(4, 60.0))
    path.fetch("k", lambda: "v")
    path.fetch("k", lambda: "unused")
    assert [event[0] for event in reports.taken()] == ["granted"]
    assert len(reports.builds) == 1


def test_a_refusal_is_reported_with_its_reason_and_its_wait_and_a_cancel_as_cancelled() -> None:
    reports = Reports()
    limiter = metered_limiter(reports, active=1, queue=0)
    path = MeteredColdPath(reports, limiter, TTLCache(4, 60.0))
    with limiter.acquire():
        reports.taken()
        with pytest.raises(Busy) as info:
            started = perf_counter()
            try:
                path.fetch("k", lambda: "v")
            finally:
                elapsed = perf_counter() - started
        assert info.value.reason == Busy.QUEUE_FULL
        (refused, reason, waited), publish = reports.taken()
        assert (refused, reason) == ("refused", Busy.QUEUE_FULL) and within(waited, elapsed)
        assert publish == ("publish", False)  # nothing was built
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        limiter.acquire(cancel)
    assert reports.taken() == [("cancelled",)]
    assert reports.builds == []


@pytest.mark.parametrize("per_process", [True, False])
def test_a_leader_that_joins_the_queue_publishes_its_place(
    threads: ThreadRunner, per_process: bool
) -> None:
    reports = Reports(per_process)
    limiter = metered_limiter(reports, active=1, queue=1)
    held = limiter.acquire()
    reports.taken()
    waiter: Outcome = start_call(threads, limiter.acquire, name="waiter")
    wait_until("the waiter to queue", lambda: limiter.stats().queued == 1)
    held.release()
    waiter.wait_done()
    assert waiter.error is None
    waiter.value.release()
    events = reports.taken()
    assert events[-1][0] == "granted"
    assert [event for event in events if event[0] == "publish"] == (
        [("publish", True)] if per_process else []
    )


class Inner(ColdLimiter):
    """A limiter standing for a shared one: records what it is asked and its closes."""

    def __init__(self) -> None:
        super().__init__(2, 1, wait=1.5, retry_after=3)
        self.asked: list[tuple[Any, Any]] = []
        self.closed = 0

    def acquire(self, cancel: Any = None, client: Any = None) -> Any:
        self.asked.append((cancel, client))
        return super().acquire(cancel, client)

    def close(self) -> None:
        self.closed += 1


def test_a_shared_limiter_is_metered_and_otherwise_its_own() -> None:
    reports = Reports()
    inner = Inner()
    shared = MeteredSharedLimiter(inner, reports)
    assert shared.inner is inner and shared.metrics is reports
    cancel = threading.Event()
    grant, elapsed = timed(lambda: shared.acquire(cancel, "client-a"))
    with grant:
        assert inner.asked == [(cancel, "client-a")]
        [(granted, waited)] = reports.taken()
        assert granted == "granted" and within(waited, elapsed)
        assert shared.stats() == inner.stats() and shared.stats().active == 1
    cancel.set()
    with pytest.raises(Cancelled):
        shared.acquire(cancel)
    assert reports.taken() == [("cancelled",)]
    assert (shared.capacity_active, shared.capacity_queue, shared.wait, shared.retry_after) == (
        2, 1, 1.5, 3
    )
    shared.close()
    assert inner.closed == 1
    MeteredSharedLimiter(ColdLimiter(1, 0), reports).close()  # a limiter without close()


def test_the_metered_path_keeps_the_flight_and_options_it_is_given(
    fake_clock: FakeClock,
) -> None:
    reports = Reports()
    flight: SingleFlight[Any] = SingleFlight()
    path = MeteredColdPath(
        reports, metered_limiter(reports), TTLCache(4, 60.0), flight, clock=fake_clock
    )
    assert path.flight is flight and path.clock is fake_clock
