#!/usr/bin/env python3
"""The over-admission when Redis comes back: how many builds run at once, service-wide, in
the second after an outage of the shared budget's Redis.

    python benchmarks/redis_recovery.py              # 5 rounds, both kinds of outage: ~2 min
    python benchmarks/redis_recovery.py --rounds 10  # more rounds
    python benchmarks/redis_recovery.py --quick      # 1 round of each kind: ~30 s

The service: ``--servers`` gunicorn masters (the shipped ``webapp/gunicorn.conf.py``) x
``--workers`` gthread workers serving ``tests.apps.build_log_app`` on one ``redis-server``
(a free loopback port, a temporary directory, stopped by its PID), one budget of ``active``
builds at once and ``queue`` waiting for the whole service (the extension's defaults, 2 and
8, REACHLIMIT_WAIT 3 s), builds of ``--build-ms``. Every build writes its start and end to
one log shared by every process, so the builds running at once service-wide are read along
that log (``at_once_along``), never from a sampled gauge.

The load, bounded: ``--clients`` closed-loop clients (``_load.Clients``, at most 64), each
sending distinct cold keys one after another, round-robin over the servers, pausing 50 to 150
ms after any answer but 200; at most ``--clients`` requests are ever in flight. Loopback only.

A round (one for each kind of outage asked for, ``--outage``):

    steady   the load on Redis for ``--steady-s``: at most ``active`` builds at once
    outage   Redis killed (``kill``: SIGKILL, then started again empty on the same port and
             directory) or paused (``pause``: SIGSTOP, then SIGCONT) for ``--outage-s``; each
             worker notices at its next call and falls back to its in-process limiter (at
             most ``active`` builds in each process)
    back     from the moment Redis answers again: every worker's probe thread notices within
             its backoff (0.25 s doubled up to 5 s) and logs "answers again", found by polling
             the servers' logs; from then on every acquire goes to Redis, while the builds the
             fallback admitted run to their end and its queued waiters keep their places
    settle   the load goes on for ``--settle-s`` before the next round

Figures per round, each the most builds at once along the build log in a window:
``before`` (the steady phase), ``during`` (the outage), ``after_1s`` (the second after Redis
answered again: workers that have not noticed yet still admit on their fallback),
``after_back_1s`` (the second after every worker said Redis is back: what the fallback still
has running beside Redis, and its queued waiters it still admits), ``after_back_2nd_s`` (the
second after that: the fallback draining); and ``back_ms`` (from Redis answering to the last
worker's line).
Over the rounds: min, median and max of each, per kind of outage, next to the bound
``active x (1 + processes)`` (Redis's budget, plus each process's fallback full). The machine
and its load average are printed at the start and at the end: the figures are only as quiet
as the machine. No 5xx and no transport error are reported as goals.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _load
import _report
from _load import Answer, Clients

from tests.support.gunicorn_server import GunicornServer
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

OUTAGES = ("kill", "pause")
MAX_CLIENTS = 64
#: The most a round waits for every worker to say Redis is back (the backoff's cap is 5 s).
BACK_DEADLINE_S = 20.0
#: How often the build log's length is sampled during a round.
SAMPLE_S = 0.005
#: A worker's lines saying Redis is away and back, in the shipped config's log format.
BACK_LINE, DOWN_LINE = _load.REDIS_BACK_LINE, _load.REDIS_DOWN_LINE
ACTIVE, QUEUE, WAIT_S = 2, 8, 3.0  # the extension's defaults (REACHLIMIT_WAIT 3 s)
#: The figures of a round, summed up over the rounds.
FIELDS = ("before", "during", "after_1s", "after_back_1s", "after_back_2nd_s", "back_ms")


@dataclass
class Config:
    servers: int
    workers: int
    clients: int
    build_s: float
    steady_s: float
    outage_s: float
    settle_s: float
    rounds: int
    outages: list[str]
    active: int = ACTIVE
    queue: int = QUEUE
    wait_s: float = WAIT_S

    @property
    def bound(self) -> int:
        """Redis's budget plus every process's fallback full."""
        return self.active * (1 + self.servers * self.workers)


# -- the build log -----------------------------------------------------------------------------


class BuildLog:
    """The log every build of every process writes (``tests.apps.build_log_app``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def lines(self) -> int:
        path = self.dir / "log"
        if not path.exists():
            return 0
        with path.open("rb") as f:
            return sum(1 for _ in f)

    def peak(self, first: int, last: int) -> int:
        """The most builds running at once from just before line ``first`` to line ``last``
        (line counts as :meth:`lines` returned them)."""
        from tests.apps.build_log_app import at_once_along

        counts = at_once_along(self.dir)
        window = counts[max(0, first - 1):last]
        return max(window, default=0)


class Sampler:
    """The build log's length every ``SAMPLE_S``, with the time, while a round runs."""

    def __init__(self, log: BuildLog) -> None:
        self.log = log
        # The first sample now, so that every time from now on has one at or before it;
        # the rest appended by the thread only.
        self.samples: list[tuple[float, int]] = [(time.perf_counter(), log.lines())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append((time.perf_counter(), self.log.lines()))

    def at(self, t: float) -> int:
        """The log's length at time ``t`` (the last sample taken at or before it; ``t`` is
        never before the first sample)."""
        return [n for when, n in self.samples if when <= t][-1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# -- the service ------------------------------------------------------------------------------


def service(log_dir: Path, log: BuildLog, url: str, cfg: Config) -> list[GunicornServer]:
    from tests.support.redis_sentinel import Gate, build_log_server

    env = {
        "REACHLIMIT_REDIS_PREFIX": "recovery",
        "REACHLIMIT_ACTIVE": str(cfg.active),
        "REACHLIMIT_QUEUE": str(cfg.queue),
        "REACHLIMIT_WAIT": repr(cfg.wait_s),
        "BUILD_SECONDS": repr(cfg.build_s),
    }
    return [
        build_log_server(log_dir, f"server-{i}", Gate(log.dir), url, env, workers=cfg.workers)
        for i in range(cfg.servers)
    ]


def lines_of(servers: list[GunicornServer], pattern: re.Pattern[str], since: list[int]) -> set[int]:
    """The workers with a line matching ``pattern`` after the offsets ``since`` (one per
    server's log)."""
    found: set[int] = set()
    for server, offset in zip(servers, since, strict=True):
        found |= {int(m.group(1)) for m in pattern.finditer(server.stderr()[offset:])}
    return found


# -- the load ---------------------------------------------------------------------------------


def load(ports: list[int], clients: int, timeout_s: float, answers: list[Answer]) -> Clients:
    """``clients`` closed-loop clients, each sending distinct cold keys one after another
    (round-robin over ``ports``), pausing 50 to 150 ms after any answer but 200."""
    return Clients(clients, lambda i, n: _load.get(ports[(i + n) % len(ports)],
                                                   f"/report/c{i}-{n}", "cold", timeout_s),
                   answers, (0.05, 0.15), name="client")  # fmt: skip


def statuses(answers: list[Answer], start: float, end: float) -> Counter[str]:
    """The statuses of the requests sent between ``start`` and ``end`` (the wall clock)."""
    return Counter(str(a.status) if a.status is not None else "error"
                   for a in list(answers) if start <= a.start < end)  # fmt: skip


# -- one round ---------------------------------------------------------------------------------


def one_round(kind: str, redis_server: RedisServer, servers: list[GunicornServer],
              log: BuildLog, answers: list[Answer], cfg: Config) -> dict[str, Any]:
    sampler = Sampler(log)
    try:
        began, began_wall = time.perf_counter(), time.time()
        time.sleep(cfg.steady_s)  # the load on Redis: the phase measured, not a wait
        offsets = [len(s.stderr()) for s in servers]
        out_at = time.perf_counter()
        port = redis_server.port
        if kind == "kill":
            os.kill(redis_server.pid, signal.SIGKILL)
            redis_server.stop()  # reaped
            time.sleep(cfg.outage_s)  # the outage itself
            redis_server.start(port=port, attempts=1)  # empty, same port, same directory
        else:
            os.kill(redis_server.pid, signal.SIGSTOP)
            try:
                time.sleep(cfg.outage_s)  # the outage itself
            finally:
                os.kill(redis_server.pid, signal.SIGCONT)
        back_at = time.perf_counter()  # Redis answers again (start waited for its PING)
        noticed = lines_of(servers, DOWN_LINE, offsets)

        def all_back() -> bool:
            return lines_of(servers, BACK_LINE, offsets) >= noticed

        wait_until("every worker that noticed the outage saying Redis is back", all_back,
                   timeout=BACK_DEADLINE_S, interval=0.01)
        all_back_at = time.perf_counter()
        time.sleep(max(2.0, cfg.settle_s))  # the two seconds after it: the load settling
        end_wall = time.time()
    finally:
        sampler.stop()
    at = sampler.at
    return {
        "outage": kind,
        "noticed_by": len(noticed),
        "before": log.peak(at(began), at(out_at)),
        "during": log.peak(at(out_at), at(back_at)),
        "after_1s": log.peak(at(back_at), at(back_at + 1.0)),
        "after_back_1s": log.peak(at(all_back_at), at(all_back_at + 1.0)),
        "after_back_2nd_s": log.peak(at(all_back_at + 1.0), at(all_back_at + 2.0)),
        "back_ms": round((all_back_at - back_at) * 1000, 1),
        "statuses": dict(statuses(answers, began_wall, end_wall)),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summary(rounds: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in cfg.outages:
        mine = [r for r in rounds if r["outage"] == kind]
        if mine:
            out[kind] = {
                field: spread([r[field] for r in mine])
                for field in FIELDS
            }
    return out


def run(cfg: Config, report: dict[str, Any]) -> None:
    with _load.place(report, "recovery", redis=True) as where:
        redis_server = where.redis
        log = BuildLog(where.dir / "builds")
        servers = service(where.dir, log, redis_server.url(), cfg)
        answers: list[Answer] = []
        with _load.serving_all(servers):
            clients = load([s.port for s in servers], cfg.clients, cfg.wait_s + 10, answers)
            rounds: list[dict[str, Any]] = []
            try:
                for _ in range(cfg.rounds):
                    for kind in cfg.outages:
                        rounds.append(one_round(kind, redis_server, servers, log, answers, cfg))
            finally:
                stuck = clients.stop(cfg.wait_s + 20)
    errors = Counter[str]()
    for r in rounds:
        errors.update({k: v for k, v in r["statuses"].items() if k == "error" or k[0] == "5"})
    report.update(
        config={**asdict(cfg), "bound": cfg.bound}, rounds=rounds, summary=summary(rounds, cfg),
        goals=[{**_report.goal("no 5xx and no transport error", "0",
                               sum(errors.values()) + stuck, not errors and not stuck),
                "errors": dict(errors), "stuck_clients": stuck}],
        figures={f"{kind}: most builds at once {field}": fields[field]["max"]
                 for kind, fields in summary(rounds, cfg).items()
                 for field in ("during", "after_1s", "after_back_1s")},
    )  # fmt: skip


def render(report: dict[str, Any]) -> str:
    cfg = report["config"]
    out = [
        *_load.head("Builds at once when Redis comes back", report),
        f"service: {cfg['servers']} servers x {cfg['workers']} workers on one Redis; budget "
        f"{cfg['clients']} clients; outage {cfg['outage_s']:g} s; bound active x (1 + "
        f"processes) = {cfg['bound']}",
        "",
    ]
    out += ["builds at once, service-wide: before the outage, during it, in the second after "
            "Redis answered again,", "in the first and the second second after every worker "
            "said it is back; and when that was", ""]
    head = (f"{'round':<6}{'outage':<8}{'before':>7}{'during':>7}{'after 1s':>9}"
            f"{'back 1st s':>11}{'back 2nd s':>11}{'all back ms':>12}  statuses")
    out += _report.ruled(head)
    for n, r in enumerate(report["rounds"]):
        out.append(f"{n:<6}{r['outage']:<8}{r['before']:>7}{r['during']:>7}{r['after_1s']:>9}"
                   f"{r['after_back_1s']:>11}{r['after_back_2nd_s']:>11}{r['back_ms']:>12.0f}"
                   f"  {r['statuses']}")
    out.append("")
    for kind, figures in report["summary"].items():
        out.append(f"{kind} (min / median / max over the rounds):")
        out += [f"  {field:<17}{f['min']:>8g}{f['median']:>8g}{f['max']:>8g}"
                for field, f in figures.items()]
    out.append("")
    return _report.closing(out, report)  # with the goal: errors and stuck clients, 0


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__),
                       "one round of each kind of outage, 1 s outages: about 30 s")
    settle = _report.options(p, rounds=(5, 1), servers=2, workers=2, clients=(16, 12),
                             build_ms=200.0, steady_s=(2.0, 1.0))
    p.add_argument("--outage", choices=(*OUTAGES, "both"), default="both",
                   help="kill (SIGKILL, restart), pause (SIGSTOP, SIGCONT) or both (default)")
    p.add_argument("--outage-s", type=float, default=None,
                   help="outage length in s (default 2, quick 1)")
    p.add_argument("--settle-s", type=float, default=None,
                   help="load after each round in s (default 2, quick 1)")
    a = p.parse_args(argv)
    settle(a)
    cfg = Config(
        servers=a.servers, workers=a.workers, clients=a.clients, build_s=a.build_ms / 1000,
        steady_s=a.steady_s, outage_s=a.outage_s or (1.0 if a.quick else 2.0),
        settle_s=a.settle_s or (1.0 if a.quick else 2.0), rounds=a.rounds,
        outages=list(OUTAGES) if a.outage == "both" else [a.outage],
    )  # fmt: skip
    if cfg.clients > MAX_CLIENTS:
        p.error(f"--clients is at most {MAX_CLIENTS} (the load is bounded)")
    if min(cfg.outage_s, cfg.settle_s) <= 0:
        p.error("need --outage-s and --settle-s > 0")
    report = _report.start("redis_recovery")
    run(cfg, report)
    return _report.finish(report, a, render)


if __name__ == "__main__":
    sys.exit(main())
