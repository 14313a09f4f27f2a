"""Redis failing is a degraded mode, never an outage, for the shared cache and the shared
single flight: ``ResilientCache`` and ``ResilientFlight`` use Redis while it answers, fall back
to this process's own when it does not, never run a build twice, and pass a build's own Redis
error through as itself; then a Redis that hangs, a call during the backoff, and refuse mode
under a queued leader. The limiter's fallback at start and across a restart is
``tests/test_redis_fallback.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import pytest
import redis

from reachlimit import Busy, SingleFlight, TTLCache
from reachlimit.redis import (
    RedisCache,
    RedisHealth,
    RedisSingleFlight,
    ResilientCache,
    ResilientFlight,
    connect,
)
from tests.support.clock import FakeClock
from tests.support.processes import free_port
from tests.support.redis_fallback import (
    SLACK,
    TIMEOUT,
    Stack,
)
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


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


def test_a_path_over_the_resilient_cache_backs_a_failing_refresh_off_by_the_shared_ttl() -> None:
    """ColdPath backs a failing refresh off by its cache's TTL (at most its cap): over a
    ResilientCache, the shared cache's. Without the property it would be the cap (60 s)
    for every TTL. No Redis is reached: the TTL is configuration."""
    from reachlimit import ColdLimiter, ColdPath

    client = connect(f"redis://127.0.0.1:{free_port()}/0")
    try:
        remote = RedisCache(client, "ttl", ttl=7.0, size=8)
        cache = ResilientCache(remote, TTLCache(8, 7.0), RedisHealth("redis://127.0.0.1"))
        assert cache.ttl == 7.0
        path = ColdPath(ColdLimiter(), cache)
        assert path.refresh_backoff == 7.0
    finally:
        client.close()
