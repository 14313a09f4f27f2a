"""Stale entries in the shared cache (``RedisCache(stale=...)``), against a real redis-server.

An entry's freshness is its ``PTTL`` above the stale window, so a test makes an entry stale
by setting its ``PTTL`` (``PEXPIRE``), never by sleeping; the first level's own clock is
injected. Cross-process claims (one refresh per key) are made with two ColdPaths that share
nothing but the Redis, as two processes would; the herd test holds the one build on an Event.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import ColdPath, TTLCache
from reachlimit.redis import (
    RedisCache,
    RedisColdLimiter,
    RedisHealth,
    RedisSingleFlight,
    ResilientCache,
    connect,
)
from tests.apps.slow_app import create_app
from tests.support.clock import FakeClock
from tests.support.redis_clients import CountingRedis
from tests.support.redis_lead import close_app, watcher_fixture  # noqa: F401 (watcher)
from tests.support.redis_server import RedisServer
from tests.support.refreshes import refreshing
from tests.support.threads import JOIN_TIMEOUT
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

TTL, STALE = 10.0, 30.0


def stale_cache(client: redis.Redis, **kwargs: Any) -> RedisCache:
    options: dict[str, Any] = {"ttl": TTL, "stale": STALE, "codec": "auto"}
    options.update(kwargs)
    return RedisCache(client, "st", **options)


def age(client: redis.Redis, cache: RedisCache, key: Any, pttl_ms: int) -> None:
    """Give ``key``'s entry ``pttl_ms`` to live in Redis, and forget the first level's copy."""
    assert client.pexpire(cache.key_of(key), pttl_ms)
    cache.local.clear()


def bracketed_lookup(client: redis.Redis, cache: RedisCache, key: Any) -> tuple[Any, float, float]:
    """``cache.lookup(key)`` between two reads of the entry's PTTL in Redis: the lookup's own
    PTTL lies between them, so its ``fresh_for`` is within the two bounds returned (latest,
    earliest) however long the machine took between the calls. For the cache's window."""
    entry_key = cache.key_of(key)
    earliest = (client.pttl(entry_key) - STALE * 1000) / 1000
    entry = cache.lookup(key)
    latest = (client.pttl(entry_key) - STALE * 1000) / 1000
    assert entry is not None
    return entry, latest, earliest


def test_an_entry_lives_ttl_plus_stale_and_is_fresh_while_its_pttl_is_above_stale(
    client: CountingRedis,
) -> None:
    cache = stale_cache(client)
    cache.put("k", {"v": 1}, 0.25)
    pttl = client.pttl(cache.key_of("k"))
    assert (TTL + STALE) * 1000 - 1000 < pttl <= (TTL + STALE) * 1000
    entry = cache.lookup("k")
    assert entry is not None and entry.value == {"v": 1} and entry.build_time == 0.25
    assert 0 < entry.fresh_for <= TTL
    age(client, cache, "k", int(STALE * 1000) + 5000)  # five seconds of freshness left
    entry, latest, earliest = bracketed_lookup(client, cache, "k")
    assert 0 < latest <= entry.fresh_for <= earliest <= 5.0  # Redis's PTTL less the window
    assert cache.get("k") == {"v": 1}
    age(client, cache, "k", int(STALE * 1000) - 2000)  # two seconds past its TTL
    entry, latest, earliest = bracketed_lookup(client, cache, "k")
    assert entry.value == {"v": 1}
    assert latest <= entry.fresh_for <= earliest <= -2.0
    assert cache.get("k") is None and cache.fetch("k") is None  # get answers fresh only
    assert cache.local.get("k") is None  # a stale entry never enters the first level
    client.delete(cache.key_of("k"))  # its stale window over: Redis dropped it
    assert cache.lookup("k") is None


def test_lookup_fields_answers_lookups_fields_from_the_first_level_and_from_redis(
    client: CountingRedis,
) -> None:
    # The plain tuple ColdPath's warm read asks for: the Entry's fields, wherever it is read.
    cache = stale_cache(client, clock=FakeClock(), local_ttl=60.0)
    assert cache.lookup_fields("k") is None and cache.lookup("k") is None  # a miss
    cache.put("k", {"v": 1}, 0.25)  # held by the first level too, fresh for TTL
    before = client.total()
    fields = cache.lookup_fields("k")
    assert type(fields) is tuple and fields == tuple(cache.lookup("k") or ())
    assert fields == ({"v": 1}, TTL, 0.25) and client.total() == before  # no round trip
    age(client, cache, "k", int(STALE * 1000) - 2000)  # stale: read from Redis each time
    fields = cache.lookup_fields("k")
    assert fields is not None and client.total() > before
    value, fresh_for, build_time = fields
    assert (value, build_time) == ({"v": 1}, 0.25) and -STALE < fresh_for <= -2.0
    no_window = RedisCache(client, "plain", ttl=TTL)
    no_window.set("k", 1)
    assert no_window.lookup_fields("k") == (1, math.inf, 0.0) == no_window.lookup("k")


