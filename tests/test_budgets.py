"""Several budgets in one app, through Flask's test client: ``rl.budget(name, ...)`` and
``REACHLIMIT_BUDGETS``, declared before or after ``init_app``; each its own limiter and cache;
bad names and options refused naming them; one ReachLimit per app; the refusal naming its
budget (or the app's own sentence); health and metrics showing every budget; an app's own
refusal handler keeping Retry-After and Cache-Status; unknown REACHLIMIT_* keys warned.

Builds that must be held wait on an Event the test sets; "building" is an Event the build
sets, so every hand-off is explicit and every wait is bounded.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from flask import Flask, jsonify
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.test import TestResponse

from reachlimit import Busy
from reachlimit.flask import _REFUSAL_SENTENCES, Budget, ColdRefused, ReachLimit
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner, start_call

pytestmark = pytest.mark.timeout(30)


class Held:
    """A build that waits for ``go``; ``building`` is set once it runs."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.building = threading.Event()
        self.runs = 0

    def __call__(self, value: Any) -> Any:
        self.runs += 1
        self.building.set()
        assert self.go.wait(JOIN_TIMEOUT), "the test never let the build go"
        return value


def make_app(rl: ReachLimit, config: dict[str, Any] | None = None, **budgets: Budget) -> Flask:
    """``/d/<k>`` through ``rl.cold``; ``/b/<name>/<k>`` through that budget; ``/health``."""
    app = Flask("budgets")
    app.config.update(config or {})
    rl.init_app(app)
    app.config["HELD"] = Held()

    @app.get("/d/<k>")
    def default(k: str) -> Any:
        return rl.cold(k, lambda: app.config["HELD"]({"k": k, "budget": "default"}))

    @app.get("/b/<name>/<k>")
    def named(name: str, k: str) -> Any:
        return budgets[name].cold(k, lambda: app.config["HELD"]({"k": k, "budget": name}))

    app.add_url_rule("/health", view_func=rl.health_view)
    app.add_url_rule("/metrics", view_func=rl.metrics_view)
    return app


def get_while_full(app: Flask, budget: Budget | ReachLimit, url: str) -> TestResponse:
    """``GET url`` while the test holds ``budget``'s only build slot (queue 0: refused)."""
    with app.test_request_context():
        grant = budget.path.limiter.acquire()
    try:
        return app.test_client().get(url)
    finally:
        grant.release()


def test_a_saturated_budget_leaves_the_default_alone(threads: ThreadRunner) -> None:
    rl = ReachLimit()
    reports = rl.budget("reports", active=1, queue=0)  # declared before init_app
    app = make_app(rl, reports=reports)
    held: Held = app.config["HELD"]
    busy = start_call(threads, lambda: app.test_client().get("/b/reports/a"), name="holder")
    assert held.building.wait(JOIN_TIMEOUT)
    refused = app.test_client().get("/b/reports/b")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"
    assert refused.get_json()["error"] == (
        "Too many 'reports' builds are running or waiting right now; please retry shortly."
    )
    assert refused.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"
    held.go.set()  # the default budget builds while reports is still full...
    assert app.test_client().get("/d/a").get_json() == {"k": "a", "budget": "default"}
    busy.wait_done(JOIN_TIMEOUT)
    assert busy.value.get_json() == {"k": "a", "budget": "reports"}
    with app.test_request_context():
        assert reports.stats().capacity_active == 1 and rl.stats().capacity_active == 2
        assert reports.stats().rejected_full == 1 and rl.stats().rejected_full == 0
        # ... and each has its own cache: the same key, two entries
        assert reports.stats().builds == 1 and rl.stats().builds == 1
        reports.clear_cache()
    assert app.test_client().get("/b/reports/a").headers["Cache-Status"].endswith("stored")
    assert app.test_client().get("/d/a").headers["Cache-Status"].startswith("reachlimit; hit")


def test_budgets_from_the_config_dict_or_json_and_arguments_win() -> None:
    for raw in ({"exports": {"active": 3, "queue": 1}}, '{"exports": {"active": 3, "queue": 1}}'):
        rl = ReachLimit(active=5)
        exports = rl.budget("exports", queue=4)
        app = make_app(rl, {"REACHLIMIT_BUDGETS": raw, "REACHLIMIT_WAIT": 7}, exports=exports)
        with app.test_request_context():
            s = exports.settings()
            assert (s.active, s.queue, s.wait) == (3, 4, 7.0)  # config, argument, the app's
            assert rl.settings().active == 5
            assert rl.budget("exports") is exports


def test_a_budget_only_in_the_config_is_built_and_shown() -> None:
    rl = ReachLimit()
    app = make_app(rl, {"REACHLIMIT_BUDGETS": {"thumbs": {"active": 1}}})
    with app.test_request_context():
        assert rl.budget("thumbs").stats().capacity_active == 1
    assert set(app.test_client().get("/health").get_json()["budgets"]) == {"default", "thumbs"}


