"""The Flask extension ``reachlimit.flask.ReachLimit`` through Flask's test client.

The test client has no socket, so no client-gone watch applies here (tests/test_gunicorn.py
and tests/test_werkzeug_server.py cover that under real servers). Build slots are held by
acquiring the app's own limiter (``app.extensions["reachlimit"].path.limiter``), so a refusal
is certain, not a race: nothing frees a held slot until the test lets it go.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask, Response, abort, jsonify, request
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.test import TestResponse

from reachlimit import NOT_FOUND, Cancelled, ColdLimiter, Grant, TTLCache
from reachlimit.flask import ReachLimit, Settings
from tests.apps.slow_app import add_cold_routes
from tests.support.flask_ext import ExtensionReads
from tests.support.limiter import LIMITER_FIELDS, PATH_FIELDS, slots_held
from tests.support.waiting import wait_until

DEADLINE = 10.0



class Harness(ExtensionReads):
    """A small app with one cold endpoint, ``/report/<key>``, and ``/health``.

    A build records its key in ``built`` and returns ``{"key", "build"}``; ``hooks[key]``
    replaces the build of one key (to block, fail or return NOT_FOUND)."""

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        rl: ReachLimit | None = None,
        name: str = "harness",
        **overrides: Any,
    ) -> None:
        self.app = app = Flask(name)
        app.config.update(config or {})
        if rl is None:
            rl = ReachLimit(app, **overrides)
        else:
            rl.init_app(app)
        self.rl = rl
        self.built: list[str] = []  # guarded by _lock
        self.hooks: dict[str, Callable[[], Any]] = {}
        self._lock = threading.Lock()

        add_cold_routes(app, rl, self._build)

    def _build(self, key: str) -> Any:
        with self._lock:
            self.built.append(key)
            number = len(self.built)
        hook = self.hooks.get(key)
        if hook is not None:
            return hook()
        return {"key": key, "build": number}

    def get(self, key: str) -> TestResponse:
        return self.app.test_client().get(f"/report/{key}")

    def settings(self) -> Settings:
        with self.app.app_context():
            return self.rl.settings()

    def followers(self, key: str) -> int:
        # White-box: a follower is attached to the leader's call once it is counted here;
        # no public figure shows it before the call ends.
        call = self.path.flight._calls.get(key)
        return call.followers if call is not None else 0


class Requests:
    """Requests run in threads (each with its own test client), joined with a timeout."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.threads: list[threading.Thread] = []
        self.responses: dict[int, TestResponse | BaseException] = {}

    def start(self, path: str) -> int:
        index = len(self.threads)

        def run() -> None:
            try:
                self.responses[index] = self.app.test_client().get(path)
            except BaseException as exc:  # failed on in results()
                self.responses[index] = exc

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return index

    def results(self) -> list[TestResponse]:
        for thread in self.threads:
            thread.join(DEADLINE)
            assert not thread.is_alive()
        out = [self.responses[i] for i in range(len(self.threads))]
        for r in out:
            assert isinstance(r, TestResponse), r
        return out  # type: ignore[return-value]


def assert_refusal(resp: TestResponse, status: int = 429, retry_after: int = 2) -> str:
    """The refusal: ``status`` (429 unless configured otherwise), ``Retry-After`` and a JSON
    body saying when to retry; returns its human sentence."""
    assert resp.status_code == status
    assert resp.headers["Retry-After"] == str(retry_after)
    assert resp.mimetype == "application/json"
    assert resp.headers["Cache-Control"] == "no-store"
    body = resp.get_json()
    assert set(body) == {"error", "retryAfter"}
    assert isinstance(body["error"], str) and body["error"]
    assert body["retryAfter"] == retry_after
    sentence: str = body["error"]
    return sentence


# -- the cold path through the extension ------------------------------------------------------


