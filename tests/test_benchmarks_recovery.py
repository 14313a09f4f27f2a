"""``benchmarks/redis_recovery.py`` runs with ``--quick`` and reports what it promises (never
how fast, nor how many builds ran at once: that is the figure it measures): one round of each
kind of outage, every window's peak, when every worker said Redis is back, the statuses, the
bound, and the machine with its load at the start and at the end; as JSON (``--output``) and
as the text report it prints, its goal last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench_scripts import run_script

#: A round's figures, and the windows summed up over the rounds.
WINDOWS = {"before", "during", "after_1s", "after_back_1s", "after_back_2nd_s", "back_ms"}


def test_redis_recovery_help() -> None:
    proc = run_script("redis_recovery.py", "--help", timeout=30)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--quick", "--json", "--rounds", "--outage"):
        assert flag in proc.stdout


def test_redis_recovery_refuses_an_unbounded_load() -> None:
    proc = run_script("redis_recovery.py", "--clients", "1000", timeout=30)
    assert proc.returncode == 2 and "--clients is at most 64" in proc.stderr


@pytest.mark.redis
@pytest.mark.gunicorn
@pytest.mark.timeout(200)
def test_redis_recovery_quick_report(tmp_path: Path) -> None:
    pytest.importorskip("gunicorn")
    from tests.support.redis_server import require_redis_server

    require_redis_server()
    output = tmp_path / "recovery.json"
    proc = run_script("redis_recovery.py", "--quick", "--clients", "8", "--outage-s", "0.5",
                      "--output", str(output), timeout=180)
    assert proc.returncode == 0, proc.stderr
    # The text report ends on its goal (met or not: a loaded machine may drop a request)
    # and the total time.
    text = proc.stdout.splitlines()
    assert text[-3] == "goals:", proc.stdout
    assert text[-2].endswith("no 5xx and no transport error: 0 (goal 0)") or "MISSED" in text[-2]
    assert text[-1].startswith("total time ")
    report = json.loads(output.read_text())
    assert {"platform", "cpu", "cores", "python"} <= set(report["machine"])
    assert {"loadavg", "loadavg_end", "gunicorn", "redis_server"} <= set(report["machine"])
    assert len(report["machine"]["loadavg_end"]) == 3
    config = report["config"]
    assert (config["servers"], config["workers"], config["rounds"]) == (2, 2, 1)
    assert config["outages"] == ["kill", "pause"]
    assert config["bound"] == config["active"] * (1 + 2 * 2)
    rounds = report["rounds"]
    assert [r["outage"] for r in rounds] == ["kill", "pause"]
    for r in rounds:
        assert WINDOWS | {"outage", "noticed_by", "statuses"} == set(r), r
        assert 0 <= r["noticed_by"] <= 4, r  # a short pause may end before any timeout
        assert r["back_ms"] >= 0 and sum(r["statuses"].values()) > 0, r
        assert all(isinstance(r[w], int) for w in WINDOWS - {"back_ms"}), r
    assert set(report["summary"]) == {"kill", "pause"}
    for figures in report["summary"].values():
        assert set(figures) == WINDOWS
        assert all(f["min"] <= f["median"] <= f["max"] for f in figures.values())
    [goal] = report["goals"]
    assert goal["goal"] == "no 5xx and no transport error" and isinstance(goal["met"], bool)
    assert goal["value"] == sum(goal["errors"].values()) + goal["stuck_clients"]
    assert goal["met"] == (goal["value"] == 0)
    assert report["elapsed_s"] > 0
