"""``rl.forget(key)`` / ``budget.forget(key)``: one ``cold()`` key dropped from every level of
the warm cache, True when it was there; and ``clear_cache()`` / ``forget()`` on a Redis that
cannot be reached raising ``reachlimit.Unavailable`` (URL masked) instead of failing silently.

design:

    In process: the TTLCache entry (fresh, stale or expired but still held), one budget's
    key only. On a real Redis, two (or three) app objects on one URL and prefix stand for
    the processes of a service: a forget in one drops the shared entry and its index place
    (read back with a raw client) and its own first level at once; another app still holding
    the key in its first level answers it until that level's TTL ends (awaited, never timed),
    and says True when it forgets it itself. With the server stopped (its URL carrying a
    password set with ``requirepass``), both calls raise ``Unavailable`` with the password
    masked, report the failure to the health, and still empty the fallback cache; with the
    server back, an app whose health still says "down" reaches Redis at once (an explicit
    call, not a request's) and the health says "up". ``RedisCache.forget`` on a Redis Cluster
    (the entry and the index on different nodes) too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask, jsonify

from reachlimit import ReachLimitError, TTLCache, Unavailable
from reachlimit.flask import ReachLimit
from reachlimit.redis import RedisCache, RedisHealth, ResilientCache, connect
from reachlimit.redis._common import key_digest
from tests.support import HOST
from tests.support.clock import FakeClock
from tests.support.flask_ext import NumberedBuilds
from tests.support.processes import free_port
from tests.support.redis_clients import restart_if_stopped
from tests.support.redis_cluster import RedisCluster, redis_cluster_fixture  # noqa: F401
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

SECRET = "f0rget-me-n0t-secret"
PREFIX = "forget"


class App:
    """An app with ``/cold/<key>`` (default budget) and ``/reports/<key>`` (budget
    "reports"); ``forget`` and ``clear`` run the extension's calls in its app context."""

    def __init__(self, builds: NumberedBuilds, **config: Any) -> None:
        self.app = app = Flask(f"forget-{uuid.uuid4().hex[:6]}")
        app.config.update(config)
        self.rl = rl = ReachLimit()
        self.reports = reports = rl.budget("reports")
        rl.init_app(app)

        @app.get("/cold/<key>")
        def cold(key: str) -> Any:
            return jsonify(rl.cold(key, lambda: builds.build(key)))

        @app.get("/reports/<key>")
        def report(key: str) -> Any:
            return jsonify(reports.cold(key, lambda: builds.build("reports:" + key)))

    def get(self, path: str) -> tuple[int, str]:
        """The answer's build number and its Cache-Status."""
        reply = self.app.test_client().get(path)
        assert reply.status_code == 200, reply.get_data(as_text=True)
        return reply.get_json()["build"], reply.headers.get("Cache-Status", "")

    def forget(self, key: Any, budget: str = "default") -> bool:
        with self.app.app_context():
            if budget == "default":
                return self.rl.forget(key)
            return self.reports.forget(key)

    def clear(self) -> None:
        with self.app.app_context():
            self.rl.clear_cache()

    @property
    def health(self) -> RedisHealth:
        health = self.app.extensions["reachlimit"].redis
        assert isinstance(health, RedisHealth)
        return health

    def close(self) -> None:
        self.rl.close(self.app)


def hit(answer: tuple[int, str], build: int) -> bool:
    """Whether ``answer`` is a cache hit of build number ``build``."""
    return answer[0] == build and answer[1].startswith("reachlimit; hit")


@pytest.fixture
def apps() -> Iterator[list[App]]:
    made: list[App] = []
    yield made
    for app in made:
        app.close()


# -- in process ---------------------------------------------------------------------------


def test_forget_drops_one_key_and_says_whether_it_was_there() -> None:
    builds = NumberedBuilds()
    app = App(builds)
    assert app.get("/cold/a")[0] == 1 and app.get("/cold/b")[0] == 2
    assert hit(app.get("/cold/a"), 1)
    assert app.forget("a") is True
    assert app.forget("a") is False  # gone already
    assert app.forget("never-cached") is False
    assert app.get("/cold/a")[0] == 3  # built again
    assert app.get("/cold/b")[0] == 2  # the other key stays
    assert builds.keys == ["a", "b", "a"]


def test_a_budget_forgets_its_own_key_only() -> None:
    builds = NumberedBuilds()
    app = App(builds)
    app.get("/cold/k")
    app.get("/reports/k")
    assert app.forget("k", budget="reports") is True
    assert app.forget("k", budget="reports") is False
    assert hit(app.get("/cold/k"), 1)  # the default budget's "k" stays
    assert app.get("/reports/k")[1].startswith("reachlimit; fwd=uri-miss")