def test_cold_request_builds_once_then_is_served_warm() -> None:
    h = Harness()
    first = h.get("a")
    second = h.get("a")
    assert first.status_code == second.status_code == 200
    assert first.get_json() == second.get_json() == {"key": "a", "build": 1}
    assert h.built == ["a"]
    stats = h.stats()
    assert (stats["hits"], stats["misses"], stats["builds"]) == (1, 1, 1)
    assert (stats["active"], stats["queued"]) == (0, 0)


def test_queue_full_refusal_then_200_once_a_slot_is_free() -> None:
    h = Harness({"REACHLIMIT_QUEUE": 0})
    with slots_held(h.limiter):
        refused = h.get("k")
    assert_refusal(refused)
    stats = h.stats()
    assert (stats["rejected_full"], stats["builds"]) == (1, 0)
    assert h.built == []
    # Nothing about the refusal was cached: with a slot free the same request is served.
    again = h.get("k")
    assert again.status_code == 200
    assert again.get_json() == {"key": "k", "build": 1}


def test_queue_full_is_refused_at_once_while_eight_leaders_wait() -> None:
    h = Harness({"REACHLIMIT_WAIT": 30})
    limiter = h.limiter
    leave = threading.Event()  # the waiters' cancel: set by the test to end their wait
    outcomes: list[str] = []

    def wait_in_queue() -> None:
        try:
            # The test client's own address: one client alone, so the request is refused
            # at once (fair admission would let another client take a place).
            with limiter.acquire(cancel=leave, client="127.0.0.1"):
                outcomes.append("promoted")
        except Cancelled:
            outcomes.append("cancelled")

    waiters = [threading.Thread(target=wait_in_queue, daemon=True) for _ in range(8)]
    with slots_held(limiter):
        try:
            for t in waiters:
                t.start()
            wait_until("8 queued", lambda: limiter.stats().queued == 8)
            refused = h.get("k")
            # Answered while all eight still wait (their wait is 30 s): refused at once.
            stats = limiter.stats()
        finally:
            leave.set()
            for t in waiters:
                t.join(DEADLINE)
                assert not t.is_alive()
    assert_refusal(refused)
    assert (stats.queued, stats.rejected_full, stats.rejected_timeout) == (8, 1, 0)
    assert outcomes == ["cancelled"] * 8
    assert h.built == []


def test_timeout_refusal() -> None:
    # No socket under the test client: the bounded wait applies, and with every slot held
    # nothing can end it but the clock.
    h = Harness({"REACHLIMIT_WAIT": 0.05, "REACHLIMIT_QUEUE": 1})
    with slots_held(h.limiter):
        refused = h.get("k")
        stats = h.limiter.stats()
    assert_refusal(refused)
    assert (stats.rejected_timeout, stats.rejected_full, stats.queued) == (1, 0, 0)
    assert h.built == []
    assert h.get("k").status_code == 200


def test_queue_full_and_timeout_refusals_say_different_things() -> None:
    h = Harness({"REACHLIMIT_WAIT": 0.05, "REACHLIMIT_QUEUE": 1})
    leave = threading.Event()
    with slots_held(h.limiter):
        waiter = threading.Thread(
            target=lambda: pytest.raises(Cancelled, h.limiter.acquire, leave), daemon=True
        )
        waiter.start()
        try:
            wait_until("the queue place taken", lambda: h.limiter.stats().queued == 1)
            full = assert_refusal(h.get("k"))
        finally:
            leave.set()
            waiter.join(DEADLINE)
        assert not waiter.is_alive()
        timed_out = assert_refusal(h.get("k"))
    stats = h.limiter.stats()
    assert (stats.rejected_full, stats.rejected_timeout, stats.cancelled) == (1, 1, 1)
    assert full != timed_out


def test_503_mode() -> None:
    h = Harness({"REACHLIMIT_STATUS": 503, "REACHLIMIT_QUEUE": 0})
    with slots_held(h.limiter):
        refused = h.get("k")
    assert_refusal(refused, status=503)


def test_retry_after_setting_reaches_header_and_body() -> None:
    h = Harness({"REACHLIMIT_QUEUE": 0}, retry_after=5)
    with slots_held(h.limiter):
        refused = h.get("k")
    assert_refusal(refused, retry_after=5)


