"""A displaced leader in the Prometheus figures: ``reachlimit_admissions_total{result=
"displaced"}``, timed in the wait histogram, and never a label per client (unbounded)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reachlimit import Busy
from reachlimit.prometheus import RESULTS, ReachMetrics
from tests.support.waiting import DEADLINE, wait_until
from tests.test_metrics import Scrape

pytestmark = pytest.mark.timeout(60)


def test_a_displaced_leader_is_counted_and_timed(threads: Any) -> None:
    metrics = ReachMetrics(active=1, queue=2, wait=30.0)
    path = metrics.path
    gate = threading.Event()
    outcomes: dict[str, str] = {}

    def lead(key: str, client: str) -> None:
        try:
            path.get(key, lambda: gate.wait(DEADLINE) and key, None, client)
            outcomes[key] = "value"
        except Busy as busy:
            outcomes[key] = busy.reason

    threads.start(lead, "building", "crawler")
    wait_until("1 building", lambda: metrics.limiter.stats().active == 1)
    for i, key in enumerate(("crawl-1", "crawl-2")):
        threads.start(lead, key, "crawler")
        wait_until(f"{key} queued", lambda i=i: metrics.limiter.stats().queued == i + 1)
    threads.start(lead, "polite", "polite")
    wait_until("crawl-2 displaced", lambda: "crawl-2" in outcomes)
    gate.set()
    threads.join_all(DEADLINE)
    assert outcomes == {
        "building": "value", "crawl-1": "value", "crawl-2": "displaced", "polite": "value"
    }
    scrape = Scrape(metrics.exposition().decode())
    assert "displaced" in RESULTS
    assert scrape.admissions("displaced") == 1
    assert scrape.admissions("granted") == 3
    assert scrape.admissions("queue_full") == 0
    # Timed like a timeout: the three grants and the displaced wait.
    assert scrape("reachlimit_wait_seconds_count") == 4
    labels = {name for (_, pairs) in scrape.values for name, _ in pairs}
    assert labels <= {"budget", "result", "le"}, labels  # no label names a client
    assert path.stats().displaced == 1
