"""Stale answers through the Flask extension: REACHLIMIT_STALE, the Cache-Status header of
every answer of a view that called ``rl.cold()``, refreshes run in the app's context, and
``rl.close()`` stopping the refresher.

The app's warm cache is swapped for one on an injected clock (``path.cache`` is public), so
an entry is made stale by moving the clock, never by sleeping; a refresh is waited for by the
refresher's own state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, current_app

from reachlimit import TTLCache
from reachlimit.flask import ReachLimit
from tests.support.clock import FakeClock
from tests.support.flask_ext import ExtensionReads
from tests.support.refreshes import refreshing, threads_of
from tests.support.threads import JOIN_TIMEOUT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class App(ExtensionReads):
    """``/r/<key>`` answers ``{"key", "n"}`` through ``rl.cold`` (a build needing the app
    context: it reads ``current_app.name``); ``/plain`` never calls it."""

    def __init__(self, clock: FakeClock, **config: Any) -> None:
        self.app = app = Flask("stale")
        app.config.update({"REACHLIMIT_CACHE_TTL": 10, "REACHLIMIT_STALE": 30, **config})
        self.rl = rl = ReachLimit(app)
        self.runs = 0
        self.gate: threading.Event | None = None
        self.fail: BaseException | None = None
        lock = threading.Lock()

        def build(key: str) -> Any:
            with lock:
                self.runs += 1
                n = self.runs
            if self.gate is not None:
                assert self.gate.wait(JOIN_TIMEOUT)
            if self.fail is not None:
                raise self.fail
            return {"key": key, "n": n, "app": current_app.name}

        @app.get("/r/<key>")
        def report(key: str) -> Any:
            return rl.cold(key, lambda: build(key))

        @app.get("/plain")
        def plain() -> Any:
            return {"ok": True}

        stale = self.path.cache.stale  # type: ignore[attr-defined]
        self.path.cache = TTLCache(64, 10.0, stale=stale, clock=clock)
        self.path.clock = clock  # the refreshes' backoff, on the same clock

    def get(self, url: str) -> Any:
        return self.app.test_client().get(url)

    def settle(self, key: str) -> None:
        wait_until(f"the refresh of {key}", lambda: not refreshing(self.path.refresher, key))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(5000.0)


@pytest.fixture
def made(clock: FakeClock) -> Iterator[list[App]]:
    apps: list[App] = []
    yield apps
    for a in apps:
        refresher = a.path.refresher
        a.rl.close(a.app)
        assert not threads_of(refresher)  # rl.close() joined the refreshers


def make(made: list[App], clock: FakeClock, **config: Any) -> App:
    made.append(App(clock, **config))
    return made[-1]


def test_cache_status_says_stored_then_hit_with_the_freshness_left(
    made: list[App], clock: FakeClock
) -> None:
    a = make(made, clock)
    first = a.get("/r/x")
    assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    clock.now += 3.4
    second = a.get("/r/x")
    assert second.get_json()["n"] == 1
    assert second.headers["Cache-Status"] == "reachlimit; hit; ttl=6"
    assert "Cache-Status" not in a.get("/plain").headers  # only views that called cold()


def test_a_stale_answer_is_served_at_once_with_a_negative_ttl_then_fresh_again(
    made: list[App], clock: FakeClock
) -> None:
    a = make(made, clock)
    a.get("/r/x")
    clock.now += 12.5  # 2.5 s past the TTL
    a.gate = threading.Event()
    stale = a.get("/r/x")  # answered while the refresh is held by its gate
    assert stale.status_code == 200 and stale.get_json()["n"] == 1
    assert stale.headers["Cache-Status"] == "reachlimit; hit; ttl=-3"
    a.gate.set()
    a.settle("x")
    fresh = a.get("/r/x")
    assert fresh.get_json() == {"key": "x", "n": 2, "app": "stale"}  # built in an app context
    assert fresh.headers["Cache-Status"] == "reachlimit; hit; ttl=10"
    with a.app.app_context():
        stats = a.rl.stats()
    assert (stats.stale, stats.builds, stats.hits) == (1, 2, 1)


def test_a_follower_is_collapsed_and_a_refusal_says_its_status(
    made: list[App], clock: FakeClock
) -> None:
    a = make(made, clock, REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=0)
    a.gate = threading.Event()
    answers: dict[str, Any] = {}
    leader = threading.Thread(target=lambda: answers.__setitem__("lead", a.get("/r/y")))
    leader.start()
    wait_until("the leader to build", lambda: a.runs == 1)
    follower = threading.Thread(target=lambda: answers.__setitem__("follow", a.get("/r/y")))
    follower.start()
    wait_until("the follower to join", lambda: a.path.flight._calls["y"].followers == 1)
    refused = a.get("/r/other")  # the only slot is the leader's, no queue: refused
    assert refused.status_code == 429
    assert refused.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"
    assert refused.headers["Retry-After"] == "2"
    a.gate.set()
    for t in (leader, follower):
        t.join(JOIN_TIMEOUT)
        assert not t.is_alive()
    assert answers["lead"].headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    assert answers["follow"].headers["Cache-Status"] == "reachlimit; fwd=uri-miss; collapsed"


def test_a_failing_refresh_never_reaches_a_client_and_is_logged_once(
    made: list[App], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    a = make(made, clock)
    a.get("/r/x")
    clock.now += 11.0
    a.fail = RuntimeError("database gone")
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        for _ in range(3):  # one try a backoff (the TTL, 10 s) after the other
            answer = a.get("/r/x")
            assert answer.status_code == 200 and answer.get_json()["n"] == 1
            a.settle("x")
            clock.now += 10.0
    assert a.runs == 4
    assert len([r for r in caplog.records if "refresh of 'x'" in r.getMessage()]) == 1


def test_the_stale_figures_reach_health_and_metrics(made: list[App], clock: FakeClock) -> None:
    pytest.importorskip("prometheus_client")
    a = make(made, clock, REACHLIMIT_METRICS=True)
    a.app.add_url_rule("/health", view_func=a.rl.health_view)
    a.app.add_url_rule("/metrics", view_func=a.rl.metrics_view)
    a.get("/r/x")
    clock.now += 11.0
    a.get("/r/x")
    a.settle("x")
    assert a.get("/health").get_json()["reach"]["stale"] == 1
    text = a.get("/metrics").get_data(as_text=True)
    assert 'reachlimit_cache_requests_total{budget="default",result="stale"} 1.0' in text
    assert 'reachlimit_refreshes_total{budget="default",result="done"} 1.0' in text


@pytest.mark.parametrize("bad", ["-1", "soon", -0.5, "inf", True])
def test_a_bad_stale_window_is_a_value_error_naming_the_key(bad: Any) -> None:
    app = Flask("bad")
    app.config["REACHLIMIT_STALE"] = bad
    with pytest.raises(ValueError, match="REACHLIMIT_STALE"):
        ReachLimit(app)


def test_a_stale_window_over_a_day_is_allowed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    app = Flask("long")
    app.config["REACHLIMIT_STALE"] = "172800"
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        rl = ReachLimit(app)
    assert any("REACHLIMIT_STALE" in r.getMessage() for r in caplog.records)
    with app.app_context():
        assert rl.settings().stale == 172800.0
        rl.close()


def test_without_a_stale_window_an_expired_entry_is_built_in_the_request(clock: FakeClock) -> None:
    a = App(clock, REACHLIMIT_STALE=0)
    try:
        a.get("/r/x")
        clock.now += 10.0
        again = a.get("/r/x")
        assert again.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
        assert again.get_json()["n"] == 2 and not threads_of(a.path.refresher)
    finally:
        a.rl.close(a.app)