# -- configuration --------------------------------------------------------------------------


def assert_built_from(h: Harness, settings: Settings) -> None:
    """``h``'s app runs with ``settings``, and its limiter and cache were built with them."""
    assert h.settings() == settings
    limiter = h.limiter
    assert (limiter.capacity_active, limiter.capacity_queue) == (settings.active, settings.queue)
    assert (limiter.wait, limiter.retry_after) == (settings.wait, settings.retry_after)
    cache = h.path.cache
    assert isinstance(cache, TTLCache)
    assert (cache.maxsize, cache.ttl) == (settings.cache_size, settings.cache_ttl)


#: The eight settings, one row each: the field, its config key, its default, the value
#: ALL_CHANGED gives it, and the one test_constructor_overrides_win_over_config passes.
SETTINGS_TABLE: list[tuple[str, str, Any, Any, Any]] = [
    # field                 config key                         default  changed  override
    ("active",               "REACHLIMIT_ACTIVE",               2,       3,       1),
    ("queue",                "REACHLIMIT_QUEUE",                8,       5,       0),
    ("wait",                 "REACHLIMIT_WAIT",                 3.0,     1.5,     9),
    ("retry_after",          "REACHLIMIT_RETRY_AFTER",          2,       4,       7),
    ("cache_ttl",            "REACHLIMIT_CACHE_TTL",            300.0,   60,      5),
    ("cache_size",           "REACHLIMIT_CACHE_SIZE",           256,     10,      3),
    ("status",               "REACHLIMIT_STATUS",               429,     503,     429),
    ("cancel_on_disconnect", "REACHLIMIT_CANCEL_ON_DISCONNECT", True,    False,   True),
]  # fmt: skip
ALL_CHANGED = {key: changed for _, key, _, changed, _ in SETTINGS_TABLE}
ALL_CHANGED_SETTINGS = Settings(**{field: changed for field, _, _, changed, _ in SETTINGS_TABLE})


def test_defaults() -> None:
    assert Settings() == Settings(**{field: default for field, _, default, _, _ in SETTINGS_TABLE})
    assert_built_from(Harness(), Settings())


def test_config_keys() -> None:
    assert_built_from(Harness(ALL_CHANGED), ALL_CHANGED_SETTINGS)


def test_constructor_overrides_win_over_config() -> None:
    overrides = {field: override for field, _, _, _, override in SETTINGS_TABLE}
    h = Harness(ALL_CHANGED, **overrides)
    assert h.settings() == Settings(**overrides)
    # Only the overridden names win; the others still come from the config.
    partial = Harness(ALL_CHANGED, active=1)
    assert partial.settings().active == 1
    assert partial.settings().queue == 5


def test_strings_from_the_environment_are_accepted() -> None:
    h = Harness({k: str(v) for k, v in ALL_CHANGED.items()})
    assert h.settings() == ALL_CHANGED_SETTINGS
    assert Harness({"REACHLIMIT_ACTIVE": "4"}).settings().active == 4
    for text, value in [("true", True), ("1", True), ("yes", True), ("0", False), ("off", False)]:
        h = Harness({"REACHLIMIT_CANCEL_ON_DISCONNECT": text})
        assert h.settings().cancel_on_disconnect is value


