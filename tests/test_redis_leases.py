"""Tests of reachlimit.redis.RedisColdLimiter against a real redis-server, in one process: leases
and their renewal, dead waiters and lost leases, a Redis restarted empty, names and keys, and
the scripts against a model.

This is the second half of the limiter's tests; the first half (construction, the fast path,
waiting) is ``tests/test_redis_limiter.py``, whose docstring says how both run: one server for
the module, flushed before each test, several limiter objects on one name standing for several
processes, *ghosts* (attempts the acquire script admitted that never poll nor renew) driven
through the script directly (``LimiterScript``), and waits for states, never sleeps.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
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

from reachlimit import Busy, Cancelled, ColdPath
from reachlimit.redis import RedisColdLimiter
from tests.support.limiter import (
    ProbeCancel,
    assert_exact_capacity,
    start_acquire,
)
from tests.support.redis_clients import RETRIED_ERRORS, CountingRedis, PausedRenewals
from tests.support.redis_limiters import (
    FULL,
    GIVE_UP,
    GRANTED,
    POLL_CANCELLED,
    POLL_GRANTED,
    POLL_WAITING,
    QUEUED,
    STAY,
    LimiterScript,
    doorbell,
    server_ms,
)
from tests.support.redis_server import RedisServer
from tests.support.refreshes import threads_named
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]



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
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    paused = make_client(PausedRenewals)
    lim = make_limiter(client=paused, active=1, queue=0, lease=0.5)
    paused.paused.set()  # the holder is "paused": its renewals never reach Redis
    stale = lim.acquire()
    wait_until("the lease ran out", lambda: lim.stats().lease_lost == 1)
    paused.paused.clear()
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


def holder_and_spied_waiter(
    make_client: Callable[..., CountingRedis],
    make_limiter: Callable[..., RedisColdLimiter],
    wait: float,
) -> tuple[BlockSpy, RedisColdLimiter, RedisColdLimiter]:
    """A :class:`BlockSpy`, a limiter (the holder's) and another on the same budget (one
    active, one queued, ``wait``) whose client is the spy (the waiter's)."""
    spy = make_client(BlockSpy)
    lim = make_limiter(active=1, queue=1, wait=wait)
    return spy, lim, make_limiter(client=spy, active=1, queue=1, wait=wait)


def test_a_waiter_with_a_cancel_token_blocks_in_short_slices_and_returns_its_place(
    make_client: Callable[..., CountingRedis],
    make_limiter: Callable[..., RedisColdLimiter],
    threads: Any,
) -> None:
    """Blocked on its doorbell, a waiter looks at its cancel token at least every
    ``CANCEL_POLL_INTERVAL`` (the local limiter's 50 ms slice): each BLPOP is that short."""
    spy, lim, waiting = holder_and_spied_waiter(make_client, make_limiter, wait=60.0)
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
    spy, lim, waiting = holder_and_spied_waiter(make_client, make_limiter, wait=60.0)
    before = threads_named("reachlimit-blpop-waker")
    with lim.acquire():
        cancel = threading.Event()
        attempt = start_acquire(threads, waiting, cancel, name="nudged")
        wait_until("three slices nudged", lambda: spy.sent["PING"] >= 3)
        assert len(spy.blocks) >= 2
        wakers = [t for t in threads_named("reachlimit-blpop-waker") if t not in before]
        assert len(wakers) == 1  # the waiter's first wait started its limiter's waker
        cancel.set()
        attempt.wait_done(timeout=10)
        assert isinstance(attempt.error, Cancelled), attempt.error
    waiting.close()
    assert not wakers[0].is_alive()
    assert lim.stats().queued == 0


def test_a_waiter_notices_its_deadline_while_blocked_on_its_doorbell(
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """No block outlasts the deadline by more than a millisecond, and no slice is longer
    than the cancel slice while a cancel token is watched: the timeout comes in time."""
    spy, lim, waiting = holder_and_spied_waiter(make_client, make_limiter, wait=0.3)
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


def holder_and_two_waiters(
    client: CountingRedis, holder: RedisColdLimiter, first: RedisColdLimiter,
    second: RedisColdLimiter, tokens: tuple[str, str, str],
) -> int:
    """The only slot taken by ``tokens[0]`` through ``holder``, then its two waiters queued
    (``tokens[1]`` through ``first``, ``tokens[2]`` through ``second``), each acquire straight
    through the script, with that limiter's settings (its presence, its lease). Returns
    Redis's time in ms from just before."""
    start = server_ms(client)
    holding, waiting_1, waiting_2 = tokens
    assert LimiterScript(client, holder).acquire(holding)[0] == GRANTED
    assert LimiterScript(client, first).acquire(waiting_1)[0] == QUEUED
    assert LimiterScript(client, second).acquire(waiting_2)[0] == QUEUED
    return start


def test_a_full_queue_with_a_waiter_gone_admits_instead_of_refusing(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """Every slot held and every place taken, but one waiter no longer present: the acquire
    script reaps it and admits the newcomer to its place."""
    lasting = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=120.0)
    fleeting = make_limiter(cls=_Fleeting, active=1, queue=2, wait=60.0, lease=120.0)
    start = holder_and_two_waiters(client, lasting, fleeting, lasting, ("holder", "dead", "live"))
    ghosts = LimiterScript(client, lasting)
    assert ghosts.acquire("refused")[0] == FULL
    wait_until("the dead waiter's presence ended", lambda: server_ms(client) > start + 300)
    assert ghosts.acquire("next")[0] == QUEUED
    assert client.zrange(lasting.keys[1], 0, -1) == [b"live", b"next"]
    assert client.zrange(lasting.keys[0], 0, -1) == [b"holder"]
    s = lasting.stats()
    assert (s.queued, s.rejected_full, s.lease_lost) == (2, 1, 0)


def test_a_full_queue_behind_a_lost_lease_promotes_instead_of_refusing(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """Every place taken and the one slot held by a lease that ended: the acquire script
    reaps the holder (counted lost), promotes the oldest waiter (its doorbell rings) and
    admits the newcomer to the place that freed."""
    short = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=0.2)
    lasting = make_limiter(cls=_Lasting, active=1, queue=2, wait=60.0, lease=120.0)
    start = holder_and_two_waiters(client, short, lasting, lasting, ("holder", "w1", "w2"))
    wait_until("the holder's lease ended", lambda: server_ms(client) > start + 300)
    assert LimiterScript(client, lasting).acquire("next")[0] == QUEUED
    assert client.zrange(lasting.keys[0], 0, -1) == [b"w1"]
    assert client.llen(doorbell(lasting, "w1")) == 1
    assert client.zrange(lasting.keys[1], 0, -1) == [b"w2", b"next"]
    s = lasting.stats()
    assert (s.active, s.queued, s.lease_lost, s.rejected_full) == (1, 2, 1, 0)


def test_the_hot_scripts_reap_a_lease_ended_beside_a_free_slot(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    """A slot free and another held by a lease that ended: neither a fast acquire nor a
    release skips the reap (read straight from Redis, not through stats, which reaps too).
    The budget's lease is the short one (``short`` started last); ``lasting``'s grants last
    its own longer lease, which it renews every third of."""
    short = make_limiter(active=3, queue=1, lease=0.2)
    lasting = make_limiter(active=3, queue=1, lease=120.0)
    lasting.stats()
    short.stats()
    holders_key, stats_key = lasting.keys[0], lasting.keys[4]
    start = server_ms(client)
    assert LimiterScript(client, short).acquire("ended-1")[0] == GRANTED
    kept = lasting.acquire()
    wait_until("the short lease ended", lambda: server_ms(client) > start + 300)
    with lasting.acquire():
        assert client.hget(stats_key, "lease_lost") == b"1"
        assert client.zscore(holders_key, "ended-1") is None
    assert LimiterScript(client, short).acquire("ended-2")[0] == GRANTED
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
    ghosts = LimiterScript(client, lim)
    holder = lim.acquire()
    assert ghosts.acquire("waiter")[0] == QUEUED
    client.delete(lim.keys[0])  # the holder's slot vanishes without a script noticing
    assert ghosts.poll("waiter", STAY)[0] == POLL_GRANTED
    assert client.zrange(lim.keys[0], 0, -1) == [b"waiter"]
    holder.release()  # gone already: frees nothing
    assert lim.stats().active == 1


def test_a_waiter_that_stops_polling_is_dropped(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter], threads: Any
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    ghosts = LimiterScript(client, lim)
    with lim.acquire():
        assert ghosts.acquire("dead")[0] == QUEUED  # a waiter whose process died at once
        with pytest.raises(Busy):
            lim.acquire()  # its place is taken...
        wait_until("the dead waiter dropped", lambda: lim.stats().queued == 0)
        cancel = threading.Event()
        attempt = start_acquire(threads, lim, cancel, name="next")  # ...and free again
        wait_until("the next waiter admitted", lambda: lim.stats().queued == 1)
        cancel.set()
        attempt.wait_done()
        assert isinstance(attempt.error, Cancelled)
    assert ghosts.poll("dead", STAY)[0] == 5  # were it only paused, it would find itself gone


def test_a_promoted_waiter_that_never_claims_gives_the_slot_back(
    client: CountingRedis, make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    lim = make_limiter(active=1, queue=1, wait=60.0)
    holder = lim.acquire()
    assert LimiterScript(client, lim).acquire("dead")[0] == QUEUED
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
    patient = make_client(redis.Redis, retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 50),
                          retry_on_error=RETRIED_ERRORS)
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
    # The script was gone: the first call since (the waiter's poll, or a renewal) loaded it
    # again (counted at the server, whose figures the restart emptied).
    loads = client.info("commandstats")
    assert sum(int(v["calls"]) for k, v in loads.items() if k.startswith("cmdstat_script")) >= 1
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
    LimiterScript.first_of_two_promoted(client, lim)  # w1 promoted: its doorbell exists
    # The prefix's registry of limiter names is one key of its own (no script touches it).
    assert client.smembers("svc:budgets") == {b"tagged"}
    keys = [k.decode() for k in client.keys("*") if k != b"svc:budgets"]
    # holders, queue, alive, deadline, stats, seq, settings, a doorbell, the fair queue's
    # three (the waiters' clients, the waiting clients, and the anonymous client's own
    # waiters), and when w1 was promoted (since: its grant is timed)
    assert len(keys) == 12, keys
    assert "{svc:tagged}:since" in keys, keys
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


#: The state machine's client, set by the test (Hypothesis builds the machine itself).
MACHINE_CLIENT: list[CountingRedis] = []


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
        self.script = LimiterScript(self.client, self.lim)
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
        status = self.script.acquire(token)[0]
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
        mine = self.script.release(token)
        assert mine == 1
        self.holders.discard(token)
        self._hand_off()

    @precondition(lambda self: self.queue or self.promoted)
    @rule(data=st.data(), give_up=st.booleans())
    def poll(self, data: st.DataObject, give_up: bool) -> None:
        token = data.draw(st.sampled_from(sorted(self.promoted) + self.queue))
        outcome = self.script.poll(token, GIVE_UP if give_up else STAY)[0]
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
        outcome = self.script.poll("stranger", STAY)[0]
        assert outcome == 5
        self.counts["rejected_timeout"] += 1

    @invariant()
    def redis_matches_the_model(self) -> None:
        holders_key, queue_key = self.lim.keys[0], self.lim.keys[1]
        held = {t.decode() for t in self.client.zrange(holders_key, 0, -1)}
        queued = [t.decode() for t in self.client.zrange(queue_key, 0, -1)]
        assert held == self.holders | self.promoted
        assert queued == self.queue
        bells = {k.decode().rsplit(":", 1)[1] for k in self.client.keys(doorbell(self.lim, "*"))}
        assert bells == self.promoted, "a doorbell rings exactly for the promoted"
        s = self.lim.stats()
        assert s.active <= self.ACTIVE and s.queued <= self.QUEUE
        for name in ("acquired", "rejected_full", "rejected_timeout", "cancelled"):
            assert getattr(s, name) == self.counts[name], name
        assert s.lease_lost == 0


class _Ghosts(RedisColdLimiter):
    PRESENCE = 3600.0  # nobody is dropped for not polling during a run


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
