"""One process using a RedisColdLimiter, driven by tests/test_redis_processes.py.

    python tests/redis_worker.py PORT NAME ACTIVE QUEUE WAIT LEASE

Reads commands on stdin, one a line, and reports on stdout, one JSON object a line:

    acquire ID   -> {"id": ID, "event": "granted" | "queue_full" | "timeout" | "cancelled"
                     | "error", ...} once the acquire (run in its own thread) returns
    release ID   -> {"id": ID, "event": "released"}
    (end of input) -> the process closes its limiter and exits

It first reports {"event": "ready", "pid": PID}. Every grant is held until the test releases it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import redis

from reachlimit import Busy, Cancelled, Grant
from reachlimit.redis import RedisColdLimiter

_out = threading.Lock()


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

    report(event="ready", pid=os.getpid())
    for line in sys.stdin:
        command, _, attempt = line.strip().partition(" ")
        if command == "acquire":
            threading.Thread(target=acquire, args=(attempt,), daemon=True).start()
        elif command == "release":
            grants.pop(attempt).release()
            report(id=attempt, event="released")
    lim.close()


if __name__ == "__main__":
    main()