BAD_VALUES = [
    ("REACHLIMIT_ACTIVE", 0, r"REACHLIMIT_ACTIVE must be a whole number >= 1, got 0"),
    ("REACHLIMIT_ACTIVE", "two", r"REACHLIMIT_ACTIVE must be a whole number >= 1"),
    ("REACHLIMIT_ACTIVE", True, r"REACHLIMIT_ACTIVE must be a whole number >= 1"),
    # Passes the digit check once its signs are stripped, but int() refuses it.
    ("REACHLIMIT_ACTIVE", "+-4", r"REACHLIMIT_ACTIVE must be a whole number >= 1"),
    ("REACHLIMIT_QUEUE", -1, r"REACHLIMIT_QUEUE must be a whole number >= 0, got -1"),
    ("REACHLIMIT_QUEUE", "-1", r"REACHLIMIT_QUEUE must be a whole number >= 0"),
    ("REACHLIMIT_WAIT", 0, r"REACHLIMIT_WAIT must be a number of seconds > 0, got 0"),
    ("REACHLIMIT_WAIT", "abc", r"REACHLIMIT_WAIT must be a number of seconds > 0"),
    ("REACHLIMIT_WAIT", "inf", r"REACHLIMIT_WAIT must be a number of seconds > 0"),
    ("REACHLIMIT_RETRY_AFTER", 0, r"REACHLIMIT_RETRY_AFTER must be a whole number >= 1"),
    ("REACHLIMIT_STATUS", 500, r"REACHLIMIT_STATUS must be 429 or 503, got 500"),
    # Not a number at all: the message should still give the allowed values.
    ("REACHLIMIT_STATUS", "abc", r"REACHLIMIT_STATUS must be 429 or 503"),
    (
        "REACHLIMIT_CANCEL_ON_DISCONNECT",
        "maybe",
        r"REACHLIMIT_CANCEL_ON_DISCONNECT must be true or false, got 'maybe'",
    ),
    ("REACHLIMIT_CACHE_SIZE", 0, r"REACHLIMIT_CACHE_SIZE must be a whole number >= 1"),
    ("REACHLIMIT_CACHE_TTL", -1, r"REACHLIMIT_CACHE_TTL must be a number of seconds > 0"),
]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    BAD_VALUES,
    ids=[f"{key.removeprefix('REACHLIMIT_')}={value!r}" for key, value, _ in BAD_VALUES],
)
def test_bad_value_fails_init_app_naming_the_key_and_range(
    key: str, value: Any, message: str
) -> None:
    app = Flask("bad")
    app.config[key] = value
    rl = ReachLimit()
    with pytest.raises(ValueError, match=message):
        rl.init_app(app)
    assert "reachlimit" not in app.extensions


def test_unknown_constructor_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="actve"):
        ReachLimit(actve=3)
    with pytest.raises(TypeError, match="REACHLIMIT_ACTIVE"):
        ReachLimit(REACHLIMIT_ACTIVE=3)  # config keys are not constructor options


# -- several apps, no stored app ------------------------------------------------------------


@pytest.mark.parametrize("added", ["before", "after"])
def test_cache_status_is_sent_past_a_middleware_added_before_or_after_init_app(
    added: str,
) -> None:
    """Cache-Status is added to the headers as the answer is sent, by the extension's own
    wrapper of ``app.wsgi_app``: a middleware the app adds (ProxyFix here) before or after
    ``init_app`` works as it did, and a Cache-Status the view set stays first."""
    app = Flask(f"middleware-{added}")
    rl = ReachLimit()
    if added == "before":
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    rl.init_app(app)
    if added == "after":
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    clients: list[str | None] = []

    @app.get("/r/<key>")
    def report(key: str) -> Any:
        clients.append(request.remote_addr)
        return rl.cold(key, lambda: {"key": key})

    @app.get("/upstream")
    def upstream() -> Any:
        return Response(rl.cold("u", lambda: "u"), headers=[("Cache-Status", "edge; hit")])

    client = app.test_client()
    forwarded = {"X-Forwarded-For": "203.0.113.7"}
    first, second = (client.get("/r/k", headers=forwarded) for _ in range(2))
    assert first.headers.getlist("Cache-Status") == ["reachlimit; fwd=uri-miss; stored"]
    [hit] = second.headers.getlist("Cache-Status")
    assert hit.startswith("reachlimit; hit; ttl=") and second.get_json() == {"key": "k"}
    assert clients == ["203.0.113.7"] * 2
    statuses = client.get("/upstream").headers.getlist("Cache-Status")
    assert statuses == ["edge; hit", "reachlimit; fwd=uri-miss; stored"]
    assert "Cache-Status" not in client.get("/r").headers  # (a 404: no view called cold())


