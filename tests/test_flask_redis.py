"""The Flask extension on a shared Redis limiter (REACHLIMIT_REDIS_URL), against a real
redis-server: settings, two apps (two processes' worth of state) on one budget, the 503 of
the "refuse" fallback, the password never shown, and a client that leaves while queued in
Redis giving its place back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Any

import pytest
from flask import Flask

from reachlimit import ColdLimiter, Grant
from reachlimit.flask import ReachLimit, Settings
from reachlimit.redis import RedisColdLimiter, ResilientLimiter
from tests.apps.slow_app import create_app
from tests.support import clients
from tests.support.clients import close_one_by_one
from tests.support.limiter import LIMITER_FIELDS
from tests.support.processes import free_port
from tests.support.redis_server import RedisServer
from tests.support.refreshes import threads_named
from tests.support.waiting import DEADLINE, wait_until
from tests.support.werkzeug_server import werkzeug_serving

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

SECRET = "pa55-w0rd-never-shown"


@pytest.fixture
def url(live_redis: RedisServer) -> str:
    return live_redis.url()


def make_app(apps: list[Flask], **config: Any) -> Flask:
    app = create_app(**config)
    apps.append(app)
    return app


def shared(app: Flask) -> ResilientLimiter:
    limiter = app.extensions["reachlimit"].path.limiter
    assert isinstance(limiter, ResilientLimiter)
    return limiter


def key() -> str:
    return uuid.uuid4().hex[:12]


# -- settings --------------------------------------------------------------------------------


def test_redis_settings_defaults_and_strings() -> None:
    app = Flask("defaults")
    ReachLimit(app)
    s: Settings = app.extensions["reachlimit"].settings
    assert (s.redis_url, s.redis_prefix, s.lease, s.redis_fallback) == (
        None, "reachlimit", 10.0, "local"
    )
    assert isinstance(app.extensions["reachlimit"].path.limiter, ColdLimiter)
    app = Flask("empty-url")
    app.config.update(REACHLIMIT_REDIS_URL="  ", REACHLIMIT_LEASE="4.5",
                      REACHLIMIT_REDIS_FALLBACK="Refuse", REACHLIMIT_REDIS_PREFIX="svc")
    ReachLimit(app)
    s = app.extensions["reachlimit"].settings
    assert (s.redis_url, s.lease, s.redis_fallback, s.redis_prefix) == (None, 4.5, "refuse", "svc")
    assert isinstance(app.extensions["reachlimit"].path.limiter, ColdLimiter)


def test_metrics_on_redis_read_the_services_gauges(url: str, apps: list[Flask]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from reachlimit.prometheus import MeteredSharedLimiter

    one = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_METRICS="true")
    two = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_METRICS="true")
    limiter = one.extensions["reachlimit"].path.limiter
    assert isinstance(limiter, MeteredSharedLimiter)
    assert isinstance(limiter.inner, ResilientLimiter)
    held = limiter.acquire()  # a build slot taken in "worker" one
    try:
        for app in (one, two):  # ... is seen by a scrape of either worker
            text = app.test_client().get("/metrics").get_data(as_text=True)
            samples = {s.name: s.value for f in text_string_to_metric_families(text)
                       for s in f.samples if s.labels == {"budget": "default"}}
            assert samples["reachlimit_builds_active"] == 1
            assert samples["reachlimit_capacity_active"] == 2
            assert samples["reachlimit_backend_degraded"] == 0
            assert samples["reachlimit_lease_lost_total"] == 0
    finally:
        held.release()


def test_the_shared_limiter_is_wired_from_the_settings(url: str, apps: list[Flask]) -> None:
    app = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_ACTIVE="3", REACHLIMIT_QUEUE="5",
                   REACHLIMIT_WAIT="2.5", REACHLIMIT_LEASE="7", REACHLIMIT_REDIS_PREFIX="svc",
                   REACHLIMIT_REDIS_FALLBACK="refuse")
    limiter = shared(app)
    assert isinstance(limiter.remote, RedisColdLimiter) and isinstance(limiter.local, ColdLimiter)
    assert limiter.fallback == "refuse" and limiter.remote.lease == 7.0
    assert limiter.remote.keys[0].startswith("{svc:cold}:")
    figures = (limiter.capacity_active, limiter.capacity_queue, limiter.wait)
    assert figures == (3, 5, 2.5)
    assert (limiter.local.capacity_active, limiter.local.capacity_queue) == (3, 5)


# -- one budget for two apps -----------------------------------------------------------------


def test_two_apps_on_one_redis_share_one_budget_and_report_the_same_figures(
    url: str, apps: list[Flask]
) -> None:
    a = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_ACTIVE="1", REACHLIMIT_QUEUE="0")
    b = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_ACTIVE="1", REACHLIMIT_QUEUE="0")
    ca, cb = a.test_client(), b.test_client()
    assert ca.get("/report/one").status_code == 200  # a build through app a
    held: Grant = shared(a).acquire()  # app a's process holds the only slot
    try:
        reply = cb.get(f"/report/{key()}")  # app b is refused: the budget is shared
        assert reply.status_code == 429
        ha = ca.get("/health").get_json()["default"]
        hb = cb.get("/health").get_json()["default"]
        for name in sorted(LIMITER_FIELDS | {"backend", "degraded", "lease_lost"}):
            assert ha[name] == hb[name], name
        assert (ha["backend"], ha["degraded"], ha["active"]) == ("redis", False, 1)
        assert (ha["acquired"], ha["rejected_full"]) == (2, 1)
        # The path's counters too are the service's: each app counts its own and both
        # flush to Redis, and the health answer flushes the answering app's first, so after
        # b's answer (which flushed b) a's answer (which flushes a) has everything.
        ha = ca.get("/health").get_json()["default"]
        assert (ha["builds"], ha["misses"], ha["hits"]) == (1, 2, 0)
        assert a.extensions["reachlimit"].path.stats().builds == 1  # per app, underneath
        assert b.extensions["reachlimit"].path.stats().builds == 0
        a.extensions["reachlimit"].counters.flush()
        hb = cb.get("/health").get_json()["default"]
        assert {k: hb[k] for k in ("builds", "misses", "hits")} == {
            k: ha[k] for k in ("builds", "misses", "hits")
        }
    finally:
        held.release()
    assert cb.get("/health").get_json()["redis"]["up"] is True


# -- Redis unavailable -------------------------------------------------------------------------


def test_refuse_mode_answers_503_json_with_retry_after(apps: list[Flask]) -> None:
    app = make_app(apps, REACHLIMIT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                   REACHLIMIT_REDIS_FALLBACK="refuse")
    client = app.test_client()
    for _ in range(2):
        reply = client.get(f"/report/{key()}")
        assert reply.status_code == 503
        assert reply.headers["Retry-After"] == "2"
        assert reply.mimetype == "application/json"
        assert "no-store" in reply.headers["Cache-Control"]
        body = reply.get_json()
        assert set(body) == {"error", "retryAfter"} and body["retryAfter"] == 2
        assert "unavailable" in body["error"]
    assert app.extensions["slow_app"].figures()["total"] == 0
    health = client.get("/health").get_json()
    assert (health["default"]["backend"], health["default"]["degraded"]) == ("local", True)
    assert health["redis"]["up"] is False


def test_local_mode_keeps_serving_while_redis_is_down(apps: list[Flask]) -> None:
    app = make_app(apps, REACHLIMIT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    client = app.test_client()
    assert client.get("/report/a").status_code == 200
    assert client.get("/report/a").status_code == 200  # warm
    reach = client.get("/health").get_json()["default"]
    assert (reach["backend"], reach["degraded"], reach["acquired"], reach["hits"]) == (
        "local", True, 1, 1
    )


def test_the_password_is_never_shown(apps: list[Flask], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis://user:{SECRET}@127.0.0.1:{free_port()}/0"
    app = make_app(apps, REACHLIMIT_REDIS_URL=url)
    client = app.test_client()
    assert client.get("/report/a").status_code == 200
    health = client.get("/health")
    assert SECRET not in health.get_data(as_text=True)
    assert health.get_json()["redis"]["url"].startswith("redis://user:***@127.0.0.1:")
    state = app.extensions["reachlimit"]
    shown = [repr(state.settings), repr(state.path.limiter), repr(state.redis),
             repr(shared(app).remote._client), str(state.settings)]
    for text in shown:
        assert SECRET not in text, text
    assert state.settings.redis_url == url  # kept, only never shown
    assert SECRET not in caplog.text
    assert "user:***@" in caplog.text  # the outage was logged, masked
    for bad in (f"http://user:{SECRET}@h/0", f"redis://user:{SECRET}@h:port/0"):
        bad_app = Flask("bad")
        bad_app.config["REACHLIMIT_REDIS_URL"] = bad
        with pytest.raises(ValueError) as info:
            ReachLimit(bad_app)
        assert SECRET not in str(info.value) and "***" in str(info.value)


# -- a client that leaves while queued in Redis ------------------------------------------------


def test_clients_that_leave_while_queued_in_redis_free_their_places(
    url: str, apps: list[Flask]
) -> None:
    app = make_app(apps, REACHLIMIT_REDIS_URL=url, REACHLIMIT_WAIT="30", REACHLIMIT_QUEUE="3")
    limiter = shared(app)
    remote = limiter.remote
    held = [limiter.acquire() for _ in range(limiter.capacity_active)]
    sockets = []
    try:
        with werkzeug_serving(app, join_timeout=10) as server:
            paths = [f"/report/{key()}" for _ in range(3)]
            for n, path in enumerate(paths, start=1):
                sockets.append(clients.raw_client(server.port, path, timeout=DEADLINE))
                wait_until(f"{n} queued in Redis", lambda n=n: remote.stats().queued == n)
            before = remote.stats()

            def place_back(n: int) -> bool:
                s = remote.stats()
                return s.cancelled - before.cancelled == n and s.queued == before.queued - n

            delays = close_one_by_one(sockets, place_back)
            print("\nclient close -> Redis queue place back: "
                  + ", ".join(f"{d * 1000:.1f} ms" for d in delays)
                  + f" (poll slice {remote.CANCEL_POLL_INTERVAL * 1000:.0f} ms)")
            after = remote.stats()
            assert (after.queued, after.rejected_timeout) == (0, before.rejected_timeout)
            assert app.extensions["slow_app"].figures()["total"] == 0
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for grant in held:
            grant.release()
    assert remote.stats().active == 0


def test_webapp_on_redis_shares_everything_and_keeps_its_metrics(
    url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp import create_app as create_webapp

    monkeypatch.setenv("REACHLIMIT_REDIS_URL", url)
    monkeypatch.setenv("REACHLIMIT_REDIS_PREFIX", "webapp-test")
    app = create_webapp({"REACH_DEMO_STALE_AFTER": None})
    state = app.extensions["reachlimit"]
    assert state.settings.metrics is True and state.settings.redis_prefix == "webapp-test"
    limiter = state.path.limiter.inner
    assert isinstance(limiter, ResilientLimiter)
    client = app.test_client()
    health = client.get("/api/health").get_json()
    assert health["default"]["backend"] == "redis"
    assert json.dumps(health)
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'reachlimit_backend_degraded{budget="default"} 0.0' in metrics
    ReachLimit().close(app)


def test_close_stops_every_thread_an_app_on_redis_started(url: str, apps: list[Flask]) -> None:
    app = make_app(apps, REACHLIMIT_REDIS_URL=url)
    client = app.test_client()
    renewers = ("reachlimit-lease-renewer", "reachlimit-flight-renewer")
    before = {name: threads_named(name) for name in renewers}
    assert client.get(f"/report/{key()}").status_code == 200  # a build: claims, a slot
    state = app.extensions["reachlimit"]
    started = {  # the app's renewers: started by that build (its slot, its flight's claim)
        name: [t for t in threads_named(name) if t not in before[name]] for name in renewers
    }
    assert all(len(made) == 1 for made in started.values()), started
    threads = {
        "counters": state.counters._thread,
        "limiter renewer": started["reachlimit-lease-renewer"][0],
        "flight renewer": started["reachlimit-flight-renewer"][0],
    }
    assert all(t is not None and t.is_alive() for t in threads.values()), threads
    ReachLimit().close(app)
    assert [name for name, t in threads.items() if t is not None and t.is_alive()] == []
    ReachLimit().close(app)  # a second close does nothing
    with app.app_context():
        ReachLimit().close()  # the current app, which is closed already
    with pytest.raises(RuntimeError, match="not initialised"):
        ReachLimit().close(Flask("never-initialised"))
