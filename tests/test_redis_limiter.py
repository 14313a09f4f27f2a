"""Tests of reachlimit.redis.RedisColdLimiter against a real redis-server, in one process.

The server is started once for the module (``tests/support/redis_server.py``) and
flushed before each test. Several limiter objects on the same name stand for several
processes; the tests that need real processes are in ``tests/test_redis_processes.py``.

Some tests drive the scripts directly (``_admit``, ``_poll``): a *ghost* is an attempt
admitted by the acquire script that never polls and never renews, which is exactly what a
process that died looks like from Redis, and which leaves the test in full control of when
each script runs. Waits are for states (``wait_until``), including states of Redis's own clock
(``server_ms``); nothing sleeps to make a test pass.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.retry import Retry

from reachlimit import Busy, Cancelled, ColdPath, Grant, LimiterStats
from reachlimit.redis import RedisColdLimiter, RedisGrant, RedisLimiterStats
from reachlimit.redis._limiter import _GIVE_UP as GIVE_UP
from reachlimit.redis._limiter import _STAY as STAY
from tests.support.limiter import (
    LIMITER_FIELDS,
    ProbeCancel,
    assert_exact_capacity,
    start_acquire,
    try_acquire_now,
)
from tests.support.redis_clients import (
    CountingRedis,
    client_fixture,  # noqa: F401 (the client fixture)
    make_client_fixture,  # noqa: F401 (the make_client fixture)
)
from tests.support.redis_server import (
    RedisServer,
    redis_server_fixture,  # noqa: F401 (the redis_server fixture)
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

GRANTED, QUEUED, FULL = 1, 2, 0
POLL_GRANTED, POLL_WAITING, POLL_TIMEOUT, POLL_CANCELLED = 1, 2, 3, 4

# Redis's read-only commands that a script may call on the refusal path.
READS = {"time", "zcount", "zrangebyscore", "zcard", "zrange", "zscore", "hget", "hgetall"}


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def make_limiter(client: CountingRedis) -> Iterator[Callable[..., RedisColdLimiter]]:
    """``make_limiter(**kwargs)``: a limiter on the test's client (or ``client=``, or a
    subclass as ``cls=``); every one made is closed at teardown."""
    made: list[RedisColdLimiter] = []

    def make(**kwargs: Any) -> RedisColdLimiter:
        cls = kwargs.pop("cls", RedisColdLimiter)
        lim: RedisColdLimiter = cls(kwargs.pop("client", client), **kwargs)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        lim.close()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def state_of(client: redis.Redis, pattern: str = "*") -> dict[str, Any]:
    """Every key matching ``pattern`` with its full content."""
    out: dict[str, Any] = {}
    for key in sorted(client.keys(pattern)):
        kind = client.type(key).decode()
        if kind == "zset":
            out[key.decode()] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[key.decode()] = client.hgetall(key)
        elif kind == "list":
            out[key.decode()] = client.lrange(key, 0, -1)
        else:
            out[key.decode()] = client.get(key)
    return out


# -- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active": 0}, "active >= 1"),
        ({"active": True}, "active >= 1"),
        ({"queue": -1}, "queue >= 0"),
        ({"wait": 0}, "wait > 0"),
        ({"wait": float("nan")}, "wait > 0"),
        ({"wait": float("inf")}, "wait > 0"),
        ({"retry_after": 0}, "retry_after >= 1"),
        ({"retry_after": 1.5}, "retry_after >= 1"),
        ({"lease": 0}, "lease > 0"),
        ({"lease": -1.0}, "lease > 0"),
        ({"lease": float("inf")}, "lease > 0"),
        ({"lease": True}, "lease > 0"),
        ({"name": ""}, "name must be a non-empty string without braces"),
        ({"name": "a}b"}, "name must be a non-empty string without braces"),
        ({"prefix": "{x"}, "prefix must be a non-empty string without braces"),
    ],
)
def test_invalid_arguments_raise_value_error_with_exact_message(
    client: CountingRedis, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        RedisColdLimiter(client, **kwargs)
    assert str(info.value) == message
    assert sum(client.sent.values()) == 1  # the fixture's FLUSHALL only: nothing was sent


def test_defaults(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter()
    assert (lim.capacity_active, lim.capacity_queue, lim.wait, lim.retry_after) == (2, 8, 3.0, 2)
    assert (lim.lease, lim.name) == (10.0, "reachlimit")
    assert 0 < lim.CANCEL_POLL_INTERVAL <= 0.05
    assert lim.POLL_EVERY <= 0.25 and lim.PRESENCE <= 1.0


def test_close_stops_the_renewer_for_good(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    lim = make_limiter(active=1)
    grant = lim.acquire()
    renewer = lim._renewer
    assert renewer is not None and renewer.is_alive()
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
    client.sent.clear()
    grant = lim.acquire()
    assert isinstance(grant, RedisGrant) and isinstance(grant, Grant) and grant.held
    assert client.sent == Counter({"EVALSHA": 1})
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
    """Both acquire scripts: the first refusal's, and the one sent after a refusal (which
    checks for the refusal first)."""
    class Patient(RedisColdLimiter):
        PRESENCE = 120.0  # the ghost waiter below must not be dropped during the test

    ghosts = make_limiter(cls=Patient, active=1, queue=1, lease=120.0)
    assert ghosts._admit("holder")[0] == GRANTED
    assert ghosts._admit("waiter")[0] == QUEUED
    refuser_client = make_client()
    # The ghosts' settings: the acquire script, made per settings, is loaded by their admits,
    # so that the refusal below is a plain EVALSHA.
    lim = make_limiter(
        cls=Patient, client=refuser_client, active=1, queue=1, lease=120.0, retry_after=5
    )
    refuser_client.ping()  # its connection is open (a new one says HELLO)
    # The first call of a limiter object also checks the budget's settings in Redis (one more
    # round trip, once): made here, before anything is counted or compared.
    lim.stats()
    if refused_before:
        for _ in range(2):  # the second one loads the script sent after a refusal
            with pytest.raises(Busy):
                lim.acquire()
        assert lim._refusing
    before = state_of(client)
    stats_key = lim.keys[4]
    commands_before = client.info("commandstats")
    refuser_client.sent.clear()

    with pytest.raises(Busy) as info:
        lim.acquire()

    assert (info.value.reason, info.value.retry_after) == ("queue_full", 5)
    assert refuser_client.sent == Counter({"EVALSHA": 1}), "not one round trip"
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
    assert lim._refusing  # the next acquire checks for the refusal first...
    holder.release()
    with lim.acquire():  # ...and, the slot being free, goes on to grant it
        assert not lim._refusing
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
    client.sent.clear()
    with pytest.raises(Cancelled):
        lim.acquire(cancel)
    assert sum(client.sent.values()) == 0


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
    holder = lim.acquire()
    assert lim._admit("w1")[0] == QUEUED
    assert lim._admit("w2")[0] == QUEUED
    holder.release()  # hands the slot to w1 before w1 looks again
    holders_key = lim.keys[0]
    assert client.zscore(holders_key, "w1") is not None
    assert client.llen(lim._bell + "w1") == 1  # w1's doorbell rang
    # w1's client left at that very instant: it gives up, and its slot goes on to w2.
    assert lim._poll("w1", GIVE_UP)[0] == POLL_CANCELLED
    assert client.zscore(holders_key, "w1") is None
    assert client.zscore(holders_key, "w2") is not None
    assert lim._poll("w2", STAY)[0] == POLL_GRANTED
    s = lim.stats()
    assert (s.active, s.queued, s.cancelled, s.acquired) == (1, 0, 1, 2)
    assert lim._poll("w2", GIVE_UP)[0] == POLL_CANCELLED  # (a ghost's way to let go)
    assert_exact_capacity(lim)


def test_promotion_before_the_waiter_saw_its_deadline_is_kept(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(active=1, queue=2, wait=0.05)
    holder = lim.acquire()
    start = server_ms(client)
    assert lim._admit("promoted")[0] == QUEUED
    assert lim._admit("late")[0] == QUEUED
    holder.release()  # "promoted" gets the slot; "late" stays queued
    wait_until("both deadlines passed", lambda: server_ms(client) > start + 100)
    assert lim._poll("late", STAY)[0] == POLL_TIMEOUT
    assert lim._poll("promoted", STAY)[0] == POLL_GRANTED
    s = lim.stats()
    assert (s.active, s.queued, s.rejected_timeout) == (1, 0, 1)
    assert lim._poll("late", STAY)[0] == 5  # gone: it never comes back
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


# -- leases, dead waiters, restarts -----------------------------------------------------------


def test_grants_are_renewed_while_held(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(active=1, queue=0, lease=1.5)
    grant = lim.acquire()
    start = server_ms(client)
    wait_until("3 leases passed", lambda: server_ms(client) > start + 4500, timeout=15)
    s = lim.stats()
    assert (s.active, s.lease_lost) == (1, 0)
    assert not grant.lease_lost  # type: ignore[attr-defined]
    grant.release()
    assert lim.stats().active == 0


def test_a_lost_lease_is_counted_and_its_late_release_frees_nothing(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=0, lease=0.5)
    lim._renewal_paused.set()  # the holder is "paused": it stops renewing
    stale = lim.acquire()
    wait_until("the lease ran out", lambda: lim.stats().lease_lost == 1)
    lim._renewal_paused.clear()
    assert lim.stats().active == 0
    current = lim.acquire()  # the slot is someone else's now
    stale.release()  # late: must not free `current`'s slot
    assert stale.lease_lost  # type: ignore[attr-defined]
    s = lim.stats()
    assert (s.active, s.lease_lost) == (1, 1)
    with pytest.raises(Busy):
        lim.acquire()
    with pytest.raises(RuntimeError):
        stale.release()
    current.release()
    assert lim.stats().active == 0


class BlockSpy(CountingRedis):
    """Records the timeout of every BLPOP a waiter blocks in (its doorbell)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks: list[float] = []

    def blpop(self, keys: Any, timeout: float | None = 0) -> Any:
        self.blocks.append(float(timeout or 0))
        return super().blpop(keys, timeout=timeout)


