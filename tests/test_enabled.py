"""REACHLIMIT_ENABLED (``ReachLimit(enabled=...)``, also per budget): off, every ``cold()`` and
decorated view runs its build directly in the request - no cache, no singleflight, no
limits, no Redis, no ``Cache-Status``, no counters thread - while the key, client and value
rules still hold, so an app's tests still catch what breaks them.

design:

    In process: two calls of one key build twice; two calls at once of one key on a budget
    of one slot and no queue both build at once (each build waits at a Barrier of two: with
    a singleflight or a limiter the second would follow or be refused, and the barrier
    break). With REACHLIMIT_REDIS_URL at a loopback port the test listens on and never
    accepts: no connection reaches it (the kernel queues any connect in the listen backlog,
    which select() sees), while an enabled app on the same URL does connect (the control).
    In a subprocess, an app whose every budget is off (the default, one of
    REACHLIMIT_BUDGETS, one declared in code) never imports redis-py; a budget declared
    enabled afterwards does (the control). A disabled budget beside an enabled one on a
    real Redis: each behaves as its own setting says, and the health view says which is
    which.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, Response, jsonify

from reachlimit.flask import ReachLimit
from tests.support import HOST, ROOT
from tests.support.flask_ext import NumberedBuilds
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner

pytestmark = pytest.mark.timeout(60)

DEADLINE = 10.0


def make_app(builds: NumberedBuilds, rl: ReachLimit | None = None, **config: Any) -> Flask:
    """An app with ``/cold/<key>`` (``rl.cold``), ``/view/<key>`` (``@rl.cached()``),
    ``/reports/<key>`` (budget "reports", declared before ``init_app``) and ``/health``."""
    app = Flask(f"enabled-{uuid.uuid4().hex[:6]}")
    app.config.update(config)
    rl = rl or ReachLimit()
    reports = rl.budget("reports")
    rl.init_app(app)

    @app.get("/cold/<key>")
    def cold(key: str) -> Any:
        return jsonify(rl.cold(key, lambda: builds.build(key)))

    @app.get("/view/<key>")
    @rl.cached()
    def view(key: str) -> Any:
        return builds.build(key)

    @app.get("/reports/<key>")
    def report(key: str) -> Any:
        return jsonify(reports.cold(key, lambda: builds.build("reports:" + key)))

    app.add_url_rule("/health", "health", rl.health_view)
    return app


def no_counters_thread() -> bool:
    return not any(t.name == "reachlimit-counters" for t in threading.enumerate())


# -- in process -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["config", "string", "argument"])
def test_off_every_build_runs_in_the_request_and_nothing_is_cached(how: str) -> None:
    builds = NumberedBuilds()
    if how == "argument":
        app = make_app(builds, ReachLimit(enabled=False))
    else:
        app = make_app(builds, REACHLIMIT_ENABLED=False if how == "config" else " Off ")
    http = app.test_client()
    for path in ("/cold/a", "/cold/a", "/view/v", "/view/v", "/reports/r", "/reports/r"):
        reply = http.get(path)
        assert reply.status_code == 200
        assert "Cache-Status" not in reply.headers, path
    assert builds.keys == ["a", "a", "v", "v", "reports:r", "reports:r"]
    health = http.get("/health").get_json()
    for name in ("default", "reports"):
        figures = health["budgets"][name]
        assert figures["enabled"] is False
        assert (figures["hits"], figures["misses"], figures["builds"], figures["acquired"]) == (
            0, 0, 0, 0
        )
    assert health["reach"] == health["budgets"]["default"] and "redis" not in health


def test_on_by_default_the_same_app_caches() -> None:
    """The control of the test above: the same app with the default setting."""
    builds = NumberedBuilds()
    app = make_app(builds)
    http = app.test_client()
    for path in ("/cold/a", "/cold/a", "/view/v", "/view/v"):
        assert http.get(path).status_code == 200
    assert builds.keys == ["a", "v"]
    assert http.get("/cold/a").headers["Cache-Status"].startswith("reachlimit; hit")
    assert http.get("/health").get_json()["budgets"]["default"]["enabled"] is True


@pytest.mark.parametrize("enabled", [False, True])
def test_off_there_is_no_singleflight_and_no_limit(threads: ThreadRunner, enabled: bool) -> None:
    """One slot, no queue: two requests of one key at once both build at once when off.
    On (the control), the second follows the first, which waits at the barrier alone."""
    both = threading.Barrier(2, timeout=DEADLINE if not enabled else 1.0)
    app = Flask("no-singleflight")
    rl = ReachLimit(app, enabled=enabled, active=1, queue=0)

    @app.get("/k")
    def k() -> Any:
        def build() -> str:
            both.wait()
            return "built"

        return rl.cold("k", build)

    statuses: list[int] = []

    def ask() -> None:
        statuses.append(app.test_client().get("/k").status_code)

    for n in range(2):
        threads.start(ask, name=f"ask-{n}")
    threads.join_all(timeout=DEADLINE + 5)
    if enabled:
        assert both.broken and sorted(statuses) == [500, 500]
    else:
        assert statuses == [200, 200] and not both.broken


def test_off_the_value_key_and_client_rules_still_hold() -> None:
    """What an app's tests run with REACHLIMIT_ENABLED false still catches: a Response
    returned from cold() (the value rule), a float key, a client callable's UUID."""
    app = Flask("rules")
    rl = ReachLimit(app, enabled=False)
    with app.test_request_context("/"):
        assert rl.cold("t", lambda: (1, "two")) == [1, "two"]  # as Redis would give it back
        with pytest.raises(TypeError, match=r"key 'r'.*Response.*bytes, str or JSON-able"):
            rl.cold("r", lambda: Response("no"))
        with pytest.raises(TypeError, match=r"cold\(\) was given a float as the cache key"):
            rl.cold(1.5, lambda: "never")
    other = Flask("client-rule")
    rl = ReachLimit(other, enabled=False, client=lambda request: uuid.uuid4())
    built: list[str] = []
    with other.test_request_context("/"):
        with pytest.raises(TypeError, match=r"ReachLimit client: .* returned a UUID"):
            rl.cold("k", lambda: built.append("k"))
    assert built == []


