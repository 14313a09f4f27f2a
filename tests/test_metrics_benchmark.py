"""Smoke test of ``benchmarks/metrics_overhead.py``: it runs, finishes, and reports what it
promises. Speed is never asserted here; the script compares metrics on with metrics off in the
same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "metrics_overhead.py"
CASES = {"warm_request", "refusal_request", "warm_cold_call", "refusal_cold_call"}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=100, cwd=SCRIPT.parent.parent, check=False)


@pytest.mark.timeout(120)
def test_quick_json_reports_both_modes_and_the_goals() -> None:
    proc = run("--quick", "--json", "--number", "50", "--rounds", "2", "--processes", "2")
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cpu", "cores", "python"} <= set(report["machine"])
    modes = report["modes"]
    assert set(modes) == {"one_process", "multiprocess"}
    # Each mode really ran in prometheus_client's mode of that name.
    assert modes["one_process"]["multiprocess"] is False
    assert modes["multiprocess"]["multiprocess"] is True
    for figures in modes.values():
        assert set(figures["results"]) == CASES
        for row in figures["results"].values():
            assert row["off_us"] > 0 and row["on_us"] > 0 and row["ratio"] > 0
            assert (row["rounds"], row["processes"], row["ops_per_round"]) == (2, 2, 50)
        # Behaviour, not speed: the metered app served warm hits and real queue_full
        # refusals, with both slots and every queue place held throughout.
        checks = figures["checks"]
        assert checks["hits"] > 0 and checks["rejected_full"] > 0
        assert (checks["active"], checks["queued"]) == (2, 8)
    assert len(report["goals"]) == 4
    assert all(isinstance(g["met"], bool) for g in report["goals"])