def test_a_waiter_with_a_cancel_token_blocks_in_short_slices_and_returns_its_place(
    make_client: Callable[..., CountingRedis],
    make_limiter: Callable[..., RedisColdLimiter],
    threads: Any,
) -> None:
    """Blocked on its doorbell, a waiter looks at its cancel token at least every
    ``CANCEL_POLL_INTERVAL`` (the local limiter's 50 ms slice): each BLPOP is that short."""
    spy = make_client(BlockSpy)
    lim = make_limiter(active=1, queue=1, wait=60.0)
    waiting = make_limiter(client=spy, active=1, queue=1, wait=60.0)
    with lim.acquire():
        cancel = threading.Event()
        attempt = start_acquire(threads, waiting, cancel, name="cancelled")
        wait_until("queued", lambda: lim.stats().queued == 1)
        wait_until("blocked on its doorbell a few times", lambda: len(spy.blocks) >= 3)
        cancel.set()
        attempt.wait_done(timeout=10)  # generous: one slice and one round trip in fact
        assert isinstance(attempt.error, Cancelled), attempt.error
        s = lim.stats()
        assert (s.queued, s.cancelled, s.rejected_timeout) == (0, 1, 0)
        # The place is free again: a newcomer (with the budget's settings) is admitted, and
        # gives up on its first look (ProbeCancel) instead of being refused as queue_full.
        with pytest.raises(Cancelled):
            make_limiter(active=1, queue=1, wait=60.0).acquire(ProbeCancel())
    assert spy.blocks and max(spy.blocks) <= RedisColdLimiter.CANCEL_POLL_INTERVAL
    assert_exact_capacity(lim)


