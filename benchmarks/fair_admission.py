#!/usr/bin/env python3
"""Fair admission over HTTP: one crawler against four polite clients, under real gunicorn.

    python benchmarks/fair_admission.py            # defaults: 20 s per variant, ~2 minutes
    python benchmarks/fair_admission.py --quick    # 5 s per variant, ~1 minute
    python benchmarks/fair_admission.py --json     # the same figures as JSON on stdout

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

  crawler  ``--crawler-connections`` (12) threads, each asking for distinct cold keys back to
           back on a new connection per request (no pause after a 429 unless
           ``--crawler-pause-ms``), from the start of the variant
  polite   ``--polite`` (4) clients, each asking for one distinct cold key every
           ``--polite-every`` s (2 s), staggered evenly, every request in its own thread
           (open loop) and tried once: together 2 builds/s of 0.5 s, half the capacity.
           They start ``--lead-s`` (1 s) after the crawler, once its requests fill the slots
           and the queue, and ask for ``--duration`` s (20 s; quick 5 s); the crawler goes on
           until the last polite answer is in

Two set-ups, each running both variants:

  single   one gunicorn server, one gthread worker: the in-process ColdLimiter
  shared   ``--servers`` (2) gunicorn servers x ``--workers`` (2) gthread workers, all on one
           Redis (``REACHLIMIT_REDIS_URL``: the shared limiter, cache and singleflight); the
           script starts its own ``redis-server`` on a free loopback port in a temporary
           directory. Requests go round-robin over the servers

The app is this module's :func:`create_app` (gunicorn ``fair_admission:create_app()`` from
``benchmarks/``): the extension configured from the ``REACHLIMIT_*`` environment, a build that
sleeps ``BENCH_BUILD_MS`` (500) and is counted around its sleep - in the worker for
``single`` (``http_app.ColdWork``), in Redis for ``shared`` (``http_redis_app.CountedBuild``, all
processes together) - so the most builds at once is the app's own count. Every server and the
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
or traceback. Printed, never asserted.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
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
import plots
from _common import fmt, ms, open_loop, pct
from _http import Sample, status_counts

from tests.support.clients import http_request

APP = "fair_admission:create_app()"
SETUPS = ("single", "shared")
VARIANTS = ("none", "remote_addr")
CRAWLER_ADDR = "127.0.0.2"
#: The polite clients' addresses: 127.0.0.3, 127.0.0.4, ...
POLITE_BASE = 3
WARM_KEYS = tuple(f"warm-{i}" for i in range(8))
REASONS = ("queue_full", "displaced", "timeout", "deadline")
GOAL_POLITE_PCT = 95.0
GOAL_GOODPUT_PCT = 90.0
JOIN_MARGIN_S = 10.0


# -- the server side ----------------------------------------------------------------------


def create_app() -> Any:
    """The app factory. ``REACHLIMIT_*`` from the environment (the extension checks them),
    ``BENCH_BUILD_MS``, ``BENCH_TOKEN``. With ``REACHLIMIT_REDIS_URL`` builds are counted in
    that Redis (every process together), else in this worker."""
    from flask import Flask, jsonify, request
    from http_app import ColdWork, stats_response
    from http_redis_app import BUILD_KEYS, CountedBuild, redis_client

    from reachlimit.flask import CONFIG_KEYS, ColdRefused, ReachLimit

    app = Flask(__name__)
    app.config.update({k: os.environ[k] for k in CONFIG_KEYS if k in os.environ})
    build_s = float(os.environ.get("BENCH_BUILD_MS", "500")) / 1000
    token = os.environ.get("BENCH_TOKEN")
    url = os.environ.get("REACHLIMIT_REDIS_URL")
    rl = ReachLimit(app)
    with app.app_context():
        for k in WARM_KEYS:
            rl.path.cache.set(k, {"key": k})
        client_setting = str(getattr(rl.settings(), "client", "(no client option)"))
    work = ColdWork(build_s) if not url else None
    counted = CountedBuild(redis_client(url), build_s) if url else None

    def build(key: str) -> Any:
        return work.build(key) if work is not None else counted(key)  # type: ignore[misc]

    @app.get("/report")
    def report() -> Any:
        key = request.args.get("key", "")
        response: Any
        try:
            response = jsonify(rl.cold(key, lambda: build(key)))
        except ColdRefused as refused:  # its finished 429, told apart by the Busy reason
            response = refused.response
            response.headers["X-Bench-Refusal"] = refused.busy.reason
        response.headers["X-Bench-Peer"] = request.remote_addr or ""
        return response

    @app.get("/stats")
    def stats() -> Any:
        return stats_response(
            pid=os.getpid(),
            token=token,
            client=client_setting,
            reach=rl.stats().as_dict(),
            builds=work.figures(None) if work is not None else None,
            build_keys=BUILD_KEYS if url else None,
        )

    return app


# -- configuration ------------------------------------------------------------------------


@dataclass
class Config(_common.Budgeted):
    wait: float
    queue: int
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
        return [f"127.0.0.{POLITE_BASE + i}" for i in range(self.polite)]


class FairServer(_http.BenchGunicorn):
    """One gunicorn master serving :func:`create_app` for one variant."""

    def __init__(
        self, variant: str, name: str, workers: int, cfg: Config, redis_url: str | None,
        log_dir: Path,
    ) -> None:  # fmt: skip
        env = {
            "REACHLIMIT_CLIENT": variant,
            "REACHLIMIT_WAIT": repr(cfg.wait),
            "BENCH_BUILD_MS": repr(cfg.build_s * 1000),
        }
        if redis_url:
            env["REACHLIMIT_REDIS_URL"] = redis_url
        super().__init__(
            APP, log_dir, name, env, workers, cfg.threads, extra_stripped=("GUNICORN_CMD_ARGS",)
        )


# -- the client side ----------------------------------------------------------------------


@dataclass
class Answer(Sample):
    """One request: ``kind`` is "crawler" or "polite"; ``end`` is perf_counter at its last
    byte; ``reason`` the refusal's reason (``X-Bench-Refusal``); ``peer`` the address the
    app saw; ``source`` the address the socket was bound to."""

    end: float = 0.0
    reason: str | None = None
    peer: str | None = None
    source: str = ""


def fetch_from(source: str, port: int, path: str, kind: str, timeout: float) -> Answer:
    """One GET sent from ``source`` on its own connection; never raises."""
    start = time.perf_counter()
    try:
        reply = http_request(
            port, "GET", path, timeout=timeout, headers={"Connection": "close"}, source=source
        )
    except (OSError, http.client.HTTPException) as exc:
        end = time.perf_counter()
        return Answer(kind, start, end - start, None, type(exc).__name__, end=end, source=source)
    end = time.perf_counter()
    return Answer(
        kind, start, end - start, reply.status, end=end, source=source,
        reason=reply.headers.get("x-bench-refusal"), peer=reply.headers.get("x-bench-peer"),
    )  # fmt: skip


def crawler(
    i: int, ports: list[int], tag: str, stop: threading.Event, out: list[Answer], cfg: Config
) -> None:
    """Distinct cold keys back to back until ``stop``, round-robin over the servers."""
    n = 0
    while not stop.is_set():
        port = ports[(i + n) % len(ports)]
        answer = fetch_from(
            CRAWLER_ADDR, port, f"/report?key=crawl-{tag}-{i}-{n}", "crawler",
            cfg.client_timeout_s,
        )  # fmt: skip
        out.append(answer)
        n += 1
        if answer.status != 200 and cfg.crawler_pause_s > 0:
            stop.wait(cfg.crawler_pause_s)


def polite_load(
    ports: list[int], tag: str, out: list[Answer], cfg: Config
) -> contextlib.AbstractContextManager[list[int]]:
    """The polite clients for the ``with`` block: one request slot every ``polite_every /
    polite`` s, client by client in turn (so each asks once every ``polite_every`` s,
    staggered), each request in its own thread at a random moment of its slot (seeded), at
    most ``duration / polite_every`` each."""
    addrs = cfg.polite_addrs()

    interval = cfg.polite_every_s / len(addrs)

    def send(i: int) -> None:
        client, n = i % len(addrs), i // len(addrs)
        port = ports[(client + n) % len(ports)]
        # A random phase within the request's own slot: fixed arrivals every 0.5 s would lock
        # onto the builds' 0.5 s cycle and always meet the slots at the same moment of it.
        time.sleep(random.Random(f"{tag}-{i}").uniform(0.0, interval))
        out.append(
            fetch_from(
                addrs[client], port, f"/report?key=polite-{tag}-{client}-{n}", "polite",
                cfg.client_timeout_s,
            )
        )  # fmt: skip

    cap = round(cfg.duration_s / cfg.polite_every_s) * len(addrs)
    return open_loop(send, interval, cap, cfg.wait + cfg.client_timeout_s + JOIN_MARGIN_S, "polite")


def warm_up(ports: list[int], cfg: Config) -> None:
    """Fresh workers' first requests (threads, imports, Redis connections) before anything is
    measured: from every client address, a few warm requests to every server at once."""
    sources = [CRAWLER_ADDR, *cfg.polite_addrs()]
    jobs = [(s, p, k) for s in sources for p in ports for k in WARM_KEYS[:4]]
    answers: list[Answer] = []
    threads = [
        threading.Thread(
            target=lambda s=s, p=p, k=k: answers.append(
                fetch_from(s, p, f"/report?key={k}", "warm", cfg.client_timeout_s)
            ),
            daemon=True,
        )
        for s, p, k in jobs
    ]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + cfg.client_timeout_s + JOIN_MARGIN_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    bad = [a for a in answers if a.status != 200]
    if len(answers) != len(jobs) or bad:
        raise RuntimeError(f"warm-up failed: {len(answers)}/{len(jobs)} answers, bad {bad[:3]}")


# -- one variant ----------------------------------------------------------------------------


def servers_of(
    setup: str, variant: str, cfg: Config, redis_url: str | None, log_dir: Path, rnd: int
) -> contextlib.AbstractContextManager[list[FairServer]]:
    count, workers = (1, 1) if setup == "single" else (cfg.servers, cfg.workers)
    return _http.all_serving(
        FairServer(variant, f"{setup}-{variant}-r{rnd}-{i}", workers, cfg, redis_url, log_dir)
        for i in range(count)
    )


def limiter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """The limiter's counts over the measured phase; peaks as they were at its end."""
    keys = ("acquired", "rejected_full", "rejected_timeout", "displaced", "cancelled",
            "deadline")
    delta = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    delta.update(peak_active=after["peak_active"], peak_queued=after["peak_queued"])
    return delta


