#!/usr/bin/env python3
"""No wasted waits (issue 30): REACHLIMIT_DEADLINE off against on, under steady overload.

    python benchmarks/deadline.py            # 2 rounds, 12 s per variant, both set-ups: ~10 min
    python benchmarks/deadline.py --quick    # 1 round, 4 s per variant, one worker only
    python benchmarks/deadline.py --json     # the same figures as JSON on stdout

The question: when the queue drains slower than the wait (builds of 1 s and 1.5 s with the
shipped limits: active 2, queue 8, wait 3 s), the last places of a full queue can never start
in time; are their leaders now told so at once instead of after their whole wait, and does
goodput (builds per second against the limit) stay where it was? And with quick builds
(0.1 s), where every place starts in time, does nothing change?

Each variant runs on fresh gunicorn servers (``deadline:create_app()`` from ``benchmarks/``:
the extension configured from the ``REACHLIMIT_*`` environment, a build that sleeps
``BENCH_BUILD_MS``, counted in the worker or, on Redis, in Redis), so each one learns its
estimate of build time from nothing:

  single   one gunicorn server, one gthread worker: the in-process ColdLimiter
  shared   ``--servers`` (2) x ``--workers`` (2) on one Redis the script starts (the shared
           limiter: the estimate and the decision in its scripts); not in ``--quick``

The load: distinct cold keys, open loop (each request in its own thread, whatever the others
do), at ``--overload`` (2) times the limit (``active / build``), for a lead of ``wait + 3
builds`` (the estimate is learnt there, not measured) and then ``--duration`` seconds measured.
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

Goals (printed, never asserted): with builds of 1 s and 1.5 s, deadline on leaves about no
whole waits (at most 5 % of off's, and at most 1); goodput on within 10 % of off's; with builds
of 0.1 s no deadline refusal at all; nothing above ``active`` at once, no 5xx, no error.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import _http
from _common import fmt, ms, open_loop, pct

from tests.support.clients import http_request

APP = "deadline:create_app()"
SETUPS = ("single", "shared")
VARIANTS = ("off", "on")
BUILDS_S = (0.1, 1.0, 1.5)
REASONS = ("queue_full", "deadline", "timeout", "displaced")
JOIN_MARGIN_S = 10.0
#: A refusal answered within this much of its arrival was refused at once.
AT_ONCE_S = 0.1
GOAL_WHOLE_WAIT_SHARE = 0.05
GOAL_GOODPUT_RATIO = 0.90


# -- the server side ----------------------------------------------------------------------


def create_app() -> Any:
    """The app factory: ``REACHLIMIT_*`` from the environment (the extension checks them),
    ``BENCH_BUILD_MS``, ``BENCH_TOKEN``; with ``REACHLIMIT_REDIS_URL`` builds are counted in
    that Redis (every process together), else in this worker."""
    from flask import Flask, jsonify, request
    from http_app import ColdWork, stats_response
    from http_redis_app import BUILD_KEYS, CountedBuild, redis_client

    from reachlimit.flask import CONFIG_KEYS, ColdRefused, ReachLimit

    app = Flask(__name__)
    app.config.update({k: os.environ[k] for k in CONFIG_KEYS if k in os.environ})
    build_s = float(os.environ.get("BENCH_BUILD_MS", "1000")) / 1000
    token = os.environ.get("BENCH_TOKEN")
    url = os.environ.get("REACHLIMIT_REDIS_URL")
    rl = ReachLimit(app)
    work = ColdWork(build_s) if not url else None
    counted = CountedBuild(redis_client(url), build_s) if url else None

    @app.get("/report")
    def report() -> Any:
        key = request.args.get("key", "")
        arrived = time.perf_counter()
        started: list[float] = []

        def build() -> Any:
            started.append(time.perf_counter())
            return work.build(key) if work is not None else counted(key)  # type: ignore[misc]

        response: Any
        try:
            response = jsonify(rl.cold(key, build))
        except ColdRefused as refused:  # its finished 429, told apart by the Busy reason
            response = refused.response
            response.headers["X-Bench-Refusal"] = refused.busy.reason
            waited = time.perf_counter() - arrived
        else:
            waited = (started[0] if started else arrived) - arrived
        response.headers["X-Bench-Waited-Ms"] = f"{waited * 1000:.3f}"
        return response

    @app.get("/stats")
    def stats() -> Any:
        with app.app_context():
            settings = rl.settings()
            estimate = getattr(rl.path.limiter, "build_estimate", None)
        return stats_response(
            pid=os.getpid(),
            token=token,
            deadline=getattr(settings, "deadline", None),
            estimate=estimate,
            reach=rl.stats().as_dict(),
            builds=work.figures(None) if work is not None else None,
            build_keys=BUILD_KEYS if url else None,
        )

    return app


# -- configuration ------------------------------------------------------------------------


@dataclass
class Config(_common.Budgeted):
    queue: int
    wait: float
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


class DeadlineServer(_http.BenchGunicorn):
    """One gunicorn master serving :func:`create_app` for one variant."""

    def __init__(
        self, variant: str, build_s: float, name: str, workers: int, cfg: Config,
        redis_url: str | None, log_dir: Path,
    ) -> None:  # fmt: skip
        env = {
            "REACHLIMIT_DEADLINE": "true" if variant == "on" else "false",
            "REACHLIMIT_WAIT": repr(cfg.wait),
            "REACHLIMIT_CLIENT": "none",  # one client: the plain FIFO queue of the issue
            "BENCH_BUILD_MS": repr(build_s * 1000),
        }
        if redis_url:
            env["REACHLIMIT_REDIS_URL"] = redis_url
        super().__init__(
            APP, log_dir, name, env, workers, cfg.threads, extra_stripped=("GUNICORN_CMD_ARGS",)
        )


# -- the client side ----------------------------------------------------------------------


@dataclass
class Answer:
    """One request: sent at ``start`` (perf_counter), answered ``latency`` s later;
    ``waited`` is what the app said it waited in the handler; ``reason`` a refusal's."""

    start: float
    latency: float
    status: int | None
    waited: float = 0.0
    reason: str | None = None
    error: str | None = None

    @property
    def end(self) -> float:
        return self.start + self.latency


