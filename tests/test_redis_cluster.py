"""reachlimit.redis on a REAL three-primary Redis Cluster (``tests/support/redis_cluster.py``).

design: one cluster for the module (forming one takes seconds), emptied before each test. The
module's ``client`` fixture is ``reachlimit.redis.connect(redis+cluster://...)`` (and so is its
``plain_client``), so the suite's ``make_limiter`` and ``factory`` fixtures
(``tests/support/redis_limiters.py``) make limiters on the cluster, and the limiter's key
properties and fair-admission rules (the checks ``tests/test_redis_mutants.py`` and
``tests/test_redis_fairness.py`` run on one Redis) run here unchanged. What only a cluster has
is proved against the nodes themselves: a limiter's keys in one slot, cache entries on several
nodes, a node that forgot its scripts, a node or the whole cluster restarted empty, and the
limiter's slot migrated while a grant is held. Nothing waits on time: every wait is for a
state, bounded.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as RedisPyCluster

from reachlimit import Busy, ColdLimiter, ColdPath, SingleFlight, TTLCache
from reachlimit.flask import ReachLimit
from reachlimit.redis import (
    FAILURES,
    RedisCache,
    RedisColdLimiter,
    RedisHealth,
    RedisSingleFlight,
    ResilientLimiter,
    SharedPathCounters,
    connect,
    owner_prefix,
    release_claims,
    release_owner,
)
from reachlimit.redis._cluster import ClusterClient
from reachlimit.redis._common import is_cluster
from tests.apps.slow_app import create_app
from tests.support.bench_scripts import run_json
from tests.support.fairness import RULES
from tests.support.processes import free_port
from tests.support.redis_cluster import RedisCluster, redis_cluster_fixture  # noqa: F401
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import wait_until
from tests.test_redis_mutants import ALL_CHECKS

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

SECRET = "cluster-s3cret"


@pytest.fixture(name="client")
def cluster_client_fixture(redis_cluster: RedisCluster) -> Iterator[Any]:
    """``connect`` of the module's cluster, emptied first (overrides the suite's ``client``,
    so ``make_limiter`` and ``factory`` make their limiters on the cluster)."""
    redis_cluster.flush()
    client = connect(redis_cluster.url())
    yield client
    client.close()


@pytest.fixture(name="plain_client")
def cluster_plain_client_fixture(client: Any) -> Any:
    """The module's ``client`` again (overrides the suite's plain client, on which
    ``make_limiter`` makes its limiters by default): a cluster has no other."""
    return client


_names = (f"c{n}" for n in itertools.count())  # a fresh budget name per use


def slots_of(cluster: RedisCluster, keys: list[str]) -> set[int]:
    return {cluster.slot(key) for key in keys}


def keys_on(cluster: RedisCluster, pattern: str) -> dict[int, list[bytes]]:
    """Every key matching ``pattern`` on each node (by port), read from the node itself."""
    out: dict[int, list[bytes]] = {}
    for node in cluster.nodes:
        with node.client() as c:
            out[node.port] = sorted(c.scan_iter(match=pattern, count=1000))
    return out


# -- the URL and the client ------------------------------------------------------------------


def test_a_cluster_url_makes_a_redis_cluster_that_connects_only_when_used() -> None:
    port = free_port()  # nothing listens there
    client = connect(f"redis+cluster://u:{SECRET}@127.0.0.1:{port},127.0.0.1:{port}/0")
    assert isinstance(client, ClusterClient) and is_cluster(client)
    assert not client.started  # no connection opened, no error: the cluster is down
    limiter = RedisColdLimiter(client, next(_names))  # objects are made without a call
    with pytest.raises(FAILURES) as info:  # the first command finds no node
        limiter.acquire()
    health = RedisHealth(f"redis+cluster://u:{SECRET}@127.0.0.1:{port}")
    health.failed(info.value)
    assert SECRET not in health.describe(info.value) and SECRET not in repr(client)
    assert health.figures()["url"].startswith("redis+cluster://u:***@")
    limiter.close()
    client.close()


def test_the_client_makes_redis_pys_cluster_client_at_its_first_command(client: Any) -> None:
    assert not client.started
    assert client.ping(target_nodes=RedisPyCluster.PRIMARIES) is True  # every primary answers
    made = client.cluster()
    assert client.started and isinstance(made, RedisPyCluster)
    # A failed command is not retried, on every supported redis-py:
    if redis.VERSION < (6,):  # 5 retries as its own setting says, whatever its Retry
        assert made.cluster_error_retry_attempts == 0
    else:
        assert made.retry.get_retries() == 0


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("redis+cluster://u:{s}@h:1,h:x", "each node's port must be a whole number"),
        ("redis+cluster://u:{s}@h:1/2", "a cluster has one database"),
        ("redis+cluster://u:{s}@h:1?db=3", "a cluster has one database: db= must be 0"),
        ("redis+cluster://u:{s}@", "it must name at least one node"),
        ("redis+cluster://u:{s}@h:1?socket_timeout=soon", "bad Redis URL"),
    ],
)
def test_a_bad_cluster_url_is_refused_with_its_password_masked(url: str, part: str) -> None:
    with pytest.raises(ValueError) as info:
        connect(url.format(s=SECRET))
    assert part in str(info.value) and SECRET not in str(info.value), info.value
    assert "u:***@" in str(info.value)


def test_the_extension_starts_on_a_cluster_that_is_down_and_answers_from_the_fallback() -> None:
    port = free_port()
    app = create_app(REACHLIMIT_REDIS_URL=f"redis+cluster://u:{SECRET}@127.0.0.1:{port}")
    try:
        reply = app.test_client().get("/report/k")
        assert reply.status_code == 200, reply.data  # the in-process fallback, never a 5xx
        health = app.extensions["reachlimit"].path.limiter.health
        assert not health.up and SECRET not in str(health.figures())
    finally:
        ReachLimit().close(app)


def test_on_a_cluster_the_extension_leads_cold_paths_step_by_step(
    redis_cluster: RedisCluster,
) -> None:
    app = create_app(REACHLIMIT_REDIS_URL=redis_cluster.url())
    try:
        flight = app.extensions["reachlimit"].path.flight.remote
        assert isinstance(flight, RedisSingleFlight) and not flight.uses_cold_lead
        statuses = [app.test_client().get(f"/report/k{n}").status_code for n in range(3)]
        assert statuses == [200, 200, 200]
        assert app.extensions["reachlimit"].path.limiter.stats().backend == "redis"
        with pytest.raises(RuntimeError):  # the cold lead itself refuses a cluster
            app.extensions["reachlimit"].path.limiter.remote.lead([], [], "", None)
    finally:
        ReachLimit().close(app)


# -- the limiter -----------------------------------------------------------------------------


def test_every_key_of_a_limiter_lives_in_its_tags_one_slot(
    client: Any, redis_cluster: RedisCluster, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(name=next(_names), active=1, queue=2, wait=30.0)
    grant = lim.acquire(client="a")
    waiter = threading.Thread(target=lambda: lim.acquire(client="b").release(), daemon=True)
    waiter.start()
    wait_until("one waiter queued", lambda: lim.stats().queued == 1)
    owner = redis_cluster.owner(lim.keys[0])
    tag = lim.keys[0].rsplit(":", 1)[0]
    found = keys_on(redis_cluster, tag + "*")
    written = found[owner.port]
    assert len(written) >= 5 and all(not keys for port, keys in found.items()
                                     if port != owner.port)
    assert len(slots_of(redis_cluster, [k.decode() for k in written])) == 1
    grant.release()
    waiter.join(10)
    assert not waiter.is_alive()
    assert (lim.stats().active, lim.stats().acquired) == (0, 2)


def test_the_limiters_key_properties_hold_on_a_cluster(
    factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    assert isinstance(factory(RedisColdLimiter)()._client, ClusterClient)
    for check in ALL_CHECKS:
        check(factory(RedisColdLimiter), threads)


def test_fair_admission_holds_on_a_cluster(
    factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    for rule in RULES:
        rule(threads, factory(RedisColdLimiter))


def test_a_node_that_forgot_its_scripts_is_sent_each_once_with_eval(
    client: Any, redis_cluster: RedisCluster, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    lim = make_limiter(name=next(_names), active=1, queue=1, wait=0.05)
    lim.acquire().release()
    owner = redis_cluster.owner(lim.keys[0])
    with owner.client() as node:
        node.script_flush()
        assert node.script_exists(lim._script.sha) == [False]
        grant = lim.acquire()  # NOSCRIPT: the text goes once, to this node
        assert node.script_exists(lim._script.sha) == [True]
        with pytest.raises(Busy):
            lim.acquire()  # queued, then timed out: its polls are the same script
        assert lim.stats().active == 1
        grant.release()
        assert lim.stats().active == 0


def test_release_owner_frees_a_dead_processes_places_on_a_cluster(
    client: Any, make_limiter: Callable[..., RedisColdLimiter]
) -> None:
    name = next(_names)
    lim = make_limiter(name=name, active=1, queue=1)
    grant = lim.acquire()
    assert release_owner(client, owner_prefix(), name=name) == (1, 0)
    assert lim.stats().active == 0
    grant.release()  # its slot was freed for it: nothing is freed twice
    assert lim.acquire() is not None and lim.stats().active == 1


def test_release_claims_finds_a_dead_processes_claims_on_every_primary(
    client: Any, threads: ThreadRunner
) -> None:
    # Claims of several keys spread over the cluster's slots, so over its primaries: one
    # release_claims of their owner finds and drops them all (SCAN on every primary).
    name = next(_names)
    prefix = f"claims-{name}"  # no other test's claims under it
    flight = RedisSingleFlight(client, name, lease=60.0, prefix=prefix)
    go = threading.Event()
    keys = [f"key-{i}" for i in range(8)]
    leads = [start_call(threads, lambda k=k: flight.do(k, lambda: (go.wait(20), "v")[1]))
             for k in keys]
    claims = [flight.base_of(k) + "lead" for k in keys]
    try:
        wait_until("every claim taken", lambda: all(client.exists(c) for c in claims))
        slots = {client.keyslot(c) for c in claims}
        nodes = {client.get_node_from_key(c).name for c in claims}
        assert len(nodes) > 1, (slots, nodes)  # the test means something only if they spread
        assert release_claims(client, owner_prefix(), prefix=prefix) == len(keys)
        assert not any(client.exists(c) for c in claims)
    finally:
        go.set()
        for lead in leads:
            lead.wait_done()
        flight.close()


# -- the cache, the flight and the counters --------------------------------------------------


def test_the_cache_spreads_over_the_nodes_keeps_its_size_and_clear_empties_every_node(
    client: Any, redis_cluster: RedisCluster
) -> None:
    name = next(_names)
    cache = RedisCache(client, name, ttl=60, size=30, local_ttl=0.001, codec="auto")
    for n in range(40):
        cache.set(("k", n), {"n": n})
    pattern = f"reachlimit:{name}:cache:e:*"
    found = keys_on(redis_cluster, pattern)
    assert sum(len(keys) for keys in found.values()) == 30  # the size bound, over the nodes
    assert sum(1 for keys in found.values() if keys) == 3  # spread over every node
    assert cache.fetch(("k", 0)) is None  # the oldest went first
    assert cache.fetch(("k", 39)) == {"n": 39}
    cache.clear()
    assert all(not keys for keys in keys_on(redis_cluster, pattern).values())
    assert client.zcard(cache._index) == 0
    assert cache.get(("k", 39)) is None


def test_a_stale_window_on_a_cluster_reads_an_entry_and_its_pttl_in_one_pipeline(
    client: Any,
) -> None:
    cache = RedisCache(client, next(_names), ttl=30, stale=10, local_ttl=0.001, codec="auto")
    cache.put("k", b"v", 0.25)
    entry = cache.fetch_entry("k")
    assert entry is not None and entry.value == b"v" and entry.build_time == 0.25
    assert 20 < entry.fresh_for <= 30


def test_the_flight_on_a_cluster_shares_one_build_and_renews_its_claim(
    client: Any, threads: ThreadRunner
) -> None:
    name = next(_names)
    first = RedisSingleFlight(client, name, lease=0.6, codec="auto")
    second = RedisSingleFlight(client, name, lease=0.6, codec="auto")  # another "process"
    cache = RedisCache(client, name, codec="auto")
    limiter = RedisColdLimiter(client, name)
    assert first.use_cold_lead(cache, limiter) is False and not first.uses_cold_lead
    go = threading.Event()
    leader = start_call(threads, lambda: first.do("key", lambda: (go.wait(20), "built")[1]))
    claim = first.base_of("key") + "lead"
    wait_until("the claim taken", lambda: client.exists(claim) or leader.done.is_set())
    assert not leader.done.is_set(), (leader.value, leader.error)
    follower = start_call(threads, lambda: second.do("key", lambda: "built twice"))
    lowest = [client.pttl(claim)]

    def renewed() -> bool:  # the lease is pushed back up while the build runs
        now = client.pttl(claim)
        lowest[0] = min(lowest[0], now)
        return now > lowest[0] + 150

    wait_until("the claim renewed", renewed)
    go.set()
    leader.wait_done()
    follower.wait_done()
    assert leader.value == ("built", False) and follower.value == ("built", True)
    for obj in (first, second, limiter):
        obj.close()


def test_the_counters_add_up_on_a_cluster(client: Any) -> None:
    name = next(_names)
    path = ColdPath(ColdLimiter(), TTLCache(8, 60.0), SingleFlight())
    counters = SharedPathCounters(client, path, name)
    for key in ("a", "a", "b"):
        path.get(key, lambda: "v")
    assert counters.totals()["hits"] == 1 and counters.totals()["misses"] == 2
    counters.close()


# -- nodes restarted, and the limiter's slot migrated ----------------------------------------


def test_a_node_restarted_empty_loses_nothing_that_is_promised(
    client: Any, redis_cluster: RedisCluster
) -> None:
    lim = RedisColdLimiter(client, next(_names), active=2, queue=1)
    shared = ResilientLimiter(lim, ColdLimiter(2, 1), RedisHealth("cluster"))
    held = shared.acquire()
    owner = redis_cluster.nodes.index(redis_cluster.owner(lim.keys[0]))
    redis_cluster.restart(owner)  # empty: its grant, its keys and its scripts are gone
    held.release()  # freed nothing in Redis, and never raises
    def back() -> bool:
        shared.acquire().release()  # the first call after may meet a closed connection
        return shared.health.up and shared.stats().backend == "redis"

    wait_until("the limiter back on the cluster", back, interval=0.05)
    grants = [lim.acquire(), lim.acquire()]  # exactly the capacity, on the restarted node
    assert lim.stats().active == 2
    with pytest.raises(Busy):
        lim.acquire()  # the queue place taken
    for grant in grants:
        grant.release()
    lim.close()


def test_the_whole_cluster_restarted_is_used_again(
    client: Any, redis_cluster: RedisCluster
) -> None:
    lim = RedisColdLimiter(client, next(_names), active=1, queue=1)
    lim.acquire().release()
    redis_cluster.restart_all()
    def usable() -> bool:
        try:
            lim.acquire().release()
        except redis.RedisError:
            return False  # a connection of before the restart, or the map being re-read
        return True

    wait_until("the limiter usable again", usable, interval=0.05)
    assert lim.stats().acquired == 1  # the state began again with the restart
    lim.close()


def test_a_grant_held_across_a_migration_of_its_slot_is_released_once(
    client: Any, redis_cluster: RedisCluster
) -> None:
    lim = RedisColdLimiter(client, next(_names), active=2, queue=2, wait=30.0, lease=0.9)
    held = lim.acquire()  # its lease is renewed by the renewer all along (every 0.3 s)
    slot = redis_cluster.slot(lim.keys[0])
    source = redis_cluster.owner(lim.keys[0])
    target = next(node for node in redis_cluster.nodes if node is not source)
    redis_cluster.begin_migration(slot, source, target)
    moved = redis_cluster.move_keys(slot, source, target)
    redis_cluster.end_migration(slot, source, target)
    assert moved >= 2 and redis_cluster.owner(lim.keys[0]) is target
    with target.client() as node:
        assert node.zcard(lim.keys[0]) == 1  # the grant, on its new node
    renewed = [0]

    def lease_pushed() -> bool:  # the renewer followed the slot (MOVED) and renews there
        with target.client() as node:
            score = node.zscore(lim.keys[0], held.token)
        assert score is not None, "the grant was lost in the move"
        if not renewed[0]:
            renewed[0] = int(score)
        return int(score) > renewed[0]

    wait_until("the grant's lease renewed on the target", lease_pushed)
    second = lim.acquire()
    assert lim.stats().active == 2  # the held grant counts: exactly the capacity
    waiting = threading.Thread(target=lambda: lim.acquire().release(), daemon=True)
    waiting.start()
    wait_until("a waiter", lambda: lim.stats().queued == 1)
    held.release()
    with pytest.raises(RuntimeError):
        held.release()  # exactly once
    waiting.join(10)
    assert not waiting.is_alive() and not held.lease_lost
    second.release()
    stats = lim.stats()
    assert (stats.active, stats.queued, stats.acquired, stats.lease_lost) == (0, 0, 3, 0)
    lim.close()


def test_the_cluster_micro_benchmark_runs() -> None:
    """benchmarks/redis_micro.py --cluster, as a process with its own cluster: it finishes and
    reports what it promises (never its speed)."""
    report = run_json("redis_micro.py", "--cluster")
    for key in ("fast_path", "refusal_vs_get", "refusal_vs_ping"):
        row = report["results"][key]
        assert row["limiter_us"] > 0 and row["baseline_us"] > 0 and row["ratio"] > 0
    assert report["results"]["refusal_vs_ping"]["check"]["ok"]
