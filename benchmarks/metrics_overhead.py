#!/usr/bin/env python3
"""What Prometheus metrics cost on the two hot paths of the Flask extension.

    python benchmarks/metrics_overhead.py            # full run, about 35 s
    python benchmarks/metrics_overhead.py --quick    # a few seconds, rough figures
    python benchmarks/metrics_overhead.py --json     # the same figures as JSON on stdout

Two identical Flask apps, one with ``ReachLimit(metrics=True)`` and one without, are timed
side by side in the same process, in alternating rounds (off first on even rounds, on first on
odd rounds); the ratio judged is the median of the per-round ratios (on / off). Two requests:

- warm hit: ``GET /r/warm``, served from the warm cache;
- 429: ``GET /r/cold`` refused with ``queue_full`` (both slots held, eight leaders parked in
  the queue in their own threads with a 600 s wait, so the refusal really tries the full gate).

Each is timed twice: as a whole request through Flask's test client (what an app pays per
request, routing and response included: the goal, <= 1.1x, is judged on this), and as the
extension's own call ``rl.cold(...)`` inside a pushed request context (the extension alone: a
stricter view, printed for information).

prometheus_client chooses its mode once, at import, from ``PROMETHEUS_MULTIPROC_DIR``, so the
figures come from two processes: this one (one-process mode) and a child run with the
variable set to a fresh temporary directory (the several-process mode gunicorn runs, where
every event is written to a memory-mapped file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _common
from _common import machine

PARKED_WAIT_S = 600.0
GOAL = 1.1
CASES = ("warm_request", "refusal_request", "warm_cold_call", "refusal_cold_call")


#: The address the test client's requests come from (werkzeug's default REMOTE_ADDR).
PEER = "127.0.0.1"


class Bench:
    """One app (metrics on or off) with a warm key and a saturated limiter."""

    def __init__(self, metrics: bool) -> None:
        from flask import Flask

        from reachlimit.flask import ReachLimit

        self.app = Flask(f"bench-{'on' if metrics else 'off'}")
        self.rl = ReachLimit(self.app, metrics=metrics, wait=PARKED_WAIT_S,
                             cancel_on_disconnect=False)

        @self.app.get("/r/<key>")
        def report(key: str) -> Any:
            return self.rl.cold(key, lambda: b"report")

        self.client = self.app.test_client()
        assert self.client.get("/r/warm").status_code == 200  # now cached
        with self.app.app_context():
            self.limiter = self.rl.path.limiter
        self.grants = [self.limiter.acquire(), self.limiter.acquire()]
        self.parked = [threading.Thread(target=self._park, daemon=True) for _ in range(8)]
        for t in self.parked:
            t.start()
        for _ in range(10_000):  # at most about 10 s
            if self.limiter.stats().queued == 8:
                break
            time.sleep(0.001)
        else:
            raise RuntimeError("the eight waiters did not park in the queue")
        assert self.client.get("/r/cold").status_code == 429
        # The test client's own address, as the parked waiters have (a bare request context
        # has none: it would be another client, who displaces one of them).
        peer = {"REMOTE_ADDR": PEER}
        self.warm_ctx = self.app.test_request_context("/r/warm", environ_base=peer)
        self.cold_ctx = self.app.test_request_context("/r/cold", environ_base=peer)

    def _park(self) -> None:
        # As the test client's own address (its REMOTE_ADDR): the refused request is then one
        # client with every place, refused at once, as it always was; an anonymous waiter
        # would be displaced by it instead (fair admission).
        self.limiter.acquire(None, PEER).release()

    def close(self) -> None:
        for g in self.grants:
            g.release()
        for t in self.parked:
            t.join(timeout=10)
        if any(t.is_alive() for t in self.parked):
            raise RuntimeError("parked waiters did not finish")

    # -- the timed statements -------------------------------------------------------------------

    def warm_request(self, n: int) -> None:
        get = self.client.get
        for _ in range(n):
            get("/r/warm")

    def refusal_request(self, n: int) -> None:
        get = self.client.get
        for _ in range(n):
            get("/r/cold")

    def warm_cold_call(self, n: int) -> None:
        cold, build = self.rl.cold, _build
        with self.warm_ctx:
            for _ in range(n):
                cold("warm", build)

    def refusal_cold_call(self, n: int) -> None:
        from reachlimit.flask import ColdRefused

        cold, build = self.rl.cold, _build
        with self.cold_ctx:
            for _ in range(n):
                try:
                    cold("cold", build)
                except ColdRefused:
                    pass


def _build() -> bytes:
    return b"report"


def paired(off: Bench, on: Bench, case: str, number: int, rounds: int) -> dict[str, Any]:
    def timed(run: Any) -> Any:
        def seconds(n: int) -> float:
            started = time.perf_counter()
            run(n)
            return time.perf_counter() - started
        return seconds

    off_s, on_s = _common.alternating(
        timed(getattr(off, case)), timed(getattr(on, case)), number, rounds
    )
    off_us = [x * 1e6 for x in off_s]
    on_us = [x * 1e6 for x in on_s]
    return {
        "off_us": statistics.median(off_us),
        "on_us": statistics.median(on_us),
        **_common.ratios(off_us, on_us),
        "rounds": rounds,
        "ops_per_round": number,
    }


def measure(number: int, rounds: int) -> dict[str, Any]:
    """Every case in this process's prometheus_client mode."""
    from reachlimit.prometheus import multiprocess_mode

    off, on = Bench(False), Bench(True)
    try:
        results = {}
        for case in CASES:
            n = number if case.endswith("request") else number * 10
            results[case] = paired(off, on, case, n, rounds)
        with on.app.app_context():
            stats = on.rl.stats()
        # Behaviour, not speed: the metered app really refused and really hit.
        checks = {"hits": stats.hits, "rejected_full": stats.rejected_full,
                  "queued": stats.queued, "active": stats.active}
    finally:
        off.close()
        on.close()
    return {"multiprocess": multiprocess_mode(), "results": results, "checks": checks}


