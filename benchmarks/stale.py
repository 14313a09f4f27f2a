#!/usr/bin/env python3
"""Stale-while-revalidate: popular reports across their TTL under gunicorn, and what a fresh
warm hit costs against a route returning its dict.

    python benchmarks/stale.py            # about 2 minutes
    python benchmarks/stale.py --quick    # about 40 s, rough figures

(a) popular  one gunicorn server (``_load.Server``: ``benchmarks/app.py``, ``-k gthread``, 1
    worker, 24 threads) with the extension's default limits and builds of ``--build-ms``
    (300) stamped with when they were built. For each TTL of ``--ttls`` (1, 2 s) and each
    ``REACHLIMIT_STALE`` of 0 (the baseline: every entry expires) and ``--stale`` (60 s), on
    a fresh server:

      quiet    ``--keys`` (6) readers (``_load.Clients``, from 127.0.0.20), each asking for
               its own popular key, pausing ``--poll-ms`` (20 ms) after each answer, for
               ``--duration`` s (10; quick 4)
      crawler  the same readers while ``--crawlers`` (12) clients from 127.0.0.2 (another
               client to fair admission) ask for distinct cold keys back to back, keeping both
               slots busy and the queue full

    Figures per run: the readers' p50/p99 (client side) against the idle warm p50 (the quiet
    run's p50 of answers that were fresh hits, same TTL and stale); the share of readers'
    answers that were 200 and that were stale; builds per popular key per TTL (the app's own
    count); the oldest data served (the largest age of an answer, in TTLs); the crawler's
    statuses. Goals, with stale on: p99 <= 3x the idle warm p50 (quiet); builds per key per
    TTL <= 2; under the crawler >= 99 % of popular answers 200 and the oldest data a few TTLs
    (< 5), never the whole stale window.

(b) fresh hit  a whole WSGI request in one process (``app(environ, start_response)``, no
    socket): a warm hit through ``rl.cold()`` with ``REACHLIMIT_STALE=300`` against a route of
    the same app returning its cached dict (``jsonify`` of a dict looked up in a plain dict),
    timed by ``_paired.py`` (alternating rounds in worker processes, the median of the
    rounds' ratios). Goal: <= 1.2x (the early-refresh draw is made only near the TTL's end,
    so a fresh hit pays for the stale window almost nothing). The same with
    ``REACHLIMIT_STALE=0`` beside it.

Every server is stopped by PID.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _load
import _paired
import _report
from _load import CRAWLER_ADDR, READER_ADDR, Answer, Server
from _paired import Pair, Spec, Worker, wsgi_caller, wsgi_side
from _report import fmt, ms, pct

SPEC = Spec("stale", sides=("plain", "cold"), unit="us", rounds=11, quick_rounds=5)


# -- (a) popular keys over HTTP ---------------------------------------------------------------


def run_phase(server: Server, cfg: dict[str, Any], crawl: bool) -> dict[str, Any]:
    port, timeout = server.port, 10.0
    keys = [f"popular-{i}-{uuid.uuid4().hex[:6]}" for i in range(cfg["keys"])]
    for key in keys:  # warm each popular key once before the clock starts
        _load.get(port, f"/report?key={key}", "reader", timeout, READER_ADDR)
    before = {key: server.stats(key)["builds"]["key_builds"] for key in keys}
    readers: list[Answer] = []
    crawled: list[Answer] = []
    clients = [_load.Clients(len(keys), lambda i, n: _load.get(
        port, f"/report?key={keys[i]}", "reader", timeout, READER_ADDR), readers,
        (cfg["poll_s"], cfg["poll_s"]), every=True, name="reader")]  # fmt: skip
    if crawl:
        tag = uuid.uuid4().hex[:6]
        clients.append(_load.Clients(cfg["crawlers"], lambda i, n: _load.get(
            port, f"/report?key=crawl-{tag}-{i}-{n}", "crawler", timeout, CRAWLER_ADDR),
            crawled, name="crawler"))  # fmt: skip
    time.sleep(cfg["duration"])  # the phase measured
    for c in clients:
        c.stop(30)
    builds = [server.stats(key)["builds"]["key_builds"] - before[key] for key in keys]
    after = server.stats()["builds"]
    samples = list(readers)
    latencies = [a.latency for a in samples]
    fresh_hits = [a.latency for a in samples if a.status == 200
                  and "ttl=-" not in (a.cache_status or "") and "; hit" in (a.cache_status or "")]
    stale = [a for a in samples if "ttl=-" in (a.cache_status or "")]
    return {
        "answers": len(samples),
        "ok_share": sum(a.status == 200 for a in samples) / len(samples) if samples else None,
        "stale_share": len(stale) / len(samples) if samples else None,
        "p50_ms": ms(pct(latencies, 50)),
        "p99_ms": ms(pct(latencies, 99)),
        "fresh_hit_p50_ms": ms(pct(fresh_hits, 50)),
        "builds_per_key_per_ttl": max(builds) / (cfg["duration"] / cfg["ttl"]) if builds else None,
        "oldest_data_ttls": max((a.age or 0.0 for a in samples), default=0.0) / cfg["ttl"],
        "crawler": dict(Counter(str(a.status) for a in crawled)),
        "max_builds_at_once": after["max_in_flight"],
    }


def popular(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for ttl in cfg["ttls"]:
        for stale in (0.0, cfg["stale"]):
            env = {"REACHLIMIT_CACHE_TTL": str(ttl), "REACHLIMIT_STALE": str(stale),
                   "BENCH_BUILD_MS": str(cfg["build_ms"])}  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="reachlimit-stale-") as tmp, \
                    _load.serving_all([Server("stale", env, Path(tmp), threads=24)]) as [server]:
                run_cfg = {**cfg, "ttl": ttl}
                quiet = run_phase(server, run_cfg, crawl=False)
                crawl = run_phase(server, run_cfg, crawl=True)
            idle = quiet["fresh_hit_p50_ms"]
            for name, phase in (("quiet", quiet), ("crawler", crawl)):
                phase["p99_x_idle_p50"] = _report.ratio_of(phase["p99_ms"], idle)
                rows.append({"ttl_s": ttl, "stale_s": stale, "scenario": name, **phase})
    return rows


# -- (b) a fresh hit in one process ------------------------------------------------------------


def fresh_hit(stale: int) -> Iterator[Pair]:
    from flask import Flask, jsonify
    from werkzeug.test import EnvironBuilder

    from reachlimit.flask import ReachLimit

    app = Flask(f"fresh{stale}")
    app.config.update(REACHLIMIT_STALE=stale, REACHLIMIT_CACHE_TTL=3600)
    rl = ReachLimit(app)
    plain: dict[str, Any] = {"k": {"key": "k", "n": 1}}

    @app.get("/plain/<key>")
    def plain_route(key: str) -> Any:
        return jsonify(plain[key])

    @app.get("/cold/<key>")
    def cold_route(key: str) -> Any:
        return jsonify(rl.cold(key, lambda: {"key": key, "n": 1}))

    request = wsgi_caller(app, [])
    plain_env = EnvironBuilder(path="/plain/k").get_environ()
    cold_env = EnvironBuilder(path="/cold/k").get_environ()
    assert request(cold_env) == request(plain_env)  # now warm

    def checks() -> dict[str, Any]:
        with app.app_context():
            figures = rl.stats()
        return {"builds": figures.builds, "hits": figures.hits}  # every timed one a hit

    yield Pair(f"stale_{stale}", wsgi_side("plain dict route", request, plain_env),
               wsgi_side("rl.cold() hit", request, cold_env), checks)
    rl.close(app)


def pairs(worker: Worker) -> Iterator[Pair]:
    for stale in (300, 0):
        yield from fresh_hit(stale)


# -- the report ----------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    out = [*_report.head("reachlimit stale answers: popular keys over HTTP, a fresh hit", report),
           "", "(a) popular keys (readers' answers; p99 against the quiet run's fresh-hit p50)",
           f"{'ttl':>4} {'stale':>6} {'scenario':>8} {'200 %':>6} {'stale %':>7} {'p50 ms':>7} "
           f"{'p99 ms':>7} {'p99/idle':>8} {'builds/key/ttl':>14} {'oldest ttls':>11} crawler"]
    for r in report["popular"]:
        share = {k: None if r[k] is None else 100 * r[k] for k in ("ok_share", "stale_share")}
        out.append(
            f"{r['ttl_s']:>4} {r['stale_s']:>6} {r['scenario']:>8} {fmt(share['ok_share']):>6} "
            f"{fmt(share['stale_share']):>7} {fmt(r['p50_ms']):>7} {fmt(r['p99_ms']):>7} "
            f"{fmt(r['p99_x_idle_p50']):>8} {fmt(r['builds_per_key_per_ttl'], '.2f'):>14} "
            f"{fmt(r['oldest_data_ttls'], '.2f'):>11} {r['crawler']}")
    hits = report["fresh_hit"]
    out += ["", "(b) a fresh warm hit, whole WSGI request: rl.cold() vs a route returning its dict",
            _paired.timing_line(hits["stale_300"])]
    out += _paired.table([(f"rl.cold() hit, {name}", "plain dict route", r)
                          for name, r in hits.items()], SPEC)  # fmt: skip
    return _report.closing([*out, ""], report)


def goals(report: dict[str, Any], stale: float) -> list[dict[str, Any]]:
    on = [r for r in report["popular"] if r["stale_s"] == stale]
    quiet = [r for r in on if r["scenario"] == "quiet"]
    crawl = [r for r in on if r["scenario"] == "crawler"]

    def worst(rows: list[dict[str, Any]], k: str) -> float | None:
        return max((r[k] for r in rows if r[k] is not None), default=None)

    least = min((r["ok_share"] for r in crawl if r["ok_share"] is not None), default=None)
    p99x, builds = worst(quiet, "p99_x_idle_p50"), worst(on, "builds_per_key_per_ttl")
    oldest = worst(crawl, "oldest_data_ttls")
    rows = [
        ("stale on, quiet: p99 vs idle warm p50", "<= 3x", p99x, p99x is not None and p99x <= 3),
        ("stale on: builds per key per TTL", "<= 2", builds, builds is not None and builds <= 2),
        ("stale on, crawler: popular answers 200", ">= 99 %", least,
         least is not None and least >= 0.99),
        ("stale on, crawler: oldest data served (TTLs)", "< 5", oldest,
         oldest is not None and oldest < 5),
    ]
    return [_report.goal(g, t, v, m) for g, t, v, m in rows] + _paired.ratio_goals(
        [("fresh warm hit vs a route returning its dict", "stale_300", 1.2)],
        report["fresh_hit"])


def main(argv: list[str] | None = None) -> int:
    p = _paired.parser(__doc__, SPEC)
    settle = _report.options(p, crawlers=12, build_ms=300.0, duration=(10.0, 4.0))
    a_ = p.add_argument
    a_("--ttls", default="1,2", help="REACHLIMIT_CACHE_TTL values in s, comma-separated "
       "(default 1,2; quick 1)")
    a_("--stale", type=float, default=60.0, help="REACHLIMIT_STALE when on, in s (default 60)")
    a_("--keys", type=int, default=6, help="popular keys, one reader each (default 6)")
    a_("--poll-ms", type=float, default=20.0, help="a reader's pause after an answer (20 ms)")
    run = _paired.Session(__file__, p, SPEC, pairs, argv)
    if run.in_worker:
        return run.work()
    args = run.args
    settle(args)
    cfg = {
        "ttls": [1.0] if args.quick else [float(x) for x in args.ttls.split(",")],
        "stale": args.stale, "keys": args.keys, "crawlers": args.crawlers,
        "poll_s": args.poll_ms / 1000, "build_ms": args.build_ms, "duration": args.duration,
    }  # fmt: skip
    _load.unwind_on_sigterm()
    run.report["popular"] = popular(cfg)
    run.report["fresh_hit"] = hits = _paired.results(run.group(), SPEC)
    report_goals = goals(run.report, cfg["stale"])
    return run.finish(render, config=cfg, goals=report_goals, figures={
        **_paired.ratio_figures(hits),
        **{g["goal"]: g["value"] for g in report_goals if "pair" not in g}})


if __name__ == "__main__":
    sys.exit(main())
