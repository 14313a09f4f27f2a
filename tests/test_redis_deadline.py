"""No wasted waits on the shared limiter, on a real redis-server: Redis times the grants
waiters were promoted to and keeps the budget's estimate; the acquire script refuses at once
(``Busy("deadline")``) a newcomer whose place cannot start within its wait, and exactly at it
admits it; a timed release refuses the waiters the estimate put past their deadline, waking a
real waiter at once; places are round-robin across clients; ``deadline=False`` is the budget's
setting; the cold lead (one script for flight, cache and acquire) refuses the same way through
the Flask extension.

design:

    Redis's clock cannot be faked, so the estimate is either taught with real grants held until
    Redis's own clock has moved a given time (``server_ms``, a state waited for) - the
    timings are then only known from below - or written straight into the budget's stats hash
    (``estimate_ms``, where the scripts keep it) when a test is about the decision and not the
    estimate. Queued leaders are ghosts (``LimiterScript``: queued by the script, never
    polling, with a presence of minutes) unless a test needs a waiter to be woken; holders
    are ghosts too. Margins are whole seconds against a few milliseconds of script time, so
    no outcome depends on the machine's speed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter
from tests.support.limiter import start_acquire
from tests.support.redis_limiters import GRANTED, QUEUED, LimiterScript, doorbell, server_ms
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

LATE = 7  # the acquire's and the poll's reply: refused, its place cannot start in time


class Ghostly(RedisColdLimiter):
    PRESENCE = 120.0  # ghost waiters (queued by the script, never polling) stay


def tag(lim: RedisColdLimiter) -> str:
    return lim.keys[0].rsplit(":", 1)[0]


def teach(client: redis.Redis, lim: RedisColdLimiter, estimate_ms: int) -> None:
    """The budget's estimate, written where the scripts keep it (as if taught)."""
    client.hset(tag(lim) + ":stats", "estimate_ms", estimate_ms)


def late_of(client: redis.Redis, lim: RedisColdLimiter, token: str) -> int | None:
    """A ghost refused late: its doorbell's Retry-After (s); None if it was not."""
    rung = client.lrange(doorbell(lim, token), 0, -1)
    late = [r for r in rung if r.startswith(b"l")]
    return int(late[0][1:]) if late else None


def promoted_ghost(ghosts: LimiterScript, token: str) -> None:
    """``token`` holds the only slot as a promoted (timed) grant: a ghost queued behind a
    fast-path ghost that then releases."""
    assert ghosts.acquire("fast-" + token)[0] == GRANTED
    assert ghosts.acquire(token)[0] == QUEUED
    assert ghosts.release("fast-" + token) == 1  # promoted: its grant is timed from now


Taught = Callable[..., tuple[RedisColdLimiter, LimiterScript]]


@pytest.fixture
def taught(client: redis.Redis, make_limiter: Callable[..., RedisColdLimiter]) -> Taught:
    """``taught(name, estimate_ms, wait=3.0, promoted=False, **kwargs)``: a budget of one
    slot and eight places (``Ghostly``, more settings in ``kwargs``) whose slot the ghost
    ``holder`` holds (a fast-path grant, counted as ending now; ``promoted``, a grant timed
    from now) and whose estimate is ``estimate_ms``: the limiter and its ghosts."""

    def make(
        name: str, estimate_ms: int, wait: float = 3.0, promoted: bool = False, **kwargs: Any
    ) -> tuple[RedisColdLimiter, LimiterScript]:
        lim = make_limiter(cls=Ghostly, name=name, active=1, queue=8, wait=wait, **kwargs)
        ghosts = LimiterScript(client, lim)
        if promoted:
            promoted_ghost(ghosts, "holder")
        else:
            assert ghosts.acquire("holder")[0] == GRANTED
        teach(client, lim, estimate_ms)
        return lim, ghosts

    return make


def held_for(client: redis.Redis, since_ms: int, ms: int) -> None:
    """Wait until Redis's own clock is ``ms`` past ``since_ms``."""
    wait_until(f"{ms} ms on Redis's clock", lambda: server_ms(client) >= since_ms + ms)


# -- the estimate -----------------------------------------------------------------------------


