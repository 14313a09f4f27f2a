"""Tests of reachlimit.redis.RedisColdLimiter against a real redis-server, in one process.

The server is started once for the module (``tests/support/redis_server.py``) and
flushed before each test. Several limiter objects on the same name stand for several
processes; the tests that need real processes are in ``tests/test_redis_processes.py``.

Some tests drive the script directly (``LimiterScript``: ``tests/support/redis_limiters.py``,
with the limiter's public key names and settings): a *ghost* is an attempt admitted by the
acquire script that never polls and never renews, which is exactly what a
process that died looks like from Redis, and which leaves the test in full control of when
each script runs. Waits are for states (``wait_until``), including states of Redis's own clock
(``server_ms``); nothing sleeps to make a test pass.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import Busy, Cancelled, Grant, LimiterStats
from reachlimit.redis import RedisColdLimiter, RedisGrant, RedisLimiterStats
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.limiter import (
    LIMITER_FIELDS,
    ProbeCancel,
    assert_exact_capacity,
    start_acquire,
    try_acquire_now,
)
from tests.support.redis_clients import Commands, CountingRedis
from tests.support.redis_limiters import (
    GIVE_UP,
    GRANTED,
    POLL_CANCELLED,
    POLL_GRANTED,
    POLL_TIMEOUT,
    QUEUED,
    STAY,
    LimiterScript,
    doorbell,
    server_ms,
    state_of,
)
from tests.support.refreshes import threads_named
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


# Redis's read-only commands that a script may call on the refusal path.
READS = {"time", "zcount", "zrangebyscore", "zcard", "zrange", "zscore", "hget", "hmget", "hgetall"}


# -- construction -----------------------------------------------------------------------------


@invalid_arguments(
    active=("active >= 1", [0, True]),
    queue=("queue >= 0", [-1]),
    wait=("wait > 0", [0, float("nan"), float("inf")]),
    retry_after=("retry_after >= 1", [0, 1.5]),
    lease=("lease > 0", [0, -1.0, float("inf"), True]),
    name=("name must be a non-empty string without braces", ["", "a}b"]),
    prefix=("prefix must be a non-empty string without braces", ["{x"]),
)
def test_invalid_arguments_raise_value_error_with_exact_message(
    client: CountingRedis, plain_client: redis.Redis, kwargs: dict[str, Any], message: str
) -> None:
    commands = Commands(client)
    assert_value_error(lambda: RedisColdLimiter(plain_client, **kwargs), message)
    assert commands.until_now() == Counter()  # nothing was sent


def test_defaults(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter()
    assert (lim.capacity_active, lim.capacity_queue, lim.wait, lim.retry_after) == (2, 8, 3.0, 2)
    assert (lim.lease, lim.name) == (10.0, "reachlimit")
    assert 0 < lim.CANCEL_POLL_INTERVAL <= 0.05
    assert lim.POLL_EVERY <= 0.25 and lim.PRESENCE <= 1.0


def test_close_stops_the_renewer_for_good(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter(active=1)
    before = threads_named("reachlimit-lease-renewer")
    grant = lim.acquire()  # its first grant starts its renewer
    started = [t for t in threads_named("reachlimit-lease-renewer") if t not in before]
    assert len(started) == 1
    renewer = started[0]
    lim.close()
    assert not renewer.is_alive()
    grant.release()  # a grant outlives the renewer: its release still works
    assert lim.stats().active == 0
    with pytest.raises(RuntimeError):
        lim.acquire()


def test_a_counter_that_is_not_a_number_reads_as_zero_never_an_error(
    make_limiter: Callable[..., RedisColdLimiter], client: CountingRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lim = make_limiter()
    lim.acquire().release()
    stats_key = next(k for k in lim.keys if k.endswith(":stats"))
    client.hset(stats_key, "rejected_full", "garbage")  # written by something else
    s = lim.stats()
    assert (s.acquired, s.rejected_full) == (1, 0)
    assert any("not a number" in r.getMessage() for r in caplog.records)


def test_stats_is_a_frozen_snapshot_with_the_limiter_fields_and_more(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    s = make_limiter().stats()
    assert isinstance(s, RedisLimiterStats) and isinstance(s, LimiterStats)
    assert set(s.as_dict()) == LIMITER_FIELDS | {"backend", "degraded", "lease_lost"}
    assert (s.backend, s.degraded, s.lease_lost, s.active, s.queued) == ("redis", False, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.active = 1  # type: ignore[misc]


# -- the fast path, the refusal, release ------------------------------------------------------


def test_fast_path_one_round_trip_and_release(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(active=2)
    lim.acquire().release()  # loads the scripts (a first call sends SCRIPT LOAD too)
    commands = Commands(client)  # counted at the server: the limiter's client sends pre-packed
    grant = lim.acquire()
    assert commands.until_now() == Counter({"EVALSHA": 1})
    assert isinstance(grant, RedisGrant) and isinstance(grant, Grant) and grant.held
    with lim.acquire():
        s = lim.stats()
        assert (s.active, s.peak_active, s.acquired) == (2, 2, 3)
    grant.release()
    assert not grant.held and not grant.lease_lost
    s = lim.stats()
    assert (s.active, s.queued, s.acquired) == (0, 0, 3)


def test_grant_released_when_the_body_raises(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter(active=1)
    with pytest.raises(KeyError):
        with lim.acquire():
            raise KeyError("build failed")
    assert lim.stats().active == 0


def test_release_twice_raises_and_creates_no_capacity(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=0)
    grant = lim.acquire()
    grant.release()
    other = lim.acquire()
    with pytest.raises(RuntimeError):
        grant.release()
    assert lim.stats().active == 1
    with pytest.raises(Busy) as info:
        lim.acquire()
    assert info.value.reason == "queue_full"
    with other:
        pass
    other.__exit__(None, None, None)  # leaving again after the block: a no-op
    assert lim.stats().active == 0


@pytest.mark.parametrize("refused_before", [False, True])
def test_queue_full_is_one_round_trip_that_writes_only_its_counter(
    make_client: Callable[..., CountingRedis],
    client: CountingRedis,
    make_limiter: Callable[..., RedisColdLimiter],
    refused_before: bool,
) -> None:
    """The first refusal, and one sent after refusals: one EVALSHA and its counter's HINCRBY,
    counted at the server, and nothing else written."""
    class Patient(RedisColdLimiter):
        PRESENCE = 120.0  # the ghost waiter below must not be dropped during the test

    ghosts = LimiterScript(client, make_limiter(cls=Patient, active=1, queue=1, lease=120.0))
    assert ghosts.acquire("holder")[0] == GRANTED
    assert ghosts.acquire("waiter")[0] == QUEUED
    refuser_client = make_client(redis.Redis)  # a plain client: its calls go pre-packed
    # The script is loaded by the ghosts' admits, so that the refusal below is a plain
    # EVALSHA.
    lim = make_limiter(
        cls=Patient, client=refuser_client, active=1, queue=1, lease=120.0, retry_after=5
    )
    refuser_client.ping()  # its connection is open (a new one says HELLO)
    # The first call of a limiter object also checks the budget's settings in Redis (one more
    # round trip, once): made here, before anything is counted or compared.
    lim.stats()
    if refused_before:
        for _ in range(2):
            with pytest.raises(Busy):
                lim.acquire()
    before = state_of(client)
    stats_key = lim.keys[4]
    commands_before = client.info("commandstats")

    with pytest.raises(Busy) as info:
        lim.acquire()

    assert (info.value.reason, info.value.retry_after) == ("queue_full", 5)
    commands_after = client.info("commandstats")
    after = state_of(client)
    assert int(after[stats_key].pop(b"rejected_full")) == 1 + int(
        before[stats_key].pop(b"rejected_full", 0)
    )
    assert after == before, "the refusal wrote something besides its counter"

    def calls(stats: dict[str, Any], name: str) -> int:
        return int(stats.get(name, {}).get("calls", 0))

    moved = {
        name.removeprefix("cmdstat_"): calls(commands_after, name) - calls(commands_before, name)
        for name in commands_after
        if calls(commands_after, name) != calls(commands_before, name)
    }
    moved.pop("info", None)  # the INFO call made just above
    # One round trip (anything else a client sent would be left in ``moved``), its one write.
    assert moved.pop("evalsha") == 1 and moved.pop("hincrby") == 1, moved
    assert set(moved) <= READS, f"write commands on the refusal path: {set(moved) - READS}"


def test_after_a_refusal_a_freed_slot_is_still_granted(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=0)
    holder = lim.acquire()
    for _ in range(2):
        with pytest.raises(Busy):
            lim.acquire()
    holder.release()
    with lim.acquire():  # the slot being free, it is granted
        pass
    s = lim.stats()
    assert (s.acquired, s.rejected_full, s.active) == (2, 2, 0)


def test_queue_zero_refuses_at_once(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter(active=1, queue=0)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
        assert info.value.reason == "queue_full"
    s = lim.stats()
    assert (s.rejected_full, s.queued, s.peak_queued) == (1, 0, 0)


# -- waiting: FIFO, hand-off, timeout, cancel -------------------------------------------------


def test_waiters_promoted_in_arrival_order_with_direct_hand_off(
    make_limiter: Callable[..., RedisColdLimiter], threads: Any
) -> None:
    lim = make_limiter(active=1, queue=5, wait=60.0)
    other = make_limiter(active=1, queue=5, wait=60.0)  # a second "process" on the same name
    order: list[str] = []
    holder = lim.acquire()
    attempts = []
    for i in range(5):
        attempt = start_acquire(
            threads, (lim, other)[i % 2], name=f"w{i}", on_grant=lambda a: order.append(a.name)
        )
        attempts.append(attempt)
        wait_until(f"w{i} queued", lambda i=i: lim.stats().queued == i + 1)
    holder.release()
    for i, attempt in enumerate(attempts):
        attempt.wait_done()
        assert order == [f"w{j}" for j in range(i + 1)]
        assert not any(a.done.is_set() for a in attempts[i + 1 :])
        # No barging: the slot went to the waiter, so a newcomer queues (and gives up).
        assert try_acquire_now(lim) is None
        attempt.release()
    s = lim.stats()
    assert (s.active, s.queued, s.acquired, s.peak_queued) == (0, 0, 6, 5)


def test_timeout_returns_the_place(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter(active=1, queue=1, wait=0.2)
    with lim.acquire():
        for attempt in range(2):
            with pytest.raises(Busy) as info:
                lim.acquire()
            assert info.value.reason == "timeout", f"attempt {attempt}: place not returned"
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout, s.rejected_full) == (0, 0, 2, 0)


def test_a_waiter_survives_a_socket_timeout_shorter_than_a_poll(
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """Blocking reads are cut to half the socket timeout: no redis TimeoutError."""
    lim = make_limiter(client=make_client(socket_timeout=0.1), active=1, queue=1, wait=0.5)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
    assert info.value.reason == "timeout"


def test_cancel_already_set_sends_nothing(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter()
    cancel = threading.Event()
    cancel.set()
    commands = Commands(client)
    with pytest.raises(Cancelled):
        lim.acquire(cancel)
    assert commands.until_now() == Counter()


def test_cancel_while_waiting_returns_the_place(
    make_limiter: Callable[..., RedisColdLimiter], threads: Any
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    with lim.acquire():
        for round_ in range(2):
            cancel = threading.Event()
            attempt = start_acquire(threads, lim, cancel, name=f"cancelled-{round_}")
            wait_until("queued", lambda: lim.stats().queued == 1)
            cancel.set()
            attempt.wait_done()
            assert isinstance(attempt.error, Cancelled), attempt.error
            assert lim.stats().queued == 0
    s = lim.stats()
    assert (s.cancelled, s.active, s.queued, s.rejected_timeout) == (2, 0, 0, 0)


def test_cancel_racing_promotion_passes_the_slot_on(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(active=1, queue=2, wait=60.0)
    # The slot is w1's before w1 looks again.
    ghosts = LimiterScript.first_of_two_promoted(client, lim)
    holders_key = lim.keys[0]
    assert client.zscore(holders_key, "w1") is not None
    assert client.llen(doorbell(lim, "w1")) == 1  # w1's doorbell rang
    # w1's client left at that very instant: it gives up, and its slot goes on to w2.
    assert ghosts.poll("w1", GIVE_UP)[0] == POLL_CANCELLED
    assert client.zscore(holders_key, "w1") is None
    assert client.zscore(holders_key, "w2") is not None
    assert ghosts.poll("w2", STAY)[0] == POLL_GRANTED
    s = lim.stats()
    assert (s.active, s.queued, s.cancelled, s.acquired) == (1, 0, 1, 2)
    assert ghosts.poll("w2", GIVE_UP)[0] == POLL_CANCELLED  # (a ghost's way to let go)
    assert_exact_capacity(lim)


# Kept apart from tests/test_redis_leases.py:test_grants_are_renewed_while_held because only
# the opening (a limiter, Redis's time, a wait for it to pass) is alike; what each checks is not.
def test_promotion_before_the_waiter_saw_its_deadline_is_kept(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(active=1, queue=2, wait=0.05)
    # "promoted" gets the slot; "late" stays queued.
    ghosts = LimiterScript.first_of_two_promoted(client, lim, "promoted", "late")
    start = server_ms(client)  # after both were queued: their deadlines are before it
    wait_until("both deadlines passed", lambda: server_ms(client) > start + 100)
    assert ghosts.poll("late", STAY)[0] == POLL_TIMEOUT
    assert ghosts.poll("promoted", STAY)[0] == POLL_GRANTED
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout) == (1, 0, 1)
    assert ghosts.poll("late", STAY)[0] == 5  # gone: it never comes back
    assert lim.stats().rejected_timeout == 2


def test_every_exit_returns_its_place_exactly_once(
    make_limiter: Callable[..., RedisColdLimiter], threads: Any
) -> None:
    """Many threads on three limiter objects (one name) mixing holds, cancels and timeouts;
    the bounds hold at every look and everything comes back at the end."""
    lims = [make_limiter(active=2, queue=3, wait=0.3) for _ in range(3)]
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    go = threading.Barrier(9, timeout=10)

    def worker(i: int) -> None:
        lim = lims[i % 3]
        go.wait()
        for j in range(6):
            cancel = threading.Event()
            if (i + j) % 4 == 0:
                cancel.set()  # already cancelled
            try:
                with lim.acquire(cancel if (i + j) % 3 else None):
                    s = lim.stats()
                    assert s.active <= 2 and s.queued <= 3, s
            except Busy as exc:
                with lock:
                    outcomes[exc.reason] += 1
            except Cancelled:
                with lock:
                    outcomes["cancelled"] += 1
            else:
                with lock:
                    outcomes["granted"] += 1

    for i in range(9):
        threads.start(worker, i, name=f"storm-{i}")
    threads.join_all(timeout=50)
    s = lims[0].stats()
    assert (s.active, s.queued) == (0, 0), s
    assert s.peak_active <= 2 and s.peak_queued <= 3
    assert s.acquired == outcomes["granted"] and s.acquired > 0
    assert s.rejected_full == outcomes["queue_full"]
    assert s.rejected_timeout == outcomes["timeout"]
    assert sum(outcomes.values()) == 9 * 6
    assert_exact_capacity(lims[1])


class FailingCancel:
    """A cancel object that answers "not set" ``calls_ok`` times, then raises."""

    def __init__(self, calls_ok: int) -> None:
        self.calls_ok = calls_ok

    def is_set(self) -> bool:
        if self.calls_ok == 0:
            raise OSError("the cancel object failed")
        self.calls_ok -= 1
        return False


def test_an_error_while_queued_propagates_and_returns_the_place(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    with lim.acquire():
        with pytest.raises(OSError):
            lim.acquire(FailingCancel(calls_ok=2))  # fails on its first look while queued
        s = lim.stats()
        assert (s.queued, s.cancelled, s.rejected_timeout) == (0, 0, 0)
        # A newcomer with the budget's settings (one budget, one set of settings) is admitted
        # (Cancelled on its first look, see ProbeCancel), not refused: the place came back.
        with pytest.raises(Cancelled):
            make_limiter(active=1, queue=1, wait=60.0).acquire(ProbeCancel())


def test_a_redis_error_while_queued_propagates_as_itself_and_returns_the_place(
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    class BrokenBlpop(CountingRedis):
        def blpop(self, *args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("the connection dropped")

    lim = make_limiter(active=1, queue=1, wait=60.0)
    with lim.acquire():
        with pytest.raises(redis.ConnectionError):
            make_limiter(client=make_client(BrokenBlpop), active=1, queue=1, wait=60.0).acquire()
        assert lim.stats().queued == 0
    assert lim.stats().active == 0

