"""Redis failing is a degraded mode, never an outage: reachlimit's resilient wrappers
(``reachlimit.redis._resilient``, re-exported by ``reachlimit.redis``) against a real
redis-server that the tests stop, restart and restart empty.

Every test leaves the module's server running (the ``server`` fixture starts it again on its
port if a test stopped it). Waits are for states; the few durations printed (time to fall back,
time to come back) are figures for the report, and the only time bounds asserted are the
contract's upper bounds (a waiter answers within its wait plus socket timeouts), with a
generous margin.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pytest
import redis

from reachlimit import Busy, Cancelled, ColdLimiter, ColdPath, SingleFlight, TTLCache
from reachlimit._urls import mask_url
from reachlimit.redis import (
    RedisCache,
    RedisColdLimiter,
    RedisHealth,
    RedisLimiterStats,
    RedisSingleFlight,
    ResilientCache,
    ResilientFlight,
    ResilientLimiter,
    connect,
    owner_prefix,
    release_owner,
)
from tests.support.clock import FakeClock
from tests.support.processes import free_port
from tests.support.redis_clients import (
    live_redis_fixture,  # noqa: F401 (the live_redis fixture)
)
from tests.support.redis_server import (
    RedisServer,
    redis_server_fixture,  # noqa: F401 (the redis_server fixture)
)
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

TIMEOUT = 0.5  # the socket timeout connect() uses by default
#: Added to every asserted upper bound: scheduling on a loaded 2-core machine, never a speed.
SLACK = 2.0


@pytest.fixture
def server(live_redis: RedisServer) -> RedisServer:
    return live_redis


@pytest.fixture
def runner() -> Iterator[ThreadRunner]:
    r = ThreadRunner()
    yield r
    r.join_all(timeout=15)


class Stack:
    """One process's worth of wiring: client, health, shared and local limiters."""

    def __init__(self, url: str, fallback: str = "local", **figures: Any) -> None:
        figures = {"active": 1, "queue": 2, "wait": 3.0, **figures}
        self.client = connect(url)
        self.health = RedisHealth(url)
        self.remote = RedisColdLimiter(self.client, "fb", lease=5.0, **figures)
        self.local = ColdLimiter(**figures)
        self.limiter = ResilientLimiter(self.remote, self.local, self.health, fallback)

    def close(self) -> None:
        self.remote.close()
        self.client.close()


@pytest.fixture
def make_stack() -> Iterator[Callable[..., Stack]]:
    made: list[Stack] = []

    def make(url: str, fallback: str = "local", **figures: Any) -> Stack:
        s = Stack(url, fallback, **figures)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def warnings_about_redis(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.name == "reachlimit" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


# -- connect and mask_url --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://cache.example:6380/1", "unix:///run/r.sock"]
)
def test_connect_accepts_the_three_schemes_with_short_timeouts_and_no_retries(url: str) -> None:
    client = connect(url)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.5 and kwargs["socket_connect_timeout"] == 0.5
    assert kwargs["retry"].get_retries() == 0
    assert kwargs["health_check_interval"] > 0
    client.close()


@pytest.mark.parametrize("url", ["http://h:1", "redis:/x", "", "memcached://h", None, 5])
def test_connect_refuses_other_schemes_with_value_error(url: Any) -> None:
    with pytest.raises(ValueError, match="redis://, rediss:// or unix://"):
        connect(url)


