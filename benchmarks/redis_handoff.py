#!/usr/bin/env python3
"""The hand-off of RedisColdLimiter between two processes, against a bare Redis doorbell.

    python benchmarks/redis_handoff.py            # about 30 s
    python benchmarks/redis_handoff.py --quick    # a few seconds, rough figures
    python benchmarks/redis_handoff.py --url redis://127.0.0.1:6379/15   # an existing Redis
                                                  # (the database is FLUSHED: use a spare one)

Without ``--url`` it starts its own ``redis-server`` (``tests/support/redis_server.py``) and
stops it by PID at the end. It also starts one child process (this script with ``--child``), told
over stdin what to do and stopped by PID at the end.

(a) hand-off: the parent holds the only slot (``active=1``); the child's ``acquire()`` queues
    and blocks on its doorbell; once Redis reports the child blocked (``blocked_clients``),
    and a random 1-5 ms later, the parent takes ``t0`` and releases. The child takes ``t1``
    when its ``acquire()`` returns with the grant, i.e. when it could start its build. The
    hand-off is ``t1 - t0``: the release script (which promotes the child and rings its
    doorbell), the child's wake-up from ``BLPOP``, and its poll script (which claims the slot).
    Baseline, in the same run and the same rounds (one of each, alternately first): the
    parent's ``LPUSH`` to a list the child waits on in ``BLPOP``; ``t1`` when ``BLPOP``
    returns. ``time.perf_counter()`` is CLOCK_MONOTONIC on Linux, one clock for every
    process of the machine, so ``t1 - t0`` across the two processes is meaningful.
    Goal: hand-off p99 <= 5 ms.
(b) cancel notice: a waiter with a cancel token (an Event) is queued behind a held slot; the
    test sets the token and times until ``acquire`` raises ``Cancelled``. Side by side with
    the in-process ``ColdLimiter``. A waiter blocks at most ``CANCEL_POLL_INTERVAL`` (50 ms)
    at a time, so the bound is one slice plus one round trip.
(c) deadline: a waiter with ``wait=0.1`` behind a held slot, with and without a cancel token:
    how long after its wait ``acquire`` raises ``Busy("timeout")``. Side by side with
    ``ColdLimiter``.

Percentiles are nearest-rank; ratios are limiter over baseline. Nothing here is pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _load
import _report
import redis
from _report import ms, pct

from reachlimit import Busy, Cancelled, ColdLimiter
from reachlimit.redis import RedisColdLimiter

#: The hand-off goal: p99 at most this many milliseconds.
GOAL_P99_MS = 5.0
NAME = "bench-handoff"
BELL = "bench-handoff:doorbell"
#: Bound of any one wait for the other process (only a failing run gets near it).
STEP_TIMEOUT = 30.0


def make_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)


def handoff_limiter(client: redis.Redis) -> RedisColdLimiter:
    """The hand-off limiter, with the same settings in both processes: one slot."""
    return RedisColdLimiter(client, NAME, active=1, queue=1, wait=30.0, lease=30.0)


# -- the child --------------------------------------------------------------------------------


def child(url: str) -> None:
    """Runs in the child process: one command a line on stdin, one JSON line on stdout."""
    client = make_client(url)
    lim = handoff_limiter(client)
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        command = line.strip()
        if command == "limiter":
            grant = lim.acquire()
            t1 = time.perf_counter()
            grant.release()
            reply: dict[str, Any] = {"t1": t1}
        elif command == "doorbell":
            rang = client.blpop([BELL], timeout=STEP_TIMEOUT)
            t1 = time.perf_counter()
            reply = {"t1": t1, "rang": rang is not None}
        else:
            reply = {"error": f"unknown command {command!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    lim.close()
    client.close()


class Child:
    """The child process, started from this script and stopped by its PID."""

    def __init__(self, url: str) -> None:
        root = Path(__file__).resolve().parents[1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                   os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self.read()
        if "ready" not in ready:
            raise RuntimeError(f"child did not start: {ready}")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited (status {self.process.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def stop(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


# -- (a) hand-off -----------------------------------------------------------------------------


def wait_blocked(client: redis.Redis) -> None:
    """Until Redis counts one client blocked (the child, in BLPOP), then 1-5 ms more."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while int(client.info("clients")["blocked_clients"]) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the child never blocked")
        time.sleep(0.0005)
    time.sleep(random.uniform(0.001, 0.005))


def limiter_handoff(client: redis.Redis, lim: RedisColdLimiter, kid: Child) -> float:
    grant = lim.acquire()  # the slot is free: the fast path
    kid.send("limiter")
    wait_blocked(client)
    t0 = time.perf_counter()
    grant.release()
    reply = kid.read()  # the child got the slot and gave it back
    return float(reply["t1"]) - t0


