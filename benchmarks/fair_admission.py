#!/usr/bin/env python3
"""Fair admission over HTTP: one crawler against four polite clients, under real gunicorn.

    python benchmarks/fair_admission.py            # 20 s per variant, ~2 minutes
    python benchmarks/fair_admission.py --quick    # 5 s per variant, ~1 minute

The question: a crawler keeps the cold endpoint's queue full; do the other clients still get
in on their first try? This script answers it for the Flask extension with its default
limits (active 2, queue 8, wait 3 s) and two values of ``REACHLIMIT_CLIENT``, side by side:

  none         every request is one client: the plain FIFO queue of before fair admission
               (the baseline)
  remote_addr  the default: each peer address is a client, the queue is shared fairly

Clients are told apart by their real source address, as the extension sees them: every
socket of a client is bound to a loopback address of its own before it connects to the
servers on 127.0.0.1 (the crawler 127.0.0.2, the polite clients 127.0.0.3, .4, ...). The app
echoes the ``remote_addr`` it saw (``X-Bench-Peer``) and the report counts any mismatch.

The load, per variant, on fresh servers:

  crawler  ``--crawler-connections`` (12) closed-loop clients (``_load.Clients``), each asking
           for distinct cold keys back to back on a new connection per request (no pause after
           a 429 unless ``--crawler-pause-ms``), from the start of the variant
  polite   ``--polite`` (4) clients, each asking for one distinct cold key every
           ``--polite-every`` s (2 s), staggered evenly, every request in its own thread
           (``_load.open_loop``) and tried once: together 2 builds/s of 0.5 s, half the
           capacity.
           They start ``--lead-s`` (1 s) after the crawler, once its requests fill the slots
           and the queue, and ask for ``--duration`` s (20 s; quick 5 s); the crawler goes on
           until the last polite answer is in

Two set-ups, each running both variants:

  single   one gunicorn server, one gthread worker: the in-process ColdLimiter
  shared   ``--servers`` (2) gunicorn servers x ``--workers`` (2) gthread workers, all on one
           Redis (``REACHLIMIT_REDIS_URL``: the shared limiter, cache and singleflight); the
           script starts its own ``redis-server`` on a free loopback port in a temporary
           directory. Requests go round-robin over the servers

The app is ``benchmarks/app.py`` (``_load.Server``): the extension configured from the
``REACHLIMIT_*`` environment, a build that sleeps ``BENCH_BUILD_MS`` (500) and is counted
around its sleep - in the worker for ``single``, in Redis for ``shared`` (all processes
together) - so the most builds at once is the app's own count. Every server and the
redis-server are stopped by PID.

Figures per variant: the polite clients' first-try admission share (200 / requests) and the
latency (client side, connect to last byte) of their admitted requests; the crawler's builds
and its share of all builds; goodput = builds completed (200 answers: every key is new, so each
is one build) while the polite clients asked, per second and as a share of ``active / build
time``; the most builds at once; the 429s of each side by reason (the extension's ``Busy``
reason, echoed by the app as ``X-Bench-Refusal``), and the limiter's own counts over the
measured phase (``rejected_full``, ``rejected_timeout``, ``displaced``: what the health view
shows).

Goals: with ``remote_addr``, polite first-try admission >= 95 % and the crawler still served;
in every variant at most ``active`` builds at once, goodput >= 90 %, no 5xx, transport error
or traceback.
"""

from __future__ import annotations

import random
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import _load
import _report
import plots
from _load import CRAWLER_ADDR, Answer, Request
from _report import fmt, ms, pct

SETUPS = ("single", "shared")
VARIANTS = ("none", "remote_addr")
GOAL_POLITE_PCT = 95.0
GOAL_GOODPUT_PCT = 90.0


@dataclass
class Config(_load.Budget):
    duration_s: float
    lead_s: float
    crawler_connections: int
    crawler_pause_s: float
    polite: int
    polite_every_s: float
    servers: int
    workers: int
    threads: int
    rounds: int
    client_timeout_s: float

    def polite_addrs(self) -> list[str]:
        return [_load.polite_addr(i) for i in range(self.polite)]


