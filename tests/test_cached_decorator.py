"""``@rl.cached()`` and ``@budget.cached()`` through Flask's test client: the view is the build,
its value the answer (JSON, text, bytes, or the decorator's mimetype) with Cache-Status; the
default key is the endpoint, the path and the query pairs sorted by name; a given key takes
the view's arguments; refusals, NOT_FOUND and view errors as with ``cold()``; a herd builds
once; a stale answer's refresh re-runs the view in a request context of the same path and
query. Flask's other return forms (tuples, Response objects, statuses other than 200) are
tests/test_cached_return_forms.py's.

Builds that must be held wait on an Event the test sets; a stale entry is made by moving an
injected clock, never by sleeping; a refresh is waited for through the refresher.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from flask import Flask, request
from werkzeug.test import EnvironBuilder

from reachlimit import NOT_FOUND, TTLCache
from reachlimit.flask import ReachLimit
from tests.support.clock import FakeClock
from tests.support.flask_ext import HeldView, one_view_app
from tests.support.refreshes import refreshing
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner, start_call
from tests.support.waiting import wait_until
from tests.test_budgets import get_while_full

pytestmark = pytest.mark.timeout(30)


def make(**overrides: Any) -> tuple[Flask, ReachLimit, list[str]]:
    """An app whose decorated views record each run in the returned list."""
    app = Flask("cached")
    rl = ReachLimit(app, **overrides)
    runs: list[str] = []

    @app.get("/json/<int:n>")
    @rl.cached()
    def as_json(n: int) -> Any:
        runs.append(f"json {n} {sorted(request.args.items(multi=True))}")
        return {"n": n, "pair": (1, 2), 3: "int key"}

    @app.get("/text")
    @rl.cached()
    def as_text() -> Any:
        runs.append("text")
        return "plain words"

    @app.get("/bytes")
    @rl.cached()
    def as_bytes() -> Any:
        runs.append("bytes")
        return b"\x00\xff"

    @app.get("/csv")
    @rl.cached(mimetype="text/csv")
    def as_csv() -> Any:
        runs.append("csv")
        return "a,b\n"

    @app.get("/by-id/<item>")
    @rl.cached(key=lambda item: item.lower())
    def by_id(item: str) -> Any:
        runs.append(f"by-id {item}")
        return {"item": item}

    @app.get("/missing")
    @rl.cached()
    def missing() -> Any:
        runs.append("missing")
        return NOT_FOUND

    @app.get("/broken")
    @rl.cached()
    def broken() -> Any:
        runs.append("broken")
        raise RuntimeError("the view failed")

    @app.get("/set")
    @rl.cached()
    def a_set() -> Any:
        runs.append("set")
        return {1, 2}

    return app, rl, runs


def test_the_second_answer_is_the_cached_first_with_its_cache_status() -> None:
    app, _, runs = make()
    first = app.test_client().get("/json/1")
    second = app.test_client().get("/json/1")
    assert first.status_code == second.status_code == 200
    assert first.mimetype == "application/json"
    # The value rule: a tuple is a list and an int key a str key, from the first answer.
    assert first.get_json() == second.get_json() == {"n": 1, "pair": [1, 2], "3": "int key"}
    assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    assert second.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
    assert runs == ["json 1 []"]


def test_the_query_string_in_any_order_is_one_key_and_another_value_another() -> None:
    app, _, runs = make()
    one = app.test_client().get("/json/2?a=1&b=2")
    two = app.test_client().get("/json/2?b=2&a=1")
    other = app.test_client().get("/json/2?a=1&b=3")
    assert two.headers["Cache-Status"].startswith("reachlimit; hit")
    assert other.headers["Cache-Status"].endswith("stored")
    assert one.get_json() == two.get_json()
    assert runs == ["json 2 [('a', '1'), ('b', '2')]", "json 2 [('a', '1'), ('b', '3')]"]


def test_the_key_takes_the_query_as_sent_so_two_spellings_are_two_entries() -> None:
    """The key is not parsed out of the query (that is what a refusal's key would cost most):
    the pairs as sent, sorted; an empty pair changes nothing, another spelling is a build."""
    app, _, runs = make()
    client = app.test_client()
    first = client.get("/json/3?q=a+b")
    again = client.get("/json/3?&q=a+b&")
    spelled = client.get("/json/3?q=a%20b")
    assert first.headers["Cache-Status"].endswith("stored")
    assert again.headers["Cache-Status"].startswith("reachlimit; hit")
    assert spelled.headers["Cache-Status"].endswith("stored")
    assert first.get_json() == spelled.get_json()  # the same answer, built twice
    assert runs == ["json 3 [('q', 'a b')]", "json 3 [('q', 'a b')]"]


def test_repeated_names_keep_their_order_in_the_key() -> None:
    """Sorted by name only: ?tag=a&tag=b and ?tag=b&tag=a ask different things of getlist."""
    app, _, _ = one_view_app(lambda: {"tags": request.args.getlist("tag")}, "/tags")
    client = app.test_client()
    assert client.get("/tags?tag=a&tag=b&x=1").get_json() == {"tags": ["a", "b"]}
    assert client.get("/tags?tag=b&tag=a&x=1").get_json() == {"tags": ["b", "a"]}
    again = client.get("/tags?x=1&tag=b&tag=a")
    assert again.get_json() == {"tags": ["b", "a"]}
    assert again.headers["Cache-Status"].startswith("reachlimit; hit")


def test_views_of_one_factory_keep_their_own_entries() -> None:
    """Two views made by one function share a qualified name; their endpoints tell them
    apart, with a given key too."""
    app = Flask("factory")
    rl = ReachLimit(app)

    def register(kind: str) -> None:
        def show(n: int) -> Any:
            return {"kind": kind, "n": n}

        view = rl.cached(key=lambda n: n)(show)
        app.add_url_rule(f"/{kind}/<int:n>", endpoint=kind, view_func=view)

    register("users")
    register("orders")
    client = app.test_client()
    assert client.get("/users/5").get_json() == {"kind": "users", "n": 5}
    assert client.get("/orders/5").get_json() == {"kind": "orders", "n": 5}


def test_a_refresh_gets_the_query_as_the_server_gave_it() -> None:
    """Raw UTF-8 bytes in the query (as curl sends them) reach the refreshed view as they
    reached the first one: the refresh is not a differently decoded request."""
    clock = FakeClock(1000.0)
    rl = ReachLimit(cache_ttl=10, stale=30)
    app = Flask("raw")
    rl.init_app(app)
    seen: list[str | None] = []

    @app.get("/q")
    @rl.cached()
    def q() -> Any:
        seen.append(request.args.get("q"))
        return {"q": request.args.get("q")}

    with app.test_request_context():
        path = rl.path
    path.cache = TTLCache(64, 10.0, stale=30.0, clock=clock)
    raw = "q=\u00e9".encode().decode("latin-1")  # the WSGI text of the bytes q=\xc3\xa9
    try:
        first = app.test_client().get("/q", environ_overrides={"QUERY_STRING": raw})
        assert first.get_json() == {"q": "\u00e9"}
        clock.advance(12)
        app.test_client().get("/q", environ_overrides={"QUERY_STRING": raw})
        key = ("q", "/q", (raw,))
        wait_until("the refresh", lambda: len(seen) == 2 and not refreshing(path.refresher, key))
        assert seen == ["\u00e9", "\u00e9"]
        assert app.test_client().get(
            "/q", environ_overrides={"QUERY_STRING": raw}
        ).get_json() == {"q": "\u00e9"}
    finally:
        rl.close(app)


def test_text_bytes_and_a_given_mimetype() -> None:
    app, _, _ = make()
    client = app.test_client()
    text, octets, csv = client.get("/text"), client.get("/bytes"), client.get("/csv")
    assert (text.content_type, text.get_data()) == ("text/plain; charset=utf-8", b"plain words")
    assert (octets.content_type, octets.get_data()) == ("application/octet-stream", b"\x00\xff")
    assert (csv.content_type, csv.get_data()) == ("text/csv; charset=utf-8", b"a,b\n")
    again = client.get("/bytes")
    assert again.get_data() == b"\x00\xff" and again.headers["Cache-Status"].startswith(
        "reachlimit; hit"
    )


def test_a_given_key_takes_the_views_arguments() -> None:
    app, _, runs = make()
    assert app.test_client().get("/by-id/ABC").get_json() == {"item": "ABC"}
    shared = app.test_client().get("/by-id/abc")
    assert shared.get_json() == {"item": "ABC"}  # one key: item.lower()
    assert shared.headers["Cache-Status"].startswith("reachlimit; hit")
    assert runs == ["by-id ABC"]


def test_not_found_is_a_404_never_cached_and_a_view_error_is_never_cached() -> None:
    app, _, runs = make()
    for _ in range(2):
        assert app.test_client().get("/missing").status_code == 404
        assert app.test_client().get("/broken").status_code == 500
    assert runs == ["missing", "broken", "missing", "broken"]


def test_a_value_outside_the_value_rule_is_a_type_error_naming_the_key_and_the_view() -> None:
    """A Response is one of Flask's return forms (tests/test_cached_return_forms.py); a set
    is no answer at all."""
    app, _, runs = make()
    app.config["PROPAGATE_EXCEPTIONS"] = True
    with pytest.raises(TypeError, match=r"by view .*a_set for key .*'/set'.* set"):
        app.test_client().get("/set")
    with pytest.raises(TypeError):
        app.test_client().get("/set")
    assert runs == ["set", "set"]  # nothing was cached


def test_the_decorator_keeps_the_views_name_and_docstring() -> None:
    rl = ReachLimit()

    def report(day: str) -> str:
        """One day's report."""
        return day

    wrapped = rl.cached()(report)
    assert (wrapped.__name__, wrapped.__doc__) == ("report", "One day's report.")
    assert wrapped.__wrapped__ is report  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="must be a callable"):
        rl.cached(key="day")(report)  # type: ignore[arg-type]


