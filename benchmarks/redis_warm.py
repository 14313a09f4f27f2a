#!/usr/bin/env python3
"""A warm hit on the shared Redis cache against a warm hit on the in-process cache.

    python benchmarks/redis_warm.py            # full run, about 10 s
    python benchmarks/redis_warm.py --quick    # a couple of seconds, rough figures
    python benchmarks/redis_warm.py --json     # the same figures as JSON on stdout
    python benchmarks/redis_warm.py --url redis://127.0.0.1:6379/15   # an existing Redis
                                               # (the database is FLUSHED: use a spare one)

Without ``--url`` it starts its own ``redis-server`` (Debian's package) on a free loopback
port in a temporary directory, without persistence, and stops it by PID at the end.

What is measured: ``ColdPath.get(key, build)`` for a key that is warm, on a ``RedisCache``
(default settings: the hit is served by its in-process first level, ``local_ttl`` 1 s, so a
Redis ``GET`` refills it about once a second) against the same call on a ``TTLCache``. Both
paths share one ``ColdLimiter`` type and never build. The two are timed in alternating rounds
(the baseline first on even rounds); the ratio is the median of the per-round ratios, with the
best-of-rounds ratio and the spread beside it. Goal: at most 1.2x. The Redis commands sent
while timing are counted, to show how rarely a warm hit reaches Redis.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import alternating, machine, ratios, redis_parser
from redis_micro import own_redis_server

from reachlimit import ColdLimiter, ColdPath, TTLCache
from reachlimit.redis import RedisCache
from tests.support.redis_clients import CountingRedis  # the suite's: counts by command name

GOAL = 1.2
KEYS = 16


def never() -> Any:
    raise AssertionError("a warm key was built")


def timed(path: ColdPath, keys: list[str]) -> Callable[[int], float]:
    """``run(n)``: ``n`` warm gets over ``keys`` in turn; the seconds they took."""
    get = path.get

    def run(n: int) -> float:
        rounds, rest = divmod(n, len(keys))
        batch = keys * rounds + keys[:rest]
        start = time.perf_counter()
        for key in batch:
            get(key, never)
        return time.perf_counter() - start

    return run


def run(url: str, number: int, rounds: int) -> dict[str, Any]:
    client = CountingRedis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    client.flushdb()
    keys = [f"report|{i}|7|g1" for i in range(KEYS)]
    value = {"nodes": list(range(20)), "summary": "warm"}
    local = ColdPath(ColdLimiter(), TTLCache())
    shared_cache = RedisCache(client, "bench-warm")
    shared = ColdPath(ColdLimiter(), shared_cache)
    for key in keys:
        local.cache.set(key, value)
        shared_cache.set(key, value)
    before = sum(client.sent.values())
    base_s, cand_s = alternating(timed(local, keys), timed(shared, keys), number, rounds)
    sent = sum(client.sent.values()) - before
    figures = ratios(base_s, cand_s)
    stats = shared.stats()
    client.flushdb()
    client.close()
    return {
        "redis_ns": round(statistics.median(cand_s) * 1e9, 1),
        "local_ns": round(statistics.median(base_s) * 1e9, 1),
        "ratio": round(figures["ratio"], 3),
        "ratio_best": round(figures["ratio_best"], 3),
        "ratio_spread": [round(x, 3) for x in figures["ratio_spread"]],
        "rounds": rounds,
        "ops_per_round": number,
        "redis_commands_while_timing": sent,
        "builds": stats.builds,
        "goal": GOAL,
        "met": figures["ratio"] <= GOAL,
    }


def main() -> None:
    parser = redis_parser(__doc__.split("\n\n")[0], "fewer, shorter rounds")
    parser.add_argument("--number", type=int, help="warm gets per round and side")
    parser.add_argument("--rounds", type=int, help="alternating rounds")
    args = parser.parse_args()
    number, rounds = (20_000, 9) if args.quick else (100_000, 41)
    number = args.number or number
    rounds = args.rounds or rounds
    if args.url:
        result = run(args.url, number, rounds)
    else:
        with own_redis_server() as url:
            result = run(url, number, rounds)
    report = {"machine": machine(), "results": {"warm_hit": result}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("machine:", json.dumps(report["machine"]))
    print(
        f"warm hit, ColdPath.get on RedisCache vs on TTLCache: {result['redis_ns']} ns vs "
        f"{result['local_ns']} ns, median ratio {result['ratio']}x (best {result['ratio_best']}x,"
        f" spread {result['ratio_spread'][0]}-{result['ratio_spread'][1]}x; {rounds} rounds x "
        f"{number}); Redis commands while timing: {result['redis_commands_while_timing']}"
    )
    print(f"goal <= {GOAL}x: {'met' if result['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