def polite_load(ports: list[int], tag: str, out: list[Answer], cfg: Config) -> Any:
    """The polite clients for a ``with`` block: one request slot every ``polite_every /
    polite`` s, client by client in turn (so each asks once every ``polite_every`` s,
    staggered), each request in its own thread at a random moment of its slot (seeded), at
    most ``duration / polite_every`` each."""
    addrs = cfg.polite_addrs()
    interval = cfg.polite_every_s / len(addrs)

    def send(i: int) -> None:
        client, n = i % len(addrs), i // len(addrs)
        # A random phase within the request's own slot: fixed arrivals every 0.5 s would lock
        # onto the builds' 0.5 s cycle and always meet the slots at the same moment of it.
        time.sleep(random.Random(f"{tag}-{i}").uniform(0.0, interval))
        out.append(_load.get(ports[(client + n) % len(ports)],
                             f"/report?key=polite-{tag}-{client}-{n}", "polite",
                             cfg.client_timeout_s, addrs[client]))  # fmt: skip

    cap = round(cfg.duration_s / cfg.polite_every_s) * len(addrs)
    return _load.open_loop(send, interval, cap,
                           cfg.wait + cfg.client_timeout_s + _load.JOIN_MARGIN_S, "polite")


def warm_up(ports: list[int], cfg: Config) -> None:
    """Fresh workers' first requests (threads, imports, Redis connections) before anything is
    measured: from every client address, a few warm requests to every server at once."""
    jobs = [(s, p, k) for s in [CRAWLER_ADDR, *cfg.polite_addrs()] for p in ports
            for k in _load.WARM_KEYS[:4]]  # fmt: skip

    def send(i: int, req: Request) -> Answer:
        source, port, key = jobs[i]
        return _load.get(port, f"/report?key={key}", "warm", cfg.client_timeout_s, source)

    answers, _, _ = _load.release([Request(0.0, "warm", k) for _, _, k in jobs], send,
                                  cfg.client_timeout_s + _load.JOIN_MARGIN_S)  # fmt: skip
    failed = [a for a in answers if a.status != 200]
    if len(answers) != len(jobs) or failed:
        raise RuntimeError(f"warm-up failed: {len(answers)}/{len(jobs)} answers, bad {failed[:3]}")


def run_variant(setup: str, variant: str, rnd: int, cfg: Config,
                where: _load.Place) -> dict[str, Any]:  # fmt: skip
    """Fresh servers (and, for ``shared``, an emptied Redis), the warm-up, the load."""
    loadavg = _report.loadavg()[0]
    tag = uuid.uuid4().hex[:8]
    crawl: list[Answer] = []
    polite: list[Answer] = []
    env = {"REACHLIMIT_CLIENT": variant, "REACHLIMIT_WAIT": repr(cfg.wait),
           "BENCH_BUILD_MS": repr(cfg.build_s * 1000)}  # fmt: skip
    with where.servers(setup, f"{setup}-{variant}-r{rnd}", env, cfg.servers, cfg.workers,
                       cfg.threads) as servers:  # fmt: skip
        ports = [s.port for s in servers]
        seen_setting = {s.stats()["client"] for s in servers}
        warm_up(ports, cfg)
        before = servers[0].stats()

        def send(i: int, n: int) -> Answer:
            return _load.get(ports[(i + n) % len(ports)], f"/report?key=crawl-{tag}-{i}-{n}",
                             "crawler", cfg.client_timeout_s, CRAWLER_ADDR)  # fmt: skip

        t_start = time.time()
        crawler = _load.Clients(cfg.crawler_connections, send, crawl,
                                (cfg.crawler_pause_s, cfg.crawler_pause_s), name="crawler")
        try:
            time.sleep(cfg.lead_s)  # the crawler alone fills the slots and the queue
            with polite_load(ports, tag, polite, cfg) as polite_stuck:
                t0 = time.time()
                time.sleep(cfg.duration_s)  # the measured phase
            t1 = t0 + cfg.duration_s
        finally:
            stuck = crawler.stop(cfg.wait + cfg.client_timeout_s + _load.JOIN_MARGIN_S)
        t_end = time.time()
        after = servers[0].stats()
    everyone = crawl + polite
    built = [a for a in everyone if a.status == 200]
    in_window = [a for a in built if t0 <= a.end <= t1]
    crawler_in_window = sum(a.kind == "crawler" for a in in_window)
    polite_ok = _load.latencies(polite, 200)
    goodput = len(in_window) / cfg.duration_s
    return {
        "setup": setup, "variant": variant, "round": rnd, "servers": len(ports),
        "workers_per_server": 1 if setup == "single" else cfg.workers,
        "client_setting_seen": sorted(seen_setting), "loadavg_1m": loadavg,
        "elapsed_s": t_end - t_start,
        "polite_requests": len(polite),
        "polite_status": _load.status_counts(polite),
        "polite_first_try_pct": 100 * len(polite_ok) / len(polite) if polite else None,
        "polite_p50_ms": ms(pct(polite_ok, 50)),
        "polite_p99_ms": ms(pct(polite_ok, 99)),
        "polite_max_ms": ms(max(polite_ok, default=None)),
        "polite_refusals": _load.reasons_of(polite),
        "crawler_requests": len(crawl),
        "crawler_rate_per_s": len(crawl) / (t_end - t_start),
        "crawler_status": _load.status_counts(crawl),
        "crawler_p50_ms": ms(pct(_load.latencies(crawl, 200), 50)),
        "crawler_refusals": _load.reasons_of(crawl),
        "builds_in_window": len(in_window),
        "crawler_builds_in_window": crawler_in_window,
        "crawler_share_pct": 100 * crawler_in_window / len(in_window) if in_window else None,
        "goodput_per_s": goodput,
        "goodput_pct": 100 * goodput / cfg.capacity,
        "builds_started": after["builds"]["started"],
        "answers_200": len(built),
        "max_in_flight": after["builds"]["max_in_flight"],
        "limiter": _load.limiter_delta(before["reach"], after["reach"]),
        "peer_mismatches": sum(1 for a in everyone if a.status is not None and a.peer != a.source),
        "errors": sorted({a.error for a in everyone if a.error}),
        "stuck": stuck + polite_stuck[0],
        "server_tracebacks": sum(s.tracebacks() for s in servers),
    }  # fmt: skip


