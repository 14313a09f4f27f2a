"""Stale-while-revalidate in the core: TTLCache's stale window, ColdPath's stale answers, its
early refresh (XFetch) and the Refresher's threads.

Every clock is injected and every random draw scripted, so each answer is checked at its
exact boundary; a refresh is waited for by the refresher's own state (``busy``), never by
time. Builds that must stay running block on an Event the test sets.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import (
    REFRESH_CLIENT,
    ColdLimiter,
    ColdPath,
    Entry,
    Refresher,
    TTLCache,
)
from reachlimit._path import EARLY_SPAN
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.clock import FakeClock
from tests.support.refreshes import Builds, refreshing, threads_named, threads_of
from tests.support.threads import JOIN_TIMEOUT, Outcome, ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Draws:
    """A scripted random source: answers ``value`` and counts its calls."""

    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


def make_path(
    paths: list[ColdPath], clock: FakeClock, *, ttl: float = 10.0, stale: float = 30.0,
    draws: Callable[[], float] | None = None, active: int = 2, queue: int = 8,
) -> ColdPath:
    cache: TTLCache[Any] = TTLCache(16, ttl, stale=stale, clock=clock)
    path = ColdPath(
        ColdLimiter(active, queue, wait=1.0), cache, random=draws or Draws(0.5), clock=clock
    )
    paths.append(path)
    return path


def stale_path(paths: list[ColdPath], clock: FakeClock, by: float, **kwargs: Any) -> ColdPath:
    """A path (``make_path(**kwargs)``) whose entry ``"k"`` ("v1") was stored ``by`` s ago."""
    path = make_path(paths, clock, **kwargs)
    assert path.fetch("k", Builds()).status == "stored"
    clock.now += by
    return path


def settle(path: ColdPath, key: Any) -> None:
    """Wait until no refresh of ``key`` waits or runs."""
    wait_until(f"the refresh of {key!r} to end", lambda: not refreshing(path.refresher, key))


# -- TTLCache: the stale window ----------------------------------------------------------------


def test_an_entry_is_fresh_then_stale_then_gone_at_its_exact_boundaries(clock: FakeClock) -> None:
    cache: TTLCache[str] = TTLCache(4, 10.0, stale=5.0, clock=clock)
    cache.put("k", "v", 0.25)
    clock.now += 9.999
    assert cache.get("k") == "v"
    entry = cache.lookup("k")
    assert entry is not None and entry.value == "v" and entry.build_time == 0.25
    assert entry.fresh_for == pytest.approx(0.001)
    clock.now += 0.001  # the TTL's end: no longer fresh
    assert cache.get("k") is None
    assert cache.lookup("k") == Entry("v", pytest.approx(0.0), 0.25)
    clock.now += 4.999  # still within the stale window
    stale = cache.lookup("k")
    assert stale is not None and stale.fresh_for == pytest.approx(-4.999)
    clock.now += 0.001  # ttl + stale: gone
    assert cache.lookup("k") is None
    assert cache.get("k") is None and len(cache) == 0


def test_lookup_fields_are_lookups_entry_as_a_plain_tuple(clock: FakeClock) -> None:
    cache: TTLCache[str] = TTLCache(4, 10.0, stale=5.0, clock=clock)
    assert cache.lookup_fields("k") is None
    cache.put("k", "v", 0.25)
    for step in (0.0, 9.5, 3.0):  # fresh, then fresh near its end, then stale
        clock.now += step
        fields = cache.lookup_fields("k")
        assert type(fields) is tuple and fields == tuple(cache.lookup("k") or ())
    assert fields == ("v", pytest.approx(-2.5), 0.25)
    clock.now += 2.5  # gone
    assert cache.lookup_fields("k") is None and len(cache) == 0


def test_without_a_stale_window_lookup_answers_fresh_entries_only(clock: FakeClock) -> None:
    cache: TTLCache[str] = TTLCache(4, 10.0, clock=clock)
    cache.set("k", "v")
    assert cache.lookup("k") == Entry("v", pytest.approx(10.0), 0.0)
    clock.now += 10.0
    assert cache.lookup("k") is None and len(cache) == 0


@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, math.nan, "300", None, True])
def test_a_stale_window_that_is_not_a_number_of_seconds_is_a_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="stale"):
        TTLCache(4, 10.0, stale=bad)


def test_a_full_cache_drops_entries_past_their_stale_window_first(clock: FakeClock) -> None:
    cache: TTLCache[str] = TTLCache(2, 10.0, stale=5.0, clock=clock)
    cache.set("old", "o")
    clock.now += 12.0  # "old" is stale, not gone
    cache.set("mid", "m")
    clock.now += 4.0  # "old" gone (16 > 15), "mid" fresh
    cache.set("new", "n")
    assert cache.lookup("old") is None
    assert cache.get("mid") == "m" and cache.get("new") == "n"


# -- ColdPath: stale answers and one refresh per key ----------------------------------------


def test_a_stale_entry_is_answered_at_once_and_refreshed_once(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = make_path(paths, clock)
    build = Builds()
    assert path.fetch("k", build).status == "stored"
    clock.now += 12.0  # 2 s past the TTL
    gate = threading.Event()
    refresh = Builds(gate)
    answer = path.fetch("k", refresh)
    assert (answer.value, answer.status) == ("v1", "stale")
    assert answer.fresh_for == pytest.approx(-2.0)
    assert refresh.started.wait(JOIN_TIMEOUT)  # on a refresher thread, not this one
    assert threading.current_thread() not in threads_of(path.refresher)
    # A herd of stale hits meanwhile: each answered at once, no second refresh.
    herd = [path.fetch("k", refresh) for _ in range(20)]
    assert {(a.value, a.status) for a in herd} == {("v1", "stale")}
    gate.set()
    settle(path, "k")
    assert refresh.runs == 1
    fresh = path.fetch("k", Builds())
    assert (fresh.value, fresh.status) == ("v1", "hit") and fresh.fresh_for == pytest.approx(10.0)
    counts = path.counts()
    assert (counts.stale, counts.refreshed, counts.builds) == (21, 1, 2)
    assert path.stats().stale == 21


def test_at_the_exact_end_of_its_ttl_an_entry_is_answered_stale(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = stale_path(paths, clock, 10.0, ttl=10.0)  # no freshness left: 0.0 exactly
    answer = path.fetch("k", Builds())
    assert (answer.value, answer.status, answer.fresh_for) == ("v1", "stale", 0.0)
    settle(path, "k")
    assert (path.counts().stale, path.counts().hits) == (1, 0)


def test_past_ttl_plus_stale_the_next_request_is_a_cold_miss(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = stale_path(paths, clock, 15.0, ttl=10.0, stale=5.0)
    answer = path.fetch("k", Builds())
    assert answer.status == "stored" and path.counts().misses == 2
    assert not refreshing(path.refresher, "k")


def test_a_refresh_that_raises_leaves_the_stale_entry_and_is_logged_once_per_episode(
    clock: FakeClock, paths: list[ColdPath], caplog: pytest.LogCaptureFixture
) -> None:
    path = stale_path(paths, clock, 11.0, stale=60.0)
    failing = Builds()
    failing.error = RuntimeError("database down")
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        for _ in range(3):  # three tries, one backoff (the TTL, 10 s) after the other
            answer = path.fetch("k", failing)
            assert (answer.value, answer.status) == ("v1", "stale")
            settle(path, "k")
            clock.now += 10.0
    assert failing.runs == 3
    assert path.counts().refresh_failed == 3
    logged = [r for r in caplog.records if "refresh of 'k'" in r.getMessage()]
    assert len(logged) == 1 and "RuntimeError: database down" in logged[0].getMessage()
    # Built again (a refresh that works): the next failure is a new episode, logged again.
    path.fetch("k", Builds())
    settle(path, "k")
    assert path.counts().refreshed == 1
    clock.now += 11.0
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        path.fetch("k", failing)
        settle(path, "k")
    assert len([r for r in caplog.records if "refresh of 'k'" in r.getMessage()]) == 2


def test_a_refused_refresh_leaves_the_stale_entry_and_its_readers_unharmed(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = stale_path(paths, clock, 11.0, active=1, queue=0)
    held = path.limiter.acquire()  # the only slot, taken: the refresh is refused at once
    try:
        refresh = Builds()
        answer = path.fetch("k", refresh)
        assert (answer.value, answer.status) == ("v1", "stale")
        settle(path, "k")
        assert refresh.runs == 0
        assert path.counts().refresh_refused == 1
        clock.now += 10.0  # the backoff (the TTL) over
        again = path.fetch("k", refresh)  # still answered, and asked to refresh again
        assert (again.value, again.status) == ("v1", "stale")
        settle(path, "k")
    finally:
        held.release()
    assert path.counts().refresh_refused == 2


def test_a_refresh_asks_the_limiter_as_a_client_of_its_own(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = make_path(paths, clock)
    asked: list[Any] = []
    acquire = path.limiter.acquire

    def spy(cancel: Any = None, client: Any = None) -> Any:
        asked.append(client)
        return acquire(cancel, client)

    path.limiter.acquire = spy  # type: ignore[method-assign]
    path.fetch("k", Builds(), client="10.0.0.1")
    clock.now += 11.0
    path.fetch("k", Builds(), client="10.0.0.1")
    settle(path, "k")
    assert asked == ["10.0.0.1", REFRESH_CLIENT]


def test_a_refresh_that_finds_a_fresher_entry_does_not_build(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = stale_path(paths, clock, 11.0)
    gate = threading.Event()
    blocker = Builds(gate)
    # Hold the refresher's only threads: two other keys whose refreshes block.
    for other in ("a", "b"):
        path.fetch(other, Builds())
    clock.now += 11.0
    for other in ("a", "b"):
        path.fetch(other, blocker)
    wait_until("both refreshers busy", lambda: blocker.runs == 2)
    refresh = Builds()
    assert path.fetch("k", refresh).status == "stale"  # queued behind the two
    path.cache.set("k", "someone else's")  # refreshed meanwhile (another process, say)
    gate.set()
    for key in ("a", "b", "k"):
        settle(path, key)
    assert refresh.runs == 0 and path.fetch("k", Builds()).value == "someone else's"


def test_warm_and_stale_answers_from_many_threads_are_each_counted_once(
    clock: FakeClock, paths: list[ColdPath], threads: ThreadRunner
) -> None:
    """A path counts its warm answers without its lock: none is lost however the threads
    interleave (a switch interval of a microsecond makes them interleave all the time)."""
    path = make_path(paths, clock)
    path.cache.put("fresh", "f", 0.0)
    path.cache.put("stale", "s", 0.0)
    clock.now += 12.0  # "stale" 2 s past its TTL, "fresh" too: put again below
    path.cache.put("fresh", "f", 0.0)
    refresh = Builds(gate=threading.Event())  # "stale" stays stale while the threads ask
    workers, each = 8, 500
    start = threading.Barrier(workers)

    def ask() -> None:
        start.wait(JOIN_TIMEOUT)
        for _ in range(each):
            assert path.fetch_warm_fields("fresh", Builds()) == ("f", "hit", 10.0)
            assert path.fetch_warm_fields("stale", refresh) == ("s", "stale", -2.0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(workers):
            threads.start(ask)
        threads.join_all()
    finally:
        sys.setswitchinterval(interval)
    counts = path.counts()
    assert (counts.hits, counts.stale, counts.misses) == (workers * each, workers * each, 0)
    assert path.stats().hits == workers * each
    assert refresh.gate is not None
    refresh.gate.set()
    settle(path, "stale")
    assert refresh.runs == 1


# -- early refresh (XFetch) -------------------------------------------------------------------


def test_early_refresh_is_drawn_only_near_the_ttls_end(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    draws = Draws(0.0)
    path = make_path(paths, clock, ttl=100.0, draws=draws)
    stored = clock.now
    path.cache.put("k", "v", 1.0)  # built in 1 s
    clock.now = stored + 100.0 - EARLY_SPAN * 1.0 - 0.01  # just outside the span: no draw
    assert path.fetch("k", Builds()).status == "hit" and draws.calls == 0
    clock.now = stored + 100.0 - EARLY_SPAN * 1.0  # its edge: not under it, no draw either
    assert path.fetch("k", Builds()) == ("v", "hit", EARLY_SPAN) and draws.calls == 0
    clock.now += 0.01  # inside it: a draw
    path.fetch("k", Builds())
    assert draws.calls == 1


def test_a_refresh_drawn_exactly_at_the_xfetch_edge_is_run(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    # -build_time * ln(1 - u) >= fresh_for: at equality the refresh is run. With a build
    # time of 1 s and 1 s left, u = 1 - exp(-1) lands on the edge exactly in floats.
    u = 1.0 - math.exp(-1.0)
    assert -1.0 * math.log(1.0 - u) == 1.0
    draws = Draws(u)
    path = make_path(paths, clock, ttl=100.0, draws=draws)
    path.cache.put("k", "v", 1.0)
    clock.now += 99.0
    refresh = Builds()
    assert path.fetch("k", refresh) == ("v", "hit", 1.0) and draws.calls == 1
    settle(path, "k")
    assert refresh.runs == 1


def test_a_stale_window_under_a_second_still_refreshes_early(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    draws = Draws(0.999)  # a draw that refreshes wherever one is drawn
    path = make_path(paths, clock, ttl=10.0, stale=0.5, draws=draws)
    path.cache.put("k", "v", 1.0)
    clock.now += 9.0
    refresh = Builds()
    assert path.fetch("k", refresh).status == "hit"
    settle(path, "k")
    assert (draws.calls, refresh.runs) == (1, 1)


@pytest.mark.parametrize("fresh_for", [0.5, 2.0, 5.0])
def test_the_early_refresh_chance_is_exp_of_minus_freshness_over_build_time(
    clock: FakeClock, paths: list[ColdPath], fresh_for: float
) -> None:
    # XFetch refreshes when -build_time * ln(1 - u) >= fresh_for, that is when
    # u >= 1 - exp(-fresh_for / build_time): the chance is exp(-fresh_for / build_time).
    build_time = 2.0
    edge = 1.0 - math.exp(-fresh_for / build_time)
    for u, refreshed in ((edge - 1e-9, False), (min(edge + 1e-9, 1 - 1e-12), True)):
        draws = Draws(u)
        path = make_path(paths, clock, ttl=100.0, draws=draws)
        path.cache.put("k", "v", build_time)
        clock.now += 100.0 - fresh_for
        refresh = Builds()
        answer = path.fetch("k", refresh)
        assert (answer.status, draws.calls) == ("hit", 1)
        settle(path, "k")
        assert refresh.runs == (1 if refreshed else 0), (u, edge)
        clock.now -= 100.0 - fresh_for


def test_no_early_refresh_without_a_stale_window(clock: FakeClock, paths: list[ColdPath]) -> None:
    draws = Draws(0.999)
    path = make_path(paths, clock, ttl=10.0, stale=0.0, draws=draws)
    path.cache.put("k", "v", 5.0)
    clock.now += 9.9
    refresh = Builds()
    assert path.fetch("k", refresh).status == "hit"
    assert draws.calls == 0 and not refreshing(path.refresher, "k") and refresh.runs == 0


# -- the Refresher --------------------------------------------------------------------------


def test_the_refresher_runs_at_most_its_threads_at_once_and_close_joins_them() -> None:
    refresher = Refresher(2, name="two-at-most")
    gate = threading.Event()
    running = threading.Semaphore(0)
    peak = [0, 0]  # now, most
    lock = threading.Lock()

    def job() -> None:
        with lock:
            peak[0] += 1
            peak[1] = max(peak[1], peak[0])
        running.release()
        assert gate.wait(JOIN_TIMEOUT)
        with lock:
            peak[0] -= 1

    for key in range(6):
        assert refresher.submit(key, job)
    assert not refresher.submit(3, job)  # waiting already: not queued twice
    for _ in range(2):
        assert running.acquire(timeout=JOIN_TIMEOUT)
    assert len(threads_named("two-at-most-")) == 2
    gate.set()
    wait_until("every job to end", lambda: not any(refreshing(refresher, k) for k in range(6)))
    assert peak[1] == 2
    refresher.close(JOIN_TIMEOUT)
    assert not threads_named("two-at-most-")
    assert not refresher.submit("late", job)  # closed: nothing more is run


def test_the_refresher_drops_jobs_beyond_its_bound_and_survives_a_job_that_raises() -> None:
    refresher = Refresher(1, max_pending=2)
    gate, running = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocked() -> None:
        running.set()
        assert gate.wait(JOIN_TIMEOUT)
        raise RuntimeError("a job's own failure")

    try:
        assert refresher.submit("first", blocked)
        assert running.wait(JOIN_TIMEOUT), "the first job never ran"
        assert refresher.submit("a", lambda: ran.append("a"))
        assert refresher.submit("b", lambda: ran.append("b"))
        assert not refresher.submit("c", lambda: ran.append("c"))
        assert refresher.dropped == 1
        gate.set()
        wait_until("a and b to run", lambda: ran == ["a", "b"])
    finally:
        refresher.close(JOIN_TIMEOUT)


def test_closing_a_path_that_never_refreshed_starts_no_thread_later(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    before = set(threads_named("reachlimit-refresher"))
    path = make_path(paths, clock)
    path.close()
    path.fetch("k", Builds())
    clock.now += 11.0
    assert path.fetch("k", Builds()).status == "stale"
    assert not refreshing(path.refresher, "k")  # the closed refresher took no job
    assert set(threads_named("reachlimit-refresher")) <= before


def test_closing_a_path_waits_for_a_running_refresh_no_longer_than_its_timeout(
    clock: FakeClock, paths: list[ColdPath], threads: ThreadRunner
) -> None:
    path = make_path(paths, clock)
    jobs = HeldJobs()
    try:
        assert path.refresher.submit("held", jobs.job("held"))
        jobs.wait_for("the refresh to run", 1)
        closing: Outcome = start_call(threads, lambda: path.close(0.01), name="close")
        closing.wait_done()  # returned although the refresh still holds its thread
        assert closing.error is None and refreshing(path.refresher, "held")
    finally:
        jobs.gate.set()
        path.close(JOIN_TIMEOUT)
    assert threads_of(path.refresher) == []


def test_refresher_threads_default_to_the_limiters_active(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = make_path(paths, clock, active=3)
    assert path.refresher.threads == 3


class HeldJobs:
    """Refresher jobs that record that they started, then hold their thread until ``gate``
    is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started: list[str] = []
        self._lock = threading.Lock()

    def job(self, name: str) -> Callable[[], None]:
        def run() -> None:
            with self._lock:
                self.started.append(name)
            assert self.gate.wait(JOIN_TIMEOUT)

        return run

    def count(self) -> int:
        with self._lock:
            return len(self.started)

    def wait_for(self, what: str, count: int) -> None:
        """Wait until ``count`` jobs have started."""
        wait_until(what, lambda: self.count() == count)


