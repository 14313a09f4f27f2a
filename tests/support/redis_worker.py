"""One process using a RedisColdLimiter, driven by tests/test_redis_processes.py.

    python tests/support/redis_worker.py PORT NAME ACTIVE QUEUE WAIT LEASE [patient|impatient]

``patient``: the client retries through a Redis restart (50 tries, backoff capped at 0.2 s);
``impatient``: it never retries; neither: redis-py's default retries.
``presence=SECONDS``: the limiter's ``PRESENCE`` (how long its waiters stay queued after
their last poll), for a test that pauses a waiter.

Reads commands on stdin, one a line, and reports on stdout, one JSON object a line:

    acquire ID [CLIENT]
                 -> {"id": ID, "event": "granted" | "queue_full" | "timeout" | "displaced"
                     | "cancelled" | "error", "elapsed": seconds (this process's monotonic
                     clock), ...}; CLIENT names who asks (fair admission; none: anonymous)
                    once the acquire (run in its own thread) returns; a grant also reports
                    its ``token`` and ``building``: the grants held at that instant in all
                    processes (a shared Redis counter ``NAME:building``, +1 on a grant and -1
                    on its release)
    release ID   -> {"id": ID, "event": "released", "lease_lost": bool}
    status ID    -> {"id": ID, "event": "status", "held": bool, "lease_lost": bool}
    time         -> {"event": "time", "time": time.time(), "monotonic": time.monotonic()}:
                    what this process's clocks say (a test runs one under libfaketime)
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
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

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
    options: dict[str, Any] = {}
    if "patient" in sys.argv[7:]:
        options["retry"] = Retry(ExponentialBackoff(cap=0.2, base=0.01), 50)
        # (redis-py 5 retries only the errors named here: redis_clients.RETRIED_ERRORS.)
        options["retry_on_error"] = [redis.ConnectionError, redis.TimeoutError]
    elif "impatient" in sys.argv[7:]:
        options["retry"] = Retry(NoBackoff(), 0)
    client = redis.Redis(
        host="127.0.0.1", port=int(port), socket_timeout=0.5, socket_connect_timeout=0.5,
        **options,
    )
    presence = [float(o.split("=", 1)[1]) for o in sys.argv[7:] if o.startswith("presence=")]

    class Limiter(RedisColdLimiter):
        PRESENCE = presence[-1] if presence else RedisColdLimiter.PRESENCE

    lim = Limiter(client, name, int(active), int(queue), float(wait), lease=float(lease))
    grants: dict[str, Grant] = {}
    building_key = f"{name}:building"

    def acquire(attempt: str, who: str | None) -> None:
        started = time.monotonic()
        try:
            grant = lim.acquire(None, who)
        except Busy as exc:
            report(id=attempt, event=exc.reason, elapsed=time.monotonic() - started)
        except Cancelled:
            report(id=attempt, event="cancelled", elapsed=time.monotonic() - started)
        except Exception as exc:  # reported, so that the test fails with it
            report(
                id=attempt, event="error", error=repr(exc), elapsed=time.monotonic() - started
            )
        else:
            elapsed = time.monotonic() - started
            grants[attempt] = grant
            building = int(client.incr(building_key))
            token = getattr(grant, "token", None)
            report(id=attempt, event="granted", elapsed=elapsed, token=token, building=building)

    def release(attempt: str) -> None:
        grant = grants.pop(attempt)
        try:
            grant.release()
            client.decr(building_key)
        except Exception as exc:  # reported, so that the test fails with it
            report(id=attempt, event="error", error=repr(exc))
            return
        report(id=attempt, event="released", lease_lost=bool(getattr(grant, "lease_lost", 0)))

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
            attempt, _, who = attempt.partition(" ")
            threading.Thread(target=acquire, args=(attempt, who or None), daemon=True).start()
        elif command == "storm":
            n, t, seed = (int(x) for x in attempt.split())
            threading.Thread(target=storm, args=(n, t, seed), daemon=True).start()
        elif command == "release":
            release(attempt)
        elif command == "status":
            grant = grants[attempt]
            lost = bool(getattr(grant, "lease_lost", False))
            report(id=attempt, event="status", held=grant.held, lease_lost=lost)
        elif command == "time":
            report(event="time", time=time.time(), monotonic=time.monotonic())
    lim.close()


if __name__ == "__main__":
    main()
