"""After a real ``os.fork()``: every daemon thread of the library starts again in the child on
demand, and a job handed to it runs (the refresher, the Redis limiter's lease renewer and
waker, the path counters' flusher), also when one of its locks was held at the instant of the
fork by a thread the child does not have.

Each test first makes the threads run in the parent, then forks. The child runs its part
(``in_child``), waiting for states with bounds of its own (``CHILD_BOUND``), reports one JSON
object through a pipe and leaves with ``os._exit`` (never back into pytest); the parent reads
the report within ``PARENT_BOUND``, waits for the child by its PID and kills it (SIGKILL, by
that PID) if it is still there: a child stuck on a lock nobody will release is a failure, not
a hung test. A lock "held at the fork" is held by a thread of the test in the parent for as
long as the child runs, which is what a thread of the library holding it at that instant
would leave the child with.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from reachlimit import Busy, ColdLimiter, ColdPath, Refresher, TTLCache
from reachlimit.redis import RedisColdLimiter, RedisGrant, SharedPathCounters
from tests.support.clock import FakeClock
from tests.support.redis_clients import Commands, CountingRedis, PausedRenewals
from tests.support.redis_limiters import server_ms
from tests.support.refreshes import refreshing, threads_named
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: The child's own waits: a state it waits for that does not come is reported as a failure.
CHILD_BOUND = 10.0
#: How long the parent waits for the child's report (longer than any wait of the child: only
#: a child that hangs reaches it) and then for the child to exit, before it kills it.
PARENT_BOUND = 20.0


def _read_report(fd: int, timeout: float) -> bytes | None:
    """Everything written to ``fd`` until its writer closed it, or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data
            data += chunk


