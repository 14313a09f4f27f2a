"""A refresh that finds its thing gone removes the entry, and a refresh that ends without a
value (refused, failed, found nothing) holds its key back for a backoff: in the core, through
the Flask extension, and on a real redis-server.

Every clock is injected (the cache's and the path's backoff clock are one ``FakeClock``; on
Redis an entry is made stale with ``PEXPIRE``), so a backoff is crossed by moving the clock,
never by sleeping. A refresh runs on the refresher's threads; the test waits for the
refresher to hold no job of the key (``busy``), which ``fetch`` sets before it returns when it
hands one over: after that wait, every refresh asked for has run.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from reachlimit import NOT_FOUND, ColdLimiter, ColdPath, Refresher, TTLCache
from reachlimit._refresh import RefreshBackoff
from reachlimit.flask import ReachLimit
from reachlimit.redis import RedisCache, RedisColdLimiter, RedisSingleFlight
from tests.support.clock import FakeClock
from tests.support.flask_ext import ExtensionReads
from tests.support.redis_clients import CountingRedis
from tests.support.refreshes import Builds, refreshing
from tests.support.threads import JOIN_TIMEOUT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

TTL, STALE = 10.0, 30.0

#: What a build returns for "the thing is gone": both are never cached.
GONE = [pytest.param(NOT_FOUND, id="NOT_FOUND"), pytest.param(None, id="None")]


class NoForget:
    """A cache with a stale window but no ``forget`` (a cache made before it existed)."""

    def __init__(self, inner: TTLCache[Any], *, ttl: bool = True) -> None:
        self.inner = inner
        self.stale = inner.stale
        if ttl:
            self.ttl = inner.ttl

    def get(self, key: Any) -> Any:
        return self.inner.get(key)

    def set(self, key: Any, value: Any) -> None:
        self.inner.set(key, value)

    def lookup(self, key: Any) -> Any:
        return self.inner.lookup(key)

    def put(self, key: Any, value: Any, build_time: float) -> None:
        self.inner.put(key, value, build_time)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


def make_path(
    paths: list[ColdPath], clock: FakeClock, cache: Any = None, *, active: int = 2,
    queue: int = 8, stale: float = STALE, refresher: Refresher | None = None,
) -> ColdPath:
    if cache is None:
        cache = TTLCache(16, TTL, stale=stale, clock=clock)
    path = ColdPath(
        ColdLimiter(active, queue, wait=1.0), cache, refresher=refresher, clock=clock
    )
    paths.append(path)
    return path


def settle(path: ColdPath, key: Any = "k") -> None:
    """Wait until no refresh of ``key`` waits or runs (every one asked for has ended)."""
    wait_until(f"the refresh of {key!r} to end", lambda: not refreshing(path.refresher, key))


def stale_entry(path: ColdPath, clock: FakeClock) -> Builds:
    """A build whose value ("v1") was stored under "k" and is now 1 s past its TTL."""
    build = Builds()
    assert path.fetch("k", build).value == "v1"
    clock.now += TTL + 1.0
    return build


def stale_hit(path: ColdPath, build: Builds, key: Any = "k") -> Any:
    """A fetch that must be answered stale, then the refresh it may have handed over ended."""
    answer = path.fetch(key, build)
    assert answer.status == "stale", answer
    settle(path, key)
    return answer.value


# -- the core ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gone", GONE)
def test_a_refresh_that_finds_nothing_removes_the_entry_and_the_next_get_builds(
    clock: FakeClock, paths: list[ColdPath], gone: Any
) -> None:
    path = make_path(paths, clock)
    build = Builds()
    assert path.fetch("k", build).status == "stored"
    clock.now += TTL + 1.0  # stale
    build.gone = [gone]
    assert stale_hit(path, build) == "v1"  # answered at once; the refresh finds nothing
    assert build.runs == 2
    assert path.cache.lookup("k") is None  # type: ignore[attr-defined]
    answer = path.fetch("k", build)  # a cold miss, built in the request: not "v1" stale
    assert (answer.value, answer.status) == (gone, "stored")
    build.gone = []
    answer = path.fetch("k", build)  # the thing is back: built and stored again
    assert (answer.value, answer.status) == ("v4", "stored")
    counts = path.counts()
    assert (counts.misses, counts.stale, counts.refreshed, counts.refresh_failed) == (3, 1, 1, 0)


def test_a_cache_that_cannot_forget_keeps_serving_stale_logs_once_and_backs_off(
    clock: FakeClock, paths: list[ColdPath], caplog: pytest.LogCaptureFixture
) -> None:
    path = make_path(paths, clock, NoForget(TTLCache(16, TTL, stale=STALE, clock=clock)))
    build = stale_entry(path, clock)
    build.gone = [NOT_FOUND]
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        assert stale_hit(path, build) == "v1"
        for _ in range(9):  # within the backoff (the TTL): no refresh handed over
            clock.now += 1.0
            assert stale_hit(path, build) == "v1"
        assert build.runs == 2
        clock.now += 1.0  # the backoff over: tried again, finds nothing again
        assert stale_hit(path, build) == "v1"
        assert build.runs == 3
    logged = [r.getMessage() for r in caplog.records if "refresh of 'k'" in r.getMessage()]
    assert len(logged) == 1 and "NoForget has no forget(key)" in logged[0]
    counts = path.counts()
    assert (counts.refreshed, counts.refresh_failed, counts.stale) == (2, 0, 11)


class ForgetFails(NoForget):
    """A cache with ``forget`` that raises ``error`` (a shared cache whose store is down,
    say): it could not remove the entry, which is not the same as having no ``forget``."""

    def __init__(self, inner: TTLCache[Any], error: BaseException) -> None:
        super().__init__(inner)
        self.error = error
        self.forgets = 0

    def forget(self, key: Any) -> bool:
        self.forgets += 1
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("store down"), TypeError("bad key")],
                         ids=["RuntimeError", "TypeError"])
def test_a_refresh_whose_entry_cannot_be_removed_is_a_failure_held_back(
    clock: FakeClock, paths: list[ColdPath], caplog: pytest.LogCaptureFixture,
    error: BaseException,
) -> None:
    """Even a TypeError: the cache has ``forget``, so it is a failure to remove the entry,
    logged with the cache's error (not the warning of a cache that cannot forget)."""
    cache = ForgetFails(TTLCache(16, TTL, stale=STALE, clock=clock), error)
    path = make_path(paths, clock, cache)
    build = stale_entry(path, clock)
    build.gone = [NOT_FOUND]
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        assert stale_hit(path, build) == "v1"
        assert cache.forgets == 1
        clock.now += TTL - 0.5  # within the backoff (the TTL): the entry still served
        assert stale_hit(path, build) == "v1"
        assert build.runs == 2
    counts = path.counts()
    assert (counts.refresh_failed, counts.refreshed, counts.stale) == (1, 0, 2)
    logged = [r.getMessage() for r in caplog.records if "refresh of 'k'" in r.getMessage()]
    assert len(logged) == 1, logged
    assert f"could not be removed: {type(error).__name__}: {error}" in logged[0]
    assert "has no forget" not in logged[0]
    clock.now += 0.5  # the backoff over: tried again
    assert stale_hit(path, build) == "v1"
    assert (build.runs, cache.forgets, path.counts().refresh_failed) == (3, 2, 2)