def judge(row: dict[str, Any], cfg: Config) -> dict[str, bool]:
    bad = sum(_load.bad(row[f]) for f in ("polite_status", "crawler_status"))
    met = {
        "in_flight_within_limit": row["max_in_flight"] <= cfg.active,
        "goodput_ge_90pct": row["goodput_pct"] >= GOAL_GOODPUT_PCT,
        "no_5xx_or_errors": bad == 0 and not row["stuck"] and not row["server_tracebacks"]
        and not row["peer_mismatches"],
    }
    if row["variant"] == "remote_addr":
        share = row["polite_first_try_pct"]
        met["polite_first_try_ge_95pct"] = share is not None and share >= GOAL_POLITE_PCT
        met["crawler_served"] = row["crawler_builds_in_window"] > 0
    return met


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    out = [
        *_load.head("reachlimit fair admission over HTTP: one crawler against polite "
                    "clients", report),
        f"servers: gthread, {c['threads']} threads per worker; single = 1 server x 1 worker "
        f"(in-process limiter); shared = {c['servers']} "
        f"servers x {c['workers']} workers on one Redis (REACHLIMIT_REDIS_URL)",
        f"load:    crawler {CRAWLER_ADDR}: {c['crawler_connections']} connections, distinct "
        f"cold keys back to back (pause after a 429: {c['crawler_pause_s'] * 1000:g} ms); "
        f"polite {c['polite_addrs'][0]}..{c['polite_addrs'][-1]}: one cold key each every "
        f"{c['polite_every_s']:g} s, tried once; {c['duration_s']:g} s measured after a "
        f"{c['lead_s']:g} s lead",
        "polite ok% = first-try admission (200 / requests); latency of admitted polite requests "
        "in ms; crawler share = crawler builds / all builds finished in the measured window;",
        "goodput = those builds per second, % of the limit; peak = most builds at once "
        "(counted in the app); 429s by reason: full / displaced / timeout",
        "",
    ]
    head = (f"{'setup':<7} {'REACHLIMIT_CLIENT':<17} {'rnd':>3} {'load':>5} {'polite':>6} "
            f"{'ok%':>5} {'p50':>6} {'p99':>6} {'crawler':>7} {'req/s':>6} {'share':>6} "
            f"{'builds':>6} {'goodput':>7} {'peak':>4} {'polite 429s':>11} {'crawler 429s':>14} "
            f"{'limiter: full/displ/tmo':>23}")
    out += _report.ruled(head)

    def trio(d: dict[str, int]) -> str:
        return f"{d['queue_full']}/{d['displaced']}/{d['timeout']}"

    for r in report["results"]:
        lim = r["limiter"]
        extra = "".join(f"  {f.upper()} {r[f]}" for f in ("peer_mismatches", "stuck",
                                                           "server_tracebacks") if r[f])
        extra += f"  errors {r['errors']}" if r["errors"] else ""
        bad = sum(_load.bad(r[f]) for f in ("polite_status", "crawler_status"))
        extra += f"  5xx/other/errors {bad}" if bad else ""
        out.append(
            f"{r['setup']:<7} {r['variant']:<17} {r['round']:>3} {r['loadavg_1m']:>5.2f} "
            f"{r['polite_requests']:>6} {fmt(r['polite_first_try_pct'], '.0f'):>5} "
            f"{fmt(r['polite_p50_ms'], '.0f'):>6} {fmt(r['polite_p99_ms'], '.0f'):>6} "
            f"{r['crawler_requests']:>7} {r['crawler_rate_per_s']:>6.0f} "
            f"{fmt(r['crawler_share_pct'], '.0f') + '%':>6} {r['builds_in_window']:>6} "
            f"{fmt(r['goodput_pct'], '.0f') + '%':>7} {r['max_in_flight']:>4} "
            f"{trio(r['polite_refusals']):>11} {trio(r['crawler_refusals']):>14} "
            f"{lim['rejected_full']:>11}/{lim['displaced']}/{lim['rejected_timeout']}" + extra)
    marks = (("polite_first_try_ge_95pct", f"polite ok >= {GOAL_POLITE_PCT:g}%"),
             ("crawler_served", "crawler served"), ("in_flight_within_limit", "peak <= active"),
             ("goodput_ge_90pct", f"goodput >= {GOAL_GOODPUT_PCT:g}%"),
             ("no_5xx_or_errors", "no 5xx/errors"))  # fmt: skip
    rows = [{**r, "name": f"{r['setup']} {r['variant']} r{r['round']}"} for r in report["results"]]
    out += ["", *_load.goal_table(rows, marks, "name"),
            "polite ok and crawler served are judged with remote_addr only (none is the baseline)"]
    return _report.closing(out, report)