def _end_child(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for the child ``pid`` to exit (reaped); kill it by its PID if
    it is still there. True if it exited by itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def in_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork now, run ``body()`` in the child and answer what it returned (a JSON object).
    Fails if it raised (with its traceback), if it did not report in time (a child stuck:
    killed), or if it did not exit."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(read)
            try:
                report = {"ok": True, **body()}
                code = 0
            except BaseException:
                report = {"ok": False, "error": traceback.format_exc()}
            with os.fdopen(write, "wb") as out:
                out.write(json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(write)
    try:
        data = _read_report(read, PARENT_BOUND)
    finally:
        os.close(read)
        exited = _end_child(pid, PARENT_BOUND if data is not None else 0.0)
    assert data is not None, f"the child did not report within {PARENT_BOUND} s (stuck)"
    assert exited, "the child reported but did not exit"
    report: dict[str, Any] = json.loads(data)
    assert report.pop("ok"), report["error"]
    return report


@contextmanager
def held(threads: ThreadRunner, lock: Any, hold: bool = True) -> Iterator[None]:
    """With ``hold``: ``lock`` (a Lock or a Condition) held by another thread of this process
    for the block; without: nothing."""
    if not hold:
        yield
        return
    taken, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            taken.set()
            assert done.wait(PARENT_BOUND + JOIN_TIMEOUT)

    threads.start(holder, name="lock-holder")
    assert taken.wait(JOIN_TIMEOUT)
    try:
        yield
    finally:
        done.set()


# -- the refresher ------------------------------------------------------------------------------


class Build:
    """A build answering ``"v<n>"``."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self) -> str:
        self.runs += 1
        return f"v{self.runs}"


@pytest.fixture
def path() -> Iterator[ColdPath]:
    """A path with a stale window on a fake clock, whose entry "k" was refreshed once by the
    refresher (its thread then idle, waiting for the next job)."""
    clock = FakeClock(1000.0)
    cache: TTLCache[Any] = TTLCache(16, 10.0, stale=30.0, clock=clock)
    p = ColdPath(ColdLimiter(2, 8), cache, clock=clock)
    p.fetch("k", Build())
    clock.now += 11.0
    assert p.fetch("k", Build()).status == "stale"
    wait_until("the refresh in the parent",
               lambda: p.counts().refreshed == 1 and not refreshing(p.refresher, "k"))
    # The state the child inherits: every refresher thread back to waiting for a job.
    wait_until("the refresher idle", lambda: p.refresher._idle == 1)
    yield p
    p.close(JOIN_TIMEOUT)


def refresh_in_child(p: ColdPath) -> dict[str, Any]:
    """In the child: make "k" stale, fetch it, and wait for its refresh to have stored."""
    assert isinstance(p.clock, FakeClock)
    p.clock.now += 11.0
    answer = p.fetch("k", Build())
    wait_until("the refresh in the child", lambda: p.counts().refreshed == 2, CHILD_BOUND)
    return {
        "status": answer.status,
        "value": p.fetch("k", Build()).value,
        "threads": [t.name for t in threads_named("reachlimit-refresher")],
    }


def test_a_refresh_handed_over_in_a_child_runs(path: ColdPath) -> None:
    report = in_child(lambda: refresh_in_child(path))
    assert report == {"status": "stale", "value": "v1", "threads": ["reachlimit-refresher-1"]}


@pytest.mark.parametrize("lock", ["refresher", "path", "backoff"])
def test_a_refresh_runs_in_a_child_forked_while_a_lock_was_held(
    path: ColdPath, threads: ThreadRunner, lock: str
) -> None:
    taken = {
        "refresher": path.refresher._cond, "path": path._lock, "backoff": path._backoff._lock,
    }[lock]
    path._backoff.hold("other", math.inf, None)  # a key held back: "k"'s hit takes its lock
    with held(threads, taken):
        report = in_child(lambda: refresh_in_child(path))
    assert report["value"] == "v1" and report["status"] == "stale"


def test_a_key_whose_job_ran_at_the_fork_gets_a_job_run_in_the_child() -> None:
    refresher = Refresher(1)
    running, gate = threading.Event(), threading.Event()

    def parents_job() -> None:
        running.set()
        assert gate.wait(PARENT_BOUND + JOIN_TIMEOUT)

    assert refresher.submit("k", parents_job)
    try:
        assert running.wait(JOIN_TIMEOUT)

        def child() -> dict[str, Any]:
            ran = threading.Event()
            queued = refresher.submit("k", ran.set)  # the parent's job is not the child's
            return {"queued": queued, "ran": ran.wait(CHILD_BOUND)}

        assert in_child(child) == {"queued": True, "ran": True}
    finally:
        gate.set()
        refresher.close(JOIN_TIMEOUT)


# -- the Redis limiter: lease renewer and waker ---------------------------------------------------


def lease_end(client: redis.Redis, lim: RedisColdLimiter, grant: RedisGrant) -> float | None:
    """The end of ``grant``'s lease in Redis (ms, Redis time), or None if it holds none."""
    score = client.zscore(lim.keys[0], grant.token)
    return None if score is None else float(score)


#: The lease of the renewal test, and how far past its start the test waits (one and a half).
LEASE = 1.5
PAST_LEASE_MS = int(LEASE * 1500)


@pytest.mark.redis
@pytest.mark.parametrize("at_fork", ["idle", "lock held"])
def test_in_a_child_a_grant_is_renewed_past_its_lease_and_the_parents_is_not(
    client: CountingRedis, make_client: Callable[..., PausedRenewals],
    make_limiter: Callable[..., RedisColdLimiter], threads: ThreadRunner, at_fork: str,
) -> None:
    # Renewed every 0.5 s: a renewal a loaded machine delays by up to a second still lands
    # in time (with 0.6 s a 0.4 s stall of the renewer's thread lost the lease once).
    renewing = make_client(PausedRenewals)
    lim = make_limiter(client=renewing, active=2, queue=1, lease=LEASE)
    first = lim.acquire()
    start = server_ms(client)
    wait_until("the parent's grant past its lease",
               lambda: server_ms(client) > start + PAST_LEASE_MS)
    end = lease_end(client, lim, first)
    assert end is not None and end > server_ms(client)  # renewed in the parent
    first.release()
    parents = lim.acquire()  # held across the fork by a thread of the parent
    renewing.paused.set()  # the parent's renewals stop: only the child could renew it

    def child() -> dict[str, Any]:
        renewing.paused.clear()  # (the parent's client, copied) the child renews its own
        mine = lim.acquire()
        since = server_ms(client)
        wait_until("the child's grant past its lease",
                   lambda: server_ms(client) > since + PAST_LEASE_MS, CHILD_BOUND)
        mine_end = lease_end(client, lim, mine)
        renewed = mine_end is not None and mine_end > server_ms(client)
        lim.stats()  # reaps the leases that ended
        parents_end = lease_end(client, lim, parents)
        mine.release()
        return {"renewed": renewed, "lost": mine.lease_lost, "parents_end": parents_end}

    try:
        with held(threads, lim._leases.lock, at_fork == "lock held"):
            report = in_child(child)
    finally:
        renewing.paused.clear()
        parents.release()
    # The child renewed its own grant, and left the parent's alone: it ended with its lease.
    assert report == {"renewed": True, "lost": False, "parents_end": None}
    assert parents.lease_lost


@pytest.mark.redis
def test_in_a_child_a_limiters_calls_go_on_connections_of_its_own(
    client: CountingRedis, make_client: Callable[..., redis.Redis],
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    """A plain client's limiter sends its scripts pre-packed on a connection of the client's
    pool (``reachlimit/redis/_packed.py``): in a child, redis-py's pool gives it connections
    of the child's own, never the parent's (whose replies the two would read in turn)."""
    parent = make_client(redis.Redis, client_name="forked")
    lim = make_limiter(client=parent, active=1, queue=1)
    lim.acquire().release()  # the parent's pooled connection is open
    [parents] = [c["addr"] for c in client.client_list() if c["name"] == "forked"]
    commands = Commands(client)

    def child() -> dict[str, Any]:
        with lim.acquire():
            held = lim.stats().active
        return {"held": held, "after": lim.stats().active}

    report = in_child(child)
    scripts = [addr for addr, command in commands.sources_until_now() if command == "EVALSHA"]
    assert report == {"held": 1, "after": 0}
    assert len(scripts) == 4 and parents not in scripts, (parents, scripts)
    with lim.acquire():  # and the parent's connection answers its own calls still
        assert lim.stats().active == 1


@pytest.mark.redis
@pytest.mark.parametrize("at_fork", ["idle", "lock held"])
def test_in_a_child_a_waiter_is_nudged_by_a_waker_of_its_own(
    make_client: Callable[..., CountingRedis], make_limiter: Callable[..., RedisColdLimiter],
    threads: ThreadRunner, at_fork: str,
) -> None:
    spy = make_client()
    lim = make_limiter(client=spy, active=1, queue=1, wait=0.3)
    holder = lim.acquire()
    with pytest.raises(Busy) as refused:  # a waiter in the parent, nudged by the waker
        lim.acquire()
    assert refused.value.reason == "timeout" and spy.sent["PING"] >= 1
    holder.release()

    def child() -> dict[str, Any]:
        pings = spy.sent["PING"]
        mine = lim.acquire()
        reason = "granted"
        try:
            lim.acquire()  # waits in the queue until its 0.3 s are up
        except Busy as busy:
            reason = busy.reason
        finally:
            mine.release()
        return {"reason": reason, "nudged": spy.sent["PING"] > pings}

    with held(threads, lim._waker._cond, at_fork == "lock held"):
        report = in_child(child)
    assert report == {"reason": "timeout", "nudged": True}


# -- the path counters' flusher -------------------------------------------------------------------


@pytest.mark.redis
def test_in_a_child_the_counters_flush_what_the_child_counted_and_only_that(
    client: CountingRedis, threads: ThreadRunner,
) -> None:
    path = ColdPath(ColdLimiter(2, 8))
    counts = SharedPathCounters(client, path, "forked", interval=0.05)
    path.get("a", lambda: "A")
    counts.ensure_running()
    try:
        wait_until("the parent's flush", lambda: client.hget(counts.key, "builds") == b"1")
        # Two hits the parent has not flushed at the fork: its flusher is held up meanwhile.
        with held(threads, counts._flush_lock):
            path.get("a", lambda: "A")
            path.get("a", lambda: "A")

            def child() -> dict[str, Any]:
                path.get("a", lambda: "A")
                counts.ensure_running()
                wait_until("the child's flush", lambda: client.hget(counts.key, "hits"),
                           CHILD_BOUND)
                thread = counts._thread
                return {
                    "hits": int(client.hget(counts.key, "hits") or 0),
                    "thread": thread is not None and thread.is_alive(),
                }

            report = in_child(child)
        assert report == {"hits": 1, "thread": True}  # the child's own hit, flushed
        counts.flush()  # the parent's two
        assert counts.totals()["hits"] == 3
    finally:
        counts.close()
