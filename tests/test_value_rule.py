"""One rule for the extension's cached values, the same with and without Redis: bytes, str or
a JSON-able value, decoded as the shared cache decodes it from the very first answer (a tuple
is a list, an int key a str key); anything else a TypeError naming the key, raised at the
build that returned it, never cached, and shared by that build's followers.

Every test runs twice: in process, and on a real redis-server (``live_redis``) with a prefix
of its own. The library's own TTLCache still takes any object (last test).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, Response

from reachlimit import TTLCache
from reachlimit._values import decode, encode, normalised, run_ruled
from reachlimit.flask import ReachLimit
from reachlimit.redis._cache import Codec
from tests.support.redis_server import RedisServer
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Thing:
    pass


@pytest.fixture(params=["in-process", "redis"])
def app(request: pytest.FixtureRequest) -> Iterator[Flask]:
    app = Flask("values")
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("live_redis")
        app.config["REACHLIMIT_REDIS_URL"] = server.url()
        app.config["REACHLIMIT_REDIS_PREFIX"] = f"values-{uuid.uuid4().hex[:8]}"
    rl = ReachLimit(app)
    app.config["BUILT"] = []
    app.config["VALUE"] = None

    @app.get("/v/<k>")
    def value(k: str) -> Any:
        def build() -> Any:
            app.config["BUILT"].append(k)
            hook = app.config.get("HOOK")
            return app.config["VALUE"] if hook is None else hook()

        got = rl.cold(k, build)
        return {"type": type(got).__name__, "repr": repr(got)}

    yield app
    rl.close(app)


def ask(app: Flask, key: str) -> dict[str, str]:
    reply = app.test_client().get(f"/v/{key}")
    assert reply.status_code == 200, reply.get_data()
    result: dict[str, str] = reply.get_json()
    return result


@pytest.mark.parametrize(
    ("value", "first"),
    [
        ((1, "two", [3]), [1, "two", [3]]),
        ({1: "one", "n": (2,)}, {"1": "one", "n": [2]}),
        (b"\x00raw", b"\x00raw"),
        (bytearray(b"ba"), b"ba"),
        ("text", "text"),
        (3.5, 3.5),
        ([], []),
    ],
    ids=["tuple", "int-key", "bytes", "bytearray", "str", "float", "empty-list"],
)
def test_a_value_is_what_the_shared_cache_would_give_from_the_first_answer(
    app: Flask, value: Any, first: Any
) -> None:
    app.config["VALUE"] = value
    key = uuid.uuid4().hex
    one, two = ask(app, key), ask(app, key)
    assert one == two == {"type": type(first).__name__, "repr": repr(first)}
    assert app.config["BUILT"] == [key]  # the second answer was the cached first


@pytest.mark.parametrize(
    "value",
    [Response("no"), {1, 2}, Thing(), float("nan"), {"k": object()}, {(1, 2): "tuple key"}],
    ids=["response", "set", "object", "nan", "nested-object", "tuple-key"],
)
def test_anything_else_is_a_type_error_naming_the_key_and_never_cached(
    app: Flask, value: Any
) -> None:
    app.config["VALUE"] = value
    app.config["PROPAGATE_EXCEPTIONS"] = True
    key = f"bad-{uuid.uuid4().hex[:6]}"
    for _ in range(2):
        with pytest.raises(TypeError, match=f"key '{key}'"):
            app.test_client().get(f"/v/{key}")
    assert app.config["BUILT"] == [key, key]  # nothing stored: built again
    app.config["VALUE"] = "fine now"
    assert ask(app, key)["repr"] == "'fine now'"


def test_the_followers_of_a_bad_build_get_its_type_error(
    app: Flask, threads: ThreadRunner
) -> None:
    app.config["PROPAGATE_EXCEPTIONS"] = True
    go, building = threading.Event(), threading.Event()

    def held_value() -> Any:
        building.set()
        assert go.wait(JOIN_TIMEOUT)
        return Thing()

    app.config["HOOK"] = held_value
    leader = start_call(threads, lambda: app.test_client().get("/v/herd"), name="leader")
    assert building.wait(JOIN_TIMEOUT)
    follower = start_call(threads, lambda: app.test_client().get("/v/herd"), name="follower")
    wait_until("the follower joined", lambda: _followers(app) == 1)
    go.set()
    for outcome in (leader, follower):
        outcome.wait_done(JOIN_TIMEOUT)
        assert isinstance(outcome.error, TypeError) and "'herd'" in str(outcome.error)
    assert app.config["BUILT"] == ["herd"]  # one build, its error shared


def _followers(app: Flask) -> int:
    """Followers waiting in this process's flight: the in-process one, or (on Redis) the
    shared flight's own in-process collapses (the cold lead's, or the plain flight's),
    where a follower of this process waits."""
    flight: Any = app.extensions["reachlimit"].path.flight
    remote = getattr(flight, "remote", None)
    locals_ = [flight] if remote is None else [remote._local, remote._local_cold]
    return sum(c.followers for local in locals_ for c in local._calls.values())


def test_one_encoding_for_the_extension_and_the_shared_cache() -> None:
    for value in ((1, 2), {"a": [1, {2: 3}]}, b"raw", "text", None, 0, True):
        assert decode(encode(value)) == normalised(value, "k")
        assert Codec("auto").decode(Codec("auto").encode(value)) == normalised(value, "k")
        assert Codec("auto").encode(value) == encode(value)
    with pytest.raises(TypeError, match="by view v for key 'k'"):
        normalised({1, 2}, "k", "view v")


def test_the_librarys_own_ttlcache_still_takes_any_object() -> None:
    cache: TTLCache[Any] = TTLCache(4, 60.0)
    thing = Thing()
    cache.set("k", thing)
    assert cache.get("k") is thing


def test_the_stored_bytes_are_a_tag_then_the_bytes_or_compact_utf8_json() -> None:
    # The bytes another process (or another version) reads back from the shared cache.
    assert encode({"a": [1, 2], "é": "ü"}) == 'j{"a":[1,2],"é":"ü"}'.encode()
    assert encode(b"raw") == b"braw" and encode(memoryview(b"mv")) == b"bmv"
    assert decode(b'j{"a":[1,2],"\xc3\xa9":"\xc3\xbc"}') == {"a": [1, 2], "é": "ü"}
    assert decode(b"braw") == b"raw"
    lone = "\ud800"  # a lone surrogate: a str Python holds, which strict UTF-8 refuses
    assert encode(lone) == b'j"\xed\xa0\x80"'
    assert decode(encode([lone])) == [lone]


def test_what_the_encoding_cannot_hold_is_a_type_error_naming_its_type() -> None:
    for value, kind in (({1}, "set"), (float("nan"), "float"), (Thing(), "Thing")):
        with pytest.raises(TypeError, match=f"this {kind}:"):
            encode(value)
    for data in (b"", b"x1", b"j{", b"j\xff"):
        with pytest.raises(ValueError):
            decode(data)


def test_a_ruled_build_is_its_value_through_the_rule_and_names_where_it_ran() -> None:
    assert run_ruled(lambda: (1, {2: "b"}), "k", "") == [1, {"2": "b"}]
    with pytest.raises(TypeError, match="the value built by view v for key 'k' is a set"):
        run_ruled(lambda: {1}, "k", "view v")