def test_a_budget_declared_after_init_app_is_built_on_first_use_in_each_app() -> None:
    rl = ReachLimit()
    one, two = make_app(rl), make_app(rl)  # an app factory: one extension, two apps
    late = rl.budget("late", active=1)
    for app in (one, two):
        app.add_url_rule("/late/<k>", "late", lambda k: late.cold(k, lambda: {"k": k}))
        app.config["HELD"].go.set()
        assert app.test_client().get("/late/x").get_json() == {"k": "x"}
        health = app.test_client().get("/health").get_json()
        assert health["budgets"]["late"]["builds"] == 1
        assert health["budgets"]["late"]["capacity_active"] == 1
    assert one.extensions["reachlimit"].budgets.states["late"] is not (
        two.extensions["reachlimit"].budgets.states["late"]
    )


def test_health_names_every_budget_and_keeps_reach_for_the_default() -> None:
    rl = ReachLimit()
    app = make_app(rl, reports=rl.budget("reports", active=1), a=rl.budget("a-b_1"))
    app.config["HELD"].go.set()
    app.test_client().get("/d/x")
    body = app.test_client().get("/health").get_json()
    assert body["status"] == "ok"
    assert set(body["budgets"]) == {"default", "reports", "a-b_1"}
    assert body["reach"] == body["budgets"]["default"] and body["reach"]["builds"] == 1
    assert body["budgets"]["reports"]["capacity_active"] == 1


def test_metrics_carry_one_budget_label_per_budget() -> None:
    rl = ReachLimit(metrics=True)
    reports = rl.budget("reports", active=1)
    app = make_app(rl, reports=reports)
    app.config["HELD"].go.set()
    app.test_client().get("/b/reports/x")
    text = app.test_client().get("/metrics").get_data(as_text=True)
    capacity: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert "budget" in sample.labels, sample  # every figure names its budget
            if sample.name == "reachlimit_capacity_active":
                capacity[sample.labels["budget"]] = sample.value
    assert capacity == {"default": 2, "reports": 1}
    assert 'reachlimit_cache_requests_total{budget="reports",result="miss"} 1.0' in text
    assert 'reachlimit_cache_requests_total{budget="default",result="miss"} 0.0' in text


@pytest.mark.parametrize("name", ["", "Reports", "a" * 33, "a b", "ä", "x{y}", 7, "cold"])
def test_a_bad_budget_name_is_a_value_error_naming_it(name: Any) -> None:
    with pytest.raises(ValueError, match=repr(name).replace("{", r"\{").replace("}", r"\}")):
        ReachLimit().budget(name)
    app = Flask("bad")
    app.config["REACHLIMIT_BUDGETS"] = {name: {}} if isinstance(name, str) else {}
    if isinstance(name, str):
        with pytest.raises(ValueError, match="REACHLIMIT_BUDGETS"):
            ReachLimit(app)


def test_bad_budget_options_are_refused_naming_them() -> None:
    rl = ReachLimit()
    with pytest.raises(TypeError, match="unknown option.*activ"):
        rl.budget("x", activ=1)
    with pytest.raises(ValueError, match=r"active \(rl.budget\('x'\) argument\) must be"):
        rl.budget("x", active=0)
    with pytest.raises(ValueError, match="redis_url.*same for every budget"):
        rl.budget("x", redis_url="redis://127.0.0.1:1")
    with pytest.raises(ValueError, match="default budget's options"):
        rl.budget("default", active=1)
    assert rl.budget("default") is rl.budget("default")
    rl.budget("x", active=1)
    with pytest.raises(ValueError, match="declared already"):
        rl.budget("x", active=2)
    for config, match in (
        ({"x": {"active": "none"}}, r"REACHLIMIT_BUDGETS\['x'\]\['active'\] must be"),
        ({"x": {"activ": 1}}, r"REACHLIMIT_BUDGETS\['x'\]: unknown option"),
        ({"x": {"metrics": True}}, "metrics is the same for every budget"),
        ({"default": {}}, "default budget's options"),
        ({"x": 1}, "must map budget names to options"),
        ("{not json", "not valid JSON"),
    ):
        app = Flask("bad")
        app.config["REACHLIMIT_BUDGETS"] = config
        with pytest.raises(ValueError, match=match):
            ReachLimit(app)


def test_a_second_reachlimit_on_one_app_is_refused_pointing_at_budgets() -> None:
    app = Flask("twice")
    rl = ReachLimit(app)
    with pytest.raises(RuntimeError, match=r"rl\.budget"):
        ReachLimit(app)
    with pytest.raises(RuntimeError, match="init_app was called twice"):
        rl.init_app(app)
    other = Flask("other")
    stranger = ReachLimit()
    ReachLimit(other)
    with other.test_request_context(), pytest.raises(RuntimeError, match="not one of this app"):
        stranger.budget("mine").stats()