def test_a_blocked_waiter_has_redis_nudged_when_each_slice_ends(
    make_client: Callable[..., CountingRedis],
    make_limiter: Callable[..., RedisColdLimiter],
    threads: Any,
) -> None:
    """Redis ends a timed-out BLPOP only when its event loop runs (on an idle server, at its
    next cron tick): the limiter's waker sends a PING after each slice's end, so that the
    slice ends on time. Here: PINGs come while a waiter blocks, and stop when it is gone."""
    spy = make_client(BlockSpy)
    lim = make_limiter(active=1, queue=1, wait=60.0)
    waiting = make_limiter(client=spy, active=1, queue=1, wait=60.0)
    with lim.acquire():
        cancel = threading.Event()
        attempt = start_acquire(threads, waiting, cancel, name="nudged")
        wait_until("three slices nudged", lambda: spy.sent["PING"] >= 3)
        assert len(spy.blocks) >= 2
        cancel.set()
        attempt.wait_done(timeout=10)
        assert isinstance(attempt.error, Cancelled), attempt.error
    waiting.close()
    assert waiting._waker._thread is not None and not waiting._waker._thread.is_alive()
    assert lim.stats().queued == 0


def test_a_waiter_notices_its_deadline_while_blocked_on_its_doorbell(
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """No block outlasts the deadline by more than a millisecond, and no slice is longer
    than the cancel slice while a cancel token is watched: the timeout comes in time."""
    spy = make_client(BlockSpy)
    lim = make_limiter(active=1, queue=1, wait=0.3)  # the budget's settings: the waiter's
    waiting = make_limiter(client=spy, active=1, queue=1, wait=0.3)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            waiting.acquire(threading.Event())
    assert info.value.reason == "timeout"
    assert spy.blocks and max(spy.blocks) <= RedisColdLimiter.CANCEL_POLL_INTERVAL
    assert sum(spy.blocks) <= 0.3 + 0.001 * len(spy.blocks)  # it never slept past its wait
    s = lim.stats()
    assert (s.queued, s.rejected_timeout, s.cancelled) == (0, 1, 0)


class _Lasting(RedisColdLimiter):
    PRESENCE = 120.0  # its ghost waiters stay present for the whole test


class _Fleeting(RedisColdLimiter):
    PRESENCE = 0.2  # its ghost waiters are gone (their process "died") after 0.2 s


def admit(lim: RedisColdLimiter, token: str, refusing: bool) -> int:
    """The acquire script's answer for ``token``: the usual script, or the one sent after a
    refusal (which checks for the refusal first, then goes on as the usual one)."""
    if refusing:
        return int(lim._evalsha(lim._refusing_script, lim._refusing_head, token))
    return lim._admit(token)[0]


@pytest.mark.parametrize("refusing", [False, True])
def test_a_full_queue_with_a_waiter_gone_admits_instead_of_refusing(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter], refusing: bool
) -> None:
    """Every slot held and every place taken, but one waiter no longer present: the acquire
    script reaps it and admits the newcomer to its place."""
    lasting = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=120.0)
    fleeting = make_limiter(cls=_Fleeting, active=1, queue=2, wait=60.0, lease=120.0)
    start = server_ms(client)
    assert lasting._admit("holder")[0] == GRANTED
    assert fleeting._admit("dead")[0] == QUEUED
    assert lasting._admit("live")[0] == QUEUED
    assert lasting._admit("refused")[0] == FULL
    wait_until("the dead waiter's presence ended", lambda: server_ms(client) > start + 300)
    assert admit(lasting, "next", refusing) == QUEUED
    assert client.zrange(lasting.keys[1], 0, -1) == [b"live", b"next"]
    assert client.zrange(lasting.keys[0], 0, -1) == [b"holder"]
    s = lasting.stats()
    assert (s.queued, s.rejected_full, s.lease_lost) == (2, 1, 0)


