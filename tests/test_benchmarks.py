"""Smoke tests of the benchmark scripts: they run, finish, and report what they promise.

Speed is never asserted here (that would make the suite depend on the machine); the scripts
themselves compare against baselines timed in the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
POLICIES = ["none", "pool(2)", "timed-sem", "refuse@2", "reachlimit"]
SCENARIOS = ["burst", "steady", "herd", "mixed"]


def run_script(name: str, *args: str, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=BENCHMARKS.parent,
        check=False,
    )


def run_json(name: str) -> dict[str, Any]:
    proc = run_script(name, "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cpu", "cores", "python"} <= set(report["machine"])
    return report


@pytest.mark.parametrize("name", ["micro.py", "threaded_burst.py"])
def test_help(name: str) -> None:
    proc = run_script(name, "--help", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout and "--json" in proc.stdout


@pytest.mark.timeout(120)
def test_micro_quick_json() -> None:
    report = run_json("micro.py")
    results = report["results"]
    for key in ("fast_path", "refusal_gate", "refusal_queue0"):
        row = results[key]
        assert row["limiter_ns"] > 0 and row["baseline_ns"] > 0
        assert row["ratio"] > 0
    # Behaviour, not speed: the refusals were real queue_full refusals that moved only
    # rejected_full and never read the clock, and the gate stayed full while timed.
    assert results["refusal_gate"]["check"]["ok"]
    assert results["refusal_gate"]["still_full"]
    assert results["refusal_queue0"]["check"]["ok"]
    allocations = results["allocations"]
    assert allocations["refusals"] == 50_000
    assert allocations["refusal_gate"] and allocations["refusal_queue0"]
    assert len(report["goals"]) == 5
    assert all(isinstance(g["met"], bool) for g in report["goals"])


@pytest.mark.timeout(120)
def test_threaded_burst_quick_json() -> None:
    report = run_json("threaded_burst.py")
    rows = report["results"]
    assert [(r["scenario"], r["policy"]) for r in rows] == [
        (s, p) for s in SCENARIOS for p in POLICIES
    ]
    keys = {
        "max_in_flight",
        "builds",
        "max_builds_per_key",
        "goodput_per_s",
        "goodput_pct_of_limit",
        "admitted_p50_ms",
        "admitted_p99_ms",
        "refusal_p50_ms",
        "refusal_p99_ms",
        "warm_busy_p50_ms",
        "warm_busy_p99_ms",
        "idle_warm_p99_ms",
        "warm_p99_vs_idle",
        "refused",
        "admitted",
    }
    active = report["config"]["active"]
    for r in rows:
        assert keys <= set(r), r["policy"]
        assert not r["errors"] and not r["stuck"], r
        assert r["admitted"] + r["refused"] == r["requests"]
        if r["policy"] != "none":  # every other policy bounds the builds in flight
            assert r["max_in_flight"] <= active
    herd = {r["policy"]: r for r in rows if r["scenario"] == "herd"}
    assert herd["reachlimit"]["herd_builds"] == 1
    assert herd["reachlimit"]["refused"] == 0
    assert [g["policy"] for g in report["goals"]] == POLICIES