def statuses(answers: list[Answer]) -> dict[str, int]:
    return status_counts(list[Sample](answers))


def reasons_of(answers: list[Answer]) -> dict[str, int]:
    c = Counter(a.reason or "unknown" for a in answers if a.status == 429)
    return {k: c[k] for k in (*REASONS, "unknown")}


def run_variant(
    setup: str, variant: str, rnd: int, cfg: Config, rc: Any, redis_url: str | None,
    log_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """Fresh servers (and, for ``shared``, an emptied Redis), the warm-up, the load."""
    if rc is not None:
        rc.flushdb()
    loadavg = os.getloadavg()[0]
    tag = uuid.uuid4().hex[:8]
    crawl: list[Answer] = []
    polite: list[Answer] = []
    with servers_of(setup, variant, cfg, redis_url, log_dir, rnd) as servers:
        ports = [s.port for s in servers]
        seen_setting = {s.stats()["client"] for s in servers}
        warm_up(ports, cfg)
        before = servers[0].stats()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=crawler, args=(i, ports, tag, stop, crawl, cfg), name=f"crawler-{i}",
                daemon=True,
            )
            for i in range(cfg.crawler_connections)
        ]  # fmt: skip
        t_start = time.perf_counter()
        for t in threads:
            t.start()
        try:
            time.sleep(cfg.lead_s)
            with polite_load(ports, tag, polite, cfg) as polite_stuck:
                t0 = time.perf_counter()
                time.sleep(cfg.duration_s)
            t1 = t0 + cfg.duration_s
        finally:
            stop.set()
            deadline = time.perf_counter() + cfg.wait + cfg.client_timeout_s + JOIN_MARGIN_S
            for t in threads:
                t.join(timeout=max(0.0, deadline - time.perf_counter()))
        stuck = sum(t.is_alive() for t in threads) + polite_stuck[0]
        t_end = time.perf_counter()
        after = servers[0].stats()
        if rc is not None:
            keys = after["build_keys"]
            max_in_flight = int(rc.get(keys["max_in_flight"]) or 0)
            builds_started = int(rc.get(keys["started"]) or 0)
        else:
            max_in_flight = after["builds"]["max_in_flight"]
            builds_started = after["builds"]["builds"]
    tracebacks = sum(s.stderr().count("Traceback") for s in servers)

    crawl = list(crawl)
    polite = list(polite)
    everyone = crawl + polite
    built = [a for a in everyone if a.status == 200]
    in_window = [a for a in built if t0 <= a.end <= t1]
    crawler_in_window = sum(a.kind == "crawler" for a in in_window)
    polite_ok = [a.latency for a in polite if a.status == 200]
    goodput = len(in_window) / cfg.duration_s
    return {
        "setup": setup,
        "variant": variant,
        "round": rnd,
        "servers": len(ports),
        "workers_per_server": 1 if setup == "single" else cfg.workers,
        "client_setting_seen": sorted(seen_setting),
        "loadavg_1m": round(loadavg, 2),
        "elapsed_s": t_end - t_start,
        "polite_requests": len(polite),
        "polite_status": statuses(polite),
        "polite_first_try_pct": 100 * len(polite_ok) / len(polite) if polite else None,
        "polite_p50_ms": ms(pct(polite_ok, 50)),
        "polite_p99_ms": ms(pct(polite_ok, 99)),
        "polite_max_ms": ms(max(polite_ok, default=None)),
        "polite_refusals": reasons_of(polite),
        "crawler_requests": len(crawl),
        "crawler_rate_per_s": len(crawl) / (t_end - t_start),
        "crawler_status": statuses(crawl),
        "crawler_p50_ms": ms(pct([a.latency for a in crawl if a.status == 200], 50)),
        "crawler_refusals": reasons_of(crawl),
        "builds_in_window": len(in_window),
        "crawler_builds_in_window": crawler_in_window,
        "crawler_share_pct": 100 * crawler_in_window / len(in_window) if in_window else None,
        "goodput_per_s": goodput,
        "goodput_pct": 100 * goodput / cfg.capacity,
        "builds_started": builds_started,
        "answers_200": len(built),
        "max_in_flight": max_in_flight,
        "limiter": limiter_delta(before["reach"], after["reach"]),
        "peer_mismatches": sum(
            1 for a in everyone if a.status is not None and a.peer != a.source
        ),
        "errors": sorted({a.error for a in everyone if a.error}),
        "stuck": stuck,
        "server_tracebacks": tracebacks,
    }


