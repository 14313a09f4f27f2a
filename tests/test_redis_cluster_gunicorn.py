"""The extension under REAL gunicorn (2 workers) on a REAL three-primary Redis Cluster
(``REACHLIMIT_REDIS_URL=redis+cluster://...``): the proofs ``tests/test_redis_gunicorn.py``
makes on one Redis, made again on a cluster.

design: the servers are that module's (``gate_server``: the shipped config serving
``tests/apps/file_gate_app.py``, whose builds wait for a gate file the test creates and
record how many builds ran at once), with the module's cluster as the Redis; the test
watches the shared limiter through a ``RedisColdLimiter`` of its own on a cluster client
(``ClusterWatch``). On a cluster the cold lead is not used, so a cold request makes its
round trips one by one; the budget, the singleflight and the warm cache are the same
promises. Every wait is for a state, bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from reachlimit.redis import RedisColdLimiter, connect
from tests import test_redis_gunicorn as single
from tests.apps.file_gate_app import build_pids, running_counts
from tests.support.clients import Herd, http_request
from tests.support.gunicorn_server import WEBAPP_CONFIG, serving
from tests.support.redis_cluster import RedisCluster, redis_cluster_fixture  # noqa: F401
from tests.support.waiting import wait_until
from tests.test_redis_gunicorn import PREFIX, Watch, debug_health, gate_server

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

gate = single.gate  # the gate directory's fixture, the single-server module's


@pytest.fixture
def redis_url(redis_cluster: RedisCluster) -> str:
    """The module's cluster, emptied."""
    redis_cluster.flush()
    return redis_cluster.url()


class ClusterWatch(Watch):
    """``Watch`` (the test's own view of the shared limiter) through a cluster client."""

    def __init__(  # noqa: D107 - Watch's, on a cluster
        self, url: str, active: int = 2, queue: int = 8, wait: float = 30.0, lease: float = 10.0
    ) -> None:
        self.client = connect(url, timeout=2.0)
        self.limiter = RedisColdLimiter(
            self.client, "cold", active, queue, wait, lease=lease, prefix=PREFIX
        )


@pytest.fixture
def watch(redis_url: str) -> Iterator[ClusterWatch]:
    w = ClusterWatch(redis_url)
    yield w
    w.close()


def test_a_burst_on_a_cluster_admits_exactly_the_shared_budget(
    tmp_path: Path, gate: Path, redis_url: str, watch: ClusterWatch
) -> None:
    server = gate_server(tmp_path, "burst", gate, redis_url)
    with serving(server):
        assert len(server.worker_pids()) == 2
        herds = [Herd(server.port, [f"/report/burst-{n}" for n in range(40)])]
        single.burst_refused(herds, watch, gate)
        reach = debug_health(server)["reach"]
        assert (reach["backend"], reach["degraded"], reach["active"]) == ("redis", False, 2)
        assert 0 < reach["queued"] <= 8  # 8, less any waiter dropped since (burst_refused)
        (gate / "open").touch()
        replies = herds[0].results()
        single.check_burst_answers(replies, watch)
        counts = running_counts(gate)
        admitted = sum(r.status == 200 for r in replies)
        assert len(counts) == admitted and max(counts) == 2, counts  # never 3 builds at once
        assert watch.stats().active == 0


def test_a_same_key_herd_on_a_cluster_builds_once_and_is_warm_in_both_workers(
    tmp_path: Path, gate: Path, redis_url: str, watch: ClusterWatch
) -> None:
    server = gate_server(tmp_path, "herd", gate, redis_url)
    with serving(server):
        workers = set(server.worker_pids())
        assert len(workers) == 2
        herd = Herd(server.port, ["/report/herd"] * 20)
        wait_until("the one build running", lambda: len(build_pids(gate)) == 1)
        (gate / "open").touch()
        replies = herd.results()
        assert Counter(r.status for r in replies) == {200: 20}
        assert len({r.body for r in replies}) == 1  # one answer: the one build's
        assert len(running_counts(gate)) == 1  # built once in the whole service

        single.warm_in_every_worker([server], "/report/herd", replies[0].body, workers)
        assert len(running_counts(gate)) == 1
        assert watch.stats().acquired == 1  # one admission in all: the one build's


def test_a_sigkilled_workers_slot_comes_back_at_once_on_a_cluster(
    tmp_path: Path, gate: Path, redis_url: str
) -> None:
    lease = 30.0
    watch = ClusterWatch(redis_url, active=1, queue=1, lease=lease)  # the server's settings
    server = gate_server(
        tmp_path, "kill", gate, redis_url, config=WEBAPP_CONFIG,
        env={"REACHLIMIT_ACTIVE": "1", "REACHLIMIT_QUEUE": "1", "REACHLIMIT_LEASE": str(lease)},
    )

    def victims_request() -> None:
        with contextlib.suppress(OSError):  # its worker is killed while it holds the slot
            http_request(server.port, "GET", "/report/victim", timeout=60)

    asker = threading.Thread(target=victims_request, daemon=True)
    try:
        with serving(server):
            asker.start()
            victim = wait_until("the victim's build running", lambda: build_pids(gate))["victim"]
            assert watch.held_by(victim)
            os.kill(victim, signal.SIGKILL)

            def slot_back() -> bool:
                watch.stats()
                return not watch.held_by(victim)

            # child_exit's release_worker: long before the lease could end (30 s).
            wait_until("the dead worker's slot back", slot_back, timeout=lease / 2,
                       interval=0.005)
            # Its log line comes just after the slot is freed in Redis.
            wait_until("child_exit's log line", lambda: "freed 1 build slot(s)" in server.stderr())
            (gate / "running-victim").unlink(missing_ok=True)  # the dead build's marker
            (gate / "open").touch()
            reply = server.get("/report/after")  # the budget is whole again
            assert reply.status == 200, reply
    finally:
        (gate / "open").touch()
        asker.join(70)
        watch.close()


def test_the_limiters_node_restarted_under_gunicorn_gives_no_5xx_and_is_used_again(
    tmp_path: Path, gate: Path, redis_cluster: RedisCluster, redis_url: str,
    watch: ClusterWatch,
) -> None:
    (gate / "open").touch()
    server = gate_server(tmp_path, "restart", gate, redis_url)
    statuses: Counter[int] = Counter()
    n = 0

    def ask(prefix: str) -> bool:
        nonlocal n
        n += 1
        reply = server.get(f"/report/{prefix}-{n}")
        statuses[reply.status] += 1
        return reply.status == 200

    with serving(server):
        for _ in range(6):
            ask("up")
        assert debug_health(server)["reach"]["backend"] == "redis"
        owner = redis_cluster.owner(watch.limiter.keys[0])
        redis_cluster.restart(redis_cluster.nodes.index(owner))  # empty, same slots
        streak = 0

        def back_on_redis() -> bool:
            nonlocal streak
            ask("again")
            reach = debug_health(server)["reach"]
            streak = streak + 1 if (reach["backend"], reach["degraded"]) == ("redis", False) \
                else 0
            return streak >= 10

        wait_until("both workers back on the cluster", back_on_redis, timeout=30,
                   interval=0.02)
    fell_back = "is unavailable" in server.stderr()
    print(f"\nstatuses across the restart: {dict(statuses)}; fallback used: {fell_back}")
    assert set(statuses) == {200}, statuses  # never a 5xx, nothing refused on "local"
    assert watch.stats().active == 0
