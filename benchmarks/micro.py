#!/usr/bin/env python3
"""ColdLimiter's two hot paths and a refusal through the Flask extension, each against a
baseline timed in turn with it, as ratios.

    python benchmarks/micro.py                   # about 15 s
    python benchmarks/micro.py --quick           # a few seconds, rough figures
    python benchmarks/micro.py --output micro.json --plot micro.png

The pairs (``_paired.py``: alternating rounds in worker processes, the median of the
rounds' ratios):

fast_path        ``g = lim.acquire(); g.release()`` with a free slot, against a
                 ``threading.BoundedSemaphore(2)`` ``acquire(); release()`` pair.
                 Goal: <= 1.0x (stretch: <= 0.5x). ``fast_path_with``: the ``with`` forms.
refusal_gate     ``queue_full`` refusal, against ``put_nowait`` refused by a full
                 ``queue.Queue`` with ``queue.Full`` caught, on the real full-gate path:
                 ``queue=8``, both slots held, eight waiter threads parked with a long wait.
                 Goal: <= 1.35x. After timing, 1,000 more refusals check that each was
                 ``queue_full``, that only ``rejected_full`` moved and the clock was never read.
refusal_queue0   the same with ``queue=0`` (no gate). Goal: <= 1.35x.
flask_refusal    a whole WSGI request (``app(environ, start_response)``, body read and
                 closed; no socket) refused by the extension (its one slot held, ``queue=0``:
                 every request a ``queue_full`` 429), against a route of the same app
                 returning a constant JSON the size of the refusal's body. Goal: <= 1.2x.

And once, in the first worker: lasting allocations, ``sys.getallocatedblocks()`` after
``gc.collect()`` before and after 50,000 refusals on each path (the refused ``put_nowait``
alike, as the yardstick). Goal: about 0 (a handful of blocks of noise allowed).
"""

from __future__ import annotations

import gc
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import _paired
import _report
import plots
from _paired import Pair, Spec, Worker, statement, wsgi_caller, wsgi_side

from reachlimit import Busy, ColdLimiter
from tests.support.waiting import wait_until

SPEC = Spec("micro", sides=("baseline", "limiter"), unit="ns", rounds=41)
#: A parked waiter must outlive the measurement; it is released explicitly at the end, so this
#: long wait never runs out (it only bounds the worst case if something goes wrong).
PARKED_WAIT_S = 600.0
#: "About zero" lasting blocks over 50k refusals: a leak of even one block per refusal would
#: show as 50,000; a handful is interpreter noise (a resized free list, an interned int).
ALLOC_TOLERANCE_BLOCKS = 16
#: The goals: (name, pair, highest ratio).
GOALS = (
    ("fast path vs BoundedSemaphore(2) pair", "fast_path", 1.0),
    ("fast path, stretch", "fast_path", 0.5),
    ("queue_full refusal, queue=8 full gate, vs refused put_nowait", "refusal_gate", 1.35),
    ("queue_full refusal, queue=0, vs refused put_nowait", "refusal_queue0", 1.35),
    ("refusal through the Flask extension vs a constant-JSON route", "flask_refusal", 1.2),
)
#: The text report's labels: pair, subject, baseline.
LABELS = (
    ("fast_path", "fast path: g = lim.acquire(); g.release()",
     "BoundedSemaphore(2) acquire+release"),
    ("fast_path_with", "fast path: with lim.acquire(): pass", "with BoundedSemaphore(2): pass"),
    ("refusal_gate", "refusal queue_full, queue=8 gate full",
     "full Queue put_nowait + except Full"),
    ("refusal_queue0", "refusal queue_full, queue=0 (no gate)",
     "full Queue put_nowait + except Full"),
    ("flask_refusal", "Flask request refused by ReachLimit (429)",
     "Flask request, constant jsonify (200)"),
)  # fmt: skip


# -- what is timed ------------------------------------------------------------------------------


