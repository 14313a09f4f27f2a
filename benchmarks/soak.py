#!/usr/bin/env python3
"""The soak: the service on Redis under a steady mixed load for minutes, while a seeded
schedule of faults hits it; then the checks that nothing was lost and no promise broken.

    python benchmarks/soak.py --seed 1 --minutes 10     # the long form
    python benchmarks/soak.py --seed 1 --quick          # the short form the suite runs: ~60 s
    python benchmarks/soak.py --seed 1 --sentinel       # on Sentinel, with one failover

Exit status 0 when every check holds, 1 when one failed (the report says which), 2 when
redis-server (or, with --sentinel, redis-sentinel) is missing.

The service: ``--servers`` gunicorn masters (the shipped ``webapp/gunicorn.conf.py``: gthread
workers, 16 threads, child_exit) x ``--workers`` workers serving ``tests.apps.soak_app`` on
one ``redis-server`` (a free loopback port, a temporary directory, stopped by its PID), or
with ``--sentinel`` on a primary, its replica and three sentinels. One budget with the
extension's defaults (active 2, queue 8, wait 3 s, Retry-After 2, fair admission by the
client's address), stale answers on (``--ttl`` 2 s, ``--stale`` 4 s: the popular keys go
stale and are refreshed while the run lasts), ``--lease`` 10 s. Every build writes its start
and end, with the time and its PID, to one log shared by every process, so the builds
running at once service-wide are read along that log, never from a sampled gauge.

The load, bounded, loopback only, every client on its own connection per request (closed
loops, ``_load.Clients``; every request ``_load.get``):

    crawler  ``--crawlers`` connections from 127.0.0.2, distinct cold keys back to back
             (50-150 ms pause after an answer but 200): the queue stays busy
    polite   ``--polite`` clients from 127.0.0.3, .4, ..., one distinct cold key each, then
             a pause of 0.5-1.5 s
    readers  ``--readers`` clients from 127.0.0.20 reading ``--popular`` popular keys (50-150
             ms pauses): warm, stale, refreshed; each answer's age read from the ``built``
             stamp the build wrote
Every answer's status, latency, Cache-Status and (for 200s) age are recorded.

The faults, drawn by ``random.Random(seed)`` and nothing else (the report names the seed and
every fault with its time): from ``WARMUP_S`` to the end of the load less a quiet tail (one
recovery allowance and two seconds), one every ``--fault-every`` seconds or so, each kind at
least once, in a seeded order:

    kill_worker    one worker SIGKILLed (its master starts another; child_exit frees its
                   slots and places at once); ends when the master has its workers again
    pause_redis    Redis SIGSTOPped for 0.3-2 s, then SIGCONT
    restart_redis  once: Redis SIGKILLed and started again, empty, on the same port and
                   directory after 0.3-2 s down
    disconnect     a client (127.0.0.1) asks three distinct cold keys at once and closes
                   the three sockets 0.1-0.4 s later, while (with fair admission: FIFO within
                   a client, round-robin across clients) the later ones still wait
    raise_build    a build that raises: that request's own 500 (asked up to three times
                   while it is refused)
    failover       with --sentinel only, once, instead of pause_redis and restart_redis
                   (pausing a primary past the sentinels' 1 s down-after is a failover
                   too): the primary SIGKILLed; ends when the sentinels name the replica

The windows, where the budget may be over-admitted (the other faults have none: ``active``
holds through them):

    kill_worker    from the kill to the new worker, plus one build and 1 s (the master's
                   reap and child_exit): nothing should be over-admitted even there
    pause_redis, restart_redis, failover
                   from the fault's start to its end plus the recovery allowance
                   ``PROBE_CAP_S + wait + build``: a worker notices Redis is back within its
                   probe's backoff (at most 5 s), its fallback's builds still running end
                   within one build, and its fallback's queued waiters may still be admitted
                   by it for one wait

After the load: every client answered, then (once the last fault ended one lease ago) a
burst of ``--burst`` distinct cold keys (builds held until every request is counted in
Redis) from one client, then the end state.

The checks (each one printed, met or not):

    builds at once   never above ``active`` outside the windows; never above
                     ``--window-bound`` (4: with the fallback's share, each of the 4
                     processes admits ceil(2 / 4) = 1 while Redis is away) inside any,
                     but for what a Redis outage's window carries in: builds Redis
                     admitted before it that still run there count against their own
                     process's share, so a process that held more than its share when
                     Redis went (one holding both of Redis's 2, say) may run that excess
                     beside the others' shares until those builds end (the documented
                     worst case: active + (N - 1) x ceil(active / N)); each window's
                     ``carried`` says how many builds it carried in and ``over_bound``
                     how far it ever went above the bound plus the excess still running
    no 5xx           but the raised builds' own 500s (JSON, never cached)
    within bound     every answer within wait + 2 Redis socket timeouts + build +
                     ``--latency-slack`` (1 s: a loaded machine's scheduling and HTTP); an
                     answer in flight across a worker kill may instead fail (the connection
                     dies with the worker) or take one lease more (a follower of a build in
                     the killed worker takes it over once its claim ends): counted, reported
    burst            admits exactly active + queue (less only the waiters Redis counted as
                     refused after waiting: a loaded machine's process that did not poll
                     within its presence, about 1 s, loses its place), at most ``active``
                     at once: no slot or place lost
    stale            no answer older than TTL + stale window + ``AGE_SLACK_S``
    clients gone     a client that left while waiting is answered 499 (in the access log)
    end state        after the load and at the end: every worker's figures back to 0 (on
                     Redis, not degraded), and nothing held or queued in Redis by nobody
    clients          no client thread stuck

The report (text, or ``--json``): the seed, the duration, the machine and its load average at
the start and the end, the statuses, latency p50/p99/max, every fault with its time, each
window's peak and how long it was above ``active``, and the checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _load
import _report
from _load import CRAWLER_ADDR, READER_ADDR, Answer, Clients
from _report import ms, pct

from tests.apps.build_log_app import HOLD, RAISE, LogLine, at_once, read_log
from tests.support.clients import Herd, raw_client
from tests.support.gunicorn_server import GunicornServer
from tests.support.redis_limiters import burst_accounted, refusals
from tests.support.redis_sentinel import Gate, SentinelSet, build_log_server, running
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

APP = "tests.apps.soak_app:create_app()"
PREFIX = "soak"
#: The extension's defaults, which the servers run with (nothing sets them).
ACTIVE, QUEUE, WAIT_S, RETRY_AFTER = 2, 8, 3.0, 2
#: The Redis socket timeout of the extension's connections (``reachlimit.redis.connect``).
SOCKET_TIMEOUT_S = 0.5
#: The longest backoff of a worker's probe of a Redis that is away.
PROBE_CAP_S = 5.0
#: The faults' own requests come from here (the clients' addresses are _load's).
FAULT_ADDR = "127.0.0.1"
#: A worker's lines saying Redis is away and back.
BACK_LINE, DOWN_LINE = _load.REDIS_BACK_LINE, _load.REDIS_DOWN_LINE
#: No fault in the first seconds: every server serving, the popular keys built.
WARMUP_S = 4.0
#: Time between a build's stamp and its answer: the store, a loaded machine, the way back.
AGE_SLACK_S = 1.0
#: A killed worker's replacement, after the kill, before its window closes: its reap and
#: child_exit's release.
KILL_ALLOWANCE_S = 1.0
#: The most the end waits for the service to be idle again (Redis, every worker).
END_DEADLINE_S = 30.0
PLAIN_KINDS = ("kill_worker", "pause_redis", "restart_redis", "disconnect", "raise_build")
SENTINEL_KINDS = ("kill_worker", "failover", "disconnect", "raise_build")
ONCE = ("restart_redis", "failover")
WINDOWED = ("kill_worker", "pause_redis", "restart_redis", "failover")
MAX_CLIENTS = 32
#: The requests of the client that leaves while queued (one fault).
LEAVING = 3


@dataclass
class Config:
    seed: int
    minutes: float
    sentinel: bool = False
    servers: int = 2
    workers: int = 2
    crawlers: int = 8
    polite: int = 3
    readers: int = 2
    popular: int = 4
    build_s: float = 0.2
    ttl_s: float = 2.0
    stale_s: float = 4.0
    lease_s: float = 10.0
    fault_every_s: float = 15.0
    window_bound: int = 4
    latency_slack_s: float = 1.0
    burst: int = 20
    active: int = ACTIVE
    queue: int = QUEUE
    wait_s: float = WAIT_S
    keep: str | None = None

    @property
    def duration_s(self) -> float:
        return self.minutes * 60

    @property
    def recovery_s(self) -> float:
        """After Redis is back: every probe noticed it, the fallback's builds and waiters
        done (see the module's design)."""
        return PROBE_CAP_S + self.wait_s + self.build_s

    @property
    def quiet_s(self) -> float:
        """The load's tail without faults: the last window closes before the load stops."""
        return self.recovery_s + 2.0

    @property
    def bound_s(self) -> float:
        """The longest an answer may take (see the module's design)."""
        return self.wait_s + 2 * SOCKET_TIMEOUT_S + self.build_s + self.latency_slack_s


# -- the schedule of faults -------------------------------------------------------------------


@dataclass
class Fault:
    """One fault: what the schedule drew (``at`` seconds after the load began, its kind and
    arguments), then what happened (``start``/``end`` in seconds after the load began, and
    the details)."""

    n: int
    kind: str
    at: float
    args: dict[str, Any]
    start: float | None = None
    end: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def schedule(cfg: Config) -> list[Fault]:
    """The faults of a run, from ``random.Random(cfg.seed)`` alone."""
    rng = random.Random(cfg.seed)
    kinds = SENTINEL_KINDS if cfg.sentinel else PLAIN_KINDS
    first, last = WARMUP_S, cfg.duration_s - cfg.quiet_s
    count = max(len(kinds), int((last - first) // cfg.fault_every_s))
    repeatable = [k for k in kinds if k not in ONCE]
    chosen = [*kinds, *(rng.choice(repeatable) for _ in range(count - len(kinds)))]
    rng.shuffle(chosen)
    slot = (last - first) / count
    faults = []
    for n, kind in enumerate(chosen):
        at = round(first + n * slot + rng.uniform(0, slot / 4), 2)
        args: dict[str, Any] = {"server": rng.randrange(cfg.servers)}
        if kind == "kill_worker":
            args["worker"] = rng.randrange(cfg.workers)
        elif kind in ("pause_redis", "restart_redis"):
            args["down_s"] = round(rng.uniform(0.3, 2.0), 2)
        elif kind == "disconnect":
            args["hold_s"] = round(rng.uniform(0.1, 0.4), 2)
        faults.append(Fault(n, kind, at, args))
    return faults


# -- the load ---------------------------------------------------------------------------------


class Load:
    """The crawler, the polite clients and the readers (module design), until stopped; their
    answers in ``answers``."""

    def __init__(self, ports: list[int], cfg: Config) -> None:
        self.answers: list[Answer] = []  # appended by the client threads (list.append)
        timeout = cfg.bound_s + cfg.lease_s + 10  # never the figure measured

        def sender(kind: str, path: Callable[[int, int], str],
                   source: Callable[[int], str]) -> Callable[[int, int], Answer]:  # fmt: skip
            return lambda i, n: _load.get(ports[(i + n) % len(ports)], path(i, n), kind,
                                          timeout, source(i))  # fmt: skip

        def popular(i: int, n: int) -> str:  # a popular key drawn from the seed
            return f"/report/pop-{random.Random(f'{cfg.seed}-{i}-{n}').randrange(cfg.popular)}"

        self._clients = [
            Clients(cfg.crawlers, sender("crawler", lambda i, n: f"/report/crawl-{i}-{n}",
                                         lambda i: CRAWLER_ADDR),
                    self.answers, (0.05, 0.15), seed=f"{cfg.seed}-crawler", name="crawler"),
            Clients(cfg.polite, sender("polite", lambda i, n: f"/report/polite-{i}-{n}",
                                       _load.polite_addr),
                    self.answers, (0.5, 1.5), every=True, seed=f"{cfg.seed}-polite",
                    name="polite"),
            Clients(cfg.readers, sender("reader", popular, lambda i: READER_ADDR),
                    self.answers, (0.05, 0.15), every=True, seed=f"{cfg.seed}-reader",
                    name="reader"),
        ]  # fmt: skip

    def stop(self, timeout_s: float) -> int:
        """Stop every client (joined within ``timeout_s`` in all); how many were stuck."""
        deadline = time.perf_counter() + timeout_s
        return sum(c.stop(max(0.0, deadline - time.perf_counter())) for c in self._clients)


# -- the service ------------------------------------------------------------------------------


class Backend:
    """The Redis the service runs on: one ``redis-server``, or a Sentinel deployment."""

    def __init__(self, directory: Path, sentinel: bool) -> None:
        self.sentinels = SentinelSet(directory / "sentinel") if sentinel else None
        self.server = None if sentinel else RedisServer(directory / "redis")
        if self.server is not None:
            self.server.directory.mkdir()

    def start(self) -> None:
        if self.sentinels is not None:
            self.sentinels.start()
        else:
            assert self.server is not None
            self.server.start()

    def stop(self) -> None:
        if self.sentinels is not None:
            self.sentinels.stop()
        elif self.server is not None:
            self.server.stop()

    def url(self) -> str:
        if self.sentinels is not None:
            return self.sentinels.url()
        assert self.server is not None
        return self.server.url()

    def port(self) -> int:
        """The port of the primary now."""
        if self.sentinels is not None:
            return self.sentinels.primary.port
        assert self.server is not None
        return self.server.port


def service(base: Path, gate_dir: Path, url: str, cfg: Config) -> list[GunicornServer]:
    """The soak app under gunicorn, set up as ``build_log_server`` sets up its app (the
    shipped config, REACH_WORKERS, child_exit, ready once it shows its token)."""
    env = {
        "REACHLIMIT_REDIS_PREFIX": PREFIX,
        "REACHLIMIT_CACHE_TTL": repr(cfg.ttl_s),
        "REACHLIMIT_STALE": repr(cfg.stale_s),
        "REACHLIMIT_LEASE": repr(cfg.lease_s),
        "BUILD_SECONDS": repr(cfg.build_s),
    }
    gate = Gate(gate_dir)
    return [
        dataclasses.replace(
            build_log_server(base, f"server-{i}", gate, url, env, workers=cfg.workers), app=APP
        )
        for i in range(cfg.servers)
    ]


# -- the faults -------------------------------------------------------------------------------


class Faults:
    """Runs the schedule against the service (the main thread: one fault at a time)."""

    def __init__(self, backend: Backend, servers: list[GunicornServer], t0: float,
                 cfg: Config) -> None:
        self.backend, self.servers, self.t0, self.cfg = backend, servers, t0, cfg
        #: Every worker killed, by PID, with when (wall clock).
        self.killed: dict[int, float] = {}
        #: The answers of the faults' own requests (the raised builds).
        self.answers: list[Answer] = []

    def now(self) -> float:
        return round(time.time() - self.t0, 3)

    def run(self, fault: Fault) -> None:
        fault.start = self.now()
        try:
            getattr(self, fault.kind)(fault)
        except Exception as exc:  # noqa: BLE001 - reported with the fault, the run goes on
            fault.detail["failed"] = f"{type(exc).__name__}: {exc}"
        fault.end = self.now()

    def kill_worker(self, fault: Fault) -> None:
        server = self.servers[fault.args["server"]]
        pids = sorted(server.worker_pids())
        victim = pids[fault.args["worker"] % len(pids)]
        self.killed[victim] = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_until("the master's new worker", lambda: (
            victim not in (now := server.worker_pids()) and len(now) >= self.cfg.workers
        ), timeout=30, interval=0.01)
        fault.detail.update(server=server.name, pid=victim)

    def pause_redis(self, fault: Fault) -> None:
        server = self.backend.server
        assert server is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            time.sleep(fault.args["down_s"])  # the outage itself
        finally:
            os.kill(server.pid, signal.SIGCONT)

    def restart_redis(self, fault: Fault) -> None:
        server = self.backend.server
        assert server is not None
        port = server.port
        os.kill(server.pid, signal.SIGKILL)
        server.stop()  # reaped
        time.sleep(fault.args["down_s"])  # the outage itself
        server.start(port=port, attempts=1)  # empty, same port, same directory

    def failover(self, fault: Fault) -> None:
        sentinels = self.backend.sentinels
        assert sentinels is not None and sentinels.replica is not None
        old, new = sentinels.primary.port, sentinels.replica.port
        sentinels.primary.kill()
        wait_until("the sentinels naming the replica", lambda: (
            sentinels.named_primary() == new and sentinels.replica_is_primary()
        ), timeout=60, interval=0.05)
        fault.detail.update(old_primary=old, new_primary=new)

    def disconnect(self, fault: Fault) -> None:
        """``LEAVING`` requests of one client for distinct cold keys (so that, served
        first-in first-out within their client, the later ones wait), all closed at once
        ``hold_s`` later."""
        port = self.servers[fault.args["server"]].port
        paths = [f"/report/gone-{fault.n}-{i}" for i in range(LEAVING)]
        sockets = [raw_client(port, path) for path in paths]
        try:
            time.sleep(fault.args["hold_s"])  # the clients waiting, then leaving
            heads = [_peek(sock) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        fault.detail["left"] = [{"path": path, "answered_before_close": _status_of(head)}
                                for path, head in zip(paths, heads, strict=True)]

    def raise_build(self, fault: Fault) -> None:
        path = f"/report/{RAISE}{fault.n}"
        port = self.servers[fault.args["server"]].port
        statuses = []
        for _ in range(3):
            answer = _load.get(port, path, "fault", self.cfg.bound_s + 10, FAULT_ADDR)
            self.answers.append(answer)
            statuses.append(answer.status)
            if answer.status != 429:
                break
            time.sleep(0.5)
        fault.detail.update(path=path, statuses=statuses)


def _peek(sock: socket.socket) -> bytes:
    """The first bytes of an answer already there, without reading them; b"" if none."""
    sock.setblocking(False)
    try:
        return sock.recv(16, socket.MSG_PEEK)
    except BlockingIOError:
        return b""


def _status_of(head: bytes) -> int | None:
    """The status of an HTTP answer's first bytes (``HTTP/1.1 429 ...``), None if none."""
    parts = head.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def window_of(fault: Fault, cfg: Config) -> tuple[float, float] | None:
    """The window of a fault, in seconds after the load began (module design); None for the
    faults under which the budget must hold as always."""
    if fault.kind not in WINDOWED or fault.start is None or fault.end is None:
        return None
    extra = cfg.build_s + KILL_ALLOWANCE_S if fault.kind == "kill_worker" else cfg.recovery_s
    return fault.start, fault.end + extra


# -- the checks -------------------------------------------------------------------------------


def check(name: str, met: bool, **detail: Any) -> dict[str, Any]:
    return {"check": name, "met": bool(met), **detail}


#: The faults whose windows are Redis outages: there each process admits only its share.
OUTAGES = ("pause_redis", "restart_redis", "failover")


def carried_excess(
    lines: list[LogLine], start: float, t0: float, share: int,
    killed: Mapping[int, float] | None = None,
) -> tuple[int, list[int]]:
    """For a Redis outage's window starting at ``start``: how many builds were running when
    it began (carried in), and after each line of ``lines``, the excess they still make, the
    sum over processes of what each runs of them beyond its ``share`` (a build is known by
    its PID and key: one build of a key at a time in a process). ``killed`` as ``at_once``
    takes it: a killed worker's builds end at the first line at or after its kill."""
    running: set[tuple[int, str]] = set()
    carried: set[tuple[int, str]] | None = None
    carried_in = 0
    excess = []
    dead = dict(killed or {})
    for line in lines:
        for pid in [pid for pid, when in dead.items() if line.at >= when]:
            del dead[pid]
            running = {b for b in running if b[0] != pid}
            if carried is not None:
                carried = {b for b in carried if b[0] != pid}
        if carried is None and line.at - t0 >= start:
            carried = set(running)
            carried_in = len(carried)
        build = (line.pid, line.key)
        if line.event == "start":
            running.add(build)
        else:
            running.discard(build)
            if carried is not None:
                carried.discard(build)
        per_pid = Counter(pid for pid, _ in (carried or ()))
        excess.append(sum(max(0, n - share) for n in per_pid.values()))
    return (len(running) if carried is None else carried_in), excess


def builds_at_once(
    lines: list[LogLine], counts: list[int], windows: list[tuple[int, str, float, float]],
    t0: float, cfg: Config, killed: Mapping[int, float] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The most builds at once outside every window, and each window's peak, the time it
    spent above ``active`` and above the bound plus what a Redis outage carried in (module
    design; judged at every line of the log, by the line's own time)."""
    def inside(t: float) -> bool:
        return any(start <= t <= end for _, _, start, end in windows)

    outside = [c for line, c in zip(lines, counts, strict=True) if not inside(line.at - t0)]
    share = -(-cfg.active // (cfg.servers * cfg.workers))
    figures = []
    for n, kind, start, end in windows:
        carried, excess = (carried_excess(lines, start, t0, share, killed) if kind in OUTAGES
                           else (0, [0] * len(lines)))
        peak, before, before_excess = 0, 0, 0
        first, above_at_start = True, False
        above_active = above_bound = 0.0  # seconds above each
        for i, line in enumerate(lines):
            t = line.at - t0
            if t < start:
                before, before_excess = counts[i], excess[i]
                continue
            if t > end:
                continue
            if first:  # what ran as the window began
                first, peak = False, before
                above_at_start = before > cfg.window_bound + before_excess
            peak = max(peak, counts[i])
            following = lines[i + 1].at - t0 if i + 1 < len(lines) else end
            span = max(0.0, min(following, end) - t)
            if counts[i] > cfg.active:
                above_active += span
            if counts[i] > cfg.window_bound + excess[i]:
                above_bound += span
        figures.append({"fault": n, "kind": kind, "start_s": round(start, 2),
                        "end_s": round(end, 2), "length_s": round(end - start, 2),
                        "peak": peak, "carried": carried,
                        "over_active_ms": round(above_active * 1000),
                        "over_bound_ms": round(above_bound * 1000),
                        "over_bound": above_bound > 0 or above_at_start})
    builds = {"builds": sum(line.event == "start" for line in lines),
              "peak_outside": max(outside, default=0), "peak": max(counts, default=0)}
    return builds, figures


def judge_answers(
    answers: list[Answer], killed: dict[int, float], t0: float, cfg: Config
) -> dict[str, Any]:
    """Statuses, latency, and the answers out of their bound (module design)."""
    kills = list(killed.values())

    def brief(a: Answer) -> dict[str, Any]:
        return {"kind": a.kind, "path": a.path, "at_s": round(a.start - t0, 2),
                "status": a.status, "error": a.error, "latency_ms": round(a.latency * 1000, 1),
                "cache_status": a.cache_status}

    def across_a_kill(a: Answer) -> bool:
        return any(a.start <= k <= a.end for k in kills)

    answered = [a for a in answers if a.status is not None]
    late = [a for a in answered if a.latency > cfg.bound_s]
    late_excused = [a for a in late if across_a_kill(a) and a.latency <= cfg.bound_s + cfg.lease_s]
    errors = [a for a in answers if a.status is None]
    excused = [a for a in errors if across_a_kill(a)]
    server_errors = [a for a in answered if (a.status or 0) >= 500]
    raised = [a for a in server_errors if a.path.startswith(f"/report/{RAISE}")]
    by_kind: dict[str, Any] = {}
    for kind in sorted({a.kind for a in answers}):
        mine = [a for a in answers if a.kind == kind]
        times = [a.latency for a in mine if a.status is not None]
        by_kind[kind] = {
            "count": len(mine),
            "status": dict(sorted(Counter(str(a.status or "error") for a in mine).items())),
            "p50_ms": ms(pct(times, 50)), "p99_ms": ms(pct(times, 99)),
            "max_ms": ms(max(times, default=None) if times else None),
        }
    times = [a.latency for a in answered]
    return {
        "count": len(answers),
        "status": dict(sorted(Counter(str(a.status or "error") for a in answers).items())),
        "p50_ms": ms(pct(times, 50)), "p99_ms": ms(pct(times, 99)),
        "max_ms": ms(max(times)) if times else None,
        "by_kind": by_kind,
        "bound_s": round(cfg.bound_s, 3),
        "over_bound": [brief(a) for a in late if a not in late_excused],
        "over_bound_across_a_kill": len(late_excused),
        "errors": [brief(a) for a in errors if a not in excused],
        "errors_across_a_kill": len(excused),
        "server_errors": [brief(a) for a in server_errors if a not in raised],
        "raised": [{**brief(a), "json": a.body.startswith(b"{")} for a in raised],
    }


def judge_stale(answers: list[Answer], cfg: Config) -> dict[str, Any]:
    """The readers' answers: how many fresh, stale, built, shared; the oldest."""
    mine = [a for a in answers if a.kind == "reader" and a.status == 200]
    statuses = Counter(_cache_kind(a.cache_status) for a in mine)
    ages = [a.age for a in mine if a.age is not None]
    limit = cfg.ttl_s + cfg.stale_s + AGE_SLACK_S
    return {"answers": len(mine), "cache_status": dict(sorted(statuses.items())),
            "oldest_s": round(max(ages), 3) if ages else None, "limit_s": limit,
            "too_old": sum(age > limit for age in ages)}


def _cache_kind(value: str | None) -> str:
    if value is None:
        return "none"
    if "; hit; ttl=-" in value:
        return "stale"
    for kind in ("hit", "stored", "collapsed"):
        if f"; {kind}" in value:
            return kind
    return value


def redis_idle(watch: Any) -> dict[str, Any]:
    """Wait (bounded) until nothing is held or queued in Redis: read raw, not through a
    script (a script would reap first and hide a slot nobody holds)."""
    keys = watch.limiter.keys
    seen: dict[str, Any] = {}

    def idle() -> bool:
        try:
            seen["holders"] = int(watch.client.zcard(keys[0]))
            seen["queue"] = int(watch.client.zcard(keys[1]))
        except Exception as exc:  # noqa: BLE001 - Redis still coming back: try again
            seen["error"] = f"{type(exc).__name__}: {exc}"
            return False
        seen.pop("error", None)
        return bool(seen["holders"] == seen["queue"] == 0)

    seen["idle"] = _eventually("Redis idle", idle)
    return seen


def workers_idle(servers: list[GunicornServer]) -> dict[str, Any]:
    """Wait (bounded) until every worker of every server says its figures are back to 0,
    on Redis and not degraded (each worker answers in turn, as gunicorn hands them out)."""
    last: dict[int, dict[str, Any]] = {}
    fields = ("backend", "degraded", "active", "queued")

    def all_idle() -> bool:
        for server in servers:
            with contextlib.suppress(OSError, http.client.HTTPException, RuntimeError):
                body = _load.get_json(server.port, "GET", "/debug/health")
                last[int(body["pid"])] = {k: body["reach"].get(k) for k in fields}
        live = {pid for s in servers for pid in s.worker_pids()}
        return live <= set(last) and all(
            last[pid] == {"backend": "redis", "degraded": False, "active": 0, "queued": 0}
            for pid in live
        )

    met = _eventually("every worker idle", all_idle)
    live = {pid for s in servers for pid in s.worker_pids()}
    return {"idle": met, "workers": {str(pid): last.get(pid) for pid in sorted(live)}}


def _eventually(what: str, probe: Callable[[], bool]) -> bool:
    try:
        wait_until(what, probe, timeout=END_DEADLINE_S, interval=0.05)
    except AssertionError:
        return False
    return True


def burst(servers: list[GunicornServer], gate_dir: Path, watch: Any, cfg: Config,
          t0: float) -> dict[str, Any]:
    """``cfg.burst`` distinct cold keys at once from one client over the servers, their
    builds held until every request is counted in Redis: then exactly active + queue are
    admitted (module design)."""
    before = watch.limiter.stats()
    started = time.time()
    paths = [f"/report/{HOLD}burst-{n}" for n in range(cfg.burst)]
    herds = [Herd(s.port, paths[i::len(servers)], source=FAULT_ADDR)
             for i, s in enumerate(servers)]
    try:
        held = burst_accounted(watch.limiter, cfg.burst, before)
    finally:
        (gate_dir / "open").touch()
    replies = [r for h in herds for r in h.results()]
    after = watch.limiter.stats()
    lines = [line for line in read_log(gate_dir) if line.at >= started]
    mine = [line for line in lines if line.key.startswith(f"{HOLD}burst-")]
    statuses = Counter(r.status for r in replies)
    dropped = after.rejected_timeout - before.rejected_timeout
    return {
        "at_s": round(started - t0, 2),
        "keys": cfg.burst,
        "status": {str(k): v for k, v in sorted(statuses.items())},
        "held": {"active": held.active, "queued": held.queued},
        "granted": after.acquired - before.acquired,
        "refused": refusals(after) - refusals(before),
        "dropped_waiters": dropped,
        "builds": sum(line.event == "start" for line in mine),
        "peak": max(at_once(lines, {}), default=0),
    }


# -- one run ----------------------------------------------------------------------------------


class Watch:
    """The run's own view of the budget: a limiter with the servers' settings on the same
    Redis, prefix and name (making it sends nothing)."""

    def __init__(self, url: str, cfg: Config) -> None:
        from reachlimit.redis import RedisColdLimiter, connect

        self.client = connect(url, timeout=2.0)
        self.limiter = RedisColdLimiter(self.client, "cold", cfg.active, cfg.queue, cfg.wait_s,
                                        RETRY_AFTER, lease=cfg.lease_s, prefix=PREFIX)

    def close(self) -> None:
        self.limiter.close()
        self.client.close()


def wait_for(t: float, t0: float) -> None:
    """Sleep until ``t`` seconds after ``t0`` (the schedule's clock, not a synchronisation)."""
    time.sleep(max(0.0, t0 + t - time.time()))


def run(cfg: Config, report: dict[str, Any]) -> None:
    faults = schedule(cfg)
    with tempfile.TemporaryDirectory(prefix="reachlimit-soak-") as tmp, \
            contextlib.ExitStack() as stack:
        base = Path(tmp)
        gate_dir = base / "builds"
        backend = stack.enter_context(running(Backend(base, cfg.sentinel)))
        stack.callback((gate_dir / "open").touch)  # no held build left behind, whatever
        servers = stack.enter_context(_load.serving_all(service(base, gate_dir, backend.url(),
                                                                cfg)))
        with contextlib.closing(Watch(backend.url(), cfg)) as watch:
            report["machine"]["redis_server"] = _load.redis_version(watch.client)
        t0 = time.time()
        load = Load([s.port for s in servers], cfg)
        runner = Faults(backend, servers, t0, cfg)
        try:
            for fault in faults:
                wait_for(fault.at, t0)
                runner.run(fault)
            wait_for(cfg.duration_s, t0)
        finally:
            stuck = load.stop(cfg.bound_s + cfg.lease_s + 20)
        load_end = time.time() - t0
        watch = Watch(backend.url(), cfg)
        stack.callback(watch.close)
        after_load = {"redis": redis_idle(watch), "workers": workers_idle(servers)}
        last_end = max((f.end or 0.0) for f in faults)
        wait_for(last_end + cfg.lease_s, t0)  # the last fault and one lease behind us
        try:
            burst_figures = burst(servers, gate_dir, watch, cfg, t0)
        except AssertionError as exc:
            burst_figures = {"failed": str(exc)}
        at_end = {"redis": redis_idle(watch), "workers": workers_idle(servers)}
        with contextlib.suppress(Exception):  # figures only: the checks are read above
            at_end["shared"] = watch.limiter.stats().as_dict()
        lines = read_log(gate_dir)
        access = "".join(s.stdout() for s in servers)
        if cfg.keep is not None:
            keep(base, Path(cfg.keep))
        errors_log = "".join(s.stderr() for s in servers)
    answers = [*load.answers, *runner.answers]
    counts = at_once(lines, runner.killed)
    windows = [(f.n, f.kind, *span) for f in faults
               if (span := window_of(f, cfg)) is not None]
    in_load = [(line, c) for line, c in zip(lines, counts, strict=True)
               if line.at - t0 <= load_end]
    builds, window_figures = builds_at_once(
        [x for x, _ in in_load], [c for _, c in in_load], windows, t0, cfg, runner.killed)
    per_window, unscheduled = outages_per_window(outage_lines(errors_log, t0), windows)
    for w in window_figures:
        w["outage_lines"] = per_window[w["fault"]]
    for fault in faults:
        for left in fault.detail.get("left", []):
            left["logged"] = _logged_status(access, left["path"])
    report.update({
        "seed": cfg.seed,
        "config": {**asdict(cfg), "recovery_s": cfg.recovery_s, "bound_s": cfg.bound_s,
                   "quiet_s": cfg.quiet_s},
        "load_s": round(load_end, 1),
        "faults": [asdict(f) for f in faults],
        "windows": window_figures,
        "builds": builds,
        "unscheduled_outage_lines": unscheduled,
        "answers": judge_answers(answers, runner.killed, t0, cfg),
        "stale": judge_stale(answers, cfg),
        "burst": burst_figures,
        "after_load": after_load,
        "at_end": at_end,
        "stuck_clients": stuck,
    })
    report["checks"] = checks(report, cfg)
    a = report["answers"]
    report["figures"] = {"answers": a["count"], "answer p99 ms": a["p99_ms"],
                         "most builds at once outside the windows": builds["peak_outside"],
                         "most builds at once in a window": max(
                             (w["peak"] for w in window_figures), default=0),
                         "checks not met": sum(not c["met"] for c in report["checks"])}


#: The start of a line of the shipped config's log: its time (local, to the millisecond).
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", re.MULTILINE)


def outage_lines(error_log: str, t0: float) -> list[tuple[float, int, str]]:
    """Every worker's lines saying Redis is unavailable ("down") or answers again ("back"):
    (seconds after the load began, the worker's PID, which), in time order."""
    out = []
    for line in error_log.splitlines():
        stamp = LOG_TIME.match(line)
        which = DOWN_LINE.search(line) or BACK_LINE.search(line)
        if stamp is None or which is None:
            continue
        when = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
        at = when + int(stamp.group(2)) / 1000 - t0
        out.append((round(at, 3), int(which.group(1)), "down" if which.re is DOWN_LINE else "back"))
    return sorted(out)


def outages_per_window(
    lines: list[tuple[float, int, str]], windows: list[tuple[int, str, float, float]]
) -> tuple[dict[int, dict[str, Any]], list[tuple[float, int, str]]]:
    """For each window: the workers that logged Redis down and back in it, and when the last
    said it is back; and the lines outside every window (an outage nobody scheduled)."""
    per: dict[int, dict[str, Any]] = {}
    for n, _, start, end in windows:
        mine = [x for x in lines if start <= x[0] <= end]
        backs = [at for at, _, which in mine if which == "back"]
        per[n] = {"down": len({pid for _, pid, w in mine if w == "down"}),
                  "back": len({pid for _, pid, w in mine if w == "back"}),
                  "last_back_s": max(backs) if backs else None}
    outside = [x for x in lines if not any(s <= x[0] <= e for _, _, s, e in windows)]
    return per, outside


def keep(base: Path, where: Path) -> None:
    """The run's logs (the build log, every server's and Redis's) copied into ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    for path in base.rglob("*"):
        if path.is_file() and (path.suffix in (".log", ".stdout", ".stderr") or path.name == "log"):
            target = where / path.relative_to(base)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _logged_status(access_log: str, path: str) -> int | None:
    """The status gunicorn's access log gave ``path``, None if it has no line for it."""
    mark = f'"GET {path} HTTP/1.1" '
    at = access_log.find(mark)
    if at < 0:
        return None
    return _status_of(b"HTTP/1.1 " + access_log[at + len(mark):at + len(mark) + 3].encode())


def checks(report: dict[str, Any], cfg: Config) -> list[dict[str, Any]]:
    builds, answers, burst_figures = report["builds"], report["answers"], report["burst"]
    windows = report["windows"]
    gone = [left for f in report["faults"] for left in f["detail"].get("left", [])]
    # A client that left before any answer: 499 (left while waiting) or 200 (it was building
    # then, not waiting); a 429 after it left means the server never noticed it leave.
    unnoticed = [d for d in gone if d.get("answered_before_close") is None
                 and d.get("logged") not in (499, 200)]
    expected = cfg.active + cfg.queue
    granted = burst_figures.get("status", {}).get("200", 0)
    dropped = burst_figures.get("dropped_waiters", 0)
    raised = answers["raised"]
    return [
        check(f"builds at once outside the windows <= active ({cfg.active})",
              builds["peak_outside"] <= cfg.active, peak=builds["peak_outside"]),
        check(f"builds at once inside every window <= {cfg.window_bound}, beside what a Redis "
              "outage carried in", not any(w["over_bound"] for w in windows),
              peaks=[w["peak"] for w in windows],
              over=[w for w in windows if w["over_bound"]]),
        check("no 5xx but the raised builds' own 500 (JSON)",
              not answers["server_errors"] and all(r["json"] and r["status"] == 500
                                                   for r in raised),
              others=answers["server_errors"], raised=len(raised)),
        check(f"every answer within {answers['bound_s']} s; transport errors only across a "
              "worker kill", not answers["over_bound"] and not answers["errors"],
              over_bound=answers["over_bound"], errors=answers["errors"],
              errors_across_a_kill=answers["errors_across_a_kill"],
              over_bound_across_a_kill=answers["over_bound_across_a_kill"]),
        check(f"the burst admits exactly active + queue ({expected}), <= {cfg.active} at once",
              "failed" not in burst_figures
              and expected - dropped <= granted <= expected
              and granted == burst_figures["granted"] == burst_figures["builds"]
              and set(burst_figures["status"]) <= {"200", "429"}
              and burst_figures["peak"] <= cfg.active,
              burst=burst_figures),
        check(f"no stale answer older than TTL + stale + {AGE_SLACK_S:g} s",
              report["stale"]["too_old"] == 0, oldest_s=report["stale"]["oldest_s"]),
        check("clients that left while waiting were answered 499", not unnoticed,
              unnoticed=unnoticed),
        check("after the load and at the end: every worker's figures 0, nothing held in Redis",
              all(s["redis"]["idle"] and s["workers"]["idle"]
                  for s in (report["after_load"], report["at_end"]))),
        check("no client stuck", report["stuck_clients"] == 0, stuck=report["stuck_clients"]),
    ]


# -- the report -------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    cfg, a, st = report["config"], report["answers"], report["stale"]
    where = "Sentinel (a primary, a replica, three sentinels)" if cfg["sentinel"] else "one Redis"
    out = [
        *_load.head(f"Soak, seed {report['seed']}: {cfg['servers']} servers x "
                      f"{cfg['workers']} workers on {where}, load {report['load_s']:g} s", report),
        f"         lease {cfg['lease_s']:g} s; TTL {cfg['ttl_s']:g} s, stale {cfg['stale_s']:g} s; "
        f"load: {cfg['crawlers']} crawler connections, "
        f"{cfg['polite']} polite, {cfg['readers']} readers of {cfg['popular']} popular keys",
        f"bounds: an answer {cfg['bound_s']:g} s; a Redis fault's window ends "
        f"{cfg['recovery_s']:g} s after it; builds at once in a window <= "
        f"{cfg['window_bound']}, beside the excess a Redis outage carried in",
        "",
        "faults (seconds after the load began)",
    ]
    head = f"{'n':>3} {'kind':<14}{'planned':>8}{'start':>8}{'end':>8}  details"
    out += _report.ruled(head)
    for f in report["faults"]:
        out.append(f"{f['n']:>3} {f['kind']:<14}{f['at']:>8.2f}{_report.fmt(f['start'], '.2f'):>8}"
                   f"{_report.fmt(f['end'], '.2f'):>8}  {f['args']} {f['detail']}")
    out += ["", "windows: builds at once (read along the build log)"]
    head = (f"{'fault':>5} {'kind':<14}{'start':>8}{'end':>8}{'length':>8}{'peak':>6}"
            f"{'carried':>8}{'> active ms':>12}{'> bound ms':>11}{'down':>6}{'back':>6}"
            f"{'last back':>10}")
    out += _report.ruled(head)
    for w in report["windows"]:
        o = w["outage_lines"]
        out.append(f"{w['fault']:>5} {w['kind']:<14}{w['start_s']:>8.2f}{w['end_s']:>8.2f}"
                   f"{w['length_s']:>8.2f}{w['peak']:>6}{w['carried']:>8}"
                   f"{w['over_active_ms']:>12}"
                   f"{w['over_bound_ms']:>11}{o['down']:>6}{o['back']:>6}"
                   f"{_report.fmt(o['last_back_s'], '.2f'):>10}")
    out += ["(carried: the builds running as a Redis outage began; > bound: above the bound "
            "plus what those still ran beyond their process's share; down, back: the workers "
            "that logged Redis unavailable, and answering again, in the window; last back: when "
            "the last did)"]
    if report["unscheduled_outage_lines"]:
        out.append(f"outage lines outside every window: {report['unscheduled_outage_lines']}")
    b = report["builds"]
    out += [f"builds {b['builds']}; most at once outside the windows {b['peak_outside']}, "
            f"anywhere {b['peak']}", "",
            f"answers {a['count']}: {a['status']}; latency p50 {_report.fmt(a['p50_ms'])} ms, "
            f"p99 {_report.fmt(a['p99_ms'])} ms, max {_report.fmt(a['max_ms'])} ms"]
    for kind, k in a["by_kind"].items():
        out.append(f"  {kind:<8} {k['count']:>6}  {k['status']}  p50 {_report.fmt(k['p50_ms'])}"
                   f" p99 {_report.fmt(k['p99_ms'])} max {_report.fmt(k['max_ms'])} ms")
    out += [f"transport errors across a worker kill {a['errors_across_a_kill']}, answers over "
            f"the bound across a worker kill {a['over_bound_across_a_kill']}",
            f"readers: {st['answers']} answers {st['cache_status']}; oldest {st['oldest_s']} s "
            f"(limit {st['limit_s']:g} s)",
            f"burst: {report['burst']}"]
    left = Counter(str(x["logged"]) for f in report["faults"] for x in f["detail"].get("left", []))
    out.append(f"clients that left: logged {dict(sorted(left.items()))} (499: left while waiting;"
               " 200: building or answered then)")
    shared = report["at_end"].get("shared")
    if shared:
        names = ("acquired", "rejected_full", "rejected_timeout", "displaced", "deadline",
                 "lease_lost")
        out.append("shared figures at the end (since Redis last started empty): "
                   + ", ".join(f"{k} {shared.get(k)}" for k in names))
    out.append("")
    for c in report["checks"]:
        extra = {k: v for k, v in c.items() if k not in ("check", "met")}
        out.append(f"check: {c['check']}: {'met' if c['met'] else 'NOT met'}"
                   f"{'' if c['met'] or not extra else f' {extra}'}")
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(
        "A soak of the service on Redis (2 gunicorn servers x 2 workers): a steady mixed "
        "load (a crawler, polite clients, readers of popular keys) while a seeded schedule "
        "of faults hits it (a worker killed, Redis paused, Redis restarted empty, a client "
        "leaving while queued, a build that raises; with --sentinel a failover); then checks "
        "that no limit was broken and nothing was lost. Exit status 1 when a check fails.",
        "the short form the suite runs: 0.75 minutes of load (about 60 s in all)",
    )
    a_ = p.add_argument
    a_("--seed", type=int, default=1, help="the seed of the schedule of faults (default 1)")
    a_("--minutes", type=float, default=None, help="minutes of load (default 10, quick 0.75)")
    a_("--sentinel", action="store_true", help="run on Sentinel (a primary, its replica, "
       "three sentinels) with one failover instead of Redis paused and restarted")
    a_("--window-bound", type=int, default=4, help="the most builds at once allowed inside a "
       "fault's window (default 4: each of 4 processes its fallback's share, Redis's 2 beside)")
    a_("--fault-every", type=float, default=15.0, help="seconds between faults, about "
       "(default 15; every kind runs at least once)")
    a_("--lease", type=float, default=10.0, help="REACHLIMIT_LEASE in s (default 10)")
    settle = _report.options(p, build_ms=200.0, crawlers=8, polite=3)
    a_("--ttl", type=float, default=2.0, help="REACHLIMIT_CACHE_TTL in s (default 2)")
    a_("--stale", type=float, default=4.0, help="REACHLIMIT_STALE in s (default 4)")
    a_("--readers", type=int, default=2, help="readers of the popular keys (default 2)")
    a_("--popular", type=int, default=4, help="popular keys (default 4)")
    a_("--burst", type=int, default=20, help="distinct cold keys of the final burst "
       "(default 20; more than active + queue)")
    a_("--latency-slack", type=float, default=1.0, help="seconds an answer may take beyond "
       "wait + 2 socket timeouts + build (default 1: a loaded machine)")
    a_("--keep-logs", metavar="DIR", help="copy the build log and every server's log "
       "into DIR at the end")
    a = p.parse_args(argv)
    settle(a)
    cfg = Config(
        seed=a.seed, minutes=a.minutes if a.minutes is not None else (0.75 if a.quick else 10.0),
        sentinel=a.sentinel, crawlers=a.crawlers, polite=a.polite, readers=a.readers,
        popular=a.popular, build_s=a.build_ms / 1000, ttl_s=a.ttl, stale_s=a.stale,
        lease_s=a.lease, fault_every_s=a.fault_every, window_bound=a.window_bound,
        latency_slack_s=a.latency_slack, burst=a.burst, keep=a.keep_logs,
    )
    if cfg.crawlers + cfg.polite + cfg.readers > MAX_CLIENTS:
        p.error(f"at most {MAX_CLIENTS} clients in all (the load is bounded)")
    if min(cfg.readers, cfg.popular) < 1:
        p.error("need --readers and --popular >= 1")
    if cfg.burst <= cfg.active + cfg.queue:
        p.error(f"--burst must be more than active + queue ({cfg.active + cfg.queue})")
    if min(cfg.ttl_s, cfg.stale_s, cfg.lease_s, cfg.fault_every_s) <= 0:
        p.error("need --ttl, --stale, --lease and --fault-every > 0")
    kinds = len(SENTINEL_KINDS if cfg.sentinel else PLAIN_KINDS)
    if cfg.duration_s - cfg.quiet_s - WARMUP_S < kinds:
        p.error(f"--minutes too short for {kinds} faults (the load needs at least "
                f"{(WARMUP_S + cfg.quiet_s + kinds) / 60:.2f} minutes)")
    if _load.redis_missing():
        return 2
    if cfg.sentinel and shutil.which("redis-sentinel") is None:
        p.exit(2, "redis-sentinel is not installed (Debian: apt-get install redis-sentinel)\n")
    report = _report.start("soak")
    _load.unwind_on_sigterm()
    run(cfg, report)
    _report.finish(report, a, render)
    return 0 if all(c["met"] for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
