"""The one key rule (``reachlimit._keys``): a ``cold()`` / ``forget()`` key, a cached view's
``key=`` result and the ``client`` callable's value are str, bytes, int or tuples of those
(the client's may be None), in process as on Redis; anything else is a TypeError at the
call, before anything is held or counted.

design:

    The rule itself on every kind of value, bool included (an int: True is the key 1).
    Then the extension, on each backend (in process; a real Redis): a float key and a
    client callable answering a UUID are TypeErrors naming what broke the rule, raised
    with a key already in flight (a build the test holds) and with a warm key alike, and
    afterwards the figures, the flight and (on Redis) the keys in Redis are exactly as
    before; True and 1 are one entry.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask, jsonify

from reachlimit import _keys
from reachlimit._keys import check_key, checked_client, checked_key, shareable
from reachlimit.flask import ReachLimit
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

GOOD = ["k", b"k", 0, -(2**70), True, (), ("k", 1, b"x", ("nested", (2,)))]
BAD = [1.5, uuid.UUID(int=7), None, ["k"], frozenset({"k"}), ("k", 1.5), ("k", ("x", None))]


@pytest.mark.parametrize("key", GOOD, ids=repr)
def test_what_a_key_may_be(key: Any) -> None:
    assert shareable(key)
    assert check_key(key, "cold()") is key and checked_key(key, "key=") is key
    assert checked_client(key, print) is key


@pytest.mark.parametrize("key", BAD, ids=repr)
def test_what_a_key_may_not_be(key: Any) -> None:
    assert not shareable(key)
    with pytest.raises(TypeError, match=r"^cold\(\) was given .* as the cache key: a key must "
                                        r"be str, bytes, int or a tuple of those"):
        check_key(key, "cold()")
    with pytest.raises(TypeError, match=r"^the key of view v returned .* as the cache key"):
        checked_key(key, "the key of view v")


def test_the_messages_name_what_broke_the_rule() -> None:
    def user(request: Any) -> Any:
        return request

    with pytest.raises(TypeError, match=r"given a tuple holding a tuple holding a float as"):
        check_key(("k", ("x", 1.5)), "cold()")
    with pytest.raises(TypeError, match=r"given an unhashable list as the cache key"):
        check_key(["k"], "cold()")
    with pytest.raises(TypeError, match=r"client: '.*user' returned a UUID; it must return"):
        checked_client(uuid.uuid4(), user)
    assert checked_client(None, user) is None  # the one anonymous client


def test_a_str_key_is_taken_without_the_full_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut the callers rely on for the common key (a warm hit pays for the check):
    a str is taken on its type alone, the full rule is asked only about other keys."""
    asked: list[object] = []

    def recording(key: object) -> bool:
        asked.append(key)
        return True

    monkeypatch.setattr(_keys, "shareable", recording)
    assert check_key("k", "cold()") == "k"
    assert checked_key("k", "key=") == "k"
    assert checked_client("user-1", print) == "user-1"
    assert asked == []
    assert check_key(1, "cold()") == 1  # the control: any other key is asked about
    assert asked == [1]


# -- the extension, in process and on Redis --------------------------------------------------


class Held:
    """Builds that count themselves; a key starting "held" waits for ``go``."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self._lock = threading.Lock()
        self.started: set[str] = set()  # guarded by _lock
        self.count = 0  # guarded by _lock

    def build(self, key: str) -> dict[str, Any]:
        with self._lock:
            self.count += 1
            self.started.add(key)
        if key.startswith("held"):
            assert self.go.wait(20), "the test never let the held build go"
        return {"key": key}


@pytest.fixture(params=["in-process", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The config of each backend (a real Redis, emptied, for "redis")."""
    if request.param == "in-process":
        yield {}
        return
    server: RedisServer = request.getfixturevalue("live_redis")
    yield {"REACHLIMIT_REDIS_URL": server.url(), "REACHLIMIT_REDIS_PREFIX": "keys"}