def test_a_budgets_decorator_is_refused_with_429_and_retry_after() -> None:
    rl = ReachLimit()
    exports = rl.budget("exports", active=1, queue=0)
    app = Flask("refused")
    rl.init_app(app)

    @app.get("/export")
    @exports.cached()
    def export() -> Any:
        return {"never": True}

    reply = get_while_full(app, exports, "/export")
    assert reply.status_code == 429 and reply.headers["Retry-After"] == "2"
    assert "'exports'" in reply.get_json()["error"]
    assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"


def test_a_herd_on_a_decorated_view_builds_once(threads: ThreadRunner) -> None:
    view = HeldView(lambda run: {"ok": True}, "/slow")
    leader, followers = view.leader_and_followers(threads, 5)
    view.go.set()
    for outcome in [leader, *followers]:
        outcome.wait_done(JOIN_TIMEOUT)
        assert outcome.error is None and outcome.value.get_json() == {"ok": True}
    assert view.runs == [1]
    statuses = sorted(o.value.headers["Cache-Status"] for o in [leader, *followers])
    assert statuses == ["reachlimit; fwd=uri-miss; collapsed"] * 5 + [
        "reachlimit; fwd=uri-miss; stored"
    ]


def test_a_stale_answers_refresh_reruns_the_view_in_a_request_of_its_path_and_query() -> None:
    clock = FakeClock(1000.0)
    rl = ReachLimit(cache_ttl=10, stale=30)
    app = Flask("refresh")
    rl.init_app(app)
    seen: list[tuple[str, str, str | None]] = []

    @app.get("/day/<day>")
    @rl.cached()
    def day(day: str) -> Any:
        seen.append((day, request.path, request.args.get("lang")))
        return {"day": day, "run": len(seen)}

    with app.test_request_context():
        path = rl.path
    path.cache = TTLCache(64, 10.0, stale=30.0, clock=clock)
    try:
        assert app.test_client().get("/day/mon?lang=fr").get_json() == {"day": "mon", "run": 1}
        clock.advance(12)  # past the TTL, within the stale window
        stale = app.test_client().get("/day/mon?lang=fr")
        assert stale.get_json()["run"] == 1
        assert stale.headers["Cache-Status"].startswith("reachlimit; hit; ttl=-")
        key = ("day", "/day/mon", ("lang=fr",))  # (endpoint, path, the query's pairs)
        assert path.cache.lookup(key) is not None  # the key the refresh is known by
        wait_until("the refresh", lambda: len(seen) == 2 and not refreshing(path.refresher, key))
        assert seen[1] == ("mon", "/day/mon", "fr")  # the refresh saw the path and the query
        fresh = app.test_client().get("/day/mon?lang=fr")
        assert fresh.get_json()["run"] == 2
        assert fresh.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
        assert path.counts().refreshed == 1 and path.counts().refresh_failed == 0
    finally:
        rl.close(app)


