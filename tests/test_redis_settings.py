"""Settings are data in Redis, the newest start wins, and the rest of what keeps the shared
backend honest to an operator: every process writes its settings when it starts using a
budget (logged when that changes them), every script reads them from Redis, a Redis that lost
them gets them back, ``release_owner`` reads them from Redis, owners that tell apart hosts
sharing a hostname, ``clear()`` of the shared cache, a warning for a Redis that may evict any
key, and scripts that never raise on a missing key. (Whole services restarted or deployed
with other settings: ``tests/test_redis_settings_gunicorn.py``.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import redis

from reachlimit import Busy, ColdLimiter
from reachlimit.redis import (
    RedisCache,
    RedisColdLimiter,
    RedisHealth,
    ResilientLimiter,
    _common,
    connect,
    owner_prefix,
    release_owner,
)
from tests.support.limiter import Attempt, assert_exact_capacity, start_acquire
from tests.support.redis_limiters import GRANTED, QUEUED, LimiterScript, server_ms
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[1]


def settings_key(lim: RedisColdLimiter) -> str:
    """The budget's settings hash (the default prefix)."""
    return "{reachlimit:" + lim.name + "}:settings"


def recorded(client: redis.Redis, lim: RedisColdLimiter) -> dict[bytes, bytes]:
    """The budget's settings hash, without who wrote it."""
    fields = client.hgetall(settings_key(lim))
    fields.pop(b"by", None)
    return fields


def changes_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and "settings of" in r.getMessage()]


class _Ghostly(RedisColdLimiter):
    PRESENCE = 120.0  # its ghost waiters (queued through the script, never polling) stay


# -- settings are data, the newest start wins --------------------------------------------------