def test_the_refusal_message_option_and_its_fields() -> None:
    rl = ReachLimit(active=1, queue=0, refusal_message="Busy {budget}; in {retry_after} s.")
    reports = rl.budget("reports", refusal_message="Reports are busy.")
    app = make_app(rl, reports=reports)
    held: Held = app.config["HELD"]
    with app.test_request_context():
        grant = rl.path.limiter.acquire()
        other = reports.path.limiter.acquire()
    try:
        assert app.test_client().get("/d/z").get_json()["error"] == "Busy default; in 2 s."
        assert app.test_client().get("/b/reports/z").get_json()["error"] == "Reports are busy."
    finally:
        grant.release()
        other.release()
    assert held.runs == 0
    assert _REFUSAL_SENTENCES[Busy.QUEUE_FULL].startswith("Too many 'default' builds")
    for bad in ("{nope}", "{0}", "{budget", "{retry_after[0]}"):
        with pytest.raises(ValueError, match="REACHLIMIT_REFUSAL_MESSAGE may use only"):
            ReachLimit().init_app(_with(REACHLIMIT_REFUSAL_MESSAGE=bad))


def _with(**config: Any) -> Flask:
    app = Flask("configured")
    app.config.update(config)
    return app


@pytest.mark.parametrize("register", ["before", "after"])
def test_an_apps_own_refusal_handler_keeps_retry_after_and_cache_status(register: str) -> None:
    rl = ReachLimit(active=1, queue=0)
    app = Flask("own-handler")

    def mine(exc: ColdRefused) -> Any:
        assert exc.budget == "default" and exc.retry_after == 2 and exc.busy.reason == "queue_full"
        return jsonify(mine=True), 429

    if register == "before":
        app.register_error_handler(ColdRefused, mine)
    rl.init_app(app)
    if register == "after":
        app.register_error_handler(ColdRefused, mine)
    app.add_url_rule("/r", "r", lambda: rl.cold("k", lambda: b"never"))
    reply = get_while_full(app, rl, "/r")
    assert (reply.status_code, reply.get_json()) == (429, {"mine": True})
    assert reply.headers["Retry-After"] == "2"
    assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"


def test_an_apps_errorhandler_429_does_not_replace_the_refusal() -> None:
    rl = ReachLimit(active=1, queue=0)
    app = Flask("http-429")
    app.register_error_handler(429, lambda exc: ("generic", 429))
    rl.init_app(app)
    app.add_url_rule("/r", "r", lambda: rl.cold("k", lambda: b"never"))
    reply = get_while_full(app, rl, "/r")
    assert reply.get_json()["retryAfter"] == 2 and reply.headers["Retry-After"] == "2"
    assert reply.headers.getlist("Cache-Status") == ["reachlimit; fwd=uri-miss; fwd-status=429"]


def test_unknown_reachlimit_keys_are_warned_with_the_nearest_known_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {
        "REACHLIMIT_ACTIV": 1, "REACHLIMIT_BOOT_ID": "abc", "REACHLIMIT_BUDGETS": {},
        "REACHLIMIT_ACTIVE": 2, "REACHLIMIT_REFUSAL_MESSAGE": "busy", "REACHLIMIT_ZZZZZZZZ": 1,
        "OTHER_KEY": 1,
    }
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        ReachLimit(_with(**config))
    warned = [r.getMessage() for r in caplog.records if "unknown config key" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "REACHLIMIT_ACTIV: reachlimit does not read it; did you mean REACHLIMIT_ACTIVE?" in (
        warned[0]
    )
    assert warned[1].endswith("REACHLIMIT_ZZZZZZZZ: reachlimit does not read it")


def test_budget_objects_hold_no_app_and_repr_their_name() -> None:
    rl = ReachLimit()
    reports = rl.budget("reports")
    assert repr(reports) == "<reachlimit Budget 'reports'>"
    assert not any(isinstance(v, Flask) for v in vars(reports).values())
    assert not any(isinstance(v, Flask) for v in vars(rl).values())
    with pytest.raises(RuntimeError, match="init_app"), Flask("none").test_request_context():
        reports.stats()


def test_close_stops_every_budgets_background_work() -> None:
    rl = ReachLimit(stale=30)
    reports = rl.budget("reports")
    app = make_app(rl, reports=reports)
    states = app.extensions["reachlimit"].budgets.states
    assert set(states) == {"default", "reports"}
    closed: list[str] = []
    for name, state in states.items():
        state.closers.append(lambda name=name: closed.append(name))  # type: ignore[misc]
    rl.close(app)
    rl.close(app)  # safe twice
    assert sorted(closed) == ["default", "reports"]



def test_options_declared_after_init_app_for_a_configured_budget_are_refused() -> None:
    """A budget an init_app built from REACHLIMIT_BUDGETS alone cannot take options declared
    later: a ValueError says to declare it first, instead of the options being ignored."""
    rl = ReachLimit(_with(REACHLIMIT_BUDGETS={"reports": {"queue": 4}}))
    with pytest.raises(ValueError, match="declare it before init_app"):
        rl.budget("reports", active=1)
    assert rl.budget("reports").name == "reports"  # without options: the configured one
    early = ReachLimit()
    early.budget("reports", active=1)
    app = _with(REACHLIMIT_BUDGETS={"reports": {"queue": 4}})
    early.init_app(app)
    with app.app_context():
        settings = early.budget("reports").settings()
    assert (settings.active, settings.queue) == (1, 4)  # declared first: both reach it
