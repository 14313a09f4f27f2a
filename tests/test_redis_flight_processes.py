"""ColdPath over Redis across real processes: one build per key, one warm cache, for all.

Each process is ``tests/support/redis_flight_worker.py``: a Python subprocess with its own
``ColdPath`` (``RedisColdLimiter``, ``RedisCache``, ``RedisSingleFlight``) on the same Redis and
name, told over stdin which keys to get, reporting over stdout when a build starts and what each
get returned. Every build counts itself in Redis and then waits until the test pushes its
``go`` list, so the test decides when builds end. Waits are for states with a bounded
``wait_until``; every process is stopped by its PID (SIGKILL, then a bounded wait).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisSingleFlight, owner_prefix, release_claims
from reachlimit.redis._common import BOOT_ID, BOOT_ID_VARIABLE
from tests.support.processes import pid_alive
from tests.support.redis_procs import LineProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

WORKER = Path(__file__).resolve().parent / "support" / "redis_flight_worker.py"
#: How long a process may take to start, or a state to be reached, before the test fails.
DEADLINE = 30.0
NAME = "shared"


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=2.0)
    c.flushall()
    yield c
    c.close()


class Worker(LineProcess):
    """One ``redis_flight_worker.py`` process (its own ``ColdPath`` on Redis) and its events."""

    def __init__(self, port: int, lease: float) -> None:
        super().__init__([str(WORKER), str(port), NAME, str(lease)])

    def results(self) -> list[dict[str, Any]]:
        return self.seen("value") + self.seen("error")

    def stats(self) -> dict[str, Any]:
        before = len(self.seen("stats"))
        self.send("stats")
        wait_until(f"stats of {self.pid}", lambda: len(self.seen("stats")) > before,
                   timeout=DEADLINE)
        return self.seen("stats")[-1]


@pytest.fixture
def start_workers(redis_server: RedisServer) -> Iterator[Callable[..., list[Worker]]]:
    started: list[Worker] = []

    def start(n: int, lease: float = 10.0) -> list[Worker]:
        workers = [Worker(redis_server.port, lease) for _ in range(n)]
        started.extend(workers)
        for w in workers:
            wait_until(f"worker {w.pid} ready", lambda w=w: bool(w.seen("ready")),
                       timeout=DEADLINE)
        return workers

    yield start
    for w in started:
        w.kill()
    assert not any(pid_alive(w.pid) for w in started)


def builds(client: redis.Redis, key: str) -> int:
    return int(client.get(f"{NAME}:builds:{key}") or 0)


def followers(client: redis.Redis, key: str, flight: int = 1) -> int:
    """How many processes wait in Redis on flight ``flight`` of ``key``."""
    base = RedisSingleFlight(client, NAME).base_of(key)
    return int(client.get(base + f"w:{flight}") or 0)


def building(workers: list[Worker]) -> list[int]:
    return [e["pid"] for w in workers for e in w.seen("building")]


def test_a_same_key_herd_over_four_processes_builds_once(
    client: redis.Redis, start_workers: Callable[..., list[Worker]]
) -> None:
    workers = start_workers(4)
    workers[0].send("get lead herd")
    wait_until("one build started", lambda: len(building(workers)) == 1, timeout=DEADLINE)
    for i, w in enumerate(workers):
        for j in range(3):
            w.send(f"get p{i}-{j} herd")
    wait_until("the three other processes follow in Redis",
               lambda: followers(client, "herd") == 3, timeout=DEADLINE)
    client.rpush(f"{NAME}:go:herd", 1)
    wait_until("every get answered", lambda: sum(len(w.results()) for w in workers) == 13,
               timeout=DEADLINE)
    values = [e for w in workers for e in w.results()]
    assert all(e["event"] == "value" for e in values), values
    assert {json.dumps(e["value"], sort_keys=True) for e in values} == {
        json.dumps({"key": "herd", "by": workers[0].pid}, sort_keys=True)
    }
    assert builds(client, "herd") == 1 and building(workers) == [workers[0].pid]
    for w in workers[1:]:
        s = w.stats()
        assert s["builds"] == 0
        assert s["coalesced"] + s["hits"] == 3 and s["coalesced"] >= 1


def test_a_warm_key_built_once_is_served_by_every_process(
    client: redis.Redis, start_workers: Callable[..., list[Worker]]
) -> None:
    workers = start_workers(4)
    client.rpush(f"{NAME}:go:warm", 1)  # the first build may finish at once
    workers[0].send("get first warm")
    wait_until("built", lambda: len(workers[0].results()) == 1, timeout=DEADLINE)
    for i, w in enumerate(workers):
        w.send(f"get again-{i} warm")
    wait_until("every process answered",
               lambda: all(len(w.results()) == (2 if w is workers[0] else 1) for w in workers),
               timeout=DEADLINE)
    values = [e for w in workers for e in w.results()]
    assert all(e["event"] == "value" and e["value"]["by"] == workers[0].pid for e in values)
    assert builds(client, "warm") == 1
    for w in workers[1:]:
        s = w.stats()
        assert (s["hits"], s["misses"], s["builds"]) == (1, 0, 0)


def test_a_killed_leader_is_taken_over_and_the_key_built_exactly_twice(
    client: redis.Redis, start_workers: Callable[..., list[Worker]]
) -> None:
    leader, *others = start_workers(4, lease=1.0)
    followers_ = others[:2]
    late = others[2]
    leader.send("get lead dead")
    wait_until("the leader builds", lambda: building([leader]) == [leader.pid], timeout=DEADLINE)
    for i, w in enumerate(followers_):
        for j in range(2):
            w.send(f"get f{i}-{j} dead")
    wait_until("two processes follow in Redis", lambda: followers(client, "dead") == 2,
               timeout=DEADLINE)
    leader.kill()  # mid-build, SIGKILL: no clean-up runs, its claim just stops being renewed
    wait_until("a follower took over", lambda: builds(client, "dead") == 2, timeout=DEADLINE)
    wait_until("its build reported", lambda: len(building(followers_)) == 1, timeout=DEADLINE)
    taker = building(followers_)[0]
    client.rpush(f"{NAME}:go:dead", 1)
    wait_until("every follower answered",
               lambda: all(len(w.results()) == 2 for w in followers_), timeout=DEADLINE)
    values = [e for w in followers_ for e in w.results()]
    assert all(e["event"] == "value" and e["value"] == {"key": "dead", "by": taker}
               for e in values), values
    late.send("get late dead")
    wait_until("a late process answered", lambda: len(late.results()) == 1, timeout=DEADLINE)
    assert late.results()[0]["value"] == {"key": "dead", "by": taker}
    assert builds(client, "dead") == 2  # once lost, once finished; never more
    base = RedisSingleFlight(client, NAME).base_of("dead")
    assert int(client.get(base + "n") or 0) == 1  # the same flight, taken over


def test_a_killed_leaders_claim_dropped_by_its_parent_is_taken_over_at_once(
    client: redis.Redis, start_workers: Callable[..., list[Worker]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What gunicorn's child_exit does for a worker that died (release_worker): its claims
    # are dropped, so a follower takes the flight over at its next check. The lease is a
    # minute: a takeover within the test's deadline is the drop's doing, not the lease's.
    # The workers share this process's boot id, as gunicorn's workers share their master's.
    monkeypatch.setenv(BOOT_ID_VARIABLE, BOOT_ID)
    leader, follower = start_workers(2, lease=60.0)
    leader.send("get lead orphan")
    wait_until("the leader builds", lambda: building([leader]) == [leader.pid], timeout=DEADLINE)
    follower.send("get f orphan")
    wait_until("the other process follows in Redis", lambda: followers(client, "orphan") == 1,
               timeout=DEADLINE)
    leader.kill()  # mid-build, SIGKILL: its claim stays until its lease ends
    assert release_claims(client, owner_prefix(leader.pid)) == 1
    wait_until("the follower took over", lambda: building([follower]) == [follower.pid],
               timeout=DEADLINE)
    client.rpush(f"{NAME}:go:orphan", 1)
    wait_until("the follower answered", lambda: len(follower.results()) == 1, timeout=DEADLINE)
    assert follower.results()[0]["value"] == {"key": "orphan", "by": follower.pid}
    assert builds(client, "orphan") == 2  # once lost, once finished


def test_a_storm_over_four_processes_builds_each_key_at_most_once(
    client: redis.Redis, start_workers: Callable[..., list[Worker]]
) -> None:
    """Random gets over a few keys from 4 processes x 4 threads at once: the cache and the
    flight together allow at most one build per key in all processes (a leader refused by the
    limiter builds nothing), and every value of a key comes from that one build."""
    workers = start_workers(4)
    for i, w in enumerate(workers):
        w.send(f"storm 60 4 6 {i + 1}")
    wait_until("every storm over", lambda: all(w.seen("storm") for w in workers),
               timeout=DEADLINE * 2)
    outcomes: Counter[str] = Counter()
    by_key: dict[str, set[int]] = {}
    for w in workers:
        report = w.seen("storm")[0]
        outcomes.update(report["outcomes"])
        for key, pids in report["values"].items():
            by_key.setdefault(key, set()).update(pids)
    assert sum(outcomes.values()) == 240
    assert set(outcomes) <= {"value", "Busy"}, outcomes
    assert outcomes["value"] > 0
    for i in range(6):
        key = f"storm-{i}"
        assert builds(client, key) <= 1, key
        if key in by_key:
            assert builds(client, key) == 1 and len(by_key[key]) == 1, (key, by_key[key])
