"""The local limiter's state machine and thread storms, run on RedisColdLimiter, with the
invariants read from Redis itself.

* ``test_redis_limiter_state_machine``: ``LimiterMachine`` of
  ``tests/test_limiter_state_machine.py`` (same rules, same model, same drain) with its three
  backend hooks pointed at Redis: a waiter's admission is seen in the queue ZSET (its token
  recorded there); "expire" moves the waiter's deadline in Redis to the past (Redis's clock
  decides a wait, so that is how a deadline passes on purpose); the backend invariants are read
  in one MULTI/EXEC snapshot. A failing clock has no Redis counterpart (the limiter reads no
  local clock to decide anything), so the Redis machine's faults are the cancel object's.
* ``test_redis_thread_storm``: the storm of ``tests/test_storms.py`` (its worker threads with
  every kind of caller and leaving, and its canceller) on a Redis limiter, with a sampler that
  checks the Redis snapshot continuously.

Invariants from Redis, at every look: holders ZCARD <= active, queue ZCARD <= queue; every
queued token has exactly one presence entry and one deadline and no slot; nobody waits while
a slot is idle; a doorbell only for a promoted token. At the end: holders, queue, alive and
deadline empty, no doorbell, every counter equal to what the callers saw, and the full
capacity usable again.

Short form (part of every run) stays under half a minute on two cores;
``REACHTEST_STRESS=long`` runs about ten times more (see ``tests/support/stress.py``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import seed
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

import tests.test_limiter_state_machine as local_machine
import tests.test_storms as local_storms
from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter
from tests.support import stress
from tests.support.redis_clients import script_operation
from tests.support.redis_limiters import GIVE_UP, LimiterScript, doorbell
from tests.support.redis_server import RedisServer
from tests.test_redis_mutants import PROMOTION_KEEPS_PLACE, mutant

pytestmark = [pytest.mark.redis, *stress.MARKS]


def _client_of(redis_server: RedisServer, cls: type[redis.Redis] = redis.Redis) -> redis.Redis:
    return cls(
        host="127.0.0.1", port=redis_server.port, socket_timeout=0.5, socket_connect_timeout=0.5
    )


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = _client_of(redis_server)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def counted(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client that counts the waits it serves (``_WaitsCounted``), for the storm's limiters."""
    c = _client_of(redis_server, _WaitsCounted)
    yield c
    c.close()


def redis_snapshot(client: redis.Redis, lim: RedisColdLimiter) -> dict[str, Any]:
    """The limiter's state in Redis, read in one MULTI/EXEC (so between two scripts)."""
    holders_key, queue_key, alive_key, deadline_key = lim.keys[:4]
    pipe = client.pipeline(transaction=True)
    pipe.zrange(holders_key, 0, -1)
    pipe.zrange(queue_key, 0, -1)
    pipe.zrange(alive_key, 0, -1)
    pipe.hkeys(deadline_key)
    pipe.keys(doorbell(lim, "*"))
    pipe.hkeys(lim.keys[6])  # each waiter's client (the fair queue)
    holders, queue, alive, deadlines, bells, clientof = pipe.execute()
    return {
        "holders": {t.decode() for t in holders},
        "queue": [t.decode() for t in queue],
        "alive": {t.decode() for t in alive},
        "deadlines": {t.decode() for t in deadlines},
        "bells": {k.decode().removeprefix(doorbell(lim, "")) for k in bells},
        "clientof": {t.decode() for t in clientof},
    }


def redis_violations(client: redis.Redis, lim: RedisColdLimiter) -> list[str]:
    """What is wrong with the Redis state right now (see the module docstring)."""
    s = redis_snapshot(client, lim)
    held, queue = s["holders"], s["queue"]
    out = []
    if len(held) > lim.capacity_active:
        out.append(f"{len(held)} holders with active={lim.capacity_active}")
    if len(queue) > lim.capacity_queue:
        out.append(f"{len(queue)} queued with queue={lim.capacity_queue}")
    if not (set(queue) == s["alive"] == s["deadlines"]):
        out.append(f"queue {queue} / alive {s['alive']} / deadlines {s['deadlines']} differ")
    if held & set(queue):
        out.append(f"tokens both holding and queued: {held & set(queue)}")
    if queue and len(held) < lim.capacity_active:
        out.append(f"{len(queue)} waiting while only {len(held)} slots are held")
    # A doorbell is a holder's (promoted, not yet claimed) or a displaced waiter's ("d",
    # until it reads it; read after the snapshot, so one gone meanwhile is not a violation).
    stray = {
        t for t in s["bells"] - held if client.lindex(doorbell(lim, t), 0) not in (b"d", None)
    }
    if stray:
        out.append(f"a doorbell for a token that holds no slot: {stray}")
    if s["clientof"] != set(queue):
        out.append(f"the fair queue's clients {s['clientof']} are not the queue's {queue}")
    return out