def test_forget_follows_the_key_rule_and_needs_an_app_context() -> None:
    app = App(NumberedBuilds())
    with app.app.test_request_context("/"):
        app.rl.cold(1, lambda: "one")
    assert app.forget(True) is True  # True is the key 1, as in a dict and on Redis
    with pytest.raises(TypeError, match=r"forget\(\) was given a float as the cache key"):
        app.forget(1.0)
    with pytest.raises(RuntimeError):
        app.rl.forget("k")  # no app context
    with pytest.raises(RuntimeError):
        app.rl.clear_cache()


def test_ttlcache_forget_drops_fresh_stale_and_held_expired_entries(
    fake_clock: FakeClock,
) -> None:
    cache: TTLCache[str] = TTLCache(ttl=10, size=4, stale=5, clock=fake_clock)
    cache.set("fresh", "v")
    cache.set("stale", "v")
    cache.set("expired", "v")
    assert cache.forget("fresh") is True and cache.get("fresh") is None
    fake_clock.advance(12)  # past the TTL, within the stale window
    assert cache.lookup("stale") is not None
    assert cache.forget("stale") is True and cache.lookup("stale") is None
    fake_clock.advance(10)  # past the stale window too: still held until somebody looks
    assert cache.forget("expired") is True
    assert cache.forget("expired") is False and len(cache) == 0


# -- Redis: two apps stand for two processes ------------------------------------------------


@pytest.mark.redis
def test_forget_on_redis_drops_the_shared_entry_its_index_place_and_the_first_level(
    live_redis: RedisServer, apps: list[App]
) -> None:
    builds = NumberedBuilds()
    config = {"REACHLIMIT_REDIS_URL": live_redis.url(), "REACHLIMIT_REDIS_PREFIX": PREFIX}
    one, two = App(builds, **config), App(builds, **config)
    apps.extend([one, two])
    raw = redis.Redis(host=HOST, port=live_redis.port, socket_timeout=2)
    entry = f"{{{PREFIX}:cold:cache}}:e:{key_digest('k')}"
    index = f"{{{PREFIX}:cold:cache}}:index"
    try:
        assert one.get("/cold/k")[0] == 1
        assert hit(two.get("/cold/k"), 1)  # from Redis, now in two's first level
        assert raw.exists(entry) == 1 and raw.zscore(index, key_digest("k")) is not None

        assert one.forget("k") is True
        assert raw.exists(entry) == 0 and raw.zscore(index, key_digest("k")) is None
        assert one.forget("k") is False  # not in Redis, not in one's first level
        assert two.forget("k") is True  # it was still in two's first level
        assert two.forget("k") is False
        assert one.get("/cold/k")[0] == 2  # built again, for both
        assert two.get("/cold/k")[0] == 2

        # Another process that holds the key in its first level answers it until that
        # level's TTL (local_ttl, 1 s) ends, then the new entry.
        three = App(builds, **config)
        apps.append(three)
        assert three.get("/cold/j")[0] == 3
        assert one.get("/cold/j")[0] == 3  # in one's first level now
        assert three.forget("j") is True
        assert three.get("/cold/j")[0] == 4
        wait_until("one stops answering the forgotten entry",
                   lambda: one.get("/cold/j")[0] == 4)
        assert builds.keys == ["k", "k", "j", "j"]
    finally:
        raw.close()


@pytest.mark.redis
def test_a_budget_on_redis_forgets_its_own_key_only(
    live_redis: RedisServer, apps: list[App]
) -> None:
    builds = NumberedBuilds()
    app = App(builds, REACHLIMIT_REDIS_URL=live_redis.url(), REACHLIMIT_REDIS_PREFIX=PREFIX)
    apps.append(app)
    app.get("/cold/k")
    app.get("/reports/k")
    assert app.forget("k", budget="reports") is True
    assert hit(app.get("/cold/k"), 1)
    assert app.get("/reports/k")[0] == 3


@pytest.fixture
def password(live_redis: RedisServer) -> Iterator[RedisServer]:
    """``live_redis`` with SECRET as its password (``requirepass``); running and without a
    password again after the test, whatever it did (the next test's Redis has none)."""
    set_password(live_redis, None, SECRET)
    yield live_redis
    restart_if_stopped(live_redis)
    try:
        set_password(live_redis, SECRET, "")
    except redis.AuthenticationError:  # restarted by the test: it has none already
        pass


def set_password(server: RedisServer, current: str | None, new: str) -> None:
    raw = redis.Redis(host=HOST, port=server.port, password=current, socket_timeout=2)
    try:
        raw.config_set("requirepass", new)
    finally:
        raw.close()


