"""Smoke tests of the benchmark scripts: they run, finish, and report what they promise.

Speed is never asserted here (that would make the suite depend on the machine); the scripts
themselves compare against baselines timed in the same run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.bench_scripts import run_json, run_script

POLICIES = ["none", "pool2", "timed-sem", "refuse2", "reachlimit"]
SCENARIOS = ["burst", "steady", "herd", "mixed"]


def require_gunicorn_and_redis() -> None:
    """Skip (fail under CI, for redis-server) the test of a script that starts gunicorn
    servers on a Redis when any of them is missing."""
    pytest.importorskip("gunicorn")
    pytest.importorskip("redis")
    from tests.support.redis_server import require_redis_server

    require_redis_server()


@pytest.mark.parametrize(
    "name",
    ["micro.py", "flask_cached.py", "metrics_overhead.py", "redis_micro.py", "redis_warm.py",
     "redis_handoff.py", "threaded_burst.py", "reach_cold.py", "http_load.py", "http_redis.py",
     "fair_admission.py", "deadline.py", "stale.py", "redis_recovery.py", "soak.py",
     "compare.py", "figures.py", "plots.py"],
)
def test_help(name: str) -> None:
    """Every script says what it does and what each of its options is for."""
    proc = run_script(name, "--help", timeout=30)
    assert proc.returncode == 0, proc.stderr
    usage, _, rest = proc.stdout.partition("\n\n")
    description, _, options = rest.partition("\n\n")
    assert description.strip() and not description.startswith("options:"), proc.stdout
    if name not in ("compare.py", "figures.py", "plots.py"):
        assert "--quick" in options and "--json" in options and "--output" in options
    # An option without help: a line that names it, nothing after it there or below it.
    lines = options.splitlines()
    bare = [line for line, below in zip(lines, [*lines[1:], ""], strict=True)
            if line.strip().startswith("-") and "  " not in line.strip()
            and not below.startswith(" " * 20)]
    assert not bare, bare


PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_micro_quick_json(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    figure = tmp_path / "micro.png"
    report = run_json("micro.py", "--plot", str(figure))
    # --plot drew the report, and stamped it with the date it was drawn on.
    assert figure.read_bytes().startswith(PNG)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", report["date"])
    results = report["results"]
    for key in ("fast_path", "refusal_gate", "refusal_queue0", "flask_refusal"):
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
    # The Flask pair timed real refusals: every timed request was counted as queue_full.
    flask = results["flask_refusal"]
    assert flask["builds"] == 0
    assert flask["refusals_counted"] >= flask["rounds"] * flask["ops_per_round"]
    assert len(report["goals"]) == 6
    assert all(isinstance(g["met"], bool) for g in report["goals"])
    assert set(report["figures"]) == {f"{k} ratio" for k in PAIRS}


#: micro.py's pairs.
PAIRS = ("fast_path", "fast_path_with", "refusal_gate", "refusal_queue0", "flask_refusal")


@pytest.mark.timeout(120)
def test_a_paired_result_is_a_pyperf_suite_that_compare_reads(tmp_path: Path) -> None:
    """Two workers' rounds of every pair, kept in pyperf's format with what the run was (the
    commit, the version, the load at the start and at the end); compare.py sets two results
    side by side with pyperf's verdict: the same result against itself is no change, one
    whose every round is 10 higher a significant one."""
    pyperf = pytest.importorskip("pyperf")
    before = tmp_path / "before.json"
    proc = run_script("micro.py", "--quick", "--processes", "2", "--rounds", "6", "--output",
                      str(before), timeout=100)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(before.read_text())
    assert report["reachlimit_version"] and report["commit"] and isinstance(report["dirty"], bool)
    assert len(report["machine"]["loadavg"]) == len(report["machine"]["loadavg_end"]) == 3
    suite = pyperf.BenchmarkSuite.load(str(before))
    for key in PAIRS:
        row = report["results"][key]
        assert (row["rounds"], row["processes"]) == (6, 2)
        ratios = suite.get_benchmark(key).get_values()
        assert len(ratios) == 6 and sorted(ratios)[2:4] and row["ratio_spread"] == [
            min(ratios), max(ratios)]
        for side in ("baseline", "limiter"):
            assert len(suite.get_benchmark(f"{key}.{side}").get_runs()) == 2
    higher = json.loads(before.read_text())
    for bench in higher["benchmarks"]:
        for run in bench["runs"]:
            run["values"] = [v + 10 for v in run.get("values", [])]
    after = tmp_path / "after.json"
    after.write_text(json.dumps(higher))
    same = run_script("compare.py", str(before), str(before), timeout=60)
    twice = run_script("compare.py", str(before), str(after), timeout=60)
    assert same.returncode == twice.returncode == 0, same.stderr + twice.stderr
    for key in PAIRS:
        [line] = [x for x in same.stdout.splitlines() if x.startswith(f"{key} ")]
        assert line.endswith("+0.0%  no"), line
        [line] = [x for x in twice.stdout.splitlines() if x.startswith(f"{key} ")]
        assert line.endswith("  yes"), line



@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["micro", "http_load", "fair_admission"])
def test_plots_draws_the_kept_results_again(kind: str, tmp_path: Path) -> None:
    """The figures of docs/benchmarks.md are drawn again from the results kept in
    benchmarks/results/, as the page says; a result missing a field the figure needs fails
    here."""
    pytest.importorskip("matplotlib")
    figure = tmp_path / f"{kind}.png"
    saved = ROOT / "benchmarks" / "results" / f"{kind}.json"
    proc = run_script("plots.py", kind, str(saved), str(figure), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert figure.read_bytes().startswith(PNG)
    for drawn in (kind, "ratios"):
        assert (ROOT / "docs" / "_static" / "bench" / f"{drawn}.png").read_bytes().startswith(PNG)


def test_the_pages_figures_are_the_kept_results() -> None:
    """benchmarks/README.md and docs/benchmarks.md show the figures of the results kept in
    benchmarks/results/, as benchmarks/figures.py makes them: a figure typed by hand, or a
    result changed without running it, fails here."""
    proc = run_script("figures.py", "--check", timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(120)
def test_flask_cached_quick_json() -> None:
    report = run_json("flask_cached.py", "--number", "50", "--rounds", "4", "--processes", "2")
    results = report["results"]
    config = report["config"]
    timed = config["rounds"] * config["number"]
    for key in ("warm_hit", "refusal", "refusal_vs_cold"):
        row = results[key]
        assert row["limiter_ns"] > 0 and row["baseline_ns"] > 0 and row["ratio"] > 0
        assert (row["rounds"], row["ops_per_round"]) == (config["rounds"], config["number"])
    # Behaviour, not speed: the warm pair never built (the two warm-ups of each process only)
    # and every timed request of it was a hit; every timed refusal was a counted queue_full.
    assert results["warm_hit"]["builds"] == 2 * config["processes"]
    assert results["warm_hit"]["hits_counted"] >= 2 * timed
    assert results["refusal"]["refusals_counted"] >= timed
    assert [g["goal"].split(" through")[0] for g in report["goals"]] == ["warm hit", "refusal"]
    assert all(isinstance(g["met"], bool) and g["value"] > 0 for g in report["goals"])
    text = run_script("flask_cached.py", "--quick", timeout=60).stdout
    assert "(goal <= 1.05x)" in text and "(goal <= 1.2x)" in text

@pytest.mark.timeout(120)
def test_threaded_burst_quick_json(tmp_path: Path) -> None:
    result = tmp_path / "threaded_burst.json"
    report = run_json("threaded_burst.py", "--output", str(result))
    assert json.loads(result.read_text()) == report  # --output writes what --json prints
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
    # compare.py sets two load results' headline figures side by side (no test: one value each).
    proc = run_script("compare.py", str(result), str(result), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "figures (one value each: no test)" in proc.stdout
    assert "reachlimit burst: most builds at once" in proc.stdout


# -- benchmarks/http_load.py: gunicorn on 127.0.0.1, one server per policy --------------------

HTTP_POLICIES = ["none", "pool2", "timed-sem", "refuse2", "flask-limiter", "reachlimit"]
HTTP_SCENARIOS = ["arrival", "burst", "steady", "herd"]
#: What http_load judges each policy by.
HTTP_GOALS = {"in_flight_within_limit", "refusal_p99_le_100ms", "warm_p99_within_3x_idle",
              "no_5xx_or_errors"}  # fmt: skip


@pytest.mark.gunicorn
@pytest.mark.timeout(240)
def test_http_load_quick_json() -> None:
    pytest.importorskip("gunicorn")
    # The script's own bounds (startup deadline, client timeouts, joins) end it well inside
    # this; the subprocess timeout only guards against a hang.
    proc = run_script("http_load.py", "--quick", "--json", timeout=200)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cpu", "cores", "python", "gunicorn"} <= set(report["machine"])

    # Every policy is reported, except flask-limiter when Flask-Limiter is not installed:
    # then it is skipped with a note saying so.
    expected = list(HTTP_POLICIES)
    if "flask-limiter" in report["skipped"]:
        assert "Flask-Limiter" in report["skipped"]["flask-limiter"]
        assert "flask-limiter skipped" in proc.stderr
        expected.remove("flask-limiter")
    assert report["config"]["policies"] == expected
    assert [g["policy"] for g in report["goals"]] == expected
    assert [i["policy"] for i in report["idle"]] == expected
    rows = report["results"]
    assert [(r["policy"], r["scenario"]) for r in rows] == [
        (p, s) for p in expected for s in HTTP_SCENARIOS
    ]
    for r in rows:
        assert sum(r["status"].values()) <= r["requests"], r  # a stuck request has none
        for key in ("max_in_flight", "admitted_p50_ms", "refused_p99_ms", "warm_p99_ms"):
            assert key in r
    for g in report["goals"]:
        assert set(g["met"]) == HTTP_GOALS

    # Behaviour, not speed: reachlimit never answers 5xx, never drops a connection, never
    # runs more than `active` builds, and its refusals are all queue_full or timeout.
    active = report["config"]["active"]
    for r in rows:
        if r["policy"] != "reachlimit":
            continue
        assert r["status"]["5xx"] == 0 and r["status"]["error"] == 0, r
        assert r["warm_status"]["5xx"] == 0 and r["warm_status"]["error"] == 0, r
        assert not r["errors"] and not r["stuck"], r
        assert sum(r["status"].values()) == r["requests"], r
        assert r["max_in_flight"] <= active, r
        # Every 429 traces to a refusal of the limiter (a refused leader's followers share
        # its 429, so there can be more 429s than refusals, never a 429 without one).
        reasons = r["reach_reasons"]
        refusals = reasons["rejected_full"] + reasons["rejected_timeout"]
        assert refusals <= r["status"]["429"], r
        assert (refusals == 0) == (r["status"]["429"] == 0), r
    goal = next(g for g in report["goals"] if g["policy"] == "reachlimit")
    assert goal["met"]["no_5xx_or_errors"] and goal["met"]["in_flight_within_limit"]


@pytest.mark.timeout(120)
def test_reach_cold_quick_json() -> None:
    report = run_json("reach_cold.py")
    [database] = report["databases"]
    assert database["database"]["observations"] == 50_000
    assert database["database"]["sample"] == 5
    assert set(database["windows"]) == {"1", "7", "30"}
    for window in database["windows"].values():
        assert window["median_s"] > 0 and window["baseline_s"] > 0
    request = database["request_7d"]
    assert request["cold_p50_s"] > 0 and request["warm_p50_s"] > 0


# -- benchmarks/http_redis.py: several gunicorn servers x workers on one Redis ---------------

REDIS_VARIANTS = ["process", "redis", "flask-limiter"]
#: What http_redis judges each variant by.
REDIS_GOALS = {"in_flight_within_budget", "goodput_ge_90pct", "warm_p99_le_3x_idle",
               "sustained_warm_p99_le_3x_idle", "no_5xx_or_errors"}  # fmt: skip


@pytest.mark.redis
@pytest.mark.gunicorn
@pytest.mark.timeout(240)
def test_http_redis_quick_json() -> None:
    require_gunicorn_and_redis()
    # Tiny settings; the script's own bounds end it well inside the subprocess timeout.
    proc = run_script(
        "http_redis.py", "--quick", "--json", "--clients", "6", "--burst-s", "0.5",
        "--idle-s", "0.2", timeout=200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cores", "loadavg", "gunicorn", "redis_server"} <= set(report["machine"])
    config = report["config"]
    assert (config["servers"], config["workers"], config["rounds"]) == (2, 2, 1)

    expected = list(REDIS_VARIANTS)
    if "flask-limiter" in report["skipped"]:  # Flask-Limiter not installed: said so
        assert "Flask-Limiter" in report["skipped"]["flask-limiter"]
        expected.remove("flask-limiter")
    assert config["variants"] == expected
    rows = report["results"]
    assert sorted(r["variant"] for r in rows) == sorted(expected)
    assert [s["variant"] for s in report["summary"]] == expected
    for s in report["summary"]:
        assert set(s["met"]) == REDIS_GOALS
        assert all(isinstance(v, bool) for v in s["met"].values())

    active = config["active"]
    for r in rows:
        for key in ("goodput_pct", "refused_p99_ms", "warm_p99_ms", "idle_p99_ms", "warm_x_idle",
                    "sustained_x_idle", "redis_ping_p99_ms"):
            assert key in r, (key, r["variant"])
        # Behaviour, not speed: every request answered, nothing stuck, no traceback, no 5xx.
        assert sum(r["cold_status"].values()) == r["cold_requests"] > 0, r
        assert not r["stuck"] and not r["server_tracebacks"] and not r["cold_errors"], r
        for f in ("cold_status", "warm_status", "idle_status"):
            assert r[f]["5xx"] == r[f]["error"] == r[f]["other"] == 0, (f, r)
        # Every key of the burst is new, so each 200 is exactly one build, counted in Redis.
        assert r["builds_started"] == r["builds_finished"] == r["cold_status"]["200"], r
        assert r["max_in_flight"] >= 1, r
        if r["variant"] == "process":  # a budget per worker
            assert r["max_in_flight"] <= config["servers"] * config["workers"] * active, r
    redis_row = next(r for r in rows if r["variant"] == "redis")
    assert redis_row["redis_path"] == "extension"
    # One budget for the service: never more than `active` builds in all processes together,
    # and every 429 is one refusal of the shared limiter (no follower shares a new key).
    assert redis_row["max_in_flight"] <= active
    limiter = redis_row["limiter"]
    assert limiter["peak_active"] <= active
    assert limiter["rejected_full"] + limiter["rejected_timeout"] == (
        redis_row["cold_status"]["429"]
    )


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_redis_warm_prints_its_ratio() -> None:
    from tests.support.redis_server import require_redis_server

    require_redis_server()
    proc = run_script("redis_warm.py", "--number", "500", "--rounds", "3")
    assert proc.returncode == 0, proc.stderr
    assert "median ratio" in proc.stdout and "goal <= 1.2x" in proc.stdout
    proc = run_script("redis_warm.py", "--number", "500", "--rounds", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["results"]["warm_hit"]
    assert row["ratio"] > 0 and row["builds"] == 0 and isinstance(row["met"], bool)
    assert (row["rounds"], row["ops_per_round"]) == (3, 500)


# -- benchmarks/fair_admission.py: a crawler against polite clients, told apart by address -----

FAIR_SETUPS = ["single", "shared"]
FAIR_VARIANTS = ["none", "remote_addr"]


@pytest.mark.redis
@pytest.mark.gunicorn
@pytest.mark.timeout(240)
def test_fair_admission_quick_json() -> None:
    require_gunicorn_and_redis()
    # A shorter measured phase than --quick's; the script's own bounds end it well inside the
    # subprocess timeout.
    proc = run_script("fair_admission.py", "--quick", "--json", "--duration", "2", timeout=200)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    assert {"platform", "cpu", "cores", "python", "gunicorn", "redis_server"} <= set(
        report["machine"]
    )
    config = report["config"]
    assert (config["setups"], config["variants"]) == (FAIR_SETUPS, FAIR_VARIANTS)
    assert (config["active"], config["queue"]) == (2, 8)
    rows = report["results"]
    assert [(r["setup"], r["variant"]) for r in rows] == [
        (s, v) for s in FAIR_SETUPS for v in FAIR_VARIANTS
    ]
    for r in rows:
        for key in ("polite_first_try_pct", "polite_p50_ms", "polite_p99_ms", "crawler_share_pct",
                    "goodput_pct", "max_in_flight", "polite_refusals", "crawler_refusals",
                    "limiter", "met"):
            assert key in r, (key, r["setup"], r["variant"])
        # Behaviour, not speed: each server ran the variant asked for, saw every client at its
        # own source address, answered every request with a 200 or a 429 and never a traceback.
        assert r["client_setting_seen"] == [r["variant"]], r
        assert r["peer_mismatches"] == 0 and not r["stuck"] and not r["server_tracebacks"], r
        assert not r["errors"], r
        for f in ("polite_status", "crawler_status"):
            assert r[f]["5xx"] == r[f]["other"] == r[f]["error"] == 0, (f, r)
        assert r["polite_requests"] > 0 and r["crawler_requests"] > 0, r
        # Every key is new: each 200 is one build, counted by the app; never more than
        # `active` at once, in all processes together.
        assert r["builds_started"] == r["answers_200"], r
        assert 1 <= r["max_in_flight"] <= config["active"], r
        limiter = r["limiter"]
        assert limiter["peak_active"] <= config["active"], r
        # Every 429 is one refusal of the limiter, with its reason on the answer.
        refused = r["polite_status"]["429"] + r["crawler_status"]["429"]
        # (A crawler's waiter that newer polite clients' put behind its deadline is refused
        # then: "deadline".)
        assert (limiter["rejected_full"] + limiter["rejected_timeout"] + limiter["displaced"]
                + limiter["deadline"]) == refused, r
        assert r["polite_refusals"]["unknown"] == r["crawler_refusals"]["unknown"] == 0, r
        if r["variant"] == "none":  # one client: plain FIFO, nobody is ever displaced
            assert limiter["displaced"] == 0, r
        assert all(isinstance(v, bool) for v in r["met"].values()), r


# -- benchmarks/deadline.py: no wasted waits, REACHLIMIT_DEADLINE off against on ------------


@pytest.mark.gunicorn
@pytest.mark.timeout(300)
def test_deadline_quick_json() -> None:
    pytest.importorskip("gunicorn")
    # Two build lengths and a shorter measured phase than --quick's; the script's own bounds
    # end it well inside the subprocess timeout.
    report = run_json("deadline.py", "--builds", "0.1,1", "--duration", "2", timeout=280)
    assert "loadavg" in report["machine"] and "loadavg_end" in report["machine"]
    config = report["config"]
    assert (config["builds"], config["setups"], config["rounds"]) == ([0.1, 1.0], ["single"], 1)
    assert (config["active"], config["queue"]) == (2, 8)
    rows = report["results"]
    assert [(r["setup"], r["build_s"], r["variant"]) for r in rows] == [
        ("single", b, v) for b in (0.1, 1.0) for v in ("off", "on")
    ]
    for r in rows:
        for key in ("whole_waits", "refused_at_once", "refusal_p50_ms", "refusal_p99_ms",
                    "wait_thread_s", "waiting_threads", "goodput_per_s", "goodput_pct",
                    "refusals", "limiter", "estimate_s"):
            assert key in r, (key, r["build_s"], r["variant"])
        # Behaviour, not speed: each server ran the variant asked for, answered every request
        # with a 200 or a 429, never a traceback, never more than `active` builds at once.
        assert r["deadline_seen"] == [r["variant"] == "on"], r
        assert not r["stuck"] and not r["server_tracebacks"] and not r["errors"], r
        assert r["status"]["other"] == r["status"]["error"] == 0, r
        assert r["requests"] > 0 and r["answers_total"] >= r["requests"], r
        assert 1 <= r["max_in_flight"] <= config["active"], r
        # Every key is new: each 200 is one build; every 429 is one refusal of the limiter,
        # with its reason on the answer.
        assert r["builds_started"] == r["answered_200_total"], r
        limiter = r["limiter"]
        assert limiter["peak_active"] <= config["active"], r
        assert (limiter["rejected_full"] + limiter["rejected_timeout"] + limiter["deadline"]
                + limiter["displaced"]) == r["refused_total"], r
        assert r["refusals"]["unknown"] == 0, r
        if r["variant"] == "off":  # never a deadline refusal, and no estimate made
            assert limiter["deadline"] == 0 and r["refusals"]["deadline"] == 0, r
            assert r["estimate_s"] == [None], r
    summary = report["summary"]
    assert [(s["setup"], s["build_s"]) for s in summary] == [("single", 0.1), ("single", 1.0)]
    for s in summary:
        assert len(s["whole_waits"]) == len(s["goodput_per_s"]) == 2
        assert all(isinstance(v, bool) for v in s["met"].values()), s
    bursts = report["burst"]
    assert [b["deadline"] for b in bursts] == [False, True]
    for b in bursts:
        refused = sum(b["refusals"].values())
        assert b["admitted"] >= 1 and b["admitted"] + refused == 9, b
    assert "deadline" not in bursts[0]["refusals"] and bursts[0]["estimate_s"] is None
    assert isinstance(report["all_met"], bool)