def check_sources(addrs: list[str]) -> None:
    """Every client address can be bound here (Linux routes all of 127/8 to loopback)."""
    for addr in addrs:
        with socket.socket() as s:
            s.bind((addr, 0))


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "5 s per variant instead of 20 (rougher shares): about a minute")
    settle = _report.options(p, duration=(20.0, 5.0), build_ms=500.0, wait=3.0, servers=2,
                             workers=2, threads=24, rounds=1, timeout=30.0)
    a_ = p.add_argument
    a_("--lead-s", type=float, default=1.0, help="crawler alone before the polite clients (1)")
    a_("--crawler-connections", type=int, default=12, help="crawler threads (default 12)")
    a_("--crawler-pause-ms", type=float, default=0.0,
       help="the crawler's pause after a non-200 (default 0: back to back)")
    a_("--polite", type=int, default=4, help="polite clients, 1 to 20 (default 4)")
    a_("--polite-every", type=float, default=2.0,
       help="seconds between one polite client's requests (default 2)")
    a_("--setups", default=",".join(SETUPS), help=f"subset of {','.join(SETUPS)}")
    a_("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    plots.add_option(p)
    a = p.parse_args(argv)
    settle(a)
    from reachlimit.flask import Settings

    defaults = Settings()  # the extension's limits, not set: the servers run with them
    cfg = Config(
        build_s=a.build_ms / 1000, wait=a.wait, active=defaults.active, queue=defaults.queue,
        duration_s=a.duration, lead_s=a.lead_s, crawler_connections=a.crawler_connections,
        crawler_pause_s=a.crawler_pause_ms / 1000, polite=a.polite,
        polite_every_s=a.polite_every, servers=a.servers, workers=a.workers, threads=a.threads,
        rounds=a.rounds, client_timeout_s=a.timeout,
    )  # fmt: skip
    setups = _load.selection(p, a.setups, SETUPS, "set-up")
    variants = _load.selection(p, a.variants, VARIANTS, "variant")
    if cfg.polite_every_s <= 0 or cfg.lead_s < 0 or cfg.crawler_pause_s < 0:
        p.error("need --polite-every > 0, --lead-s >= 0 and --crawler-pause-ms >= 0")
    if not 1 <= cfg.polite <= 20 or not 1 <= cfg.crawler_connections <= 200:
        p.error("need 1 <= --polite <= 20 and 1 <= --crawler-connections <= 200")
    check_sources([CRAWLER_ADDR, *cfg.polite_addrs()])
    report = _report.start("fair_admission")
    results: list[dict[str, Any]] = []
    with _load.place(report, "fair", "shared" in setups) as where:
        for rnd in range(1, cfg.rounds + 1):
            for setup in setups:
                for variant in variants if rnd % 2 else variants[::-1]:
                    row = run_variant(setup, variant, rnd, cfg, where)
                    row["met"] = judge(row, cfg)
                    results.append(row)
    report.update(
        config={**asdict(cfg), "quick": a.quick, "setups": setups, "variants": variants,
                "crawler_addr": CRAWLER_ADDR, "polite_addrs": cfg.polite_addrs()},
        results=results, all_met=all(all(r["met"].values()) for r in results),
        figures={
            **{f"{r['setup']} {r['variant']} polite first-try %": r["polite_first_try_pct"]
               for r in results if r["round"] == 1},
            **{f"{r['setup']} remote_addr {name}": r[k] for r in results
               if r["round"] == 1 and r["variant"] == "remote_addr"
               for k, name in (("crawler_share_pct", "crawler's share of the builds %"),
                               ("goodput_pct", "goodput %"))},
        },
    )  # fmt: skip
    return _report.finish(report, a, render, plots.fair_admission)


if __name__ == "__main__":
    sys.exit(main())
