"""One process using a RedisColdLimiter, driven by tests/test_redis_processes.py.

    python tests/redis_worker.py PORT NAME ACTIVE QUEUE WAIT LEASE

Reads commands on stdin, one a line, and reports on stdout, one JSON object a line:

    acquire ID   -> {"id": ID, "event": "granted" | "queue_full" | "timeout" | "cancelled"
                     | "error", ...} once the acquire (run in its own thread) returns
    release ID   -> {"id": ID, "event": "released"}
    storm N T SEED -> T threads make N attempts in all, each held a few random milliseconds
                     (some with a cancel token that fires after a random delay); then
                     {"event": "storm", "granted": .., "queue_full": .., "timeout": ..,
                      "cancelled": .., "max_inside": ..}. Every holder increments a shared
                     Redis counter while it holds its grant: ``max_inside`` is the most
                     holders this process saw at once in all processes together.
    (end of input) -> the process closes its limiter and exits

It first reports {"event": "ready", "pid": PID}. Every grant is held until the test releases it.
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

from reachlimit import Busy, Cancelled, Grant
from reachlimit.redis import RedisColdLimiter

_out = threading.Lock()


class FiresAfter:
    """A cancel token that becomes set ``delay`` seconds from now (a client that leaves)."""

    def __init__(self, delay: float) -> None:
        self.at = time.monotonic() + delay

    def is_set(self) -> bool:
        return time.monotonic() >= self.at


def report(**fields: Any) -> None:
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> None:
    port, name, active, queue, wait, lease = sys.argv[1:7]
    client = redis.Redis(
        host="127.0.0.1", port=int(port), socket_timeout=0.5, socket_connect_timeout=0.5
    )
    lim = RedisColdLimiter(
        client, name, int(active), int(queue), float(wait), lease=float(lease)
    )
    grants: dict[str, Grant] = {}

    def acquire(attempt: str) -> None:
        try:
            grants[attempt] = lim.acquire()
        except Busy as exc:
            report(id=attempt, event=exc.reason)
        except Cancelled:
            report(id=attempt, event="cancelled")
        except Exception as exc:  # reported, so that the test fails with it
            report(id=attempt, event="error", error=repr(exc))
        else:
            report(id=attempt, event="granted")

    def storm(attempts: int, threads: int, seed: int) -> None:
        outcomes: Counter[str] = Counter()
        max_inside = 0
        lock = threading.Lock()
        inside_key = f"{name}:inside"

        def run(rng: random.Random, n: int) -> None:
            nonlocal max_inside
            for _ in range(n):
                cancel = FiresAfter(rng.uniform(0, 0.1)) if rng.random() < 0.3 else None
                try:
                    with lim.acquire(cancel):
                        inside = int(client.incr(inside_key))
                        time.sleep(rng.uniform(0, 0.08))  # the "build"
                        client.decr(inside_key)
                except Busy as exc:
                    outcome = exc.reason
                except Cancelled:
                    outcome = "cancelled"
                else:
                    outcome = "granted"
                    with lock:
                        max_inside = max(max_inside, inside)
                with lock:
                    outcomes[outcome] += 1
                time.sleep(rng.uniform(0, 0.1))  # the client's pause before its next request

        rngs = [random.Random(seed * 1000 + i) for i in range(threads)]
        workers = [
            threading.Thread(target=run, args=(rngs[i], attempts // threads), daemon=True)
            for i in range(threads)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        report(event="storm", max_inside=max_inside, **outcomes)

    report(event="ready", pid=os.getpid())
    for line in sys.stdin:
        command, _, attempt = line.strip().partition(" ")
        if command == "acquire":
            threading.Thread(target=acquire, args=(attempt,), daemon=True).start()
        elif command == "storm":
            n, t, seed = (int(x) for x in attempt.split())
            threading.Thread(target=storm, args=(n, t, seed), daemon=True).start()
        elif command == "release":
            grants.pop(attempt).release()
            report(id=attempt, event="released")
    lim.close()


if __name__ == "__main__":
    main()
