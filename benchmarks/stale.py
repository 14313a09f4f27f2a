#!/usr/bin/env python3
"""Stale-while-revalidate: popular reports across their TTL, and what a fresh hit costs.

    python benchmarks/stale.py            # defaults: about 2 minutes
    python benchmarks/stale.py --quick    # about 40 s, rough figures
    python benchmarks/stale.py --json     # the same figures as JSON on stdout

(a) popular  one gunicorn server (``-k gthread``, 1 worker, 24 threads) on 127.0.0.1 serving
    this module's :func:`create_app` (the extension with its default limits, a build that
    sleeps ``--build-ms`` (300) and stamps its value with the time it was built). For each
    TTL of ``--ttls`` (1, 2 s) and each ``REACHLIMIT_STALE`` of 0 (the baseline: every entry
    expires) and ``--stale`` (60 s), on a fresh server:

      quiet    ``--keys`` (6) reader threads, each polling its own popular key every
               ``--poll-ms`` (20 ms) on a new connection, for ``--duration`` s (10; quick 4)
      crawler  the same readers while ``--crawlers`` (12) threads from another loopback
               address (127.0.0.2: another client to fair admission) ask for distinct cold
               keys back to back, keeping both slots busy and the queue full

    Figures per run: the readers' p50/p99 (client side, connect to last byte) against the
    idle warm p50 (the quiet run's p50 of answers that were fresh hits, same TTL and stale,
    so a ratio of one server against itself); the share of readers' answers that were 200;
    builds per popular key per TTL (the server's own count); the oldest data served (the
    largest answer-time minus built-at, in TTLs); the crawler's 200s and 429s.
    Goals, with stale on: p99 <= 3x the idle warm p50 (quiet); builds per key per TTL <= 2;
    under the crawler >= 99 % of popular answers 200 and the oldest data a few TTLs (< 5),
    never the whole stale window.

(b) fresh hit  in one process, a whole WSGI request (``app(environ, start_response)``, no
    socket): a warm hit through ``rl.cold()`` with ``REACHLIMIT_STALE=300`` against a route of
    the same app returning its cached dict (``jsonify`` of a dict looked up in a plain dict);
    alternating rounds, the median per-round ratio. Goal: <= 1.2x (the early-refresh draw is
    made only near the TTL's end, so a fresh hit pays for the stale window almost nothing).
    The same with ``REACHLIMIT_STALE=0`` is shown beside it.

Printed, never asserted. Every server is stopped by PID.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import timeit
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import _common
import _http
from _common import ms, pct

from tests.support import HOST

CRAWLER_SOURCE, READER_SOURCE = "127.0.0.2", "127.0.0.3"


# -- the app ----------------------------------------------------------------------------------


def create_app() -> Any:
    """The app factory (gunicorn ``stale:create_app()`` from ``benchmarks/``):
    ``REACHLIMIT_*`` from the environment, ``BENCH_BUILD_MS``, ``BENCH_TOKEN``."""
    from flask import Flask, jsonify, request
    from http_app import stats_response

    from reachlimit.flask import CONFIG_KEYS, ReachLimit

    app = Flask(__name__)
    app.config.update({k: os.environ[k] for k in CONFIG_KEYS if k in os.environ})
    build_s = float(os.environ.get("BENCH_BUILD_MS", "300")) / 1000
    token = os.environ.get("BENCH_TOKEN")
    rl = ReachLimit(app)
    lock = threading.Lock()
    per_key: Counter[str] = Counter()  # guarded by lock
    running = [0, 0]  # now, most; guarded by lock

    def build(key: str) -> dict[str, Any]:
        with lock:
            per_key[key] += 1
            running[0] += 1
            running[1] = max(running)
        try:
            time.sleep(build_s)
            return {"key": key, "built_at": time.time()}
        finally:
            with lock:
                running[0] -= 1

    @app.get("/report")
    def report() -> Any:
        key = request.args.get("key", "")
        return jsonify(rl.cold(key, lambda: build(key)))

    @app.get("/stats")
    def stats() -> Any:
        with lock:
            builds = dict(per_key)
            most = running[1]
        return stats_response(pid=os.getpid(), token=token, reach=rl.stats().as_dict(),
                              builds=builds, max_in_flight=most)

    return app


# -- (a) popular keys over HTTP -----------------------------------------------------------


def one_get(port: int, path: str, source: str) -> tuple[float, int | None, dict[str, str], bytes]:
    import http.client

    start = time.perf_counter()
    conn = http.client.HTTPConnection(HOST, port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        body = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return time.perf_counter() - start, resp.status, headers, body
    except OSError:
        return time.perf_counter() - start, None, {}, b""
    finally:
        conn.close()


def run_phase(port: int, cfg: dict[str, Any], crawl: bool) -> dict[str, Any]:
    stop = threading.Event()
    readers: list[list[tuple[float, int | None, str, float]]] = []
    crawled: Counter[str] = Counter()
    crawl_lock = threading.Lock()
    keys = [f"popular-{i}-{uuid.uuid4().hex[:6]}" for i in range(cfg["keys"])]
    for key in keys:  # warm each popular key once before the clock starts
        one_get(port, f"/report?key={key}", READER_SOURCE)

    def reader(key: str, out: list[tuple[float, int | None, str, float]]) -> None:
        next_at = time.perf_counter()
        while not stop.is_set():
            latency, status, headers, body = one_get(port, f"/report?key={key}", READER_SOURCE)
            age = 0.0
            if status == 200:
                age = time.time() - json.loads(body)["built_at"]
            out.append((latency, status, headers.get("cache-status", ""), age))
            next_at += cfg["poll_s"]
            stop.wait(max(0.0, next_at - time.perf_counter()))

    def crawler(i: int) -> None:
        n = 0
        while not stop.is_set():
            _, status, _, _ = one_get(port, f"/report?key=crawl-{i}-{n}", CRAWLER_SOURCE)
            n += 1
            with crawl_lock:
                crawled[str(status)] += 1

    threads = []
    for key in keys:
        out: list[tuple[float, int | None, str, float]] = []
        readers.append(out)
        threads.append(threading.Thread(target=reader, args=(key, out), daemon=True))
    if crawl:
        threads += [threading.Thread(target=crawler, args=(i,), daemon=True)
                    for i in range(cfg["crawlers"])]
    before = _http.get_json(port, "GET", "/stats")["builds"]
    for t in threads:
        t.start()
    time.sleep(cfg["duration"])
    stop.set()
    for t in threads:
        t.join(30)
    after = _http.get_json(port, "GET", "/stats")
    samples = [s for out in readers for s in out]
    latencies = [s[0] for s in samples]
    fresh_hits = [s[0] for s in samples if s[1] == 200 and "ttl=-" not in s[2]
                  and "; hit" in s[2]]
    builds = [after["builds"].get(k, 0) - before.get(k, 0) for k in keys]
    ttls = cfg["duration"] / cfg["ttl"]
    return {
        "answers": len(samples),
        "ok_share": sum(1 for s in samples if s[1] == 200) / len(samples) if samples else None,
        "stale_share": (sum(1 for s in samples if "ttl=-" in s[2]) / len(samples)
                        if samples else None),
        "p50_ms": ms(pct(latencies, 50)),
        "p99_ms": ms(pct(latencies, 99)),
        "fresh_hit_p50_ms": ms(pct(fresh_hits, 50)),
        "builds_per_key_per_ttl": max(builds) / ttls if builds else None,
        "oldest_data_ttls": max((s[3] for s in samples), default=0.0) / cfg["ttl"],
        "crawler": dict(crawled),
        "max_builds_at_once": after["max_in_flight"],
    }


def popular(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for ttl in cfg["ttls"]:
        for stale in (0.0, cfg["stale"]):
            env = {"REACHLIMIT_CACHE_TTL": str(ttl), "REACHLIMIT_STALE": str(stale),
                   "BENCH_BUILD_MS": str(cfg["build_ms"])}
            with tempfile.TemporaryDirectory(prefix="bench-stale-") as tmp:
                server = _http.BenchGunicorn("stale:create_app()", Path(tmp), "stale", env,
                                             workers=1, threads=24)
                with _http.all_serving([server]):
                    run_cfg = {**cfg, "ttl": ttl}
                    quiet = run_phase(server.port, run_cfg, crawl=False)
                    crawl = run_phase(server.port, run_cfg, crawl=True)
            idle = quiet["fresh_hit_p50_ms"]
            for name, phase in (("quiet", quiet), ("crawler", crawl)):
                p99 = phase["p99_ms"]
                phase["p99_x_idle_p50"] = p99 / idle if idle and p99 else None
                rows.append({"ttl_s": ttl, "stale_s": stale, "scenario": name, **phase})
    return rows


# -- (b) a fresh hit in one process -----------------------------------------------------------


def fresh_hit(number: int, rounds: int) -> dict[str, Any]:
    return {f"stale_{stale}": _fresh_hit_at(stale, number, rounds) for stale in (300, 0)}


def _fresh_hit_at(stale: int, number: int, rounds: int) -> dict[str, Any]:
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

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        pass

    def request(environ: dict[str, Any]) -> bytes:
        body = app(dict(environ), start_response)
        try:
            return b"".join(body)
        finally:
            getattr(body, "close", lambda: None)()

    plain_env = EnvironBuilder(path="/plain/k").get_environ()
    cold_env = EnvironBuilder(path="/cold/k").get_environ()
    assert json.loads(request(cold_env)) == json.loads(request(plain_env))  # now warm
    ns = {"request": request, "plain_env": plain_env, "cold_env": cold_env}
    base = timeit.Timer("request(plain_env)", globals=ns)
    cand = timeit.Timer("request(cold_env)", globals=ns)
    base_s, cand_s = _common.alternating(base.timeit, cand.timeit, number, rounds)
    with app.app_context():
        figures = rl.stats()
    assert figures.builds == 1 and figures.hits >= number * rounds  # every timed one a hit
    rl.close(app)
    return {
        "plain_us": min(base_s) * 1e6, "cold_us": min(cand_s) * 1e6,
        **_common.ratios(base_s, cand_s),
    }


# -- main -----------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [f"machine: {m['cpu']} ({m['cores']} cores), {m['python']}, load {m['loadavg_1m']}",
           "", "(a) popular keys (readers' answers; p99 against the quiet run's fresh-hit p50)",
           f"{'ttl':>4} {'stale':>6} {'scenario':>8} {'200 %':>6} {'stale %':>7} {'p50 ms':>7} "
           f"{'p99 ms':>7} {'p99/idle':>8} {'builds/key/ttl':>14} {'oldest ttls':>11} crawler"]
    for r in report["popular"]:
        out.append(
            f"{r['ttl_s']:>4} {r['stale_s']:>6} {r['scenario']:>8} "
            f"{_common.fmt(100 * r['ok_share'])!s:>6} {_common.fmt(100 * r['stale_share'])!s:>7} "
            f"{_common.fmt(r['p50_ms'])!s:>7} {_common.fmt(r['p99_ms'])!s:>7} "
            f"{_common.fmt(r['p99_x_idle_p50'])!s:>8} "
            f"{_common.fmt(r['builds_per_key_per_ttl'], '.2f')!s:>14} "
            f"{_common.fmt(r['oldest_data_ttls'], '.2f')!s:>11} {r['crawler']}"
        )
    out += ["", "(b) a fresh warm hit, whole WSGI request: rl.cold() vs a route returning its dict"]
    for name, r in report["fresh_hit"].items():
        out.append(f"  {name}: {r['cold_us']:.1f} us vs {r['plain_us']:.1f} us = "
                   f"{r['ratio']:.3f}x (best {r['ratio_best']:.3f}x, rounds "
                   f"{r['ratio_spread'][0]:.3f}-{r['ratio_spread'][1]:.3f})")
    out += ["", "goals:"]
    for g in report["goals"]:
        out.append(f"  [{'met' if g['met'] else 'MISSED'}] {g['goal']}: {g['value']} "
                   f"({g['target']})")
    return "\n".join(out)


def goals(report: dict[str, Any], stale: float) -> list[dict[str, Any]]:
    on = [r for r in report["popular"] if r["stale_s"] == stale]
    quiet = [r for r in on if r["scenario"] == "quiet"]
    crawl = [r for r in on if r["scenario"] == "crawler"]
    worst = lambda rows, k: max((r[k] for r in rows if r[k] is not None), default=None)  # noqa: E731
    least = min((r["ok_share"] for r in crawl if r["ok_share"] is not None), default=None)
    p99x, builds = worst(quiet, "p99_x_idle_p50"), worst(on, "builds_per_key_per_ttl")
    oldest = worst(crawl, "oldest_data_ttls")
    hit = report["fresh_hit"]["stale_300"]["ratio"]
    rows = [
        ("stale on, quiet: p99 vs idle warm p50", "<= 3x", p99x, p99x is not None and p99x <= 3),
        ("stale on: builds per key per TTL", "<= 2", builds, builds is not None and builds <= 2),
        ("stale on, crawler: popular answers 200", ">= 99 %", least,
         least is not None and least >= 0.99),
        ("stale on, crawler: oldest data served (TTLs)", "< 5", oldest,
         oldest is not None and oldest < 5),
        ("fresh warm hit vs a route returning its dict", "<= 1.2x", hit, hit <= 1.2),
    ]
    return [{"goal": g, "target": t, "value": None if v is None else round(v, 3), "met": bool(m)}
            for g, t, v, m in rows]


def main() -> int:
    p = _common.parser(__doc__.splitlines()[1], "4 s per phase, TTL 1 s only, fewer rounds")
    p.add_argument("--ttls", default="1,2")
    p.add_argument("--stale", type=float, default=60.0)
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--crawlers", type=int, default=12)
    p.add_argument("--poll-ms", type=float, default=20.0)
    p.add_argument("--build-ms", type=float, default=300.0)
    p.add_argument("--duration", type=float, default=None)
    args = p.parse_args()
    _http.unwind_on_sigterm()
    cfg = {
        "ttls": [1.0] if args.quick else [float(x) for x in args.ttls.split(",")],
        "stale": args.stale, "keys": args.keys, "crawlers": args.crawlers,
        "poll_s": args.poll_ms / 1000, "build_ms": args.build_ms,
        "duration": args.duration or (4.0 if args.quick else 10.0),
    }
    report: dict[str, Any] = {"machine": _common.machine(), "config": cfg}
    report["popular"] = popular(cfg)
    report["fresh_hit"] = fresh_hit(2_000 if args.quick else 5_000, 5 if args.quick else 11)
    report["goals"] = goals(report, cfg["stale"])
    return _http.finish(report, args.json, render)


if __name__ == "__main__":
    sys.exit(main())
