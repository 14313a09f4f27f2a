"""RedisColdLimiter across real processes: one budget for all of them.

Each process is ``tests/support/redis_worker.py`` (started by ``tests/support/redis_procs.py``),
a Python subprocess with its own limiter object on the same Redis and name, told over stdin
what to acquire and release and reporting each outcome on stdout. The test process watches
the global figures through a limiter of its own.
Every process is stopped by its PID at the end of its test (SIGKILL, then a bounded wait).
Waits are for states, with a bounded ``wait_until``; nothing is timed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter
from tests.support.bench_scripts import run_json
from tests.support.redis_procs import DEADLINE, Worker
from tests.support.redis_server import require_redis_server
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]



@pytest.fixture
def make_watch(client: redis.Redis) -> Iterator[Callable[..., RedisColdLimiter]]:
    """``watch(active, queue, wait=60.0, lease=10.0)``: the test process's own limiter on the
    workers' name, to read the global figures (and to hold slots); closed at teardown. Its
    settings must be the workers' (the defaults are ``start_workers``'s): one budget, one set
    of settings, or its first call raises ``ValueError``."""
    made: list[RedisColdLimiter] = []

    def make(active: int, queue: int, wait: float = 60.0, lease: float = 10.0) -> RedisColdLimiter:
        lim = RedisColdLimiter(client, "procs", active, queue, wait, lease=lease)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        lim.close()


def test_four_processes_share_one_budget(
    make_watch: Callable[..., RedisColdLimiter],
    start_workers: Callable[..., list[Worker]],
) -> None:
    """4 processes x 10 attempts at once, every grant held: 2 granted, 8 queued, 30 refused
    in all; then releasing one grant at a time lets exactly one queued attempt in."""
    workers = start_workers(4)
    watch = make_watch(2, 8)
    for j in range(10):
        for i, w in enumerate(workers):
            w.send(f"acquire p{i}-{j}")

    def outcomes() -> Counter[str]:
        return Counter(
            e["event"] for w in workers for e in w.seen() if e["event"] not in ("ready", "released")
        )

    wait_until(
        "2 granted, 8 queued, 30 refused",
        lambda: (
            outcomes() == Counter({"granted": 2, "queue_full": 30}) and watch.stats().queued == 8
        ),
        timeout=DEADLINE,
    )
    s = watch.stats()
    assert (s.active, s.queued, s.peak_active, s.peak_queued) == (2, 8, 2, 8)
    assert (s.rejected_full, s.acquired) == (30, 2)

    released: set[str] = set()
    for granted in range(2, 10):
        holder, attempt = next(
            (w, e["id"])
            for w in workers
            for e in w.seen()
            if e["event"] == "granted" and e["id"] not in released
        )
        released.add(attempt)
        holder.send(f"release {attempt}")
        wait_until(
            f"grant {granted + 1} handed over",
            lambda g=granted: outcomes()["granted"] == g + 1,
            timeout=DEADLINE,
        )
        s = watch.stats()
        assert s.active == 2 and s.queued == 8 - (granted - 1)
    assert outcomes() == Counter({"granted": 10, "queue_full": 30})
    for w in workers:
        for e in w.seen():
            if e["event"] == "granted" and e["id"] not in released:
                w.send(f"release {e['id']}")
    wait_until("all released", lambda: watch.stats().active == 0, timeout=DEADLINE)
    s = watch.stats()
    assert (s.acquired, s.rejected_full, s.rejected_timeout, s.queued) == (10, 30, 0, 0)


def test_first_in_first_out_across_processes(
    make_watch: Callable[..., RedisColdLimiter],
    start_workers: Callable[..., list[Worker]],
) -> None:
    workers = start_workers(4, active=1)
    watch = make_watch(1, 8)
    holder = watch.acquire()
    arrival: list[tuple[Worker, str]] = []
    for j in range(8):
        w = workers[(j * 3) % 4]  # 0, 3, 2, 1, 0, ...: not the order the processes started in
        attempt = f"a{j}"
        w.send(f"acquire {attempt}")
        wait_until(f"{attempt} queued", lambda j=j: watch.stats().queued == j + 1, timeout=DEADLINE)
        arrival.append((w, attempt))
    holder.release()
    for k, (w, attempt) in enumerate(arrival):
        wait_until(
            f"{attempt} promoted",
            lambda w=w, attempt=attempt: w.outcome(attempt) == "granted",
            timeout=DEADLINE,
        )
        later = [a for ww, a in arrival[k + 1 :] if ww.outcome(a) is not None]
        assert later == [], f"{later} served before {attempt}"
        w.send(f"release {attempt}")
    wait_until("last released", lambda: watch.stats().active == 0, timeout=DEADLINE)
    assert watch.stats().acquired == 9


def test_a_killed_holders_slot_comes_back_after_its_lease(
    make_watch: Callable[..., RedisColdLimiter],
    start_workers: Callable[..., list[Worker]],
) -> None:
    holder, waiter = start_workers(2, active=1, queue=1, lease=1.0)
    watch = make_watch(1, 1, lease=1.0)  # the workers' settings
    holder.send("acquire h")
    wait_until("h granted", lambda: holder.outcome("h") == "granted", timeout=DEADLINE)
    waiter.send("acquire w")
    wait_until("w queued", lambda: watch.stats().queued == 1, timeout=DEADLINE)
    holder.kill()
    wait_until("w promoted", lambda: waiter.outcome("w") == "granted", timeout=DEADLINE)
    s = watch.stats()
    assert (s.active, s.queued, s.lease_lost) == (1, 0, 1)
    waiter.send("release w")
    wait_until("w released", lambda: watch.stats().active == 0, timeout=DEADLINE)


def test_a_killed_waiters_place_comes_back(
    make_watch: Callable[..., RedisColdLimiter],
    start_workers: Callable[..., list[Worker]],
) -> None:
    first, second = start_workers(2, active=1, queue=1)
    watch = make_watch(1, 1)
    with watch.acquire():
        first.send("acquire w1")
        wait_until("w1 queued", lambda: watch.stats().queued == 1, timeout=DEADLINE)
        with pytest.raises(Busy) as info:
            watch.acquire()
        assert info.value.reason == "queue_full"
        first.kill()
        wait_until("w1's place back", lambda: watch.stats().queued == 0, timeout=DEADLINE)
        second.send("acquire w2")
        wait_until("w2 queued", lambda: watch.stats().queued == 1, timeout=DEADLINE)
    wait_until("w2 in", lambda: second.outcome("w2") == "granted", timeout=DEADLINE)
    second.send("release w2")
    wait_until("w2 released", lambda: watch.stats().active == 0, timeout=DEADLINE)
    assert watch.stats().lease_lost == 0


def test_a_storm_from_four_processes_keeps_the_bounds_and_returns_everything(
    client: redis.Redis,
    make_watch: Callable[..., RedisColdLimiter],
    start_workers: Callable[..., list[Worker]],
) -> None:
    """4 processes x 2 threads x 20 attempts with short holds, short waits and clients that
    leave: never more than 2 holders at once in all processes (a shared counter each holder
    increments), and afterwards every slot and place is back and every counter adds up."""
    workers = start_workers(4, active=2, queue=3, wait=0.1, lease=5.0)
    watch = make_watch(2, 3, wait=0.1, lease=5.0)  # the workers' settings
    for i, w in enumerate(workers):
        w.send(f"storm 40 2 {i}")

    def reports() -> list[dict[str, Any]]:
        return [e for w in workers for e in w.seen() if e["event"] == "storm"]

    wait_until("four storms over", lambda: len(reports()) == 4, timeout=90)
    done = reports()
    total = Counter[str]()
    for r in done:
        assert r["max_inside"] <= 2, r
        total.update({k: v for k, v in r.items() if k not in ("event", "max_inside")})
    assert sum(total.values()) == 4 * 40
    s = watch.stats()
    assert (s.active, s.queued, s.lease_lost) == (0, 0, 0), s
    assert s.peak_active <= 2 and s.peak_queued <= 3
    assert (s.acquired, s.rejected_full, s.rejected_timeout, s.cancelled) == (
        total["granted"],
        total["queue_full"],
        total["timeout"],
        total["cancelled"],
    )
    assert total["granted"] > 0 and max(r["max_inside"] for r in done) >= 1
    print(f"storm outcomes: {dict(total)}")
    assert client.get("procs:inside") == b"0"


def test_the_redis_micro_benchmark_runs() -> None:
    """benchmarks/redis_micro.py, as a process with its own redis-server: it finishes and
    reports what it promises (never its speed)."""
    require_redis_server()
    report = run_json("redis_micro.py")
    for key in ("fast_path", "refusal"):
        row = report["results"][key]
        assert row["limiter_us"] > 0 and row["baseline_us"] > 0 and row["ratio"] > 0
    assert report["results"]["refusal"]["check"]["ok"]


def test_the_redis_handoff_benchmark_runs() -> None:
    """benchmarks/redis_handoff.py, as a process with its own redis-server and its own child
    process: it finishes and reports what it promises (never its speed)."""
    require_redis_server()
    report = run_json("redis_handoff.py", "--handoffs", "6")
    handoff = report["results"]["handoff"]
    for side in ("limiter", "doorbell"):
        row = handoff[side]
        assert row["n"] == 6
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert handoff["ratio_p50"] > 0 and handoff["ratio_p99"] > 0
    assert handoff["goal_p99_ms"] == 5.0 and isinstance(handoff["goal_met"], bool)
    assert handoff["check"]["ok"], handoff["check"]
    waits = report["results"]["waits"]
    assert waits and all(hz.startswith("hz ") for hz in waits)
    for by_hz in waits.values():
        for case in ("cancel", "deadline_with_cancel_token", "deadline_without_token"):
            for side in ("redis", "local"):
                row = by_hz[case][side]
                assert row["n"] > 0 and row["p50_ms"] <= row["max_ms"]