def test_several_apps_each_get_their_own_state() -> None:
    rl = ReachLimit()
    a = Harness({"REACHLIMIT_ACTIVE": 1, "REACHLIMIT_QUEUE": 0}, rl=rl, name="a")
    b = Harness({"REACHLIMIT_ACTIVE": 3}, rl=rl, name="b")
    assert (a.settings().active, b.settings().active) == (1, 3)
    assert a.path is not b.path
    assert a.path.cache is not b.path.cache
    assert a.limiter is not b.limiter

    assert a.get("k").status_code == 200
    assert b.get("k").status_code == 200  # b's cache is its own: b builds too
    assert a.get("k").status_code == 200  # a warm hit in a
    assert (a.built, b.built) == (["k"], ["k"])

    with slots_held(a.limiter):  # a is saturated; b is not touched by it
        assert_refusal(a.get("new"))
        assert b.get("new").status_code == 200
    sa, sb = a.stats(), b.stats()
    assert (sa["hits"], sa["builds"], sa["rejected_full"]) == (1, 1, 1)
    assert (sb["hits"], sb["builds"], sb["rejected_full"]) == (0, 2, 0)


def _flask_apps_reachable(root: object, depth: int = 6) -> list[str]:
    """Paths from ``root`` to a Flask app (or a weak reference to one) through attributes,
    slots and container items."""
    found: list[str] = []
    seen: set[int] = set()

    def walk(obj: object, where: str, depth: int) -> None:
        if id(obj) in seen or depth < 0:
            return
        seen.add(id(obj))
        if isinstance(obj, Flask):
            found.append(where)
            return
        if isinstance(obj, weakref.ReferenceType):
            walk(obj(), f"{where}()", depth - 1)
            return
        if isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, f"{where}[key]", depth - 1)
                walk(v, f"{where}[{k!r}]", depth - 1)
            return
        if isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]", depth - 1)
            return
        for name in getattr(obj, "__dict__", {}):
            walk(getattr(obj, name), f"{where}.{name}", depth - 1)
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if hasattr(obj, name):
                    walk(getattr(obj, name), f"{where}.{name}", depth - 1)

    walk(root, "rl", depth)
    return found


def test_the_extension_never_stores_the_app() -> None:
    rl = ReachLimit(active=1)
    apps = [Harness(rl=rl, name=f"app{i}") for i in range(2)]
    for h in apps:
        assert h.get("k").status_code == 200
    assert _flask_apps_reachable(rl) == []

    def served_once() -> weakref.ReferenceType[Flask]:
        h = Harness(rl=rl, name="short-lived")
        assert h.get("k").status_code == 200
        return weakref.ref(h.app)

    app_ref = served_once()
    gc.collect()
    assert app_ref() is None  # the extension (still alive) kept nothing of it


# -- followers, errors, not-found -----------------------------------------------------------


class HeldDoor:
    """A duck-typed limiter in front of the real one: the leader stops at the door until the
    test opens it, then goes on to the real limiter."""

    def __init__(self, inner: ColdLimiter) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.door = threading.Event()
        self.calls = 0

    def acquire(self, cancel: Any = None, client: Any = None) -> Grant:
        self.calls += 1
        self.entered.set()
        assert self.door.wait(DEADLINE), "the test never opened the door"
        return self.inner.acquire(cancel, client)

    def stats(self) -> Any:
        return self.inner.stats()


def test_followers_of_a_refused_leader_all_get_the_same_429() -> None:
    h = Harness({"REACHLIMIT_ACTIVE": 1, "REACHLIMIT_QUEUE": 1, "REACHLIMIT_WAIT": 0.05})
    real = h.limiter
    door = HeldDoor(real)
    h.path.limiter = door
    requests = Requests(h.app)
    with slots_held(real):
        requests.start("/report/k")
        assert door.entered.wait(DEADLINE)  # the leader holds the key's flight
        for _ in range(5):
            requests.start("/report/k")
        wait_until("5 followers attached", lambda: h.followers("k") == 5)
        # The leader now queues behind the held slot, times out, and is refused.
        door.door.set()
        responses = requests.results()
        stats = real.stats()

    assert [r.status_code for r in responses] == [429] * 6
    for r in responses:
        assert_refusal(r)
    assert len({r.data for r in responses}) == 1
    assert door.calls == 1  # only the leader reached the limiter; followers took no place
    assert (stats.rejected_timeout, stats.rejected_full, stats.queued) == (1, 0, 0)
    assert h.built == []
    h.path.limiter = real
    assert h.get("k").status_code == 200  # the refusal was not cached


