"""A stale report on 2 REAL gunicorn servers x 2 workers on one Redis: every worker answers it
stale at once, and it is refreshed once in the whole service.

design: the servers of ``tests/test_redis_gunicorn.py`` (the shipped gunicorn config serving
``tests/apps/file_gate_app.py``, whose builds wait for a gate file and log each start), with a
2 s TTL and a 60 s stale window. The test closes the gate once the report is stored, waits for
the entry to turn stale in Redis (the one wait on time: an entry in Redis goes stale only with
time; awaited on Redis's own clock, the entry's ``PTTL`` at or below the stale window, since
Redis starts the TTL when the build's set arrives, not when the test sent its request), then
asks every worker for it: each answers the stale copy at once and asks its refresher for a refresh;
the refreshes meet in the shared singleflight, so one build runs (read back from the gate
directory) while the gate is closed, and the log then holds exactly two builds: the first and
the one refresh. Opened, the report is fresh again everywhere.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from reachlimit.redis import RedisCache
from tests.apps.file_gate_app import build_pids, running_counts
from tests.support.gunicorn_server import serving
from tests.support.waiting import wait_until
from tests.test_redis_gunicorn import (  # noqa: F401  (the fixtures)
    PREFIX,
    gate,
    gate_server,
    redis_url,
)

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

TTL = 2.0
STALE = 60.0
STALE_ENV = {"REACHLIMIT_CACHE_TTL": str(TTL), "REACHLIMIT_STALE": str(int(STALE))}


def wait_stale_in_redis(url: str, key: str) -> None:
    """Wait until the shared cache's entry of ``key`` is stale: Redis's ``PTTL`` of it at or
    below the stale window (an entry lives TTL + stale window in Redis and is fresh while its
    PTTL is above the window; every worker's first level holds it fresh for no longer). The
    entry is found by the cache's own ``key_of`` (the extension's shared cache is named
    "cold", as its limiter is); making the ``RedisCache`` sends nothing to Redis."""
    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        entry = RedisCache(client, "cold", prefix=PREFIX).key_of(key)
        window_ms = STALE * 1000

        def stale() -> bool:
            left_ms = int(client.pttl(entry))
            assert left_ms != -2, f"the entry {entry} is gone from Redis"
            return 0 <= left_ms <= window_ms

        wait_until(f"the entry of {key!r} to turn stale in Redis", stale, interval=0.01)
    finally:
        client.close()


def test_a_stale_key_is_refreshed_once_in_every_process(
    tmp_path: Path, gate: Path, redis_url: str,  # noqa: F811  (the imported fixtures)
) -> None:
    a = gate_server(tmp_path, "a", gate, redis_url, env=STALE_ENV)
    b = gate_server(tmp_path, "b", gate, redis_url, env=STALE_ENV)
    with serving(a), serving(b):
        workers = {str(pid) for pid in a.worker_pids() + b.worker_pids()}
        assert len(workers) == 4
        (gate / "open").touch()
        first = a.get("/report/popular")
        assert first.status == 200
        assert first.headers["cache-status"] == "reachlimit; fwd=uri-miss; stored"
        (gate / "open").unlink()  # refreshes from now on wait at the gate
        wait_stale_in_redis(redis_url, "popular")

        stale_by: Counter[str] = Counter()
        for _ in range(400):  # until every worker of both servers has answered it stale
            for server in (a, b):
                reply = server.get("/report/popular")
                assert reply.status == 200 and reply.body == first.body, reply
                assert reply.headers["cache-status"].startswith("reachlimit; hit; ttl=-")
                stale_by[reply.headers["x-worker-pid"]] += 1
            if set(stale_by) == workers:
                break
        assert set(stale_by) == workers, stale_by
        wait_until("the one refresh building", lambda: len(build_pids(gate)) == 1)
        assert len(running_counts(gate)) == 2  # the first build and one refresh, no more

        (gate / "open").touch()

        def fresh_everywhere() -> bool:
            seen: set[str] = set()
            for _ in range(40):
                for server in (a, b):
                    reply = server.get("/report/popular")
                    if reply.status != 200 or "ttl=-" in reply.headers["cache-status"]:
                        return False
                    seen.add(reply.headers["x-worker-pid"])
            return seen == workers

        wait_until("the refreshed report in every worker", fresh_everywhere)
        # Fresh again, a report may be refreshed early (its last build waited at the gate, so
        # it counts as slow); whatever ran since, each build ran alone.
        assert max(running_counts(gate)) == 1
