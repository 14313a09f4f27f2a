#!/usr/bin/env python3
"""Cold and warm reach report times on demo databases: the webapp's calibration.

    python benchmarks/reach_cold.py                      # demo dbs of 100k, 300k and 1M rows
    python benchmarks/reach_cold.py --sizes 300000       # one size
    python benchmarks/reach_cold.py --db webapp/data/demo.sqlite
    python benchmarks/reach_cold.py --nodes 30           # sample size (path-capable nodes)
    python benchmarks/reach_cold.py --quick --json       # a small demo db, 5 targets, JSON

For each database, two measurements in the same run:

- the cold build in-process, as the service runs it: the node index and degree table are
  loaded once (the service keeps them as once-a-minute snapshots), then ``build_report`` runs
  for a random sample of path-capable nodes over 1-, 7- and 30-day windows. The baseline is a
  bare ``SELECT COUNT(*)`` over each window's rows: the ratio says how much the token filter,
  the joins and the attribution add to merely walking the window;
- the whole request through the Flask app (test client, no sockets): the first request for a
  7-day report (cold: limiter, build, JSON, cache fill) and the same request again (warm: a
  cache hit that never touches the limiter), with the cold/warm ratio.

Prints the machine, each database and the figures; the webapp wants the 7-day cold median in
0.1-1 s on its default demo database (see webapp/demodb.py).
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _report  # also puts the repository root on sys.path, for webapp
from _report import pct

from webapp import create_app
from webapp.db import open_readonly
from webapp.demodb import read_meta, write_demo_db
from webapp.meshcore import is_path_capable
from webapp.report import build_report
from webapp.snapshot import load_degrees, load_node_index
from webapp.visibility import Visibility


def measure(db: Path, targets: int, seed: int, say: Callable[..., None]) -> dict[str, Any]:
    meta = read_meta(db)
    now = float(meta["now"]) if "now" in meta else time.time()
    conn = open_readonly(db)
    index = load_node_index(conn)
    degrees = load_degrees(conn)
    rules = Visibility().current
    capable = sorted(k for k, n in index.nodes.items()
                     if is_path_capable(n.role) and index.reliable_tokens(k))
    sample = random.Random(seed).sample(capable, min(targets, len(capable)))
    [(rows,)] = conn.execute("SELECT COUNT(*) FROM observations")
    result: dict[str, Any] = {
        "database": {"path": str(db), "bytes": db.stat().st_size, "observations": rows,
                     "targets": len(capable), "sample": len(sample)},
    }
    say(f"database: {db.name} ({db.stat().st_size / 1e6:.0f} MB, {rows:,} observations, "
        f"{len(capable)} nodes with a reliable token; sample of {len(sample)})")
    windows: dict[str, object] = {}
    result["windows"] = windows
    for days in (1, 7, 30):
        since = int(now) - days * 86_400
        t0 = time.perf_counter()
        [(in_window,)] = conn.execute(
            "SELECT COUNT(*) FROM observations WHERE timestamp >= ?", (since,))
        baseline = time.perf_counter() - t0
        times = []
        for key in sample:
            t0 = time.perf_counter()
            build_report(conn, key, days, now=now, visibility=rules,
                         degrees=degrees, index=index)
            times.append(time.perf_counter() - t0)
        median = statistics.median(times)
        ratio = median / baseline if baseline > 0 else float("inf")
        windows[str(days)] = {"rows": in_window, "median_s": median, "min_s": min(times),
                              "max_s": max(times), "baseline_s": baseline, "ratio": ratio}
        say(f"  build {days:>2}-day: {in_window:>8,} rows; cold median {median * 1e3:6.1f} ms "
            f"(min {min(times) * 1e3:6.1f}, max {max(times) * 1e3:6.1f}); "
            f"bare count {baseline * 1e3:6.1f} ms; ratio {ratio:4.1f}x")
    conn.close()

    # The whole request through the app: cold (first) and warm (again) 7-day reports.
    app = create_app({"REACH_DB": str(db), "REACH_WALL_CLOCK": lambda: now, "TESTING": True})
    client = app.test_client()
    cold: list[float] = []
    warm: list[float] = []
    for key in sample:
        for into in (cold, warm):
            t0 = time.perf_counter()
            reply = client.get(f"/api/nodes/{key}/reach?days=7")
            into.append(time.perf_counter() - t0)
            if reply.status_code != 200:
                raise SystemExit(f"{key}: HTTP {reply.status_code} {reply.get_data(as_text=True)}")
    request: dict[str, Any] = {
        "cold_p50_s": statistics.median(cold), "cold_p99_s": pct(cold, 99),
        "warm_p50_s": statistics.median(warm), "warm_p99_s": pct(warm, 99),
    }
    request["cold_over_warm"] = request["cold_p50_s"] / request["warm_p50_s"]
    result["request_7d"] = request
    say(f"  request 7-day: cold p50 {request['cold_p50_s'] * 1e3:6.1f} ms, "
        f"p99 {request['cold_p99_s'] * 1e3:6.1f} ms; warm hit p50 "
        f"{request['warm_p50_s'] * 1e3:6.2f} ms, p99 {request['warm_p99_s'] * 1e3:6.2f} ms; "
        f"cold/warm {request['cold_over_warm']:,.0f}x")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = _report.parser(_report.description(__doc__),
                            "one small demo database (300 nodes, 50,000 observations), 5 targets")
    parser.add_argument("--db", type=Path, help="an existing demo database (default: write them)")
    parser.add_argument("--sizes", default="100000,300000,1000000",
                        help="observations of each demo database to write (comma-separated)")
    parser.add_argument("--nodes", type=int, default=30, help="how many targets to sample")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    args = parser.parse_args(argv)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    targets = 5 if args.quick else args.nodes
    try:
        sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    except ValueError:
        parser.error("--sizes takes whole numbers separated by commas")

    report = _report.start("reach_cold")
    report["machine"]["sqlite"] = sqlite3.sqlite_version
    report["databases"] = []
    say("\n".join(_report.head("reachlimit: the webapp's reach reports, cold and warm", report)))
    with tempfile.TemporaryDirectory() as tmp:
        if args.db is not None:
            dbs = [args.db]
        elif args.quick:
            dbs = [Path(tmp) / "quick.sqlite"]
            say(f"writing {dbs[0].name}: {write_demo_db(dbs[0], nodes=300, observations=50_000)}")
        else:
            dbs = []
            for size in sizes:
                db = Path(tmp) / f"demo-{size}.sqlite"
                say(f"writing {db.name}: {write_demo_db(db, observations=size)}")
                dbs.append(db)
        for db in dbs:
            report["databases"].append(measure(db, targets, args.seed, say))
    report["config"] = {"targets": targets, "seed": args.seed, "quick": args.quick}
    report["figures"] = {f"{Path(d['database']['path']).name} 7-day cold median s":
                         d["windows"]["7"]["median_s"] for d in report["databases"]}
    return _report.finish(report, args, lambda r: _report.closing([], r))


if __name__ == "__main__":
    sys.exit(main())
