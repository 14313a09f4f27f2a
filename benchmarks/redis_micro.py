#!/usr/bin/env python3
"""Micro-benchmarks of RedisColdLimiter's two hot paths, each against a redis-py baseline.

    python benchmarks/redis_micro.py            # full run, about 15 s
    python benchmarks/redis_micro.py --quick    # a few seconds, rough figures
    python benchmarks/redis_micro.py --json     # the same figures as JSON on stdout
    python benchmarks/redis_micro.py --url redis://127.0.0.1:6379/15   # an existing Redis
                                                # (the database is FLUSHED: use a spare one)
    python benchmarks/redis_micro.py --tls      # the same paths over TLS vs plain TCP

Without ``--url`` it starts its own ``redis-server`` (Debian's package) on a free loopback
port in a temporary directory, without persistence, and stops it by PID at the end.

What is measured, one client, one connection, as ratios against a baseline timed in the same
run:

(a) fast path: ``g = lim.acquire(); g.release()`` with a free slot (two scripts, two round
    trips), against a redis-py ``Lock`` ``acquire(); release()`` pair (``SET NX PX`` and a
    release script: two round trips too).
(b) queue_full refusal: ``acquire()`` refused with the queue full (one script, one round
    trip), against a ``PING``: the cheapest round trip there is.

Each pair is timed in alternating rounds (``_common.alternating``: baseline first on even
rounds, limiter first on odd rounds; 61 rounds of 200 calls); a ratio is the median of the
per-round ratios (both sides of a round saw the same machine load), with the spread of the
per-round ratios and the best-of-rounds figures beside it. The goals (fast path <= 1.0x,
refusal <= 1.5x) are printed as met or missed; nothing here fails on them.

With ``--tls`` it starts two servers instead, one plain and one with TLS on (a CA and a
server certificate made by ``openssl`` in the temporary directory; clients verify it through
redis-py's own URL parameters, ``rediss://...?ssl_ca_certs=<ca>&ssl_cert_reqs=required``),
and times each path over TLS against the same path over plain TCP, alternating rounds again:
(a) the fast path, (b) the refusal, (c) a ``PING`` (the transport's own cost per round trip).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import _common
import redis
from _common import machine

from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter
from tests.support.redis_limiters import LimiterScript

#: The goals, as the median of the per-round ratios.
GOALS = {"fast_path": 1.0, "refusal": 1.5}


class _Parked(RedisColdLimiter):
    """Its ghost holders and waiters (admitted, never polling) stay for the whole run."""

    PRESENCE = 3600.0


def _certificates(tmp: str) -> list[str]:
    """A CA and a server certificate for 127.0.0.1 signed by it, made by ``openssl`` in
    ``tmp``: redis-server's TLS options."""
    openssl = shutil.which("openssl")
    if openssl is None:
        sys.exit("openssl is not installed (Debian: apt-get install openssl)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=tmp, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", "ca.key",
        "-out", "ca.pem", "-subj", "/CN=bench CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
        "server.csr", "-subj", "/CN=127.0.0.1")
    with open(f"{tmp}/san.cnf", "w", encoding="ascii") as f:
        f.write("subjectAltName = IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.cnf", "-out", "server.pem")
    return ["--tls-cert-file", f"{tmp}/server.pem", "--tls-key-file", f"{tmp}/server.key",
            "--tls-ca-cert-file", f"{tmp}/ca.pem", "--tls-auth-clients", "no"]


@contextmanager
def own_redis_server(tls: bool = False) -> Iterator[str]:
    """A throwaway redis-server on 127.0.0.1 (TLS only, with ``tls``); its URL. Stopped by
    PID on the way out."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server); "
                 "or pass --url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        where = ["--port", str(port)]
        url = f"redis://127.0.0.1:{port}/0"
        if tls:
            where = ["--port", "0", "--tls-port", str(port), *_certificates(tmp)]
            url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp}/ca.pem&ssl_cert_reqs=required"
        proc = subprocess.Popen(
            [binary, *where, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis.from_url(url, socket_timeout=0.5).ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.02)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def timed(fn: Callable[[], None]) -> Callable[[int], float]:
    """``fn`` as a workload for ``_common.alternating``: ``n`` calls, their seconds."""

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - start

    return run


def paired(limiter: Callable[[], None], baseline: Callable[[], None], n: int, rounds: int
           ) -> dict[str, Any]:
    """Alternating rounds of ``n`` calls (``_common.alternating``). Many short rounds rather
    than a few long ones: the load of a shared machine drifts within a second, and each
    ratio is taken within one round."""
    base_times, lim_times = _common.alternating(timed(baseline), timed(limiter), n, rounds)
    figures = _common.ratios(base_times, lim_times)
    return {
        "limiter_us": round(statistics.median(lim_times) * 1e6, 1),
        "baseline_us": round(statistics.median(base_times) * 1e6, 1),
        "ratio": round(figures["ratio"], 3),
        "ratio_spread": [round(x, 3) for x in figures["ratio_spread"]],
        "best_limiter_us": round(min(lim_times) * 1e6, 1),
        "best_baseline_us": round(min(base_times) * 1e6, 1),
        "rounds": rounds,
        "ops_per_round": n,
    }


def bench_client(url: str) -> redis.Redis:
    """A client with the library's short timeouts, on an emptied database."""
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    client.flushdb()
    return client


