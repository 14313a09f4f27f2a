"""Fair admission through the Flask extension: ``REACHLIMIT_CLIENT`` and
``REACHLIMIT_RETRY_AFTER="auto"``, through Flask's test client.

design:

    Each request runs in its own thread with its own test client, its address set with
    ``environ_base={"REMOTE_ADDR": ...}``. Builds block on an Event of their own key
    (``Builds``), so which slot frees when is the test's decision, and "queued" is a figure
    read from the limiter before the next request is sent: arrival order is the order of the
    calls. ``REACHLIMIT_WAIT`` is 30 s, so no queued request leaves by timing out while a test
    runs; every way out of the queue is a promotion or a displacement.

    The Retry-After tests (``tests/test_flask_retry_after.py``) inject what decides it:
    durations recorded straight into ``AutoRetryAfter`` or measured on a fake clock that the
    build itself moves, and a random source that returns a known end of its range (or a
    seeded ``random.Random``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask, Request

from reachlimit.flask import (
    CONFIG_KEYS,
    ReachLimit,
    Settings,
)
from tests.support.fair_app import (
    CRAWLER,
    DISPLACED,
    POLITE,
    PROXY,
    QUEUE_FULL,
    TIMEOUT,
    UNAVAILABLE,
    App,
    fill,
    refusal,
    response,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


# -- a crawler does not keep the others out -----------------------------------------------


def test_a_crawler_filling_the_queue_does_not_keep_another_address_out(
    make: Callable[..., App],
) -> None:
    app = make()
    crawler = fill(app)  # c1 c2 build; c3..c10 wait: every place is the crawler's

    # One more from the crawler: it holds most places already, so it is refused at once.
    assert refusal(app.get("c11")) == QUEUE_FULL

    # The polite address holds none: its leader takes the crawler's newest place.
    polite = app.queue("polite", POLITE)
    displaced = response(crawler[-1])
    assert refusal(displaced) == DISPLACED
    s = app.stats()
    assert (s["active"], s["queued"], s["displaced"], s["rejected_full"]) == (2, 8, 1, 1)
    assert not polite.done.is_set()

    # Freed slots go round the clients: the crawler's oldest waiter, then the polite one.
    app.builds.let_go("c1")
    app.builds.wait_started("c3")
    app.builds.let_go("c2")
    app.builds.wait_started("polite")
    assert app.builds.started == ["c1", "c2", "c3", "polite"]

    app.builds.let_all_go()
    assert response(polite).status_code == 200
    assert response(polite).get_json() == {"key": "polite"}
    assert [response(o).status_code for o in crawler[:-1]] == [200] * 9
    wait_until("idle", app.idle)
    s = app.stats()
    assert (s["displaced"], s["rejected_full"], s["rejected_timeout"]) == (1, 1, 0)
    assert (s["builds"], s["acquired"]) == (10, 10)  # c1..c9 and polite; c10 never built

    # The health view shows the new figure too.
    health = app.app.test_client().get("/health").get_json()["default"]
    assert health["displaced"] == 1


def test_refusal_sentences_differ_and_never_echo_the_client() -> None:
    sentences = [QUEUE_FULL, TIMEOUT, DISPLACED, UNAVAILABLE]
    assert len(set(sentences)) == 4
    assert all(CRAWLER not in s for s in sentences)


def test_the_same_address_alone_is_plain_fifo(make: Callable[..., App]) -> None:
    """One address (whatever X-Forwarded-For it sends without ProxyFix) is one client."""
    app = make()
    crawler = fill(app, headers=lambda i: {"X-Forwarded-For": f"10.0.0.{i}"})
    refused = app.get("c11", headers={"X-Forwarded-For": "10.9.9.9"})
    assert refusal(refused) == QUEUE_FULL
    assert app.stats()["displaced"] == 0
    app.builds.let_all_go()
    assert [response(o).status_code for o in crawler] == [200] * 10


def test_client_none_is_plain_fifo_for_everybody(make: Callable[..., App]) -> None:
    app = make({"REACHLIMIT_CLIENT": "none"})
    crawler = fill(app)
    # Another address is the same (anonymous) client: refused at once, nobody displaced.
    assert refusal(app.get("polite", POLITE)) == QUEUE_FULL
    s = app.stats()
    assert (s["queued"], s["displaced"], s["rejected_full"]) == (8, 0, 1)
    app.builds.let_go("c1")
    app.builds.wait_started("c3")
    app.builds.let_all_go()
    assert [response(o).status_code for o in crawler] == [200] * 10


def test_a_client_callable_names_the_client(make: Callable[..., App]) -> None:
    """E.g. the user an authenticating proxy the app trusts put in a header."""
    seen: list[Any] = []

    def user(request: Request) -> str | None:
        seen.append(request)
        return request.headers.get("X-User")

    app = make(client=user)
    as_bot = {"X-User": "bot"}
    crawler = fill(app, addr=PROXY, headers=lambda i: as_bot)
    assert refusal(app.get("c11", PROXY, as_bot)) == QUEUE_FULL
    polite = app.queue("polite", PROXY, {"X-User": "alice"})
    assert refusal(response(crawler[-1])) == DISPLACED
    app.builds.let_all_go()
    assert response(polite).status_code == 200
    assert all(isinstance(r, Request) for r in seen) and len(seen) == 12


def test_behind_proxy_fix_the_rightmost_trusted_hop_is_the_client(
    make: Callable[..., App],
) -> None:
    """Every request comes from the proxy (127.0.0.1); with one trusted proxy the client is
    the rightmost X-Forwarded-For entry, whatever the client wrote to the left of it."""
    app = make(proxies=1)

    def spoofed(i: int) -> dict[str, str]:
        return {"X-Forwarded-For": f"192.0.2.{i}, {CRAWLER}"}

    crawler = fill(app, addr=PROXY, headers=spoofed)
    # A new spoofed leftmost entry does not make the crawler somebody else.
    assert refusal(app.get("c11", PROXY, spoofed(11))) == QUEUE_FULL
    assert app.stats()["displaced"] == 0
    polite = app.queue("polite", PROXY, {"X-Forwarded-For": f"{CRAWLER}, {POLITE}"})
    assert refusal(response(crawler[-1])) == DISPLACED
    app.builds.let_all_go()
    assert response(polite).status_code == 200


# -- the client option ----------------------------------------------------------------------


def test_client_option_defaults_and_spellings() -> None:
    assert Settings().client == "remote_addr"
    assert "REACHLIMIT_CLIENT" in CONFIG_KEYS and "REACHLIMIT_RETRY_AFTER" in CONFIG_KEYS
    for text, value in [(" None ", "none"), ("REMOTE_ADDR", "remote_addr")]:
        app = Flask("spelling")
        app.config["REACHLIMIT_CLIENT"] = text
        rl = ReachLimit(app)
        with app.app_context():
            assert rl.settings().client == value


def nobody(request: Request) -> None:
    return None


BAD_CLIENTS = [
    ({"REACHLIMIT_CLIENT": "x-forwarded-for"}, {},
     r"REACHLIMIT_CLIENT must be 'remote_addr' or 'none', got 'x-forwarded-for'"),
    ({"REACHLIMIT_CLIENT": ""}, {}, r"REACHLIMIT_CLIENT must be 'remote_addr' or 'none'"),
    ({"REACHLIMIT_CLIENT": 7}, {}, r"REACHLIMIT_CLIENT must be 'remote_addr' or 'none', got 7"),
    # A callable is the app's code: the constructor argument only, never a config value.
    ({"REACHLIMIT_CLIENT": nobody}, {},
     r"REACHLIMIT_CLIENT must be 'remote_addr' or 'none' \(a callable only as the ReachLimit "
     r"argument client=\)"),
    ({}, {"client": "user"},
     r"client \(ReachLimit argument\) must be 'remote_addr' or 'none' or a callable"),
    ({}, {"client": None}, r"client \(ReachLimit argument\) must be"),
]


@pytest.mark.parametrize(("config", "overrides", "message"), BAD_CLIENTS,
                         ids=["header-name", "empty", "number", "config-callable",
                              "argument-word", "argument-none"])
def test_a_bad_client_option_fails_init_app_naming_the_key(
    config: dict[str, Any], overrides: dict[str, Any], message: str
) -> None:
    app = Flask("bad-client")
    app.config.update(config)
    rl = ReachLimit(**overrides)
    with pytest.raises(ValueError, match=message):
        rl.init_app(app)
    assert "reachlimit" not in app.extensions


# -- a client callable that is the app's bug ------------------------------------------------


class LookupFailed(Exception):
    pass


def flaky_user(request: Request) -> Any:
    """The app's client callable, broken on demand by the X-Bad header."""
    bad = request.headers.get("X-Bad")
    if bad == "raise":
        raise LookupFailed("no session store")
    if bad == "list":
        return ["not", "hashable"]
    return request.headers.get("X-User", "anonymous")


