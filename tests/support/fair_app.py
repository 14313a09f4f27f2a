"""The harness of the Flask fair-admission tests (``tests/test_flask_fair.py``, Retry-After
too): :class:`App` (a Flask app with the extension whose builds block on an Event of their
own key, :class:`Builds`, so which slot frees when is the test's decision), the ``make``
fixture (apps whose builds are all let go, and every request finished and idle, at
teardown), ``response``/``refusal``/``fill``, the clients' addresses and the refusal
sentences."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask, jsonify
from werkzeug.test import TestResponse

from reachlimit import Busy
from reachlimit._answers import refusal_sentence
from reachlimit.flask import ReachLimit
from tests.apps.slow_app import add_cold_routes
from tests.support.flask_ext import ExtensionReads
from tests.support.threads import Outcome, ThreadRunner, start_call
from tests.support.waiting import DEADLINE, wait_until

CRAWLER = "198.51.100.7"
POLITE = "203.0.113.9"
PROXY = "127.0.0.1"



def default_sentence(reason: str) -> str:
    """The default budget's built-in refusal sentence for ``reason`` (``reachlimit._answers``,
    where the sentences are written)."""
    return refusal_sentence(Busy(reason, 2), "default")


QUEUE_FULL = default_sentence(Busy.QUEUE_FULL)
DISPLACED = default_sentence(Busy.DISPLACED)
TIMEOUT = default_sentence(Busy.TIMEOUT)
UNAVAILABLE = default_sentence(Busy.UNAVAILABLE)


class Builds:
    """Builds that each wait for their own key to be let go, in the order they started;
    ``hook``, when set, replaces them."""

    def __init__(self) -> None:
        self.started: list[str] = []  # guarded by _lock
        self._go: dict[str, threading.Event] = {}  # guarded by _lock
        self._all_go = False  # guarded by _lock: every build, also those not started yet
        self._lock = threading.Lock()
        self.hook: Callable[[str], Any] | None = None

    def _event(self, key: str) -> threading.Event:
        with self._lock:
            event = self._go.setdefault(key, threading.Event())
            if self._all_go:
                event.set()
            return event

    def build(self, key: str) -> Any:
        if self.hook is not None:
            return self.hook(key)
        go = self._event(key)
        with self._lock:
            self.started.append(key)
        if not go.wait(DEADLINE):
            raise RuntimeError(f"the test never let the build of {key!r} go")
        return {"key": key}

    def let_go(self, *keys: str) -> None:
        for key in keys:
            self._event(key).set()

    def let_all_go(self) -> None:
        """Let every build go, those that have not started yet too."""
        with self._lock:
            self._all_go = True
            events = list(self._go.values())
        for event in events:
            event.set()

    def wait_started(self, key: str) -> None:
        wait_until(f"the build of {key!r} to start", lambda: key in self.started)


class App(ExtensionReads):
    """A Flask app with ``/report/<key>`` (blocking builds) and ``/health``; requests from
    any address, each in a thread of ``threads``."""

    def __init__(
        self,
        threads: ThreadRunner,
        config: dict[str, Any] | None = None,
        proxies: int = 0,
        **overrides: Any,
    ) -> None:
        self.threads = threads
        self.app = app = Flask("fair")
        app.config.update({"REACHLIMIT_WAIT": 30, **(config or {})})
        self.rl = ReachLimit(app, **overrides)
        if proxies:
            from webapp import trust_proxies

            trust_proxies(app, proxies)
        self.builds = Builds()
        add_cold_routes(app, self.rl, self.builds.build)
        self.server_errors: list[BaseException] = []

        @app.errorhandler(500)
        def server_error(e: Any) -> Any:
            self.server_errors.append(e.original_exception)
            return jsonify(error="internal"), 500

    def get(self, key: str, addr: str = CRAWLER, headers: dict[str, str] | None = None
            ) -> TestResponse:
        client = self.app.test_client()
        return client.get(f"/report/{key}", environ_base={"REMOTE_ADDR": addr},
                          headers=headers or {})

    def start(self, key: str, addr: str = CRAWLER, headers: dict[str, str] | None = None
              ) -> Outcome:
        return start_call(self.threads, lambda: self.get(key, addr, headers), name=key)

    def queue(self, key: str, addr: str = CRAWLER, headers: dict[str, str] | None = None
              ) -> Outcome:
        """A request that must end up waiting in the queue (in a place of its own, or one it
        took over): returns once the limiter counts it."""
        before = self.limiter.stats()
        outcome = self.start(key, addr, headers)

        def queued() -> bool:
            now = self.limiter.stats()
            return now.queued == before.queued + 1 or now.displaced == before.displaced + 1

        wait_until(f"{key} queued", queued)
        return outcome

    def building(self, key: str, addr: str = CRAWLER, headers: dict[str, str] | None = None
                 ) -> Outcome:
        """A request that takes a free slot and blocks in its build."""
        outcome = self.start(key, addr, headers)
        self.builds.wait_started(key)
        return outcome

    def idle(self) -> bool:
        s = self.limiter.stats()
        return s.active == 0 and s.queued == 0 and not self.path.flight._calls  # type: ignore[attr-defined]


def response(outcome: Outcome) -> TestResponse:
    outcome.wait_done(DEADLINE)
    assert outcome.error is None, outcome.error
    assert isinstance(outcome.value, TestResponse)
    return outcome.value


def refusal(resp: TestResponse, retry_after: int = 2, status: int = 429) -> str:
    """A refusal's status, headers and body; returns its sentence."""
    assert resp.status_code == status, (resp.status_code, resp.data)
    assert resp.headers["Retry-After"] == str(retry_after)
    assert resp.headers["Cache-Control"] == "no-store"
    body = resp.get_json()
    assert body["retryAfter"] == retry_after
    assert set(body) == {"error", "retryAfter"}
    sentence: str = body["error"]
    return sentence


def fill(app: App, prefix: str = "c", addr: str = CRAWLER, count: int = 10,
         headers: Callable[[int], dict[str, str]] | None = None) -> list[Outcome]:
    """``count`` requests from ``addr``: the first two build (held), the rest queue, in order."""
    outcomes = []
    for i in range(1, count + 1):
        more = headers(i) if headers else None
        if i <= app.limiter.capacity_active:
            outcomes.append(app.building(f"{prefix}{i}", addr, more))
        else:
            outcomes.append(app.queue(f"{prefix}{i}", addr, more))
    s = app.limiter.stats()
    assert (s.active, s.queued) == (2, count - 2)
    return outcomes


@pytest.fixture(name="make")
def make_fixture(threads: ThreadRunner) -> Iterator[Callable[..., App]]:
    """``make(config=None, proxies=0, **overrides)``: an :class:`App`; at the end every build
    is let go and every request has finished and left nothing behind."""
    apps: list[App] = []

    def factory(*args: Any, **kwargs: Any) -> App:
        app = App(threads, *args, **kwargs)
        apps.append(app)
        return app

    yield factory
    for app in apps:
        app.builds.let_all_go()
    threads.join_all(DEADLINE)
    for app in apps:
        assert app.idle()
