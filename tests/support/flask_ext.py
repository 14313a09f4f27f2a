"""What a test reads from an app with the reachlimit Flask extension: ``ExtensionReads``, the
base of ``App`` (``tests/support/fair_app.py``, ``tests/test_flask_stale.py``,
``tests/test_refresh_gone.py``) and ``Harness`` (``tests/test_flask_ext.py``); the ``apps``
fixture (the apps a test makes, their extension closed at teardown), ``NumberedBuilds``
(the builds of a test's apps, numbered in one sequence), ``one_view_app`` (an app with one
``@rl.cached()`` view) and ``HeldView`` (an app with one such view whose run the test holds,
and requests of it following a leader held there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from reachlimit import ColdLimiter, ColdPath
from reachlimit.flask import ReachLimit
from tests.support.threads import (
    JOIN_TIMEOUT,
    Outcome,
    ThreadRunner,
    leader_and_followers,
    start_call,
)


class ExtensionReads:
    """``path`` (the extension's ``ColdPath``), ``limiter`` (its in-process ``ColdLimiter``)
    and ``stats()`` (the extension's figures as a dict) of ``self.app`` and ``self.rl``."""

    app: Flask
    rl: ReachLimit

    @property
    def state(self) -> Any:
        return self.app.extensions["reachlimit"]

    @property
    def path(self) -> ColdPath:
        path = self.state.path
        assert isinstance(path, ColdPath)
        return path

    @property
    def limiter(self) -> ColdLimiter:
        limiter = self.path.limiter
        assert isinstance(limiter, ColdLimiter)
        return limiter

    def stats(self) -> dict[str, Any]:
        with self.app.app_context():
            return self.rl.stats().as_dict()


@pytest.fixture(name="apps")
def apps_fixture() -> Iterator[list[Flask]]:
    """The list a test puts the apps it makes in: at teardown each app's extension is closed,
    so no thread of theirs outlives the test."""
    made: list[Flask] = []
    yield made
    for app in made:
        ReachLimit().close(app)


class NumberedBuilds:
    """Every key built by the apps of one test, in order (guarded by ``_lock``): one
    numbering for all of them, so an answer says which build made it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.keys: list[str] = []

    def build(self, key: str) -> dict[str, Any]:
        with self._lock:
            self.keys.append(key)
            return {"key": key, "build": len(self.keys)}


def one_view_app(
    answer: Callable[[], Any], path: str = "/v"
) -> tuple[Flask, ReachLimit, list[int]]:
    """An app whose one view, ``@rl.cached()`` at ``path``, answers ``answer()`` (in the
    request: it may read ``request``), each run recorded in the list returned. Its endpoint,
    the first part of its cache keys, is ``path`` without the slash (``"/v"``: ``"v"``)."""
    app = Flask("one-view")
    rl = ReachLimit(app)
    runs: list[int] = []

    @app.get(path, endpoint=path.strip("/"))
    @rl.cached()
    def view() -> Any:
        runs.append(1)
        return answer()

    return app, rl, runs


class HeldView:
    """An app whose one view, ``@rl.cached()`` at ``path``, is held: each run is recorded in
    ``runs`` (a 1 a run), sets ``building`` and waits for ``go`` (``JOIN_TIMEOUT`` at the
    most, or the request fails), then answers ``answer(run)`` (``run``: 1 for the first, 2
    for the next, ...; in the request, so it may read ``request``). The test sets ``go`` to
    let the held run answer; a run that starts after that goes straight on."""

    def __init__(self, answer: Callable[[int], Any], path: str = "/v") -> None:
        self.app = Flask("held-view")
        self.rl = ReachLimit(self.app)
        self.path = path
        self.runs: list[int] = []
        self.building, self.go = threading.Event(), threading.Event()

        @self.app.get(path, endpoint=path.strip("/"))
        @self.rl.cached()
        def view() -> Any:
            self.runs.append(1)
            run = len(self.runs)
            self.building.set()
            assert self.go.wait(JOIN_TIMEOUT)
            return answer(run)

    def leader_and_followers(
        self, threads: ThreadRunner, count: int
    ) -> tuple[Outcome, list[Outcome]]:
        """A leader's request of the view and, once its run is held, ``count`` followers'
        of the same URL: returned once all of them follow it in the extension's
        singleflight."""
        with self.app.test_request_context():
            flight: Any = self.rl.path.flight

        def start(name: str) -> Outcome:
            outcome: Outcome = start_call(
                threads, lambda: self.app.test_client().get(self.path), name=name
            )
            return outcome

        return leader_and_followers(
            start, self.building, count,
            lambda: sum(c.followers for c in flight._calls.values()),
        )