def assert_nothing_left(client: redis.Redis, lim: RedisColdLimiter) -> None:
    s = redis_snapshot(client, lim)
    assert s == {"holders": set(), "queue": [], "alive": set(), "deadlines": set(),
                 "bells": set(), "clientof": set()}, s


# -- the state machine ------------------------------------------------------------------------


class _MachineLimiter(RedisColdLimiter):
    """Polls often, so that a deadline moved in Redis is seen within a few ms; a waiter the
    machine pins between two polls (a race rule) is not dropped for it."""

    POLL_EVERY = 0.02
    CANCEL_POLL_INTERVAL = 0.005
    PRESENCE = 5.0


#: The state machine's client, set by the test (Hypothesis builds the machine itself).
MACHINE_CLIENT: list[redis.Redis] = []


class RedisLimiterMachine(local_machine.LimiterMachine):
    """``LimiterMachine`` on a RedisColdLimiter (see the module docstring)."""

    @property
    def client(self) -> redis.Redis:
        return MACHINE_CLIENT[0]

    @initialize(active=st.integers(1, 3), queue=st.sampled_from([2, 0, 1, 3, 4, 2]))
    def make_limiter(self, active: int, queue: int) -> None:
        self.client.flushall()
        self.lim = _MachineLimiter(  # type: ignore[assignment]
            self.client, "machine", active, queue, wait=local_machine.WAIT
        )
        local_machine.MACHINE_COUNTS["examples"] += 1

    # The faults of the local machine, less the failing clock (nothing to fail here).
    @precondition(lambda self: any(c.token for c in self.queue))
    @rule(data=st.data(), what=st.just("token"))
    def fault_while_waiting(self, data: st.DataObject, what: str) -> None:
        super().fault_while_waiting(data, what)

    @precondition(lambda self: self.holders and self.queue and self.queue[0].token)
    @rule(data=st.data(), what=st.just("token"))
    def handoff_then_fault(self, data: st.DataObject, what: str) -> None:
        super().handoff_then_fault(data, what)

    def _admitted(self, client: local_machine.Client) -> None:
        # The machine is sequential: the newest ticket in the queue is this client's.
        newest = self.client.zrange(self.lim.keys[1], -1, -1)  # type: ignore[union-attr]
        assert newest, f"{client} not in the Redis queue"
        client.redis_token = newest[0].decode()  # type: ignore[attr-defined]

    def _trigger(self, victim: local_machine.Client, what: str) -> None:
        if what != "expire":
            local_machine.trigger(victim, what)
            return
        # Redis's clock decides a wait: the deadline itself is moved to the past, if the
        # victim is still queued (promoted already, it has no deadline left to pass).
        lim = self.lim
        assert lim is not None
        token = victim.redis_token  # type: ignore[attr-defined]
        if self.client.zscore(lim.keys[1], token) is not None:
            self.client.hset(lim.keys[3], token, 0)
            local_machine.MACHINE_COUNTS["deadlines moved"] += 1

    def _check_backend(self) -> None:
        lim = self.lim
        assert isinstance(lim, RedisColdLimiter)
        problems = redis_violations(self.client, lim)
        assert not problems, problems
        assert lim.stats().lease_lost == 0

    def teardown(self) -> None:
        lim = self.lim
        try:
            super().teardown()
            if isinstance(lim, RedisColdLimiter):
                assert_nothing_left(self.client, lim)
                s = lim.stats()
                for name in ("acquired", "rejected_full", "rejected_timeout", "cancelled"):
                    assert getattr(s, name) == self.expected[name], (name, s)
        finally:
            if isinstance(lim, RedisColdLimiter):
                lim.close()


seed(stress.SEED)(RedisLimiterMachine)


