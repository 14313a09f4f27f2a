#!/usr/bin/env python3
"""One cold-build budget for a whole service: several gunicorn servers x workers on one Redis,
three ways to hold it, side by side.

    python benchmarks/http_redis.py            # 3 rounds, about 3 minutes
    python benchmarks/http_redis.py --quick    # one short round, about 30 s

The budget, for the service as a whole: ``active`` builds at once (2), ``queue`` waiting (8),
``wait`` seconds at most (3). The variants (``benchmarks/app.py``):

  process        the reachlimit extension as it ships: an in-process limiter with that budget
                 in every worker (the service runs servers x workers x active at once)
  redis          the extension on Redis (``REACHLIMIT_REDIS_URL``): one budget for all of them
  flask-limiter  Flask-Limiter with its Redis storage: a rate of ``active / build time`` per
                 second for the whole service (one key, fixed window), warm keys exempt. It has
                 no concurrency limit; this rate is how a Flask user approximates one

One ``redis-server`` for the run (``_load.own_redis``); for each variant ``--servers`` gunicorn
masters (``-k gthread --workers W --threads T`` on 127.0.0.1), stopped by PID when the variant
is done; Redis emptied before each; the variants' order rotating from round to round. Every
build is counted in Redis (every process together). For each variant:

  warm-up  every client sends one cold and one warm request at once (each worker opens its
           Redis connections, each thread serves its first request); once every build is
           over, Redis is emptied again but for the shared warm cache
  idle     warm requests only, open loop (one every ``--warm-ms``, spread over the servers),
           for ``--idle-s``: the baseline
  burst    ``--clients`` closed-loop clients (``_load.Clients``), each sending distinct cold
           keys one after another (round-robin over the servers) for ``--burst-s``, pausing
           0.5 to 1.5 x ``--backoff-ms`` after any answer but 200; the warm trickle beside it,
           and a PING to Redis every ``--warm-ms``
  idle     the warm-only baseline again, after every build has finished

Figures per variant and round: builds in flight across all processes, at most; goodput =
cold requests answered 200 (each a build: every key is new) that came back during the burst,
per second and as a share of ``active / build time`` (a limiter that never leaves a slot idle
scores at most 1 - build time / burst); the cold requests' statuses and the latency of the
admitted and the refused; warm p50/p99 under the burst against the idle warm p99, and the same
for the warm requests that started after the clients' first wave (``sustained``: from 0.5 s
on, or a quarter of a shorter burst); the PING's round trips; the Redis limiter's global
figures for ``redis``. Over the rounds: the median and the spread of each.

Goals: at most ``active`` builds in flight (worst round); goodput >= 90 % of the budget (median
round); warm p99 under the burst <= 3x idle with every warm request answered 200 (median
round), judged over the whole burst and sustained; no 5xx, other status or transport error
(any round).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _load
import _report
from _load import Answer, Server
from _report import fmt, ms, pct

from tests.support.waiting import wait_until

VARIANTS = ("process", "redis", "flask-limiter")
GOAL_GOODPUT_PCT = 90.0
GOAL_WARM_X_IDLE = 3.0
#: Bounds of the load: cold client threads, and warm requests in one phase (60 s at 20 ms).
MAX_THREADS = 300
MAX_WARM_PER_PHASE = 3000
SPREAD_FIELDS = ("max_in_flight", "goodput_pct", "refused_p50_ms", "refused_p99_ms",
                 "admitted_p99_ms", "warm_p99_ms", "idle_p99_ms", "warm_x_idle",
                 "sustained_p99_ms", "sustained_x_idle")  # fmt: skip
MARKS = (
    ("in_flight_within_budget", "in flight <= active"),
    ("goodput_ge_90pct", f"goodput >= {GOAL_GOODPUT_PCT:g}%"),
    ("warm_p99_le_3x_idle", f"warm p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
    ("sustained_warm_p99_le_3x_idle", f"sust p99 <= {GOAL_WARM_X_IDLE:g}x idle"),
    ("no_5xx_or_errors", "no 5xx/errors"),
)


@dataclass
class Config(_load.Budget):
    servers: int
    workers: int
    threads: int
    rate: str
    clients: int
    burst_s: float
    backoff_s: float
    warm_interval_s: float
    idle_s: float
    rounds: int
    client_timeout_s: float

    @property
    def arrival_s(self) -> float:
        """How long the clients' first wave counts as the arrival (not in ``sustained``)."""
        return min(0.5, self.burst_s / 4)


