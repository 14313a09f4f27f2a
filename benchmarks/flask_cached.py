#!/usr/bin/env python3
"""What ``@rl.cached()`` costs a request, against what it replaces, in one process.

    python benchmarks/flask_cached.py            # full run, about 15 s
    python benchmarks/flask_cached.py --quick    # a few seconds, rough figures
    python benchmarks/flask_cached.py --json     # the same figures as JSON on stdout

Each figure is a whole WSGI request (``app(environ, start_response)``, body read and closed;
no server, no socket) to one app (``ReachLimit(app, active=1, queue=0)``, TTL one hour, no
stale window), against a baseline route of the same app timed in the same run:

(a) warm hit: ``GET /cached/k?b=2&a=1`` answered from the cache by a view decorated with
    ``@rl.cached()``, against ``GET /hand/k?b=2&a=1``: the same view written by hand around
    ``rl.cold()`` (the same key: its path and its sorted query pairs; its dict returned for
    Flask to turn into JSON). Goal: <= 1.05x - the decorator is a way of writing that view,
    not a layer of its own.
(b) refusal: ``GET /cached/cold`` refused by the decorated view (``queue_full``: the limiter's
    one slot is held while timing), against a route returning a constant JSON (``jsonify`` of
    a dict the size of the refusal's body), as ``micro.py`` does for ``rl.cold()``.
    Goal: <= 1.2x. Shown beside it, not judged: the same refusal against ``GET /hand/cold``
    refused by the hand-written view, which is what the decorator itself adds to a refusal.

Both pairs are timed in alternating rounds (the baseline first on even rounds); the ratio
judged is the median of the per-round ratios, the best-of-rounds ratio and the spread beside
it. Before timing, every route is checked to answer what it claims (the same body and a
``Cache-Status`` hit for both warm routes, a 429 for the refusal); after, the figures confirm
that nothing was built while timing and that every refused request was counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import _common
from micro import goal, paired, wsgi_caller

#: The decorator's goals: (name, result, highest ratio).
GOALS = (
    ("warm hit through @rl.cached() vs the same view around rl.cold()", "warm_hit", 1.05),
    ("refusal through @rl.cached() vs a constant-JSON route", "refusal", 1.2),
)
QUERY = "b=2&a=1"


def report_of(key: str) -> dict[str, Any]:
    """What both warm views build: a small report."""
    return {"key": key, "rows": [1, 2, 3], "total": 6}


def run(number: int, rounds: int) -> dict[str, Any]:
    from flask import Flask, jsonify, request
    from werkzeug.test import EnvironBuilder

    from reachlimit.flask import ReachLimit

    app = Flask("flask_cached")
    app.config.update(REACHLIMIT_CACHE_TTL=3600)
    rl = ReachLimit(app, active=1, queue=0)
    constant = {"error": "Too many requests are being answered right now; retry shortly.",
                "retryAfter": 2, "budget": "default"}

    @app.get("/cached/<key>")
    @rl.cached()
    def cached(key: str) -> Any:
        return report_of(key)

    @app.get("/hand/<key>")
    def hand(key: str) -> Any:
        pairs = tuple(sorted(request.args.items(multi=True)))
        return rl.cold(("hand", request.path, pairs), lambda: report_of(key))

    @app.get("/constant/<key>")
    def constant_json(key: str) -> Any:
        return jsonify(constant)

    statuses: list[str] = []
    headers: list[Any] = []
    call = wsgi_caller(app, statuses, headers)
    envs = {
        name: EnvironBuilder(path=path, query_string=query).get_environ()
        for name, path, query in (
            ("hand", "/hand/k", QUERY), ("cached", "/cached/k", QUERY),
            ("constant", "/constant/k", ""), ("refused", "/cached/cold", ""),
            ("hand_refused", "/hand/cold", ""),
        )
    }

    def answer(name: str) -> tuple[str, Any, str]:
        body = json.loads(call(envs[name]))
        return statuses[-1], body, dict(headers[-1]).get("Cache-Status", "")

    # What is timed must be what it claims: both warm routes built once, then hits with the
    # same body; a constant 200; a queue_full 429 from the decorated view.
    for name in ("hand", "cached"):
        assert answer(name)[0].startswith("200")
    hand_answer, cached_answer = answer("hand"), answer("cached")
    assert hand_answer[1] == cached_answer[1] == report_of("k"), (hand_answer, cached_answer)
    assert "; hit" in hand_answer[2] and "; hit" in cached_answer[2], (hand_answer, cached_answer)
    with app.app_context():
        held = rl.path.limiter.acquire()
    try:
        assert answer("constant")[:2] == ("200 OK", constant)
        for name in ("refused", "hand_refused"):
            status, refused, _ = answer(name)
            assert status.startswith("429") and refused["retryAfter"] >= 1, (status, refused)
        ns = {"call": call, **{f"{name}_env": env for name, env in envs.items()}}
        warm = paired("call(hand_env)", "call(cached_env)", ns, number, rounds)
        refusal = paired("call(constant_env)", "call(refused_env)", ns, number, rounds)
        over_cold = paired("call(hand_refused_env)", "call(refused_env)", ns, number, rounds)
        with app.app_context():
            figures = rl.stats()
    finally:
        held.release()
    rl.close(app)
    # Nothing built while timing (the two warm-ups only); every timed refusal counted.
    warm["builds"] = refusal["builds"] = figures.builds
    warm["hits_counted"] = figures.hits
    refusal["refusals_counted"] = figures.rejected_full
    return {"warm_hit": warm, "refusal": refusal, "refusal_vs_cold": over_cold}


def render(report: dict[str, Any]) -> str:
    r, c = report["results"], report["config"]
    out = [
        "reachlimit @rl.cached() through a whole WSGI request",
        *_common.machine_lines(report["machine"]),
        f"timing:  {c['rounds']} alternating rounds x {c['number']:,} requests; "
        "ratio = median of per-round ratios (best-of ratio alongside)",
        "",
    ]
    rows = (
        ("warm hit, @rl.cached() view", "the same view around rl.cold()", r["warm_hit"]),
        ("refused by @rl.cached() view (429)", "constant jsonify (200)", r["refusal"]),
        ("refused by @rl.cached() view (429)", "the view around rl.cold() (429)",
         r["refusal_vs_cold"]),
    )
    w1 = max(len(a) for a, _, _ in rows)
    w2 = max(len(b) for _, b, _ in rows)
    head = (f"{'decorated':<{w1}}  {'us':>6}  {'baseline':<{w2}}  {'us':>6}  {'ratio':>6}  "
            f"{'best':>6}  {'spread':>11}")
    out += _common.ruled(head)
    for a, b, x in rows:
        lo, hi = x["ratio_spread"]
        out.append(
            f"{a:<{w1}}  {x['limiter_ns'] / 1000:6.1f}  {b:<{w2}}  "
            f"{x['baseline_ns'] / 1000:6.1f}  {x['ratio']:5.3f}x  {x['ratio_best']:5.3f}x  "
            f"{lo:4.2f}-{hi:4.2f}x"
        )
    out += [
        f"check: builds while timing {r['warm_hit']['builds'] - 2} (after 2 warm-ups), "
        f"refusals counted {r['refusal']['refusals_counted']:,}",
        "",
        "goals:",
    ]
    for g in report["goals"]:
        out.append(f"  [{'met' if g['met'] else 'MISSED':>6}] {g['goal']}: {g['value']:.3f}x "
                   f"(goal {g['target']})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "What @rl.cached() costs a warm hit and a refusal, as ratios against routes of the "
        "same app timed in the same run.",
        "small run (seconds): fewer rounds and requests, rough figures",
    )
    _common.optional(p, "--number", int, "requests per timed round (default 2000, quick 300)")
    _common.optional(p, "--rounds", int, "alternating rounds per pair (default 41, quick 7)")
    args: argparse.Namespace = p.parse_args(argv)
    number = args.number or (300 if args.quick else 2_000)
    rounds = args.rounds or (7 if args.quick else 41)
    if number < 1 or rounds < 1:
        p.error("--number and --rounds must be >= 1")
    machine = _common.machine()  # the load average at the start
    results = run(number, rounds)
    report = {
        "machine": machine,
        "config": {"number": number, "rounds": rounds, "quick": args.quick},
        "results": results,
        "goals": [
            goal(name, f"<= {most:g}x", results[key]["ratio"], results[key]["ratio"] <= most)
            for name, key, most in GOALS
        ],
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