def test_a_second_process_with_other_settings_wins_without_an_error(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    """A budget recorded with active 2; a process with active 3 starts (a real process): no
    error, its settings are the budget's, and the INFO line names the change and who."""
    lim = RedisColdLimiter(client, "budget", active=2, queue=8)
    assert lim.stats().capacity_active == 2  # the first use records the settings
    probe = (
        "import logging, redis, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "from reachlimit.redis import RedisColdLimiter\n"
        f"c = redis.Redis(host='127.0.0.1', port={redis_server.port})\n"
        "lim = RedisColdLimiter(c, 'budget', active=3, queue=8)\n"
        "with lim.acquire():\n"
        "    print('capacity', lim.stats().capacity_active)\n"
        "lim.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACHLIMIT_BOOT_ID": "0ddba11"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert "capacity 3" in done.stdout
    changed = [line for line in done.stdout.splitlines() if "settings of" in line]
    assert len(changed) == 1, done.stdout
    assert "active 2 -> 3" in changed[0] and "queue" not in changed[0]
    assert ":0ddba11:" in changed[0]  # who: the new process's owner id (and its host)
    assert f"recorded before by {_common.owner_id()}" in changed[0]
    assert recorded(client, lim) == {
        b"active": b"3", b"queue": b"8", b"wait_ms": b"3000", b"lease_ms": b"10000",
        b"deadline": b"1",
    }
    assert lim.stats().capacity_active == 3  # the old process sees the budget's settings
    lim.close()


def test_the_newest_start_sets_the_budget_for_every_object_and_a_burst_admits_its_figures(
    client: redis.Redis, threads: ThreadRunner, caplog: pytest.LogCaptureFixture
) -> None:
    old = RedisColdLimiter(client, "burst", active=2, queue=4, wait=60.0)
    old.stats()
    new = RedisColdLimiter(client, "burst", active=3, queue=4, wait=60.0)
    with caplog.at_level(logging.INFO, logger="reachlimit"):
        assert new.stats().capacity_active == 3
    (line,) = changes_logged(caplog)
    assert "active 2 -> 3" in line and "budget {reachlimit:burst}" in line
    assert old.stats().capacity_active == 3 and old.stats().capacity_queue == 4
    assert old.capacity_active == 2  # the object's own figure stays its own
    # A burst through both objects: exactly 3 builds at once and 4 waiting, the rest refused.
    attempts: list[Attempt] = []
    for n in range(10):
        attempts.append(start_acquire(threads, (old, new)[n % 2], name=f"a{n}"))
        if n < 7:
            wait_until(f"a{n} granted or queued",
                       lambda n=n: (s := new.stats()).active + s.queued == n + 1)
    for attempt in attempts[7:]:
        attempt.wait_done()
    assert all(isinstance(a.error, Busy) and a.error.reason == "queue_full"
               for a in attempts[7:])
    assert sum(a.done.is_set() and a.grant is not None for a in attempts) == 3
    s = old.stats()
    assert (s.active, s.queued, s.rejected_full) == (3, 4, 3)
    for n in range(7):  # the rest, in turn: each release promotes the next waiter
        holder = next(a for a in attempts if a.done.is_set() and a.grant is not None
                      and a.grant.held)
        holder.release()
        if n < 4:
            wait_until("the next waiter promoted",
                       lambda: sum(a.grant is not None and a.grant.held for a in attempts) == 3)
    assert Counter(a.grant is not None for a in attempts) == {True: 7, False: 3}
    assert_exact_capacity(new)
    old.close()
    new.close()


def test_every_setting_of_the_newest_start_is_recorded_and_each_change_named(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = RedisColdLimiter(client, "b", 2, 8, 3.0, lease=10.0)
    first.stats()
    again = RedisColdLimiter(client, "b", 2, 8, 3.0, lease=10.0)
    with caplog.at_level(logging.INFO, logger="reachlimit"):
        again.stats()  # the same settings: nothing changed, nothing logged
        assert changes_logged(caplog) == []
        other = RedisColdLimiter(client, "b", 4, 9, 2.0, lease=5.0)
        with other.acquire():  # a first call of any kind records them
            pass
    (line,) = changes_logged(caplog)
    for change in ("active 2 -> 4", "queue 8 -> 9", "wait_ms 3000 -> 2000",
                   "lease_ms 10000 -> 5000"):
        assert change in line
    s = first.stats()
    assert (s.capacity_active, s.capacity_queue, s.wait) == (4, 9, 2.0)
    for lim in (first, again, other):
        lim.close()


def test_a_waiters_wait_is_the_budgets_not_its_process(
    client: redis.Redis, threads: ThreadRunner
) -> None:
    """Redis decides a wait with the budget's ``wait``: a process that was given 60 s times
    out after the budget's 0.3 s, and one given 0.05 s still waits after 0.3 s and is served
    (the deadline and its length come from the script, on Redis's clock)."""
    holder_side = RedisColdLimiter(client, "waits", active=1, queue=4, wait=60.0)
    short_budget = RedisColdLimiter(client, "waits", active=1, queue=4, wait=0.3)
    holder_side.stats()
    short_budget.stats()  # the newest start: the budget waits 0.3 s
    holding = holder_side.acquire()
    patient = start_acquire(threads, holder_side, name="given 60 s")
    patient.wait_done()  # the budget's 0.3 s, not the 60 s this object was given
    assert isinstance(patient.error, Busy) and patient.error.reason == "timeout"
    long_budget = RedisColdLimiter(client, "waits", active=1, queue=4, wait=60.0)
    hasty = RedisColdLimiter(client, "waits", active=1, queue=4, wait=0.05)
    hasty.stats()
    long_budget.stats()  # the newest start: the budget waits 60 s
    start = server_ms(client)
    waiter = start_acquire(threads, hasty, name="given 0.05 s")
    wait_until("queued", lambda: hasty.stats().queued == 1)
    wait_until("past the 0.05 s it was given",
               lambda: server_ms(client) > start + 300 and hasty.stats().queued == 1)
    assert not waiter.done.is_set()
    holding.release()
    waiter.wait_done()
    assert waiter.grant is not None, waiter.error
    waiter.release()
    for lim in (holder_side, short_budget, long_budget, hasty):
        lim.close()


def test_more_slots_recorded_promote_the_waiters_before_any_newcomer(client: redis.Redis) -> None:
    """A budget given more slots by a process's start promotes its waiters in that same
    script: the next acquire (a lean one, which trusts that no slot is free while someone
    waits) finds every new slot taken, and queues behind them."""
    small = _Ghostly(client, "grown", active=1, queue=4, wait=60.0)
    small.stats()
    ghosts = LimiterScript(client, small)
    assert ghosts.acquire("holder")[0] == GRANTED
    assert ghosts.acquire("waiter-1")[0] == QUEUED
    assert ghosts.acquire("waiter-2")[0] == QUEUED
    big = _Ghostly(client, "grown", active=3, queue=4, wait=60.0)
    started = LimiterScript(client, big)
    started.run("record", owner_prefix()[:-1])  # its start (the script a first call sends)
    holders = {t.decode() for t in client.zrange(big.keys[0], 0, -1)}
    assert holders == {"holder", "waiter-1", "waiter-2"}
    assert started.acquire("newcomer")[0] == QUEUED  # never ahead of the waiters
    small.close()
    big.close()


def test_fewer_slots_recorded_admit_nobody_until_the_holders_are_fewer(
    client: redis.Redis,
) -> None:
    """Three slots held when a process with one starts: an acquire through the old object
    queues, and releases promote nobody until the one slot is free."""
    wide = _Ghostly(client, "shrunk", active=3, queue=4, wait=60.0)
    wide.stats()
    ghosts = LimiterScript(client, wide)
    for n in range(3):
        assert ghosts.acquire(f"holder-{n}")[0] == GRANTED
    narrow = _Ghostly(client, "shrunk", active=1, queue=4, wait=60.0)
    narrow.stats()
    assert ghosts.acquire("waiter")[0] == QUEUED
    holders = wide.keys[0]
    assert ghosts.release("holder-0") == 1 and ghosts.release("holder-1") == 1
    assert [t.decode() for t in client.zrange(holders, 0, -1)] == ["holder-2"]
    assert ghosts.release("holder-2") == 1
    assert [t.decode() for t in client.zrange(holders, 0, -1)] == ["waiter"]
    wide.close()
    narrow.close()


def test_a_cache_takes_the_ttl_and_size_of_its_newest_start(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = RedisCache(client, "c", ttl=300.0, size=256)
    first.set("k", 1)
    newest = RedisCache(client, "c", ttl=60.0, size=2)
    with caplog.at_level(logging.INFO, logger="reachlimit"):
        assert newest.get("k") == 1  # no error: it reads the entry and records its settings
    (line,) = changes_logged(caplog)
    assert "ttl_ms 300000 -> 60000" in line and "size 256 -> 2" in line
    assert "cache {reachlimit:c:cache}" in line
    for n in range(4):  # set through the first object: Redis's settings decide
        first.set(f"k{n}", n)
    assert 0 < client.pttl(first.key_of("k3")) <= 60_000
    assert client.zcard("{reachlimit:c:cache}:index") == 2
    assert len(client.keys("{reachlimit:c:cache}:e:*")) == 2  # the evicted ones deleted
    assert newest.fetch("k3") == 3 and newest.fetch("k0") is None


# -- Redis that lost the settings ------------------------------------------------------------


def test_settings_lost_with_a_restart_come_back_and_nothing_fails(live_redis: RedisServer) -> None:
    client = connect(live_redis.url())
    lim = RedisColdLimiter(client, "restarted", active=2, queue=3, wait=5.0)
    cache = RedisCache(client, "restarted", ttl=30.0, size=4)
    with lim.acquire():
        cache.set("k", 1)
    assert recorded(client, lim)[b"active"] == b"2"
    live_redis.restart_empty()
    client.connection_pool.disconnect()  # the old connections are dead: no retry would help
    assert client.exists(settings_key(lim)) == 0
    with lim.acquire():  # the scripts load again, and write the settings back
        assert recorded(client, lim) == {
            b"active": b"2", b"queue": b"3", b"wait_ms": b"5000", b"lease_ms": b"10000",
            b"deadline": b"1",
        }
    s = lim.stats()
    assert (s.capacity_active, s.capacity_queue, s.wait, s.active) == (2, 3, 5.0, 0)
    cache.set("k", 2)
    assert client.hgetall("{reachlimit:restarted:cache}:settings") == {
        b"ttl_ms": b"30000", b"stale_ms": b"0", b"size": b"4"
    }
    assert 0 < client.pttl(cache.key_of("k")) <= 30_000
    lim.close()
    client.close()


@pytest.mark.parametrize("lost", ["evicted", "not a number"])
def test_settings_lost_under_waiters_are_written_back_by_the_next_script(
    client: redis.Redis, lost: str
) -> None:
    """The settings hash evicted (or a field turned to something else) under a holder and a
    waiter: the next script of any process uses its own settings and writes them back, and
    the waiter is still served in turn."""
    lim = _Ghostly(client, "evicted-settings", active=1, queue=2, wait=60.0)
    lim.stats()
    ghosts = LimiterScript(client, lim)
    assert ghosts.acquire("holder")[0] == GRANTED
    assert ghosts.acquire("waiter")[0] == QUEUED
    if lost == "evicted":
        client.delete(settings_key(lim))
    else:
        client.hset(settings_key(lim), "active", "many")
    assert ghosts.release("holder") == 1  # a release: the waiter is promoted into the slot
    assert [t.decode() for t in client.zrange(lim.keys[0], 0, -1)] == ["waiter"]
    assert recorded(client, lim) == {
        b"active": b"1", b"queue": b"2", b"wait_ms": b"60000", b"lease_ms": b"10000",
        b"deadline": b"1",
    }
    lim.close()


def test_release_owner_takes_the_budgets_figures_from_redis(client: redis.Redis) -> None:
    """The caller's figures are wrong (5 active): the recorded ones (1) decide how many
    waiters the freed slot promotes; and the parent records nothing of its own."""
    lim = RedisColdLimiter(client, "owners", active=1, queue=4, wait=60.0)
    lim.stats()  # records active=1
    dead = "deadhost:0000:4242:"
    ghosts = LimiterScript(client, lim)
    assert ghosts.acquire(dead + "holder")[0] == 1
    for n in range(3):
        assert ghosts.acquire(f"livehost:0000:7:{n}")[0] == 2
    freed, dropped = release_owner(client, dead, name="owners", active=5)
    assert (freed, dropped) == (1, 0)
    s = lim.stats()
    assert (s.active, s.queued) == (1, 2)  # one promoted into the one slot, not three
    assert recorded(client, lim)[b"active"] == b"1"
    # Settings lost: the caller's figures count (5 slots: its two waiters are promoted by
    # the script's fill before the release, and freed with the third), and are not written.
    client.delete(settings_key(lim))
    assert release_owner(client, "livehost:0000:7:", name="owners", active=5) == (3, 0)
    assert client.exists(settings_key(lim)) == 0
    lim.close()


# -- owners ------------------------------------------------------------------------------------


def test_owners_carry_a_boot_id_so_hosts_sharing_a_hostname_stay_apart(
    client: redis.Redis,
) -> None:
    host, boot, pid, rest = owner_prefix().split(":")
    assert (pid, rest) == (str(os.getpid()), "") and boot == _common.BOOT_ID and host
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REACHLIMIT_BOOT_ID": "feedbeef"}
    probe = "from reachlimit.redis import owner_prefix; print(owner_prefix(7))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=30, env=env, check=True).stdout.strip()
    assert out == f"{host}:feedbeef:7:"  # a gunicorn master's id, inherited by its workers
    env.pop("REACHLIMIT_BOOT_ID")
    other = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=30, env=env, check=True).stdout.strip()
    assert other.startswith(f"{host}:") and other != out  # a random one of its own
    # Two "hosts" with one hostname and the same worker PID: freeing one frees only its own.
    lim = RedisColdLimiter(client, "twins", active=2, queue=0)
    lim.stats()
    ghosts = LimiterScript(client, lim)
    assert ghosts.acquire(f"{host}:aaaa0000:7:x")[0] == 1
    assert ghosts.acquire(f"{host}:bbbb0000:7:y")[0] == 1
    assert release_owner(client, f"{host}:aaaa0000:7:", name="twins") == (1, 0)
    assert [t.decode() for t in client.zrange(lim.keys[0], 0, -1)] == [f"{host}:bbbb0000:7:y"]
    with pytest.raises(ValueError, match="boot id"):
        release_owner(client, f"{host}:7:", name="twins")
    lim.close()


def test_tokens_are_owned_of_one_length_and_never_repeat_in_a_forked_child() -> None:
    """A token is its owner's prefix, a random part drawn once per process and a counter: a
    forked child (its own pid) draws its own, so its tokens never meet its parent's, nor
    those of a dead process whose pid it was given (a fork of the same parent)."""
    first, second = _common.new_token(), _common.new_token()
    assert first != second and len(first) == len(second)
    assert first.startswith(owner_prefix()) and first[:-12] == second[:-12]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next token, then out at once
        os.write(write, _common.new_token().encode())
        os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 200).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    mine = _common.new_token()
    assert child.startswith(owner_prefix(pid)) and len(child) == len(owner_prefix(pid)) + 24
    assert child[-24:-12] != mine[-24:-12]  # its own draw


# -- the shared cache's clear() --------------------------------------------------------------


def test_clear_empties_the_shared_cache_for_every_process(client: redis.Redis) -> None:
    mine = RedisCache(client, "cleared", local_ttl=60.0)
    theirs = RedisCache(client, "cleared", local_ttl=60.0)  # another process's view
    for n in range(5):
        mine.set(f"k{n}", n)
    assert theirs.fetch("k3") == 3
    mine.clear()
    assert mine.get("k3") is None  # this process: at once, first level included
    assert theirs.fetch("k3") is None  # Redis: at once (theirs' first level: local_ttl)
    assert client.keys("{reachlimit:cleared:cache}:e:*") == []
    assert not client.exists("{reachlimit:cleared:cache}:index")


# -- Redis that may evict any key -------------------------------------------------------------


def test_an_allkeys_policy_is_warned_about_once_per_process(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client.config_set("maxmemory-policy", "allkeys-lru")
    _common._eviction_checked.clear()  # as in a fresh process
    try:
        with caplog.at_level(logging.WARNING, logger="reachlimit"):
            RedisColdLimiter(client, "evicting").stats()
            RedisColdLimiter(client, "evicting-too").stats()
        warned = [r for r in caplog.records if "maxmemory-policy allkeys-lru" in r.message]
        assert len(warned) == 1
    finally:
        client.config_set("maxmemory-policy", "noeviction")


@pytest.mark.parametrize("evicted", ["deadline", "everything"])
def test_keys_evicted_under_a_waiting_leader_end_its_wait_without_a_redis_error(
    client: redis.Redis, threads: ThreadRunner, evicted: str
) -> None:
    """What an allkeys-* policy may do at any time: the waiter ends in a grant or a Busy,
    never a script error, and the resilient wrapper sees no outage."""
    remote = RedisColdLimiter(client, "evicted", active=1, queue=2, wait=60.0)
    health = RedisHealth("redis://127.0.0.1/")
    lim = ResilientLimiter(remote, ColdLimiter(1, 2, 60.0), health)
    holder = lim.acquire()
    waiter = start_acquire(threads, lim, threading.Event(), name="waiter")
    wait_until("queued", lambda: remote.stats().queued == 1)
    if evicted == "deadline":
        client.delete(remote.keys[3])
    else:
        client.delete(*client.keys("{reachlimit:evicted}:*"))
    waiter.wait_done()
    assert waiter.grant is not None or isinstance(waiter.error, Busy), repr(waiter.error)
    if waiter.grant is not None:
        waiter.release()
    holder.release()
    assert health.up and health.figures()["outages"] == 0
    assert_exact_capacity(remote)
    remote.close()