def ask(port: int, key: str, timeout: float) -> Answer:
    """One GET on its own connection; never raises."""
    start = time.perf_counter()
    try:
        reply = http_request(port, "GET", f"/report?key={key}", timeout=timeout,
                             headers={"Connection": "close"})  # fmt: skip
    except OSError as exc:
        return Answer(start, time.perf_counter() - start, None, error=type(exc).__name__)
    latency = time.perf_counter() - start
    waited = float(reply.headers.get("x-bench-waited-ms", "0")) / 1000
    return Answer(start, latency, reply.status, waited, reply.headers.get("x-bench-refusal"))


# -- one variant ----------------------------------------------------------------------------


def servers_of(
    setup: str, variant: str, build_s: float, cfg: Config, redis_url: str | None,
    log_dir: Path, rnd: int,
) -> contextlib.AbstractContextManager[list[DeadlineServer]]:  # fmt: skip
    count, workers = (1, 1) if setup == "single" else (cfg.servers, cfg.workers)
    return _http.all_serving(
        DeadlineServer(variant, build_s, f"{setup}-{build_s:g}-{variant}-r{rnd}-{i}", workers,
                       cfg, redis_url, log_dir)  # fmt: skip
        for i in range(count)
    )


def limiter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    keys = ("acquired", "rejected_full", "rejected_timeout", "deadline", "displaced",
            "cancelled")  # fmt: skip
    delta = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    delta.update(peak_active=after["peak_active"])
    return delta


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


