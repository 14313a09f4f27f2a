"""What the tests of the cold lead (``reachlimit/redis/_lead.py``) share: an app of
``tests/apps/slow_app.py`` on the module's redis-server (one slot, one queue place, a lease of
two minutes, so nothing is renewed while a test counts), the test's own limiter to fill that
budget and the flight keys of the app (the commands clients send are counted with
``redis_clients.Commands``).

A test module gets the fixtures with::

    from tests.support.redis_lead import (
        app_fixture,  # noqa: F401 (the app fixture)
        watcher_fixture,  # noqa: F401 (the watcher fixture)
    )
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from flask import Flask

from reachlimit.flask import ReachLimit
from reachlimit.redis import RedisColdLimiter
from tests.apps.slow_app import create_app
from tests.support import HOST
from tests.support.redis_limiters import GRANTED, QUEUED, LimiterScript
from tests.support.redis_server import RedisServer


def make_app(server: RedisServer, prefix: str) -> Flask:
    """An app on ``server``'s budget ``prefix``: two apps of one prefix are two processes'
    worth of state on one budget."""
    return create_app(
        REACHLIMIT_REDIS_URL=server.url(),
        REACHLIMIT_REDIS_PREFIX=prefix,
        REACHLIMIT_ACTIVE=1,
        REACHLIMIT_QUEUE=1,
        REACHLIMIT_LEASE=120,
    )


def close_app(app: Flask) -> None:
    app.extensions["slow_app"].gate.set()
    ReachLimit().close(app)


@pytest.fixture(name="watcher")
def watcher_fixture(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the module's redis-server, emptied first."""
    client = redis.Redis(host=HOST, port=redis_server.port, socket_timeout=5)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(name="app")
def app_fixture(redis_server: RedisServer, watcher: redis.Redis) -> Iterator[Flask]:
    made = make_app(redis_server, "rt" + uuid.uuid4().hex[:8])
    yield made
    close_app(made)


class Patient(RedisColdLimiter):
    """The test's own holder and waiter on the app's budget: its waiter is never dropped
    for not polling (it never polls) while the test runs."""

    PRESENCE = 120.0


def quiet(app: Flask) -> None:
    """Stop the threads of the app that talk to Redis on their own: the counters' flusher
    (it flushes first) and the budget's membership announcer (it stays a member)."""
    ext = app.extensions["reachlimit"]
    assert ext.counters is not None
    ext.counters.close()
    ext.path.limiter.members.close(leave=False)


def ghosts_fill(app: Flask, watcher: redis.Redis) -> tuple[Patient, LimiterScript]:
    """Take the budget's one slot and its one queue place with ghosts of the test's own
    limiter ("holder", "waiter"), so that every cold request of the app is refused (queue
    full): that limiter (to read the budget's figures), and its script driven by the test."""
    settings = app.extensions["reachlimit"].settings
    lim = Patient(
        watcher, "cold", 1, 1, settings.wait, lease=120.0, prefix=settings.redis_prefix
    )
    ghosts = LimiterScript(watcher, lim)
    assert ghosts.acquire("holder")[0] == GRANTED
    assert ghosts.acquire("waiter")[0] == QUEUED
    return lim, ghosts


def flight_keys(watcher: redis.Redis, app: Flask) -> list[bytes]:
    """Every key of every flight of the app (``{<prefix>:cold:<digest of the key>}:...``)."""
    flight = app.extensions["reachlimit"].path.flight.remote
    base = flight.base_of("any")  # "{<prefix>:cold:" + 64 hex digits + "}:"
    pattern = base[: -(64 + 2)] + "?" * 64 + "}:*"
    return sorted(watcher.keys(pattern))
