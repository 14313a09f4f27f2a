"""Fair admission in RedisColdLimiter: the rules of ``tests/support/fairness.py`` against the
real redis-server, what only the shared queue has (the displaced waiter's doorbell, a victim
whose process is gone, client names), and displacement racing the other ends of a wait."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter, client_id
from tests.support import fairness
from tests.support.limiter import assert_exact_capacity, start_acquire
from tests.support.redis_clients import Commands, CountingRedis
from tests.support.redis_limiters import LimiterScript, doorbell
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

_names = itertools.count()


@pytest.fixture
def make(make_limiter: Callable[..., RedisColdLimiter]) -> Callable[..., RedisColdLimiter]:
    """``make(active, queue, **kwargs)``: a limiter on a fresh name (a minute's wait unless
    given), closed at teardown."""

    def build(active: int, queue: int, **kwargs: Any) -> RedisColdLimiter:
        kwargs.setdefault("wait", 60.0)
        return make_limiter(name=f"fair{next(_names)}", active=active, queue=queue, **kwargs)

    return build


@pytest.mark.parametrize(
    "check",
    fairness.RULES,
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_fair_admission_rule(
    threads: ThreadRunner, make: Callable[..., RedisColdLimiter], check: Any
) -> None:
    check(threads, make)


def test_a_displaced_waiter_learns_it_through_its_doorbell_at_once(
    threads: ThreadRunner, make: Callable[..., RedisColdLimiter],
    make_client: Callable[..., redis.Redis], client: CountingRedis,
) -> None:
    """The victim never polls (its poll interval is longer than the test): its blocking read
    of its doorbell is what ends its wait, with "displaced"."""
    lim = make(1, 2)
    # The victim's own plain client, named so that what it sends can be counted at the server.
    own = make_client(redis.Redis, client_name="victim")
    victim_lim = RedisColdLimiter(own, lim.name, 1, 2, wait=60.0)
    victim_lim.POLL_EVERY = 30.0  # type: ignore[misc]
    # A limiter object's first call also checks the budget's settings in Redis (one more
    # round trip, once): made here, and not counted below.
    victim_lim.stats()
    commands = Commands(client)
    holder = lim.acquire(None, "a")
    first = start_acquire(threads, lim, None, name="a1", client="a")
    wait_until("a1 queued", lambda: lim.stats().queued == 1)
    victim = start_acquire(threads, victim_lim, None, name="a2", client="a")
    wait_until("a2 queued", lambda: lim.stats().queued == 2)
    newcomer = start_acquire(threads, lim, None, name="b1", client="b")
    victim.wait_done()
    assert isinstance(victim.error, Busy) and victim.error.reason == Busy.DISPLACED
    sent = commands.until_now(client_name="victim")
    assert sent["EVALSHA"] == 1, sent  # its acquire: no poll, no script after it
    s = lim.stats()
    assert (s.queued, s.displaced, s.rejected_timeout, s.rejected_full) == (2, 1, 0, 0)
    holder.release()
    first.wait_done()
    first.release()
    newcomer.wait_done()
    newcomer.release()
    assert_exact_capacity(lim)
    victim_lim.close()


def test_a_victim_whose_process_is_gone_loses_nothing(
    client: CountingRedis, make: Callable[..., RedisColdLimiter], threads: ThreadRunner
) -> None:
    """The displaced place passes to the newcomer in the displacing script itself: a victim
    that never polls again (its process died) changes nothing afterwards."""
    lim = make(1, 2, wait=60.0)
    holder = lim.acquire(None, "a")
    # Two waiters of client "a" that never poll: a process that died after queueing them.
    a = client_id("a")
    ghosts = LimiterScript(client, lim)
    assert ghosts.acquire("ghost-1", a)[0] == 2
    assert ghosts.acquire("ghost-2", a)[0] == 2
    newcomer = start_acquire(threads, lim, threading.Event(), name="b1", client="b")
    wait_until("ghost-2 displaced", lambda: lim.stats().displaced == 1)
    assert client.lindex(doorbell(lim, "ghost-2"), 0) == b"d"
    wait_until("ghost-1's presence ended", lambda: lim.stats().queued == 1, timeout=10.0)
    holder.release()
    newcomer.wait_done()
    assert newcomer.grant is not None
    newcomer.release()
    s = lim.stats()
    assert (s.active, s.queued, s.displaced, s.rejected_timeout) == (0, 0, 1, 0)
    assert_exact_capacity(lim)
    for key in client.keys(lim.keys[0].rsplit(":", 1)[0] + ":c:*"):
        assert client.zcard(key) == 0, key  # no client keeps a waiter that is gone


def test_client_names_and_their_ids() -> None:
    """Ids are the same for the same name in every process, differ between names of
    different types, and anything else is a TypeError before any call to Redis."""
    assert client_id("127.0.0.1") == client_id("127.0.0.1")
    ids = {client_id(c) for c in ("1", b"1", 1, ("1",), ("1", 1), (b"1", "1"), "")}
    assert len(ids) == 7
    assert all(len(i) == 16 for i in ids) and "-" not in ids
    assert client_id(True) == client_id(1)  # one client, as in the in-process limiter's dict
    for bad in (1.5, ["x"], {"a": 1}, ("ok", 2.0)):
        with pytest.raises(TypeError, match="client must be"):
            client_id(bad)


def test_an_unknown_kind_of_client_is_a_type_error_and_changes_nothing(
    make: Callable[..., RedisColdLimiter],
) -> None:
    lim = make(1, 1)
    before = lim.stats()
    with pytest.raises(TypeError):
        lim.acquire(None, 3.5)
    assert lim.stats() == before


def _race_round(
    threads: ThreadRunner, make: Callable[..., RedisColdLimiter], other_end: str, rng: Any
) -> str:
    """a's newest waiter ends another way (``other_end``) while b's newcomer arrives, from one
    Barrier with a random skew: exactly one outcome, every place and slot back."""
    lim = make(1, 2, wait=60.0 if other_end != "timeout" else 0.3)
    holder = lim.acquire(None, "a")
    first = start_acquire(  # promoted, it releases at once: the next in turn goes on
        threads, lim, threading.Event(), name="a1", client="a",
        on_grant=lambda attempt: attempt.release(),
    )
    wait_until("a1 queued", lambda: lim.stats().queued == 1)
    cancel = threading.Event()
    victim = start_acquire(threads, lim, cancel, name="a2", client="a")
    wait_until("a2 queued", lambda: lim.stats().queued == 2)
    go = threading.Barrier(2, timeout=10.0)
    # A random skew on each side, so that either may come first; for "timeout" the newcomer
    # comes around the end of a2's 0.3 s wait. Which one wins is free; the checks hold for
    # both, and no skew makes the test pass.
    other_skew, newcomer_skew = rng.random() * 0.01, rng.random() * 0.01
    if other_end == "timeout":
        newcomer_skew = 0.27 + rng.random() * 0.06

    def other() -> None:
        go.wait()
        time.sleep(other_skew)
        if other_end == "promotion":
            holder.release()
        elif other_end == "cancel":
            cancel.set()

    threads.start(other, name="other-end")
    go.wait()
    time.sleep(newcomer_skew)
    newcomer = start_acquire(threads, lim, threading.Event(), name="b1", client="b")
    victim.wait_done()
    error = victim.error
    outcome = error.reason if isinstance(error, Busy) else type(error).__name__
    if victim.grant is not None:  # the release won: a1 promoted, then a2 in its turn
        outcome = "granted"
        victim.release()
    if other_end != "promotion":
        holder.release()
    first.wait_done()
    newcomer.wait_done()
    if newcomer.grant is not None:
        newcomer.release()
    wait_until("drained", lambda: (lim.stats().active, lim.stats().queued) == (0, 0))
    s = lim.stats()
    ended = s.acquired + s.rejected_full + s.rejected_timeout + s.cancelled + s.displaced
    assert ended == 4, s  # the holder, a1, a2 and b1: each ended once, and counted once
    assert_exact_capacity(lim)
    return outcome


@pytest.mark.parametrize("other_end", ["promotion", "timeout", "cancel"])
def test_a_displacement_racing_another_end_of_the_wait(
    threads: ThreadRunner, make: Callable[..., RedisColdLimiter], other_end: str
) -> None:
    rng = random.Random(20261202)
    seen = [_race_round(threads, make, other_end, rng) for _ in range(64)]
    allowed = {
        "promotion": {Busy.DISPLACED, "granted"},  # a1 promoted then a2 displaced, or b1 refused
        "timeout": {Busy.DISPLACED, Busy.TIMEOUT},
        "cancel": {Busy.DISPLACED, "Cancelled"},
    }[other_end]
    assert set(seen) <= allowed, seen
    print(f"{other_end}: {sorted((o, seen.count(o)) for o in set(seen))}")