def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = {"one_process": measure(args.number, args.rounds)}
    with tempfile.TemporaryDirectory(prefix="reach-metrics-bench-") as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "--number", str(args.number),
             "--rounds", str(args.rounds)],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the several-process run failed:\n{proc.stderr}")
        modes["multiprocess"] = json.loads(proc.stdout)
    goals = [
        {
            "goal": f"{case.replace('_', ' ')} with metrics on, {mode.replace('_', ' ')} mode",
            "target": f"<= {GOAL}x",
            "value": figures["results"][case]["ratio"],
            "met": figures["results"][case]["ratio"] <= GOAL,
        }
        for mode, figures in modes.items()
        for case in ("warm_request", "refusal_request")
    ]
    return {
        "machine": machine(),
        "config": {"number": args.number, "rounds": args.rounds, "quick": args.quick},
        "modes": modes,
        "goals": goals,
    }


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [
        "reachlimit: the cost of Prometheus metrics on the extension's hot paths",
        f"machine: {m['platform']}",
        f"         {m['cpu']}, {m['cores']} cores, {m['python']}, load average {m['loadavg_1m']}",
        f"timing:  {report['config']['rounds']} alternating rounds; ratio = median of per-round "
        "ratios (metrics on / metrics off); best = fastest on / fastest off",
        "",
        f"{'mode':<13} {'case':<32} {'off us':>8} {'on us':>8} {'ratio':>7} {'best':>7} "
        f"{'spread':>12}",
    ]
    labels = {
        "warm_request": "warm hit, whole request",
        "refusal_request": "429 queue_full, whole request",
        "warm_cold_call": "warm hit, rl.cold() alone",
        "refusal_cold_call": "429 queue_full, rl.cold() alone",
    }
    for mode, figures in report["modes"].items():
        for case in CASES:
            x = figures["results"][case]
            lo, hi = x["ratio_spread"]
            out.append(
                f"{mode:<13} {labels[case]:<32} {x['off_us']:8.2f} {x['on_us']:8.2f} "
                f"{x['ratio']:6.3f}x {x['ratio_best']:6.3f}x {lo:5.2f}-{hi:4.2f}x"
            )
    out += ["", "goals:"]
    out += [
        "  {}: {:.3f}x, goal {} - {}".format(
            g["goal"], g["value"], g["target"], "met" if g["met"] else "MISSED")
        for g in report["goals"]
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(
        "The cost of REACHLIMIT_METRICS on a warm hit and on a 429 through the Flask "
        "extension, as a ratio against the same app without metrics, timed side by side."))
    for flag, text in (("--json", "print the figures as JSON"),
                       ("--quick", "small run (seconds), rough figures")):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--number", type=int, default=None,
                   help="requests per timed round (default 100, quick 50); rl.cold() calls "
                   "are ten times as many")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating rounds per case (default 101, quick 5)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # Many short rounds: on a shared machine a round's two halves then see the same load.
    args.number = args.number or (50 if args.quick else 100)
    args.rounds = args.rounds or (5 if args.quick else 101)
    if args.child:
        print(json.dumps(measure(args.number, args.rounds)))
        return 0
    report = run(args)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
