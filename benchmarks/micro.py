#!/usr/bin/env python3
"""Micro-benchmarks of ColdLimiter's two hot paths, each against a standard-library baseline.

    python benchmarks/micro.py            # full run, about 10 s
    python benchmarks/micro.py --quick    # a few seconds, rough figures
    python benchmarks/micro.py --json     # the same figures as JSON on stdout

What is measured, in one process, as ratios against a baseline timed in the same run:

(a) fast path: ``g = lim.acquire(); g.release()`` with a free slot, against a
    ``threading.BoundedSemaphore(2)`` ``acquire(); release()`` pair.
    Goal: <= 1.0x (stretch: <= 0.5x).
(b) queue_full refusal, against ``put_nowait`` refused by a full ``queue.Queue`` with
    ``queue.Full`` caught. Goal: <= 1.5x. Two limiters are measured:
      - the real full-gate path: ``queue=8``, both slots held, the gate full of eight parked
        waiter threads (each with a long wait), so the refusal really tries the gate;
      - ``queue=0``: no gate is built (``Queue(maxsize=0)`` would be unbounded).
(c) lasting allocations: ``sys.getallocatedblocks()`` after ``gc.collect()``, before and after
    50,000 refusals on each path. Goal: about 0 (we allow a handful of blocks of noise).
(d) a refusal through the Flask extension, a whole WSGI request (``app(environ,
    start_response)``, body read and closed; no server, no socket), against a route of the same
    app returning a constant JSON (``jsonify`` of a dict the size of the refusal's body).
    Goal: <= 1.2x - the refusal is the cheapest answer the service gives. The limiter runs
    with its one slot held and ``queue=0``, so every request is a ``queue_full`` refusal.

Each pair is timed in alternating rounds (baseline first on even rounds, limiter first on odd
rounds); a ratio is reported both as the median of the per-round ratios (the figure the goal
is judged on: both sides of a round saw the same machine load) and as best-of-rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import statistics
import sys
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

import _common
import plots
from _common import machine

from reachlimit import Busy, ColdLimiter

# A parked waiter must outlive the measurement; it is released explicitly at the end, so this
# long wait never has to run out (it only bounds the worst case if something goes wrong).
PARKED_WAIT_S = 600.0
# "About zero" lasting blocks over 50k refusals: a leak of even one block per refusal would
# show as 50,000; a handful is interpreter noise (a resized free list, an interned int).
ALLOC_TOLERANCE_BLOCKS = 16


# -- the machine ------------------------------------------------------------------------------





# -- timing -----------------------------------------------------------------------------------


def paired(
    base_stmt: str, cand_stmt: str, ns: dict[str, Any], number: int, rounds: int
) -> dict[str, Any]:
    """Time two statements in alternating rounds; return ns/op and their ratios."""
    base_s, cand_s = _common.alternating(
        timeit.Timer(base_stmt, globals=ns).timeit,
        timeit.Timer(cand_stmt, globals=ns).timeit,
        number,
        rounds,
    )
    base_ns = [x * 1e9 for x in base_s]
    cand_ns = [x * 1e9 for x in cand_s]
    return {
        "baseline_ns": min(base_ns),
        "limiter_ns": min(cand_ns),
        "baseline_ns_median": statistics.median(base_ns),
        "limiter_ns_median": statistics.median(cand_ns),
        **_common.ratios(base_ns, cand_ns),
        "rounds": rounds,
        "ops_per_round": number,
    }


def lasting_blocks(refuse: Any, n: int, repeats: int) -> list[int]:
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


def refuse_loop(acquire: Any, exc: type[BaseException]) -> Any:
    def run(n: int) -> None:
        for _ in range(n):
            try:
                acquire()
            except exc:
                pass

    return run


# -- set-ups ----------------------------------------------------------------------------------


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
        deadline = time.monotonic() + 10
        while self.limiter.stats().queued < 8:
            if time.monotonic() > deadline:
                raise RuntimeError("the eight waiters did not park within 10 s")
            time.sleep(0.001)

    def _park(self) -> None:
        try:
            self.limiter.acquire().release()
        except BaseException as exc:  # recorded and reported, never silent
            self.errors.append(exc)

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
    ok = (
        reasons == {"queue_full"}
        and moved == {"rejected_full"}
        and after["rejected_full"] - before["rejected_full"] == n
        and (clock.reads if clock else 0) == reads
    )
    return {
        "ok": ok,
        "reasons": sorted(reasons),
        "moved": sorted(moved),
        "clock_reads": (clock.reads - reads) if clock else 0,
    }


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    number, rounds = args.number, args.rounds
    results: dict[str, Any] = {}

    # (a) fast path
    lim = ColdLimiter(active=2, queue=8)
    sem = threading.BoundedSemaphore(2)
    ns: dict[str, Any] = {"lim": lim, "sem": sem}
    results["fast_path"] = paired(
        "sem.acquire(); sem.release()", "g = lim.acquire(); g.release()", ns, number, rounds
    )
    results["fast_path_with"] = paired(
        "with sem: pass", "with lim.acquire(): pass", ns, number, rounds
    )
    assert lim.stats().active == 0

    # (b) refusals
    full_q: queue.Queue[None] = queue.Queue(maxsize=1)
    full_q.put_nowait(None)
    refuse_q = "try:\n    q.put_nowait(None)\nexcept Full:\n    pass"
    refuse_l = "try:\n    lim.acquire()\nexcept Busy:\n    pass"

    def refusals_paired(lim: ColdLimiter) -> dict[str, Any]:
        """A refused ``put_nowait`` on a full queue against a refused ``lim.acquire()``."""
        names = {"q": full_q, "Full": queue.Full, "lim": lim, "Busy": Busy}
        return paired(refuse_q, refuse_l, names, number, rounds)

    gate = FullGate()
    try:
        glim = gate.limiter
        results["refusal_gate"] = refusals_paired(glim)
        results["refusal_gate"]["check"] = check_refusal(glim, gate.clock)
        blocks_gate = lasting_blocks(refuse_loop(glim.acquire, Busy), args.refusals, args.repeats)
        s = glim.stats()
        results["refusal_gate"]["still_full"] = (
            s.active == 2 and s.queued == 8 and s.rejected_timeout == 0
        )
    finally:
        gate.close()

    zlim = ColdLimiter(active=2, queue=0)
    held = [zlim.acquire(), zlim.acquire()]
    results["refusal_queue0"] = refusals_paired(zlim)
    results["refusal_queue0"]["check"] = check_refusal(zlim, None)
    blocks_q0 = lasting_blocks(refuse_loop(zlim.acquire, Busy), args.refusals, args.repeats)
    for g in held:
        g.release()

    blocks_base = lasting_blocks(
        refuse_loop(lambda: full_q.put_nowait(None), queue.Full), args.refusals, args.repeats
    )
    results["allocations"] = {
        "refusals": args.refusals,
        "repeats": args.repeats,
        "baseline_put_nowait": blocks_base,
        "refusal_gate": blocks_gate,
        "refusal_queue0": blocks_q0,
    }

    # (d) a whole request: a few tens of microseconds, so fewer of them per round
    results["flask_refusal"] = flask_refusal(max(1, number // 20), rounds)

    worst = max(abs(d) for d in blocks_gate + blocks_q0)
    ratio_goals = (  # (goal, result, highest ratio)
        ("fast path vs BoundedSemaphore(2) pair", "fast_path", 1.0),
        ("fast path, stretch", "fast_path", 0.5),
        ("queue_full refusal, queue=8 full gate, vs refused put_nowait", "refusal_gate", 1.5),
        ("queue_full refusal, queue=0, vs refused put_nowait", "refusal_queue0", 1.5),
        ("refusal through the Flask extension vs a constant-JSON route", "flask_refusal", 1.2),
    )
    goals = [
        goal(name, f"<= {most:.1f}x", results[key]["ratio"], results[key]["ratio"] <= most)
        for name, key, most in ratio_goals
    ]
    goals.append(
        goal(
            f"lasting blocks over {args.refusals:,} refusals (worst repeat, both paths)",
            f"~0 (|delta| <= {ALLOC_TOLERANCE_BLOCKS})",
            worst,
            worst <= ALLOC_TOLERANCE_BLOCKS,
        )
    )
    return {
        "machine": machine(),
        "config": {
            "number": number,
            "rounds": rounds,
            "refusals": args.refusals,
            "repeats": args.repeats,
            "quick": args.quick,
        },
        "results": results,
        "goals": goals,
    }


def wsgi_caller(
    app: Any, statuses: list[str], headers: list[Any] | None = None
) -> Callable[[dict[str, Any]], bytes]:
    """``request(environ) -> body``: one whole WSGI request to ``app`` (body read and closed),
    its status appended to ``statuses`` (and its headers to ``headers``, when given)."""

    def start_response(status: str, response_headers: Any, exc_info: Any = None) -> None:
        statuses.append(status)
        if headers is not None:
            headers.append(response_headers)

    def request(environ: dict[str, Any]) -> bytes:
        body = app(dict(environ), start_response)
        try:
            return b"".join(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    return request


def flask_refusal(number: int, rounds: int) -> dict[str, Any]:
    """(d): a refused request through ReachLimit against a constant-JSON route, same app."""
    from flask import Flask, jsonify
    from werkzeug.test import EnvironBuilder

    from reachlimit.flask import ReachLimit

    app = Flask("micro")
    rl = ReachLimit(app, active=1, queue=0)
    constant = {"error": "Too many reports are being built right now; please retry shortly.",
                "retryAfter": 2}

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
        ns = {"request": request, "constant_env": constant_env, "refused_env": refused_env}
        result = paired("request(constant_env)", "request(refused_env)", ns, number, rounds)
        with app.app_context():
            figures = rl.stats()
        result["refusals_counted"] = figures.rejected_full
        result["builds"] = figures.builds
    finally:
        held.release()
    return result


def goal(name: str, target: str, value: float, met: bool) -> dict[str, Any]:
    return {"goal": name, "target": target, "value": value, "met": bool(met)}


# -- output -----------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    m, r = report["machine"], report["results"]
    out = [
        "reachlimit micro-benchmarks",
        *_common.machine_lines(m),
        f"timing:  {report['config']['rounds']} alternating rounds x "
        f"{report['config']['number']:,} ops; "
        "ratio = median of per-round ratios (best-of ratio alongside)",
        "",
    ]
    rows = [
        (
            "fast path: g = lim.acquire(); g.release()",
            "BoundedSemaphore(2) acquire+release",
            r["fast_path"],
        ),
        (
            "fast path: with lim.acquire(): pass",
            "with BoundedSemaphore(2): pass",
            r["fast_path_with"],
        ),
        (
            "refusal queue_full, queue=8 gate full",
            "full Queue put_nowait + except Full",
            r["refusal_gate"],
        ),
        (
            "refusal queue_full, queue=0 (no gate)",
            "full Queue put_nowait + except Full",
            r["refusal_queue0"],
        ),
        (
            "Flask request refused by ReachLimit (429)",
            "Flask request, constant jsonify (200)",
            r["flask_refusal"],
        ),
    ]
    w1 = max(len(a) for a, _, _ in rows)
    w2 = max(len(b) for _, b, _ in rows)
    out.append(
        f"{'limiter':<{w1}}  {'ns/op':>6}  {'baseline':<{w2}}  {'ns/op':>6}  "
        f"{'ratio':>6}  {'best':>6}  {'spread':>11}"
    )
    out.append("-" * (w1 + w2 + 46))
    for a, b, x in rows:
        lo, hi = x["ratio_spread"]
        out.append(
            f"{a:<{w1}}  {x['limiter_ns']:6.0f}  {b:<{w2}}  {x['baseline_ns']:6.0f}  "
            f"{x['ratio']:5.2f}x  {x['ratio_best']:5.2f}x  {lo:4.2f}-{hi:4.2f}x"
        )
    for key, label in (("refusal_gate", "queue=8"), ("refusal_queue0", "queue=0")):
        c = r[key]["check"]
        extra = (
            ""
            if key != "refusal_gate"
            else (f"; gate still full after timing: {'yes' if r[key]['still_full'] else 'NO'}")
        )
        out.append(
            f"check {label}: 1000 refusals -> reasons {c['reasons']}, counters moved "
            f"{c['moved']}, clock reads {c['clock_reads']}: "
            f"{'ok' if c['ok'] else 'FAILED'}{extra}"
        )
    a = r["allocations"]
    out += [
        "",
        f"lasting allocated blocks after {a['refusals']:,} refusals (gc.collect before/after), "
        f"per repeat:",
        f"  queue=8 full gate        {a['refusal_gate']}",
        f"  queue=0                  {a['refusal_queue0']}",
        f"  baseline put_nowait      {a['baseline_put_nowait']}",
        "",
        "goals:",
    ]
    for g in report["goals"]:
        v = g["value"]
        vs = f"{v:.2f}x" if isinstance(v, float) else f"{v} blocks"
        out.append(
            f"  [{'met' if g['met'] else 'MISSED':>6}] {g['goal']}: {vs} (goal {g['target']})"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "Micro-benchmarks of ColdLimiter's fast path and queue_full refusal, "
        "as ratios against standard-library baselines timed in the same run.",
        "small run (seconds): fewer rounds and operations, rough figures",
    )
    _common.optional(p, "--number", int, "operations per timed round (default 20000, quick 5000)")
    p.add_argument(
        "--rounds", type=int, default=None, help="alternating rounds per pair (default 41, quick 7)"
    )
    p.add_argument(
        "--refusals",
        type=int,
        default=50_000,
        help="refusals in the allocation check (default 50000)",
    )
    _common.optional(p, "--repeats", int, "repeats of the allocation check (default 3, quick 1)")
    plots.add_option(p)
    args = p.parse_args(argv)
    if args.number is None:
        args.number = 5_000 if args.quick else 20_000
    if args.rounds is None:
        args.rounds = 7 if args.quick else 41
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.number < 1 or args.rounds < 1 or args.refusals < 1 or args.repeats < 1:
        p.error("--number, --rounds, --refusals and --repeats must be >= 1")
    report = run(args)
    if args.plot is not None:
        plots.micro(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