def servers_of(variant: str, cfg: Config, url: str, log_dir: Path) -> Any:
    env = {"BENCH_POLICY": "flask-limiter" if variant == "flask-limiter" else "reachlimit",
           "BENCH_REDIS_URL": url, "BENCH_BUILD_MS": repr(cfg.build_s * 1000),
           "BENCH_RATE": cfg.rate, "REACHLIMIT_ACTIVE": str(cfg.active),
           "REACHLIMIT_QUEUE": str(cfg.queue), "REACHLIMIT_WAIT": repr(cfg.wait)}  # fmt: skip
    if variant == "redis":
        env["REACHLIMIT_REDIS_URL"] = url
    return _load.serving_all(Server(f"{variant}-{i}", env, log_dir, cfg.workers, cfg.threads)
                             for i in range(cfg.servers))  # fmt: skip


def warm_trickle(ports: list[int], kind: str, out: list[Answer], cfg: Config) -> Any:
    """One warm request every ``warm_interval_s``, round-robin over the servers, open loop,
    for a ``with`` block; its yielded list says how many were still running at its end."""

    def send(i: int) -> None:
        path = f"/report?key={_load.WARM_KEYS[i % len(_load.WARM_KEYS)]}"
        out.append(_load.get(ports[i % len(ports)], path, kind, cfg.client_timeout_s))

    return _load.open_loop(send, cfg.warm_interval_s, MAX_WARM_PER_PHASE,
                           cfg.client_timeout_s + _load.JOIN_MARGIN_S, kind)  # fmt: skip


def idle_warm(ports: list[int], cfg: Config) -> tuple[list[Answer], int]:
    out: list[Answer] = []
    with warm_trickle(ports, "idle", out, cfg) as stuck:
        time.sleep(cfg.idle_s)  # the phase measured, not a wait for a state
    return list(out), stuck[0]


def no_build_running(server: Server, cfg: Config) -> None:
    wait_until("every build to finish", lambda: server.stats()["builds"]["in_flight"] <= 0,
               timeout=cfg.wait + cfg.client_timeout_s + _load.JOIN_MARGIN_S, interval=0.02)


