"""One process using ColdPath over Redis, driven by tests/test_redis_flight_processes.py.

    python tests/support/redis_flight_worker.py PORT NAME LEASE

Builds a ``ColdPath`` of a ``RedisColdLimiter`` (active 2, queue 8, wait 30 s), a
``RedisCache`` and a ``RedisSingleFlight`` on the Redis at 127.0.0.1:PORT, all named NAME,
with LEASE seconds of lease for the limiter and the flight. Reads commands on stdin, one a
line, and reports on stdout, one JSON object a line:

    get ID KEY  -> runs ``path.get(KEY, build)`` in a thread of its own; then
                   {"id": ID, "event": "value", "value": ...} or
                   {"id": ID, "event": "error", "error": "..."}
    stats       -> {"event": "stats", "hits": .., "misses": .., "builds": .., "coalesced": ..}
    storm N T KEYS SEED -> T threads make N gets in all over KEYS keys (``storm-<i>``), chosen
                   at random; these builds are not gated: each counts itself, sleeps a few
                   random milliseconds and returns {"key": KEY, "by": PID}. Then
                   {"event": "storm", "outcomes": {...}, "values": {KEY: [PID, ...]}}
    (end of input) -> the process closes its limiter and flight and exits

A build counts itself in the Redis counter ``NAME:builds:KEY`` (every build of every process),
reports {"event": "building", "key": KEY, "pid": PID}, then waits (``BLPOP`` in one-second
slices, at most 60 s) for the test to push ``NAME:go:KEY``: the test decides when each build
ends. It returns {"key": KEY, "by": PID}. The process first reports {"event": "ready", "pid": PID}.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections import Counter
from typing import Any

import redis

from reachlimit import ColdPath
from reachlimit.redis import RedisCache, RedisColdLimiter, RedisSingleFlight

_out = threading.Lock()


def report(**fields: Any) -> None:
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> None:
    port, name, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = redis.Redis(
        host="127.0.0.1", port=int(port), socket_timeout=2.0, socket_connect_timeout=0.5
    )
    limiter = RedisColdLimiter(client, name, 2, 8, 30.0, lease=lease)
    flight = RedisSingleFlight(client, name, lease=lease)
    path = ColdPath(limiter, RedisCache(client, name), flight)
    pid = os.getpid()

    def build_of(key: str) -> Any:
        def build() -> dict[str, Any]:
            client.incr(f"{name}:builds:{key}")
            report(event="building", key=key, pid=pid)
            for _ in range(60):  # one-second waits: shorter than the socket timeout
                if client.blpop([f"{name}:go:{key}"], timeout=1) is not None:
                    break
            else:
                raise TimeoutError("the test never let the build finish")
            return {"key": key, "by": pid}

        return build

    def get(attempt: str, key: str) -> None:
        try:
            value = path.get(key, build_of(key))
        except Exception as exc:  # reported, so that the test fails with it
            report(id=attempt, event="error", error=repr(exc))
        else:
            report(id=attempt, event="value", value=value)

    def storm(attempts: int, n_threads: int, n_keys: int, seed: int) -> None:
        outcomes: Counter[str] = Counter()
        values: dict[str, set[int]] = {}
        lock = threading.Lock()

        def quick_build(key: str, rng: random.Random) -> Any:
            def build() -> dict[str, Any]:
                client.incr(f"{name}:builds:{key}")
                time.sleep(rng.uniform(0, 0.03))
                return {"key": key, "by": pid}

            return build

        def run(rng: random.Random, n: int) -> None:
            for _ in range(n):
                key = f"storm-{rng.randrange(n_keys)}"
                try:
                    value = path.get(key, quick_build(key, rng))
                except Exception as exc:
                    outcome = type(exc).__name__
                else:
                    outcome = "value"
                    with lock:
                        values.setdefault(key, set()).add(value["by"])
                with lock:
                    outcomes[outcome] += 1
                time.sleep(rng.uniform(0, 0.01))

        workers = [
            threading.Thread(target=run, args=(random.Random(seed * 1000 + i),
                                               attempts // n_threads), daemon=True)
            for i in range(n_threads)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        report(event="storm", outcomes=dict(outcomes),
               values={k: sorted(v) for k, v in values.items()})

    report(event="ready", pid=pid)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "get":
            threading.Thread(target=get, args=(args[0], args[1]), daemon=True).start()
        elif command == "storm":
            numbers = [int(x) for x in args]
            threading.Thread(target=storm, args=numbers, daemon=True).start()
        elif command == "stats":
            s = path.stats()
            report(event="stats", hits=s.hits, misses=s.misses, builds=s.builds,
                   coalesced=s.coalesced)
    flight.close()
    limiter.close()


if __name__ == "__main__":
    main()