def fast_path_of(client: redis.Redis) -> tuple[Callable[[], None], RedisColdLimiter]:
    """``acquire(); release()`` of a free limiter on ``client`` (scripts loaded)."""
    lim = RedisColdLimiter(client, "bench-fast", active=2, queue=8, lease=60.0)

    def fast_path() -> None:
        lim.acquire().release()

    fast_path()
    return fast_path, lim


class Refusals:
    """A ``queue_full`` refusal on ``client``: two ghost holders and eight ghost waiters
    keep the queue full for the whole run; ``check`` says every call was refused so."""

    def __init__(self, client: redis.Redis) -> None:
        self.limiter = _Parked(client, "bench-full", active=2, queue=8, lease=3600.0)
        ghosts = LimiterScript(client, self.limiter)
        for i in range(10):
            ghosts.acquire(f"parked-{i}")
        self.refused = 0
        self()
        self.before = self.limiter.stats()

    def __call__(self) -> None:
        try:
            self.limiter.acquire()
        except Busy:
            self.refused += 1

    def check(self) -> dict[str, Any]:
        after = self.limiter.stats()
        self.limiter.close()
        return {
            # Every call was a queue_full refusal: no grant, no waiter, nothing reaped.
            "ok": self.refused == after.rejected_full
            and after.acquired == self.before.acquired
            and (after.active, after.queued, after.lease_lost) == (2, 8, 0),
            "refused": self.refused,
        }


def run(url: str, n: int, rounds: int) -> dict[str, Any]:
    client = bench_client(url)
    results: dict[str, Any] = {}

    fast_path, lim = fast_path_of(client)
    lock = client.lock("bench-lock", timeout=60)

    def lock_pair() -> None:
        lock.acquire()
        lock.release()

    lock_pair()
    results["fast_path"] = paired(fast_path, lock_pair, n, rounds)
    lim.close()

    refusal = Refusals(client)
    results["refusal"] = paired(refusal, client.ping, n, rounds)
    results["refusal"]["check"] = refusal.check()
    client.flushdb()
    client.close()
    return results


def run_tls(plain_url: str, tls_url: str, n: int, rounds: int) -> dict[str, Any]:
    """Each path over TLS (the candidate) against the same path over plain TCP."""
    plain, tls = bench_client(plain_url), bench_client(tls_url)
    results: dict[str, Any] = {}
    (plain_fast, plain_lim), (tls_fast, tls_lim) = fast_path_of(plain), fast_path_of(tls)
    results["tls_fast_path"] = paired(tls_fast, plain_fast, n, rounds)
    plain_lim.close()
    tls_lim.close()
    plain_refusal, tls_refusal = Refusals(plain), Refusals(tls)
    results["tls_refusal"] = paired(tls_refusal, plain_refusal, n, rounds)
    results["tls_refusal"]["check"] = {
        "plain": plain_refusal.check(), "tls": tls_refusal.check()}
    results["tls_ping"] = paired(tls.ping, plain.ping, n, rounds)
    for client in (plain, tls):
        client.flushdb()
        client.close()
    return results


def print_rows(results: dict[str, Any], rows: tuple[tuple[str, str], ...]) -> None:
    """One line for each ``(name, label)`` of ``rows``: ``results[name]`` under ``label``."""
    for name, label in rows:
        row = results[name]
        print(
            f"{label}: {row['limiter_us']} us vs {row['baseline_us']} us, "
            f"median ratio {row['ratio']}x (rounds {row['ratio_spread'][0]}-"
            f"{row['ratio_spread'][1]}x; best {row['best_limiter_us']} / "
            f"{row['best_baseline_us']} us; {row['rounds']} rounds x {row['ops_per_round']})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--url", help="an existing Redis (its database is flushed)")
    parser.add_argument("--tls", action="store_true",
                        help="TLS against plain TCP, on two servers of its own")
    args = parser.parse_args()
    n, rounds = (100, 5) if args.quick else (200, 61)
    if args.tls:
        if args.url:
            sys.exit("--tls starts its own two servers: leave out --url")
        with own_redis_server() as plain_url, own_redis_server(tls=True) as tls_url:
            results = run_tls(plain_url, tls_url, n, rounds)
    elif args.url:
        results = run(args.url, n, rounds)
    else:
        with own_redis_server() as url:
            results = run(url, n, rounds)
    report = {"machine": machine(), "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("machine:", json.dumps(report["machine"]))
    if args.tls:
        print_rows(results, (
            ("tls_fast_path", "acquire+release over TLS vs over plain TCP"),
            ("tls_refusal", "queue_full refusal over TLS vs over plain TCP"),
            ("tls_ping", "PING over TLS vs over plain TCP"),
        ))
        print("refusal check:", results["tls_refusal"]["check"])
        return
    print_rows(results, (
        ("fast_path", "acquire+release vs redis-py Lock acquire+release"),
        ("refusal", "queue_full refusal vs PING"),
    ))
    for name, goal in GOALS.items():
        ratio = results[name]["ratio"]
        print(f"goal {name} <= {goal}x: {'met' if ratio <= goal else 'MISSED'} ({ratio}x)")
    print("refusal check:", results["refusal"]["check"])


if __name__ == "__main__":
    main()
