"""Tests of ColdPath: the layers of a request (warm-cache bypass, same-key singleflight, cache
recheck, the cold limiter, then build and publish), each test named after what it checks.

A "build" here is a counted callable standing in for the database scan: a scenario that
promises "no database work" is checked by the build log staying unchanged.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import (
    NOT_FOUND,
    Answer,
    Busy,
    Cancelled,
    ColdLimiter,
    ColdPath,
    ColdPathStats,
    SingleFlight,
    TTLCache,
)
from tests.support.caches import DictCache
from tests.support.limiter import LIMITER_FIELDS, PATH_FIELDS, start_acquire
from tests.support.threads import Outcome, ThreadRunner, leader_and_followers, start_call
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

_DEFAULT = object()


# -- helpers ----------------------------------------------------------------------------------


class BuildLog:
    """Makes build callables and records every build that really ran, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.keys: list[Any] = []
        self._started: dict[Any, threading.Event] = {}

    def started(self, key: Any) -> threading.Event:
        with self._lock:
            return self._started.setdefault(key, threading.Event())

    def count(self, key: Any = _DEFAULT) -> int:
        with self._lock:
            return len(self.keys) if key is _DEFAULT else self.keys.count(key)

    def build(
        self,
        key: Any,
        value: Any = _DEFAULT,
        *,
        hold: threading.Event | None = None,
        error: BaseException | None = None,
    ) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                self.keys.append(key)
            self.started(key).set()
            if hold is not None:
                assert hold.wait(5.0), f"build {key!r} was never let go"
            if error is not None:
                raise error
            return f"report:{key}" if value is _DEFAULT else value

        return run


def start_get(
    threads: ThreadRunner,
    path: ColdPath,
    key: Any,
    build: Callable[[], Any],
    cancel: Any = None,
    name: str = "request",
) -> Outcome:
    """``path.get(key, build, cancel)`` in a thread of ``threads``."""
    return start_call(threads, lambda: path.get(key, build, cancel), name=name)


def followers_of(path: ColdPath, key: Any) -> int:
    """White box: followers that joined the key's in-flight call (-1: none in flight)."""
    flight = path.flight
    with flight._lock:
        call = flight._calls.get(key)
        return -1 if call is None else call.followers


class SpyLimiter:
    """A duck-typed limiter (not a ColdLimiter) that counts acquire() calls and can hold each
    call at its entry until ``proceed`` is set."""

    def __init__(self, inner: ColdLimiter, gated: bool = False) -> None:
        self.inner = inner
        self.acquire_calls = 0
        self.entered = threading.Event()
        self.proceed = threading.Event()
        if not gated:
            self.proceed.set()

    def acquire(self, cancel: Any = None, client: Any = None) -> Any:
        self.acquire_calls += 1
        self.entered.set()
        assert self.proceed.wait(5.0), "SpyLimiter never told to proceed"
        return self.inner.acquire(cancel, client)

    def stats(self) -> Any:
        return self.inner.stats()


def limiter_diff(before: Any, after: Any) -> dict[str, tuple[Any, Any]]:
    b, a = before.as_dict(), after.as_dict()
    return {k: (b[k], a[k]) for k in b if b[k] != a[k]}


# -- composition, stats -----------------------------------------------------------------------


def test_default_cache_is_a_five_minute_256_entry_ttl_cache() -> None:
    path = ColdPath(ColdLimiter())
    assert isinstance(path.cache, TTLCache)
    assert (path.cache.maxsize, path.cache.ttl) == (256, 300.0)


def test_cold_then_warm() -> None:
    lim = ColdLimiter()
    path = ColdPath(lim)
    log = BuildLog()
    assert path.get("k", log.build("k")) == "report:k"
    assert path.get("k", log.build("k")) == "report:k"
    assert log.count() == 1
    s = path.stats()
    assert (s.hits, s.misses, s.builds, s.coalesced, s.acquired, s.active) == (1, 1, 1, 0, 1, 0)


