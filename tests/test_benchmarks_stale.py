"""``benchmarks/stale.py`` runs with ``--quick --json`` and reports what it promises (never
its speed): every run of the popular keys and both fresh-hit ratios."""

from __future__ import annotations

import pytest

from tests.support.bench_scripts import run_json


@pytest.mark.gunicorn
@pytest.mark.timeout(200)
def test_stale_quick_json() -> None:
    pytest.importorskip("gunicorn")
    report = run_json("stale.py", "--duration", "1.5", timeout=180)
    rows = report["popular"]
    assert [(r["ttl_s"], r["stale_s"], r["scenario"]) for r in rows] == [
        (1.0, stale, scenario) for stale in (0.0, 60.0) for scenario in ("quiet", "crawler")
    ]
    for r in rows:
        assert r["answers"] > 0 and r["p99_ms"] is not None, r
        assert r["max_builds_at_once"] <= 2, r  # the budget holds in every run
    assert all(r["stale_share"] == 0 for r in rows if r["stale_s"] == 0)
    assert set(report["fresh_hit"]) == {"stale_300", "stale_0"}
    assert all(v["ratio"] > 0 for v in report["fresh_hit"].values())
    assert {g["goal"] for g in report["goals"]} >= {"fresh warm hit vs a route returning its dict"}
    assert all(isinstance(g["met"], bool) for g in report["goals"])
