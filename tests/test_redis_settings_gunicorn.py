"""Settings are data in Redis, the newest start wins: whole services under real gunicorn.

design:

    Each server is ``tests.apps.build_log_app`` under gunicorn with the shipped
    ``webapp/gunicorn.conf.py`` (two workers on one Redis, ``build_log_server``), every build
    writing its start and end to one log shared by all the servers of a test (``Gate``), so
    the most builds running at once across every process is read from the log
    (``at_once_along``). A ``hold-`` key's build waits for the gate file, so a burst of them
    fills the budget and stays there while the test looks; other keys build in 50 ms.

    A process starts using the budget at its first call (the extension opens no connection
    before): every worker of a server is made to answer once (``every_worker``) before the
    next server starts, so that "started second" means what it says.

    restart  a server with REACHLIMIT_ACTIVE=2 serves and is stopped; one with 3 starts on the
             same Redis: no 5xx, and a burst of distinct cold keys admits exactly 3 builds
             at once and the queue.
    rolling  the old server (2) stays up under load while the new one (3) starts beside it:
             no 5xx from either, never more than 3 builds at once service-wide, and every
             worker of both shows the budget's 3.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from tests.apps.build_log_app import at_once_along, running_now
from tests.support.clients import Herd, Load, Reply, check_refusal
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.redis_sentinel import (
    Gate,
    build_log_server,
    gate_fixture,  # noqa: F401 (the gate fixture)
    worker_figures,
)
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

PREFIX = "deploy"
TAG = "{" + PREFIX + ":cold}"  # the default budget's keys
QUEUE = 4
WAIT = 30.0  # a held burst's waiters stay queued while the test looks


def settings_env(active: int) -> dict[str, str]:
    return {
        "REACHLIMIT_REDIS_PREFIX": PREFIX,
        "REACHLIMIT_ACTIVE": str(active),
        "REACHLIMIT_QUEUE": str(QUEUE),
        "REACHLIMIT_WAIT": str(WAIT),
    }


def server(tmp_path: Path, name: str, gate: Gate, redis_server: RedisServer,
           active: int) -> GunicornServer:
    return build_log_server(tmp_path, name, gate, redis_server.url(), settings_env(active))


def health_capacity(server: GunicornServer, asks: int = 10) -> set[int]:
    """``capacity_active`` as the health view (``/health``) shows it, asked ``asks`` times
    (whichever worker answers each)."""
    seen = set()
    for _ in range(asks):
        reply = server.get("/health")
        assert reply.status == 200, reply
        seen.add(reply.json()["reach"]["capacity_active"])
    return seen


def statuses(replies: list[Reply | BaseException]) -> Counter[int]:
    errors = [r for r in replies if not isinstance(r, Reply)]
    assert not errors, errors[:3]
    return Counter(r.status for r in replies if isinstance(r, Reply))


def held_burst(servers: list[GunicornServer], gate: Gate, watch: redis.Redis, active: int,
               label: str, n: int = 20) -> None:
    """``n`` requests of distinct held keys at once, spread over ``servers``: exactly
    ``active`` builds run and ``QUEUE`` wait, the rest are refused at once; then the gate
    opens and every admitted one is served."""
    herds = [
        Herd(s.port, [f"/report/hold-{label}-{i}" for i in range(k, n, len(servers))])
        for k, s in enumerate(servers)
    ]
    refused = n - active - QUEUE

    def replied() -> int:
        return sum(r is not None for herd in herds for r in herd.replies)

    wait_until("the refusals", lambda: replied() >= refused)
    wait_until("the budget full",
               lambda: running_now(gate.dir) == active
               and int(watch.zcard(f"{TAG}:queue")) == QUEUE)
    assert replied() == refused  # nobody admitted has been answered: their builds are held
    for herd in herds:
        for reply in herd.replies:
            if reply is not None:
                assert isinstance(reply, Reply), reply
                check_refusal(reply)
    assert int(watch.zcard(f"{TAG}:holders")) == active
    gate.open()
    replies: list[Reply | BaseException] = [r for herd in herds for r in herd.results()]
    assert statuses(replies) == {200: active + QUEUE, 429: refused}


def test_a_restart_with_more_slots_serves_and_admits_the_new_figures(
    tmp_path: Path, gate: Gate, redis_server: RedisServer, client: redis.Redis
) -> None:
    old = server(tmp_path, "old", gate, redis_server, active=2)
    with serving(old):
        assert {f["capacity_active"] for f in worker_figures(old).values()} == {2}
        assert statuses([old.get(f"/report/before-{n}") for n in range(6)]) == {200: 6}
    assert client.hget(f"{TAG}:settings", "active") == b"2"  # left in Redis, without a TTL
    new = server(tmp_path, "new", gate, redis_server, active=3)
    with serving(new):
        figures = worker_figures(new)
        assert {f["capacity_active"] for f in figures.values()} == {3}
        assert statuses([new.get(f"/report/after-{n}") for n in range(6)]) == {200: 6}
        held_burst([new], gate, client, active=3, label="restart")
        assert max(at_once_along(gate.dir)) == 3
    assert "settings of budget " + TAG + " changed by" in new.stderr()
    assert "active 2 -> 3" in new.stderr()


def test_a_rolling_deploy_with_more_slots_never_fails_and_never_overadmits(
    tmp_path: Path, gate: Gate, redis_server: RedisServer, client: redis.Redis
) -> None:
    old = server(tmp_path, "old", gate, redis_server, active=2)
    new = server(tmp_path, "new", gate, redis_server, active=3)
    with serving(old):
        assert {f["capacity_active"] for f in worker_figures(old).values()} == {2}
        load = Load([old.port], threads=6)
        try:
            wait_until("the old server under load", lambda: load.count() >= 20)
            with serving(new):
                load.ports.append(new.port)  # the new server takes traffic beside the old
                assert {f["capacity_active"] for f in worker_figures(new).values()} == {3}
                before = load.count()
                wait_until("both servers under load", lambda: load.count() >= before + 40)
                replies = [reply for reply, _ in load.finish()]
                # The budget's settings, whichever server's worker answers its health.
                assert health_capacity(old) == health_capacity(new) == {3}
                assert {f["capacity_active"] for f in worker_figures(old).values()} == {3}
                wait_until("the load's builds ended", lambda: running_now(gate.dir) == 0)
                held_burst([old, new], gate, client, active=3, label="rolling")
        finally:
            load.finish()
    counts = statuses(replies)
    assert set(counts) <= {200, 429}, counts  # never a 5xx, from either server
    assert counts[200] > 0
    assert max(at_once_along(gate.dir)) <= 3  # service-wide, old and new workers together
    assert "active 2 -> 3" in new.stderr() and "active 2 -> 3" not in old.stderr()