def test_stats_has_path_and_limiter_figures_and_is_frozen() -> None:
    path = ColdPath(ColdLimiter(active=3, queue=5, wait=2.0))
    path.get("k", lambda: "v")
    s = path.stats()
    assert isinstance(s, ColdPathStats)
    d = s.as_dict()
    assert (LIMITER_FIELDS | PATH_FIELDS) <= set(d)
    assert (d["capacity_active"], d["capacity_queue"], d["wait"]) == (3, 5, 2.0)
    assert (d["misses"], d["builds"], d["acquired"]) == (1, 1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.hits = 5  # type: ignore[misc]


def test_build_runs_with_no_lock_held_and_the_slot_is_released_before_publishing() -> None:
    lim = ColdLimiter()
    active_when_cached: list[int] = []

    class RecordingCache(DictCache):
        def set(self, key: Any, value: Any) -> None:
            active_when_cached.append(lim.stats().active)
            super().set(key, value)

    path = ColdPath(lim, cache=RecordingCache())

    def build() -> str:
        assert not lim._lock.locked()
        assert not path._lock.locked()
        assert not path.flight._lock.locked()
        assert lim.stats().active == 1
        return "v"

    assert path.get("k", build) == "v"
    assert active_when_cached == [0]


def test_custom_duck_typed_cache_is_used() -> None:
    cache = DictCache()
    path = ColdPath(ColdLimiter(), cache=cache)
    log = BuildLog()
    assert path.get("k", log.build("k")) == "report:k"
    assert cache.data == {"k": "report:k"}
    assert path.get("k", log.build("k")) == "report:k"
    assert log.count() == 1
    # warm miss, leader's recheck, publish; then one warm hit
    assert cache.calls == [("get", "k"), ("get", "k"), ("set", "k"), ("get", "k")]


def test_cache_recheck_leader_finds_the_value_and_builds_nothing() -> None:
    class FilledMeanwhile(DictCache):
        """Misses on the first get (the warm check), hits on the second (the recheck): as if
        another leader published the value in between."""

        def get(self, key: Any) -> Any:
            super().get(key)
            return None if len(self.calls) == 1 else "published by another leader"

    spy = SpyLimiter(ColdLimiter())
    path = ColdPath(spy, cache=FilledMeanwhile())
    log = BuildLog()
    answer = path.fetch("k", log.build("k"))
    # Found in the cache, by the leader's recheck: a hit, not a value this call stored.
    assert answer == ("published by another leader", "hit", None)
    assert log.count() == 0
    assert spy.acquire_calls == 0  # the limiter was never asked
    s = path.stats()
    assert (s.misses, s.builds, s.acquired) == (1, 0, 0)


def test_a_plain_caches_warm_answers_are_hits_counted_one_each() -> None:
    """A cache without ``lookup`` (get/set only): its warm answers are hits, with no
    freshness known, and each is counted once."""
    path = ColdPath(ColdLimiter(), cache=DictCache())
    log = BuildLog()
    assert path.fetch("k", log.build("k")) == ("report:k", "stored", None)
    assert path.fetch("k", log.build("k")) == ("report:k", "hit", None)
    assert path.fetch("k", log.build("k")) == ("report:k", "hit", None)
    counts = path.counts()
    assert (counts.hits, counts.misses, counts.builds) == (2, 1, 1)
    assert path.stats().hits == 2 and log.count() == 1


@pytest.mark.parametrize("cache", [TTLCache, DictCache], ids=["TTLCache", "plain"])
def test_fetch_warm_fields_are_fetch_warms_answer_as_a_plain_tuple(cache: Any) -> None:
    """What the Flask extension asks on every request: fetch_warm's Answer, its fields in a
    plain tuple; a miss is None and counted by neither."""
    path = ColdPath(ColdLimiter(), cache=cache())
    log = BuildLog()
    assert path.fetch_warm_fields("k", log.build("k")) is None
    assert path.fetch_warm("k", log.build("k")) is None
    assert path.fetch("k", log.build("k")).status == "stored"
    fields = path.fetch_warm_fields("k", log.build("k"))
    answer = path.fetch_warm("k", log.build("k"))
    assert type(fields) is tuple and type(answer) is Answer
    assert fields[:2] == answer[:2] == ("report:k", "hit")
    assert (fields[2] is None) == (answer.fresh_for is None) == (cache is DictCache)
    counts = path.counts()
    assert (counts.hits, counts.misses, counts.builds) == (2, 1, 1) and log.count() == 1


def test_a_cache_set_on_the_path_is_the_one_its_next_request_reads() -> None:
    path = ColdPath(ColdLimiter())
    path.cache.set("k", "old")
    path.cache = DictCache()
    assert path.fetch_warm_fields("k", lambda: "never") is None
    path.cache.set("k", "new")
    assert path.get("k", lambda: "never") == "new"


@pytest.mark.parametrize("result", [NOT_FOUND, None], ids=["NOT_FOUND", "None"])
def test_not_found_and_none_pass_through_and_are_not_cached(result: Any) -> None:
    cache = DictCache()
    path = ColdPath(ColdLimiter(), cache=cache)
    log = BuildLog()
    assert path.get("k", log.build("k", result)) is result
    assert "k" not in cache.data
    assert path.get("k", log.build("k", result)) is result
    assert log.count("k") == 2  # built again: nothing was cached
    assert path.stats().active == 0


def test_not_found_is_falsy_singleton_with_a_readable_repr() -> None:
    import pickle

    assert not NOT_FOUND
    assert repr(NOT_FOUND) == "reachlimit.NOT_FOUND"
    assert type(NOT_FOUND)() is NOT_FOUND
    assert pickle.loads(pickle.dumps(NOT_FOUND)) is NOT_FOUND


def test_cancel_already_set_raises_cancelled_and_builds_nothing() -> None:
    lim = ColdLimiter()
    path = ColdPath(lim)
    log = BuildLog()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        path.get("k", log.build("k"), cancel)
    assert log.count() == 0
    assert path.cache.get("k") is None
    s = path.stats()
    assert (s.active, s.queued, s.acquired, s.builds) == (0, 0, 0, 0)
    assert path.flight.in_flight() == 0


# -- a leader beyond the queue ----------------------------------------------------------------


def test_a_leader_beyond_the_queue_is_refused_at_once_without_a_deadline_or_a_build(
    threads: Any, fake_clock: Any
) -> None:
    lim = ColdLimiter(active=2, queue=8, clock=fake_clock)
    path = ColdPath(lim)
    log = BuildLog()
    release_builds = threading.Event()
    requests = []
    for i in range(2):
        key = f"k{i}"
        requests.append(
            start_get(threads, path, key, log.build(key, hold=release_builds), name=key)
        )
        assert log.started(key).wait(5.0)
    for i in range(2, 10):
        key = f"k{i}"
        requests.append(start_get(threads, path, key, log.build(key), name=key))
        wait_until(f"{key} queued", lambda i=i: lim.stats().queued == i - 1)
    assert log.keys == ["k0", "k1"]  # queued leaders run no build
    assert not any(r.done.is_set() for r in requests)
    before = path.stats()
    for n in range(1, 4):
        with pytest.raises(Busy) as info:
            path.get("k10", log.build("k10"))
        assert (info.value.reason, info.value.retry_after) == ("queue_full", 2)
        assert fake_clock.calls_from_this_thread() == 0  # no deadline was created
        assert log.keys == ["k0", "k1"]  # no build ran
        assert limiter_diff(before, path.stats()) == {
            "rejected_full": (0, n),
            "misses": (before.misses, before.misses + n),
        }
    assert path.cache.get("k10") is None
    release_builds.set()
    threads.join_all()
    assert [r.value for r in requests] == [f"report:k{i}" for i in range(10)]
    assert sorted(log.keys) == sorted(f"k{i}" for i in range(10))  # each built exactly once
    s = path.stats()
    assert (s.active, s.queued, s.builds, s.acquired, s.peak_active, s.peak_queued) == (
        0,
        0,
        10,
        10,
        2,
        8,
    )


# -- warm hits under saturation ---------------------------------------------------------------


def test_warm_hits_succeed_while_the_limiter_is_saturated(threads: Any) -> None:
    lim = ColdLimiter(active=2, queue=8)
    spy = SpyLimiter(lim)
    path = ColdPath(spy)
    path.cache.set("warm", "cached report")
    holders = [lim.acquire(), lim.acquire()]
    cancels = [threading.Event() for _ in range(8)]
    for i, cancel in enumerate(cancels):
        start_acquire(threads, lim, cancel)
        wait_until(f"{i + 1} queued", lambda i=i: lim.stats().queued == i + 1)
    with pytest.raises(Busy):  # saturated: a cold request is refused
        path.get("cold", lambda: "never built")
    assert spy.acquire_calls == 1
    before = lim.stats()

    def must_not_build() -> str:
        raise AssertionError("a warm request ran a build")

    for _ in range(20):
        assert path.get("warm", must_not_build) == "cached report"
    assert spy.acquire_calls == 1  # the limiter was never touched by a warm request
    assert lim.stats() == before  # acquired and every other figure unchanged
    assert path.stats().hits == 20
    for cancel in cancels:
        cancel.set()
    threads.join_all()
    for grant in holders:
        grant.release()


# -- same-key requests: one build -------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 8])
def test_same_key_requests_run_one_build(threads: Any, n: int) -> None:
    lim = ColdLimiter(active=2, queue=8)
    path = ColdPath(lim)
    log = BuildLog()
    hold = threading.Event()
    report = {"rows": [1, 2, 3]}
    build = log.build("k", report, hold=hold)
    requests = [start_get(threads, path, "k", build, name=f"r{i}") for i in range(n)]
    assert log.started("k").wait(5.0)
    wait_until("all followers joined", lambda: followers_of(path, "k") == n - 1)
    assert not any(r.done.is_set() for r in requests)
    hold.set()
    threads.join_all()
    assert log.count() == 1
    assert all(r.error is None and r.value is report for r in requests)
    s = path.stats()
    assert (s.builds, s.coalesced, s.misses, s.acquired, s.active) == (1, n - 1, n, 1, 0)
    assert path.cache.get("k") is report


# -- only promoted leaders build --------------------------------------------------------------


def test_only_a_promoted_leader_builds(threads: Any) -> None:
    lim = ColdLimiter(active=1, queue=2)
    path = ColdPath(lim)
    log = BuildLog()
    hold_a = threading.Event()
    a = start_get(threads, path, "a", log.build("a", hold=hold_a), name="a")
    assert log.started("a").wait(5.0)
    hold_b = threading.Event()
    b = start_get(threads, path, "b", log.build("b", hold=hold_b), name="b")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    c = start_get(threads, path, "c", log.build("c"), name="c")
    wait_until("2 queued", lambda: lim.stats().queued == 2)
    with pytest.raises(Busy) as info:
        path.get("d", log.build("d"))
    assert info.value.reason == "queue_full"
    assert log.keys == ["a"]  # b and c are queued: no build yet; d was refused
    hold_a.set()
    a.wait_done()
    assert log.started("b").wait(5.0)  # b was promoted and builds
    assert log.keys == ["a", "b"]  # c still waits behind b
    assert not c.done.is_set()
    hold_b.set()
    threads.join_all()
    assert log.keys == ["a", "b", "c"]
    assert [r.value for r in (a, b, c)] == ["report:a", "report:b", "report:c"]
    assert path.cache.get("d") is None
    assert lim.stats().active == 0


# -- build errors -----------------------------------------------------------------------------


def test_a_build_error_reaches_everyone_is_not_cached_and_frees_the_slot(threads: Any) -> None:
    lim = ColdLimiter(active=1, queue=0)
    cache = DictCache()
    path = ColdPath(lim, cache=cache)
    log = BuildLog()
    hold = threading.Event()
    error = OSError("database is locked")
    build = log.build("k", hold=hold, error=error)
    leader, followers = leader_and_followers(
        lambda name: start_get(threads, path, "k", build, name=name), log.started("k"), 3,
        lambda: followers_of(path, "k"),
    )
    assert lim.stats().active == 1
    hold.set()
    threads.join_all()
    assert leader.error is error
    assert all(f.error is error for f in followers)
    assert log.count() == 1
    assert cache.data == {}  # not cached
    s = path.stats()
    assert (s.active, s.builds, s.coalesced) == (0, 1, 3)  # followers shared the error
    # The slot is really free (queue=0 would refuse otherwise) and the next call builds again.
    assert path.get("k", log.build("k", "fixed")) == "fixed"
    assert log.count() == 2


# -- refusals and cancellations seen by followers ---------------------------------------------


def test_followers_of_a_timed_out_leader_get_the_same_busy(threads: Any, fake_clock: Any) -> None:
    lim = ColdLimiter(active=1, queue=1, wait=3.0, clock=fake_clock)
    path = ColdPath(lim)
    log = BuildLog()
    holder = lim.acquire()
    build = log.build("k")
    leader = start_get(threads, path, "k", build, cancel=threading.Event(), name="leader")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    followers = [start_get(threads, path, "k", build, name=f"f{i}") for i in range(3)]
    wait_until("3 followers", lambda: followers_of(path, "k") == 3)
    wait_until("leader's deadline fixed", lambda: fake_clock.calls >= 2)
    fake_clock.advance(10.0)
    threads.join_all()
    assert isinstance(leader.error, Busy) and leader.error.reason == "timeout"
    assert all(f.error is leader.error for f in followers)
    assert log.count() == 0
    assert path.cache.get("k") is None
    holder.release()
    s = path.stats()
    assert (s.active, s.queued, s.rejected_timeout, s.builds) == (0, 0, 1, 0)


def test_followers_of_a_refused_leader_get_the_same_busy(threads: Any) -> None:
    lim = ColdLimiter(active=1, queue=0)
    spy = SpyLimiter(lim, gated=True)  # holds the leader at the limiter's door
    path = ColdPath(spy)
    log = BuildLog()
    holder = lim.acquire()
    build = log.build("k")
    leader, followers = leader_and_followers(
        lambda name: start_get(threads, path, "k", build, name=name), spy.entered, 4,
        lambda: followers_of(path, "k"),
    )
    spy.proceed.set()
    threads.join_all()
    assert isinstance(leader.error, Busy) and leader.error.reason == "queue_full"
    assert all(f.error is leader.error for f in followers)
    assert spy.acquire_calls == 1  # followers never asked the limiter
    assert log.count() == 0
    assert path.cache.get("k") is None
    holder.release()
    assert lim.stats().rejected_full == 1
    assert path.stats().coalesced == 4  # the followers shared the refusal


def test_a_cancelled_leader_does_not_fail_its_followers(threads: Any) -> None:
    lim = ColdLimiter(active=1, queue=2)
    path = ColdPath(lim)
    log = BuildLog()
    holder = lim.acquire()
    build = log.build("k")
    leader_cancel = threading.Event()
    leader = start_get(threads, path, "k", build, cancel=leader_cancel, name="leader")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    followers = [
        start_get(threads, path, "k", build, cancel=threading.Event(), name=f"f{i}")
        for i in range(2)
    ]
    wait_until("2 followers", lambda: followers_of(path, "k") == 2)
    leader_cancel.set()
    leader.wait_done()
    assert isinstance(leader.error, Cancelled)
    # One follower took over as leader and queued; the other follows it.
    wait_until(
        "a follower became the new leader",
        lambda: lim.stats().queued == 1 and followers_of(path, "k") == 1,
    )
    assert log.count() == 0
    assert not any(f.done.is_set() for f in followers)
    holder.release()
    threads.join_all()
    assert all(f.error is None and f.value == "report:k" for f in followers)
    assert log.count() == 1
    s = path.stats()
    assert (s.builds, s.coalesced, s.cancelled, s.active, s.queued) == (1, 1, 1, 0, 0)


def test_a_cancelled_leader_alone_raises_cancelled_and_caches_nothing(threads: Any) -> None:
    lim = ColdLimiter(active=1, queue=1)
    path = ColdPath(lim)
    log = BuildLog()
    holder = lim.acquire()
    cancel = threading.Event()
    leader = start_get(threads, path, "k", log.build("k"), cancel=cancel, name="leader")
    wait_until("1 queued", lambda: lim.stats().queued == 1)
    cancel.set()
    leader.wait_done()
    assert isinstance(leader.error, Cancelled)
    assert path.flight.in_flight() == 0
    holder.release()
    assert (log.count(), path.cache.get("k")) == (0, None)
    assert (lim.stats().active, lim.stats().queued) == (0, 0)


def test_a_follower_can_cancel_without_disturbing_the_leader(threads: Any) -> None:
    lim = ColdLimiter()
    path = ColdPath(lim)
    log = BuildLog()
    hold = threading.Event()
    build = log.build("k", hold=hold)
    leader = start_get(threads, path, "k", build, name="leader")
    assert log.started("k").wait(5.0)
    cancel = threading.Event()
    quitter = start_get(threads, path, "k", build, cancel=cancel, name="quitter")
    wait_until("1 follower", lambda: followers_of(path, "k") == 1)
    cancel.set()
    quitter.wait_done()
    assert isinstance(quitter.error, Cancelled)
    assert not leader.done.is_set()
    hold.set()
    threads.join_all()
    assert leader.value == "report:k"
    assert log.count() == 1
    assert path.stats().coalesced == 0


def test_a_single_flight_passed_in_is_the_one_used() -> None:
    class CountingFlight(SingleFlight[Any]):
        calls = 0

        def do(self, key: Any, fn: Callable[[], Any], cancel: Any = None) -> tuple[Any, bool]:
            self.calls += 1
            return super().do(key, fn, cancel)

    flight = CountingFlight()
    path = ColdPath(ColdLimiter(), flight=flight)
    assert path.flight is flight
    assert path.get("k", lambda: "v") == "v"
    assert flight.calls == 1


class ColdFlight:
    """A flight with ``do_cold`` (what a shared flight may have): it records what ColdPath
    hands it and leads through a SingleFlight; its plain ``do`` must not be used."""

    def __init__(self) -> None:
        self.inner: SingleFlight[Any] = SingleFlight()
        self.calls: list[tuple[Any, Any, Any]] = []

    def do(self, key: Any, fn: Callable[[], Any], cancel: Any = None) -> tuple[Any, bool]:
        raise AssertionError("ColdPath called do() on a flight that has do_cold()")

    def do_cold(
        self, key: Any, lead: Callable[[], Any], cancel: Any, client: Any
    ) -> tuple[Any, bool]:
        self.calls.append((key, cancel, client))
        return self.inner.do(key, lead, cancel)


def test_a_flight_with_do_cold_gets_the_key_the_cancel_token_and_the_client() -> None:
    asked: list[Any] = []

    class ClientLimiter(SpyLimiter):
        def acquire(self, cancel: Any = None, client: Any = None) -> Any:
            asked.append((cancel, client))
            return super().acquire(cancel, client)

    flight = ColdFlight()
    path = ColdPath(ClientLimiter(ColdLimiter()), flight=flight)  # type: ignore[arg-type]
    cancel = threading.Event()
    answer = path.fetch("k", lambda: "v", cancel, client="10.0.0.1")
    assert answer == ("v", "stored", None)
    assert flight.calls == [("k", cancel, "10.0.0.1")]
    assert asked == [(cancel, "10.0.0.1")]  # its lead is the path's: the limiter, the client


def test_a_shared_limiters_backend_degraded_and_lost_leases_reach_the_paths_figures() -> None:
    inner = ColdLimiter(active=2, queue=3)

    class SharedFigures(SpyLimiter):
        def stats(self) -> Any:
            figures = self.inner.stats().as_dict()
            return types.SimpleNamespace(
                **figures, backend="redis", degraded=True, lease_lost=3, extra="not copied"
            )

    stats = ColdPath(SharedFigures(inner)).stats()  # type: ignore[arg-type]
    assert (stats.backend, stats.degraded, stats.lease_lost) == ("redis", True, 3)
    assert (stats.capacity_active, stats.capacity_queue) == (2, 3)
    assert "extra" not in stats.as_dict()


def test_a_fresh_path_and_limiter_report_all_zero_figures() -> None:
    stats = ColdPath(ColdLimiter(active=3, queue=5, wait=2.5)).stats()
    counters = {name: value for name, value in stats.as_dict().items()
                if name not in ("capacity_active", "capacity_queue", "wait", "backend")}
    assert counters and set(counters.values()) == {0}, counters
    assert (stats.backend, stats.degraded) == ("local", False)
    assert "peak_active" in counters and "peak_queued" in counters
    assert (stats.capacity_active, stats.capacity_queue, stats.wait) == (3, 5, 2.5)


@pytest.mark.parametrize("outcome", ["refused", "raised"])
def test_a_lone_leader_that_fails_leaves_no_reference_cycle(outcome: str) -> None:
    """Freed by reference counting alone: a saturated server refuses most often, and a cycle
    per refusal (the error holding its flight call through its traceback) would leave that
    much work to the garbage collector."""
    limiter = ColdLimiter(active=1, queue=0)
    path = ColdPath(limiter)

    def failing_build() -> Any:
        raise RuntimeError("scan failed")

    held = limiter.acquire() if outcome == "refused" else None
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            with pytest.raises((Busy, RuntimeError)):
                path.get("k", failing_build)
        # Only the cycles of these calls count: a daemon thread left by an earlier test may
        # make garbage of its own meanwhile (the collector sees the whole process).
        assert cyclic_garbage(ours=lambda o: (
            isinstance(o, Busy)
            or (isinstance(o, RuntimeError) and o.args == ("scan failed",))
            or type(o).__module__ in ("reachlimit._flight", "reachlimit._path")
        )) == []
    finally:
        gc.enable()
        if held is not None:
            held.release()


def cyclic_garbage(ours: Callable[[object], bool]) -> list[object]:
    """Collect, and return the objects the collector found only in cycles for which
    ``ours`` is true (the rest is freed as usual)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [o for o in gc.garbage if ours(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_cyclic_garbage_finds_a_cycle_of_ours() -> None:
    """The check above can fail: an error caught with its traceback kept in a local is a
    cycle (error -> traceback -> frame -> error), and it is found."""
    gc.collect()
    gc.disable()
    try:
        def keep() -> None:
            try:
                raise RuntimeError("scan failed")
            except RuntimeError as exc:
                kept = exc  # noqa: F841 (the frame holds the error that holds the frame)

        keep()
        found = cyclic_garbage(ours=lambda o: isinstance(o, RuntimeError))
        assert [o.args for o in found] == [("scan failed",)]
    finally:
        gc.enable()