def warm_up(servers: list[Server], rc: Any, cfg: Config) -> None:
    """Fresh servers to their working state before anything is measured (see the module's
    design); then Redis emptied but for the extension's shared warm cache (its keys
    ``{...:cache}:...``: wiping them would turn the burst's warm requests into builds)."""
    ports = [s.port for s in servers]
    requests = [r for i in range(cfg.clients) for r in (
        _load.Request(0.0, "cold", f"warm-up-{i}"), _load.Request(0.0, "warm", "warm-0"))]
    answers, stuck, _ = _load.release(requests, lambda i, r: _load.get(
        ports[i // 2 % len(ports)], f"/report?key={r.key}", r.kind, cfg.client_timeout_s),
        2 * cfg.client_timeout_s + _load.JOIN_MARGIN_S)  # fmt: skip
    if stuck or len(answers) != len(requests):
        raise RuntimeError("warm-up requests did not come back")
    no_build_running(servers[0], cfg)
    for key in list(rc.scan_iter(count=1000)):
        if b":cache}:" not in key:
            rc.delete(key)


@contextlib.contextmanager
def redis_pings(port: int, every_s: float) -> Iterator[list[float]]:
    """A PING to Redis every ``every_s`` on a connection of its own, for the ``with`` block:
    how long Redis (and this process) took to answer while the load ran, in seconds, in the
    yielded list once the block is over."""
    import redis

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
        thread.join(timeout=_load.JOIN_MARGIN_S)
        client.close()


def burst(servers: list[Server], redis_port: int, cfg: Config) -> dict[str, Any]:
    """The burst with its warm trickle; the build counts read once every build is over."""
    ports = [s.port for s in servers]
    tag = uuid.uuid4().hex[:8]
    cold: list[Answer] = []
    warm: list[Answer] = []

    def send(i: int, n: int) -> Answer:
        return _load.get(ports[(i + n) % len(ports)], f"/report?key={tag}-{i}-{n}", "cold",
                         cfg.client_timeout_s)  # fmt: skip

    with redis_pings(redis_port, cfg.warm_interval_s) as pings, \
            warm_trickle(ports, "warm", warm, cfg) as warm_stuck:
        t0 = time.time()
        clients = _load.Clients(cfg.clients, send, cold, (cfg.backoff_s / 2, cfg.backoff_s * 1.5),
                                seed=tag, name="cold")  # fmt: skip
        time.sleep(cfg.burst_s)  # the burst itself
        stuck = clients.stop(cfg.client_timeout_s + _load.JOIN_MARGIN_S)
    no_build_running(servers[0], cfg)
    builds = servers[0].stats()["builds"]
    in_window = sum(a.status == 200 and t0 <= a.end <= t0 + cfg.burst_s for a in cold)
    goodput = in_window / cfg.burst_s
    figures = _load.cold_figures(cold)
    return {
        "cold_requests": len(cold),
        "cold_status": figures.pop("status"),
        "cold_errors": figures.pop("errors"),
        **figures,
        "builds_started": builds["started"],
        "builds_finished": builds["finished"],
        "builds_in_window": in_window,
        "max_in_flight": builds["max_in_flight"],
        "goodput_per_s": goodput,
        "goodput_pct": 100 * goodput / cfg.capacity,
        **_load.warm_figures(warm, "warm"),
        # The same without the arrival: the clients' first wave costs CPU whatever answers it.
        **_load.warm_figures([a for a in warm if a.start - t0 >= cfg.arrival_s], "sustained"),
        # Where the warm tail came from: (ms after the burst's start, latency ms), slowest first.
        "warm_slowest": [(round((a.start - t0) * 1000), round(a.latency * 1000, 1))
                         for a in sorted(warm, key=lambda a: -a.latency)[:5]],
        "redis_ping_p50_ms": ms(pct(pings, 50)),
        "redis_ping_p99_ms": ms(pct(pings, 99)),
        "redis_ping_max_ms": ms(max(pings, default=None)),
        "stuck": stuck + warm_stuck[0],
    }


def run_variant(variant: str, round_no: int, cfg: Config,
                where: _load.Place) -> dict[str, Any]:  # fmt: skip
    """One variant for one round: fresh Redis contents, fresh servers."""
    where.client.flushdb()
    loadavg = _report.loadavg()[0]
    with servers_of(variant, cfg, where.redis.url(), where.dir) as servers:
        ports = [s.port for s in servers]
        redis_path = servers[0].stats()["redis_path"]
        warm_up(servers, where.client, cfg)
        before, stuck_before = idle_warm(ports, cfg)
        row = burst(servers, where.redis.port, cfg)
        after, stuck_after = idle_warm(ports, cfg)
        limiter = servers[0].stats()["reach"] if variant == "redis" else None
    row.update(_load.warm_figures(before + after, "idle"))
    row.update(
        variant=variant, round=round_no, redis_path=redis_path, loadavg_1m=loadavg,
        idle_before_p99_ms=ms(pct(_load.latencies(before, 200), 99)),
        idle_after_p99_ms=ms(pct(_load.latencies(after, 200), 99)),
        warm_x_idle=_report.ratio_of(row["warm_p99_ms"], row["idle_p99_ms"]),
        sustained_x_idle=_report.ratio_of(row["sustained_p99_ms"], row["idle_p99_ms"]),
        stuck=row["stuck"] + stuck_before + stuck_after,
        server_tracebacks=sum(s.tracebacks() for s in servers), limiter=limiter,
    )  # fmt: skip
    return row


def summarize(variant: str, rows: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Median and spread over the rounds, and the goals."""
    s: dict[str, Any] = {"variant": variant, "rounds": len(rows)}
    for f in SPREAD_FIELDS:
        xs = [r[f] for r in rows if r[f] is not None]
        s[f] = {"median": statistics.median(xs) if xs else None, "min": min(xs, default=None),
                "max": max(xs, default=None)}  # fmt: skip
    s["totals"] = {f: {k: sum(r[f][k] for r in rows) for k in rows[0][f]}
                   for f in ("cold_status", "warm_status", "idle_status")}  # fmt: skip
    s["bad_answers"] = sum(_load.bad(r[f]) for r in rows
                           for f in ("cold_status", "warm_status", "idle_status"))  # fmt: skip
    s["stuck"] = sum(r["stuck"] for r in rows)
    s["server_tracebacks"] = sum(r["server_tracebacks"] for r in rows)
    s["warm_not_200"] = warm_refused = sum(r["warm_samples"] - r["warm_status"]["200"]
                                           for r in rows)  # fmt: skip
    ratio, sustained = s["warm_x_idle"]["median"], s["sustained_x_idle"]["median"]
    goodput = s["goodput_pct"]["median"]
    s["met"] = {
        "in_flight_within_budget": s["max_in_flight"]["max"] <= cfg.active,
        "goodput_ge_90pct": goodput is not None and goodput >= GOAL_GOODPUT_PCT,
        "warm_p99_le_3x_idle": ratio is not None and ratio <= GOAL_WARM_X_IDLE
        and warm_refused == 0,
        "sustained_warm_p99_le_3x_idle": sustained is not None and sustained <= GOAL_WARM_X_IDLE
        and warm_refused == 0,
        "no_5xx_or_errors": s["bad_answers"] == s["stuck"] == s["server_tracebacks"] == 0,
    }
    s["all"] = all(s["met"].values())
    return s


def spread(d: dict[str, Any], spec: str = ".1f") -> str:
    if d["median"] is None:
        return "-"
    if d["min"] == d["max"]:
        return fmt(d["median"], spec)
    return f"{fmt(d['median'], spec)} ({fmt(d['min'], spec)}-{fmt(d['max'], spec)})"


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    paths = sorted({r["redis_path"] for r in report["results"] if r["redis_path"]})
    out = [
        *_load.head("reachlimit over HTTP: one cold-build budget for several gunicorn servers "
                    "on one Redis", report),
        f"config:  {c['servers']} servers x {c['workers']} gthread workers x {c['threads']} "
        f"threads",
        f"         flask-limiter: \"{c['rate']}\" on /report, fixed window, one key for the "
        f"service, Redis storage, warm keys exempt; redis variant wired through: "
        f"{', '.join(paths) or '-'}",
        f"load:    {c['clients']} clients x distinct cold keys for {c['burst_s']:g} s (pause "
        f"{c['backoff_s'] * 1000:g} ms after a non-200), warm every "
        f"{c['warm_interval_s'] * 1000:g} ms (open loop); idle warm {c['idle_s']:g} s before "
        f"and after; {c['rounds']} round(s), variant order rotating",
        "latency in ms, client side; inflt = builds in flight across all processes (most); "
        "builds = cold 200s back during the burst; goodput % of the budget's builds/s;",
        f"sust = warm requests started {min(0.5, c['burst_s'] / 4):g} s or more after the "
        "clients' release (without their first wave); x idle = / idle p99",
        "", *_load.skipped_notes(report),
    ]
    head = (f"{'rnd':>3} {'variant':<13} {'load':>5} {'inflt':>5} {'builds':>6} {'goodput':>7} "
            f"{'cold':>5} {'200':>4} {'429':>4} {'5xx':>3} {'err':>3} {'ok p50':>7} {'p99':>7} "
            f"{'429 p50':>7} {'p99':>6} {'warm p50':>8} {'p99':>6} {'idle p99':>8} "
            f"{'x idle':>6} {'sust p99':>8} {'x idle':>6}")
    out += _report.ruled(head)
    for r in report["results"]:
        st = r["cold_status"]
        extra = ""
        if r["limiter"]:
            lim = r["limiter"]
            extra += (f"  limiter: peak {lim['peak_active']}/{lim['peak_queued']}, full "
                      f"{lim['rejected_full']}, timeout {lim['rejected_timeout']}")
        extra += f"  ping p99 {fmt(r['redis_ping_p99_ms'])} max {fmt(r['redis_ping_max_ms'])}"
        warm_bad = r["warm_samples"] - r["warm_status"]["200"]
        for label, value in (("warm !200", warm_bad), ("errors", r["cold_errors"]),
                             ("STUCK", r["stuck"]), ("TRACEBACKS", r["server_tracebacks"])):
            extra += f"  {label} {value}" if value else ""
        out.append(
            f"{r['round']:>3} {r['variant']:<13} {r['loadavg_1m']:>5.2f} {r['max_in_flight']:>5} "
            f"{r['builds_in_window']:>6} {fmt(r['goodput_pct'], '.0f') + '%':>7} "
            f"{r['cold_requests']:>5} {st['200']:>4} {st['429']:>4} {st['5xx']:>3} "
            f"{st['error'] + st['other']:>3} {fmt(r['admitted_p50_ms']):>7} "
            f"{fmt(r['admitted_p99_ms']):>7} {fmt(r['refused_p50_ms']):>7} "
            f"{fmt(r['refused_p99_ms']):>6} {fmt(r['warm_p50_ms']):>8} "
            f"{fmt(r['warm_p99_ms']):>6} {fmt(r['idle_p99_ms']):>8} {fmt(r['warm_x_idle']):>6} "
            f"{fmt(r['sustained_p99_ms']):>8} {fmt(r['sustained_x_idle']):>6}" + extra)
    out += ["", "median over the rounds (min-max)"]
    for s in report["summary"]:
        t = s["totals"]["cold_status"]
        out.append(
            f"  {s['variant']:<13} in flight {spread(s['max_in_flight'], '.0f')}, goodput "
            f"{spread(s['goodput_pct'], '.0f')} %, 429 p50 {spread(s['refused_p50_ms'])} "
            f"p99 {spread(s['refused_p99_ms'])} ms, warm p99 {spread(s['warm_p99_ms'])} ms vs "
            f"idle {spread(s['idle_p99_ms'])} ms = {spread(s['warm_x_idle'])}x (sustained "
            f"{spread(s['sustained_x_idle'])}x); cold 200/429/5xx {t['200']}/{t['429']}/{t['5xx']}")
    out += ["", *_load.goal_table(report["summary"], MARKS, "variant"),
            "in flight: worst round; goodput and warm: median round (warm also needs every warm "
            "request answered 200); errors: any round"]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "one short round (20 ms builds, 12 clients, 1 s burst): about 30 s")
    settle = _report.options(p, servers=2, workers=2, threads=16, active=2, queue=8,
                             wait=(3.0, 1.0), build_ms=(100.0, 20.0), rate=None,
                             clients=(60, 12), warm_ms=20.0, idle_s=(2.0, 0.3), rounds=(3, 1),
                             timeout=(30.0, 10.0))
    p.add_argument("--burst-s", type=float, default=None,
                   help="length of the burst (default 4, quick 1)")
    p.add_argument("--backoff-ms", type=float, default=None,
                   help="a client's pause after a non-200 (default 500, quick 100)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    a = p.parse_args(argv)
    settle(a)
    cfg = Config(
        servers=a.servers, workers=a.workers, threads=a.threads, active=a.active, queue=a.queue,
        wait=a.wait, build_s=a.build_ms / 1000,
        rate=a.rate or f"{max(1, round(a.active * 1000 / a.build_ms))} per second",
        clients=a.clients, burst_s=a.burst_s or (1.0 if a.quick else 4.0),
        backoff_s=(a.backoff_ms if a.backoff_ms is not None else 100 if a.quick else 500) / 1000,
        warm_interval_s=a.warm_ms / 1000, idle_s=a.idle_s, rounds=a.rounds,
        client_timeout_s=a.timeout,
    )  # fmt: skip
    variants = _load.selection(p, a.variants, VARIANTS, "variant")
    if cfg.burst_s <= 0 or cfg.backoff_s < 0:
        p.error("need --burst-s > 0 and --backoff-ms >= 0")
    if cfg.clients > MAX_THREADS:
        p.error(f"--clients is at most {MAX_THREADS}")
    skipped = _load.skip_flask_limiter(variants, a.json)
    report = _report.start("http_redis")
    results: list[dict[str, Any]] = []
    with _load.place(report, "http-redis", redis=True) as where:
        for r in range(cfg.rounds):
            k = r % len(variants)
            for variant in variants[k:] + variants[:k]:
                results.append(run_variant(variant, r + 1, cfg, where))
    summary = [summarize(v, [r for r in results if r["variant"] == v], cfg) for v in variants]
    report.update(
        config={**asdict(cfg), "quick": a.quick, "variants": variants}, skipped=skipped,
        results=results, summary=summary, holders=[s["variant"] for s in summary if s["all"]],
        figures={
            **{f"{s['variant']} most builds at once": s["max_in_flight"]["max"] for s in summary},
            **{f"redis {k}": v for s in summary if s["variant"] == "redis" for k, v in (
                ("goodput %", s["goodput_pct"]["median"]),
                ("warm p99 x idle", s["warm_x_idle"]["median"]))},
        },
    )  # fmt: skip
    return _report.finish(report, a, render)


if __name__ == "__main__":
    sys.exit(main())
