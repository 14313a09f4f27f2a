"""Fair admission through the Flask extension, through Flask's test client:
``REACHLIMIT_CLIENT`` (who a client is), then ``REACHLIMIT_RETRY_AFTER="auto"`` (the formula at
exact values, its clamps and spread, the builds it keeps, each refusal reason's queue count, a
fixed value, the option's spellings), the displacement metric and the reach service's
``REACH_PROXIES``.

design:

    Each request runs in its own thread with its own test client, its address set with
    ``environ_base={"REMOTE_ADDR": ...}`` (``tests/support/fair_app.py``). Builds block on an
    Event of their own key (``Builds``), so which slot frees when is the test's decision, and
    "queued" is a figure read from the limiter before the next request is sent: arrival order
    is the order of the calls. ``REACHLIMIT_WAIT`` is 30 s, so no queued request leaves by
    timing out while a test runs; every way out of the queue is a promotion or a
    displacement.

    The Retry-After tests inject what decides it: durations recorded straight into
    ``AutoRetryAfter`` or measured on a fake clock that the build itself moves, and a random
    source that returns a known end of its range (or a seeded ``random.Random``).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask, Request, jsonify

from reachlimit import Busy, ColdLimiter, Grant
from reachlimit.flask import CONFIG_KEYS, AutoRetryAfter, ReachLimit, Settings
from tests.support.clock import FakeClock
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
from tests.support.limiter import slots_held
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

# -- Retry-After: "auto" --------------------------------------------------------------------


class Ends:
    """A ``randint`` that returns the low or the high end of its range, and records ranges."""

    def __init__(self, end: str = "high") -> None:
        self.end = end
        self.ranges: list[tuple[int, int]] = []

    def __call__(self, low: int, high: int) -> int:
        self.ranges.append((low, high))
        return high if self.end == "high" else low


def auto(active: int = 2, queue: int = 8, durations: tuple[float, ...] = (),
         end: str = "high") -> tuple[AutoRetryAfter, Ends]:
    ends = Ends(end)
    retry = AutoRetryAfter(active, queue, randint=ends)
    for seconds in durations:
        retry.record(seconds)
    return retry, ends


@pytest.mark.parametrize(
    ("active", "durations", "queued", "base"),
    [
        (2, (1.0, 2.0), 8, 7),  # mean 1.5 x 9 / 2 = 6.75 -> 7
        (1, (1.0, 2.0), 8, 14),  # the same over one slot: 13.5 -> 14
        (2, (0.5,), 3, 1),  # 0.5 x 4 / 2 = 1.0 exactly: no rounding up
        (4, (0.25, 0.25), 0, 1),  # 0.0625 -> at least 1
        (2, (3.0,), 8, 14),  # 13.5 -> 14
        (1, (10.0,), 8, 30),  # 90 -> at most 30
        (2, (), 8, 2),  # nothing timed yet: 2
    ],
)
def test_auto_formula_at_exact_values(
    active: int, durations: tuple[float, ...], queued: int, base: int
) -> None:
    retry, ends = auto(active, 8, durations, end="low")
    assert retry.base(queued) == base
    assert retry.seconds(queued) == base  # the low end of the spread adds nothing
    assert ends.ranges == [(0, max(1, base // 4))]
    retry.randint = Ends("high")
    high = retry.seconds(queued)
    spread = max(1, base // 4)
    assert high == (base + spread if base + spread <= 30 else base - spread)


def test_auto_clamps_to_1_and_30_with_the_spread_inside() -> None:
    retry, ends = auto(active=1, durations=(100.0,))
    assert retry.base(8) == 30
    assert retry.seconds(8) == 23  # 30 + 7 would pass 30: the spread is taken off instead
    retry.randint = Ends("low")
    assert retry.seconds(8) == 30
    tiny, _ = auto(active=8, durations=(0.001,))
    assert tiny.base(0) == 1
    assert tiny.seconds(0) == 2  # 1 + max(1, 1 // 4)
    tiny.randint = Ends("low")
    assert tiny.seconds(0) == 1


def test_auto_keeps_only_the_recent_builds() -> None:
    retry, _ = auto(active=1, queue=0, end="low")
    for _ in range(AutoRetryAfter.SAMPLES):
        retry.record(20.0)
    assert retry.base(0) == 20
    for _ in range(AutoRetryAfter.SAMPLES):
        retry.record(3.0)
    assert retry.base(0) == 3  # the slow builds have all rotated out
    retry.record(-1.0)  # a clock that stepped back counts as an instant build
    assert retry.mean() == pytest.approx(3.0 * 15 / 16)


def test_auto_spread_differs_between_refusals_in_whole_seconds() -> None:
    retry = AutoRetryAfter(1, 8, randint=random.Random(7).randint)
    retry.record(2.0)  # base: 2 x 9 / 1 = 18, spread 0..4
    figures = [retry.seconds(8) for _ in range(40)]
    assert len(set(figures)) > 1
    assert all(type(f) is int and 18 <= f <= 22 for f in figures)
    low = AutoRetryAfter(8, 0, randint=random.Random(7).randint)
    low.record(0.01)  # base 1, spread 0..1
    assert set(low.seconds(0) for _ in range(40)) == {1, 2}


def fake_timed(app: App, clock: FakeClock, seconds: float) -> None:
    """Make every build of ``app`` take ``seconds`` on ``clock``."""
    app.state.retry_auto.clock = clock

    def build(key: str) -> dict[str, Any]:
        clock.advance(seconds)
        return {"key": key}

    app.builds.hook = build


def test_auto_through_the_extension_queue_full(make: Callable[..., App]) -> None:
    app = make({"REACHLIMIT_RETRY_AFTER": "auto", "REACHLIMIT_ACTIVE": 1,
                "REACHLIMIT_QUEUE": 0})
    state = app.state
    assert app.limiter.retry_after == 2  # the limiter's own figure, replaced per refusal
    ends = Ends("high")
    state.retry_auto.randint = ends
    # Before any build: 2, plus the spread (high end: 1).
    with slots_held(app.limiter):
        assert refusal(app.get("a"), retry_after=3) == QUEUE_FULL
    clock = FakeClock()
    fake_timed(app, clock, 3.0)
    assert app.get("a").status_code == 200  # one build of 3 s on the fake clock
    with slots_held(app.limiter):
        refused = app.get("b")
    # ceil(3 x (0 + 1) / 1) = 3, plus the high end of 0..1.
    assert refusal(refused, retry_after=4) == QUEUE_FULL
    assert ends.ranges == [(0, 1), (0, 1)]
    assert app.stats()["rejected_full"] == 2


def test_auto_displaced_counts_the_whole_queue(make: Callable[..., App]) -> None:
    app = make({"REACHLIMIT_RETRY_AFTER": "auto"})
    state = app.state
    state.retry_auto.randint = Ends("low")
    state.retry_auto.record(1.5)
    crawler = fill(app)
    polite = app.queue("polite", POLITE)
    # ceil(1.5 x (8 + 1) / 2) = 7.
    assert refusal(response(crawler[-1]), retry_after=7) == DISPLACED
    assert refusal(app.get("c11"), retry_after=7) == QUEUE_FULL
    app.builds.let_all_go()
    assert response(polite).status_code == 200


def test_auto_timeout_of_the_real_limiter(make: Callable[..., App]) -> None:
    # The one wait that really runs out (0.05 s): with every slot held nothing else ends it.
    app = make({"REACHLIMIT_RETRY_AFTER": "auto", "REACHLIMIT_ACTIVE": 1,
                "REACHLIMIT_QUEUE": 4, "REACHLIMIT_WAIT": 0.05})
    app.state.retry_auto.randint = Ends("low")
    app.state.retry_auto.record(3.0)
    with slots_held(app.limiter):
        refused = app.get("late")
    # Nobody waits once the leader has left: ceil(3 x (0 + 1) / 1) = 3.
    assert refusal(refused, retry_after=3) == TIMEOUT
    assert app.stats()["rejected_timeout"] == 1


class TimesOut:
    """A duck-typed limiter whose every leader times out; ``stats()`` says ``queued`` wait,
    or raises when ``queued`` is None."""

    def __init__(self, real: ColdLimiter, queued: int | None) -> None:
        self.real = real
        self.queued = queued

    def acquire(self, cancel: Any = None, client: Any = None) -> Grant:
        raise Busy(Busy.TIMEOUT, 2)

    def stats(self) -> Any:
        if self.queued is None:
            raise ConnectionError("figures unavailable")
        return dataclasses.replace(self.real.stats(), queued=self.queued)


@pytest.mark.parametrize(
    ("queued", "retry_after"),
    [
        (3, 12),  # ceil(3 x (3 + 1) / 1)
        (0, 3),  # ceil(3 x (0 + 1) / 1)
        (None, 27),  # unreadable: the queue is taken as full, ceil(3 x (8 + 1) / 1)
    ],
    ids=["3-waiting", "none-waiting", "unreadable"],
)
def test_auto_timeout_counts_who_still_waits(
    make: Callable[..., App], queued: int | None, retry_after: int
) -> None:
    app = make({"REACHLIMIT_RETRY_AFTER": "auto", "REACHLIMIT_ACTIVE": 1,
                "REACHLIMIT_QUEUE": 8})
    state = app.state
    real = app.limiter
    state.retry_auto.randint = Ends("low")
    state.retry_auto.record(3.0)
    state.path.limiter = TimesOut(real, queued)
    try:
        refused = app.get("k")
    finally:
        state.path.limiter = real
    assert refusal(refused, retry_after=retry_after) == TIMEOUT


def test_auto_spreads_the_refusals_a_herd_gets(make: Callable[..., App]) -> None:
    app = make({"REACHLIMIT_RETRY_AFTER": "auto", "REACHLIMIT_ACTIVE": 1,
                "REACHLIMIT_QUEUE": 0})
    app.state.retry_auto.randint = random.Random(3).randint
    app.state.retry_auto.record(12.0)  # base 12, spread 0..3
    with slots_held(app.limiter):
        figures = [int(app.get(f"k{i}").headers["Retry-After"]) for i in range(30)]
    assert len(set(figures)) > 1
    assert all(12 <= f <= 15 for f in figures)


def test_auto_times_builds_that_fail_too(make: Callable[..., App]) -> None:
    app = make({"REACHLIMIT_RETRY_AFTER": "auto"})
    clock = FakeClock()
    app.state.retry_auto.clock = clock

    def failing(key: str) -> Any:
        clock.advance(5.0)
        raise RuntimeError("scan failed")

    app.builds.hook = failing
    assert app.get("k").status_code == 500
    assert app.state.retry_auto.mean() == 5.0


def test_a_fixed_retry_after_is_not_worked_out(make: Callable[..., App]) -> None:
    app = make(retry_after=5)
    assert app.state.retry_auto is None
    crawler = fill(app)
    app.queue("polite", POLITE)
    assert refusal(response(crawler[-1]), retry_after=5) == DISPLACED
    assert refusal(app.get("c11"), retry_after=5) == QUEUE_FULL


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        ({"REACHLIMIT_RETRY_AFTER": "sometimes"}, {},
         r"REACHLIMIT_RETRY_AFTER must be a whole number >= 1 or 'auto', got 'sometimes'"),
        ({"REACHLIMIT_RETRY_AFTER": 0}, {},
         r"REACHLIMIT_RETRY_AFTER must be a whole number >= 1 or 'auto', got 0"),
        ({"REACHLIMIT_RETRY_AFTER": -1}, {},
         r"REACHLIMIT_RETRY_AFTER must be a whole number >= 1 or 'auto', got -1"),
        ({"REACHLIMIT_RETRY_AFTER": "-1"}, {}, r"REACHLIMIT_RETRY_AFTER must be"),
        ({}, {"retry_after": "sometimes"}, r"retry_after \(ReachLimit argument\) must be"),
    ],
    ids=["sometimes", "0", "-1", "'-1'", "argument"],
)
def test_a_bad_retry_after_fails_init_app_naming_the_key(
    config: dict[str, Any], overrides: dict[str, Any], message: str
) -> None:
    app = Flask("bad-retry")
    app.config.update(config)
    with pytest.raises(ValueError, match=message):
        ReachLimit(**overrides).init_app(app)
    assert "reachlimit" not in app.extensions


def test_auto_spellings() -> None:
    for value in ("auto", " AUTO "):
        app = Flask("auto")
        app.config["REACHLIMIT_RETRY_AFTER"] = value
        rl = ReachLimit(app)
        with app.app_context():
            assert rl.settings().retry_after == "auto"
        assert isinstance(app.extensions["reachlimit"].retry_auto, AutoRetryAfter)


# -- metrics ------------------------------------------------------------------------------


def test_a_displacement_is_counted_in_the_metrics(make: Callable[..., App]) -> None:
    pytest.importorskip("prometheus_client")
    app = make({"REACHLIMIT_METRICS": True})
    crawler = fill(app)
    polite = app.queue("polite", POLITE)
    assert refusal(response(crawler[-1])) == DISPLACED
    text = app.app.test_client().get("/metrics").get_data(as_text=True)
    assert 'reachlimit_admissions_total{budget="default",result="displaced"} 1.0' in text
    app.builds.let_all_go()
    assert response(polite).status_code == 200


# -- the reach service: REACH_PROXIES ---------------------------------------------------------


@pytest.mark.parametrize(("proxies", "seen"), [
    (0, PROXY), ("1", POLITE), (2, CRAWLER), (" 3 ", PROXY),
])
def test_reach_proxies_sets_whose_address_the_service_sees(
    reach_app_factory: Callable[..., Flask], proxies: Any, seen: str
) -> None:
    from flask import request

    app = reach_app_factory(REACH_PROXIES=proxies)

    @app.get("/test/whoami")
    def whoami() -> Any:
        return jsonify(addr=request.remote_addr)

    # Fewer entries than trusted proxies: the peer address stays (ProxyFix's rule).
    resp = app.test_client().get("/test/whoami", environ_base={"REMOTE_ADDR": PROXY},
                                 headers={"X-Forwarded-For": f"{CRAWLER}, {POLITE}"})
    assert resp.get_json() == {"addr": seen}


def test_reach_proxies_from_the_environment(
    reach_app_factory: Callable[..., Flask], monkeypatch: pytest.MonkeyPatch
) -> None:
    from werkzeug.middleware.proxy_fix import ProxyFix

    monkeypatch.setenv("REACH_PROXIES", "1")
    # (The extension's own WSGI wrapper, which sends Cache-Status, is around it.)
    proxy = inspect.unwrap(reach_app_factory().wsgi_app)
    assert isinstance(proxy, ProxyFix)
    # X-Forwarded-For from one hop; and X-Forwarded-Proto from the nearest (ProxyFix's own
    # default), which only decides the scheme the app sees.
    assert (proxy.x_for, proxy.x_proto, proxy.x_host) == (1, 1, 0)
    monkeypatch.setenv("REACH_PROXIES", "0")
    assert not isinstance(inspect.unwrap(reach_app_factory().wsgi_app), ProxyFix)


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "", -1, True, 1.0, "١"])
def test_a_bad_reach_proxies_stops_start_up_with_one_line(
    reach_app_factory: Callable[..., Flask], value: Any
) -> None:
    with pytest.raises(SystemExit) as exc:
        reach_app_factory(REACH_PROXIES=value)
    message = str(exc.value.code)
    assert message == f"webapp: REACH_PROXIES must be a whole number >= 0, got {value!r}"
    assert "\n" not in message