def test_the_first_level_never_answers_an_entry_past_its_freshness(
    client: CountingRedis,
) -> None:
    clock = FakeClock()
    cache = stale_cache(client, clock=clock, local_ttl=1.0)
    cache.put("k", "v", 0.0)
    age(client, cache, "k", int(STALE * 1000) + 900)  # 0.9 s of freshness left in Redis
    entry = cache.lookup("k")  # read from Redis, held in the first level that long
    # (As long as Redis said when the lookup read its PTTL: a few ms less than 0.9 s, or
    # more on a loaded machine; the clock steps below are measured from what it said.)
    assert entry is not None and 0.01 < entry.fresh_for <= 0.9
    data = client.get(cache.key_of("k"))
    client.delete(cache.key_of("k"))
    assert cache.get("k") == "v"  # answered by the first level: Redis has nothing now
    client.set(cache.key_of("k"), data, px=int(STALE * 1000) - 100)  # back, and stale
    clock.advance(entry.fresh_for - 0.01)
    assert cache.get("k") == "v"  # still within the time it was read as fresh for
    clock.advance(0.02)  # past its freshness, though within the first level's own 1 s
    assert cache.get("k") is None  # the held copy is not fresh any more: Redis says stale
    entry = cache.lookup("k")
    assert entry is not None and entry.fresh_for < 0


def test_an_entry_written_without_a_build_time_still_decodes(client: CountingRedis) -> None:
    plain = RedisCache(client, "old", ttl=TTL, codec="auto")
    plain.set("k", {"v": 1})
    data = client.get(plain.key_of("k"))
    assert data is not None and data.startswith(b"j")  # no header without a stale window
    client.flushall()
    cache = stale_cache(client)
    client.set(cache.key_of("k"), data, px=int((TTL + STALE) * 1000))
    entry = cache.lookup("k")
    assert entry is not None and entry.value == {"v": 1} and entry.build_time == 0.0
    cache.put("b", b"raw", 1.5)
    stored = client.get(cache.key_of("b"))
    assert stored is not None and stored.startswith(b"t1500,30000;b")  # build time, window
    cache.local.clear()
    assert cache.lookup("b") == (b"raw", pytest.approx(TTL, abs=1.0), 1.5)
    # An older version's header (no window in it): read with this process's window.
    client.set(cache.key_of("old"), b"t250;" + data, px=int((TTL + STALE) * 1000))
    entry = cache.lookup("old")
    assert entry is not None and entry.value == {"v": 1} and entry.build_time == 0.25
    assert entry.fresh_for == pytest.approx(TTL, abs=1.0)


def test_the_stale_window_of_the_newest_start_is_the_caches_and_each_entry_carries_its_own(
    client: CountingRedis,
) -> None:
    """Processes that disagree on the window: no error, the newest start's window (in
    Redis) decides an entry's life, and every reader takes the window the entry was set
    with, whatever its own."""
    first = stale_cache(client)
    first.set("k", 1)
    newest = stale_cache(client, stale=5.0)
    assert newest.get("k") == 1  # no error: it records its window and reads the entry
    first.put("a", "set by the first", 0.0)  # the cache's window now: 5 s
    assert (TTL + 5.0) * 1000 - 1000 < client.pttl(first.key_of("a")) <= (TTL + 5.0) * 1000
    age(client, first, "a", 6000)  # past 5 s of stale window: fresh for 1 s more
    entry = first.lookup("a")  # a reader whose own window is 30 s
    assert entry is not None and entry.fresh_for == pytest.approx(1.0, abs=0.5)
    age(client, first, "a", 4000)  # within the entry's window: stale for the first too
    entry = first.lookup("a")
    assert entry is not None and entry.fresh_for < 0


