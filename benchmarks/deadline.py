#!/usr/bin/env python3
"""No wasted waits (issue 30): REACHLIMIT_DEADLINE off against on, under steady overload.

    python benchmarks/deadline.py            # 2 rounds, 12 s per variant, both set-ups: ~10 min
    python benchmarks/deadline.py --quick    # 1 round, 4 s per variant, one worker only

The question: when the queue drains slower than the wait (builds of 1 s and 1.5 s with the
shipped limits: active 2, queue 8, wait 3 s), the last places of a full queue can never start
in time; are their leaders now told so at once instead of after their whole wait, and does
goodput (builds per second against the limit) stay where it was? And with quick builds
(0.1 s), where every place starts in time, does nothing change?

Each variant runs on fresh gunicorn servers (``_load.Server``: ``benchmarks/app.py``, the
extension configured from the ``REACHLIMIT_*`` environment, a build that sleeps
``BENCH_BUILD_MS``, counted in the worker or, on Redis, in Redis), so each one learns its
estimate of build time from nothing:

  single   one gunicorn server, one gthread worker: the in-process ColdLimiter
  shared   ``--servers`` (2) x ``--workers`` (2) on one Redis the script starts (the shared
           limiter: the estimate and the decision in its scripts); not in ``--quick``

The load (``_load.open_loop``): distinct cold keys, each request in its own thread whatever
the others do, at ``--overload`` (2) times the limit (``active / build``), for a lead of
``wait + 3 builds`` (the estimate is learnt there, not measured) and then ``--duration``
seconds measured.
Requests are spread over the servers round-robin. The app answers each request with the
seconds it spent waiting in the handler (until its build started, or until its refusal:
``X-Bench-Waited-Ms``) and the refusal's reason (``X-Bench-Refusal``).

Figures per variant, over the requests sent in the measured window: answers by status and
refusal reason; **whole waits** (refusals after waiting the whole wait: ``timeout``); refusal
latency p50/p99 (client side); **handler-thread-seconds spent waiting** (the sum of the waits,
and per second: how many handler threads sat parked on average); **goodput** (builds finished
in the window per second, and as a share of the limit); the most builds at once; the limiter's
own counts. Variants alternate (off first on odd rounds, on first on even ones).

``issue 30's burst`` (in process, Flask's test client, the issue's numbers): ``active=1,
queue=8, wait=1 s``, builds of 0.4 s; three bursts of nine teach the estimate, then one more
burst of nine is measured: how many got in, how many were refused at once, how many after
their whole wait. A burst that follows an idle moment meets a holder that took a free slot
on the fast path, whose start the limiter does not know (the fast path never reads the
clock): it is counted as ending now, so the place at the edge of the wait may still wait.

Goals: with builds of 1 s and 1.5 s, deadline on leaves about no whole waits (at most 5 % of
off's, and at most 1); goodput on within 10 % of off's; with builds of 0.1 s no deadline
refusal at all; nothing above ``active`` at once, no 5xx, no error.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import _load
import _report
from _load import Answer, Request
from _report import fmt, ms, pct

SETUPS = ("single", "shared")
VARIANTS = ("off", "on")
BUILDS_S = (0.1, 1.0, 1.5)
REASONS = ("queue_full", "deadline", "timeout", "displaced")
#: A refusal answered within this much of its arrival was refused at once.
AT_ONCE_S = 0.1
GOAL_WHOLE_WAIT_SHARE = 0.05
GOAL_GOODPUT_RATIO = 0.90


# -- configuration ------------------------------------------------------------------------


@dataclass
class Config(_load.Budget):
    builds: list[float]
    overload: float
    duration_s: float
    servers: int
    workers: int
    threads: int
    rounds: int
    client_timeout_s: float

    def lead_s(self, build_s: float) -> float:
        """The unmeasured start of a variant: the queue fills and four promoted builds have
        been timed (the estimate), with room to spare."""
        return self.wait + 3 * build_s


# -- one variant ----------------------------------------------------------------------------


def figures(answers: list[Answer], cfg: Config, build_s: float, t0: float, t1: float
            ) -> dict[str, Any]:
    """The figures of the requests sent in [t0, t1) (goodput: builds finished in it)."""
    sent = [a for a in answers if t0 <= a.start < t1]
    status = Counter(
        "error" if a.status is None else str(a.status) if a.status in (200, 429) else "other"
        for a in sent
    )
    refused = [a for a in sent if a.status == 429]
    reasons = Counter(a.reason or "unknown" for a in refused)
    whole = [a for a in refused if a.reason == "timeout"]
    finished = [a for a in answers if a.status == 200 and t0 <= a.end < t1]
    waited = sum(a.waited for a in sent)
    span = t1 - t0
    goodput = len(finished) / span
    return {
        "requests": len(sent),
        "status": {k: status[k] for k in ("200", "429", "other", "error")},
        "refusals": {k: reasons[k] for k in (*REASONS, "unknown")},
        "whole_waits": len(whole),
        "refused_at_once": sum(a.latency <= AT_ONCE_S for a in refused),
        "refusal_p50_ms": ms(pct([a.latency for a in refused], 50)),
        "refusal_p99_ms": ms(pct([a.latency for a in refused], 99)),
        "wait_thread_s": waited,
        "waiting_threads": waited / span,
        "goodput_per_s": goodput,
        "goodput_pct": 100 * goodput / (cfg.active / build_s),
        "errors": sorted({a.error for a in sent if a.error}),
    }


def run_variant(setup: str, variant: str, build_s: float, rnd: int, cfg: Config,
                where: _load.Place) -> dict[str, Any]:  # fmt: skip
    """Fresh servers (and, for ``shared``, an emptied Redis), the lead, the measured load."""
    env = {"REACHLIMIT_DEADLINE": "true" if variant == "on" else "false",
           "REACHLIMIT_WAIT": repr(cfg.wait),
           "REACHLIMIT_CLIENT": "none",  # one client: the plain FIFO queue of the issue
           "BENCH_BUILD_MS": repr(build_s * 1000)}  # fmt: skip
    loadavg = _report.loadavg()[0]
    tag = uuid.uuid4().hex[:8]
    answers: list[Answer] = []
    rate = cfg.overload * cfg.active / build_s
    lead = cfg.lead_s(build_s)
    with where.servers(setup, f"{setup}-{build_s:g}-{variant}-r{rnd}", env, cfg.servers,
                       cfg.workers, cfg.threads) as servers:  # fmt: skip
        ports = [s.port for s in servers]
        seen = {s.stats()["deadline"] for s in servers}
        before = servers[0].stats()

        def send(i: int) -> None:
            answers.append(_load.get(ports[i % len(ports)], f"/report?key=cold-{tag}-{i}",
                                     "cold", cfg.client_timeout_s))  # fmt: skip

        cap = int(rate * (lead + cfg.duration_s)) + 1
        join_s = cfg.wait + build_s + cfg.client_timeout_s + _load.JOIN_MARGIN_S
        t_start = time.time()
        with _load.open_loop(send, 1 / rate, cap, join_s, "load") as stuck:
            time.sleep(lead)  # the estimate is learnt here, not measured
            t0 = time.time()
            time.sleep(cfg.duration_s)  # the measured phase
        t1 = t0 + cfg.duration_s
        elapsed = time.time() - t_start
        after = servers[0].stats()
        estimates = sorted({s.stats()["estimate"] for s in servers}, key=str)
        if setup == "shared":  # the budget's, as Redis keeps it (the default budget's keys)
            raw = where.client.hget("{reachlimit:cold}:stats", "estimate_ms")
            estimates = [int(raw) / 1000 if raw is not None else None]
    return {
        "setup": setup,
        "build_s": build_s,
        "variant": variant,
        "round": rnd,
        "deadline_seen": sorted(seen, key=str),
        "loadavg_1m": loadavg,
        "elapsed_s": elapsed,
        "rate_per_s": rate,
        "estimate_s": estimates,
        **figures(list(answers), cfg, build_s, t0, t1),
        # Over the whole variant, lead included: every answer, and every build run.
        "answers_total": len(answers),
        "answered_200_total": sum(a.status == 200 for a in answers),
        "refused_total": sum(a.status == 429 for a in answers),
        "builds_started": after["builds"]["started"],
        "max_in_flight": after["builds"]["max_in_flight"],
        "limiter": _load.limiter_delta(before["reach"], after["reach"]),
        "stuck": stuck[0],
        "server_tracebacks": sum(s.tracebacks() for s in servers),
    }


# -- issue 30's burst, in process -------------------------------------------------------------


def burst(deadline: bool, teach: int = 3, size: int = 9, build_s: float = 0.4) -> dict[str, Any]:
    """The issue's numbers through Flask's test client: ``teach`` bursts of ``size`` teach
    the estimate, one more is measured."""
    from flask import Flask, jsonify

    from reachlimit.flask import ColdRefused, ReachLimit

    app = Flask("burst")
    rl = ReachLimit(app, active=1, queue=8, wait=1.0, deadline=deadline, client="none")

    @app.get("/r/<key>")
    def report(key: str) -> Any:
        arrived = time.perf_counter()
        try:
            return jsonify(rl.cold(key, lambda: time.sleep(build_s) or key))
        except ColdRefused as refused:
            refused.response.headers["X-Bench-Refusal"] = refused.busy.reason
            refused.response.headers["X-Bench-Waited-Ms"] = str(
                (time.perf_counter() - arrived) * 1000)
            raise

    def send(_: int, req: Request) -> Answer:
        start, began = time.time(), time.perf_counter()
        reply = app.test_client().get(f"/r/{req.key}")
        return Answer("cold", req.key, start, time.perf_counter() - began, reply.status_code,
                      headers={k.lower(): v for k, v in reply.headers.items()})

    def one_burst(n: int) -> list[Answer]:
        burst = [Request(0.0, "cold", f"b{n}-{i}") for i in range(size)]
        return _load.release(burst, send, 30)[0]

    for n in range(teach):
        one_burst(n)
    with app.app_context():
        estimate = rl.path.limiter.build_estimate  # type: ignore[attr-defined]
    measured = one_burst(teach)
    refused = [a for a in measured if a.status == 429]
    return {
        "deadline": deadline,
        "estimate_s": estimate,
        "admitted": sum(a.status == 200 for a in measured),
        "refused_at_once": sum(a.latency <= AT_ONCE_S for a in refused),
        "whole_waits": sum(a.reason == "timeout" for a in refused),
        "refusals": dict(Counter(a.reason for a in refused)),
        "refusal_p50_ms": ms(pct([a.latency for a in refused], 50)),
        "wait_thread_s": sum(a.waited for a in refused),
    }


# -- judging and output -----------------------------------------------------------------------


def drains_slower_than_the_wait(cfg: Config, build_s: float) -> bool:
    """Whether the last place of a full queue starts after the wait: ``queue // active``
    rounds of builds ahead of it, the holders' rest not counted."""
    return (cfg.queue // cfg.active) * build_s > cfg.wait


def compare(results: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Off against on, per set-up and build (the rounds added up), with the goals."""
    out = []
    keys = sorted({(r["setup"], r["build_s"]) for r in results}, key=lambda k: (k[0], k[1]))
    for setup, build_s in keys:
        rows = {v: [r for r in results if (r["setup"], r["build_s"], r["variant"]) ==
                    (setup, build_s, v)] for v in VARIANTS}  # fmt: skip
        if not all(rows.values()):
            continue

        def total(v: str, f: str, rows: dict[str, list[dict[str, Any]]] = rows) -> float:
            return float(sum(r[f] for r in rows[v]))

        def mean(v: str, f: str, rows: dict[str, list[dict[str, Any]]] = rows) -> float:
            return total(v, f) / len(rows[v])

        whole_off, whole_on = total("off", "whole_waits"), total("on", "whole_waits")
        good_off, good_on = mean("off", "goodput_per_s"), mean("on", "goodput_per_s")
        ratio = good_on / good_off if good_off else None
        deadline_on = total("on", "refusals_deadline")
        met: dict[str, bool] = {
            "goodput_within_10pct": ratio is not None and ratio >= GOAL_GOODPUT_RATIO,
            "clean": all(
                r["max_in_flight"] <= r["limiter_active"] and not r["stuck"]
                and not r["server_tracebacks"] and not r["errors"]
                and r["status"]["other"] == r["status"]["error"] == 0
                for v in VARIANTS for r in rows[v]
            ),
        }
        if drains_slower_than_the_wait(cfg, build_s):
            met["about_no_whole_waits"] = whole_on <= min(
                max(1.0, GOAL_WHOLE_WAIT_SHARE * whole_off), max(1.0, whole_off))
        else:
            met["no_deadline_refusal"] = deadline_on == 0
        out.append({
            "setup": setup, "build_s": build_s,
            "whole_waits": [whole_off, whole_on],
            "refusal_p99_ms": [mean("off", "refusal_p99_ms_n"), mean("on", "refusal_p99_ms_n")],
            "waiting_threads": [mean("off", "waiting_threads"), mean("on", "waiting_threads")],
            "goodput_per_s": [good_off, good_on],
            "goodput_ratio": ratio,
            "deadline_refusals_on": deadline_on,
            "met": met,
        })  # fmt: skip
    return out


def flatten(row: dict[str, Any], active: int) -> None:
    """Fields ``compare`` adds up, set on each result row."""
    row["refusals_deadline"] = row["refusals"]["deadline"]
    row["refusal_p99_ms_n"] = row["refusal_p99_ms"] or 0.0
    row["limiter_active"] = active


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    out = [
        *_load.head("reachlimit no wasted waits: REACHLIMIT_DEADLINE off against on", report),
        f"load:    distinct cold keys, open loop at {c['overload']:g}x the limit; "
        f"{c['duration_s']:g} s measured after a lead of wait + 3 builds; fresh servers per "
        "variant",
        "whole = refused after waiting the whole wait (timeout); at once = refused within "
        f"{AT_ONCE_S * 1000:g} ms; wait thr = handler-thread-seconds spent waiting per second "
        "(threads parked on average); goodput = builds finished per second, % of the limit",
        "",
    ]
    head = (
        f"{'setup':<6} {'build':>5} {'dl':>3} {'rnd':>3} {'load':>5} {'req':>5} {'200':>5} "
        f"{'full':>5} {'dline':>5} {'whole':>5} {'once':>5} {'p50':>6} {'p99':>6} "
        f"{'wait thr':>8} {'goodput':>8} {'peak':>4} {'estimate':>8}"
    )
    out += _report.ruled(head)
    for r in report["results"]:
        est = [e for e in r["estimate_s"] if e is not None]
        extra = ""
        for field in ("stuck", "server_tracebacks"):
            if r[field]:
                extra += f"  {field.upper()} {r[field]}"
        if r["errors"]:
            extra += f"  errors {r['errors']}"
        out.append(
            f"{r['setup']:<6} {r['build_s']:>5g} {r['variant']:>3} {r['round']:>3} "
            f"{r['loadavg_1m']:>5.2f} {r['requests']:>5} {r['status']['200']:>5} "
            f"{r['refusals']['queue_full']:>5} {r['refusals']['deadline']:>5} "
            f"{r['whole_waits']:>5} {r['refused_at_once']:>5} "
            f"{fmt(r['refusal_p50_ms'], '.0f'):>6} {fmt(r['refusal_p99_ms'], '.0f'):>6} "
            f"{r['waiting_threads']:>8.2f} {fmt(r['goodput_pct'], '.0f') + '%':>8} "
            f"{r['max_in_flight']:>4} {fmt(est[0] if est else None, '.3f'):>8}" + extra
        )
    out += ["", "off -> on (rounds added up; goodput and wait thr averaged)"]
    head = (
        f"{'setup':<6} {'build':>5} {'whole waits':>12} {'refusal p99 ms':>15} "
        f"{'wait thr':>12} {'goodput /s':>12} {'ratio':>6}  goals"
    )
    out += _report.ruled(head)
    for s in report["summary"]:
        goals = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in s["met"].items())
        w, p, t, g = s["whole_waits"], s["refusal_p99_ms"], s["waiting_threads"], s[
            "goodput_per_s"]
        out.append(
            f"{s['setup']:<6} {s['build_s']:>5g} {f'{w[0]:g} -> {w[1]:g}':>12} "
            f"{f'{p[0]:.0f} -> {p[1]:.0f}':>15} {f'{t[0]:.2f} -> {t[1]:.2f}':>12} "
            f"{f'{g[0]:.2f} -> {g[1]:.2f}':>12} {fmt(s['goodput_ratio'], '.2f'):>6}  {goals}"
        )
    if report["burst"]:
        out += ["", "issue 30's burst (in process, test client): active 1, queue 8, wait 1 s, "
                    "builds 0.4 s; a burst of 9 after three to teach the estimate"]
        head = (f"{'deadline':<8} {'estimate':>8} {'in':>3} {'at once':>7} {'whole':>5} "
                f"{'refusal p50 ms':>14} {'refused: thread-s waiting':>25}")  # fmt: skip
        out += _report.ruled(head)
        for b in report["burst"]:
            out.append(
                f"{'on' if b['deadline'] else 'off':<8} {fmt(b['estimate_s'], '.3f'):>8} "
                f"{b['admitted']:>3} {b['refused_at_once']:>7} {b['whole_waits']:>5} "
                f"{fmt(b['refusal_p50_ms'], '.0f'):>14} {b['wait_thread_s']:>25.2f}"
            )
    out.append("")
    out.append(f"all goals met: {'yes' if report['all_met'] else 'NO'}")
    return _report.closing(out, report)


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "1 round, 4 s measured per variant (rougher figures): about two minutes")
    settle = _report.options(p, duration=(12.0, 4.0), wait=3.0, servers=2, workers=2,
                             threads=32, rounds=(2, 1), timeout=30.0)
    a_ = p.add_argument
    a_("--builds", default=",".join(f"{b:g}" for b in BUILDS_S),
       help="build lengths in s, comma-separated (default 0.1,1,1.5)")  # fmt: skip
    a_("--overload", type=float, default=2.0, help="arrivals as a multiple of the limit (2)")
    a_("--setups", default=None,
       help=f"subset of {','.join(SETUPS)} (default both; quick: single)")  # fmt: skip
    a_("--no-burst", action="store_true", help="skip issue 30's in-process burst")
    a = p.parse_args(argv)
    settle(a)
    try:
        builds = [float(b) for b in a.builds.split(",") if b]
    except ValueError:
        p.error("--builds takes numbers of seconds, comma-separated")
    from reachlimit.flask import Settings

    defaults = Settings()  # the extension's limits, not set: the servers run with them
    cfg = Config(
        active=defaults.active,
        build_s=builds[0] if builds else 1.0,
        queue=defaults.queue,
        wait=a.wait,
        builds=builds,
        overload=a.overload,
        duration_s=a.duration,
        servers=a.servers,
        workers=a.workers,
        threads=a.threads,
        rounds=a.rounds,
        client_timeout_s=a.timeout,
    )
    setups = [s for s in (a.setups or ("single" if a.quick else ",".join(SETUPS))).split(",")
              if s]  # fmt: skip
    if not setups or any(s not in SETUPS for s in setups):
        p.error(f"--setups takes a subset of {','.join(SETUPS)}")
    if not builds or min(builds) <= 0 or cfg.overload <= 0:
        p.error("need --builds and --overload > 0")
    if max(cfg.overload * 2 / b for b in builds) * (cfg.wait + cfg.duration_s + 3 * max(
            builds)) > 5000:
        p.error("that load would start more than 5000 requests in a variant: bounded load")
    report = _report.start("deadline")
    results: list[dict[str, Any]] = []
    with _load.place(report, "deadline", "shared" in setups) as where:
        for rnd in range(1, cfg.rounds + 1):
            for setup in setups:
                for build_s in builds:
                    for variant in VARIANTS if rnd % 2 else VARIANTS[::-1]:
                        row = run_variant(setup, variant, build_s, rnd, cfg, where)
                        flatten(row, cfg.active)
                        results.append(row)
        bursts = [] if a.no_burst else [burst(False), burst(True)]
    summary = compare(results, cfg)
    report.update(
        config={**asdict(cfg), "quick": a.quick, "setups": setups}, results=results,
        summary=summary, burst=bursts, all_met=all(all(s["met"].values()) for s in summary),
        figures={f"{s['setup']}, {s['build_s']:g} s builds: whole waits off -> on; goodput "
                 "on / off": f"{s['whole_waits'][0]:g} -> {s['whole_waits'][1]:g}; "
                 f"{_report.fmt(s['goodput_ratio'], '.2f')}" for s in summary},
    )  # fmt: skip
    return _report.finish(report, a, render)


if __name__ == "__main__":
    sys.exit(main())
