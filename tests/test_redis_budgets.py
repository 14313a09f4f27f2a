"""Budgets on a real redis-server: each named budget has its own keys and slots under the hash
tag ``{<prefix>:<budget>}``, the default keeps ``{<prefix>:cold}`` (the keys of the version
before budgets), each records its own settings, every limiter lists its name in the prefix's
registry, and ``release_worker`` frees a dead worker's places in every budget - those only
declared in code included - and returns the sums.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask

from reachlimit.flask import ReachLimit, release_worker
from reachlimit.redis import RedisColdLimiter, RedisSingleFlight, registry_key
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def prefix() -> str:
    return f"budgets-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def app(live_redis: RedisServer, prefix: str) -> Iterator[Flask]:
    rl = ReachLimit(redis_url=live_redis.url(), redis_prefix=prefix)
    reports = rl.budget("reports", active=1, queue=0)
    app = Flask("redis-budgets")
    app.config["REACHLIMIT_BUDGETS"] = {"exports": {"active": 3}}
    rl.init_app(app)
    app.add_url_rule("/d/<k>", "d", lambda k: rl.cold(k, lambda: {"k": k}))
    app.add_url_rule("/r/<k>", "r", lambda k: reports.cold(k, lambda: {"r": k}))
    app.add_url_rule("/health", view_func=rl.health_view)
    yield app
    rl.close(app)


def keys_of(client: redis.Redis, prefix: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=f"*{prefix}*")}


def test_each_budget_has_its_own_hash_tag_and_the_default_keeps_cold(
    app: Flask, client: redis.Redis, prefix: str
) -> None:
    assert app.test_client().get("/d/x").get_json() == {"k": "x"}
    assert app.test_client().get("/r/x").get_json() == {"r": "x"}
    keys = keys_of(client, prefix) - {registry_key(prefix)}
    # The limiter's keys carry the budget's tag; the cache's entries spread over slots but
    # are named after the budget too.
    tags = {k[: k.index("}") + 1] for k in keys if k.endswith(":settings")}
    assert f"{{{prefix}:cold}}" in tags and f"{{{prefix}:reports}}" in tags, keys
    owners = {k.split(":")[1].rstrip("}") for k in keys}
    assert owners == {"cold", "reports"}, keys  # "exports" built nothing: no key yet
    # Each budget's settings are its own record; the registry lists both limiters.
    assert client.hget(f"{{{prefix}:cold}}:settings", "active") == b"2"
    assert client.hget(f"{{{prefix}:reports}}:settings", "active") == b"1"
    assert client.smembers(registry_key(prefix)) == {b"cold", b"reports"}
    health = app.test_client().get("/health").get_json()
    assert set(health["budgets"]) == {"default", "reports", "exports"}
    assert health["budgets"]["reports"]["backend"] == "redis"
    assert health["budgets"]["exports"]["capacity_active"] == 3


def test_a_full_budget_on_redis_refuses_while_the_default_builds(
    app: Flask, live_redis: RedisServer, make_client: Any, prefix: str
) -> None:
    other = RedisColdLimiter(make_client(), "reports", 1, 0, lease=10.0, prefix=prefix)
    held = other.acquire()  # another process's build in "reports"
    try:
        refused = app.test_client().get("/r/y")
        assert refused.status_code == 429 and "'reports'" in refused.get_json()["error"]
        assert app.test_client().get("/d/y").status_code == 200
    finally:
        held.release()
    assert app.test_client().get("/r/y").status_code == 200


def test_release_worker_frees_the_places_of_every_budget(
    live_redis: RedisServer, make_client: Any, prefix: str
) -> None:
    # This process plays the dead worker: its tokens carry its own pid.
    held = [
        RedisColdLimiter(make_client(), name, 2, 2, lease=60.0, prefix=prefix).acquire()
        for name in ("cold", "reports", "code-only")
    ]
    config = {"REACHLIMIT_REDIS_URL": live_redis.url(), "REACHLIMIT_REDIS_PREFIX": prefix,
              "REACHLIMIT_BUDGETS": '{"reports": {}}'}
    assert release_worker(config, os.getpid()) == (3, 0)
    for name in ("cold", "reports", "code-only"):
        probe = RedisColdLimiter(make_client(), name, 2, 2, lease=60.0, prefix=prefix)
        assert probe.stats().active == 0, name  # freed at once, not after the 60 s lease
    assert release_worker(config, os.getpid()) == (0, 0)
    for grant in held:
        grant.release()  # already freed: nothing of another's is touched
    assert release_worker({}, os.getpid()) is None  # no Redis URL: nothing to do


def test_release_worker_drops_the_workers_singleflight_claims(
    live_redis: RedisServer, make_client: Any, prefix: str, reachlimit_log: pytest.LogCaptureFixture
) -> None:
    # This process plays the dead worker: a flight it leads, under its own pid, whose claim
    # would stand for its minute-long lease; another prefix's claim is not touched.
    mine = RedisSingleFlight(make_client(), "reports", lease=60.0, prefix=prefix)
    other = RedisSingleFlight(make_client(), "reports", lease=60.0, prefix=prefix + "-other")
    started, finish = threading.Event(), threading.Event()

    def build() -> str:
        started.set()
        assert finish.wait(10)
        return "v"

    leads = [threading.Thread(target=f.do, args=("k", build), daemon=True) for f in (mine, other)]
    try:
        for t in leads:
            started.clear()
            t.start()
            assert started.wait(10)
        client = make_client()
        config = {"REACHLIMIT_REDIS_URL": live_redis.url(), "REACHLIMIT_REDIS_PREFIX": prefix}
        assert release_worker(config, os.getpid()) == (0, 0)
        assert not client.exists(mine.base_of("k") + "lead")  # dropped at once
        assert client.exists(other.base_of("k") + "lead")  # another prefix's: kept
        assert any("dropped 1 singleflight claim" in r.getMessage() for r in reachlimit_log.records)
    finally:
        finish.set()
        for t in leads:
            t.join(10)
        mine.close()
        other.close()