def doorbell_handoff(client: redis.Redis, kid: Child) -> float:
    kid.send("doorbell")
    wait_blocked(client)
    t0 = time.perf_counter()
    client.lpush(BELL, 1)
    reply = kid.read()
    if not reply.get("rang"):
        raise RuntimeError(f"the doorbell did not ring: {reply}")
    return float(reply["t1"]) - t0


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "p50_ms": ms(pct(samples, 50)),
        "p99_ms": ms(pct(samples, 99)),
        "max_ms": ms(max(samples)) if samples else None,
    }


def handoffs(url: str, client: redis.Redis, n: int) -> dict[str, Any]:
    lim = handoff_limiter(client)
    kid = Child(url)
    lim_s: list[float] = []
    bell_s: list[float] = []
    try:
        limiter_handoff(client, lim, kid)  # warm up both (scripts loaded, connections open)
        doorbell_handoff(client, kid)
        for i in range(n):
            if i % 2:
                lim_s.append(limiter_handoff(client, lim, kid))
                bell_s.append(doorbell_handoff(client, kid))
            else:
                bell_s.append(doorbell_handoff(client, kid))
                lim_s.append(limiter_handoff(client, lim, kid))
        stats = lim.stats()
    finally:
        kid.stop()
        lim.close()
    limiter, doorbell = summary(lim_s), summary(bell_s)
    return {
        "limiter": limiter,
        "doorbell": doorbell,
        "ratio_p50": limiter["p50_ms"] / doorbell["p50_ms"],
        "ratio_p99": limiter["p99_ms"] / doorbell["p99_ms"],
        "goal_p99_ms": GOAL_P99_MS,
        "goal_met": limiter["p99_ms"] <= GOAL_P99_MS,
        # Every timed acquire was a hand-off: queued first, then promoted (none refused).
        "check": {
            "ok": stats.rejected_full == 0 and stats.rejected_timeout == 0
            and stats.active == 0 and stats.queued == 0
            and stats.acquired == 2 * (n + 1),
            "acquired": stats.acquired,
        },
    }


# -- (b) cancel notice and (c) deadline -------------------------------------------------------


def _queued(lim: Any) -> int:
    return int(lim.stats().queued)


def cancel_notice(make: Any, n: int) -> list[float]:
    """Seconds from setting a queued waiter's cancel token to its ``Cancelled``."""
    holder_lim, waiter_lim = make(), make()
    out: list[float] = []
    with holder_lim.acquire():
        for _ in range(n):
            cancel = threading.Event()
            done: list[float] = []

            def wait(cancel: threading.Event = cancel, done: list[float] = done) -> None:
                try:
                    waiter_lim.acquire(cancel).release()
                except Cancelled:
                    done.append(time.perf_counter())

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            deadline = time.monotonic() + STEP_TIMEOUT
            while _queued(holder_lim) < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the waiter never queued")
                time.sleep(0.001)
            time.sleep(random.uniform(0.0, 0.05))  # anywhere in its blocking slice
            t0 = time.perf_counter()
            cancel.set()
            thread.join(STEP_TIMEOUT)
            if not done:
                raise RuntimeError("the waiter was not cancelled")
            out.append(done[0] - t0)
    return out


def deadline_overshoot(make: Any, n: int, with_cancel: bool) -> list[float]:
    """Seconds by which ``Busy("timeout")`` comes after the wait (0.1 s) has passed."""
    holder_lim, waiter_lim = make(), make()
    wait = waiter_lim.wait
    out: list[float] = []
    with holder_lim.acquire():
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                waiter_lim.acquire(threading.Event() if with_cancel else None).release()
            except Busy as exc:
                if exc.reason != Busy.TIMEOUT:
                    raise
            else:
                raise RuntimeError("the waiter was granted a held slot")
            out.append(time.perf_counter() - t0 - wait)
    return out