def run_variant(
    setup: str, variant: str, build_s: float, rnd: int, cfg: Config, rc: Any,
    redis_url: str | None, log_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """Fresh servers (and, for ``shared``, an emptied Redis), the lead, the measured load."""
    if rc is not None:
        rc.flushdb()
    loadavg = os.getloadavg()[0]
    tag = uuid.uuid4().hex[:8]
    answers: list[Answer] = []
    rate = cfg.overload * cfg.active / build_s
    lead = cfg.lead_s(build_s)
    with servers_of(setup, variant, build_s, cfg, redis_url, log_dir, rnd) as servers:
        ports = [s.port for s in servers]
        seen = {s.stats()["deadline"] for s in servers}
        before = servers[0].stats()

        def send(i: int) -> None:
            answers.append(ask(ports[i % len(ports)], f"cold-{tag}-{i}", cfg.client_timeout_s))

        cap = int(rate * (lead + cfg.duration_s)) + 1
        join_s = cfg.wait + build_s + cfg.client_timeout_s + JOIN_MARGIN_S
        t_start = time.perf_counter()
        with open_loop(send, 1 / rate, cap, join_s, "load") as stuck:
            time.sleep(lead)
            t0 = time.perf_counter()
            time.sleep(cfg.duration_s)
        t1 = t0 + cfg.duration_s
        elapsed = time.perf_counter() - t_start
        after = servers[0].stats()
        estimates = sorted({s.stats()["estimate"] for s in servers}, key=str)
        if rc is not None:  # the budget's, as Redis keeps it (the default budget's keys)
            raw = rc.hget("{reachlimit:cold}:stats", "estimate_ms")
            estimates = [int(raw) / 1000 if raw is not None else None]
            max_in_flight = int(rc.get(after["build_keys"]["max_in_flight"]) or 0)
            builds_started = int(rc.get(after["build_keys"]["started"]) or 0)
        else:
            max_in_flight = after["builds"]["max_in_flight"]
            builds_started = after["builds"]["builds"]
    tracebacks = sum(s.stderr().count("Traceback") for s in servers)
    return {
        "setup": setup,
        "build_s": build_s,
        "variant": variant,
        "round": rnd,
        "deadline_seen": sorted(seen, key=str),
        "loadavg_1m": round(loadavg, 2),
        "elapsed_s": elapsed,
        "rate_per_s": rate,
        "estimate_s": estimates,
        **figures(list(answers), cfg, build_s, t0, t1),
        # Over the whole variant, lead included: every answer, and every build run.
        "answers_total": len(answers),
        "answered_200_total": sum(a.status == 200 for a in answers),
        "refused_total": sum(a.status == 429 for a in answers),
        "builds_started": builds_started,
        "max_in_flight": max_in_flight,
        "limiter": limiter_delta(before["reach"], after["reach"]),
        "stuck": stuck[0],
        "server_tracebacks": tracebacks,
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

    def one_burst(n: int) -> list[Answer]:
        out: list[Answer] = []

        def get(i: int) -> None:
            start = time.perf_counter()
            reply = app.test_client().get(f"/r/b{n}-{i}")
            out.append(Answer(
                start, time.perf_counter() - start, reply.status_code,
                float(reply.headers.get("X-Bench-Waited-Ms", "0")) / 1000,
                reply.headers.get("X-Bench-Refusal"),
            ))  # fmt: skip

        threads = [threading.Thread(target=get, args=(i,), daemon=True) for i in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return out

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
    m, c = report["machine"], report["config"]
    out = [
        "reachlimit no wasted waits (issue 30): REACHLIMIT_DEADLINE off against on",
        *_common.machine_lines(m),
        f"         gunicorn {m['gunicorn']}, Flask {m['flask']}, redis-server "
        f"{m.get('redis_server') or '-'}; load average at the end {m['loadavg_end']}",
        f"config:  active {c['active']}, queue {c['queue']}, wait {c['wait']:g} s; builds "
        f"{', '.join(f'{b:g}' for b in c['builds'])} s (sleep); distinct cold keys, open loop "
        f"at {c['overload']:g}x the limit; {c['duration_s']:g} s measured after a lead of "
        "wait + 3 builds; fresh servers per variant",
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
    out += _common.ruled(head)
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
    out += _common.ruled(head)
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
        out += _common.ruled(head)
        for b in report["burst"]:
            out.append(
                f"{'on' if b['deadline'] else 'off':<8} {fmt(b['estimate_s'], '.3f'):>8} "
                f"{b['admitted']:>3} {b['refused_at_once']:>7} {b['whole_waits']:>5} "
                f"{fmt(b['refusal_p50_ms'], '.0f'):>14} {b['wait_thread_s']:>25.2f}"
            )
    out.append("")
    out.append(f"all goals met: {'yes' if report['all_met'] else 'NO'}")
    return _common.closing(out, report)


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "Steady overload through the reachlimit Flask extension under gunicorn, "
        "REACHLIMIT_DEADLINE off against on, with builds of 0.1, 1 and 1.5 s.",
        "1 round, 4 s measured per variant (rougher figures): about two minutes",
    )
    a_ = p.add_argument
    a_("--duration", type=float, default=None,
       help="measured seconds per variant (default 12, quick 4)")  # fmt: skip
    a_("--builds", default=",".join(f"{b:g}" for b in BUILDS_S),
       help="build lengths in s, comma-separated (default 0.1,1,1.5)")  # fmt: skip
    a_("--wait", type=float, default=3.0, help="REACHLIMIT_WAIT in s (default 3)")
    a_("--overload", type=float, default=2.0, help="arrivals as a multiple of the limit (2)")
    a_("--servers", type=int, default=2, help="gunicorn servers of the shared set-up (2)")
    a_("--workers", type=int, default=2, help="workers per server of the shared set-up (2)")
    a_("--threads", type=int, default=32, help="gthread threads per worker (default 32)")
    a_("--rounds", type=int, default=None, help="rounds, variants alternating (2, quick 1)")
    a_("--timeout", type=float, default=30.0, help="client socket timeout in s (default 30)")
    a_("--setups", default=None,
       help=f"subset of {','.join(SETUPS)} (default both; quick: single)")  # fmt: skip
    a_("--no-burst", action="store_true", help="skip issue 30's in-process burst")
    a = p.parse_args(argv)
    try:
        builds = [float(b) for b in a.builds.split(",") if b]
    except ValueError:
        p.error("--builds takes numbers of seconds, comma-separated")
    cfg = Config(
        active=2,  # the extension's defaults, read back below
        build_s=builds[0] if builds else 1.0,
        queue=8,
        wait=a.wait,
        builds=builds,
        overload=a.overload,
        duration_s=a.duration if a.duration is not None else (4.0 if a.quick else 12.0),
        servers=a.servers,
        workers=a.workers,
        threads=a.threads,
        rounds=a.rounds if a.rounds is not None else (1 if a.quick else 2),
        client_timeout_s=a.timeout,
    )
    setups = [s for s in (a.setups or ("single" if a.quick else ",".join(SETUPS))).split(",")
              if s]  # fmt: skip
    if not setups or any(s not in SETUPS for s in setups):
        p.error(f"--setups takes a subset of {','.join(SETUPS)}")
    if not builds or min(builds) <= 0 or min(cfg.wait, cfg.duration_s, cfg.overload) <= 0:
        p.error("need --builds, --wait, --duration, --overload > 0")
    if min(cfg.servers, cfg.workers, cfg.threads, cfg.rounds) < 1:
        p.error("need --servers, --workers, --threads, --rounds >= 1")
    if max(cfg.overload * 2 / b for b in builds) * (cfg.wait + cfg.duration_s + 3 * max(
            builds)) > 5000:
        p.error("that load would start more than 5000 requests in a variant: bounded load")

    from reachlimit.flask import Settings

    defaults = Settings()
    if not hasattr(defaults, "deadline"):
        print("reachlimit.flask has no deadline option (REACHLIMIT_DEADLINE): nothing to "
              "compare", file=sys.stderr)  # fmt: skip
        return 2
    cfg.active, cfg.queue = defaults.active, defaults.queue
    if "shared" in setups and _http.redis_missing():
        return 2

    _http.unwind_on_sigterm()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="reachlimit-deadline-") as tmp,
        contextlib.ExitStack() as st,
    ):
        rc = rs = None
        if "shared" in setups:
            rs, rc = _http.shared_redis(st, Path(tmp))
        where = _http.service_machine(
            [("gunicorn", "gunicorn"), ("flask", "flask")], rs.port if rs is not None else None
        )
        for rnd in range(1, cfg.rounds + 1):
            for setup in setups:
                for build_s in builds:
                    order = VARIANTS if rnd % 2 else VARIANTS[::-1]
                    for variant in order:
                        row = run_variant(
                            setup, variant, build_s, rnd, cfg,
                            rc if setup == "shared" else None,
                            rs.url() if rs is not None and setup == "shared" else None,
                            Path(tmp),
                        )  # fmt: skip
                        flatten(row, cfg.active)
                        results.append(row)
        bursts = [] if a.no_burst else [burst(False), burst(True)]
        where["loadavg_end"] = round(os.getloadavg()[0], 2)
    summary = compare(results, cfg)
    report: dict[str, Any] = {
        "machine": where,
        "config": {**asdict(cfg), "quick": a.quick, "setups": setups},
        "results": results,
        "summary": summary,
        "burst": bursts,
        "all_met": all(all(s["met"].values()) for s in summary),
        "elapsed_s": time.perf_counter() - started,
    }
    return _http.finish(report, a.json, render)


if __name__ == "__main__":
    sys.exit(main())
