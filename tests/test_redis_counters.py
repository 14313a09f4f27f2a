"""The cold path's counters added up over processes in Redis (``SharedPathCounters``).

Two ``ColdPath`` objects on one Redis stand for two workers; the cross-process answer under
real gunicorn workers is in ``tests/test_redis_gunicorn.py``. The flushing thread is waited
for by the state it writes (the hash in Redis), never by a sleep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from reachlimit import ColdLimiter, ColdPath
from reachlimit.redis import SharedPathCounters
from tests.support.processes import pid_alive
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=0.5,
                    socket_connect_timeout=0.5)
    c.flushall()
    yield c
    c.close()


def worker(client: redis.Redis, interval: float = 60.0) -> tuple[ColdPath, SharedPathCounters]:
    path = ColdPath(ColdLimiter(active=1, queue=0))
    return path, SharedPathCounters(client, path, "svc", interval=interval)


def test_totals_add_up_every_process_and_are_the_same_from_each(client: redis.Redis) -> None:
    one, one_counts = worker(client)
    two, two_counts = worker(client)
    assert one.get("a", lambda: "A") == "A"  # a miss and a build in "worker" one
    assert one.get("a", lambda: "never") == "A"  # a hit
    assert two.get("b", lambda: "B") == "B"
    assert two.get("b", lambda: "never") == "B"
    assert two.get("b", lambda: "never") == "B"
    expected = {"hits": 3, "misses": 2, "builds": 2, "coalesced": 0, "stale": 0,
                "refreshed": 0, "refresh_refused": 0, "refresh_failed": 0}
    one_counts.flush()  # each process flushes its own; totals() flushes the caller's
    assert two_counts.totals() == expected
    assert one_counts.totals() == expected
    stats = one_counts.apply(one.stats())
    assert (stats.hits, stats.misses, stats.builds) == (3, 2, 2)
    assert one.stats().hits == 1  # the path's own figures are untouched


def test_a_flush_adds_only_what_changed(client: redis.Redis) -> None:
    path, counts = worker(client)
    path.get("a", lambda: "A")
    counts.flush()
    counts.flush()  # nothing new: nothing added twice
    assert client.hgetall(counts.key) == {b"misses": b"1", b"builds": b"1"}
    path.get("a", lambda: "never")
    counts.flush()
    assert client.hget(counts.key, "hits") == b"1"


def test_the_thread_flushes_without_being_asked(client: redis.Redis) -> None:
    path, counts = worker(client, interval=0.05)
    path.get("a", lambda: "A")
    counts.ensure_running()
    counts.ensure_running()  # idempotent: one thread
    try:
        wait_until("the thread flushed", lambda: client.hget(counts.key, "builds") == b"1")
    finally:
        counts.close()
    thread = counts._thread
    assert thread is not None and not thread.is_alive()


def test_the_key_carries_the_limiters_hash_tag(client: redis.Redis) -> None:
    _, counts = worker(client)
    assert counts.key == "{reachlimit:svc}:path"


def test_a_failed_flush_keeps_its_delta(redis_server: RedisServer) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.2, socket_connect_timeout=0.2)
    path = ColdPath(ColdLimiter(active=1, queue=0))
    counts = SharedPathCounters(dead, path, "svc")
    path.get("a", lambda: "A")
    with pytest.raises(redis.ConnectionError):
        counts.flush()
    # The same counts, moved to a client that works, are flushed whole.
    live = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=0.5)
    live.flushall()
    counts._client = live
    counts.flush()
    assert live.hgetall(counts.key) == {b"misses": b"1", b"builds": b"1"}
    live.close()


def test_a_forked_child_starts_its_own_thread(client: redis.Redis) -> None:
    path, counts = worker(client, interval=0.05)
    counts.ensure_running()  # the parent's thread
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: count, start its own thread, wait for its flush
            code = 1
            try:
                os.close(read)
                child = redis.Redis(host="127.0.0.1",
                                    port=client.connection_pool.connection_kwargs["port"])
                counts._client = child
                path.get("child", lambda: "C")
                counts.ensure_running()
                thread = counts._thread
                if thread is not None and thread.is_alive():
                    wait_until("the child's thread flushed",
                               lambda: child.hget(counts.key, "builds") == b"1", timeout=10)
                    code = 0
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            assert answer.read(1) == b"\x00"
        wait_until("the child exited", lambda: os.waitpid(pid, os.WNOHANG)[0] == pid
                   or not pid_alive(pid))
    finally:
        counts.close()