class CountingClock:
    """A monotonic clock that counts its readers: the refusal path must never read it."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return time.monotonic()


class FullGate:
    """A ``ColdLimiter(active=2, queue=8)`` with both slots held and eight leaders parked in its
    queue, each in its own thread with a long wait. ``close()`` releases the two grants; the
    hand-offs then promote and release every parked waiter in turn."""

    def __init__(self) -> None:
        self.clock = CountingClock()
        self.limiter = ColdLimiter(active=2, queue=8, wait=PARKED_WAIT_S, clock=self.clock)
        self.grants = [self.limiter.acquire(), self.limiter.acquire()]
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._park, name=f"parked-{i}", daemon=True) for i in range(8)
        ]
        for t in self.threads:
            t.start()
        wait_until("the eight waiters parked", lambda: self.limiter.stats().queued == 8,
                   timeout=10, interval=0.001)  # fmt: skip

    def _park(self) -> None:
        try:
            self.limiter.acquire().release()
        except BaseException as exc:  # recorded and reported, never silent
            self.errors.append(exc)

    def still_full(self) -> bool:
        s = self.limiter.stats()
        return s.active == 2 and s.queued == 8 and s.rejected_timeout == 0

    def close(self) -> None:
        for g in self.grants:
            g.release()
        for t in self.threads:
            t.join(timeout=10)
        if any(t.is_alive() for t in self.threads) or self.errors:
            raise RuntimeError(f"parked waiters did not finish cleanly: {self.errors}")


def check_refusal(lim: ColdLimiter, clock: CountingClock | None, n: int = 1000) -> dict[str, Any]:
    """Refuse ``n`` times and check that only ``rejected_full`` moved and no clock was read."""
    before = lim.stats().as_dict()
    reads = clock.reads if clock else 0
    reasons = set()
    for _ in range(n):
        try:
            lim.acquire()
        except Busy as exc:
            reasons.add(exc.reason)
    after = lim.stats().as_dict()
    moved = {k for k in before if before[k] != after[k]}
    read = (clock.reads - reads) if clock else 0
    ok = (reasons == {"queue_full"} and moved == {"rejected_full"}
          and after["rejected_full"] - before["rejected_full"] == n and read == 0)  # fmt: skip
    return {"ok": ok, "reasons": sorted(reasons), "moved": sorted(moved), "clock_reads": read}


def refuse_loop(acquire: Callable[[], object], exc: type[BaseException]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            try:
                acquire()
            except exc:
                pass

    return run


def lasting_blocks(refuse: Callable[[int], None], n: int, repeats: int) -> list[int]:
    """Blocks still allocated after ``n`` calls of ``refuse`` (after gc.collect), per repeat."""
    refuse(1000)  # warm up: first-call caches, the counter already a big int
    deltas = []
    for _ in range(repeats):
        gc.collect()
        before = sys.getallocatedblocks()
        refuse(n)
        gc.collect()
        deltas.append(sys.getallocatedblocks() - before)
    return deltas


def flask_refusal() -> Iterator[Pair]:
    """A refused request through ReachLimit against a constant-JSON route of the same app."""
    from flask import Flask, jsonify
    from werkzeug.test import EnvironBuilder

    from reachlimit.flask import ReachLimit

    app = Flask("micro")
    rl = ReachLimit(app, active=1, queue=0)
    constant = {"error": "Too many reports are being built right now; please retry shortly.",
                "retryAfter": 2}  # fmt: skip

    # Both routes take a key from the URL, so both sides do the same routing work.
    @app.get("/constant/<key>")
    def constant_json(key: str) -> Any:
        return jsonify(constant)

    @app.get("/cold/<key>")
    def cold(key: str) -> Any:
        return rl.cold(key, lambda: {"key": key})

    statuses: list[str] = []
    request = wsgi_caller(app, statuses)
    constant_env = EnvironBuilder(path="/constant/k").get_environ()
    refused_env = EnvironBuilder(path="/cold/k").get_environ()
    with app.app_context():
        held = rl.path.limiter.acquire()
    try:
        # What is timed must be what it claims: a 200 constant, a queue_full 429.
        assert json.loads(request(constant_env)) == constant and statuses[-1].startswith("200")
        refused = json.loads(request(refused_env))
        assert statuses[-1].startswith("429") and refused["retryAfter"] == 2, statuses[-1]

        def checks() -> dict[str, Any]:
            with app.app_context():
                figures = rl.stats()
            return {"refusals_counted": figures.rejected_full, "builds": figures.builds}

        yield Pair("flask_refusal", wsgi_side("constant", request, constant_env),
                   wsgi_side("refused", request, refused_env), checks)  # fmt: skip
    finally:
        held.release()


def pairs(worker: Worker) -> Iterator[Pair]:
    args = worker.args
    lim = ColdLimiter(active=2, queue=8)
    sem = threading.BoundedSemaphore(2)
    names: dict[str, Any] = {"lim": lim, "sem": sem}
    yield Pair("fast_path", statement("semaphore", "sem.acquire(); sem.release()", names),
               statement("limiter", "g = lim.acquire(); g.release()", names))  # fmt: skip
    yield Pair("fast_path_with", statement("semaphore", "with sem: pass", names),
               statement("limiter", "with lim.acquire(): pass", names))  # fmt: skip
    assert lim.stats().active == 0

    full_q: queue.Queue[None] = queue.Queue(maxsize=1)
    full_q.put_nowait(None)
    put = refuse_loop(lambda: full_q.put_nowait(None), queue.Full)

    def refusals(key: str, lim: ColdLimiter, clock: CountingClock | None,
                 more: Callable[[], dict[str, Any]] = dict) -> Pair:  # fmt: skip
        names = {"q": full_q, "Full": queue.Full, "lim": lim, "Busy": Busy}
        return Pair(key, statement("put_nowait", "try:\n    q.put_nowait(None)\n"
                                   "except Full:\n    pass", names),
                    statement("refused", "try:\n    lim.acquire()\nexcept Busy:\n    pass", names),
                    lambda: {"check": check_refusal(lim, clock), **more()})  # fmt: skip

    blocks: dict[str, Any] = {}
    gate = FullGate()
    try:
        yield refusals("refusal_gate", gate.limiter, gate.clock,
                       lambda: {"still_full": gate.still_full()})  # fmt: skip
        if worker.first:
            blocks["refusal_gate"] = lasting_blocks(refuse_loop(gate.limiter.acquire, Busy),
                                                    args.refusals, args.repeats)  # fmt: skip
    finally:
        gate.close()

    zlim = ColdLimiter(active=2, queue=0)
    held = [zlim.acquire(), zlim.acquire()]
    yield refusals("refusal_queue0", zlim, None)
    if worker.first:
        blocks["refusal_queue0"] = lasting_blocks(refuse_loop(zlim.acquire, Busy),
                                                  args.refusals, args.repeats)  # fmt: skip
        blocks["baseline_put_nowait"] = lasting_blocks(put, args.refusals, args.repeats)
        worker.extra["allocations"] = {"refusals": args.refusals, "repeats": args.repeats,
                                       **blocks}  # fmt: skip
    for g in held:
        g.release()

    yield from flask_refusal()


# -- the report ---------------------------------------------------------------------------------


def goals(results: dict[str, Any], refusals: int) -> list[dict[str, Any]]:
    out = _paired.ratio_goals(GOALS, results)
    a = results["allocations"]
    worst = max(abs(d) for d in a["refusal_gate"] + a["refusal_queue0"])
    out.append(_report.goal(f"lasting blocks over {refusals:,} refusals (worst repeat, both paths)",
                            f"~0 (|delta| <= {ALLOC_TOLERANCE_BLOCKS})", worst,
                            worst <= ALLOC_TOLERANCE_BLOCKS))  # fmt: skip
    return out


def render(report: dict[str, Any]) -> str:
    r = report["results"]
    out = [*_report.head("reachlimit micro-benchmarks", report),
           _paired.timing_line(r["fast_path"]), ""]
    out += _paired.table([(a, b, r[key]) for key, a, b in LABELS], SPEC)
    for key, label in (("refusal_gate", "queue=8"), ("refusal_queue0", "queue=0")):
        c = r[key]["check"]
        extra = "" if key != "refusal_gate" else \
            f"; gate still full after timing: {'yes' if r[key]['still_full'] else 'NO'}"
        out.append(f"check {label}: 1000 refusals a process -> reasons {sorted(set(c['reasons']))}"
                   f", counters moved {sorted(set(c['moved']))}, clock reads {c['clock_reads']}: "
                   f"{'ok' if c['ok'] else 'FAILED'}{extra}")  # fmt: skip
    a = r["allocations"]
    out += ["", f"lasting allocated blocks after {a['refusals']:,} refusals (gc.collect "
            "before/after), per repeat:",
            f"  queue=8 full gate        {a['refusal_gate']}",
            f"  queue=0                  {a['refusal_queue0']}",
            f"  baseline put_nowait      {a['baseline_put_nowait']}", ""]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _paired.parser(__doc__, SPEC)
    p.add_argument("--refusals", type=int, default=50_000,
                   help="refusals in the allocation check (default 50000)")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats of the allocation check (default 3, quick 1)")
    plots.add_option(p)
    run = _paired.Session(__file__, p, SPEC, pairs, argv)
    args = run.args
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.refusals < 1 or args.repeats < 1:
        p.error("--refusals and --repeats must be >= 1")
    if run.in_worker:
        return run.work()
    group = run.group()
    results = _paired.results(group, SPEC)
    figures = _paired.ratio_figures(results)
    results["allocations"] = group.extra["allocations"]
    return run.finish(render, config={"refusals": args.refusals, "repeats": args.repeats},
                      results=results, goals=goals(results, args.refusals), figures=figures,
                      draw=plots.micro)


if __name__ == "__main__":
    sys.exit(main())