def test_refusal_stays_json_past_the_apps_error_handlers() -> None:
    h = Harness({"REACHLIMIT_QUEUE": 0})
    seen: list[str] = []

    @h.app.errorhandler(429)
    def too_many(e: Exception) -> Any:
        seen.append("429")
        return "custom 429 page", 429

    @h.app.errorhandler(Exception)
    def anything(e: Exception) -> Any:
        seen.append(type(e).__name__)
        return "custom error page", 500

    @h.app.get("/limited")
    def limited() -> Any:
        abort(429)

    with slots_held(h.limiter):
        refused = h.get("k")
    assert_refusal(refused)
    assert seen == []
    # The handlers themselves are live: the app's own 429 still goes through them.
    assert h.app.test_client().get("/limited").data == b"custom 429 page"
    assert seen == ["429"]


def test_build_error_reaches_the_apps_500_handler_uncached_and_frees_the_slot() -> None:
    h = Harness()

    @h.app.errorhandler(500)
    def server_error(e: Any) -> Any:
        cause = type(e.original_exception).__name__
        return jsonify(error="custom 500", cause=cause), 500

    started, go_on = threading.Event(), threading.Event()

    def failing_scan() -> Any:
        started.set()
        assert go_on.wait(DEADLINE)
        raise RuntimeError("scan failed")

    h.hooks["bad"] = failing_scan
    requests = Requests(h.app)
    requests.start("/report/bad")
    assert started.wait(DEADLINE)
    for _ in range(3):
        requests.start("/report/bad")
    wait_until("3 followers attached", lambda: h.followers("bad") == 3)
    go_on.set()
    responses = requests.results()

    expected = {"error": "custom 500", "cause": "RuntimeError"}
    assert [(r.status_code, r.get_json()) for r in responses] == [(500, expected)] * 4
    stats = h.stats()
    assert (stats["active"], stats["builds"]) == (0, 1)  # one build; its slot came back
    # Not cached: the next request builds again (and fails again).
    assert (h.get("bad").status_code, h.built) == (500, ["bad", "bad"])
    del h.hooks["bad"]
    assert h.get("bad").status_code == 200
    assert h.stats()["active"] == 0


def test_not_found_passes_through_and_is_not_cached() -> None:
    h = Harness()
    h.hooks["ghost"] = lambda: NOT_FOUND
    first, second = h.get("ghost"), h.get("ghost")
    assert first.status_code == second.status_code == 404
    assert h.built == ["ghost", "ghost"]
    stats = h.stats()
    assert (stats["hits"], stats["builds"], stats["active"]) == (0, 2, 0)


# -- health, misuse, housekeeping -----------------------------------------------------------


def test_health_view() -> None:
    h = Harness()
    h.get("a")
    h.get("a")
    resp = h.app.test_client().get("/health")
    assert resp.status_code == 200
    assert resp.mimetype == "application/json"
    assert resp.headers["Cache-Control"] == "no-store"
    body = resp.get_json()
    assert body["status"] == "ok"
    reach = body["reach"]
    for name in sorted(LIMITER_FIELDS | PATH_FIELDS):
        assert name in reach, name
    assert (reach["capacity_active"], reach["capacity_queue"], reach["wait"]) == (2, 8, 3.0)
    assert (reach["hits"], reach["misses"], reach["builds"], reach["acquired"]) == (1, 1, 1, 1)
    assert (reach["active"], reach["queued"]) == (0, 0)