def test_a_given_key_follows_the_shared_key_rule_with_or_without_redis() -> None:
    """A float key would work in process and fail on Redis: refused in both, naming the view;
    str, int and tuples of those pass."""
    app = Flask("keys")
    app.testing = True  # the view's exception reaches the test, not a 500 page
    rl = ReachLimit(app)

    @app.get("/f/<float:x>")
    @rl.cached(key=lambda x: x)
    def by_float(x: float) -> Any:
        return {"x": x}

    @app.get("/t/<int:n>")
    @rl.cached(key=lambda n: (n, "t"))
    def by_tuple(n: int) -> Any:
        return {"n": n}

    with pytest.raises(TypeError, match=r"by_float returned a float as the cache key"):
        app.test_client().get("/f/1.5")
    assert app.test_client().get("/t/3").get_json() == {"n": 3}


def test_a_refresh_runs_the_view_under_the_root_url_of_the_request_that_asked() -> None:
    clock = FakeClock(1000.0)
    rl = ReachLimit(cache_ttl=10, stale=30)
    app = Flask("root")
    rl.init_app(app)
    seen: list[str] = []

    @app.get("/where")
    @rl.cached()
    def where() -> Any:
        seen.append(request.url_root)
        return {"root": request.url_root}

    with app.test_request_context():
        path = rl.path
    path.cache = TTLCache(64, 10.0, stale=30.0, clock=clock)
    root = "https://shop.example/app/"
    try:
        assert app.test_client().get("/where", base_url=root).get_json() == {"root": root}
        clock.advance(12)  # stale: this answer hands out a refresh
        app.test_client().get("/where", base_url=root)
        key = ("where", "/where", ())
        wait_until("the refresh", lambda: len(seen) == 2 and not refreshing(path.refresher, key))
        assert seen == [root, root]
    finally:
        rl.close(app)


