"""Fair admission for a whole service: 2 REAL gunicorn servers x 2 workers on one Redis, the
clients told apart by their real source addresses (``REACHLIMIT_CLIENT`` left at its default,
``remote_addr``).

A crawler (127.0.0.2) sends 12 distinct cold requests at once over both servers: 2 build, 8
wait in Redis, 2 are refused at once. Two polite clients (127.0.0.3, 127.0.0.4) then ask once
each, on the server the crawler's waiters are not necessarily on: each displaces the crawler's
newest waiter (answered 429 with Retry-After in whichever worker it waited) and is built in
its turn. Builds wait for the test's gate file (``tests/apps/file_gate_app.py``), so every
count is a state, never a duration.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.apps.file_gate_app import running_counts
from tests.support.clients import Herd, http_request
from tests.support.gunicorn_server import serving
from tests.support.waiting import wait_until
from tests.test_redis_gunicorn import (  # noqa: F401 (the fixtures)
    Watch,
    answered,
    gate,
    gate_server,
    redis_url,
    watch,
)

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

CRAWLER, POLITE, SECOND = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def test_a_crawler_filling_the_shared_queue_does_not_keep_polite_clients_out(
    tmp_path: Path, gate: Path, redis_url: str, watch: Watch  # noqa: F811
) -> None:
    a = gate_server(tmp_path, "a", gate, redis_url)
    b = gate_server(tmp_path, "b", gate, redis_url)
    with serving(a), serving(b):
        paths = [f"/report/crawl-{n}" for n in range(12)]
        crawl = [Herd(a.port, paths[0::2], CRAWLER), Herd(b.port, paths[1::2], CRAWLER)]
        wait_until("2 refused at once", lambda: len(answered(crawl)) >= 2)
        wait_until("2 building, 8 waiting", lambda: (watch.stats().active, watch.stats().queued)
                   == (2, 8))
        refused = answered(crawl)
        assert [r.status for r in refused] == [429, 429]

        polite = Herd(b.port, ["/report/polite-1"], POLITE)
        wait_until("a crawler's waiter displaced", lambda: watch.stats().displaced == 1)
        second = Herd(a.port, ["/report/second-1"], SECOND)
        wait_until("another displaced", lambda: watch.stats().displaced == 2)
        wait_until("4 crawler refusals", lambda: len(answered(crawl)) >= 4)
        for reply in answered(crawl):
            assert reply.status == 429 and int(reply.headers["retry-after"]) >= 1
        stats = watch.stats()
        assert (stats.active, stats.queued, stats.rejected_full, stats.displaced) == (2, 8, 2, 2)

        (gate / "open").touch()
        polite_reply, = polite.results()
        second_reply, = second.results()
        assert (polite_reply.status, second_reply.status) == (200, 200)
        crawler = Counter(r.status for h in crawl for r in h.results())
        assert crawler == {200: 8, 429: 4}, crawler  # served too: fairness, not a ban
        counts = running_counts(gate)
        assert len(counts) == 10 and max(counts) <= 2, counts  # never 3 builds at once
        assert watch.stats().active == 0
        # The crawler, alone again, gets the whole queue: as before fair admission.
        again = http_request(a.port, "GET", "/report/crawl-0", source=CRAWLER)
        assert again.status == 200  # warm now, from the shared cache
