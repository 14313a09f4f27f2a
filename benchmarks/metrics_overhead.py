#!/usr/bin/env python3
"""What Prometheus metrics cost on the two hot paths of the Flask extension.

    python benchmarks/metrics_overhead.py            # about 40 s
    python benchmarks/metrics_overhead.py --quick    # a few seconds, rough figures

Two identical Flask apps, one with ``ReachLimit(metrics=True)`` and one without, are timed
side by side in the same process (``_paired.py``: alternating rounds in worker processes, the
median of the rounds' ratios on / off). Two requests:

- warm hit: ``GET /r/warm``, served from the warm cache;
- 429: ``GET /r/cold`` refused with ``queue_full`` (both slots held, eight leaders parked in
  the queue in their own threads with a 600 s wait, so the refusal really tries the full gate).

Each is timed twice: as a whole request through Flask's test client (what an app pays per
request, routing and response included: the goal, <= 1.1x, is judged on this), and as the
extension's own call ``rl.cold(...)`` inside a pushed request context (the extension alone: a
stricter view, printed for information).

prometheus_client chooses its mode once, at import, from ``PROMETHEUS_MULTIPROC_DIR``, so the
figures come from two groups of worker processes: without the variable (one-process mode) and
with it set to a fresh temporary directory for each (the several-process mode gunicorn runs,
where every event is written to a memory-mapped file).
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import _paired
import _report
from _paired import Pair, Side, Spec, Worker

from tests.support.waiting import wait_until

SPEC = Spec("metrics_overhead", sides=("off", "on"), unit="us", rounds=101, quick_rounds=5)
PARKED_WAIT_S = 600.0
GOAL = 1.1
CASES = {
    "warm_request": "warm hit, whole request",
    "refusal_request": "429 queue_full, whole request",
    "warm_cold_call": "warm hit, rl.cold() alone",
    "refusal_cold_call": "429 queue_full, rl.cold() alone",
}
MODES = {"one_process": False, "multiprocess": True}
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
        wait_until("the eight waiters parked", lambda: self.limiter.stats().queued == 8,
                   timeout=10, interval=0.001)  # fmt: skip
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

    # -- the timed cases: n operations, the seconds taken ---------------------------------------

    def warm_request(self, n: int) -> float:
        return _timed(lambda: self.client.get("/r/warm"), n)

    def refusal_request(self, n: int) -> float:
        return _timed(lambda: self.client.get("/r/cold"), n)

    def warm_cold_call(self, n: int) -> float:
        with self.warm_ctx:
            return _timed(lambda: self.rl.cold("warm", _build), n)

    def refusal_cold_call(self, n: int) -> float:
        from reachlimit.flask import ColdRefused

        def refused() -> None:
            try:
                self.rl.cold("cold", _build)
            except ColdRefused:
                pass

        with self.cold_ctx:
            return _timed(refused, n)


def _timed(fn: Any, n: int) -> float:
    return float(_paired.call("", fn).run(n))


def _build() -> bytes:
    return b"report"


def pairs(worker: Worker) -> Iterator[Pair]:
    from reachlimit.prometheus import multiprocess_mode

    off, on = Bench(False), Bench(True)
    try:
        for case, label in CASES.items():
            yield Pair(case, Side(f"{label}, metrics off", getattr(off, case)),
                       Side(f"{label}, metrics on", getattr(on, case)))
        with on.app.app_context():
            stats = on.rl.stats()
        # Behaviour, not speed: the metered app really refused and really hit (the first
        # process's figures).
        worker.extra.update(multiprocess=multiprocess_mode(), checks={
            "hits": stats.hits, "rejected_full": stats.rejected_full, "queued": stats.queued,
            "active": stats.active})
    finally:
        off.close()
        on.close()


def render(report: dict[str, Any]) -> str:
    first = report["modes"]["one_process"]["results"]["warm_request"]
    out = [*_report.head("reachlimit: the cost of Prometheus metrics on the extension's hot paths",
                         report), _paired.timing_line(first), ""]
    for mode, figures in report["modes"].items():
        out += [f"{mode} (prometheus_client's {'several' if figures['multiprocess'] else 'one'}"
                "-process mode)"]
        out += _paired.table([(f"{label}, on", "off", figures["results"][case])
                              for case, label in CASES.items()], SPEC)  # fmt: skip
        out.append("")
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    run = _paired.Session(__file__, _paired.parser(__doc__, SPEC), SPEC, pairs, argv)
    if run.in_worker:
        return run.work()
    with tempfile.TemporaryDirectory(prefix="reachlimit-metrics-") as tmp:
        def own_directory() -> dict[str, str]:
            return {"PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(dir=tmp)}

        groups = [run.group(mode, own_directory if several else None)
                  for mode, several in MODES.items()]
    modes = {g.name: {"multiprocess": g.extra["multiprocess"], "results": _paired.results(g, SPEC),
                      "checks": g.extra["checks"]} for g in groups}  # fmt: skip
    goals = [(f"{case.replace('_', ' ')} with metrics on, {mode.replace('_', ' ')} mode",
              case, figures["results"], mode) for mode, figures in modes.items()
             for case in ("warm_request", "refusal_request")]  # fmt: skip
    return run.finish(
        render, modes=modes,
        goals=[{**_paired.ratio_goals([(name, case, GOAL)], results)[0], "pair": f"{mode}/{case}"}
               for name, case, results, mode in goals],
        figures={k: v for mode, figures in modes.items()
                 for k, v in _paired.ratio_figures(figures["results"], f"{mode}/").items()},
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
