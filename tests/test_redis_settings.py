"""One budget, one set of settings, and the rest of what keeps the shared backend honest to
an operator: settings recorded in Redis and checked by every process, ``release_owner``
reading them from Redis, owners that tell apart hosts sharing a hostname, ``clear()`` of the
shared cache, a warning for a Redis that may evict any key, and scripts that never raise on a
missing key."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
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
    owner_prefix,
    release_owner,
)
from tests.support.limiter import assert_exact_capacity, start_acquire
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[1]


# -- one budget, one set of settings ----------------------------------------------------------


def test_a_second_process_with_other_settings_refuses_with_both_values(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    lim = RedisColdLimiter(client, "budget", active=2, queue=8)
    assert lim.stats().active == 0  # the first use records the settings
    probe = (
        "import redis, sys\n"
        "from reachlimit.redis import RedisColdLimiter\n"
        f"c = redis.Redis(host='127.0.0.1', port={redis_server.port})\n"
        "try:\n"
        "    RedisColdLimiter(c, 'budget', active=3, queue=8).acquire()\n"
        "except ValueError as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 3, done.stderr
    assert "active is 3 here but 2 for the budget" in done.stdout
    assert client.hgetall(lim.keys[0].rsplit(":", 1)[0] + ":settings") == {
        b"active": b"2", b"queue": b"8", b"wait_ms": b"3000", b"lease_ms": b"10000"
    }
    lim.close()


def test_every_setting_is_checked_and_a_new_prefix_starts_afresh(client: redis.Redis) -> None:
    RedisColdLimiter(client, "b", 2, 8, 3.0, lease=10.0).stats()
    for name, other in (
        ("queue", {"queue": 9}), ("wait_ms", {"wait": 2.0}), ("lease_ms", {"lease": 5.0}),
    ):
        args = {"active": 2, "queue": 8, "wait": 3.0, "lease": 10.0, **other}
        lim = RedisColdLimiter(client, "b", args["active"], args["queue"], args["wait"],
                               lease=args["lease"])
        with pytest.raises(ValueError, match=f"^{name} is "):
            lim.acquire()
    # A change of settings rolls out under a new prefix: a budget of its own.
    assert RedisColdLimiter(client, "b", 3, 8, prefix="v2").stats().capacity_active == 3


def test_a_cache_with_another_ttl_or_size_refuses(client: redis.Redis) -> None:
    RedisCache(client, "c", ttl=300.0, size=256).set("k", 1)
    with pytest.raises(ValueError, match="^ttl_ms is 60000 here but 300000"):
        RedisCache(client, "c", ttl=60.0, size=256).get("k")
    with pytest.raises(ValueError, match="^size is 10 here but 256"):
        RedisCache(client, "c", ttl=300.0, size=10).set("k", 2)
    assert RedisCache(client, "c", ttl=300.0, size=256).get("k") == 1


def test_release_owner_takes_the_budgets_figures_from_redis(client: redis.Redis) -> None:
    """The caller's figures are wrong (5 active): the recorded ones (1) decide how many
    waiters the freed slot promotes."""
    lim = RedisColdLimiter(client, "owners", active=1, queue=4, wait=60.0)
    lim.stats()  # records active=1
    dead = "deadhost:0000:4242:"
    assert lim._admit(dead + "holder")[0] == 1
    for n in range(3):
        assert lim._admit(f"live:{n}")[0] == 2
    freed, dropped = release_owner(client, dead, name="owners", active=5)
    assert (freed, dropped) == (1, 0)
    s = lim.stats()
    assert (s.active, s.queued) == (1, 2)  # one promoted into the one slot, not three
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
    assert lim._admit(f"{host}:aaaa0000:7:x")[0] == 1
    assert lim._admit(f"{host}:bbbb0000:7:y")[0] == 1
    assert release_owner(client, f"{host}:aaaa0000:7:", name="twins") == (1, 0)
    assert [t.decode() for t in client.zrange(lim.keys[0], 0, -1)] == [f"{host}:bbbb0000:7:y"]
    with pytest.raises(ValueError, match="boot id"):
        release_owner(client, f"{host}:7:", name="twins")
    lim.close()


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