def test_promoted_grants_are_timed_in_redis_and_the_estimate_is_the_smallest_of_four(
    client: redis.Redis, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(cls=Ghostly, name="taught", active=1, queue=4, wait=60.0)
    ghosts = LimiterScript(client, lim)
    stats = tag(lim) + ":stats"
    for _ in range(3):  # fast-path grants are never timed
        assert ghosts.acquire("fast")[0] == GRANTED
        assert ghosts.release("fast") == 1
    assert client.llen(tag(lim) + ":took") == 0
    held = [400, 100, 300, 200]
    for i, ms in enumerate(held):
        promoted_ghost(ghosts, f"g{i}")
        start = server_ms(client)
        held_for(client, start, ms)
        if i < 3:
            assert ghosts.release(f"g{i}", True) == 1
            assert client.hget(stats, "estimate_ms") is None  # fewer than four: none
    assert ghosts.release("g3", True) == 1
    took = sorted(int(t) for t in client.lrange(tag(lim) + ":took", 0, -1))
    assert len(took) == 4 and all(t >= ms for t, ms in zip(took, sorted(held), strict=True))
    assert int(client.hget(stats, "estimate_ms")) == took[0]  # the smallest of four
    assert client.hlen(tag(lim) + ":since") == 0  # every timed grant's start forgotten
    assert lim.stats().deadline == 0


# -- a newcomer refused at once -------------------------------------------------------------


def test_exactly_at_the_wait_is_in_time(taught: Taught) -> None:
    lim, ghosts = taught("boundary", 1500)  # a fast-path holder: counted as ending now
    # p = 0, 1, 2 start 0, 1.5 and 3.0 s from now; the third, worked out in its own script
    # (one clock reading for its deadline and its start), is exactly in time.
    for p in range(3):
        assert ghosts.acquire(f"w{p}")[0] == QUEUED
    assert lim.stats().deadline == 0


def test_a_newcomer_that_cannot_start_in_time_is_refused_at_once(
    client: redis.Redis, taught: Taught
) -> None:
    lim, ghosts = taught("at-once", 1500, wait=3.2, retry_after=1)  # a fast-path holder
    # p = 0, 1, 2 start 0, 1.5 and 3.0 s from now: in time (with 0.2 s to spare for the
    # third, while the next leaders arrive).
    for p in range(3):
        assert ghosts.acquire(f"w{p}")[0] == QUEUED
    assert ghosts.acquire("w3") == (LATE, 2)  # 4.5 s: refused, Retry-After ceil(4.5 - 3.2)
    with pytest.raises(Busy) as info:
        lim.acquire()  # the same through acquire(), in one round trip
    assert (info.value.reason, info.value.retry_after) == ("deadline", 2)
    s = lim.stats()
    assert (s.queued, s.deadline, s.rejected_full, s.rejected_timeout) == (3, 2, 0, 0)
    assert client.zcard(tag(lim) + ":queue") == 3


def test_a_timed_holder_counts_what_it_still_needs(taught: Taught) -> None:
    # The holder promoted just now: it needs about the estimate still.
    lim, ghosts = taught("holder-left", 10_000, promoted=True)
    # Its slot frees in about 10 s, far past the wait: even the first place is late.
    status, retry = ghosts.acquire("w0")
    assert status == LATE and retry >= 2
    # The same after a fast-path holder (counted as ending now): the first place is in time.
    other, other_ghosts = taught("holder-fast", 10_000)
    assert other_ghosts.acquire("w0")[0] == QUEUED
    assert other_ghosts.acquire("w1")[0] == LATE


def test_the_budgets_deadline_setting_turns_it_off(client: redis.Redis, taught: Taught) -> None:
    lim, ghosts = taught("off", 10_000, deadline=False)
    for p in range(8):
        assert ghosts.acquire(f"w{p}")[0] == QUEUED  # never refused for its place
    assert client.hget(tag(lim) + ":settings", "deadline") == b"0"
    assert lim.stats().deadline == 0
    # Off, nothing is timed either: a promotion leaves no start, its release no time.
    assert ghosts.release("holder") == 1  # w0 promoted
    assert ghosts.release("w0", True) == 1
    assert client.exists(tag(lim) + ":since", tag(lim) + ":took") == 0


# -- waiters refused when the estimate grows ------------------------------------------------


def test_waiters_are_refused_when_a_timed_release_finds_them_late(
    client: redis.Redis, taught: Taught, threads: ThreadRunner,
) -> None:
    lim, ghosts = taught("grown", 1000, wait=10.0, promoted=True, retry_after=1)
    # free <= 1 s: places 0..4 start within 1 + 4 = 5 s of now, well within 10 s.
    for p in range(4):
        assert ghosts.acquire(f"w{p}")[0] == QUEUED
    real = start_acquire(threads, lim, threading.Event(), name="real")  # p = 4
    wait_until("the real waiter queued", lambda: lim.stats().queued == 5)
    teach(client, lim, 6000)  # the estimate grew (fewer than four timings: it stays)
    # The timed release: w0 promoted (6 s to go), w1 at 6 s (in time), w2 at 12 s and the
    # rest later: past their deadlines (10 s less the moment they have waited), refused.
    assert ghosts.release("holder", True) == 1
    assert [t.decode() for t in client.zrange(lim.keys[0], 0, -1)] == ["w0"]
    assert [t.decode() for t in client.zrange(tag(lim) + ":queue", 0, -1)] == ["w1"]
    assert late_of(client, lim, "w1") is None
    for token in ("w2", "w3"):
        retry = late_of(client, lim, token)
        assert retry is not None and retry >= 2, token
        assert ghosts.poll(token, 0) == (LATE, retry)  # its next poll says so, once
    real.wait_done()  # woken by its doorbell, not at the end of its 10 s wait
    assert isinstance(real.error, Busy), real.error
    assert real.error.reason == "deadline" and real.error.retry_after >= 2
    s = lim.stats()
    assert (s.queued, s.deadline, s.rejected_timeout) == (1, 3, 0)


def test_places_are_round_robin_across_clients(client: redis.Redis, taught: Taught) -> None:
    lim, ghosts = taught("turns", 1000, wait=3.5, retry_after=1)
    for i in range(4):  # a's places 0..3 start 0..3 s from now: all in time
        assert ghosts.acquire(f"a{i}", "a")[0] == QUEUED
    # b0 is served second (1 s, in time): a3 goes from 3 to 4 s, past its wait, and is
    # refused for it (Retry-After ceil(0.5 s + the moments it waited)).
    assert ghosts.acquire("b0", "b")[0] == QUEUED
    assert late_of(client, lim, "a3") == 1
    assert ghosts.acquire("b1", "b")[0] == QUEUED  # a0 b0 a1 b1: 3 s; a2 goes to 4 s
    assert late_of(client, lim, "a2") == 1
    assert ghosts.acquire("b2", "b") == (LATE, 1)  # a0 b0 a1 b1 b2: 4 s
    order = []
    for holder in ("holder", "a0", "b0", "a1"):
        assert ghosts.release(holder) == 1
        order.append(client.zrange(lim.keys[0], 0, -1)[0].decode())
    assert order == ["a0", "b0", "a1", "b1"]
    assert lim.stats().deadline == 3


# -- through the Flask extension, the cold lead's one script ---------------------------------


def test_the_extension_on_redis_answers_429_at_once(
    client: redis.Redis, redis_server: RedisServer,
    taught: Taught,
) -> None:
    from flask import Flask

    from reachlimit.flask import ReachLimit

    app = Flask("deadline-redis")
    # client "none": every request is the ghosts' anonymous client (one FIFO line).
    rl = ReachLimit(app, redis_url=redis_server.url(), redis_prefix="dl", active=1, queue=8,
                    wait=3, client="none")  # fmt: skip
    built: list[str] = []

    @app.get("/r/<key>")
    def report(key: str) -> Any:
        return rl.cold(key, lambda: built.append(key) or {"key": key})

    # The budget's state, made by a limiter of the test's on the same keys and settings.
    lim, ghosts = taught("cold", 1000, prefix="dl")
    for p in range(2):  # 0 and 1 s: in time
        assert ghosts.acquire(f"w{p}")[0] == QUEUED
    teach(client, lim, 2500)
    refused = app.test_client().get("/r/late")  # the third place: 5 s
    assert refused.status_code == 429, refused.data
    assert refused.headers["Retry-After"] == "2"
    assert "too slowly" in refused.get_json()["error"]
    assert refused.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"
    with app.app_context():
        figures = rl.stats().as_dict()
    assert (figures["deadline"], figures["queued"], figures["rejected_timeout"]) == (1, 2, 0)
    assert built == []
    rl.close(app)