@invalid_arguments(
    threads=("threads >= 1", [0, -1, True, 1.5, "2"]),
    max_pending=("max_pending >= 1", [0, -1, True, 2.0]),
)
def test_a_refresher_with_a_bad_figure_is_a_value_error_naming_it(
    kwargs: dict[str, Any], message: str
) -> None:
    figures = {"threads": 1, **kwargs}
    assert_value_error(lambda: Refresher(**figures), message)


def test_an_idle_thread_takes_the_next_job_and_a_thread_starts_only_when_none_is_idle() -> None:
    refresher = Refresher(4, name="idle-first")
    jobs = HeldJobs()
    try:
        for key in ("a", "b", "c"):
            assert refresher.submit(key, jobs.job(key))
        jobs.wait_for("a, b and c to run", 3)
        assert len(threads_named("idle-first-")) == 3
        jobs.gate.set()
        # The refresher's own count of the threads waiting for a job: all three.
        wait_until("the three threads to be idle", lambda: refresher._idle == 3)
        jobs.gate.clear()
        for started, key in enumerate(("d", "e", "f"), start=4):
            assert refresher.submit(key, jobs.job(key))
            jobs.wait_for(f"{key} to run", started)
            assert len(threads_named("idle-first-")) == 3  # an idle thread took it
        assert refresher.submit("g", jobs.job("g"))  # no thread idle: a fourth starts for it
        jobs.wait_for("g to run while d, e and f hold their threads", 7)
        assert len(threads_named("idle-first-")) == 4
        # Daemon threads: a refresh never keeps the process from exiting.
        assert all(thread.daemon for thread in threads_named("idle-first-"))
    finally:
        jobs.gate.set()
        refresher.close(JOIN_TIMEOUT)