def judge(row: dict[str, Any], cfg: Config) -> dict[str, bool]:
    bad = sum(row[f][k] for f in ("polite_status", "crawler_status") for k in ("5xx", "other",
              "error"))  # fmt: skip
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


# -- output ---------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["config"]
    cap = c["active"] / c["build_s"]
    out = [
        "reachlimit fair admission over HTTP: one crawler against polite clients",
        f"machine: {m['platform']}",
        f"         {m['cpu']}, {m['cores']} cores, {m['python']}, load average "
        f"{' '.join(format(x, '.2f') for x in m['loadavg'])} at the start",
        f"         gunicorn {m['gunicorn']}, Flask {m['flask']}, redis-py {m.get('redis_py')}, "
        f"redis-server {m.get('redis_server') or '-'}",
        f"config:  active {c['active']}, queue {c['queue']}, wait {c['wait']:g} s; build "
        f"{c['build_s'] * 1000:g} ms (sleep) -> {cap:g} builds/s; gthread, {c['threads']} "
        "threads per worker",
        f"         single = 1 server x 1 worker (in-process limiter); shared = {c['servers']} "
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
    head = (
        f"{'setup':<7} {'REACHLIMIT_CLIENT':<17} {'rnd':>3} {'load':>5} {'polite':>6} "
        f"{'ok%':>5} {'p50':>6} {'p99':>6} {'crawler':>7} {'req/s':>6} {'share':>6} "
        f"{'builds':>6} {'goodput':>7} {'peak':>4} {'polite 429s':>11} {'crawler 429s':>14} "
        f"{'limiter: full/displ/tmo':>23}"
    )
    out += _common.ruled(head)
    for r in report["results"]:

        def trio(d: dict[str, int]) -> str:
            return f"{d['queue_full']}/{d['displaced']}/{d['timeout']}"

        lim = r["limiter"]
        extra = ""
        for field in ("peer_mismatches", "stuck", "server_tracebacks"):
            if r[field]:
                extra += f"  {field.upper()} {r[field]}"
        if r["errors"]:
            extra += f"  errors {r['errors']}"
        bad = sum(r[f][k] for f in ("polite_status", "crawler_status") for k in ("5xx", "other"))
        if bad:
            extra += f"  5xx/other {bad}"
        out.append(
            f"{r['setup']:<7} {r['variant']:<17} {r['round']:>3} {r['loadavg_1m']:>5.2f} "
            f"{r['polite_requests']:>6} {fmt(r['polite_first_try_pct'], '.0f'):>5} "
            f"{fmt(r['polite_p50_ms'], '.0f'):>6} {fmt(r['polite_p99_ms'], '.0f'):>6} "
            f"{r['crawler_requests']:>7} {r['crawler_rate_per_s']:>6.0f} "
            f"{fmt(r['crawler_share_pct'], '.0f') + '%':>6} {r['builds_in_window']:>6} "
            f"{fmt(r['goodput_pct'], '.0f') + '%':>7} {r['max_in_flight']:>4} "
            f"{trio(r['polite_refusals']):>11} {trio(r['crawler_refusals']):>14} "
            f"{lim['rejected_full']:>11}/{lim['displaced']}/{lim['rejected_timeout']}" + extra
        )
    labels = {
        "polite_first_try_ge_95pct": f"polite ok >= {GOAL_POLITE_PCT:g}%",
        "crawler_served": "crawler served",
        "in_flight_within_limit": f"peak <= {c['active']}",
        "goodput_ge_90pct": f"goodput >= {GOAL_GOODPUT_PCT:g}%",
        "no_5xx_or_errors": "no 5xx/errors",
    }
    out += ["", f"{'goals':<26}  " + "  ".join(labels.values())]
    for r in report["results"]:
        met = r["met"]
        cells = "  ".join(
            f"{('-' if k not in met else 'yes' if met[k] else 'NO'):>{len(lb)}}"
            for k, lb in labels.items()
        )
        out.append(f"{r['setup'] + ' ' + r['variant'] + ' r' + str(r['round']):<26}  {cells}")
    out.append(
        "polite ok and crawler served are judged with remote_addr only (none is the baseline)"
    )
    return _common.closing(out, report)


# -- main -----------------------------------------------------------------------------------


def check_sources(addrs: list[str]) -> None:
    """Every client address can be bound here (Linux routes all of 127/8 to loopback)."""
    for addr in addrs:
        with socket.socket() as s:
            s.bind((addr, 0))


def machine(redis_port: int | None) -> dict[str, Any]:
    return _http.service_machine(
        [("gunicorn", "gunicorn"), ("flask", "flask"), ("redis_py", "redis")], redis_port
    )


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "A crawler against polite clients through the reachlimit Flask extension under "
        "gunicorn, with REACHLIMIT_CLIENT=none (plain FIFO) and remote_addr (fair), in one "
        "worker and in 2 servers x 2 workers on Redis.",
        "5 s per variant instead of 20 (rougher shares): about a minute",
    )
    a_ = p.add_argument
    a_("--duration", type=float, default=None,
       help="measured seconds per variant (default 20, quick 5)")  # fmt: skip
    a_("--lead-s", type=float, default=1.0, help="crawler alone before the polite clients (1)")
    a_("--build-ms", type=float, default=500.0, help="one cold build in ms (default 500)")
    a_("--wait", type=float, default=3.0, help="REACHLIMIT_WAIT in s (default 3)")
    a_("--crawler-connections", type=int, default=12, help="crawler threads (default 12)")
    a_("--crawler-pause-ms", type=float, default=0.0,
       help="the crawler's pause after a non-200 (default 0: back to back)")  # fmt: skip
    a_("--polite", type=int, default=4, help="polite clients, 1 to 20 (default 4)")
    a_("--polite-every", type=float, default=2.0,
       help="seconds between one polite client's requests (default 2)")  # fmt: skip
    a_("--servers", type=int, default=2, help="gunicorn servers of the shared set-up (2)")
    a_("--workers", type=int, default=2, help="workers per server of the shared set-up (2)")
    a_("--threads", type=int, default=24, help="gthread threads per worker (default 24)")
    a_("--rounds", type=int, default=1, help="rounds; the variants' order alternates (1)")
    a_("--timeout", type=float, default=30.0, help="client socket timeout in s (default 30)")
    a_("--setups", default=",".join(SETUPS), help=f"subset of {','.join(SETUPS)}")
    a_("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    plots.add_option(p)
    a = p.parse_args(argv)
    cfg = Config(
        build_s=a.build_ms / 1000,
        wait=a.wait,
        active=2,  # the extension's defaults, not set: the script reads them back below
        queue=8,
        duration_s=a.duration if a.duration is not None else (5.0 if a.quick else 20.0),
        lead_s=a.lead_s,
        crawler_connections=a.crawler_connections,
        crawler_pause_s=a.crawler_pause_ms / 1000,
        polite=a.polite,
        polite_every_s=a.polite_every,
        servers=a.servers,
        workers=a.workers,
        threads=a.threads,
        rounds=a.rounds,
        client_timeout_s=a.timeout,
    )
    setups = [s for s in a.setups.split(",") if s]
    variants = [v for v in a.variants.split(",") if v]
    bad = [x for x in setups if x not in SETUPS] + [x for x in variants if x not in VARIANTS]
    if bad or not setups or not variants:
        p.error(f"unknown or no set-up / variant: {', '.join(bad) or '(none given)'}")
    if min(cfg.build_s, cfg.wait, cfg.duration_s, cfg.polite_every_s, cfg.client_timeout_s) <= 0:
        p.error("need --build-ms, --wait, --duration, --polite-every, --timeout > 0")
    if cfg.lead_s < 0 or cfg.crawler_pause_s < 0:
        p.error("need --lead-s >= 0 and --crawler-pause-ms >= 0")
    if not 1 <= cfg.polite <= 20 or not 1 <= cfg.crawler_connections <= 200:
        p.error("need 1 <= --polite <= 20 and 1 <= --crawler-connections <= 200")
    if min(cfg.servers, cfg.workers, cfg.threads, cfg.rounds) < 1:
        p.error("need --servers, --workers, --threads, --rounds >= 1")

    from reachlimit.flask import Settings

    defaults = Settings()
    if not hasattr(defaults, "client"):
        print("reachlimit.flask has no client option (REACHLIMIT_CLIENT): nothing to compare",
              file=sys.stderr)  # fmt: skip
        return 2
    cfg.active, cfg.queue = defaults.active, defaults.queue
    check_sources([CRAWLER_ADDR, *cfg.polite_addrs()])
    if "shared" in setups and _http.redis_missing():
        return 2

    _http.unwind_on_sigterm()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="reachlimit-fair-") as tmp,
        contextlib.ExitStack() as st,
    ):
        rc = rs = None
        if "shared" in setups:
            rs, rc = _http.shared_redis(st, Path(tmp))
        where = machine(rs.port if rs is not None else None)
        for rnd in range(1, cfg.rounds + 1):
            for setup in setups:
                order = variants if rnd % 2 else variants[::-1]
                for variant in order:
                    row = run_variant(
                        setup, variant, rnd, cfg, rc if setup == "shared" else None,
                        rs.url() if rs is not None and setup == "shared" else None, Path(tmp),
                    )  # fmt: skip
                    row["met"] = judge(row, cfg)
                    results.append(row)
    report: dict[str, Any] = {
        "machine": where,
        "config": {
            **asdict(cfg),
            "quick": a.quick,
            "setups": setups,
            "variants": variants,
            "crawler_addr": CRAWLER_ADDR,
            "polite_addrs": cfg.polite_addrs(),
        },
        "results": results,
        "all_met": all(all(r["met"].values()) for r in results),
        "elapsed_s": time.perf_counter() - started,
    }
    if a.plot is not None:
        plots.fair_admission(report, a.plot)
    return _http.finish(report, a.json, render)


if __name__ == "__main__":
    sys.exit(main())