def test_off_a_decorated_view_answers_every_return_form_as_it_is() -> None:
    app = Flask("forms")
    rl = ReachLimit(app, enabled=False)
    calls: list[str] = []

    @app.get("/created")
    @rl.cached
    def created() -> Any:
        calls.append("created")
        return {"made": len(calls)}, 201, {"X-Mine": "1", "Set-Cookie": "s=1"}

    http = app.test_client()
    for n in (1, 2):
        reply = http.get("/created")
        assert (reply.status_code, reply.get_json()) == (201, {"made": n})
        assert reply.headers["X-Mine"] == "1" and reply.headers["Set-Cookie"] == "s=1"
        assert "Cache-Status" not in reply.headers


def test_a_bad_enabled_value_is_a_value_error_naming_the_key() -> None:
    app = Flask("bad-enabled")
    app.config["REACHLIMIT_ENABLED"] = "maybe"
    with pytest.raises(ValueError, match=r"^REACHLIMIT_ENABLED must be true or false"):
        ReachLimit(app)
    with pytest.raises(ValueError, match=r"REACHLIMIT_BUDGETS\['x'\]\['enabled'\] must be"):
        ReachLimit(_config(REACHLIMIT_BUDGETS={"x": {"enabled": "maybe"}}))
    with pytest.raises(ValueError, match=r"enabled \(rl.budget\('x'\) argument\) must be"):
        ReachLimit().budget("x", enabled="maybe")


def _config(**config: Any) -> Flask:
    app = Flask("configured")
    app.config.update(config)
    return app


def test_the_readme_fixture_turns_reachlimit_off_for_an_apps_tests() -> None:
    """The pattern the README's testing section shows: an app factory given
    REACHLIMIT_ENABLED=False by the test's fixture."""

    def create_app(config: dict[str, Any]) -> Flask:
        app = Flask("myapp")
        app.config.update(config)
        rl = ReachLimit(app)

        @app.get("/report/<key>")
        def report(key: str) -> Any:
            return rl.cold(key, lambda: {"key": key})

        return app

    app = create_app({"TESTING": True, "REACHLIMIT_ENABLED": False})
    reply = app.test_client().get("/report/a")
    assert reply.get_json() == {"key": "a"} and "Cache-Status" not in reply.headers