@pytest.mark.redis
def test_clear_and_forget_with_redis_stopped_raise_unavailable_masked(
    password: RedisServer, apps: list[App]
) -> None:
    live_redis = password
    url = f"redis://default:{SECRET}@{HOST}:{live_redis.port}/0"
    builds = NumberedBuilds()
    app = App(builds, REACHLIMIT_REDIS_URL=url, REACHLIMIT_REDIS_PREFIX=PREFIX)
    apps.append(app)
    assert app.get("/cold/k")[0] == 1 and app.health.up

    live_redis.stop()
    assert app.get("/cold/x")[0] == 2  # built on the fallback, into the fallback cache
    assert hit(app.get("/cold/x"), 2)
    assert not app.health.up
    outages = app.health.figures()["outages"]
    for call in (lambda: app.forget("x"), app.clear):
        with pytest.raises(Unavailable) as info:
            call()
        error = info.value
        assert isinstance(error, ReachLimitError)
        assert error.where == f"redis://default:***@{HOST}:{live_redis.port}/0"
        assert error.reason.startswith("ConnectionError")
        for text in (str(error), repr(error), error.reason):
            assert SECRET not in text
        assert str(error).startswith(f"the shared cache at {error.where} cannot be reached")
        assert app.get("/cold/x")[1].startswith("reachlimit; fwd=uri-miss")  # gone anyway
    figures = app.health.figures()
    assert figures["outages"] == outages and not figures["up"]  # the same outage, reported
    assert "ConnectionError" in figures["last_error"] and SECRET not in figures["last_error"]

    # Back (empty, with its password again): the calls work again, whatever the health
    # said when they began (test_resilient_cache_tries_redis_while_its_health_says_down),
    # and the health says up after them.
    restart_if_stopped(live_redis)
    set_password(live_redis, None, SECRET)
    other = App(builds, REACHLIMIT_REDIS_URL=url, REACHLIMIT_REDIS_PREFIX=PREFIX)
    apps.append(other)
    assert other.get("/cold/y")[0] == 5  # an entry in Redis, set by another process
    assert app.forget("y") is True  # found in Redis: the call went there
    # The call that worked sends the probe at once, which marks Redis up once this process
    # has told Redis what a process back from an outage tells it (RedisHealth.before_up).
    wait_until("the health up after a call that worked", lambda: app.health.up)
    assert other.forget("y") is True and other.forget("y") is False  # its first level's
    app.clear()


@pytest.mark.redis
def test_resilient_cache_tries_redis_while_its_health_says_down(
    live_redis: RedisServer, fake_clock: FakeClock
) -> None:
    """An explicit clear or forget is an admin's call, not a request's: it goes to Redis
    even while the health says Redis is down and no probe is due (the health's clock does
    not move), and a success marks Redis up."""
    client = connect(live_redis.url())
    health = RedisHealth(live_redis.url(), clock=fake_clock)  # no probe thread of its own
    shared = RedisCache(client, "resilient", codec="auto")
    cache = ResilientCache(shared, TTLCache(ttl=60), health)
    try:
        for call, key in ((lambda: cache.forget("k"), "k"), (cache.clear, "j")):
            shared.set(key, {"v": key})
            health.failed(ConnectionError("believed down by the test"))
            assert not health.up and not health.available()  # no request would try now
            call()
            assert health.up  # the call reached Redis, and said so
            assert shared.fetch(key) is None  # and did its work there
        health.failed(ConnectionError("believed down by the test"))
        assert cache.forget("k") is False and health.up  # not there: an answer all the same
    finally:
        health.close()
        client.close()


@pytest.mark.redis
def test_unavailable_masks_the_password_of_a_url_where_nothing_listens(
    apps: list[App],
) -> None:
    url = f"redis://user:{SECRET}@{HOST}:{free_port()}/0"
    app = App(NumberedBuilds(), REACHLIMIT_REDIS_URL=url)
    apps.append(app)
    assert app.health.up  # nothing tried yet: the explicit call is the first to fail
    with pytest.raises(Unavailable) as info:
        app.clear()
    assert info.value.where.startswith("redis://user:***@") and SECRET not in str(info.value)
    assert not app.health.up
    with pytest.raises(Unavailable):
        app.forget("k")
    with pytest.raises(TypeError):  # the key rule first: no call to Redis at all
        app.forget(2.5)


# -- RedisCache.forget on a Cluster -------------------------------------------------------


@pytest.mark.redis
def test_redis_cache_forget_on_a_cluster(redis_cluster: RedisCluster) -> None:
    redis_cluster.flush()
    client = connect(redis_cluster.url())
    try:
        cache = RedisCache(client, "forget", ttl=60, size=8, codec="auto")
        other = RedisCache(client, "forget", ttl=60, size=8, codec="auto")  # a process
        for n in range(4):
            cache.set(("k", n), {"n": n})
        assert other.get(("k", 1)) == {"n": 1}  # now in other's first level
        assert cache.forget(("k", 1)) is True
        assert cache.forget(("k", 1)) is False
        assert cache.fetch(("k", 1)) is None and other.fetch(("k", 1)) is None
        assert client.zscore(cache._index, key_digest(("k", 1))) is None
        assert client.zcard(cache._index) == 3
        assert other.forget(("k", 1)) is True  # its first level held it
        assert cache.fetch(("k", 2)) == {"n": 2}
    finally:
        client.close()