def test_redis_limiter_state_machine(client: redis.Redis) -> None:
    counts = local_machine.MACHINE_COUNTS
    counts.clear()

    def report(elapsed: float) -> None:
        print(
            f"\n[redis state machine] seed={stress.SEED} examples={counts['examples']} "
            f"steps={counts['steps']} fast={counts['fast_path']} queued={counts['queued']} "
            f"promotions={counts['promotions']} refused_full={counts['refused_full']} "
            f"deadlines moved={counts['deadlines moved']} "
            f"in {elapsed:.1f} s; races: {stress.races(counts)}"
        )

    MACHINE_CLIENT[:] = [client]
    examples, steps = (400, 60) if stress.LONG else (40, 40)
    try:
        stress.run_machine(RedisLimiterMachine, examples, steps, stress.LONG, report=report)
    finally:
        MACHINE_CLIENT.clear()
    assert counts["steps"] > 0 and counts["promotions"] > 0 and counts["queued"] > 0
    assert counts["deadlines moved"] > 0, "no wait was ever made to run out in Redis"


def test_the_redis_invariants_see_a_forgotten_or_doubled_place(client: redis.Redis) -> None:
    """The invariant check can fail: it passes on the real limiter, and reports a waiter that
    promotion left in the queue (a mutant of tests/test_redis_mutants.py), a waiter without its
    presence entry, and a waiter while a slot is idle."""

    class Patient(RedisColdLimiter):
        PRESENCE = 60.0  # the ghost waiters below are not dropped, however slow the machine

    class PatientBroken(mutant(PROMOTION_KEEPS_PLACE.changes)):  # type: ignore[misc]
        PRESENCE = 60.0

    real = Patient(client, "inv-real", 1, 2, wait=60.0)
    broken = PatientBroken(client, "inv-broken", 1, 2, wait=60.0)
    try:
        for lim in (real, broken):
            holder = lim.acquire()
            assert LimiterScript(client, lim).acquire("ghost")[0] == 2  # queued, never polls
            assert redis_violations(client, lim) == []
            holder.release()  # promotes "ghost"
        assert redis_violations(client, real) == []
        assert any("both holding and queued" in v for v in redis_violations(client, broken))

        assert LimiterScript(client, real).acquire("second")[0] == 2
        client.zrem(real.keys[2], "second")  # its presence entry forgotten
        assert any("differ" in v for v in redis_violations(client, real))
        client.zrem(real.keys[0], "ghost")  # the slot is idle, "second" still waits
        assert any("waiting while only 0" in v for v in redis_violations(client, real))
    finally:
        real.close()
        broken.close()


# -- the storm --------------------------------------------------------------------------------