def test_a_value_outside_the_rule_names_the_views_module_and_the_key_in_a_tuple_too() -> None:
    app = Flask("named")
    app.config["PROPAGATE_EXCEPTIONS"] = True
    rl = ReachLimit(app)

    @app.get("/pair")
    @rl.cached()
    def pair() -> Any:
        return {1, 2}, 200

    class Page:
        """A callable object as a view: it has a module, but no qualified name."""

        def __repr__(self) -> str:
            return "<the page>"

        def __call__(self) -> Any:
            return {3}

    app.add_url_rule("/page", endpoint="page", view_func=rl.cached()(Page()))
    with pytest.raises(TypeError, match=(
        rf"by view {__name__}\.test_a_value_outside_the_rule_names_the_views_module_and_the_key"
        r"_in_a_tuple_too\.<locals>\.pair for key \('pair', '/pair', \(\)\) is a set"
    )):
        app.test_client().get("/pair")
    with pytest.raises(TypeError, match=rf"by view {__name__}\.<the page> for key \('page'"):
        app.test_client().get("/page")


def test_a_follower_whose_second_round_finds_nothing_is_a_404(threads: ThreadRunner) -> None:
    # The first run answers, and never shares it with the follower; then the thing went
    # away: the follower's own run finds nothing.
    view = HeldView(lambda run: ("made", 201) if run == 1 else NOT_FOUND, "/r")
    leader, (follower,) = view.leader_and_followers(threads, 1)
    view.go.set()
    leader.wait_done()
    follower.wait_done()
    assert (leader.value.status_code, follower.value.status_code) == (201, 404)
    assert view.runs == [1, 1]


