#!/usr/bin/env python3
"""How long a cold reach report takes on the demo database: the webapp's calibration.

    python benchmarks/reach_cold.py                      # writes a default-size demo db first
    python benchmarks/reach_cold.py --db webapp/data/demo.sqlite
    python benchmarks/reach_cold.py --nodes 30           # sample size (path-capable nodes)
    python benchmarks/reach_cold.py --quick --json       # a small demo db, 5 targets, JSON

Runs in-process, as the service's cold build does: the node index and degree table are
loaded once (the service keeps them as once-a-minute snapshots), then ``build_report`` runs
for a random sample of path-capable nodes over 1-, 7- and 30-day windows. The baseline, timed
in the same run, is a bare ``SELECT COUNT(*)`` over each window's rows: the ratio says how
much the token filter, the joins and the attribution add to merely walking the window.
Prints the machine, the database and the figures; the webapp wants the 7-day median in
0.1-1 s (see webapp/demodb.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webapp import reach  # noqa: E402
from webapp.demodb import read_meta, write_demo_db  # noqa: E402


def cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="a demo database (default: write one)")
    parser.add_argument("--nodes", type=int, default=30, help="how many targets to sample")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--quick", action="store_true",
                        help="a small demo database (300 nodes, 50,000 observations), 5 targets")
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = parser.parse_args()
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else print
    targets = 5 if args.quick else args.nodes

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "demo.sqlite"
            size = {"nodes": 300, "observations": 50_000} if args.quick else {}
            say("writing a demo database ...")
            say(f"  {write_demo_db(db, **size)}")
        meta = read_meta(db)
        now = float(meta["now"]) if "now" in meta else time.time()
        conn = reach.open_readonly(db)
        index = reach.load_node_index(conn)
        degrees = reach.load_degrees(conn)
        rules = reach.Visibility().current
        capable = sorted(k for k, n in index.nodes.items()
                         if reach.is_path_capable(n.role) and index.reliable_tokens(k))
        sample = random.Random(args.seed).sample(capable, min(targets, len(capable)))
        [(rows,)] = conn.execute("SELECT COUNT(*) FROM observations")
        report: dict[str, object] = {
            "machine": {"platform": platform.platform(), "cpu": cpu_name(),
                        "cores": os.cpu_count(), "python": platform.python_version(),
                        "sqlite": reach.sqlite3.sqlite_version},
            "database": {"path": str(db), "bytes": db.stat().st_size, "observations": rows,
                         "targets": len(capable), "sample": len(sample)},
            "windows": {},
        }
        say(f"machine: {report['machine']}")
        say(f"database: {db} ({db.stat().st_size / 1e6:.0f} MB, {rows:,} observations, "
            f"{len(capable)} nodes with a reliable token; sample of {len(sample)})")
        windows: dict[str, object] = {}
        report["windows"] = windows
        for days in (1, 7, 30):
            since = int(now) - days * 86_400
            t0 = time.perf_counter()
            [(in_window,)] = conn.execute(
                "SELECT COUNT(*) FROM observations WHERE timestamp >= ?", (since,))
            baseline = time.perf_counter() - t0
            times = []
            for key in sample:
                t0 = time.perf_counter()
                reach.build_report(conn, key, days, now=now, visibility=rules,
                                   degrees=degrees, index=index)
                times.append(time.perf_counter() - t0)
            median = statistics.median(times)
            ratio = median / baseline if baseline > 0 else float("inf")
            windows[str(days)] = {"rows": in_window, "median_s": median, "min_s": min(times),
                                  "max_s": max(times), "baseline_s": baseline, "ratio": ratio}
            say(f"{days:>2}-day: {in_window:>8,} rows; cold report median {median * 1e3:6.1f} ms "
                f"(min {min(times) * 1e3:6.1f}, max {max(times) * 1e3:6.1f}); "
                f"bare count {baseline * 1e3:6.1f} ms; ratio {ratio:4.1f}x")
        conn.close()
        if args.json:
            print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