@pytest.mark.parametrize("refusing", [False, True])
def test_a_full_queue_behind_a_lost_lease_promotes_instead_of_refusing(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter], refusing: bool
) -> None:
    """Every place taken and the one slot held by a lease that ended: the acquire script
    reaps the holder (counted lost), promotes the oldest waiter (its doorbell rings) and
    admits the newcomer to the place that freed."""
    short = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=0.2)
    lasting = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=120.0)
    start = server_ms(client)
    assert short._admit("holder")[0] == GRANTED
    assert lasting._admit("w1")[0] == QUEUED
    assert lasting._admit("w2")[0] == QUEUED
    wait_until("the holder's lease ended", lambda: server_ms(client) > start + 300)
    assert admit(lasting, "next", refusing) == QUEUED
    assert client.zrange(lasting.keys[0], 0, -1) == [b"w1"]
    assert client.llen(lasting._bell + "w1") == 1
    assert client.zrange(lasting.keys[1], 0, -1) == [b"w2", b"next"]
    s = lasting.stats()
    assert (s.active, s.queued, s.lease_lost, s.rejected_full) == (1, 2, 1, 0)


def test_the_hot_scripts_reap_a_lease_ended_beside_a_free_slot(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """A slot free and another held by a lease that ended: neither a fast acquire nor a
    release skips the reap (read straight from Redis, not through stats, which reaps too)."""
    short = make_limiter(active=3, queue=1, lease=0.2)
    lasting = make_limiter(active=3, queue=1, lease=120.0)
    holders_key, stats_key = lasting.keys[0], lasting.keys[4]
    start = server_ms(client)
    assert short._admit("ended-1")[0] == GRANTED
    kept = lasting.acquire()
    wait_until("the short lease ended", lambda: server_ms(client) > start + 300)
    with lasting.acquire():
        assert client.hget(stats_key, "lease_lost") == b"1"
        assert client.zscore(holders_key, "ended-1") is None
    assert short._admit("ended-2")[0] == GRANTED
    wait_until("the second short lease ended", lambda: server_ms(client) > start + 600)
    kept.release()
    assert client.hget(stats_key, "lease_lost") == b"2"
    assert client.zcard(holders_key) == 0


def test_a_waiters_poll_repairs_a_free_slot_left_with_a_waiter(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """The hot scripts trust that a free slot means an empty queue (every script fills);
    if that ever breaks (here: the holders key evicted), the waiter's own poll counts the
    queue, promotes it and claims the slot."""
    lim = make_limiter(active=1, queue=1, wait=60.0)
    holder = lim.acquire()
    assert lim._admit("waiter")[0] == QUEUED
    client.delete(lim.keys[0])  # the holder's slot vanishes without a script noticing
    assert lim._poll("waiter", STAY)[0] == POLL_GRANTED
    assert client.zrange(lim.keys[0], 0, -1) == [b"waiter"]
    holder.release()  # gone already: frees nothing
    assert lim.stats().active == 1


def test_a_waiter_that_stops_polling_is_dropped(
    make_limiter: Callable[..., RedisColdLimiter], threads: Any
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    with lim.acquire():
        assert lim._admit("dead")[0] == QUEUED  # a waiter whose process died at once
        with pytest.raises(Busy):
            lim.acquire()  # its place is taken...
        wait_until("the dead waiter dropped", lambda: lim.stats().queued == 0)
        cancel = threading.Event()
        attempt = start_acquire(threads, lim, cancel, name="next")  # ...and free again
        wait_until("the next waiter admitted", lambda: lim.stats().queued == 1)
        cancel.set()
        attempt.wait_done()
        assert isinstance(attempt.error, Cancelled)
    assert lim._poll("dead", STAY)[0] == 5  # were it only paused, it would find itself gone


def test_a_promoted_waiter_that_never_claims_gives_the_slot_back(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    holder = lim.acquire()
    assert lim._admit("dead")[0] == QUEUED
    holder.release()  # promoted, with a short claim lease it never turns into a grant
    assert lim.stats().active == 1
    wait_until("the unclaimed slot came back", lambda: lim.stats().active == 0)
    assert lim.stats().lease_lost == 1
    assert_exact_capacity(lim)


def test_redis_restarted_empty_recovers(
    redis_server: RedisServer,
    make_limiter: Callable[..., RedisColdLimiter],
    make_client: Callable[..., CountingRedis],
    client: CountingRedis,
    threads: Any,
) -> None:
    # The waiter's client retries through the restart (what a client with retries does; the
    # count and backoff are set here so that redis-py's defaults of the day do not matter).
    patient = make_client(retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 50))
    lim = make_limiter(active=2, queue=1, wait=60.0)  # the same settings as the waiter's
    before = lim.acquire()
    lim.acquire().release()
    other = lim.acquire()
    waiter = start_acquire(threads, make_limiter(client=patient, active=2, queue=1, wait=60.0))
    wait_until("queued", lambda: lim.stats().queued == 1)
    redis_server.restart_empty()
    waiter.wait_done(timeout=15)
    assert isinstance(waiter.error, Busy) and waiter.error.reason == "timeout", waiter.error
    other.release()
    # The state and the scripts are gone (the waiter only ran its poll script since).
    assert client.script_exists(lim._acquire_script.sha) == [False]
    before.release()  # a grant from before the restart: a no-op
    assert before.lease_lost  # type: ignore[attr-defined]
    s = lim.stats()
    assert (s.active, s.queued, s.acquired, s.rejected_timeout) == (0, 0, 0, 1)
    assert_exact_capacity(lim)  # the scripts were loaded again, and every slot is there


# -- names, keys, composition -----------------------------------------------------------------


def test_two_names_are_independent(make_limiter: Callable[..., RedisColdLimiter]) -> None:
    a = make_limiter(name="a", active=1, queue=0)
    b = make_limiter(name="b", active=1, queue=0)
    with a.acquire():
        with pytest.raises(Busy):
            a.acquire()
        with b.acquire():
            assert (a.stats().active, b.stats().active) == (1, 1)
    assert (a.stats().acquired, b.stats().acquired) == (1, 1)


def test_every_key_carries_the_hash_tag(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(name="tagged", prefix="svc", active=1, queue=2, wait=60.0)
    holder = lim.acquire()
    assert lim._admit("w1")[0] == QUEUED
    assert lim._admit("w2")[0] == QUEUED
    holder.release()  # w1 promoted: its doorbell exists
    keys = [k.decode() for k in client.keys("*")]
    # holders, queue, alive, deadline, stats, seq, settings, a doorbell, and the fair queue's
    # three: the waiters' clients, the waiting clients, and the anonymous client's own waiters
    assert len(keys) == 11, keys
    assert "{svc:tagged}:settings" in keys, keys
    assert all(k.startswith("{svc:tagged}:") for k in keys), keys
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_coldpath_runs_on_the_shared_limiter(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    path = ColdPath(make_limiter(active=1, queue=0))
    assert path.get("k", lambda: "built") == "built"
    assert path.get("k", lambda: "again") == "built"
    s = path.stats()
    assert (s.acquired, s.active, s.builds, s.hits) == (1, 0, 1, 1)


# -- the scripts against a model --------------------------------------------------------------


class ScriptMachine(RuleBasedStateMachine):
    """Random sequences of the scripts (admit, release, a waiter's poll, a give-up), run on
    ghosts so that nothing expires and no thread runs, checked after every step against a
    plain model: who holds a slot, the queue in arrival order, and every counter."""

    ACTIVE, QUEUE = 2, 3

    def __init__(self) -> None:
        super().__init__()
        assert MACHINE_CLIENT, "the test sets the client"
        self.client = MACHINE_CLIENT[0]
        self.client.flushall()
        self.lim = _Ghosts(
            self.client, "machine", self.ACTIVE, self.QUEUE, wait=3600.0, lease=3600.0
        )
        self.holders: set[str] = set()  # claimed grants
        self.promoted: set[str] = set()  # handed a slot, not yet claimed by a poll
        self.queue: list[str] = []
        self.counts: Counter[str] = Counter()
        self.next_token = 0

    def teardown(self) -> None:
        self.lim.close()

    def _hand_off(self) -> None:
        while len(self.holders) + len(self.promoted) < self.ACTIVE and self.queue:
            self.promoted.add(self.queue.pop(0))

    @rule()
    def admit(self) -> None:
        token = f"t{self.next_token}"
        self.next_token += 1
        status = self.lim._admit(token)[0]
        if len(self.holders) + len(self.promoted) < self.ACTIVE:
            expected = GRANTED
            self.holders.add(token)
            self.counts["acquired"] += 1
        elif len(self.queue) >= self.QUEUE:
            expected = FULL
            self.counts["rejected_full"] += 1
        else:
            expected = QUEUED
            self.queue.append(token)
        assert status == expected

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.holders)))
        mine = self.lim._free(token)
        assert mine == 1
        self.holders.discard(token)
        self._hand_off()

    @precondition(lambda self: self.queue or self.promoted)
    @rule(data=st.data(), give_up=st.booleans())
    def poll(self, data: st.DataObject, give_up: bool) -> None:
        token = data.draw(st.sampled_from(sorted(self.promoted) + self.queue))
        outcome = self.lim._poll(token, GIVE_UP if give_up else STAY)[0]
        if give_up:
            expected = POLL_CANCELLED
            self.counts["cancelled"] += 1
            if token in self.promoted:
                self.promoted.discard(token)
                self._hand_off()
            else:
                self.queue.remove(token)
        elif token in self.promoted:
            expected = POLL_GRANTED
            self.promoted.discard(token)
            self.holders.add(token)
            self.counts["acquired"] += 1
        else:
            expected = POLL_WAITING
        assert outcome == expected

    @rule()
    def poll_a_stranger(self) -> None:
        """A token Redis does not know (dropped, or from before a restart) is told it is
        gone, and changes nothing."""
        outcome = self.lim._poll("stranger", STAY)[0]
        assert outcome == 5
        self.counts["rejected_timeout"] += 1

    @invariant()
    def redis_matches_the_model(self) -> None:
        holders_key, queue_key = self.lim.keys[0], self.lim.keys[1]
        held = {t.decode() for t in self.client.zrange(holders_key, 0, -1)}
        queued = [t.decode() for t in self.client.zrange(queue_key, 0, -1)]
        assert held == self.holders | self.promoted
        assert queued == self.queue
        bells = {k.decode().rsplit(":", 1)[1] for k in self.client.keys(self.lim._bell + "*")}
        assert bells == self.promoted, "a doorbell rings exactly for the promoted"
        s = self.lim.stats()
        assert s.active <= self.ACTIVE and s.queued <= self.QUEUE
        for name in ("acquired", "rejected_full", "rejected_timeout", "cancelled"):
            assert getattr(s, name) == self.counts[name], name
        assert s.lease_lost == 0


class _Ghosts(RedisColdLimiter):
    PRESENCE = 3600.0  # nobody is dropped for not polling during a run


#: The state machine's client, set by the test (Hypothesis builds the machine itself).
MACHINE_CLIENT: list[CountingRedis] = []


def test_the_scripts_follow_the_model(client: CountingRedis) -> None:
    MACHINE_CLIENT[:] = [client]
    try:
        run_state_machine_as_test(
            ScriptMachine,
            settings=settings(
                max_examples=40,
                stateful_step_count=40,
                database=None,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        MACHINE_CLIENT.clear()
