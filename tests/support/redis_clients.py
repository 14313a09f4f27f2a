"""Clients of the test Redis that count what they send.

The fixtures are registered for the whole suite by ``tests/conftest.py``
(``pytest_plugins``): a test module asks for them by name.

``make_client(**options)`` makes a client of the module's ``redis_server`` with short socket
timeouts (0.5 s, as the library advises), closed at teardown; ``client`` is one of those on an
emptied Redis. ``cls=`` makes a subclass of :class:`CountingRedis` instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import pytest
import redis

from tests.support import HOST
from tests.support.redis_server import RedisServer

#: What a test client that must retry passes as ``retry_on_error`` beside its ``retry``:
#: redis-py 5 retries only the errors named there (6 and newer: every error its ``Retry``
#: supports, these included), so such a client retries on every supported redis-py.
RETRIED_ERRORS = [redis.ConnectionError, redis.TimeoutError]


class CountingRedis(redis.Redis):
    """A client that counts the commands it sends (by name), to prove a round-trip count.

    Only commands sent through this client's ``execute_command`` are counted (every redis-py
    command and every ``Script`` call is; a pipeline is not)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter[str] = Counter()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent[str(args[0]).upper()] += 1
        return super().execute_command(*args, **options)

    def total(self) -> int:
        return sum(self.sent.values())


class Closes(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closes)


def closed_at_teardown(build: Callable[..., C]) -> Iterator[Callable[..., C]]:
    """The body of a factory fixture: yields ``build``, remembering what it made, and closes
    every object made once the test is over."""
    made: list[C] = []

    def make(*args: Any, **kwargs: Any) -> C:
        obj = build(*args, **kwargs)
        made.append(obj)
        return obj

    yield make
    for obj in made:
        obj.close()


@pytest.fixture(name="make_client")
def make_client_fixture(redis_server: RedisServer) -> Iterator[Callable[..., CountingRedis]]:
    def build(cls: type[CountingRedis] = CountingRedis, **kwargs: Any) -> CountingRedis:
        options: dict[str, Any] = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
        options.update(kwargs)
        return cls(host=HOST, port=redis_server.port, **options)

    yield from closed_at_teardown(build)


@pytest.fixture(name="client")
def client_fixture(make_client: Callable[..., CountingRedis]) -> CountingRedis:
    c = make_client()
    c.flushall()
    return c


def restart_if_stopped(server: RedisServer) -> None:
    """Start ``server`` again on its port if a test stopped it (or it died)."""
    if server.process is None or server.process.poll() is not None:
        server.start(port=server.port, attempts=1)


@pytest.fixture(name="live_redis")
def live_redis_fixture(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The module's ``redis_server``, running and emptied, for a test that may stop or kill
    it: it is started again (on the same port) after the test too."""
    restart_if_stopped(redis_server)
    c = redis.Redis(host=HOST, port=redis_server.port, socket_timeout=2)
    c.flushall()
    c.close()
    yield redis_server
    restart_if_stopped(redis_server)
