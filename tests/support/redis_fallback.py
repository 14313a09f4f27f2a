"""The wiring of the Redis fallback tests (``tests/test_redis_fallback.py``,
``tests/test_redis_fallback_cache.py``, ``tests/test_redis_recovery.py`` and
``tests/test_redis_health.py``): :class:`Stack` (one process's worth of client, health,
shared and local limiters behind a ``ResilientLimiter``, the health probing Redis on that
client as the extension's does), the ``make_stack`` fixture (stacks closed at teardown), the
``server`` fixture (the module's ``live_redis``), the ``redis_app`` fixture (the same wiring
made by the Flask extension: an app of ``tests/apps/slow_app.py`` on ``live_redis``), the
``runner`` fixture (a ``ThreadRunner`` joined at teardown), the
bounds the tests assert with (``TIMEOUT``, ``SLACK``) and ``warnings_about_redis`` (what the
library warned of, read from the test's captured log)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask

from reachlimit import ColdLimiter
from reachlimit.flask import ReachLimit
from reachlimit.redis import (
    RedisColdLimiter,
    RedisHealth,
    ResilientLimiter,
    connect,
)
from tests.apps.slow_app import create_app
from tests.support.redis_server import RedisServer
from tests.support.threads import ThreadRunner

TIMEOUT = 0.5  # the socket timeout connect() uses by default
#: Added to every asserted upper bound: scheduling on a loaded 2-core machine, never a speed.
SLACK = 2.0


def warnings_about_redis(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """The messages of the ``reachlimit`` logger's warnings captured so far that say ``text``."""
    return [
        r.getMessage() for r in caplog.records
        if r.name == "reachlimit" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


@pytest.fixture(name="server")
def server_fixture(live_redis: RedisServer) -> RedisServer:
    return live_redis


@pytest.fixture
def redis_app(live_redis: RedisServer) -> Iterator[Flask]:
    """An app of ``tests/apps/slow_app.py`` on the module's ``live_redis`` (which the test may
    stop), its extension closed at teardown."""
    made = create_app(REACHLIMIT_REDIS_URL=live_redis.url())
    yield made
    ReachLimit().close(made)


@pytest.fixture(name="runner")
def runner_fixture() -> Iterator[ThreadRunner]:
    r = ThreadRunner()
    yield r
    r.join_all(timeout=15)


class Stack:
    """One process's worth of wiring: client, health, shared and local limiters."""

    def __init__(self, url: str, fallback: str = "local", **figures: Any) -> None:
        figures = {"active": 1, "queue": 2, "wait": 3.0, **figures}
        self.client = connect(url)
        # As the extension makes it: its probe thread PINGs Redis on this client while down.
        self.health = RedisHealth(url, client=self.client)
        self.remote = RedisColdLimiter(self.client, "fb", lease=5.0, **figures)
        self.local = ColdLimiter(**figures)
        self.limiter = ResilientLimiter(self.remote, self.local, self.health, fallback)

    def close(self) -> None:
        self.health.close()
        self.remote.close()
        self.client.close()


@pytest.fixture(name="make_stack")
def make_stack_fixture() -> Iterator[Callable[..., Stack]]:
    made: list[Stack] = []

    def make(url: str, fallback: str = "local", **figures: Any) -> Stack:
        s = Stack(url, fallback, **figures)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
