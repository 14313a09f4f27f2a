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

from reachlimit.flask import Budget, ColdRefused, ReachLimit
from tests.support.fair_app import QUEUE_FULL
from tests.support.refreshes import refreshing
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


def test_health_names_every_budget_and_keys_the_default_by_its_name() -> None:
    rl = ReachLimit()
    app = make_app(rl, reports=rl.budget("reports", active=1), a=rl.budget("a-b_1"))
    app.config["HELD"].go.set()
    app.test_client().get("/d/x")
    body = app.test_client().get("/health").get_json()
    assert body["status"] == "ok"
    assert set(body["budgets"]) == {"default", "reports", "a-b_1"}
    assert body["default"] == body["budgets"]["default"] and body["default"]["builds"] == 1
    assert body["reach"] == body["default"]  # the old key, kept one release (deprecated)
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
    assert QUEUE_FULL.startswith("Too many 'default' builds")
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


# -- an app's own refusal handler, and what the extension adds as the answer is sent -----------


def own_handler_app(status: int, retry_after: int = 2) -> tuple[Flask, ReachLimit, list[Any]]:
    """An app whose "reports" budget (one slot, no queue) is answered by the app's own
    refusal handler, with ``status`` and no Retry-After of its own; the refusals it saw."""
    rl = ReachLimit(retry_after=retry_after)
    reports = rl.budget("reports", active=1, queue=0)
    app = Flask("own-status")
    seen: list[Any] = []

    def mine(exc: ColdRefused) -> Any:
        seen.append(exc)
        return jsonify(mine=True), status

    app.register_error_handler(ColdRefused, mine)
    rl.init_app(app)
    app.add_url_rule("/r", "r", lambda: reports.cold("k", lambda: b"never"))
    return app, rl, seen


@pytest.mark.parametrize(("status", "retry_after"), [(429, "2"), (503, "2"), (200, None)])
def test_the_hook_adds_retry_after_to_an_own_429_or_503_only(
    status: int, retry_after: str | None
) -> None:
    """A handler that answers the refusal with a page of its own (200) is not told to retry."""
    app, rl, seen = own_handler_app(status)
    reply = get_while_full(app, rl.budget("reports"), "/r")
    assert reply.status_code == status
    assert reply.headers.get("Retry-After") == retry_after
    [refused] = seen
    assert refused.budget == "reports" and refused.busy.reason == "queue_full"


def test_an_own_answers_retry_after_in_any_case_is_the_only_one_sent() -> None:
    """Header names in any case are the same header: the handler's ``retry-after`` is the
    answer's Retry-After, and the refusal's is not added beside it."""
    rl = ReachLimit(active=1, queue=0)
    app = Flask("own-retry-after")
    app.register_error_handler(
        ColdRefused, lambda exc: (jsonify(mine=True), 503, [("retry-after", "9")])
    )
    rl.init_app(app)
    app.add_url_rule("/r", "r", lambda: rl.cold("k", lambda: b"never"))
    reply = get_while_full(app, rl, "/r")
    assert (reply.status_code, reply.headers.getlist("Retry-After")) == (503, ["9"])
    assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"


def test_a_one_second_retry_after_stays_one_second() -> None:
    app, rl, seen = own_handler_app(429, retry_after=1)
    reply = get_while_full(app, rl.budget("reports"), "/r")
    assert reply.headers["Retry-After"] == "1"
    assert seen[0].retry_after == 1


def test_a_caught_refusal_followed_by_an_answer_is_not_told_to_retry() -> None:
    """The view catches the refusal of one budget and answers from a warm key of another,
    with a 503 of its own: the last cold() was no refusal, so no Retry-After is added."""
    rl = ReachLimit()
    reports = rl.budget("reports", active=1, queue=0)
    app = Flask("caught")
    rl.init_app(app)

    def view() -> Any:
        try:
            reports.cold("k", lambda: b"never")
        except ColdRefused:
            pass
        return jsonify(rl.cold("warm", lambda: {"warm": True})), 503

    app.add_url_rule("/v", "v", view)
    reply = get_while_full(app, reports, "/v")
    assert reply.status_code == 503 and reply.get_json() == {"warm": True}
    assert "Retry-After" not in reply.headers
    assert reply.headers.getlist("Cache-Status") == ["reachlimit; fwd=uri-miss; stored"]


# -- budgets declared after init_app -------------------------------------------------------------


def test_a_budget_declared_after_init_app_is_in_the_health_before_its_first_use() -> None:
    rl = ReachLimit()
    app = Flask("late-health")
    rl.init_app(app)
    app.add_url_rule("/health", view_func=rl.health_view)
    rl.budget("later", active=1)
    budgets = app.test_client().get("/health").get_json()["budgets"]
    assert set(budgets) == {"default", "later"}
    assert budgets["later"]["capacity_active"] == 1


