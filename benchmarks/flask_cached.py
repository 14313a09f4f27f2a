#!/usr/bin/env python3
"""What ``@rl.cached()`` costs a request, against what it replaces, in one process.

    python benchmarks/flask_cached.py            # about 15 s
    python benchmarks/flask_cached.py --quick    # a few seconds, rough figures

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

The pairs are timed by ``_paired.py`` (alternating rounds in worker processes, the median of
the rounds' ratios). Before timing, every route is checked to answer what it claims (the same
body and a ``Cache-Status`` hit for both warm routes, a 429 for the refusal); after, the app's
figures confirm that nothing was built while timing (``builds``: the two warm-ups of each
process) and that every refused request was counted.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import _paired
import _report
from _paired import Pair, Spec, Worker, wsgi_caller, wsgi_side

SPEC = Spec("flask_cached", sides=("baseline", "limiter"), unit="ns", rounds=41)
#: The decorator's goals: (name, result, highest ratio).
GOALS = (
    ("warm hit through @rl.cached() vs the same view around rl.cold()", "warm_hit", 1.05),
    ("refusal through @rl.cached() vs a constant-JSON route", "refusal", 1.2),
)
#: The text report's labels: pair, subject, baseline.
LABELS = (
    ("warm_hit", "warm hit, @rl.cached() view", "the same view around rl.cold()"),
    ("refusal", "refused by @rl.cached() view (429)", "constant jsonify (200)"),
    ("refusal_vs_cold", "refused by @rl.cached() view (429)", "the view around rl.cold() (429)"),
)
QUERY = "b=2&a=1"


def report_of(key: str) -> dict[str, Any]:
    """What both warm views build: a small report."""
    return {"key": key, "rows": [1, 2, 3], "total": 6}


def pairs(worker: Worker) -> Iterator[Pair]:
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

    def side(name: str) -> _paired.Side:
        return wsgi_side(name, call, envs[name])

    def figures() -> Any:
        with app.app_context():
            return rl.stats()

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
        # Nothing built while timing (the two warm-ups only); every timed request a hit.
        yield Pair("warm_hit", side("hand"), side("cached"),
                   lambda: {"builds": figures().builds, "hits_counted": figures().hits})
        before = figures().rejected_full
        yield Pair("refusal", side("constant"), side("refused"),
                   lambda: {"builds": figures().builds,
                            "refusals_counted": figures().rejected_full - before})
        yield Pair("refusal_vs_cold", side("hand_refused"), side("refused"))
    finally:
        held.release()
    rl.close(app)


def render(report: dict[str, Any]) -> str:
    r = report["results"]
    out = [*_report.head("reachlimit @rl.cached() through a whole WSGI request", report),
           _paired.timing_line(r["warm_hit"]), ""]
    out += _paired.table([(a, b, r[key]) for key, a, b in LABELS], SPEC)
    out += [f"check: builds {r['warm_hit']['builds']} (2 warm-ups a process, none while timing), "
            f"refusals counted {r['refusal']['refusals_counted']:,}", ""]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    run = _paired.Session(__file__, _paired.parser(__doc__, SPEC), SPEC, pairs, argv)
    if run.in_worker:
        return run.work()
    results = _paired.results(run.group(), SPEC)
    return run.finish(render, results=results, goals=_paired.ratio_goals(GOALS, results),
                      figures=_paired.ratio_figures(results))


if __name__ == "__main__":
    sys.exit(main())