def test_cold_without_init_app_is_a_runtime_error() -> None:
    rl = ReachLimit()
    app = Flask("never-initialised")
    calls: list[int] = []
    with app.test_request_context("/"):
        with pytest.raises(RuntimeError, match="init_app"):
            rl.cold("k", lambda: calls.append(1))
        with pytest.raises(RuntimeError, match="init_app"):
            rl.stats()
    with pytest.raises(RuntimeError):  # and outside any app context at all
        rl.cold("k", lambda: calls.append(1))
    assert calls == []


def test_clear_cache() -> None:
    h = Harness()
    h.get("a")
    h.get("a")
    assert h.built == ["a"]
    with h.app.app_context():
        h.rl.clear_cache()
    assert h.get("a").get_json() == {"key": "a", "build": 2}
    assert h.built == ["a", "a"]


@pytest.mark.parametrize("status", [429, 503])
def test_refusal_stays_json_past_blueprint_handlers_and_trapping(status: int) -> None:
    from flask import Blueprint
    from werkzeug.exceptions import HTTPException

    h = Harness({"REACHLIMIT_QUEUE": 0, "REACHLIMIT_STATUS": status,
                 "TRAP_HTTP_EXCEPTIONS": True})
    seen: list[str] = []
    bp = Blueprint("reports", __name__)

    @bp.get("/bp/<key>")
    def bp_report(key: str) -> Any:
        return jsonify(h.rl.cold(key, lambda: {"key": key}))

    for registered in (429, 503, HTTPException, Exception):
        def handler(e: Exception, registered: object = registered) -> Any:
            seen.append(f"blueprint {registered}")
            return "custom page", 500

        bp.register_error_handler(registered, handler)

    @h.app.errorhandler(HTTPException)
    def app_http(e: HTTPException) -> Any:
        seen.append("app HTTPException")
        return "custom page", 500

    @h.app.after_request
    def stamp(response: Any) -> Any:
        response.headers["X-Seen-By-App"] = "yes"
        return response

    h.app.register_blueprint(bp)
    with slots_held(h.limiter):
        refused = h.app.test_client().get("/bp/k")
    assert_refusal(refused, status)
    assert refused.headers["Content-Length"] == str(len(refused.data))
    assert refused.headers["X-Seen-By-App"] == "yes"  # after_request hooks still run
    assert seen == []



# -- misuse and edges -----------------------------------------------------------------------


def test_unknown_options_are_named_with_every_known_one() -> None:
    from reachlimit.flask import CONFIG_KEYS

    with pytest.raises(TypeError) as info:
        ReachLimit(queu=1, activ=2)
    unknown, known = str(info.value).split("; known: ")
    assert unknown == "unknown ReachLimit option(s): activ, queu"
    options = sorted(k.removeprefix("REACHLIMIT_").lower() for k in CONFIG_KEYS)
    assert known.split(", ") == [o for o in options if o != "budgets"]


def test_the_default_budgets_handle_is_the_extensions_own() -> None:
    h = Harness()
    default = h.rl.budget("default")
    assert default.name == "default" and h.rl.budget("default") is default
    with h.app.test_request_context("/"):
        assert default.cold("k", lambda: {"v": 1}) == {"v": 1}
        assert default.stats() == h.rl.stats() and default.path is h.rl.path


def test_close_on_an_app_never_initialised_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="ReachLimit is not initialised on this app"):
        ReachLimit().close(Flask("never"))


def test_a_value_outside_the_rule_is_named_by_its_key() -> None:
    h = Harness()
    with h.app.test_request_context("/"), pytest.raises(TypeError) as info:
        h.rl.cold("odd", lambda: {1, 2})
    assert str(info.value).startswith("the value built for key 'odd' is a set, which ")


def test_a_disabled_budget_calls_the_client_callable_with_the_request() -> None:
    asked: list[str] = []

    def client(request: Any) -> str:
        asked.append(request.path)
        return "someone"

    h = Harness(enabled=False, client=client)
    assert h.get("x").get_json() == {"key": "x", "build": 1}
    assert asked == ["/report/x"]
