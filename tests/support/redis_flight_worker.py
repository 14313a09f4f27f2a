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
    (end of input) -> the process closes its limiter and flight and exits

A build counts itself in the Redis counter ``NAME:builds:KEY`` (every build of every process),
reports {"event": "building", "key": KEY, "pid": PID}, then waits (``BLPOP`` in one-second
slices, at most 60 s) for the test to push ``NAME:go:KEY``: the test decides when each build
ends. It returns {"key": KEY, "by": PID}. The process first reports {"event": "ready", "pid": PID}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
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

    report(event="ready", pid=pid)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "get":
            threading.Thread(target=get, args=(args[0], args[1]), daemon=True).start()
        elif command == "stats":
            s = path.stats()
            report(event="stats", hits=s.hits, misses=s.misses, builds=s.builds,
                   coalesced=s.coalesced)
    flight.close()
    limiter.close()


if __name__ == "__main__":
    main()