def waits(client: redis.Redis, n_cancel: int, n_deadline: int) -> dict[str, Any]:
    made: list[RedisColdLimiter] = []

    def shared(wait: float) -> Any:
        # One name per wait: the processes (here, objects) of one budget share its settings.
        name = f"bench-waits-{round(wait * 1000)}ms"

        def make() -> RedisColdLimiter:
            lim = RedisColdLimiter(client, name, active=1, queue=1, wait=wait)
            made.append(lim)
            return lim
        return make

    local_by_wait: dict[float, ColdLimiter] = {}

    def local(wait: float) -> Any:
        # One in-process limiter stands for both "objects": the same state, like one name.
        def make() -> ColdLimiter:
            return local_by_wait.setdefault(wait, ColdLimiter(active=1, queue=1, wait=wait))
        return make

    try:
        results = {
            "cancel": {
                "redis": summary(cancel_notice(shared(30.0), n_cancel)),
                "local": summary(cancel_notice(local(30.0), n_cancel)),
            },
            "deadline_with_cancel_token": {
                "redis": summary(deadline_overshoot(shared(0.1), n_deadline, True)),
                "local": summary(deadline_overshoot(local(0.1), n_deadline, True)),
            },
            "deadline_without_token": {
                "redis": summary(deadline_overshoot(shared(0.1), n_deadline, False)),
                "local": summary(deadline_overshoot(local(0.1), n_deadline, False)),
            },
        }
    finally:
        for lim in made:
            lim.close()
    return results


# -- main -------------------------------------------------------------------------------------


def run(url: str, n: int, n_cancel: int, n_deadline: int, own: bool) -> dict[str, Any]:
    """Everything, against the server at ``url``. On a server of our own, (b) and (c) run
    twice: at Redis's default ``hz`` (10) and at ``hz 100``. Redis ends a blocking command
    that timed out when its event loop next runs, which on an idle server is its cron tick,
    every ``1/hz`` seconds: so the waits' precision depends on it."""
    client = make_client(url)
    client.flushdb()
    try:
        server_hz = int(client.config_get("hz")["hz"])
        results: dict[str, Any] = {"handoff": handoffs(url, client, n), "waits": {}}
        for hz in (server_hz, 100) if own and server_hz != 100 else (server_hz,):
            if own:
                client.config_set("hz", hz)
            results["waits"][f"hz {hz}"] = waits(client, n_cancel, n_deadline)
        return results
    finally:
        client.flushdb()
        client.close()


def fmt(row: dict[str, Any]) -> str:
    return (f"p50 {row['p50_ms']:7.3f}  p99 {row['p99_ms']:7.3f}  max {row['max_ms']:7.3f} ms"
            f"  (n={row['n']})")


def render(report: dict[str, Any]) -> str:
    r = report["results"]
    h = r["handoff"]
    out = [*_report.head("reachlimit: a slot handed from one process to another", report),
           "(a) hand-off, release in one process -> acquire returns in the other:",
           f"  RedisColdLimiter         {fmt(h['limiter'])}",
           f"  LPUSH -> BLPOP doorbell  {fmt(h['doorbell'])}",
           f"  ratio p50 {h['ratio_p50']:.2f}x, p99 {h['ratio_p99']:.2f}x; goal p99 <= "
           f"{GOAL_P99_MS:g} ms: {'met' if h['goal_met'] else 'MISSED'}; check {h['check']}"]
    for hz, w in r["waits"].items():
        out.append(f"(b) cancel notice, token set -> Cancelled raised (Redis {hz}):")
        out += [f"  {side:6s}  {fmt(w['cancel'][side])}" for side in ("redis", "local")]
        for key, label in (
            ("deadline_with_cancel_token", "(c) deadline overshoot, with a cancel token"),
            ("deadline_without_token", "    deadline overshoot, without a token"),
        ):
            out.append(f"{label} (wait 0.1 s; Redis {hz}):")
            out += [f"  {side:6s}  {fmt(w[key][side])}" for side in ("redis", "local")]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _report.parser(_report.description(__doc__), "fewer samples: a few seconds")
    p.add_argument("--url", help="an existing Redis (its database is flushed)")
    p.add_argument("--handoffs", type=int, help="hand-offs of each kind (default 400)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    n, n_cancel, n_deadline = (30, 5, 3) if args.quick else (400, 40, 15)
    if args.handoffs is not None:
        if args.handoffs < 1:
            p.error("--handoffs must be at least 1")
        n = args.handoffs
    report = _report.start("redis_handoff")
    with _load.redis_unless(args.url) as url:
        with contextlib.closing(make_client(url)) as client:
            report["machine"]["redis_server"] = client.info("server")["redis_version"]
        report["config"] = {"handoffs": n, "cancels": n_cancel, "deadlines": n_deadline,
                            "quick": args.quick}
        report["results"] = run(url, n, n_cancel, n_deadline, own=args.url is None)
    h = report["results"]["handoff"]
    report["figures"] = {"hand-off p50 ms": h["limiter"]["p50_ms"],
                         "hand-off p99 ms": h["limiter"]["p99_ms"],
                         "hand-off p99 / doorbell p99": h["ratio_p99"]}
    return _report.finish(report, args, render)


if __name__ == "__main__":
    sys.exit(main())