def test_a_process_without_a_window_never_takes_a_stale_entry_for_fresh(
    client: CountingRedis,
) -> None:
    """A deploy that turned the window on, not yet everywhere: a process of the old
    settings (no window of its own) asks an entry set with a window its PTTL, and takes one
    past its freshness for a miss."""
    windowed = stale_cache(client)
    plain = RedisCache(client, "st", ttl=TTL, codec="auto")
    plain.set("k", "fresh")  # its start: no window in Redis for a moment
    windowed.put("k", "fresh", 0.0)  # the newest start: a 30 s window, written in the entry
    assert plain.fetch("k") == "fresh"
    age(client, plain, "k", 20_000)  # within its window: stale
    assert plain.fetch("k") is None
    assert plain.get("k") is None  # not held in the first level either
    age(client, plain, "k", 31_000)
    assert plain.get("k") == "fresh"


def test_a_bad_stale_window_is_a_value_error(client: CountingRedis) -> None:
    with pytest.raises(ValueError, match="stale"):
        stale_cache(client, stale=-1)


def test_the_resilient_cache_looks_up_and_puts_in_the_fallback_while_redis_is_down(
    live_redis: RedisServer,
) -> None:
    client = connect(live_redis.url())
    health = RedisHealth(live_redis.url())
    local: TTLCache[Any] = TTLCache(16, TTL, stale=STALE)
    cache = ResilientCache(stale_cache(client), local, health)
    assert cache.stale == STALE
    cache.put("k", "shared", 0.5)
    entry = cache.lookup("k")
    assert entry is not None and entry.value == "shared" and local.get("k") is None
    live_redis.stop()
    assert cache.lookup("missing") is None and not health.up  # a miss, not an error
    cache.put("k2", "kept here", 0.5)
    kept = cache.lookup("k2")
    assert kept is not None and (kept.value, kept.build_time) == ("kept here", 0.5)
    assert local.get("k2") == "kept here"
    client.close()


# -- one refresh per key across "processes" ---------------------------------------------------


class Process:
    """One process's objects on the shared Redis: cache, flight, limiter and path (the
    path's refresh backoff on a clock of the test's)."""

    def __init__(self, make_client: Callable[..., CountingRedis], active: int = 2,
                 queue: int = 8) -> None:
        self.client = make_client()
        self.cache = stale_cache(self.client)
        self.flight = RedisSingleFlight(self.client, "st", codec="auto")
        self.limiter = RedisColdLimiter(self.client, "st", active, queue, wait=1.0)
        self.clock = FakeClock()
        self.path = ColdPath(self.limiter, self.cache, self.flight, clock=self.clock)

    def close(self) -> None:
        self.path.close(JOIN_TIMEOUT)
        self.flight.close()
        self.limiter.close()


def settle(*processes: Process, key: str = "k") -> None:
    wait_until("the refreshes to end",
               lambda: not any(refreshing(p.path.refresher, key) for p in processes))


def test_a_herd_of_stale_hits_in_two_processes_builds_once(
    make_client: Callable[..., CountingRedis],
) -> None:
    one, two = Process(make_client), Process(make_client)
    one.client.flushall()
    try:
        assert one.path.fetch("k", lambda: "first").status == "stored"
        age(one.client, one.cache, "k", int(STALE * 1000) - 1000)
        two.cache.local.clear()
        gate, started = threading.Event(), threading.Event()
        runs: list[str] = []

        def refresh() -> str:
            runs.append(threading.current_thread().name)
            started.set()
            assert gate.wait(JOIN_TIMEOUT)
            return "second"

        answers = [p.path.fetch("k", refresh) for p in (one, two) for _ in range(5)]
        assert {(a.value, a.status) for a in answers} == {("first", "stale")}
        assert started.wait(JOIN_TIMEOUT)
        # Both processes asked for a refresh; one leads it, the other follows it in Redis.
        wait_until("both refreshers in the flight", lambda: refreshing(one.path.refresher, "k")
                   and refreshing(two.path.refresher, "k"))
        gate.set()
        settle(one, two)
        assert len(runs) == 1
        for p in (one, two):
            p.cache.local.clear()
            fresh = p.path.fetch("k", refresh)
            assert (fresh.value, fresh.status) == ("second", "hit")
        assert len(runs) == 1
    finally:
        one.close()
        two.close()