def test_a_refresh_that_finds_a_fresher_entry_ends_the_keys_episode(
    clock: FakeClock, paths: list[ColdPath], caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing built, but the key has a value again (somebody else refreshed it): its next
    failure starts a new episode, logged again. The path runs its refreshes on the
    refresher it was given, whose one thread the test holds to order the steps."""
    refresher = Refresher(1)
    path = make_path(paths, clock, refresher=refresher)
    assert path.refresher is refresher
    build = stale_entry(path, clock)
    build.error = RuntimeError("database down")

    def logged() -> int:
        return len([r for r in caplog.records if "refresh of 'k'" in r.getMessage()])

    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        assert stale_hit(path, build) == "v1"
        assert (logged(), path.counts().refresh_failed) == (1, 1)
        clock.now += TTL  # the backoff over
        gate, started = threading.Event(), threading.Event()

        def hold() -> None:
            started.set()
            assert gate.wait(JOIN_TIMEOUT)

        assert refresher.submit("held", hold)  # the refresher's one thread, held
        assert started.wait(JOIN_TIMEOUT)
        try:
            assert path.fetch("k", build).status == "stale"  # its refresh waits its turn
            path.cache.set("k", "someone else's")  # refreshed meanwhile (another process)
        finally:
            gate.set()
        settle(path, "k")
        assert build.runs == 2 and path.counts().refreshed == 1  # found, not built
        clock.now += TTL + 1.0  # stale again, and the refresh fails again: a new episode
        assert stale_hit(path, build) == "someone else's"
        assert (logged(), path.counts().refresh_failed) == (2, 2)


@pytest.mark.parametrize("how", ["raises", "refused"])
def test_a_refresh_that_fails_is_tried_once_per_backoff(
    clock: FakeClock, paths: list[ColdPath], caplog: pytest.LogCaptureFixture, how: str
) -> None:
    path = make_path(paths, clock, active=1, queue=0)
    build = stale_entry(path, clock)
    held = None
    if how == "raises":
        build.error = RuntimeError("database down")
    else:
        held = path.limiter.acquire()  # the only slot, no queue: a refresh is refused at once

    def tried() -> int:
        counts = path.counts()
        return counts.refresh_failed if how == "raises" else counts.refresh_refused

    try:
        with caplog.at_level(logging.WARNING, logger="reachlimit"):
            assert stale_hit(path, build) == "v1"
            assert tried() == 1
            for _ in range(19):  # 19 stale hits within the backoff (10 s): none hands one over
                clock.now += 0.5
                assert stale_hit(path, build) == "v1"
            assert tried() == 1
            clock.now += 0.5  # the backoff after the try: tried again
            assert stale_hit(path, build) == "v1"
            assert tried() == 2
    finally:
        if held is not None:
            held.release()
    assert build.runs == (3 if how == "raises" else 1)
    assert path.counts().stale == 21
    assert len([r for r in caplog.records if "refresh of 'k'" in r.getMessage()]) == 1


def test_a_key_built_again_ends_its_backoff(clock: FakeClock, paths: list[ColdPath]) -> None:
    # A cache that does not say its TTL: the backoff is the cap (a minute), longer than the
    # entry's TTL plus its stale window, so only the build can end it here.
    path = make_path(paths, clock, NoForget(TTLCache(16, TTL, stale=5.0, clock=clock), ttl=False))
    assert path.refresh_backoff == ColdPath.REFRESH_BACKOFF_CAP == 60.0
    build = stale_entry(path, clock)
    build.error = RuntimeError("database down")
    stale_hit(path, build)
    assert path.counts().refresh_failed == 1
    clock.now += 5.0  # past the stale window: the next request is a cold miss that builds
    build.error = None
    assert path.fetch("k", build).status == "stored"
    clock.now += TTL + 1.0  # stale again, well within a minute of the failure
    stale_hit(path, build)
    assert path.counts().refreshed == 1 and build.runs == 4


def test_the_backoff_is_the_caches_ttl_at_most_a_minute() -> None:
    limiter = ColdLimiter(1, 0)
    assert ColdPath(limiter, TTLCache(4, 10.0)).refresh_backoff == 10.0
    assert ColdPath(limiter, TTLCache(4, 0.25)).refresh_backoff == 0.25
    assert ColdPath(limiter, TTLCache(4, 3600.0)).refresh_backoff == 60.0
    plain = NoForget(TTLCache(4, 10.0), ttl=False)
    assert ColdPath(limiter, plain).refresh_backoff == 60.0


def test_an_hour_long_ttl_is_tried_again_after_a_minute(
    clock: FakeClock, paths: list[ColdPath]
) -> None:
    path = make_path(paths, clock, TTLCache(16, 3600.0, stale=600.0, clock=clock))
    build = Builds()
    path.fetch("k", build)
    clock.now += 3601.0
    build.error = RuntimeError("database down")
    stale_hit(path, build)
    clock.now += 59.9
    stale_hit(path, build)
    assert path.counts().refresh_failed == 1
    clock.now += 0.1
    stale_hit(path, build)
    assert path.counts().refresh_failed == 2


def test_the_backoff_remembers_at_most_its_limit_of_keys() -> None:
    backoff = RefreshBackoff()
    assert not backoff
    for key in range(RefreshBackoff.LIMIT + 1):
        backoff.hold(key, 100.0, None)
    assert backoff.allows(0, 50.0)  # the oldest, forgotten to make room
    assert not backoff.allows(1, 50.0) and not backoff.allows(RefreshBackoff.LIMIT, 50.0)
    assert backoff.allows(1, 100.0)  # its backoff over
    assert len(backoff._keys) == RefreshBackoff.LIMIT


# -- the Flask extension ------------------------------------------------------------------------


class App(ExtensionReads):
    """``/r/<key>`` answers ``rl.cold(key, build)`` (404 when the build finds nothing);
    ``/c/<key>`` is the same build as an ``@rl.cached()`` view. The warm cache and the path's
    backoff are on the test's clock (``path.cache`` and ``path.clock`` are public)."""

    def __init__(self, clock: FakeClock) -> None:
        self.app = app = Flask("gone")
        app.config.update({"REACHLIMIT_CACHE_TTL": TTL, "REACHLIMIT_STALE": STALE})
        self.rl = rl = ReachLimit(app)
        self.build = build = Builds()

        @app.get("/r/<key>")
        def report(key: str) -> Any:
            value = rl.cold(key, build)
            return ("gone", 404) if value is None or value is NOT_FOUND else {"v": value}

        @app.get("/c/<key>")
        @rl.cached()
        def cached(key: str) -> Any:
            value = build()
            return NOT_FOUND if value is None or value is NOT_FOUND else {"v": value}

        self.path.cache = TTLCache(64, TTL, stale=STALE, clock=clock)
        self.path.clock = clock
        self.seen: set[Any] = set()  # every key the cache held: their refreshes are awaited

    def get(self, url: str) -> Any:
        """A request, then every refresh it handed over ended."""
        self.seen.update(self.keys())
        reply = self.app.test_client().get(url)
        self.seen.update(self.keys())
        wait_until("the refreshes to end",
                   lambda: not any(refreshing(self.path.refresher, k) for k in self.seen))
        return reply

    def keys(self) -> list[Any]:
        return list(self.path.cache._data)  # type: ignore[attr-defined]


@pytest.fixture
def flask_app(clock: FakeClock) -> Iterator[App]:
    a = App(clock)
    yield a
    a.rl.close(a.app)


@pytest.mark.parametrize("url", ["/r/x", "/c/x"])
@pytest.mark.parametrize("gone", GONE)
def test_the_extension_removes_an_entry_whose_refresh_finds_nothing(
    flask_app: App, clock: FakeClock, url: str, gone: Any
) -> None:
    a = flask_app
    assert a.get(url).get_json() == {"v": "v1"}
    clock.now += TTL + 1.0
    a.build.gone = [gone]
    stale = a.get(url)  # answered stale at once; its refresh finds nothing
    assert stale.status_code == 200 and stale.get_json() == {"v": "v1"}
    assert stale.headers["Cache-Status"] == "reachlimit; hit; ttl=-1"
    assert a.build.runs == 2 and not a.keys()
    again = a.get(url)  # a cold miss: built in the request, answered as the build says
    assert again.status_code == 404
    assert again.headers["Cache-Status"] == "reachlimit; fwd=uri-miss"  # built, not stored
    assert a.build.runs == 3


def test_the_extension_holds_a_failing_refresh_back_for_the_ttl(
    flask_app: App, clock: FakeClock
) -> None:
    a = flask_app
    a.get("/r/x")
    clock.now += TTL + 1.0
    a.build.error = RuntimeError("database down")
    for _ in range(5):  # one refresh, then four stale answers within the backoff
        reply = a.get("/r/x")
        assert reply.status_code == 200 and reply.get_json() == {"v": "v1"}
        clock.now += 1.75
    assert a.build.runs == 2
    clock.now += 10.0 - 5 * 1.75  # the backoff after the try (sums exact in binary)
    a.build.error = None
    assert a.get("/r/x").get_json() == {"v": "v1"}  # still stale; the refresh now works
    assert a.build.runs == 3
    assert a.get("/r/x").get_json() == {"v": "v3"}
    assert a.path.counts().refresh_failed == 1 and a.path.counts().refreshed == 1


# -- on a real Redis ------------------------------------------------------------------------------


class Shared:
    """One process's objects on the test's Redis: RedisCache, RedisSingleFlight,
    RedisColdLimiter and their ColdPath, its backoff on a clock of the test's."""

    def __init__(self, make_client: Callable[..., CountingRedis], active: int = 2,
                 queue: int = 8) -> None:
        name = "gone" + uuid.uuid4().hex[:8]
        self.client = make_client()
        self.cache = RedisCache(self.client, name, ttl=TTL, stale=STALE, codec="auto")
        self.flight = RedisSingleFlight(self.client, name, codec="auto")
        self.limiter = RedisColdLimiter(self.client, name, active, queue, wait=1.0)
        self.clock = FakeClock()
        self.path = ColdPath(self.limiter, self.cache, self.flight, clock=self.clock)

    def make_stale(self, key: str = "k") -> None:
        """Give ``key``'s entry one second past its TTL, and forget the first level's copy."""
        assert self.client.pexpire(self.cache.key_of(key), int(STALE * 1000) - 1000)
        self.cache.local.clear()

    def close(self) -> None:
        self.path.close(JOIN_TIMEOUT)
        self.flight.close()
        self.limiter.close()


@pytest.fixture
def shared(make_client: Callable[..., CountingRedis]) -> Iterator[Callable[..., Shared]]:
    made: list[Shared] = []

    def make(**kwargs: Any) -> Shared:
        made.append(Shared(make_client, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.mark.redis
@pytest.mark.parametrize("gone", GONE)
def test_on_redis_a_refresh_that_finds_nothing_removes_the_shared_entry(
    shared: Callable[..., Shared], gone: Any
) -> None:
    one = shared()
    build = Builds()
    assert one.path.fetch("k", build).status == "stored"
    one.make_stale()
    build.gone = [gone]
    assert stale_hit(one.path, build) == "v1"
    assert one.client.exists(one.cache.key_of("k")) == 0  # gone from Redis
    assert one.cache.lookup("k") is None
    answer = one.path.fetch("k", build)
    assert (answer.value, answer.status) == (gone, "stored")
    assert build.runs == 3 and one.path.counts().refreshed == 1


@pytest.mark.redis
def test_on_redis_a_failing_refresh_is_tried_once_per_backoff(
    shared: Callable[..., Shared],
) -> None:
    one = shared()
    assert one.path.refresh_backoff == TTL  # RedisCache says its TTL
    build = Builds()
    one.path.fetch("k", build)
    one.make_stale()
    build.error = RuntimeError("database down")
    for _ in range(10):  # one refresh, then nine stale answers within the backoff
        assert stale_hit(one.path, build) == "v1"
        one.clock.advance(TTL / 10)
    assert build.runs == 2 and one.path.counts().refresh_failed == 1
    one.clock.advance(TTL / 10)
    build.error = None
    assert stale_hit(one.path, build) == "v1"  # tried again, and it works
    assert build.runs == 3 and one.path.counts().refreshed == 1
    one.cache.local.clear()
    assert one.path.fetch("k", build).value == "v3"


def test_a_failure_is_logged_once_per_episode_even_after_a_refresh_that_found_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = RefreshBackoff()

    def warnings_of(key: str) -> int:
        return len([r for r in caplog.records if r.levelno == logging.WARNING and
                    f"refresh of {key!r}" in r.getMessage()])

    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        backoff.hold("k", 100.0, None)  # found nothing: held back, not logged
        assert warnings_of("k") == 0
        backoff.hold("k", 200.0, "refused")  # the episode's first failure
        backoff.hold("k", 300.0, "failed")
        backoff.hold("other", 300.0, "failed")  # another key: an episode of its own
        assert (warnings_of("k"), warnings_of("other")) == (1, 1)
        backoff.ended("k")  # built again: the next failure starts a new episode
        assert backoff.allows("k", 0.0)
        backoff.hold("k", 400.0, "failed")
        assert warnings_of("k") == 2
    assert not backoff.allows("k", 399.0) and backoff.allows("k", 400.0)
