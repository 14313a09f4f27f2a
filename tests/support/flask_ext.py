"""What a test reads from an app with the reachlimit Flask extension: ``ExtensionReads``, the
base of ``App`` (``tests/support/fair_app.py``, ``tests/test_flask_stale.py``,
``tests/test_refresh_gone.py``) and ``Harness`` (``tests/test_flask_ext.py``); the ``apps``
fixture (the apps a test makes, their extension closed at teardown) and ``NumberedBuilds``
(the builds of a test's apps, numbered in one sequence).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from reachlimit import ColdLimiter, ColdPath
from reachlimit.flask import ReachLimit


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
