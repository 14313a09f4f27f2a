#!/usr/bin/env python3
"""One cold-build budget for a whole service: several gunicorn servers x workers on one Redis.

    python benchmarks/http_redis.py            # defaults: 3 rounds, about 3 minutes
    python benchmarks/http_redis.py --quick    # one short round, about 30 s
    python benchmarks/http_redis.py --json     # the same figures as JSON on stdout

The budget, for the service as a whole: ``active`` builds at once (2), ``queue`` waiting (8),
``wait`` seconds at most (3). Three ways to hold it, side by side:

  process        the reachlimit Flask extension as it ships: an in-process limiter with that
                 budget in every worker (the service runs servers x workers x active at once)
  redis          reachlimit's cache and singleflight per worker, one RedisColdLimiter with that
                 budget shared by all of them (through the Flask extension when it has
                 ``REACHLIMIT_REDIS_URL``, else ``ColdPath(RedisColdLimiter(...))`` in the app;
                 the report says which: ``redis_path``)
  flask-limiter  Flask-Limiter with its Redis storage: a rate of ``active / build time`` per
                 second for the whole service (one key, fixed window), warm keys exempt. It has
                 no concurrency limit; this rate is how a Flask user approximates one

Every round starts one ``redis-server`` (a free loopback port, a temporary directory, stopped by
its PID) for the whole run, and for each variant ``--servers`` gunicorn masters (``-k gthread
--workers W --threads T`` on 127.0.0.1, serving ``benchmarks/http_redis_app.py``), stopped by
PID when the variant is done; Redis is emptied before each variant. The variants' order
rotates from round to round. For each variant:

  warm-up  every client thread sends one cold and one warm request at once (each worker opens
         its Redis connections, each thread serves its first request); once they are over,
         Redis is emptied again, so no figure below counts them

  idle   warm requests only, open loop (one every ``--warm-ms``, each in its own thread,
         spread over the servers), for ``--idle-s``: the baseline
  burst  ``--clients`` client threads released together, each sending distinct cold keys
         (round-robin over the servers) one after another for ``--burst-s``; after a refusal
         (or any answer but 200) a client pauses 0.5 to 1.5 x ``--backoff-ms`` (jitter) before its
         next key. The
         same warm trickle runs for the length of the burst
  idle   the warm-only baseline again, after every build has finished

Figures per variant and round: builds in flight across ALL processes, at most (counted in
Redis around each build, in keys of its own); goodput = builds that finished during the burst
(Redis time, from the clients' release to ``--burst-s`` later) / ``--burst-s``, in builds/s
and as a share of the budget ``active / build time`` (a limiter that never leaves a slot idle
scores at most 1 - build time / burst: nothing can finish in the first build time); cold
requests' 200 / 429 / 5xx / other / transport errors and the latency (client side, connect to
last byte) of the admitted and the refused; warm p50/p99 under the burst, the idle warm p99
(before and after together) and their ratio, and the same for the warm requests that started
after the clients' first wave (``sustained``: from 0.5 s on, or a quarter of a shorter burst);
a PING to Redis every ``--warm-ms`` during the burst; the Redis limiter's global figures for
``redis``.
Over the rounds: the median and the spread of each.

Goals: at most ``active`` builds in flight (worst round); goodput >= 90 % of the budget (median
round); warm p99 under the burst <= 3x idle with every warm request answered 200 (median
round), judged twice: over the whole burst, and sustained (without the first wave); no 5xx,
other status or transport error (any round). Printed, never asserted: the
machine may be shared, and the figures are only as quiet as it is (the load average is printed).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import _http
import redis
from _common import fmt, ms, open_loop, pct
from _http import Sample, cold_figures, fetch, warm_figures

from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

APP = "http_redis_app:create_app()"
VARIANTS = ("process", "redis", "flask-limiter")
WARM_KEYS = [f"warm-{i}" for i in range(16)]  # the keys http_redis_app.py pre-caches
BUILD_KEYS = {  # http_redis_app.BUILD_KEYS (not imported: that module needs Flask)
    "in_flight": "bench:builds:in_flight",
    "max_in_flight": "bench:builds:max_in_flight",
    "started": "bench:builds:started",
    "finished": "bench:builds:finished",
    "finished_at": "bench:builds:finished_at",
}
GOAL_GOODPUT_PCT = 90.0
GOAL_WARM_X_IDLE = 3.0
JOIN_MARGIN_S = 10.0
#: Bounds of the load: cold client threads, and warm requests in one phase (60 s at 20 ms).
MAX_THREADS = 300
MAX_WARM_PER_PHASE = 3000


@dataclass
class Config(_common.Budgeted):
    servers: int
    workers: int
    threads: int
    queue: int
    wait: float
    rate: str
    clients: int
    burst_s: float
    backoff_s: float
    warm_interval_s: float
    idle_s: float
    rounds: int
    client_timeout_s: float
    redis_via: str


# -- processes ------------------------------------------------------------------------------


class BenchServer(_http.BenchGunicorn):
    """One gunicorn master with ``cfg.workers`` gthread workers serving one variant."""

    def __init__(self, variant: str, index: int, cfg: Config, redis_url: str, log_dir: Path):
        super().__init__(
            APP,
            log_dir,
            f"{variant}-{index}",
            env={
                "BENCH_VARIANT": variant,
                "BENCH_REDIS_URL": redis_url,
                "BENCH_BUILD_MS": repr(cfg.build_s * 1000),
                "BENCH_ACTIVE": str(cfg.active),
                "BENCH_QUEUE": str(cfg.queue),
                "BENCH_WAIT": repr(cfg.wait),
                "BENCH_RATE": cfg.rate,
                "BENCH_REDIS_VIA": cfg.redis_via,
            },
            workers=cfg.workers,
            threads=cfg.threads,
        )


def servers_of(
    variant: str, cfg: Config, redis_url: str, log_dir: Path
) -> contextlib.AbstractContextManager[list[BenchServer]]:
    """``cfg.servers`` servers of one variant, each stopped by PID on the way out."""
    return _http.all_serving(
        BenchServer(variant, i, cfg, redis_url, log_dir) for i in range(cfg.servers)
    )


# -- load -----------------------------------------------------------------------------------


def warm_load(
    ports: list[int], kind: str, out: list[Sample], cfg: Config
) -> contextlib.AbstractContextManager[list[int]]:
    """One warm request every ``warm_interval_s``, round-robin over the servers, whether or
    not the earlier ones came back (open loop), for the ``with`` block (at most
    ``MAX_WARM_PER_PHASE``), their samples appended to ``out``; the number of threads still
    running at its end is left in the yielded list."""

    def send(i: int) -> None:
        path = f"/report?key={WARM_KEYS[i % len(WARM_KEYS)]}"
        out.append(fetch(ports[i % len(ports)], path, kind, cfg.client_timeout_s))

    return open_loop(
        send, cfg.warm_interval_s, MAX_WARM_PER_PHASE, cfg.client_timeout_s + JOIN_MARGIN_S, kind
    )


def idle_warm(ports: list[int], cfg: Config) -> tuple[list[Sample], int]:
    out: list[Sample] = []
    with warm_load(ports, "idle", out, cfg) as stuck:
        time.sleep(cfg.idle_s)
    return list(out), stuck[0]


def cold_client(
    i: int,
    ports: list[int],
    tag: str,
    go: threading.Event,
    stop: threading.Event,
    out: list[Sample],
    cfg: Config,
) -> None:
    """Distinct cold keys one after another until ``stop``; a pause of 0.5 to 1.5 times
    ``backoff_s`` after any answer but 200."""
    jitter = random.Random(f"{tag}-{i}")  # its own generator: a client thread shares none
    go.wait()
    n = 0
    while not stop.is_set():
        port = ports[(i + n) % len(ports)]
        sample = fetch(port, f"/report?key={tag}-{i}-{n}", "cold", cfg.client_timeout_s)
        out.append(sample)
        n += 1
        if sample.status != 200:
            # Jittered, as clients that honour a Retry-After should: the refused of one
            # moment must not all come back at the same later moment.
            stop.wait(cfg.backoff_s * jitter.uniform(0.5, 1.5))


def warm_up(ports: list[int], rc: redis.Redis, cfg: Config) -> None:
    """Bring fresh servers to their working state before anything is measured: every client
    thread sends one cold request and one warm one, all at once (new connections to Redis in
    every worker, each thread's first request); then, once every build is over, Redis is
    emptied but for the shared warm cache, so the limiters and the counters start from zero
    (nothing is held or queued)."""
    go = threading.Event()
    out: list[Sample] = []

    def one(i: int) -> None:
        go.wait()
        port = ports[i % len(ports)]
        out.append(fetch(port, f"/report?key=warm-up-{i}", "cold", cfg.client_timeout_s))
        out.append(fetch(port, f"/report?key={WARM_KEYS[0]}", "warm", cfg.client_timeout_s))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(cfg.clients)]
    for t in threads:
        t.start()
    go.set()
    deadline = time.perf_counter() + 2 * cfg.client_timeout_s + JOIN_MARGIN_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    if any(t.is_alive() for t in threads):
        raise RuntimeError("warm-up requests did not come back")
    wait_until(
        "every warm-up build to finish",
        lambda: int(rc.get(BUILD_KEYS["in_flight"]) or 0) <= 0,
        timeout=cfg.wait + cfg.client_timeout_s + JOIN_MARGIN_S,
        interval=0.02,
    )
    # Empty Redis but for the extension's shared warm cache (keys ``{...:cache}:...``): it
    # holds the warm keys, and wiping them would turn the burst's warm requests into builds.
    for key in list(rc.scan_iter(count=1000)):
        if b":cache}:" not in key:
            rc.delete(key)


@contextlib.contextmanager
def redis_pings(port: int, every_s: float) -> Iterator[list[float]]:
    """A PING to Redis every ``every_s`` on a connection of its own, for the ``with`` block:
    how long Redis (and this process) took to answer while the load ran; the round trips, in
    seconds, are in the yielded list once the block is over."""
    out: list[float] = []
    stop = threading.Event()
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                client.ping()
            except redis.RedisError:
                out.append(math.inf)
            else:
                out.append(time.perf_counter() - start)
            stop.wait(every_s)

    thread = threading.Thread(target=probe, name="redis-ping", daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join(timeout=JOIN_MARGIN_S)
        client.close()


def redis_ms(rc: redis.Redis) -> int:
    seconds, micros = rc.time()
    return int(seconds) * 1000 + int(micros) // 1000


def burst(ports: list[int], rc: redis.Redis, cfg: Config) -> dict[str, Any]:
    """The burst with its warm trickle; the build counters read once every build is over."""
    tag = uuid.uuid4().hex[:8]
    cold: list[Sample] = []
    warm: list[Sample] = []
    go, stop = threading.Event(), threading.Event()
    clients = [
        threading.Thread(
            target=cold_client, args=(i, ports, tag, go, stop, cold, cfg), daemon=True
        )
        for i in range(cfg.clients)
    ]
    for t in clients:
        t.start()
    t0_redis = redis_ms(rc)
    port = rc.connection_pool.connection_kwargs["port"]
    with redis_pings(port, cfg.warm_interval_s) as pings, warm_load(
        ports, "warm", warm, cfg
    ) as warm_stuck:
        t0 = time.perf_counter()
        go.set()
        time.sleep(cfg.burst_s)
        stop.set()
    deadline = t0 + cfg.burst_s + cfg.client_timeout_s + JOIN_MARGIN_S
    for t in clients:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    stuck = sum(t.is_alive() for t in clients) + warm_stuck[0]
    wait_until(
        "every build to finish",
        lambda: int(rc.get(BUILD_KEYS["in_flight"]) or 0) <= 0,
        timeout=cfg.wait + cfg.client_timeout_s + JOIN_MARGIN_S,
        interval=0.02,
    )
    ends = [int(x) for x in rc.lrange(BUILD_KEYS["finished_at"], 0, -1)]
    window_end = t0_redis + round(cfg.burst_s * 1000)
    in_window = sum(t0_redis <= t <= window_end for t in ends)
    goodput = in_window / cfg.burst_s
    figures = cold_figures(cold)  # its status and errors named as this report names them
    return {
        "cold_requests": len(cold),
        "cold_status": figures.pop("status"),
        "cold_errors": figures.pop("errors"),
        **figures,
        "builds_started": int(rc.get(BUILD_KEYS["started"]) or 0),
        "builds_finished": len(ends),
        "builds_in_window": in_window,
        "max_in_flight": int(rc.get(BUILD_KEYS["max_in_flight"]) or 0),
        "goodput_per_s": goodput,
        "goodput_pct": 100 * goodput / cfg.capacity,
        **warm_figures(warm, "warm"),
        # The same without the arrival: the clients' first wave costs CPU whatever answers it.
        **warm_figures([s for s in warm if s.start - t0 >= arrival_s(cfg)], "sustained"),
        # Where the warm tail came from: (ms after the burst's start, latency ms), slowest first.
        "warm_slowest": [
            (round((s.start - t0) * 1000), round(s.latency * 1000, 1))
            for s in sorted(warm, key=lambda s: -s.latency)[:5]
        ],
        "redis_ping_p50_ms": ms(pct(pings, 50)),
        "redis_ping_p99_ms": ms(pct(pings, 99)),
        "redis_ping_max_ms": ms(max(pings, default=None)),
        "stuck": stuck,
    }


def arrival_s(cfg: Config) -> float:
    """How long the clients' first wave counts as the arrival (not in the sustained figure)."""
    return min(0.5, cfg.burst_s / 4)


def run_variant(
    variant: str, round_no: int, cfg: Config, rs: RedisServer, log_dir: Path
) -> dict[str, Any]:
    """One variant for one round: fresh Redis contents, fresh servers."""
    rc = redis.Redis(host="127.0.0.1", port=rs.port, socket_timeout=5)
    try:
        rc.flushdb()
        loadavg = os.getloadavg()[0]
        with servers_of(variant, cfg, rs.url(), log_dir) as servers:
            ports = [s.port for s in servers]
            redis_path = servers[0].stats()["redis_path"]
            warm_up(ports, rc, cfg)
            before, stuck_before = idle_warm(ports, cfg)
            row = burst(ports, rc, cfg)
            after, stuck_after = idle_warm(ports, cfg)
            limiter = servers[0].stats()["limiter"]
        tracebacks = sum(s.stderr().count("Traceback") for s in servers)
    finally:
        rc.close()
    idle = before + after
    row.update(warm_figures(idle, "idle"))
    idle_p99 = row["idle_p99_ms"]
    row.update(
        variant=variant,
        round=round_no,
        redis_path=redis_path,
        loadavg_1m=round(loadavg, 2),
        idle_before_p99_ms=ms(pct([s.latency for s in before if s.status == 200], 99)),
        idle_after_p99_ms=ms(pct([s.latency for s in after if s.status == 200], 99)),
        warm_x_idle=row["warm_p99_ms"] / idle_p99
        if row["warm_p99_ms"] is not None and idle_p99
        else None,
        sustained_x_idle=row["sustained_p99_ms"] / idle_p99
        if row["sustained_p99_ms"] is not None and idle_p99
        else None,
        stuck=row["stuck"] + stuck_before + stuck_after,
        server_tracebacks=tracebacks,
        limiter=limiter,
    )
    return row


# -- over the rounds ------------------------------------------------------------------------

CONFIG_FIELDS = tuple(Config.__dataclass_fields__)
SPREAD_FIELDS = (
    "max_in_flight",
    "goodput_pct",
    "refused_p50_ms",
    "refused_p99_ms",
    "admitted_p99_ms",
    "warm_p99_ms",
    "idle_p99_ms",
    "warm_x_idle",
    "sustained_p99_ms",
    "sustained_x_idle",
)


def bad_answers(row: dict[str, Any]) -> int:
    return sum(
        row[f][k] for f in ("cold_status", "warm_status", "idle_status")
        for k in ("5xx", "other", "error")
    )  # fmt: skip


def summarize(variant: str, rows: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Median and spread over the rounds, and the goals."""
    s: dict[str, Any] = {"variant": variant, "rounds": len(rows)}
    for f in SPREAD_FIELDS:
        xs = [r[f] for r in rows if r[f] is not None]
        s[f] = {
            "median": statistics.median(xs) if xs else None,
            "min": min(xs, default=None),
            "max": max(xs, default=None),
        }
    totals: dict[str, dict[str, int]] = {}
    for f in ("cold_status", "warm_status", "idle_status"):
        totals[f] = {k: sum(r[f][k] for r in rows) for k in rows[0][f]}
    s["totals"] = totals
    s["bad_answers"] = sum(bad_answers(r) for r in rows)
    s["stuck"] = sum(r["stuck"] for r in rows)
    s["server_tracebacks"] = sum(r["server_tracebacks"] for r in rows)
    warm_refused = sum(r["warm_samples"] - r["warm_status"]["200"] for r in rows)
    s["warm_not_200"] = warm_refused
    ratio = s["warm_x_idle"]["median"]
    sustained = s["sustained_x_idle"]["median"]
    s["met"] = {
        "in_flight_within_budget": s["max_in_flight"]["max"] <= cfg.active,
        "goodput_ge_90pct": s["goodput_pct"]["median"] is not None
        and s["goodput_pct"]["median"] >= GOAL_GOODPUT_PCT,
        "warm_p99_le_3x_idle": ratio is not None
        and ratio <= GOAL_WARM_X_IDLE
        and warm_refused == 0,
        "sustained_warm_p99_le_3x_idle": sustained is not None
        and sustained <= GOAL_WARM_X_IDLE
        and warm_refused == 0,
        "no_5xx_or_errors": s["bad_answers"] == 0
        and s["stuck"] == 0
        and s["server_tracebacks"] == 0,
    }
    s["all"] = all(s["met"].values())
    return s


# -- output ---------------------------------------------------------------------------------


def yes_no(met: bool) -> str:
    return "yes" if met else "NO"


def spread(d: dict[str, Any], spec: str = ".1f") -> str:
    if d["median"] is None:
        return "-"
    if d["min"] == d["max"]:
        return fmt(d["median"], spec)
    return f"{fmt(d['median'], spec)} ({fmt(d['min'], spec)}-{fmt(d['max'], spec)})"


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["config"]
    cap = c["active"] / c["build_s"]
    paths = sorted({r["redis_path"] for r in report["results"] if r["redis_path"]})
    out = [
        "reachlimit over HTTP: one cold-build budget for several gunicorn servers on one Redis",
        f"machine: {m['platform']}",
        f"         {m['cpu']}, {m['cores']} cores, {m['python']}, load average "
        f"{' '.join(format(x, '.2f') for x in m['loadavg'])} at the start",
        f"         gunicorn {m['gunicorn']}, Flask {m['flask']}, Flask-Limiter "
        f"{m['flask_limiter'] or 'not installed'}, redis-py {m['redis_py']}, "
        f"redis-server {m['redis_server']}",
        f"config:  {c['servers']} servers x {c['workers']} gthread workers x {c['threads']} "
        f"threads; budget active {c['active']}, queue {c['queue']}, wait {c['wait']:g} s; "
        f"build {c['build_s'] * 1000:g} ms (sleep) -> {cap:g} builds/s",
        f"         flask-limiter: \"{c['rate']}\" on /report, fixed window, one key for the "
        f"service, Redis storage, warm keys exempt; redis variant wired through: "
        f"{', '.join(paths) or '-'}",
        f"load:    {c['clients']} client threads x distinct cold keys for {c['burst_s']:g} s "
        f"(pause {c['backoff_s'] * 1000:g} ms after a non-200), warm every "
        f"{c['warm_interval_s'] * 1000:g} ms (open loop); idle warm {c['idle_s']:g} s "
        f"before and after; {c['rounds']} round(s), variant order rotating",
        "latency in ms, client side; inflt = builds in flight across all processes (most); "
        "builds = builds finished during the burst; goodput % of the budget's builds/s;",
        f"sust = warm requests started {arrival_s(Config(**{k: c[k] for k in CONFIG_FIELDS})):g} "
        "s or more after the clients' release (without their first wave); x idle = / idle p99",
        "",
    ]
    out += _common.skipped_notes(report)
    # Kept apart from benchmarks/fair_admission.py:render's head because each table has its
    # own columns and widths; only the f-string layout is alike.
    head = (
        f"{'rnd':>3} {'variant':<13} {'load':>5} {'inflt':>5} {'builds':>6} {'goodput':>7} "
        f"{'cold':>5} {'200':>4} {'429':>4} {'5xx':>3} {'err':>3} {'ok p50':>7} {'p99':>7} "
        f"{'429 p50':>7} {'p99':>6} {'warm p50':>8} {'p99':>6} {'idle p99':>8} {'x idle':>6} "
        f"{'sust p99':>8} {'x idle':>6}"
    )
    out += _common.ruled(head)
    for r in report["results"]:
        st = r["cold_status"]
        extra = ""
        if r["limiter"]:
            lim = r["limiter"]
            extra += (
                f"  limiter: peak {lim['peak_active']}/{lim['peak_queued']}, "
                f"full {lim['rejected_full']}, timeout {lim['rejected_timeout']}"
            )
        extra += f"  ping p99 {fmt(r['redis_ping_p99_ms'])} max {fmt(r['redis_ping_max_ms'])}"
        warm_bad = r["warm_samples"] - r["warm_status"]["200"]
        if warm_bad:
            extra += f"  warm !200 {warm_bad}"
        if r["cold_errors"]:
            extra += f"  errors {r['cold_errors']}"
        if r["stuck"]:
            extra += f"  STUCK {r['stuck']}"
        if r["server_tracebacks"]:
            extra += f"  TRACEBACKS {r['server_tracebacks']}"
        out.append(
            f"{r['round']:>3} {r['variant']:<13} {r['loadavg_1m']:>5.2f} {r['max_in_flight']:>5} "
            f"{r['builds_in_window']:>6} {fmt(r['goodput_pct'], '.0f') + '%':>7} "
            f"{r['cold_requests']:>5} {st['200']:>4} {st['429']:>4} {st['5xx']:>3} "
            f"{st['error'] + st['other']:>3} {fmt(r['admitted_p50_ms']):>7} "
            f"{fmt(r['admitted_p99_ms']):>7} {fmt(r['refused_p50_ms']):>7} "
            f"{fmt(r['refused_p99_ms']):>6} {fmt(r['warm_p50_ms']):>8} "
            f"{fmt(r['warm_p99_ms']):>6} {fmt(r['idle_p99_ms']):>8} {fmt(r['warm_x_idle']):>6} "
            f"{fmt(r['sustained_p99_ms']):>8} {fmt(r['sustained_x_idle']):>6}" + extra
        )
    out += ["", "median over the rounds (min-max)"]
    for s in report["summary"]:
        t = s["totals"]["cold_status"]
        out.append(
            f"  {s['variant']:<13} in flight {spread(s['max_in_flight'], '.0f')}, goodput "
            f"{spread(s['goodput_pct'], '.0f')} %, 429 p50 {spread(s['refused_p50_ms'])} "
            f"p99 {spread(s['refused_p99_ms'])} ms, warm p99 {spread(s['warm_p99_ms'])} ms vs "
            f"idle {spread(s['idle_p99_ms'])} ms = {spread(s['warm_x_idle'])}x (sustained "
            f"{spread(s['sustained_x_idle'])}x); cold "
            f"200/429/5xx {t['200']}/{t['429']}/{t['5xx']}"
        )
    labels = (
        ("in_flight_within_budget", f"in flight <= {c['active']}"),
        ("goodput_ge_90pct", f"goodput >= {GOAL_GOODPUT_PCT:g}%"),
        ("warm_p99_le_3x_idle", f"warm p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
        ("sustained_warm_p99_le_3x_idle", f"sust p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
        ("no_5xx_or_errors", "no 5xx/errors"),
    )
    out += ["", f"{'goals':<13}  " + "  ".join(lb for _, lb in labels) + "  verdict"]
    for s in report["summary"]:
        cells = "  ".join(f"{yes_no(s['met'][k]):>{len(lb)}}" for k, lb in labels)
        out.append(f"{s['variant']:<13}  {cells}  " + ("holds all" if s["all"] else "misses some"))
    out.append(
        "in flight: worst round; goodput and warm: median round (warm also needs every warm "
        "request answered 200); errors: any round;\nwarm p99 is over the whole burst, its "
        "first wave included; sust p99 without it (see above)"
    )
    return _common.closing(out, report)


# -- main -----------------------------------------------------------------------------------


def machine(rs: RedisServer) -> dict[str, Any]:
    return _http.service_machine(
        [("gunicorn", "gunicorn"), ("flask", "flask"), ("flask_limiter", "flask-limiter"),
         ("redis_py", "redis")],
        rs.port,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(
        "Hold one cold-build budget over several gunicorn servers and workers on one Redis: "
        "reachlimit per process, reachlimit on Redis, Flask-Limiter on Redis, side by side.",
        "one short round (20 ms builds, 12 clients, 1 s burst): about 30 s",
    )
    a_ = p.add_argument
    a_("--servers", type=int, default=2, help="gunicorn masters per variant (default 2)")
    a_("--workers", type=int, default=2, help="gthread workers per server (default 2)")
    a_("--threads", type=int, default=16, help="threads per worker (default 16)")
    a_("--active", type=int, default=2, help="builds at once, whole service (default 2)")
    a_("--queue", type=int, default=8, help="waiting builds, whole service (default 8)")
    a_("--wait", type=float, default=None, help="longest wait in s (default 3, quick 1)")
    a_("--build-ms", type=float, default=None, help="one build in ms (default 100, quick 20)")
    a_("--rate", default=None, help='flask-limiter rate (default "<active / build s> per second")')
    a_("--clients", type=int, default=None, help="cold client threads (default 60, quick 12)")
    a_("--burst-s", type=float, default=None, help="length of the burst (default 4, quick 1)")
    a_("--backoff-ms", type=float, default=None,
       help="a client's pause after a non-200 (default 500, quick 100)")
    a_("--warm-ms", type=float, default=20.0, help="one warm request every this many ms")
    a_("--idle-s", type=float, default=None,
       help="idle warm phase, before and after the burst (default 2, quick 0.3)")
    a_("--rounds", type=int, default=None, help="rounds of every variant (default 3, quick 1)")
    a_("--timeout", type=float, default=None, help="client socket timeout in s (default 30)")
    a_("--redis-via", choices=("auto", "library", "extension"), default="auto",
       help="how the redis variant is wired (default auto: the extension if it has redis_url)")
    a_("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    a = p.parse_args(argv)
    q = a.quick

    def pick(value: Any, default: Any, quick: Any) -> Any:
        return value if value is not None else (quick if q else default)

    build_s = pick(a.build_ms, 100.0, 20.0) / 1000
    cfg = Config(
        servers=a.servers,
        workers=a.workers,
        threads=a.threads,
        active=a.active,
        queue=a.queue,
        wait=pick(a.wait, 3.0, 1.0),
        build_s=build_s,
        rate=a.rate or f"{max(1, round(a.active / build_s))} per second",
        clients=pick(a.clients, 60, 12),
        burst_s=pick(a.burst_s, 4.0, 1.0),
        backoff_s=pick(a.backoff_ms, 500.0, 100.0) / 1000,
        warm_interval_s=a.warm_ms / 1000,
        idle_s=pick(a.idle_s, 2.0, 0.3),
        rounds=pick(a.rounds, 3, 1),
        client_timeout_s=pick(a.timeout, 30.0, 10.0),
        redis_via=a.redis_via,
    )
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        p.error(f"unknown variant(s): {', '.join(unknown) or '(none given)'}")
    if min(cfg.servers, cfg.workers, cfg.threads, cfg.active, cfg.clients, cfg.rounds) < 1:
        p.error("need --servers, --workers, --threads, --active, --clients, --rounds >= 1")
    if cfg.queue < 0 or min(cfg.wait, cfg.build_s, cfg.burst_s, cfg.idle_s) <= 0:
        p.error("need --queue >= 0 and --wait, --build-ms, --burst-s, --idle-s > 0")
    if cfg.backoff_s < 0 or cfg.warm_interval_s <= 0 or cfg.client_timeout_s <= 0:
        p.error("need --backoff-ms >= 0, --warm-ms > 0, --timeout > 0")
    if cfg.clients > MAX_THREADS:
        p.error(f"--clients is at most {MAX_THREADS}")
    if _http.redis_missing():
        return 2

    skipped = _http.skip_flask_limiter(variants, "pip install -e '.[bench]'", a.json)

    _http.unwind_on_sigterm()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reachlimit-http-redis-") as tmp:
        rs = RedisServer(Path(tmp))
        rs.start()
        try:
            where = machine(rs)
            for r in range(cfg.rounds):
                k = r % len(variants)
                for variant in variants[k:] + variants[:k]:
                    results.append(run_variant(variant, r + 1, cfg, rs, Path(tmp)))
        finally:
            rs.stop()
    summary = [
        summarize(v, [r for r in results if r["variant"] == v], cfg) for v in variants
    ]
    report: dict[str, Any] = {
        "machine": where,
        "config": {**asdict(cfg), "quick": q, "variants": variants},
        "skipped": skipped,
        "results": results,
        "summary": summary,
        "holders": [s["variant"] for s in summary if s["all"]],
        "elapsed_s": time.perf_counter() - started,
    }
    return _http.finish(report, a.json, render)


if __name__ == "__main__":
    sys.exit(main())
