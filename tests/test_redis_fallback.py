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

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import Busy, Cancelled, ColdPath
from reachlimit._urls import url_secrets
from reachlimit.redis import (
    RedisHealth,
    RedisLimiterStats,
    ResilientLimiter,
    connect,
    owner_prefix,
    release_owner,
)
from tests.support.clock import FakeClock
from tests.support.processes import free_port
from tests.support.redis_fallback import (
    SLACK,
    TIMEOUT,
    Stack,
    warnings_about_redis,
)
from tests.support.redis_limiters import LimiterScript
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


# -- connect, and a password in its URL ----------------------------------------------------


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://cache.example:6380/1", "unix:///run/r.sock"]
)
def test_connect_accepts_the_three_schemes_with_short_timeouts_and_no_retries(url: str) -> None:
    client = connect(url)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.5 and kwargs["socket_connect_timeout"] == 0.5
    # No retry on any supported redis-py: 5 retries only what retry_on_error names, 6 and
    # newer what the Retry supports, as many times as it says.
    assert kwargs["retry_on_error"] == []
    if hasattr(kwargs["retry"], "get_retries"):  # redis-py 6 and newer
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


def test_a_password_with_an_unencoded_slash_is_in_no_error_of_the_extension() -> None:
    """The URL check refuses such a URL (its "port" is the password's start): the message
    shows the URL masked, never a piece of the password."""
    from flask import Flask

    from reachlimit.flask import ReachLimit

    app = Flask(__name__)
    app.config["REACHLIMIT_REDIS_URL"] = "redis://:s3cr/et+pw==@redis.internal:6379/0"
    with pytest.raises(ValueError) as info:
        ReachLimit(app)
    assert "s3cr" not in str(info.value) and "pw==" not in str(info.value), info.value
    assert url_secrets("redis://:s3cr/et+pw==@h:1/0") == ["s3cr/et+pw=="]


# -- the health tracker, with request probes (a health given no client: nothing to probe with;
# the probe thread of a health given one is tests/test_redis_recovery.py's) -----------------


def test_health_backoff_doubles_to_the_cap_with_one_probe_and_logs_once_each_way(
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    health = RedisHealth("redis://:pw@h:1/0", clock=clock)
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
    down = warnings_about_redis(reachlimit_log, "is unavailable")
    back = warnings_about_redis(reachlimit_log, "answers again")
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
    make_stack: Callable[..., Stack], reachlimit_log: pytest.LogCaptureFixture
) -> None:
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
    assert len(warnings_about_redis(reachlimit_log, "is unavailable")) == 1
    assert "hunter2" not in reachlimit_log.text


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
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
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
    assert warnings_about_redis(reachlimit_log, "could not release")
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
    server: RedisServer, make_stack: Callable[..., Stack], reachlimit_log: pytest.LogCaptureFixture
) -> None:
    s = make_stack(server.url())
    path = ColdPath(s.limiter)

    def build() -> str:
        assert s.remote.stats().active == 1  # the slot is Redis's
        server.stop()
        return "built"

    assert path.get("k", build) == "built"
    assert path.get("k", lambda: "never") == "built"  # cached
    assert warnings_about_redis(reachlimit_log, "could not release")
    assert len(warnings_about_redis(reachlimit_log, "is unavailable")) == 1
    stats = path.stats()
    assert (stats.backend, stats.degraded, stats.builds) == ("local", True, 1)


def test_back_to_redis_after_a_restart_within_the_backoff(
    server: RedisServer, make_stack: Callable[..., Stack], reachlimit_log: pytest.LogCaptureFixture
) -> None:
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
    assert len(warnings_about_redis(reachlimit_log, "answers again")) == 1
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
    held = [t.decode() for t in s.client.zrange(holders_key, 0, -1)]
    assert len(held) == 1 and held[0].startswith(owner_prefix())  # mine, the only holder
    dead = "deadhost:0badb007:4242:"  # <host>:<boot id>:<pid>: of a process that died
    ghosts = LimiterScript(s.client, s.remote)
    assert ghosts.acquire(dead + "a" * 24)[0] == 1  # the dead process's slot
    assert ghosts.acquire(dead + "b" * 24)[0] == 2  # and its queue place
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
