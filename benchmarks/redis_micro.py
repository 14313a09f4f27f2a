#!/usr/bin/env python3
"""RedisColdLimiter's two hot paths, each against a redis-py baseline timed in turn with it,
as ratios; over TLS against plain TCP; on a Redis Cluster.

    python benchmarks/redis_micro.py            # about 15 s
    python benchmarks/redis_micro.py --quick    # a few seconds, rough figures
    python benchmarks/redis_micro.py --url redis://127.0.0.1:6379/15   # an existing Redis
                                                # (the database is FLUSHED: use a spare one)
    python benchmarks/redis_micro.py --tls      # the same paths over TLS vs plain TCP
    python benchmarks/redis_micro.py --cluster  # on a three-primary Redis Cluster

Without ``--url`` it starts its own ``redis-server`` (``tests/support/redis_server.py``: a free
loopback port, a temporary directory, no persistence, stopped by PID). One client, one
connection; the pairs (``_paired.py``: alternating rounds in worker processes, the median of
the rounds' ratios):

fast_path   ``g = lim.acquire(); g.release()`` with a free slot (two scripts, two round
            trips), against a redis-py ``Lock`` ``acquire(); release()`` pair (``SET NX PX``
            and a release script: two round trips too). Goal: <= 0.9x.
refusal     ``acquire()`` refused with the queue full (one script, one round trip), against
            a ``PING``: the cheapest round trip there is. Goal: <= 1.3x. After timing, a check
            that every call was a ``queue_full`` refusal and nothing else moved.

With ``--tls`` it starts two servers (``tests/support/redis_tls.py``: one with TLS, its
certificate made by ``openssl``, the client verifying it) and times each path over TLS against
the same path over plain TCP: ``tls_fast_path``, ``tls_refusal``, ``tls_ping``.

With ``--cluster`` it starts a three-primary cluster (``tests/support/redis_cluster.py``) and
talks to it through ``reachlimit.redis.connect("redis+cluster://...")``: ``fast_path`` against
two ``GET`` of a key of the limiter's hash tag (two round trips to the same node),
``refusal_vs_get`` against one such ``GET``, ``refusal_vs_ping`` against a ``PING`` sent to
that node.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _paired
import _report
import redis
from _paired import Pair, Spec, Worker, call

from reachlimit import Busy
from reachlimit.redis import RedisColdLimiter, connect
from tests.support.redis_limiters import LimiterScript

SPEC = Spec("redis_micro", sides=("baseline", "limiter"), unit="us", rounds=61, quick_rounds=5)
#: The goals: (pair, highest ratio); the product's bars for the shared limiter.
GOALS = {"fast_path": 0.9, "refusal": 1.3}
#: The text report's labels, by mode: pair, subject, baseline.
LABELS = {
    "plain": (("fast_path", "acquire+release", "redis-py Lock acquire+release"),
              ("refusal", "queue_full refusal", "PING")),
    "tls": (("tls_fast_path", "acquire+release over TLS", "over plain TCP"),
            ("tls_refusal", "queue_full refusal over TLS", "over plain TCP"),
            ("tls_ping", "PING over TLS", "over plain TCP")),
    "cluster": (("fast_path", "acquire+release", "2 GET (same node, RedisCluster)"),
                ("refusal_vs_get", "queue_full refusal", "GET (same node, RedisCluster)"),
                ("refusal_vs_ping", "queue_full refusal", "PING (same node, RedisCluster)")),
}  # fmt: skip


class _Parked(RedisColdLimiter):
    """Its ghost holders and waiters (admitted, never polling) stay for the whole run."""

    PRESENCE = 3600.0


def bench_client(url: str) -> Any:
    """A client with the library's short timeouts, on an emptied database (every node of a
    cluster)."""
    client = connect(url, timeout=0.5) if url.startswith("redis+cluster") else \
        redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    client.flushall() if url.startswith("redis+cluster") else client.flushdb()
    return client


def fast_path_of(client: Any) -> tuple[Callable[[], None], RedisColdLimiter]:
    """``acquire(); release()`` of a free limiter on ``client`` (scripts loaded)."""
    lim = RedisColdLimiter(client, "bench-fast", active=2, queue=8, lease=60.0)

    def fast_path() -> None:
        lim.acquire().release()

    fast_path()
    return fast_path, lim


class Refusals:
    """A ``queue_full`` refusal on ``client``: two ghost holders and eight ghost waiters
    keep the queue full for the whole run; ``check`` says every call was refused so."""

    def __init__(self, client: Any) -> None:
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
        return {
            # Every call was a queue_full refusal: no grant, no waiter, nothing reaped.
            "ok": self.refused == after.rejected_full
            and after.acquired == self.before.acquired
            and (after.active, after.queued, after.lease_lost) == (2, 8, 0),
            "refused": self.refused,
        }

    def tag_key(self) -> str:
        """A key of the limiter's hash tag: on its node in a cluster."""
        return self.limiter.keys[0].rsplit(":", 1)[0] + ":bench"


def plain_pairs(url: str) -> Iterator[Pair]:
    client = bench_client(url)
    fast_path, lim = fast_path_of(client)
    lock = client.lock("bench-lock", timeout=60)

    def lock_pair() -> None:
        lock.acquire()
        lock.release()

    yield Pair("fast_path", call("Lock pair", lock_pair), call("limiter", fast_path))
    lim.close()
    refusal = Refusals(client)
    yield Pair("refusal", call("PING", client.ping), call("refusal", refusal),
               lambda: {"check": refusal.check()})
    refusal.limiter.close()
    client.flushdb()
    client.close()


