"""A service on Redis behind Sentinel (``redis+sentinel://``): one primary, one replica and
three sentinels that the tests start (``tests/support/redis_sentinel.py``), real gunicorn
in front.

design:

    The failover test runs ``tests.apps.build_log_app`` under gunicorn (2 workers, the
    shipped config) on ``redis+sentinel://<three sentinels>/svc/0``. Six client threads send
    distinct cold keys, one after another each (50 ms builds), while the test SIGKILLs the
    primary. The sentinels notice after 1 s (down-after) and promote the replica; meanwhile
    each worker answers from its in-process fallback and probes Redis with its backoff (0.25
    s doubled up to 5 s), whose client asks the sentinels where the primary is at each new
    connection. What is asserted: no 5xx and no client error at any time; no request longer
    than its bound (below); the replica promoted and named by the sentinels; both workers
    back on Redis and not degraded; the budget's keys and a grant made after the failover on
    the promoted replica; then a burst of 40 distinct cold keys (builds held by the test)
    admits exactly 2 building and fills the 8 places, read on the new primary, and answers
    every admitted request 200 (10) and every other one 429, each counted there (a waiter
    whose 2 s wait ended before the test opened the gate, or whose worker a loaded machine
    kept from polling within its presence period, is refused too: the figures are awaited
    until every request is accounted for). Before the kill the builds log never shows more
    than the budget's 2 at once.

    What is printed, never asserted (the figures the README's guarantees quote): the time
    from the SIGKILL to the promotion and to the first grant on the new primary, and the most
    builds at once during the switch (the over-admission: the fallback's per-process limits,
    plus any grant written to the old primary that had not reached the replica).

    The request bound is the contract's, wait + two socket timeouts (a waiter queued on the
    primary that dies goes on with the fallback for the rest of its wait; leaving the shared
    queue can take one more timeout), plus the build itself and a slack for the HTTP round
    trip and gunicorn on a loaded 2-core machine (SLACK, deliberately generous: it is the
    one machine-dependent part of the bound).

    The unreplicated-grants test makes the other half of the over-admission certain instead
    of hoping for replication lag: replication is cut with both servers up
    (``SentinelSet.cut_replication``), two builds are granted on the primary and held, the
    primary is killed, and the new primary, which never heard of them, admits a whole
    budget beside them: exactly 4 builds at once with active 2.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from redis.sentinel import Sentinel

from reachlimit import ColdLimiter
from reachlimit.redis import (
    RedisColdLimiter,
    RedisHealth,
    RedisLimiterStats,
    ResilientLimiter,
    connect,
)
from tests.apps.build_log_app import at_once_along, running_now
from tests.support import HOST
from tests.support.clients import Herd, Load, Reply, check_refusal
from tests.support.gunicorn_server import serving
from tests.support.redis_limiters import burst_accounted, refusals, reservations_over
from tests.support.redis_sentinel import (  # noqa: F401 - the gate and sentinels fixtures
    SERVICE,
    Gate,
    SentinelSet,
    build_log_server,
    gate_fixture,
    sentinels_fixture,
    worker_figures,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(120)]

PREFIX = "sentinel"
TAG = "{" + PREFIX + ":cold}"
WAIT = 2.0  # REACHLIMIT_WAIT
LEASE = 3.0  # REACHLIMIT_LEASE: a grant lost with the old primary ends within it
SOCKET_TIMEOUT = 0.5  # reachlimit.redis.connect's default
BUILD = 0.05  # BUILD_SECONDS of a load key
SLACK = 3.0  # HTTP and gunicorn on a loaded 2-core machine (see the module's design)
LOADERS = 10


def settings_env() -> dict[str, str]:
    return {
        "REACHLIMIT_REDIS_PREFIX": PREFIX,
        "REACHLIMIT_WAIT": str(WAIT),
        "REACHLIMIT_LEASE": str(LEASE),
        "BUILD_SECONDS": str(BUILD),
    }


def test_connect_gives_the_primary_the_sentinels_name(sentinels: SentinelSet) -> None:
    client = connect(sentinels.url())
    ready = Sentinel([(HOST, s.port) for s in sentinels.sentinels], socket_timeout=0.5)
    try:
        assert client.set("where", b"primary")
        primary = sentinels.primary.client()
        assert primary.get("where") == b"primary"  # written to the primary itself
        primary.close()
        # The library objects take the client connect() made and a ready master_for(...).
        for n, each in enumerate((client, ready.master_for(SERVICE, socket_timeout=0.5))):
            shared = RedisColdLimiter(each, f"lib{n}", 1, 1, 1.0, prefix="lib")
            resilient = ResilientLimiter(shared, ColdLimiter(1, 1, 1.0), RedisHealth())
            with resilient.acquire():
                assert shared.stats().active == 1
                assert resilient.stats().backend == "redis"
            resilient.close()
    finally:
        client.close()
        for sentinel in ready.sentinels:
            sentinel.close()


def check_held_burst(
    herd: Herd, watch: RedisColdLimiter, before: RedisLimiterStats, burst: int
) -> None:
    """A burst of ``burst`` distinct held keys (more than 2 + 8) against the budget, read on
    the new primary: 2 building, every queue place taken, every other request refused at
    once with the refusal every layer promises. A place the queue lacks is a waiter's that
    was refused meanwhile: its 2 s wait ended, or (a loaded machine) its worker missed its
    presence period (``burst_accounted``)."""
    stats = burst_accounted(watch, burst, before)
    timed_out = stats.rejected_timeout - before.rejected_timeout
    assert stats.active == 2 and stats.queued + timed_out >= 8 >= stats.queued, stats
    for reply in herd.wait_done(refusals(stats) - refusals(before)):
        check_refusal(reply)


def check_burst_answers(
    herd: Herd, watch: RedisColdLimiter, before: RedisLimiterStats, burst: int
) -> None:
    """The gate open, the burst's answers: 200 for each request the budget admitted (10: 2
    building and 8 waiting, unless a waiter was refused meanwhile and nobody took its place)
    and the refusal for every other one, each counted on the new primary."""
    statuses = Counter(r.status for r in herd.results())
    after = watch.stats()
    admitted = after.acquired - before.acquired
    assert set(statuses) <= {200, 429} and sum(statuses.values()) == burst, statuses
    assert statuses[200] == admitted <= 10, (statuses, after)
    assert statuses[429] == refusals(after) - refusals(before), (statuses, after)
    assert admitted == 10 or after.rejected_timeout > before.rejected_timeout, (statuses, after)


def test_a_primary_killed_under_load_fails_over_to_the_replica(
    tmp_path: Path, gate: Gate, sentinels: SentinelSet
) -> None:
    assert sentinels.replica is not None
    server = build_log_server(tmp_path, "sentinel", gate, sentinels.url(), settings_env())
    with serving(server):
        assert all(f["backend"] == "redis" for f in worker_figures(server).values())
        load = Load([server.port], LOADERS)
        try:
            wait_until("the load under way", lambda: load.count() >= 40)
            replica = sentinels.replica.client()
            before = len(at_once_along(gate.dir))  # log lines written before the kill
            sentinels.primary.kill()
            killed = time.monotonic()
            # The replica is frozen until promoted: its count of grants is exact now.
            acquired_before = int(replica.hget(f"{TAG}:stats", "acquired") or 0)
            wait_until("the replica promoted and named by the sentinels",
                       lambda: sentinels.replica_is_primary()
                       and sentinels.named_primary() == sentinels.replica.port,
                       timeout=30, interval=0.005)
            promoted = time.monotonic() - killed
            wait_until("a grant on the new primary",
                       lambda: int(replica.hget(f"{TAG}:stats", "acquired") or 0)
                       > acquired_before, timeout=30, interval=0.005)
            first_grant = time.monotonic() - killed

            def both_back() -> bool:
                figures = worker_figures(server)
                return all(f["backend"] == "redis" and not f["degraded"]
                           for f in figures.values())

            wait_until("both workers back on Redis", both_back, timeout=30, interval=0.01)
            back = time.monotonic() - killed
            after = len(at_once_along(gate.dir))
        finally:
            outcomes = load.finish()
        wait_until("the load's builds ended", lambda: running_now(gate.dir) == 0)

        bound = WAIT + 2 * SOCKET_TIMEOUT + BUILD + SLACK
        errors = [o for o, _ in outcomes if not isinstance(o, Reply)]
        assert not errors, errors[:3]
        statuses = Counter(o.status for o, _ in outcomes if isinstance(o, Reply))
        assert all(status in (200, 429) for status in statuses), statuses  # never a 5xx
        longest = max(seconds for _, seconds in outcomes)
        assert longest <= bound, (longest, bound)
        counts = at_once_along(gate.dir)
        assert max(counts[:before]) <= 2  # one budget for both workers while it answered
        assert after > before  # builds ran during the switch: the fallback answered
        switch = max(counts[before:after])
        over = max(switch - 2, 0)

        # The new primary holds the budget's keys and is the one in use: grants lost with
        # the old primary end with their lease, then a burst admits exactly the budget.
        new_primary = connect(f"redis://{HOST}:{sentinels.replica.port}/0")
        watch = RedisColdLimiter(new_primary, "cold", 2, 8, WAIT, lease=LEASE, prefix=PREFIX)
        try:
            assert replica.exists(f"{TAG}:settings", f"{TAG}:stats") == 2
            wait_until("nothing held or queued on the new primary",
                       lambda: (s := watch.stats()).active == 0 and s.queued == 0,
                       timeout=LEASE + 10, interval=0.05)
            wait_until("no recovery reservation in force",
                       lambda: reservations_over(new_primary, TAG), interval=0.05)
            idle = watch.stats()
            herd = Herd(server.port, [f"/report/hold-{n}" for n in range(40)])
            check_held_burst(herd, watch, idle, 40)
            assert all(f["backend"] == "redis" and not f["degraded"]
                       for f in worker_figures(server).values())
            gate.open()
            check_burst_answers(herd, watch, idle, 40)
        finally:
            watch.close()
            new_primary.close()
            replica.close()
    print(
        f"\nSentinel failover under {LOADERS} clients (2 workers, active 2, wait {WAIT} s, "
        f"lease {LEASE} s): promoted {promoted * 1000:.0f} ms after the SIGKILL, first grant "
        f"on the new primary {first_grant * 1000:.0f} ms, both workers back on Redis "
        f"{back * 1000:.0f} ms; most builds at once during the switch {switch} (over-admission "
        f"{over} beyond active 2); {len(outcomes)} requests {dict(statuses)}, longest "
        f"{longest * 1000:.0f} ms (bound {bound * 1000:.0f} ms)"
    )
    assert "is unavailable" in server.stderr() and "answers again" in server.stderr()


def test_grants_the_replica_never_received_are_unknown_to_the_new_primary(
    tmp_path: Path, gate: Gate, sentinels: SentinelSet
) -> None:
    """The over-admission a failover can cause, made certain: replication is cut (both
    servers up), two builds are granted on the primary and held, the primary is killed and
    the replica promoted. The new primary has never heard of those two grants, so it admits
    a whole budget beside them: 4 builds at once with active 2, until the two end."""
    assert sentinels.replica is not None
    server = build_log_server(tmp_path, "unreplicated", gate, sentinels.url(), settings_env())
    with serving(server):
        assert all(f["backend"] == "redis" for f in worker_figures(server).values())
        primary = sentinels.primary.client()
        sentinels.cut_replication()
        first = Herd(server.port, ["/report/hold-old-0", "/report/hold-old-1"])
        wait_until("2 builds running, granted on the primary",
                   lambda: running_now(gate.dir) == 2 and primary.zcard(f"{TAG}:holders") == 2)
        primary.close()
        sentinels.primary.kill()
        wait_until("the replica promoted and named by the sentinels",
                   lambda: sentinels.replica_is_primary()
                   and sentinels.named_primary() == sentinels.replica.port,
                   timeout=30, interval=0.01)

        def both_back() -> bool:
            return all(f["backend"] == "redis" and not f["degraded"]
                       for f in worker_figures(server).values())

        wait_until("both workers back on Redis", both_back, timeout=30, interval=0.01)
        new_primary = connect(f"redis://{HOST}:{sentinels.replica.port}/0")
        watch = RedisColdLimiter(new_primary, "cold", 2, 8, WAIT, lease=LEASE, prefix=PREFIX)
        try:
            # A worker back from the outage may have reserved the other's share for a
            # moment: not the over-admission this test is about.
            wait_until("no recovery reservation in force",
                       lambda: reservations_over(new_primary, TAG), interval=0.05)
            before = watch.stats()
            assert (before.active, before.queued) == (0, 0)  # the 2 grants: never replicated
            assert running_now(gate.dir) == 2  # ... while their builds still run
            second = Herd(server.port, [f"/report/hold-new-{n}" for n in range(12)])
            check_held_burst(second, watch, before, 12)
            wait_until("the new grants' builds running", lambda: running_now(gate.dir) == 4)
            most = max(at_once_along(gate.dir))
            gate.open()
            assert Counter(r.status for r in first.results()) == {200: 2}
            check_burst_answers(second, watch, before, 12)
        finally:
            watch.close()
            new_primary.close()
    assert most == 4
    print(f"\ngrants the replica never received: {most} builds at once with active 2 "
          f"(over-admission {most - 2}, as long as the 2 unknown builds run)")