@pytest.mark.parametrize("bad", ["raise", "list"])
def test_a_broken_client_callable_is_an_error_of_the_app_and_holds_nothing(
    make: Callable[..., App], bad: str
) -> None:
    app = make(client=flaky_user)
    # Warm one key; then make every place busy: two builds and some waiters.
    app.builds.let_go("warm")
    assert app.get("warm").status_code == 200
    busy = fill(app, count=5, headers=lambda i: {"X-User": "bob"})
    before = app.stats()
    flight_before = set(app.path.flight._calls)  # type: ignore[attr-defined]

    # Cold, a key in flight, and warm: the same error each time, and nothing held.
    for key in ("fresh", "c1", "warm"):
        resp = app.get(key, headers={"X-Bad": bad})
        assert resp.status_code == 500
        error = app.server_errors.pop()
        if bad == "raise":
            assert type(error) is LookupFailed and str(error) == "no session store"
        else:
            assert type(error) is TypeError
            assert "ReachLimit client" in str(error) and "flaky_user" in str(error)
            assert "unhashable list" in str(error)
    assert app.stats() == before  # no hit, miss, slot, queue place or refusal counted
    assert set(app.path.flight._calls) == flight_before  # type: ignore[attr-defined]
    assert "fresh" not in app.builds.started

    app.builds.let_all_go()
    assert [response(o).status_code for o in busy] == [200] * 5
    wait_until("idle", app.idle)
    # The next request works, cold and warm.
    app.builds.let_go("fresh")
    assert app.get("fresh").status_code == 200
    assert app.get("fresh").status_code == 200
    s = app.stats()
    assert (s["active"], s["queued"], s["rejected_full"], s["displaced"]) == (0, 0, 0, 0)
