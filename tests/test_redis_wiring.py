"""What an app on Redis is built of, read without a server (``reachlimit._flask_redis``): no
connection is opened while an app is set up, so every object of a budget's shared path can be
looked at here - which settings reached the shared limiter, its in-process fallback, the
shared cache and its fallback, the singleflight, the counters - and which of them a budget
shares with the app's other budgets (one client, one health per URL). ``release_worker`` is
run on stand-ins of the Redis calls it makes, to pin how it adds up every budget.

Some of these objects say their settings only in Redis (recorded at their first call); those
are read from the object's own attributes, named where they are read. The same wiring
against a real redis-server is ``tests/test_flask_redis.py`` and ``tests/test_redis_budgets.py``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

import reachlimit
import reachlimit.redis
from reachlimit import ColdLimiter, SingleFlight, TTLCache
from reachlimit._flask_redis import RedisLinks, release_worker, shared_path
from reachlimit._flask_settings import read_settings
from reachlimit.flask import ReachLimit
from reachlimit.prometheus import MeteredSharedLimiter, ReachMetrics
from reachlimit.redis import (
    RedisCache,
    RedisColdLimiter,
    RedisHealth,
    RedisSingleFlight,
    ResilientCache,
    ResilientFlight,
    ResilientLimiter,
)

pytestmark = pytest.mark.timeout(30)

#: Nothing listens there: nothing here may connect.
URL = "redis://u:wiring-secret@127.0.0.1:1/3"

#: Every option of a budget's shared path, none at its default.
OPTIONS: dict[str, Any] = dict(
    active=3, queue=5, wait=1.5, retry_after=4, lease=7.0, redis_fallback="refuse",
    deadline=False, cache_ttl=30.0, cache_size=9, stale=20.0,
)


@pytest.fixture
def app() -> Iterator[Flask]:
    app = Flask("wiring")
    rl = ReachLimit(redis_url=URL, redis_prefix="pfx", **OPTIONS)
    rl.budget("reports", active=1, queue=0)
    rl.init_app(app)
    yield app
    rl.close(app)


def figures(limiter: Any) -> tuple[Any, ...]:
    return (limiter.capacity_active, limiter.capacity_queue, limiter.wait, limiter.retry_after)


def test_the_shared_limiter_and_its_fallback_get_every_setting(app: Flask) -> None:
    state = app.extensions["reachlimit"]
    limiter = state.path.limiter
    assert isinstance(limiter, ResilientLimiter) and limiter.fallback == "refuse"
    remote, local = limiter.remote, limiter.local
    assert isinstance(remote, RedisColdLimiter) and type(local) is ColdLimiter
    assert figures(remote) == figures(local) == (3, 5, 1.5, 4)
    assert remote.name == "cold" and remote.lease == 7.0
    assert all(key.startswith("{pfx:cold}") for key in remote.keys)
    # deadline=False is said to Redis at the first call; the objects keep it until then
    assert remote._deadline is False and local._deadline_on is False


def test_the_shared_cache_and_flight_get_theirs(app: Flask) -> None:
    path = app.extensions["reachlimit"].path
    cache, flight = path.cache, path.flight
    assert isinstance(cache, ResilientCache) and isinstance(flight, ResilientFlight)
    shared, fallback = cache.remote, cache.local
    assert isinstance(shared, RedisCache) and type(fallback) is TTLCache
    assert (shared.name, shared.ttl, shared.size, shared.stale) == ("cold", 30.0, 9, 20.0)
    assert (fallback.maxsize, fallback.ttl, fallback.stale) == (9, 30.0, 20.0)
    assert repr(shared) == "<RedisCache {pfx:cold:cache} ttl=30.0 size=9 local_ttl=1.0 codec=auto>"
    assert isinstance(flight.remote, RedisSingleFlight) and type(flight.local) is SingleFlight
    assert repr(flight.remote) == "<RedisSingleFlight {pfx:cold} lease=7.0 outcome_ttl=5.0>"
    assert flight.remote._codec.name == "auto"  # (said in Redis only) bytes as bytes, JSON


def test_the_counters_are_the_budgets_and_closed_before_the_limiter(app: Flask) -> None:
    state = app.extensions["reachlimit"]
    reports = state.budgets.states["reports"]
    assert state.counters.key == "{pfx:cold}:path"
    assert reports.counters.key == "{pfx:reports}:path"
    assert state.closers == [
        state.path.close, state.counters.close, state.path.limiter.close,
        state.path.flight.close,
    ]  # the client and the health are the app's links', closed once by them


def test_every_budget_of_the_app_shares_one_client_and_one_health(app: Flask) -> None:
    budgets = app.extensions["reachlimit"].budgets
    default, reports = budgets.states["default"], budgets.states["reports"]
    assert isinstance(default.redis, RedisHealth) and default.redis is reports.redis
    assert default.path.limiter.remote._client is reports.path.limiter.remote._client
    assert default.redis.where == "redis://u:***@127.0.0.1:1/3"
    assert default.redis._probe is not None  # it probes a Redis that went down on the client
    assert reports.path.limiter.remote.name == "reports"
    assert figures(reports.path.limiter.local)[:2] == (1, 0)
    assert default.metrics is None  # metrics off: the view says so
    with app.test_request_context():
        assert default.budgets.owner.metrics_view().status_code == 404


def test_links_make_one_client_and_health_per_url() -> None:
    links = RedisLinks()
    try:
        first = links.get(URL)
        assert links.get(URL) is first
        other = links.get("redis://127.0.0.1:2/0")
        assert other[0] is not first[0] and other[1] is not first[1]
        assert first[1].where == "redis://u:***@127.0.0.1:1/3"
    finally:
        links.close()


def test_a_path_without_the_apps_links_closes_its_own_client_last() -> None:
    settings = read_settings({}, {"redis_url": URL})
    shared = shared_path(settings, None)
    client = shared.path.limiter.remote._client
    assert shared.closers == [
        shared.counters.close, shared.path.limiter.close, shared.path.flight.close,
        shared.health.close, client.close,
    ]
    assert shared.metrics is None
    for close in shared.closers:
        close()


def test_a_metered_path_on_redis_counts_the_shared_limiters_admissions() -> None:
    settings = read_settings({}, {"redis_url": URL, "wait": 2.5, "metrics": True})
    links = RedisLinks()
    try:
        shared = shared_path(settings, ReachMetrics, links=links)
        metrics = shared.metrics
        assert isinstance(metrics, ReachMetrics) and shared.path is metrics.path
        assert metrics.shared and metrics.wait == 2.5  # a bucket of the wait histogram
        assert isinstance(metrics.limiter, MeteredSharedLimiter)
        assert isinstance(metrics.limiter.inner, ResilientLimiter)
        assert isinstance(metrics.path.cache, ResilientCache)
        assert isinstance(metrics.path.flight, ResilientFlight)
        for close in shared.closers:
            close()
    finally:
        links.close()


def test_with_metrics_each_budget_on_redis_is_metered_under_its_own_name() -> None:
    app = Flask("wiring-metrics")
    rl = ReachLimit(redis_url=URL, metrics=True)
    rl.budget("reports", active=1)
    rl.init_app(app)
    try:
        states = app.extensions["reachlimit"].budgets.states
        assert set(states) == {"default", "reports"}
        for name, state in states.items():
            assert state.name == name
            assert isinstance(state.metrics, ReachMetrics) and state.metrics.budget == name
            assert state.metrics.path is state.path and state.metrics.shared
            assert isinstance(state.metrics.limiter.inner, ResilientLimiter)
    finally:
        rl.close(app)


def test_redis_without_redis_py_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reachlimit.redis", None)  # the import fails
    monkeypatch.delattr(reachlimit, "redis")  # (imported already by this process)
    with pytest.raises(ValueError) as info:
        ReachLimit(Flask("no-redis-py"), redis_url=URL)
    assert str(info.value).startswith(
        "REACHLIMIT_REDIS_URL needs redis-py: pip install 'reachlimit[redis]' ("
    )


# -- release_worker ---------------------------------------------------------------------------


class Released:
    """Stand-ins of the Redis calls release_worker makes: the client ``connect`` gives (its
    registry of limiter names), ``release_owner`` (each call recorded, answering
    ``(slots, places)`` by name) and ``release_claims`` (each call recorded, answering
    ``claims``)."""

    def __init__(
        self, listed: set[Any], freed: dict[str, tuple[int, int]], claims: int = 0
    ) -> None:
        self.listed = listed
        self.freed = freed
        self.claims = claims
        self.calls: list[dict[str, Any]] = []
        self.claim_calls: list[dict[str, Any]] = []
        self.closed = False
        self.url: str | None = None

    def connect(self, url: str) -> Any:
        self.url = url
        return self

    def smembers(self, key: str) -> set[Any]:
        assert key == reachlimit.redis.registry_key("pfx"), key
        return self.listed

    def close(self) -> None:
        self.closed = True

    def release_owner(self, client: Any, owner: str, **options: Any) -> tuple[int, int]:
        assert client is self
        self.calls.append({"owner": owner, **options})
        return self.freed.get(options["name"], (0, 0))

    def release_claims(self, client: Any, owner: str, **options: Any) -> int:
        assert client is self and not self.closed
        self.claim_calls.append({"owner": owner, **options})
        return self.claims

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("connect", "release_owner", "release_claims"):
            monkeypatch.setattr(reachlimit.redis, name, getattr(self, name))


def test_release_worker_frees_every_budget_and_adds_up(monkeypatch: pytest.MonkeyPatch) -> None:
    released = Released(
        listed={b"reports", "exports", b"cold"},
        freed={"cold": (1, 2), "reports": (2, 3), "exports": (0, 1), "configured": (4, 0)},
    )
    released.patch(monkeypatch)
    config = {
        "REACHLIMIT_REDIS_URL": URL, "REACHLIMIT_REDIS_PREFIX": "pfx",
        "REACHLIMIT_ACTIVE": "3", "REACHLIMIT_LEASE": "7",
        "REACHLIMIT_BUDGETS": '{"configured": {"active": 1}}',
    }
    assert release_worker(config, 4242) == (1 + 2 + 0 + 4, 2 + 3 + 1 + 0)
    assert released.url == URL and released.closed
    assert [c["name"] for c in released.calls] == ["cold", "configured", "exports", "reports"]
    owner = reachlimit.redis.owner_prefix(4242)
    for call in released.calls:
        assert call == {"owner": owner, "name": call["name"], "prefix": "pfx", "active": 3,
                        "lease": 7.0}
    assert released.claim_calls == [{"owner": owner, "prefix": "pfx"}]  # once, every budget


def test_release_worker_without_a_redis_url_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    released = Released(set(), {})
    monkeypatch.setattr(reachlimit.redis, "connect", released.connect)
    assert release_worker({}, 4242) is None and released.url is None


def test_the_health_of_an_app_whose_redis_cannot_be_reached(app: Flask) -> None:
    """Nothing listens at the URL: the figures are this process's fallback's, and the health
    says where Redis is (masked) and that it is down."""
    app.add_url_rule("/health", view_func=app.extensions["reachlimit"].budgets.owner.health_view)
    body = app.test_client().get("/health").get_json()
    assert body["reach"]["degraded"] is True and body["budgets"]["reports"]["degraded"] is True
    redis = body["redis"]
    assert redis["url"] == "redis://u:***@127.0.0.1:1/3" and redis["up"] is False
    assert "wiring-secret" not in str(body)


def test_a_refusal_because_redis_is_down_is_a_503_whatever_the_status_setting(
    app: Flask,
) -> None:
    """redis_fallback="refuse" (OPTIONS): while Redis cannot be reached, cold() refuses with
    "unavailable", the service's failure and not the client's: 503, never the 429 of a full
    budget."""
    rl = app.extensions["reachlimit"].budgets.owner
    assert app.extensions["reachlimit"].settings.status == 429
    app.add_url_rule("/r", "r", lambda: rl.cold("k", lambda: {"never": "built"}))
    reply = app.test_client().get("/r")
    assert reply.status_code == 503, reply.get_data()
    assert reply.headers["Retry-After"] == "4" and reply.get_json()["retryAfter"] == 4


def test_release_worker_logs_the_claims_it_dropped_and_only_then(
    monkeypatch: pytest.MonkeyPatch, reachlimit_log: pytest.LogCaptureFixture
) -> None:
    config = {"REACHLIMIT_REDIS_URL": URL, "REACHLIMIT_REDIS_PREFIX": "pfx"}
    Released(set(), {}, claims=0).patch(monkeypatch)
    assert release_worker(config, 4242) == (0, 0)
    assert reachlimit_log.records == []
    released = Released({b"reports"}, {"reports": (1, 0)}, claims=2)
    released.patch(monkeypatch)
    assert release_worker(config, 4242) == (1, 0) and released.closed
    assert [(r.name, r.levelno, r.getMessage()) for r in reachlimit_log.records] == [
        ("reachlimit", logging.INFO,
         "reachlimit: dropped 2 singleflight claim(s) of worker 4242: their followers take "
         "them over"),
    ]