def redis_keys(config: dict[str, Any]) -> set[bytes]:
    url = config.get("REACHLIMIT_REDIS_URL")
    if url is None:
        return set()
    raw = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return set(raw.keys("*"))
    finally:
        raw.close()


def make_app(apps: list[Flask], config: dict[str, Any], held: Held, **options: Any) -> Flask:
    app = Flask(f"keys-{uuid.uuid4().hex[:6]}")
    app.config.update(config)
    rl = ReachLimit(app, **options)
    apps.append(app)

    @app.get("/cold/<key>")
    def cold(key: str) -> Any:
        return jsonify(rl.cold(key, lambda: held.build(key)))

    @app.get("/float")
    def by_float() -> Any:
        return jsonify(rl.cold(1.5, lambda: held.build("float")))

    @app.get("/bool")
    def by_bool() -> Any:
        return jsonify(rl.cold(True, lambda: held.build("bool")))

    @app.get("/one")
    def by_one() -> Any:
        return jsonify(rl.cold(1, lambda: held.build("one")))

    @app.get("/health")
    def health() -> Any:
        return jsonify(rl.stats().as_dict())

    return app


def figures(app: Flask) -> dict[str, Any]:
    reply = app.test_client().get("/health")
    assert reply.status_code == 200
    return dict(reply.get_json())


def user_of(request: Any) -> Any:
    """The client: a UUID when the request asks for one (X-Bad), else its user's name."""
    if request.headers.get("X-Bad"):
        return uuid.UUID(int=42)
    return request.headers.get("X-User", "anon")


def test_a_float_key_and_a_uuid_client_are_type_errors_that_hold_nothing(
    backend: dict[str, Any], apps: list[Flask], threads: ThreadRunner
) -> None:
    held = Held()
    app = make_app(apps, backend, held, client=user_of)
    app.testing = True  # the view's exception reaches the test
    http = app.test_client()
    assert http.get("/cold/warm").status_code == 200
    leader = start_call(threads, lambda: app.test_client().get("/cold/held"))
    wait_until("the held build started", lambda: "held" in held.started)
    wait_until("the held build counted", lambda: figures(app)["active"] == 1)
    before, keys_before, built = figures(app), redis_keys(backend), held.count

    with pytest.raises(TypeError, match=r"cold\(\) was given a float as the cache key"):
        http.get("/float")
    for path in ("/cold/warm", "/cold/held", "/cold/fresh"):
        with pytest.raises(TypeError, match=r"ReachLimit client: .*user_of' returned a UUID"):
            http.get(path, headers={"X-Bad": "1"})
    assert figures(app) == before  # no hit, miss, slot, queue place or refusal counted
    assert redis_keys(backend) == keys_before  # nothing written to Redis either
    assert held.count == built

    held.go.set()
    wait_until("the held build done", lambda: leader.done.is_set())
    assert leader.value.status_code == 200
    assert http.get("/cold/fresh", headers={"X-User": "bob"}).status_code == 200


def test_true_is_the_key_one_on_every_backend(backend: dict[str, Any], apps: list[Flask]) -> None:
    held = Held()
    app = make_app(apps, backend, held)
    http = app.test_client()
    assert http.get("/one").get_json() == {"key": "one"}
    reply = http.get("/bool")
    assert reply.get_json() == {"key": "one"} and reply.headers["Cache-Status"].startswith(
        "reachlimit; hit"
    )
    assert held.count == 1


def test_a_warm_str_key_still_answers_with_the_rule_in_place(
    backend: dict[str, Any], apps: list[Flask]
) -> None:
    """The rule's fast path: str keys (and tuples) answer from the cache as before."""
    held = Held()
    app = make_app(apps, backend, held)
    with app.test_request_context("/"):
        rl = app.extensions["reachlimit"].budgets.owner
        for key in ("s", ("t", 1, b"x")):
            assert rl.cold(key, lambda: "v") == "v"
            assert rl.cold(key, lambda: "never") == "v"