def test_a_budget_declared_after_init_app_refreshes_in_the_apps_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stale entry's refresh runs on a refresher thread, in an app context of the app the
    budget was built in (the build reads current_app)."""
    from flask import current_app

    from reachlimit import TTLCache
    from tests.support.clock import FakeClock
    from tests.support.waiting import wait_until

    rl = ReachLimit()
    app = Flask("late-stale")
    rl.init_app(app)
    reports = rl.budget("reports", cache_ttl=10, stale=30)
    runs: list[str] = []

    def build() -> Any:
        runs.append(current_app.name)
        return {"n": len(runs)}

    app.add_url_rule("/r", "r", lambda: reports.cold("k", build))
    clock = FakeClock(5000.0)
    with app.app_context():
        path = reports.path  # built now, on its first use in this app
    path.cache = TTLCache(8, 10.0, stale=30.0, clock=clock)
    path.clock = clock
    try:
        assert app.test_client().get("/r").get_json() == {"n": 1}
        clock.advance(12.0)  # stale
        assert app.test_client().get("/r").get_json() == {"n": 1}  # at once, then refreshed
        wait_until("the refresh", lambda: not refreshing(path.refresher, "k"))
        assert runs == ["late-stale", "late-stale"]
        assert app.test_client().get("/r").get_json() == {"n": 2}
        assert (path.counts().refreshed, path.counts().refresh_failed) == (1, 0)
    finally:
        rl.close(app)


def test_a_budgets_bad_options_are_named_with_the_known_ones() -> None:
    from reachlimit.flask import CONFIG_KEYS

    rl = ReachLimit()
    with pytest.raises(TypeError) as info:
        rl.budget("x", queu=1, activ=2)
    unknown, known = str(info.value).split("; known: ")
    assert unknown == "rl.budget('x'): unknown option(s) activ, queu"
    app_wide = {"metrics", "redis_url", "redis_prefix", "budgets"}
    options = sorted(k.removeprefix("REACHLIMIT_").lower() for k in CONFIG_KEYS)
    assert known.split(", ") == [o for o in options if o not in app_wide]
    with pytest.raises(ValueError) as shared:
        rl.budget("x", redis_prefix="p", metrics=True)
    assert str(shared.value).startswith(
        "rl.budget('x'): metrics, redis_prefix is the same for every budget of an app"
    )


# -- a budget's figures and housekeeping (reachlimit._budgets) ------------------------------------


class ServiceCounters:
    """A stand-in for the counters an app on Redis adds up there (``SharedPathCounters``):
    ``apply`` puts the service's hits in place of this process's."""

    def __init__(self, hits: int) -> None:
        self.hits = hits
        self.applied = 0

    def apply(self, stats: Any) -> Any:
        import dataclasses

        self.applied += 1
        return dataclasses.replace(stats, hits=self.hits)


def test_the_figures_are_the_services_unless_its_backend_is_degraded() -> None:
    import dataclasses

    from reachlimit import ColdLimiter, ColdPath
    from reachlimit._budgets import BudgetState
    from reachlimit.flask import Settings

    path = ColdPath(ColdLimiter())
    counters = ServiceCounters(hits=41)
    state = BudgetState(Settings(), path, counters=counters)  # type: ignore[arg-type]
    assert state.stats().hits == 41 and counters.applied == 1
    degraded = dataclasses.replace(path.stats(), degraded=True)
    path.stats = lambda: degraded  # type: ignore[method-assign]
    assert state.stats() is degraded and counters.applied == 1  # never asked
    alone = BudgetState(Settings(), ColdPath(ColdLimiter()))  # no service counters
    assert alone.stats().hits == 0


def test_clearing_a_cache_that_cannot_be_cleared_does_nothing() -> None:
    from reachlimit import ColdLimiter, ColdPath
    from reachlimit._budgets import BudgetState
    from reachlimit.flask import Settings

    class Plain:
        """A cache of an app's own, without clear()."""

        def __init__(self) -> None:
            self.entries: dict[Any, Any] = {"k": "v"}

        def get(self, key: Any) -> Any:
            return self.entries.get(key)

        def set(self, key: Any, value: Any) -> None:
            self.entries[key] = value

    cache = Plain()
    BudgetState(Settings(), ColdPath(ColdLimiter(), cache)).clear_cache()
    assert cache.entries == {"k": "v"}


def test_a_budgets_cold_keeps_the_key_and_value_rules() -> None:
    rl = ReachLimit()
    reports = rl.budget("reports")
    app = Flask("rules")
    rl.init_app(app)
    with app.test_request_context("/"):
        with pytest.raises(TypeError, match="cold"):
            reports.cold(1.5, lambda: "never built")
        with pytest.raises(TypeError) as info:
            reports.cold("odd", lambda: {1, 2})
        assert str(info.value).startswith("the value built for key 'odd' is a set, which ")
        assert reports.cold("fine", lambda: ("a", 1)) == ["a", 1]  # as the shared cache gives


def test_a_budgets_cached_view_takes_its_key_and_mimetype() -> None:
    rl = ReachLimit()
    reports = rl.budget("reports")
    app = Flask("cached-budget")
    rl.init_app(app)
    built: list[str] = []

    @app.get("/csv/<name>")
    @reports.cached(key=lambda name: name, mimetype="text/csv")
    def csv(name: str) -> str:
        built.append(name)
        return f"name\n{name}\n"

    client = app.test_client()
    first, second = client.get("/csv/a?x=1"), client.get("/csv/a?x=2")  # one key: the name
    assert first.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert first.get_data() == second.get_data() == b"name\na\n"
    assert built == ["a"]
    with app.app_context():
        assert reports.stats().hits == 1 and rl.stats().hits == 0  # the budget's own


def test_an_own_refusals_retry_after_is_kept() -> None:
    rl = ReachLimit(active=1, queue=0)
    app = Flask("own-retry-after")
    app.register_error_handler(
        ColdRefused, lambda exc: (jsonify(mine=True), 429, {"Retry-After": "7"})
    )
    rl.init_app(app)
    app.add_url_rule("/r", "r", lambda: rl.cold("k", lambda: b"never"))
    reply = get_while_full(app, rl, "/r")
    assert reply.headers.getlist("Retry-After") == ["7"]
