#!/usr/bin/env python3
"""A warm hit on the shared Redis cache against a warm hit on the in-process cache.

    python benchmarks/redis_warm.py            # about 10 s
    python benchmarks/redis_warm.py --quick    # a couple of seconds, rough figures
    python benchmarks/redis_warm.py --url redis://127.0.0.1:6379/15   # an existing Redis
                                               # (the database is FLUSHED: use a spare one)

Without ``--url`` it starts its own ``redis-server`` (``tests/support/redis_server.py``: a free
loopback port, a temporary directory, no persistence, stopped by PID).

What is measured: ``ColdPath.get(key, build)`` for a key that is warm, on a ``RedisCache``
(default settings: the hit is served by its in-process first level, ``local_ttl`` 1 s, so a
Redis ``GET`` refills it about once a second) against the same call on a ``TTLCache``. Both
paths share one ``ColdLimiter`` type and never build. The pair is timed by ``_paired.py``
(alternating rounds in worker processes, the median of the rounds' ratios). Goal: at most
1.2x. The Redis commands sent while timing are counted, to show how rarely a warm hit reaches
Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterator
from typing import Any

import _load
import _paired
import _report
from _paired import Pair, Spec, Worker, call

from reachlimit import ColdLimiter, ColdPath, TTLCache
from reachlimit.redis import RedisCache
from tests.support.redis_clients import CountingRedis  # the suite's: counts by command name

SPEC = Spec("redis_warm", sides=("local", "redis"), unit="ns", rounds=41, quick_rounds=5)
GOAL = 1.2
KEYS = 16


def never() -> Any:
    raise AssertionError("a warm key was built")


def warm_gets(path: ColdPath[Any], keys: list[str]) -> Any:
    """One warm get an operation, over ``keys`` in turn."""
    get, turn = path.get, itertools.cycle(keys)
    return lambda: get(next(turn), never)


def pairs(worker: Worker) -> Iterator[Pair]:
    client = CountingRedis.from_url(worker.args.url, socket_timeout=0.5,
                                    socket_connect_timeout=0.5)  # fmt: skip
    client.flushdb()
    keys = [f"report|{i}|7|g1" for i in range(KEYS)]
    value = {"nodes": list(range(20)), "summary": "warm"}
    local: ColdPath[Any] = ColdPath(ColdLimiter(), TTLCache())
    shared_cache: RedisCache[Any] = RedisCache(client, "bench-warm")
    shared: ColdPath[Any] = ColdPath(ColdLimiter(), shared_cache)
    for key in keys:
        local.cache.set(key, value)
        shared_cache.set(key, value)
    before = client.total()
    yield Pair("warm_hit", call("TTLCache", warm_gets(local, keys)),
               call("RedisCache", warm_gets(shared, keys)),
               lambda: {"redis_commands_while_timing": client.total() - before,
                        "builds": shared.stats().builds})
    client.flushdb()
    client.close()


def render(report: dict[str, Any]) -> str:
    row = report["results"]["warm_hit"]
    out = [*_report.head("reachlimit: a warm hit on RedisCache against one on TTLCache", report),
           _paired.timing_line(row), ""]
    out += _paired.table([("ColdPath.get on RedisCache", "on TTLCache", row)], SPEC)
    out += [f"Redis commands while timing: {row['redis_commands_while_timing']}; builds "
            f"{row['builds']}; median ratio {row['ratio']:.3f}x", "",
            f"goal <= {GOAL}x: {'met' if row['met'] else 'NOT met'}"]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _paired.parser(__doc__, SPEC)
    p.add_argument("--url", help="an existing Redis (its database is flushed)")
    run = _paired.Session(__file__, p, SPEC, pairs, argv)
    if run.in_worker:
        return run.work()
    with _load.redis_unless(run.args.url) as url:
        group = run.group(argv=("--url", url))
        with contextlib.closing(CountingRedis.from_url(url)) as client:
            run.report["machine"]["redis_server"] = _load.redis_version(client)
    row = _paired.figures(group, SPEC, "warm_hit")
    row.update(goal=GOAL, met=row["ratio"] <= GOAL)
    results = {"warm_hit": row}
    return run.finish(render, results=results, figures=_paired.ratio_figures(results),
                      goals=_paired.ratio_goals(
                          [("warm hit on RedisCache vs on TTLCache", "warm_hit", GOAL)], results))


if __name__ == "__main__":
    sys.exit(main())
