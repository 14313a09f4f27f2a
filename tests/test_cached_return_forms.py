"""``@rl.cached`` meets every answer a Flask view gives: each return form Flask takes, answered
as Flask would answer it; only a 200 without a cookie cached, whole (status, headers, body),
and replayed exactly but for hop-by-hop headers, Content-Length and our own Cache-Status; any
other answer the answer of the request that built it alone (never cached, never shared with
a follower); a streamed response a TypeError naming the view; a value in the cache that is
not a replay rebuilt, never a 500; the bare decorator; and ``view.forget``. The last part runs
the same on a real redis-server, with two app objects on one Redis as two processes.

Builds that must be held wait on an Event the test sets; a follower is seen in the flight
before the leader is let go; the first level's copy on Redis is awaited, never slept on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask, Response, redirect, request

from reachlimit import NOT_FOUND, TTLCache
from reachlimit._cached import MAGIC, SHARED_ROUNDS
from reachlimit.flask import ReachLimit
from tests.support.clock import FakeClock
from tests.support.flask_ext import HeldView, one_view_app
from tests.support.redis_server import RedisServer
from tests.support.refreshes import refreshing
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner
from tests.support.waiting import wait_until
from tests.test_cached_decorator import make as decorated_views_app

pytestmark = pytest.mark.timeout(60)

#: What each form's view returns, by route name: (return value maker, the first answer's
#: status, its Content-Type, its body, the X-Mine header it carries or None).
FORMS: dict[str, tuple[Callable[[], Any], int, str, bytes, str | None]] = {
    "json": (lambda: {"n": 1, "pair": (1, 2)}, 200, "application/json",
             b'{"n":1,"pair":[1,2]}\n', None),
    "text": (lambda: "plain words", 200, "text/plain; charset=utf-8", b"plain words", None),
    "bytes": (lambda: b"\x00\xff", 200, "application/octet-stream", b"\x00\xff", None),
    "body-status": (lambda: ("hello", 200), 200, "text/plain; charset=utf-8", b"hello", None),
    "body-headers-dict": (lambda: ({"a": 1}, {"X-Mine": "1"}), 200, "application/json",
                          b'{"a":1}\n', "1"),
    "body-headers-list": (lambda: (b"raw", [("X-Mine", "2")]), 200,
                          "application/octet-stream", b"raw", "2"),
    "body-status-headers": (lambda: ("hi", 200, {"X-Mine": "3", "Content-Type": "text/csv"}),
                            200, "text/csv", b"hi", "3"),
    "reason-phrase": (lambda: ("fine", "200 Fine Indeed"), 200, "text/plain; charset=utf-8",
                      b"fine", None),
    "response": (lambda: Response("<p>x</p>", headers={"X-Mine": "4"}), 200,
                 "text/html; charset=utf-8", b"<p>x</p>", "4"),
    "response-in-tuple": (lambda: (Response("r", mimetype="text/plain"), {"X-Mine": "5"}), 200,
                          "text/plain; charset=utf-8", b"r", "5"),
}

#: Answers that are never cached: (return value maker, status, body).
UNCACHED: dict[str, tuple[Callable[[], Any], int, bytes]] = {
    "created": (lambda: ({"created": "1"}, 201), 201, b'{"created":"1"}\n'),
    "accepted": (lambda: ("hello", 202, {"X-Mine": "1"}), 202, b"hello"),
    "no-content": (lambda: ("", 204), 204, b""),
    "redirect": (lambda: redirect("/elsewhere"), 302, None),  # type: ignore[dict-item]
    "gone": (lambda: ({"error": "gone"}, 404), 404, b'{"error":"gone"}\n'),
    "failed": (lambda: ({"error": "down"}, 500), 500, b'{"error":"down"}\n'),
    "cookie": (lambda: _with_cookie("1"), 200, b"with a cookie"),
}


def _with_cookie(value: str) -> Response:
    response = Response("with a cookie", mimetype="text/plain")
    response.set_cookie("session", value)
    return response


def forms_app(**overrides: Any) -> tuple[Flask, ReachLimit, list[str]]:
    """An app with one decorated view per form of FORMS and UNCACHED; each run recorded."""
    app = Flask("forms")
    rl = ReachLimit(app, **overrides)
    runs: list[str] = []

    def register(name: str, make: Callable[[], Any]) -> None:
        def view() -> Any:
            runs.append(name)
            return make()

        app.add_url_rule(f"/{name}", endpoint=name, view_func=rl.cached()(view))

    for name, form in FORMS.items():
        register(name, form[0])
    for name, (make, _, _) in UNCACHED.items():
        register(name, make)
    return app, rl, runs


# -- every return form ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FORMS))
def test_every_return_form_is_answered_and_its_hit_replays_it_whole(name: str) -> None:
    app, _, runs = forms_app()
    _, status, content_type, body, mine = FORMS[name]
    first = app.test_client().get(f"/{name}")
    hit = app.test_client().get(f"/{name}")
    for reply in (first, hit):
        assert (reply.status_code, reply.content_type, reply.get_data()) == (
            status, content_type, body
        )
        assert reply.headers.get("X-Mine") == mine
        assert reply.headers["Content-Length"] == str(len(body))
    assert first.status == hit.status  # the reason phrase too
    assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
    assert hit.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
    assert runs == [name]  # the hit ran nothing


def test_a_reason_phrase_is_replayed_as_the_view_gave_it() -> None:
    app, _, _ = forms_app()
    app.test_client().get("/reason-phrase")
    assert app.test_client().get("/reason-phrase").status == "200 Fine Indeed"


def test_a_tuple_is_flasks_tuple_form_never_a_json_list() -> None:
    app = Flask("tuples")
    app.testing = True
    rl = ReachLimit(app)

    @app.get("/made/<k>")
    @rl.cached()
    def made(k: str) -> Any:
        return {"created": k}, 201

    @app.get("/four")
    @rl.cached()
    def four() -> Any:
        return (1, 2, 3, 4)

    reply = app.test_client().get("/made/1")
    assert (reply.status_code, reply.get_json()) == (201, {"created": "1"})
    with pytest.raises(TypeError, match=r"view .*four returned a tuple of 4 items"):
        app.test_client().get("/four")


@pytest.mark.parametrize("name", list(UNCACHED))
def test_any_other_answer_is_answered_as_returned_and_never_cached(name: str) -> None:
    app, _, runs = forms_app()
    _, status, body = UNCACHED[name]
    for _ in range(2):
        reply = app.test_client().get(f"/{name}")
        assert reply.status_code == status
        if body is not None:
            assert reply.get_data() == body
        # Built, not stored: never "stored", never a hit.
        assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss"
    assert runs == [name, name]  # the second request ran the view again
    with app.test_request_context():
        assert len(app.extensions["reachlimit"].path.cache) == 0


def test_an_uncached_answer_keeps_its_status_headers_and_cookie() -> None:
    app, _, _ = forms_app()
    accepted = app.test_client().get("/accepted")
    assert (accepted.status_code, accepted.headers["X-Mine"]) == (202, "1")
    moved = app.test_client().get("/redirect")
    assert moved.headers["Location"] == "/elsewhere"
    cookie = app.test_client().get("/cookie")
    assert cookie.headers["Set-Cookie"].startswith("session=1")


@pytest.mark.parametrize("status", [200, 201, 404])
def test_an_uncached_answer_is_never_shared_with_a_concurrent_follower(
    threads: ThreadRunner, status: int
) -> None:
    """A follower held behind a leader whose answer may not be shared (a cookie, a 201, a
    404) goes round and runs its own view: each request answers its own."""

    def mine(run: int) -> Response:
        response = Response(f"run {run}", status=status, mimetype="text/plain")
        if status == 200:
            response.set_cookie("session", f"s{run}")
        return response

    view = HeldView(mine, "/mine")
    leader, (follower,) = view.leader_and_followers(threads, 1)
    view.go.set()
    leader.wait_done(JOIN_TIMEOUT)
    follower.wait_done(JOIN_TIMEOUT)
    assert leader.error is None and follower.error is None
    assert leader.value.get_data() == b"run 1" and follower.value.get_data() == b"run 2"
    assert {leader.value.status_code, follower.value.status_code} == {status}
    if status == 200:
        assert leader.value.headers["Set-Cookie"].startswith("session=s1")
        assert follower.value.headers["Set-Cookie"].startswith("session=s2")
    assert view.runs == [1, 1]
    assert follower.value.headers["Cache-Status"] == "reachlimit; fwd=uri-miss"


def test_not_found_alone_is_still_a_404_shared_and_never_cached() -> None:
    app, _, runs = one_view_app(lambda: NOT_FOUND, "/nf")
    assert [app.test_client().get("/nf").status_code for _ in range(2)] == [404, 404]
    assert runs == [1, 1]


def test_hop_by_hop_headers_content_length_and_our_cache_status_are_not_replayed() -> None:
    app, _, _ = one_view_app(lambda: Response("body", headers=[
        ("X-Mine", "kept"), ("Connection", "close, X-Private"), ("X-Private", "p"),
        ("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic"), ("TE", "trailers"),
        ("Trailer", "X-Sum"), ("Upgrade", "h2c"), ("Content-Length", "999"),
        ("Cache-Status", "upstream; hit, reachlimit; hit; ttl=9"),
        ("Link", "</a>; rel=preload"), ("Link", "</b>; rel=preload"),
    ]), "/hops")
    first = app.test_client().get("/hops")
    assert first.headers["X-Private"] == "p"  # the request that built it: as returned
    hit = app.test_client().get("/hops")
    assert hit.get_data() == b"body" and hit.headers["X-Mine"] == "kept"
    for name in ("Connection", "X-Private", "Keep-Alive", "Proxy-Authenticate", "TE",
                 "Trailer", "Upgrade"):
        assert name not in hit.headers, name
    assert hit.headers["Content-Length"] == "4"
    assert hit.headers.getlist("Link") == first.headers.getlist("Link") == [
        "</a>; rel=preload", "</b>; rel=preload"
    ]  # a header given twice is replayed twice, in order
    # The upstream's member stays, ours is this answer's alone.
    statuses = hit.headers.getlist("Cache-Status")
    assert statuses[0] == "upstream; hit"
    assert len(statuses) == 2 and statuses[1].startswith("reachlimit; hit; ttl=")


def test_a_streamed_response_is_a_type_error_naming_the_view_and_nothing_is_cached() -> None:
    app = Flask("streams")
    app.testing = True
    rl = ReachLimit(app)
    runs: list[str] = []

    def chunks() -> Iterator[bytes]:
        yield b"a"

    @app.get("/gen")
    @rl.cached()
    def gen() -> Any:
        runs.append("gen")
        return chunks()

    @app.get("/streamed")
    @rl.cached()
    def streamed() -> Any:
        runs.append("streamed")
        return Response(chunks())

    @app.get("/in-tuple")
    @rl.cached()
    def in_tuple() -> Any:
        runs.append("in-tuple")
        return chunks(), 200

    for url, view in (("/gen", "gen"), ("/streamed", "streamed"), ("/in-tuple", "in_tuple")):
        for _ in range(2):
            with pytest.raises(TypeError, match=rf"view .*\.{view} returned a streamed"):
                app.test_client().get(url)
    assert runs == ["gen", "gen", "streamed", "streamed", "in-tuple", "in-tuple"]


def test_a_view_returning_none_is_a_type_error_naming_it() -> None:
    app, _, runs = one_view_app(lambda: None, "/none")
    app.testing = True  # the error reaches the test, as Flask's own for a view's None
    with pytest.raises(TypeError, match=r"view tests\.support\.flask_ext\..*view returned None"):
        app.test_client().get("/none")
    assert runs == [1]


# -- a refresh keeps the same rules -----------------------------------------------------------


def test_a_refresh_caches_the_whole_answer_and_never_a_non_200() -> None:
    clock = FakeClock(1000.0)
    rl = ReachLimit(cache_ttl=10, stale=30)
    app = Flask("refresh")
    rl.init_app(app)
    answers: list[tuple[int, str]] = [(200, "one"), (200, "two"), (404, "gone")]
    runs: list[int] = []

    @app.get("/r")
    @rl.cached()
    def r() -> Any:
        runs.append(1)
        status, word = answers[len(runs) - 1]
        return word, status, {"X-Run": str(len(runs))}

    with app.test_request_context():
        path = rl.path
    path.cache = TTLCache(64, 10.0, stale=30.0, clock=clock)
    key = ("r", "/r", ())
    try:
        assert app.test_client().get("/r").headers["X-Run"] == "1"
        clock.advance(12)  # stale: answered, and refreshed on a refresher thread
        assert app.test_client().get("/r").headers["X-Run"] == "1"
        wait_until("the first refresh",
                   lambda: len(runs) == 2 and not refreshing(path.refresher, key))
        fresh = app.test_client().get("/r")
        assert (fresh.get_data(), fresh.headers["X-Run"]) == (b"two", "2")  # whole, refreshed
        assert fresh.headers["Cache-Status"].startswith("reachlimit; hit; ttl=")
        kept = path.cache.lookup(key)
        assert kept is not None
        clock.advance(12)
        app.test_client().get("/r")
        wait_until("the second refresh",
                   lambda: len(runs) == 3 and not refreshing(path.refresher, key))
        # The refresh's view answered a 404: not cached (the entry is the 200 or gone).
        entry = path.cache.lookup(key)
        assert entry is None or entry.value == kept.value
        assert entry is None or b"gone" not in entry.value
    finally:
        rl.close(app)


# -- a cached value that is not a replay ------------------------------------------------------


def _head(status: Any, headers: Any) -> bytes:
    return json.dumps([status, headers]).encode()


def _replay(head: bytes, body: bytes = b"body") -> bytes:
    return MAGIC + len(head).to_bytes(4, "big") + head + body


HOSTILE = {
    "old-json": {"an": "older version's value"},
    "text": "just text",
    "bytes": b"no magic here",
    "short": MAGIC + b"\x00\x00",
    "too-long": MAGIC + (10_000).to_bytes(4, "big") + b"[]",
    "not-json": _replay(b"{not json"),
    "deep": _replay(b"[" * 100_000 + b"]" * 100_000),
    "a-500": _replay(_head("500 INTERNAL SERVER ERROR", [])),
    "a-cookie": _replay(_head("200 OK", [["Set-Cookie", "admin=1"]])),
    "newline": _replay(_head("200 OK", [["X-A", "1\r\nSet-Cookie: admin=1"]])),
    "bad-name": _replay(_head("200 OK", [["X A", "1"]])),
    "ours": _replay(_head("200 OK", [["Cache-Status", "reachlimit; hit"]])),
    "shape": _replay(_head("200 OK", [["X-A", "1", "extra"]])),
    "a-number": _replay(b"[200, []]"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_cached_value_that_is_not_a_replay_is_rebuilt_never_a_500(name: str) -> None:
    app, rl, runs = one_view_app(lambda: ("built", 200, {"X-Mine": "1"}), "/h")
    with app.test_request_context():
        cache = rl.path.cache
    cache.set(("h", "/h", ()), HOSTILE[name])
    reply = app.test_client().get("/h")
    assert (reply.status_code, reply.get_data(), reply.headers["X-Mine"]) == (200, b"built", "1")
    assert "admin" not in reply.headers.get("Set-Cookie", "")
    assert runs == [1]
    again = app.test_client().get("/h")  # the rebuilt entry is a replay
    assert again.get_data() == b"built" and again.headers["Cache-Status"].startswith(
        "reachlimit; hit"
    )
    assert runs == [1]


class StuckCache:
    """A plain get/set cache that answers a value no replay is for the view's key whatever
    is done to it (no forget): the pathological case the rounds are bounded for."""

    def __init__(self) -> None:
        self.gets: list[Any] = []
        self.stored: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        self.gets.append(key)
        return b"stuck" if key == ("s", "/s", ()) else self.stored.get(key)

    def set(self, key: Any, value: Any) -> None:
        self.stored[key] = value


def test_the_rounds_are_bounded_then_the_request_builds_its_own_answer() -> None:
    app, rl, runs = one_view_app(lambda: "own", "/s")
    stuck = StuckCache()
    with app.test_request_context():
        rl.path.cache = stuck
    reply = app.test_client().get("/s")
    assert (reply.status_code, reply.get_data()) == (200, b"own")
    assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss"  # not stored
    assert runs == [1]
    assert stuck.gets.count(("s", "/s", ())) == 1 + SHARED_ROUNDS
    assert stuck.stored == {}  # the request's own key stored nothing


# -- the bare decorator ---------------------------------------------------------------------


def test_the_bare_decorator_on_the_extension_and_on_a_budget() -> None:
    rl = ReachLimit()
    reports = rl.budget("reports", active=1)
    app = Flask("bare")
    rl.init_app(app)
    runs: list[str] = []

    @app.get("/plain/<k>")
    @rl.cached
    def plain(k: str) -> Any:
        runs.append(f"plain {k}")
        return {"k": k}

    @app.get("/report/<k>")
    @reports.cached
    def report(k: str) -> Any:
        runs.append(f"report {k}")
        return f"report {k}", {"X-Budget": "reports"}

    client = app.test_client()
    for _ in range(2):
        assert client.get("/plain/a").get_json() == {"k": "a"}
        reply = client.get("/report/b")
        assert (reply.get_data(), reply.headers["X-Budget"]) == (b"report b", "reports")
    assert reply.headers["Cache-Status"].startswith("reachlimit; hit")
    assert runs == ["plain a", "report b"]
    assert plain.__name__ == "plain" and plain.__wrapped__.__name__ == "plain"  # type: ignore[attr-defined]
    with app.test_request_context():
        assert reports.stats().builds == 1 and rl.stats().builds == 1


def test_the_only_positional_argument_is_the_view() -> None:
    rl = ReachLimit()
    with pytest.raises(TypeError, match=r"only positional argument .* key by keyword"):
        rl.cached("day")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="only positional argument"):
        rl.budget("b").cached(3)  # type: ignore[call-overload]


# -- forgetting a view's entries --------------------------------------------------------------


def forget_app() -> tuple[Flask, ReachLimit, list[str], dict[str, Any]]:
    """The decorator tests' app (its ``/by-id/<item>`` view has a key function, the key the
    item lower-cased) with a view of the default keys and one view at two endpoints; the
    views to forget entries of, by name."""
    app, rl, runs = decorated_views_app()

    @app.get("/day/<day>")
    @rl.cached
    def day(day: str) -> Any:
        runs.append(f"day {day} {sorted(request.args.items(multi=True))}")
        return {"day": day}

    # One view at two endpoints: each has its own entries.
    def both(n: int) -> Any:
        runs.append(f"both {request.endpoint} {n}")
        return {"n": n}

    shared = rl.cached(both)
    app.add_url_rule("/one/<int:n>", endpoint="one", view_func=shared)
    app.add_url_rule("/two/<int:n>", endpoint="two", view_func=shared)
    return app, rl, runs, {"by_id": app.view_functions["by_id"], "day": day, "both": shared}


def test_forget_a_key_views_entry_then_it_is_built_again() -> None:
    app, _, runs, views = forget_app()
    client = app.test_client()
    client.get("/by-id/ABC")
    assert client.get("/by-id/abc").headers["Cache-Status"].startswith("reachlimit; hit")
    with app.app_context():  # no request needed
        assert views["by_id"].forget(item="Abc") is True
        assert views["by_id"].forget(item="Abc") is False
    assert client.get("/by-id/abc").headers["Cache-Status"].endswith("stored")
    assert runs == ["by-id ABC", "by-id abc"]


def test_forget_a_default_keys_entry_by_path_and_query() -> None:
    app, _, runs, views = forget_app()
    client = app.test_client()
    client.get("/day/mon?b=2&a=1")
    client.get("/day/tue")
    client.get("/day/a b", query_string={"q": "x y", "tag": ["1", "2"]})
    day = views["day"]
    with app.app_context():
        assert day.forget("a=1&b=2", day="mon") is True  # any order of the pairs
        assert day.forget("a=1&b=2", day="mon") is False
        assert day.forget(day="tue") is True
        # A mapping is encoded as the test client (and urlencode) encodes it; the path
        # argument as a request has it, unquoted.
        assert day.forget({"q": "x y", "tag": ["1", "2"]}, day="a b") is True
        assert day.forget(b"q=x+y&tag=1&tag=2", day="a b") is False  # gone: bytes as sent
    before = len(runs)
    for url in ("/day/mon?b=2&a=1", "/day/tue"):
        assert client.get(url).headers["Cache-Status"].endswith("stored")
    assert len(runs) == before + 2


def test_forget_a_view_registered_at_two_endpoints_forgets_each() -> None:
    app, _, runs, views = forget_app()
    client = app.test_client()
    assert client.get("/one/1").get_json() == client.get("/two/1").get_json() == {"n": 1}
    with app.app_context():
        assert views["both"].forget(n=1) is True
        assert views["both"].forget(n=1) is False
    client.get("/one/1")
    client.get("/two/1")
    assert runs == ["both one 1", "both two 1", "both one 1", "both two 1"]


def test_forget_refuses_what_no_request_would_use() -> None:
    app, rl, _, views = forget_app()
    with app.app_context():
        with pytest.raises(TypeError, match="has a key=: its entries are not by query"):
            views["by_id"].forget("a=1", item="x")
        with pytest.raises(TypeError, match=r"extra is not an argument of the URL rule"):
            views["day"].forget(day="mon", extra=1)
        with pytest.raises(TypeError, match="query must be a str, bytes or a mapping"):
            views["day"].forget(3, day="mon")
        with pytest.raises(LookupError):  # werkzeug's BuildError: the rule needs day=
            views["day"].forget()

        @rl.cached
        def loose() -> Any:
            return "never routed"

        with pytest.raises(RuntimeError, match="is not registered in this app"):
            loose.forget()


# -- the same on a real Redis: two app objects, as two processes ------------------------------


@pytest.fixture
def redis_apps(live_redis: RedisServer) -> Iterator[Callable[[], tuple[Flask, list[str]]]]:
    """``make()`` -> an app on the test's Redis and prefix, and its view runs; every app
    made here shares that Redis and prefix, as the processes of one service do."""
    prefix = f"forms-{uuid.uuid4().hex[:8]}"
    made: list[tuple[Flask, ReachLimit]] = []

    def make() -> tuple[Flask, list[str]]:
        app = Flask(f"redis-forms-{len(made)}")
        app.config.update(REACHLIMIT_REDIS_URL=live_redis.url(), REACHLIMIT_REDIS_PREFIX=prefix)
        rl = ReachLimit(app)
        runs: list[str] = []

        @app.get("/page/<k>")
        @rl.cached
        def page(k: str) -> Any:
            runs.append(f"page {k}")
            return f"page {k}", {"X-Mine": k, "Content-Type": "text/x-page"}

        @app.get("/made/<k>")
        @rl.cached()
        def made_view(k: str) -> Any:
            runs.append(f"made {k}")
            return {"created": k}, 201

        @app.get("/hostile")
        @rl.cached()
        def hostile() -> Any:
            runs.append("hostile")
            return "fine"

        app.config["VIEWS"] = {"page": page}
        made.append((app, rl))
        return app, runs

    yield make
    for app, rl in made:
        rl.close(app)


@pytest.mark.redis
def test_a_200_built_in_one_app_is_replayed_whole_by_another_on_the_same_redis(
    redis_apps: Callable[[], tuple[Flask, list[str]]],
) -> None:
    (one, one_runs), (two, two_runs) = redis_apps(), redis_apps()
    first = one.test_client().get("/page/a")
    replayed = two.test_client().get("/page/a")
    for reply in (first, replayed):
        assert (reply.status_code, reply.get_data(), reply.content_type) == (
            200, b"page a", "text/x-page"
        )
        assert reply.headers["X-Mine"] == "a" and reply.headers["Content-Length"] == "6"
    assert replayed.headers["Cache-Status"].startswith("reachlimit; hit")
    assert one_runs == ["page a"] and two_runs == []


@pytest.mark.redis
def test_a_201_is_not_cached_on_redis(
    redis_apps: Callable[[], tuple[Flask, list[str]]],
) -> None:
    (one, one_runs), (two, two_runs) = redis_apps(), redis_apps()
    for app in (one, two, one):
        reply = app.test_client().get("/made/x")
        assert (reply.status_code, reply.get_json()) == (201, {"created": "x"})
        assert reply.headers["Cache-Status"] == "reachlimit; fwd=uri-miss"
    assert one_runs == ["made x", "made x"] and two_runs == ["made x"]


@pytest.mark.redis
def test_a_value_on_redis_that_is_not_a_replay_is_rebuilt(
    redis_apps: Callable[[], tuple[Flask, list[str]]],
) -> None:
    (one, runs), = [redis_apps()]
    with one.test_request_context():
        cache: Any = one.extensions["reachlimit"].path.cache
    cache.set(("hostile", "/hostile", ()), {"an": "older version's value"})
    for _ in range(2):
        reply = one.test_client().get("/hostile")
        assert (reply.status_code, reply.get_data()) == (200, b"fine")
    assert runs[:1] == ["hostile"]


@pytest.mark.redis
def test_forget_on_redis_reaches_every_app_after_its_first_level(
    redis_apps: Callable[[], tuple[Flask, list[str]]],
) -> None:
    (one, one_runs), (two, two_runs) = redis_apps(), redis_apps()
    one.test_client().get("/page/f")
    assert two.test_client().get("/page/f").headers["Cache-Status"].startswith("reachlimit; hit")
    with one.app_context():
        page = one.config["VIEWS"]["page"]
        assert page.forget(k="f") is True
        assert page.forget(k="f") is False
    # Another process stops answering it once its first level's copy ends (local_ttl).
    wait_until(
        "the second app builds it again",
        lambda: two.test_client().get("/page/f").headers["Cache-Status"].endswith("stored"),
    )
    assert two_runs == ["page f"]
    assert one.test_client().get("/page/f").headers["Cache-Status"].startswith(
        "reachlimit; hit"
    )
    assert one_runs == ["page f"]
