"""No ghost slots: a call whose reply is lost (Redis paused past the socket timeout, so the
script runs once Redis resumes, for a caller that has given up) leaves no slot and no queue
place that nobody owns, once its limiter's next round trip gives its token up; and a call that
reaches Redis only after its token was given up is refused.

Redis is paused with SIGSTOP by its PID (the ``live_redis`` fixture starts it again if a test
leaves it stopped). The test's own client reads Redis's state; the limiter under test has the
library's 0.5 s socket timeout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from reachlimit import Cancelled
from reachlimit.redis import RedisColdLimiter
from tests.support import HOST
from tests.support.limiter import ProbeCancel, assert_exact_capacity
from tests.support.redis_clients import LostReply
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _client(server: RedisServer, cls: type[redis.Redis] = redis.Redis) -> redis.Redis:
    """A client as the library makes them: 0.5 s timeouts, no retries."""
    return cls(host=HOST, port=server.port, socket_timeout=0.5, socket_connect_timeout=0.5,
               retry=Retry(NoBackoff(), 0))


def lossy_client(server: RedisServer) -> LostReply:
    """A client as the library makes them whose next call of the operation its ``trap``
    names (once set) never reaches Redis and raises a timeout: its reply is lost. The call
    is kept in its ``late``, for the test to send when it likes."""
    lossy = _client(server, LostReply)
    assert isinstance(lossy, LostReply)
    lossy.deferred = True
    return lossy


@pytest.fixture
def clients(live_redis: RedisServer) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """(the limiter's client; the test's own reader)."""
    mine = _client(live_redis)
    reader = redis.Redis(host=HOST, port=live_redis.port, socket_timeout=5)
    yield mine, reader
    mine.close()
    reader.close()


def _paused(server: RedisServer) -> None:
    os.kill(server.pid, signal.SIGSTOP)


def _resumed(server: RedisServer) -> None:
    os.kill(server.pid, signal.SIGCONT)


def test_acquires_whose_replies_were_lost_leave_no_ghost_slots(
    live_redis: RedisServer, clients: tuple[redis.Redis, redis.Redis]
) -> None:
    """Two stalls, each under an acquire of its own limiter object (as two processes would
    be): each lost acquire runs once Redis resumes and holds a slot for nobody, until that
    object's next round trip gives its token up."""
    mine, reader = clients
    # b on a client of its own: each stall then hits a connection already open (a new one
    # would time out in redis-py's connection handshake, before the script is even sent).
    theirs = _client(live_redis)
    a = RedisColdLimiter(mine, "ghosts", active=2, queue=8, wait=3.0)
    b = RedisColdLimiter(theirs, "ghosts", active=2, queue=8, wait=3.0)
    holders = a.keys[0]
    try:
        for lim in (a, b):
            with lim.acquire():  # Redis knows the scripts (else the lost calls fail NOSCRIPT)
                pass
        for lim in (a, b):  # each stall longer than the socket timeout
            _paused(live_redis)
            try:
                with pytest.raises(redis.TimeoutError):
                    lim.acquire()
            finally:
                _resumed(live_redis)
        wait_until("the lost acquires ran", lambda: reader.zcard(holders) == 2)
        assert a.stats().active == 1  # a's next round trip gave a's token up
        assert b.stats().active == 0  # and b's, b's
        grants = [a.acquire(), b.acquire()]  # two new grants at once, no waiting
        assert reader.zcard(holders) == 2
        for grant in grants:
            grant.release()
        assert_exact_capacity(a)
    finally:
        a.close()
        b.close()
        theirs.close()


def test_a_lost_queue_place_is_given_up_by_the_next_acquire(
    live_redis: RedisServer, clients: tuple[redis.Redis, redis.Redis]
) -> None:
    mine, reader = clients
    lim = RedisColdLimiter(mine, "ghost-place", active=1, queue=1, wait=30.0)
    holder = lim.acquire()  # Redis knows the acquire script from here on
    try:
        _paused(live_redis)
        try:
            with pytest.raises(redis.TimeoutError):
                lim.acquire()  # queued in Redis once it resumes, for nobody
        finally:
            _resumed(live_redis)
        wait_until("the lost acquire queued", lambda: reader.zcard(lim.keys[1]) == 1)
        # Without the give-up this would be queue_full; the acquire gives the ghost up first
        # and is itself queued, then leaves at its first look at its cancel object.
        with pytest.raises(Cancelled):
            lim.acquire(ProbeCancel())
        assert reader.zcard(lim.keys[1]) == 0
    finally:
        holder.release()
        lim.close()


def test_a_call_that_arrives_after_its_token_was_given_up_is_refused(
    live_redis: RedisServer, clients: tuple[redis.Redis, redis.Redis],
) -> None:
    """The order the give-up cannot control: the lost call reaches Redis after it (here:
    the acquire is kept from Redis, its caller told its reply was lost, and sent by the test
    once the limiter's next round trip has given its token up)."""
    _, reader = clients
    lossy = lossy_client(live_redis)
    lim = RedisColdLimiter(lossy, "late", active=2, queue=8)
    try:
        lim.stats()  # its start (and the script loaded): the trap catches the acquire only
        lossy.trap = "acquire"
        with pytest.raises(redis.TimeoutError):
            lim.acquire()  # kept from Redis: its token is given up at the next round trip
        assert lim.stats().active == 0  # the give-up ran (nothing to free yet)
        status = reader.execute_command(*lossy.late)  # the lost call reaches Redis now
        assert status == 3  # refused as given up: neither granted nor queued
        assert reader.zcard(lim.keys[0]) == 0 and reader.zcard(lim.keys[1]) == 0
        s = lim.stats()
        assert (s.acquired, s.rejected_full) == (0, 0)  # and counted nowhere
        assert_exact_capacity(lim)
    finally:
        lim.close()
        lossy.close()


def test_a_release_that_never_reached_redis_frees_the_slot_at_the_next_round_trip(
    live_redis: RedisServer, clients: tuple[redis.Redis, redis.Redis],
) -> None:
    """The release's call fails (a timeout before it reached Redis): the slot is still held
    there, by a grant this process has let go. The next round trip frees it, long before
    its 30 s lease would."""
    _, reader = clients
    lossy = lossy_client(live_redis)  # its release kept from Redis: never sent
    lim = RedisColdLimiter(lossy, "lost-release", active=1, queue=0, lease=30.0)
    try:
        grant = lim.acquire()
        lossy.trap = "release"
        with pytest.raises(redis.TimeoutError):
            grant.release()
        assert reader.zcard(lim.keys[0]) == 1  # held in Redis, by nobody
        with lim.acquire():  # queue=0: this would be refused if the slot were still held
            pass
        assert_exact_capacity(lim)
    finally:
        lim.close()
        lossy.close()