def tls_pairs(plain_url: str, tls_url: str) -> Iterator[Pair]:
    """Each path over TLS (the subject) against the same path over plain TCP."""
    plain, tls = bench_client(plain_url), bench_client(tls_url)
    (plain_fast, plain_lim), (tls_fast, tls_lim) = fast_path_of(plain), fast_path_of(tls)
    yield Pair("tls_fast_path", call("plain", plain_fast), call("tls", tls_fast))
    plain_lim.close()
    tls_lim.close()
    refusals = {"plain": Refusals(plain), "tls": Refusals(tls)}
    yield Pair("tls_refusal", call("plain", refusals["plain"]), call("tls", refusals["tls"]),
               lambda: {"check": {k: r.check() for k, r in refusals.items()}})
    yield Pair("tls_ping", call("plain", plain.ping), call("tls", tls.ping))
    for client in (plain, tls):
        client.flushdb()
        client.close()


def cluster_pairs(url: str) -> Iterator[Pair]:
    client = bench_client(url)
    fast_path, lim = fast_path_of(client)
    same_slot = lim.keys[0].rsplit(":", 1)[0] + ":bench"  # the limiter's tag: its node
    client.set(same_slot, b"x")

    def two_gets() -> None:
        client.get(same_slot)
        client.get(same_slot)

    yield Pair("fast_path", call("2 GET", two_gets), call("limiter", fast_path))
    lim.close()
    refusal = Refusals(client)
    node = client.get_node_from_key(refusal.limiter.keys[0])
    client.set(refusal.tag_key(), b"x")
    yield Pair("refusal_vs_get", call("GET", lambda: client.get(refusal.tag_key())),
               call("refusal", refusal))
    yield Pair("refusal_vs_ping",
               call("PING", lambda: client.execute_command("PING", target_nodes=node)),
               call("refusal", refusal), lambda: {"check": refusal.check()})
    refusal.limiter.close()
    client.close()


def pairs(worker: Worker) -> Iterator[Pair]:
    args = worker.args
    if args.tls:
        return tls_pairs(args.url, args.tls_url)
    return cluster_pairs(args.url) if args.cluster else plain_pairs(args.url)


@contextlib.contextmanager
def servers(args: Any) -> Iterator[list[str]]:
    """The servers the run needs, started unless ``--url`` names one: the workers' argv for
    them (stopped by PID on the way out)."""
    if args.url:
        yield []
        return
    from tests.support.redis_cluster import RedisCluster
    from tests.support.redis_sentinel import running
    from tests.support.redis_server import RedisServer
    from tests.support.redis_tls import TLSRedis

    with tempfile.TemporaryDirectory(prefix="reachlimit-redis-micro-") as tmp, \
            contextlib.ExitStack() as stack:
        base = Path(tmp)
        if args.cluster:
            cluster = stack.enter_context(running(RedisCluster(base / "cluster")))
            yield ["--url", cluster.url()]
            return
        (base / "plain").mkdir()
        plain = stack.enter_context(running(RedisServer(base / "plain")))
        if args.tls:
            tls = stack.enter_context(running(TLSRedis(base / "tls")))
            yield ["--url", plain.url(), "--tls-url", tls.url()]
        else:
            yield ["--url", plain.url()]


def server_version(client: Any) -> str:
    """The redis-server's version (a cluster client answers INFO node by node)."""
    info = client.info("server")
    return str(info["redis_version"] if "redis_version" in info
               else next(iter(info.values()))["redis_version"])  # fmt: skip


def mode(args: Any) -> str:
    return "tls" if args.tls else "cluster" if args.cluster else "plain"


def render(report: dict[str, Any]) -> str:
    r = report["results"]
    rows = LABELS[report["config"]["mode"]]
    out = [*_report.head(f"reachlimit RedisColdLimiter hot paths ({report['config']['mode']})",
                         report), _paired.timing_line(r[rows[0][0]]), ""]
    out += _paired.table([(a, b, r[key]) for key, a, b in rows], SPEC)
    checks = {k: row["check"] for k, row in r.items() if "check" in row}
    out += [f"refusal check: {checks}", ""]
    return _report.closing(out, report)


def main(argv: list[str] | None = None) -> int:
    p = _paired.parser(__doc__, SPEC)
    p.add_argument("--url", help="an existing Redis (its database is flushed)")
    p.add_argument("--tls", action="store_true",
                   help="TLS against plain TCP, on two servers of its own")
    p.add_argument("--tls-url", help=argparse.SUPPRESS)
    p.add_argument("--cluster", action="store_true",
                   help="on a three-primary Redis Cluster of its own")
    run = _paired.Session(__file__, p, SPEC, pairs, argv)
    args = run.args
    if run.in_worker:
        return run.work()
    if args.url and (args.tls or args.cluster):
        p.error("--tls and --cluster start their own servers: leave out --url")
    if args.tls and args.cluster:
        p.error("--tls or --cluster, not both")
    with servers(args) as where:
        group = run.group(argv=tuple(where))
        with contextlib.closing(bench_client(where[1] if where else args.url)) as client:
            run.report["machine"]["redis_server"] = server_version(client)
    results = _paired.results(group, SPEC)
    goals = [] if args.tls or args.cluster else _paired.ratio_goals(
        [(f"{key} vs its baseline", key, most) for key, most in GOALS.items()], results)
    return run.finish(render, config={"mode": mode(args)}, results=results, goals=goals,
                      figures=_paired.ratio_figures(results))


if __name__ == "__main__":
    sys.exit(main())