def test_a_refused_or_failing_refresh_leaves_the_stale_entry_served(
    make_client: Callable[..., CountingRedis],
) -> None:
    one = Process(make_client, active=1, queue=0)
    one.client.flushall()
    try:
        one.path.fetch("k", lambda: "first")
        age(one.client, one.cache, "k", int(STALE * 1000) - 1000)
        held = one.limiter.acquire()  # the service's only slot, no queue: refused at once
        try:
            assert one.path.fetch("k", lambda: "never").value == "first"
            settle(one)
        finally:
            held.release()
        assert one.path.counts().refresh_refused == 1

        def failing() -> str:
            raise RuntimeError("database gone")

        one.clock.advance(TTL)  # each try a backoff (the TTL) after the last
        answer = one.path.fetch("k", failing)
        assert (answer.value, answer.status) == ("first", "stale")
        settle(one)
        assert one.path.counts().refresh_failed == 1
        one.cache.local.clear()
        assert one.cache.lookup("k") is not None  # still there, still stale
        one.clock.advance(TTL)
        assert one.path.fetch("k", lambda: "second").status == "stale"
        settle(one)
        assert one.path.fetch("k", lambda: "never").value == "second"
    finally:
        one.close()


# -- what the first level holds, and the probe ------------------------------------------------


def test_the_clock_given_is_the_first_levels_and_a_lead_hit_is_not_held(
    client: CountingRedis,
) -> None:
    clock = FakeClock()
    cache = stale_cache(client, clock=clock)
    cache.put("k", "v", 0.0)  # held fresh for the TTL, measured before the set was sent
    entry = cache.lookup("k")
    assert entry is not None and entry.fresh_for == pytest.approx(TTL)
    clock.advance(0.5)
    assert cache.local.get("k") is not None  # the first level's own 1 s, on the same clock
    clock.advance(0.6)
    assert cache.local.get("k") is None
    # The cold lead reads an entry and its PTTL in its script: a stale one is answered
    # stale, not held (the first level never holds what may be stale).
    age(client, cache, "k", int(STALE * 1000) - 100)
    key, sent = cache.lead_key("k")
    found = cache.found("k", key, client.get(key), client.pttl(key), sent)
    assert found is not None and found.value == "v" and found.fresh_for <= 0
    assert cache.local.get("k") is None and cache.get("k") is None


def test_a_probe_of_lookup_reaches_redis_past_the_first_level(live_redis: RedisServer) -> None:
    clock = FakeClock()
    client = connect(live_redis.url())
    health = RedisHealth(live_redis.url(), clock=clock)
    local: TTLCache[Any] = TTLCache(16, TTL, stale=STALE, clock=clock)
    cache = ResilientCache(stale_cache(client, clock=clock), local, health)
    cache.put("k", "shared", 0.0)  # the shared cache's first level holds it now
    live_redis.stop()
    assert cache.lookup("other") is None and not health.up  # Redis is down
    clock.advance(0.3)  # past the first retry (0.25 s): the next call is the probe
    # Answered from the first level, the probe would say nothing about Redis yet mark it up.
    assert cache.lookup("k") is None  # it went to Redis, failed: the fallback's miss
    assert not health.up
    client.close()


# -- the Flask extension on Redis -------------------------------------------------------------


def test_the_extension_answers_stale_with_its_cache_status_then_fresh(
    redis_server: RedisServer, watcher: redis.Redis,
) -> None:
    app = create_app(
        REACHLIMIT_REDIS_URL=redis_server.url(),
        REACHLIMIT_REDIS_PREFIX="st" + uuid.uuid4().hex[:8],
        REACHLIMIT_CACHE_TTL=TTL,
        REACHLIMIT_STALE=STALE,
    )
    gate = app.extensions["slow_app"]
    state = app.extensions["reachlimit"]
    shared = state.path.cache.remote
    try:
        http = app.test_client()
        first = http.get("/report/popular")
        assert first.status_code == 200 and first.json["build"] == 1
        assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
        fresh = http.get("/report/popular")
        assert fresh.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
        assert "ttl=-" not in fresh.headers["Cache-Status"]

        gate.gate.clear()  # the refresh waits at the gate
        assert watcher.pexpire(shared.key_of("popular"), int(STALE * 1000) - 2500)
        shared.local.clear()
        stale = [http.get("/report/popular") for _ in range(3)]
        for reply in stale:
            assert reply.status_code == 200 and reply.json["build"] == 1
            assert reply.headers["Cache-Status"] == "reachlimit; hit; ttl=-3"
        wait_until("the refresh building", lambda: gate.figures()["in_flight"] == 1)
        gate.gate.set()
        wait_until("the refresh stored",
                   lambda: not refreshing(state.path.refresher, "popular"))
        assert gate.figures()["total"] == 2  # one refresh for the herd
        shared.local.clear()
        again = http.get("/report/popular")
        assert again.json["build"] == 2
        assert again.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
        assert "ttl=-" not in again.headers["Cache-Status"]
        assert state.path.counts().refreshed == 1
    finally:
        close_app(app)