# -- Redis: no connection, no redis-py -------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[socket.socket]:
    """A loopback port that listens and never accepts: any connection attempt to it waits
    in its backlog, where :func:`attempted` sees it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen(16)
    try:
        yield listener
    finally:
        listener.close()


def attempted(listener: socket.socket) -> bool:
    """Whether a connection to ``listener`` is waiting to be accepted."""
    readable, _, _ = select.select([listener], [], [], 0)
    return bool(readable)


def test_off_an_app_on_redis_never_connects(
    silent_port: socket.socket, apps: list[Flask]
) -> None:
    url = f"redis://{HOST}:{silent_port.getsockname()[1]}/0"
    builds = NumberedBuilds()
    app = make_app(builds, REACHLIMIT_REDIS_URL=url, REACHLIMIT_ENABLED="false",
                   REACHLIMIT_BUDGETS={"exports": {"active": 1}})
    apps.append(app)
    http = app.test_client()
    for path in ("/cold/a", "/cold/a", "/view/v", "/reports/r"):
        reply = http.get(path)
        assert reply.status_code == 200 and "Cache-Status" not in reply.headers
    assert builds.keys == ["a", "a", "v", "reports:r"]
    health = http.get("/health").get_json()
    assert "redis" not in health
    assert {name: f["backend"] for name, f in health["budgets"].items()} == {
        "default": "local", "reports": "local", "exports": "local"
    }
    assert not any(f["degraded"] or f["enabled"] for f in health["budgets"].values())
    assert app.extensions["reachlimit"].redis is None
    assert no_counters_thread()
    assert not attempted(silent_port), "a disabled app connected to its Redis URL"

    # The control: the same URL, enabled, is tried (and answered from the fallback).
    on = make_app(NumberedBuilds(), REACHLIMIT_REDIS_URL=url)
    apps.append(on)
    assert on.test_client().get("/cold/a").status_code == 200
    assert attempted(silent_port)


def test_an_app_whose_every_budget_is_off_never_imports_redis_py(
    silent_port: socket.socket,
) -> None:
    url = f"redis://{HOST}:{silent_port.getsockname()[1]}/0"
    code = textwrap.dedent(f"""
        import json, sys
        from flask import Flask
        from reachlimit.flask import ReachLimit

        app = Flask("off")
        app.config.update(REACHLIMIT_REDIS_URL={url!r}, REACHLIMIT_ENABLED="false",
                          REACHLIMIT_BUDGETS={{"exports": {{"active": 1}}}})
        rl = ReachLimit()
        reports = rl.budget("reports")
        rl.init_app(app)
        with app.test_request_context("/"):
            values = [rl.cold("a", lambda: 1), reports.cold("b", lambda: 2),
                      rl.budget("exports").cold("c", lambda: 3)]
            rl.clear_cache()
            forgot = rl.forget("a")
            stats = rl.stats().as_dict()
        off = "redis" in sys.modules or "reachlimit.redis" in sys.modules
        late = rl.budget("late", enabled=True)
        with app.test_request_context("/"):
            late.settings()  # built now, on Redis: no connection made yet
        print(json.dumps({{"values": values, "forgot": forgot, "builds": stats["builds"],
                          "imported_off": off, "imported_on": "redis" in sys.modules}}))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"values": [1, 2, 3], "forgot": False, "builds": 0,
                      "imported_off": False, "imported_on": True}
    assert not attempted(silent_port)


# -- a disabled budget beside an enabled one, on a real Redis -----------------------------


@pytest.mark.redis
@pytest.mark.parametrize("where", ["declared", "config"])
def test_a_disabled_budget_beside_an_enabled_one(
    live_redis: RedisServer, apps: list[Flask], where: str
) -> None:
    builds = NumberedBuilds()
    rl = ReachLimit()
    if where == "declared":
        rl.budget("reports", enabled=False)
        app = make_app(builds, rl, REACHLIMIT_REDIS_URL=live_redis.url())
    else:
        app = make_app(builds, rl, REACHLIMIT_REDIS_URL=live_redis.url(),
                       REACHLIMIT_BUDGETS={"reports": {"enabled": "false"}})
    apps.append(app)
    http = app.test_client()
    assert [http.get("/reports/r").status_code for _ in range(2)] == [200, 200]
    assert "Cache-Status" not in http.get("/reports/r").headers
    assert [http.get("/cold/a").status_code for _ in range(2)] == [200, 200]
    assert http.get("/cold/a").headers["Cache-Status"].startswith("reachlimit; hit")
    assert builds.keys == ["reports:r"] * 3 + ["a"]
    health = http.get("/health").get_json()
    assert health["budgets"]["reports"]["enabled"] is False
    assert health["budgets"]["reports"]["backend"] == "local"
    assert health["budgets"]["reports"]["builds"] == 0
    assert health["budgets"]["default"]["enabled"] is True
    assert health["budgets"]["default"]["backend"] == "redis"
    assert health["redis"]["up"] is True
    assert app.extensions["reachlimit"].budgets.states["reports"].redis is None


@pytest.mark.redis
def test_the_default_off_and_a_budget_on_redis(live_redis: RedisServer, apps: list[Flask]) -> None:
    """REACHLIMIT_ENABLED false with one budget turned back on: that budget is on Redis
    (and the health view shows Redis, from it), the rest run their builds directly."""
    builds = NumberedBuilds()
    rl = ReachLimit()
    rl.budget("reports", enabled=True)
    app = make_app(builds, rl, REACHLIMIT_REDIS_URL=live_redis.url(), REACHLIMIT_ENABLED="0")
    apps.append(app)
    http = app.test_client()
    for _ in range(2):
        assert http.get("/reports/r").status_code == 200
        assert http.get("/cold/a").status_code == 200
    assert builds.keys == ["reports:r", "a", "a"]
    health = http.get("/health").get_json()
    assert health["budgets"]["reports"]["backend"] == "redis"
    assert health["budgets"]["reports"]["hits"] == 1
    assert health["reach"]["enabled"] is False and health["redis"]["up"] is True