def test_requests_that_build_answers_of_their_own_never_share_one(threads: ThreadRunner) -> None:
    """Three followers of an answer that may not be shared go round; one of them leads the
    next build and the other two follow it, and that answer may not be shared either: those
    two then build their own answers, each under a key of its own, at the same time."""
    app = Flask("own")
    rl = ReachLimit(app, active=2, queue=8)
    gates = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]
    both_own = threading.Barrier(2, timeout=JOIN_TIMEOUT)
    runs: list[int] = []
    lock = threading.Lock()

    @app.get("/o")
    @rl.cached()
    def o() -> Any:
        with lock:
            runs.append(1)
            run = len(runs)
        if run <= 2:  # the shared rounds' builds, held by the test
            started[run - 1].set()
            assert gates[run - 1].wait(JOIN_TIMEOUT)
        else:
            both_own.wait()  # the two own builds run at once, or this breaks
        return f"run {run}", 201

    with app.test_request_context():
        flight: Any = rl.path.flight

    def followers() -> int:
        return sum(c.followers for c in flight._calls.values())

    first = start_call(threads, lambda: app.test_client().get("/o"), name="first")
    assert started[0].wait(JOIN_TIMEOUT)
    rest = [
        start_call(threads, lambda: app.test_client().get("/o"), name=f"r{i}") for i in range(3)
    ]
    wait_until("three followers of the first build", lambda: followers() == 3)
    gates[0].set()
    assert started[1].wait(JOIN_TIMEOUT)
    wait_until("two followers of the second build", lambda: followers() == 2)
    gates[1].set()
    for outcome in [first, *rest]:
        outcome.wait_done()
        assert outcome.error is None and outcome.value.status_code == 201
    bodies = sorted(outcome.value.get_data() for outcome in [first, *rest])
    assert bodies == [b"run 1", b"run 2", b"run 3", b"run 4"]


def test_a_refresh_of_a_request_whose_server_gave_no_query_string_has_an_empty_one() -> None:
    """PEP 3333 lets a server leave QUERY_STRING out of the environ when there is none."""
    clock = FakeClock(1000.0)
    rl = ReachLimit(cache_ttl=10, stale=30)
    app = Flask("no-query")
    rl.init_app(app)
    seen: list[tuple[bytes, list[tuple[str, str]]]] = []

    @app.get("/bare")
    @rl.cached()
    def bare() -> Any:
        seen.append((request.query_string, list(request.args.items(multi=True))))
        return "bare"

    with app.test_request_context():
        path = rl.path
    path.cache = TTLCache(64, 10.0, stale=30.0, clock=clock)

    def ask() -> bytes:
        environ = EnvironBuilder(path="/bare").get_environ()
        del environ["QUERY_STRING"]
        return b"".join(app.wsgi_app(environ, lambda status, headers, exc_info=None: None))

    try:
        assert ask() == b"bare"
        clock.advance(12)  # stale: this answer hands out a refresh
        assert ask() == b"bare"
        key = ("bare", "/bare", ())
        wait_until("the refresh", lambda: len(seen) == 2 and not refreshing(path.refresher, key))
        assert seen == [(b"", []), (b"", [])]
        assert path.counts().refreshed == 1
    finally:
        rl.close(app)