class _WaitsCounted(redis.Redis):
    """The storm's limiters' client: counts, per thread, what a waiter sends once it waits (a
    block on its doorbell, a poll), in the storm's per-thread counter: the storm worker tells a
    fast path from a promotion, and a cancel seen at once from one seen while waiting, by
    whether that counter moved (on ColdLimiter, a clock read marks the same)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] == "BLPOP" or script_operation(args) == "poll":
            local_storms._tls.reads = local_storms._reads() + 1
        return super().execute_command(*args, **options)


class _Lasting(RedisColdLimiter):
    """The storm's settings (one budget, one set of settings), with waiters that stay present
    for the whole final check (``PRESENCE`` is not a budget setting: each process has its own)."""

    PRESENCE = 120.0


def _assert_full_capacity_usable_in_redis(client: redis.Redis, lim: _Lasting) -> None:
    """``_assert_full_capacity_usable`` of ``tests/test_storms.py`` on Redis: every slot and
    every queue place is still there: ``active`` fast-path grants (no wait entered), then
    ``queue`` admitted waiters, then an immediate queue_full refusal. The waiters are ghosts
    (the acquire script alone, never polling): a real waiter with the storm's short wait would
    time out during the check, and Redis decides a wait; a ghost stays queued while present
    (120 s here), and gives its place up at the end as a cancelled waiter does."""
    before = local_storms._reads()
    grants = [lim.acquire() for _ in range(lim.capacity_active)]
    assert local_storms._reads() == before, "a fast-path acquire entered a wait"
    ghosts = [f"final-check-{i}" for i in range(lim.capacity_queue)]
    script = LimiterScript(client, lim)
    try:
        assert [script.acquire(token)[0] for token in ghosts] == [2] * lim.capacity_queue
        with pytest.raises(Busy) as refused:
            lim.acquire()
        assert refused.value.reason == "queue_full"
    finally:
        cancelled = [script.poll(token, GIVE_UP)[0] for token in ghosts]  # 4 cancelled
        for grant in grants:
            grant.release()
    assert cancelled == [4] * lim.capacity_queue, cancelled
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), s


def _redis_sampler(
    client: redis.Redis, lim: RedisColdLimiter, storm: Any, tally: Counter[str]
) -> None:
    """Checks the Redis state continuously while the storm runs."""
    while not storm.stop.is_set():
        problems = redis_violations(client, lim)
        storm.violations.extend(problems)
        tally["samples"] += 1
        tally["saturated_samples"] += bool(client.zcard(lim.keys[1]))
        time.sleep(0.001)  # the sampler's pace, not a synchronisation


REDIS_STORM_CONFIGS = [  # (active, queue, wait seconds, threads, clients; the first crawls)
    (2, 4, 0.05, 8, ("a", "b", "c")),
    (1, 2, 0.03, 6, (None,)),
]


@pytest.mark.parametrize("active,queue,wait,threads,clients", REDIS_STORM_CONFIGS)
def test_redis_thread_storm(
    client: redis.Redis,
    counted: redis.Redis,
    active: int,
    queue: int,
    wait: float,
    threads: int,
    clients: tuple[str | None, ...],
) -> None:
    ops = 1000 if stress.LONG else 100
    rng = random.Random(f"{stress.SEED}-redis-{active}-{queue}-{wait}")
    lim = RedisColdLimiter(counted, "storm", active, queue, wait=wait)
    twin = _Lasting(counted, "storm", active, queue, wait=wait)  # for the final check
    storm = local_storms.Storm(active)
    tallies = [Counter[str]() for _ in range(threads + 2)]
    # Several clients: a crawler on most threads and one thread for each other client, each
    # pausing up to a quarter of the wait before a call, so that the others keep finding the
    # queue full of the crawler's waiters (the local storms' shape).
    whom = local_storms._clients_of_workers(clients, threads)
    think = wait / 4 if len(clients) > 1 else 0.0
    workers = [
        threading.Thread(
            target=local_storms._storm_worker,
            args=(lim, storm, random.Random(rng.random()), ops, tallies[i], whom[i], think),
            name=f"redis-storm-{i}",
            daemon=True,
        )
        for i in range(threads)
    ]
    helpers = [
        threading.Thread(
            target=_redis_sampler, args=(client, lim, storm, tallies[-1]), daemon=True
        ),
        threading.Thread(
            target=local_storms._storm_canceller,
            args=(storm, random.Random(rng.random()), wait / 2, tallies[-2]),
            daemon=True,
        ),
    ]
    try:
        elapsed = stress.run_storm_threads(workers, helpers, storm.stop, 30.0 + ops * wait * 4)

        label = f"redis storm A={active} Q={queue} wait={wait} clients={len(clients)}"
        tally = stress.storm_tally(label, tallies, ops, threads, elapsed)
        assert not storm.violations, storm.violations[:10]
        assert tally["samples"] > 0
        assert_nothing_left(client, lim)
        s = lim.stats()
        assert (s.active, s.queued, s.lease_lost) == (0, 0, 0), s
        stress.assert_storm_counted(s, tally, ops * threads)
        # A waiter displaced while its cancel object raised reports the error, not the
        # displacement Redis counted: between the two.
        assert tally["displaced"] <= s.displaced <= tally["displaced"] + tally["token_error"]
        assert storm.max_holding <= active and s.peak_active <= active
        assert s.peak_queued <= queue
        # The storm really went through the main paths. How many waiters time out or are
        # cancelled while waiting depends on the machine's pace (a few per run, sometimes
        # none), so it is not required here: the state machine above ends waits both ways on
        # purpose, and the counters are checked against the callers either way.
        assert tally["grant"] and tally["fast_path"] and tally["promoted"], tally
        assert tally["queue_full"], tally
        if len(clients) > 1:
            assert s.displaced, tally  # the crawler's waiters were displaced, on Redis too
        # Every slot and queue place is usable again (with waiters that stay queued).
        _assert_full_capacity_usable_in_redis(client, twin)
        assert_nothing_left(client, lim)
    finally:
        storm.stop.set()
        with storm.lock:
            for event in storm.events:
                event.set()
        for thread in workers + helpers:
            thread.join(stress.STEP_TIMEOUT)
        lim.close()
        twin.close()