def test_connect_errors_and_reprs_never_show_the_password() -> None:
    secret = "s3cr3t-pw"
    with pytest.raises(ValueError) as info:
        connect(f"redis://user:{secret}@host:notaport/0")
    assert secret not in str(info.value) and "user:***@host" in str(info.value)
    with pytest.raises(ValueError) as info:
        connect(f"http://user:{secret}@host/0")
    assert secret not in str(info.value)
    client = connect(f"redis://user:{secret}@127.0.0.1:1/0")
    assert secret not in repr(client)
    assert secret not in repr(RedisHealth(f"redis://user:{secret}@127.0.0.1:1/0"))
    client.close()


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host:6379", "redis://:***@host:6379"),
        ("rediss://host:6380/2", "rediss://host:6380/2"),
        ("redis://user@host", "redis://user@host"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
        ("redis://u:p%40ss@h", "redis://u:***@h"),
        ("http://[::1", "<unparseable url>"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


# -- the health tracker ----------------------------------------------------------------------


def test_health_backoff_doubles_to_the_cap_with_one_probe_and_logs_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    health = RedisHealth("redis://:pw@h:1/0", clock=clock)
    caplog.set_level(logging.INFO, logger="reachlimit")
    assert health.available()
    health.failed(redis.ConnectionError("refused"))
    health.failed(redis.TimeoutError("a straggler of the same outage"))
    assert not health.up
    pauses = []
    for _ in range(8):
        assert not health.available()  # during the backoff: straight to the fallback
        start = clock()
        while not health.available():
            clock.advance(0.05)
        pauses.append(round(clock() - start, 2))
        assert not health.available()  # one probe at a time
        health.failed(OSError("still refused"))
    assert pauses[0] == pytest.approx(0.25, abs=0.06)
    assert pauses[:5] == sorted(pauses[:5])
    assert max(pauses) == pytest.approx(5.0, abs=0.06)
    assert pauses[-1] == pytest.approx(5.0, abs=0.06)
    clock.advance(5.0)
    assert health.available()
    health.succeeded()
    health.succeeded()
    assert health.up and health.available()
    down = warnings_about_redis(caplog, "is unavailable")
    back = warnings_about_redis(caplog, "answers again")
    assert len(down) == 1 and len(back) == 1
    assert "redis://:***@h:1/0" in down[0] and "pw" not in " ".join(down + back)
    assert health.figures()["outages"] == 1


def test_a_probe_that_never_reports_does_not_block_the_next_one() -> None:
    clock = FakeClock()
    health = RedisHealth("redis://h:1/0", clock=clock)
    health.failed(redis.ConnectionError("refused"))
    clock.advance(0.25)
    assert health.available()  # the probe, which then ends in an error of its own
    assert not health.available()  # one probe per backoff...
    clock.advance(0.25)
    assert health.available()  # ... but a lost probe does not stop the next one
    health.succeeded()
    assert health.up


def test_a_success_that_began_before_a_failure_does_not_end_the_outage() -> None:
    clock = FakeClock()
    health = RedisHealth("redis://h:1/0", clock=clock)
    since = health.failures  # a slow call begins while Redis is up...
    health.failed(redis.ConnectionError("reset"))  # ... another call finds Redis down ...
    health.succeeded(since)  # ... and the slow call's late success is no news
    assert not health.up
    clock.advance(0.25)
    assert health.available()
    since = health.failures
    health.succeeded(since)  # the probe's own success is
    assert health.up


# -- the limiter -----------------------------------------------------------------------------


def test_redis_down_at_start_uses_the_local_limiter_degraded_and_logs_once(
    make_stack: Callable[..., Stack], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reachlimit")
    s = make_stack(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    first = s.limiter.acquire()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        s.limiter.acquire(cancel)
    stats = s.limiter.stats()
    assert isinstance(stats, RedisLimiterStats)
    assert (stats.backend, stats.degraded, stats.active) == ("local", True, 1)
    first.release()
    assert s.limiter.stats().active == 0
    assert len(warnings_about_redis(caplog, "is unavailable")) == 1
    assert "hunter2" not in caplog.text


def test_redis_down_at_start_refuse_mode_says_unavailable(
    make_stack: Callable[..., Stack],
) -> None:
    s = make_stack(f"redis://127.0.0.1:{free_port()}/0", fallback="refuse", retry_after=7)
    for _ in range(3):
        with pytest.raises(Busy) as info:
            s.limiter.acquire()
        assert (info.value.reason, info.value.retry_after) == (Busy.UNAVAILABLE, 7)
    assert s.local.stats().acquired == 0
    assert s.limiter.stats().degraded


def test_fallback_must_be_local_or_refuse(make_stack: Callable[..., Stack]) -> None:
    s = make_stack("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="fallback must be 'local' or 'refuse'"):
        ResilientLimiter(s.remote, s.local, s.health, "queue")


def test_up_the_shared_limiter_decides_and_stats_are_global(
    server: RedisServer, make_stack: Callable[..., Stack]
) -> None:
    a = make_stack(server.url(), queue=0)
    b = make_stack(server.url(), queue=0)
    grant = a.limiter.acquire()
    with pytest.raises(Busy) as info:
        b.limiter.acquire()  # the other "process" holds the only shared slot
    assert info.value.reason == Busy.QUEUE_FULL
    for s in (a, b):
        stats = s.limiter.stats()
        assert (stats.backend, stats.degraded, stats.active) == ("redis", False, 1)
    grant.release()
    assert b.limiter.stats().active == 0
    assert a.local.stats().acquired == 0 and b.local.stats().acquired == 0


def test_a_leader_queued_in_redis_when_it_dies_finishes_on_the_fallback(
    server: RedisServer,
    make_stack: Callable[..., Stack],
    runner: ThreadRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="reachlimit")
    holder = make_stack(server.url())
    waiter = make_stack(server.url())
    held = holder.limiter.acquire()
    started = time.monotonic()
    outcome = start_call(runner, waiter.limiter.acquire, name="queued leader")
    wait_until("the leader queued in Redis", lambda: holder.remote.stats().queued == 1)
    killed_at = time.monotonic()
    server.stop()
    outcome.wait_done(timeout=waiter.remote.wait + 2 * TIMEOUT + SLACK)
    answered = time.monotonic()
    assert outcome.error is None, outcome.error
    grant = outcome.value
    assert grant.held and waiter.local.stats().active == 1  # the fallback's slot
    print(f"\nqueued leader switched to the fallback {answered - killed_at:.3f} s after "
          f"Redis died (asked {answered - started:.3f} s before answering)")
    grant.release()
    held.release()  # the holder's Redis is gone: logged and swallowed, never raised
    assert not held.held
    assert warnings_about_redis(caplog, "could not release")
    assert waiter.limiter.stats().degraded


def test_a_queued_leader_keeps_only_the_rest_of_its_wait_on_the_fallback(
    server: RedisServer, make_stack: Callable[..., Stack], runner: ThreadRunner
) -> None:
    wait = 2.0
    holder = make_stack(server.url(), wait=wait)
    waiter = make_stack(server.url(), wait=wait)
    held = holder.limiter.acquire()
    local_held = waiter.local.acquire()  # the fallback is full too: it will have to wait
    started = time.monotonic()
    outcome = start_call(runner, waiter.limiter.acquire, name="queued leader")
    wait_until("the leader queued in Redis", lambda: holder.remote.stats().queued == 1)
    server.stop()
    outcome.wait_done(timeout=wait + 2 * TIMEOUT + SLACK)
    elapsed = time.monotonic() - started
    assert isinstance(outcome.error, Busy) and outcome.error.reason == Busy.TIMEOUT
    # The rest of the wait, not a second full wait on the fallback.
    assert elapsed < 2 * wait, elapsed
    print(f"\nfallback wait ended {elapsed:.3f} s after asking (wait {wait} s)")
    local_held.release()
    held.release()


def test_cancelled_while_queued_in_redis_that_died_is_still_cancelled(
    server: RedisServer, make_stack: Callable[..., Stack], runner: ThreadRunner
) -> None:
    holder = make_stack(server.url())
    waiter = make_stack(server.url())
    held = holder.limiter.acquire()
    local_held = waiter.local.acquire()  # so that the fallback makes the leader wait
    cancel = threading.Event()
    outcome = start_call(runner, lambda: waiter.limiter.acquire(cancel), name="leader")
    wait_until("queued in Redis", lambda: holder.remote.stats().queued == 1)
    server.stop()
    wait_until("queued on the fallback", lambda: waiter.local.stats().queued == 1)
    cancel.set()
    outcome.wait_done(timeout=waiter.remote.wait + 2 * TIMEOUT + SLACK)
    assert isinstance(outcome.error, Cancelled), outcome.error
    assert waiter.local.stats().queued == 0
    local_held.release()
    held.release()


def test_a_build_whose_redis_died_is_served_and_its_release_swallowed(
    server: RedisServer, make_stack: Callable[..., Stack], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reachlimit")
    s = make_stack(server.url())
    path = ColdPath(s.limiter)

    def build() -> str:
        assert s.remote.stats().active == 1  # the slot is Redis's
        server.stop()
        return "built"

    assert path.get("k", build) == "built"
    assert path.get("k", lambda: "never") == "built"  # cached
    assert warnings_about_redis(caplog, "could not release")
    assert len(warnings_about_redis(caplog, "is unavailable")) == 1
    stats = path.stats()
    assert (stats.backend, stats.degraded, stats.builds) == ("local", True, 1)


def test_back_to_redis_after_a_restart_within_the_backoff(
    server: RedisServer, make_stack: Callable[..., Stack], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reachlimit")
    s = make_stack(server.url())
    port = server.port
    s.limiter.acquire().release()
    assert s.remote.stats().acquired == 1
    stopped = time.monotonic()
    server.stop()
    s.limiter.acquire().release()  # noticed: local from now on
    noticed = time.monotonic()
    assert not s.health.up and s.local.stats().acquired == 1
    server.start(port=port, attempts=1)
    restarted = time.monotonic()

    def on_redis_again() -> bool:
        grant = s.limiter.acquire()
        grant.release()
        return s.health.up

    wait_until("the limiter back on Redis", on_redis_again, timeout=RedisHealth.MAX_RETRY + SLACK,
               interval=0.01)
    back = time.monotonic()
    assert s.limiter.stats().backend == "redis"
    assert s.remote.stats().acquired >= 1  # a fresh (empty) Redis: counted from now on
    assert len(warnings_about_redis(caplog, "answers again")) == 1
    print(f"\nfell back {noticed - stopped:.3f} s after the stop; back on Redis "
          f"{back - restarted:.3f} s after it answered again (backoff cap "
          f"{RedisHealth.MAX_RETRY} s)")


def test_a_redis_restarted_empty_is_recovered_from(
    server: RedisServer, make_stack: Callable[..., Stack]
) -> None:
    s = make_stack(server.url())
    held = s.limiter.acquire()
    server.restart_empty()  # scripts and keys are gone
    held.release()  # its token is unknown to the new Redis: frees nothing, raises nothing
    grant = s.limiter.acquire()  # NOSCRIPT -> the script is loaded again
    stats = s.limiter.stats()
    assert (stats.backend, stats.active, stats.acquired) == ("redis", 1, 1)
    grant.release()
    assert s.limiter.stats().active == 0


# -- owners ----------------------------------------------------------------------------------


def test_tokens_carry_the_owner_and_release_owner_frees_a_dead_owners_places(
    server: RedisServer, make_stack: Callable[..., Stack], runner: ThreadRunner
) -> None:
    s = make_stack(server.url(), active=2, queue=4, wait=30.0)
    mine = s.limiter.acquire()
    holders_key = s.remote.keys[0]
    assert [t.decode() for t in s.client.zrange(holders_key, 0, -1)] == [
        mine._inner.token  # type: ignore[attr-defined]
    ]
    assert mine._inner.token.startswith(owner_prefix())  # type: ignore[attr-defined]
    dead = "deadhost:0badb007:4242:"  # <host>:<boot id>:<pid>: of a process that died
    assert s.remote._admit(dead + "a" * 24)[0] == 1  # the dead process's slot
    assert s.remote._admit(dead + "b" * 24)[0] == 2  # and its queue place
    waiting = start_call(runner, s.limiter.acquire, name="live waiter")
    wait_until("the live waiter queued", lambda: s.remote.stats().queued == 2)
    freed = release_owner(s.client, dead, name="fb", active=2)
    assert freed == (1, 1)
    waiting.wait_done(timeout=5)
    assert waiting.error is None and waiting.value.held  # promoted into the freed slot
    stats = s.remote.stats()
    assert (stats.active, stats.queued) == (2, 0)
    assert release_owner(s.client, dead, name="fb", active=2) == (0, 0)
    waiting.value.release()
    mine.release()
    with pytest.raises(ValueError, match="owner must look like"):
        release_owner(s.client, "nocolon")


# -- cache and flight ------------------------------------------------------------------------


class RedisStandInCache:
    """A minimal Redis-backed cache for these tests (JSON values, one key each)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, key: Hashable) -> Any:
        raw = self.client.get(f"cache:{key}")
        return None if raw is None else json.loads(raw)

    def set(self, key: Hashable, value: Any) -> None:
        self.client.set(f"cache:{key}", json.dumps(value), px=60_000)


class RedisStandInFlight:
    """A minimal Redis-backed singleflight for these tests: the leader holds a SET NX key
    while fn runs and publishes its value; a follower polls for the value."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.after_fn: Callable[[], None] = lambda: None

    def do(
        self, key: Hashable, fn: Callable[[], Any], cancel: Any = None
    ) -> tuple[Any, bool]:
        if self.client.set(f"flight:{key}", 1, nx=True, px=10_000):
            value = fn()
            self.after_fn()
            self.client.set(f"flight-value:{key}", json.dumps(value), px=10_000)
            self.client.delete(f"flight:{key}")
            return value, False
        raw = wait_until("the leader's value", lambda: self.client.get(f"flight-value:{key}"))
        return json.loads(raw), True


def test_resilient_cache_uses_redis_when_up_and_a_failing_get_is_a_miss(
    server: RedisServer,
) -> None:
    client = connect(server.url())
    health = RedisHealth(server.url())
    local: TTLCache[Any] = TTLCache()
    cache = ResilientCache(RedisStandInCache(client), local, health)
    cache.set("a", {"v": 1})
    assert client.get("cache:a") is not None and local.get("a") is None
    assert cache.get("a") == {"v": 1}
    server.stop()
    assert cache.get("a") is None  # a miss, not an error
    assert not health.up
    cache.set("b", 2)  # the fallback keeps it meanwhile
    assert cache.get("b") == 2 and local.get("b") == 2
    client.close()


def test_a_probe_that_raised_no_redis_error_leaves_recovery_to_the_next_call(
    server: RedisServer,
) -> None:
    client = connect(server.url())
    clock = FakeClock()
    health = RedisHealth(server.url(), clock=clock)
    cache = ResilientCache(RedisStandInCache(client), TTLCache(), health)
    health.failed(redis.ConnectionError("a blip"))  # Redis itself is up all along
    clock.advance(0.25)
    with pytest.raises(TypeError):
        cache.set("x", object())  # the probe: a value JSON cannot hold, Redis never asked
    assert not health.up
    clock.advance(0.25)
    cache.set("x", 1)  # the next probe reaches Redis
    assert health.up and client.get("cache:x") == b"1"
    client.close()


def test_a_probe_reaches_redis_not_the_shared_caches_first_level(server: RedisServer) -> None:
    client = connect(server.url())
    clock = FakeClock()
    health = RedisHealth(server.url(), clock=clock)
    shared = RedisCache(client, "probe", local_ttl=60.0)
    cache = ResilientCache(shared, TTLCache(), health)
    cache.set("a", {"v": 1})
    assert shared.local.get("a") == {"v": 1}  # in the first level, for 60 s
    server.stop()
    assert cache.get("b") is None and not health.up  # Redis is down
    clock.advance(0.25)
    assert cache.get("a") is None  # the probe asked Redis, which is still down
    assert not health.up
    client.close()


def test_a_flight_outcome_that_cannot_be_published_marks_redis_down(
    server: RedisServer,
) -> None:
    client = connect(server.url())
    health = RedisHealth(server.url())
    flight: ResilientFlight[Any] = ResilientFlight(
        RedisSingleFlight(client, "publish"), SingleFlight(), health
    )

    def build() -> str:
        server.stop()  # Redis dies while the build runs
        return "built"

    try:
        assert flight.do("k", build) == ("built", False)  # the build's answer stands
        assert not health.up  # the failed publish was not swallowed unseen
    finally:
        flight.close()
        client.close()


def test_a_builds_own_redis_error_reaches_same_process_followers_as_it_is(
    server: RedisServer, runner: ThreadRunner
) -> None:
    client = connect(server.url())
    health = RedisHealth(server.url())
    remote = RedisSingleFlight(client, "own-error")
    flight: ResilientFlight[Any] = ResilientFlight(remote, SingleFlight(), health)
    gate = threading.Event()
    reran: list[int] = []

    def build() -> str:
        assert gate.wait(10)
        raise redis.ConnectionError("the build's own Redis failed")

    def follower_build() -> str:
        reran.append(1)
        return "built again"

    try:
        leader = start_call(runner, lambda: flight.do("k", build))
        wait_until("the leader's flight", lambda: "k" in remote._local._calls)
        follower = start_call(runner, lambda: flight.do("k", follower_build))
        wait_until("a local follower", lambda: remote._local._calls["k"].followers == 1)
        gate.set()
        for call in (leader, follower):
            call.wait_done()
            assert isinstance(call.error, redis.ConnectionError), call.error
            assert "build's own" in str(call.error)
        assert reran == []  # the follower did not take it for Redis failing
        assert health.up and health.failures == 0
    finally:
        gate.set()
        remote.close()
        client.close()


def test_resilient_flight_falls_back_and_never_runs_fn_twice(server: RedisServer) -> None:
    client = connect(server.url())
    health = RedisHealth(server.url())
    remote = RedisStandInFlight(client)
    flight: ResilientFlight[Any] = ResilientFlight(remote, SingleFlight(), health)
    calls: list[str] = []

    def fn(name: str) -> Callable[[], str]:
        def run() -> str:
            calls.append(name)
            return name
        return run

    assert flight.do("k", fn("up")) == ("up", False)
    assert client.get("flight-value:k") is not None  # it went through Redis
    remote.after_fn = server.stop  # Redis dies between fn and publishing its value
    assert flight.do("k2", fn("dies after fn")) == ("dies after fn", False)
    assert calls == ["up", "dies after fn"]  # not run again on the fallback
    assert not health.up
    assert flight.do("k3", fn("down")) == ("down", False)  # straight to the local flight
    assert calls[-1] == "down"

    def broken() -> str:
        raise OSError("the build's own error")

    with pytest.raises(OSError, match="the build's own error"):
        flight.do("k4", broken)  # during the backoff: the local flight; raised as it is
    client.close()


def test_resilient_flight_passes_a_builds_own_redis_error_through(server: RedisServer) -> None:
    client = connect(server.url())
    health = RedisHealth(server.url())
    flight: ResilientFlight[Any] = ResilientFlight(
        RedisStandInFlight(client), SingleFlight(), health
    )
    calls = []

    def build() -> str:
        calls.append(1)
        raise redis.ConnectionError("the build's own Redis failed")

    with pytest.raises(redis.ConnectionError, match="build's own"):
        flight.do("k", build)
    assert calls == [1] and health.up
    client.close()


def test_a_leader_queued_in_a_redis_that_hangs_answers_within_wait_plus_two_timeouts(
    server: RedisServer, make_stack: Callable[..., Stack], runner: ThreadRunner
) -> None:
    """A Redis that stops answering (SIGSTOP) rather than refusing: the waiter's read times
    out, then the shared limiter's attempt to leave the queue times out too; after that the
    fallback answers. Bounded by wait + 2 socket timeouts (plus scheduling slack)."""
    import os
    import signal

    holder = make_stack(server.url())
    waiter = make_stack(server.url())
    held = holder.limiter.acquire()
    outcome = start_call(runner, waiter.limiter.acquire, name="queued leader")
    wait_until("the leader queued in Redis", lambda: holder.remote.stats().queued == 1)
    frozen_at = time.monotonic()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        outcome.wait_done(timeout=waiter.remote.wait + 2 * TIMEOUT + SLACK)
        answered = time.monotonic() - frozen_at
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert outcome.error is None, outcome.error
    assert outcome.value.held and waiter.local.stats().active == 1
    print(f"\nRedis frozen: the queued leader was answered by the fallback {answered:.3f} s "
          f"later (socket timeout {TIMEOUT} s)")
    outcome.value.release()
    held.release()


def test_a_call_during_the_backoff_never_touches_redis(
    make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_stack(f"redis://127.0.0.1:{free_port()}/0")
    s.health = s.limiter.health = RedisHealth(s.health.where, first_retry=60.0, max_retry=60.0)
    sent: list[Any] = []
    # Counted where every command takes its connection: the limiter sends its hot scripts
    # through a bound ``execute_command`` it keeps, so patching the client's would miss them.
    pool = s.client.connection_pool
    real = pool.get_connection

    def counting(*args: Any, **options: Any) -> Any:
        sent.append(args)
        return real(*args, **options)

    monkeypatch.setattr(pool, "get_connection", counting)
    s.limiter.acquire().release()  # the first call finds Redis down
    assert sent and not s.health.up
    sent.clear()
    for _ in range(5):
        s.limiter.acquire().release()
        assert s.limiter.stats().degraded
    assert sent == []  # all answered by the fallback, Redis never asked
    assert s.local.stats().acquired == 6


def test_refuse_mode_when_redis_dies_under_a_queued_leader(
    server: RedisServer, make_stack: Callable[..., Stack], runner: ThreadRunner
) -> None:
    holder = make_stack(server.url(), fallback="refuse")
    waiter = make_stack(server.url(), fallback="refuse")
    held = holder.limiter.acquire()
    outcome = start_call(runner, waiter.limiter.acquire, name="queued leader")
    wait_until("queued in Redis", lambda: holder.remote.stats().queued == 1)
    server.stop()
    outcome.wait_done(timeout=waiter.remote.wait + 2 * TIMEOUT + SLACK)
    assert isinstance(outcome.error, Busy) and outcome.error.reason == Busy.UNAVAILABLE
    assert waiter.local.stats().acquired == 0
    held.release()