def test_every_job_beyond_the_bound_is_counted_as_dropped() -> None:
    refresher = Refresher(1, max_pending=1)
    jobs = HeldJobs()
    try:
        assert refresher.submit("running", jobs.job("running"))
        jobs.wait_for("the first job to run", 1)
        assert refresher.submit("waiting", jobs.job("waiting"))
        assert not refresher.submit("x", jobs.job("x"))
        assert not refresher.submit("y", jobs.job("y"))
        assert refresher.dropped == 2
        jobs.gate.set()
        wait_until("the waiting job to run", lambda: not refreshing(refresher, "waiting"))
        assert jobs.started == ["running", "waiting"]
    finally:
        jobs.gate.set()
        refresher.close(JOIN_TIMEOUT)


def test_by_default_256_jobs_wait_and_the_next_is_dropped() -> None:
    refresher = Refresher(1)
    jobs = HeldJobs()
    try:
        assert refresher.submit("running", jobs.job("running"))
        jobs.wait_for("the first job to run", 1)
        assert all(refresher.submit(n, jobs.job(str(n))) for n in range(256))
        assert not refresher.submit(256, jobs.job("256"))
        assert refresher.dropped == 1
    finally:
        jobs.gate.set()
        refresher.close(JOIN_TIMEOUT)


def test_close_waits_for_a_running_job_no_longer_than_its_timeout(threads: ThreadRunner) -> None:
    refresher = Refresher(1, name="closed-early")
    jobs = HeldJobs()
    try:
        assert refresher.submit("held", jobs.job("held"))
        jobs.wait_for("the job to run", 1)
        closing: Outcome = start_call(threads, lambda: refresher.close(0.01), name="close")
        closing.wait_done()  # returned although the job still holds its thread
        assert closing.error is None and refreshing(refresher, "held")
        assert not refresher.submit("late", jobs.job("late"))
    finally:
        jobs.gate.set()
        refresher.close(JOIN_TIMEOUT)
    assert not threads_named("closed-early-")
