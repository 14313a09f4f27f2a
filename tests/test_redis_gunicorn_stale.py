"""A stale report on 2 REAL gunicorn servers x 2 workers on one Redis: every worker answers it
stale at once, and it is refreshed once in the whole service.

design: the servers of ``tests/test_redis_gunicorn.py`` (the shipped gunicorn config serving
``tests/apps/file_gate_app.py``, whose builds wait for a gate file and log each start), with a
2 s TTL and a 60 s stale window. The test closes the gate once the report is stored, waits for
the TTL to end (the one wait on time: an entry in Redis goes stale only with time), then asks
every worker for it: each answers the stale copy at once and asks its refresher for a refresh;
the refreshes meet in the shared singleflight, so one build runs (read back from the gate
directory) while the gate is closed, and the log then holds exactly two builds: the first and
the one refresh. Opened, the report is fresh again everywhere.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.apps.file_gate_app import build_pids, running_counts
from tests.support.gunicorn_server import serving
from tests.support.waiting import wait_until
from tests.test_redis_gunicorn import gate, gate_server, redis_url  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

TTL = 2.0
STALE_ENV = {"REACHLIMIT_CACHE_TTL": str(TTL), "REACHLIMIT_STALE": "60"}


def test_a_stale_key_is_refreshed_once_in_every_process(
    tmp_path: Path, gate: Path, redis_url: str,  # noqa: F811  (the imported fixtures)
) -> None:
    a = gate_server(tmp_path, "a", gate, redis_url, env=STALE_ENV)
    b = gate_server(tmp_path, "b", gate, redis_url, env=STALE_ENV)
    with serving(a), serving(b):
        workers = {str(pid) for pid in a.worker_pids() + b.worker_pids()}
        assert len(workers) == 4
        (gate / "open").touch()
        stored_at = time.monotonic()
        first = a.get("/report/popular")
        assert first.status == 200
        assert first.headers["cache-status"] == "reachlimit; fwd=uri-miss; stored"
        (gate / "open").unlink()  # refreshes from now on wait at the gate
        wait_until("the TTL to end", lambda: time.monotonic() > stored_at + TTL + 0.05,
                   interval=0.01)

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
