"""Limiters on the test Redis and reads of what they keep there, shared by the Redis test
modules: the ``make_limiter`` fixture (``make_limiter(**kwargs)``: a ``RedisColdLimiter`` on
the test's ``client``, or on ``client=``, or a subclass as ``cls=``; every one made is closed at
teardown), the ``factory`` fixture built on it (``factory(cls)``: a factory with
``ColdLimiter``'s signature for the checks of ``tests/support/limiter_checks.py`` and
``tests/support/fairness.py``, each limiter on a fresh name), the scripts' answer codes
(``GRANTED``, ``QUEUED``, ``FULL``, ``POLL_*``), ``server_ms`` (Redis's own clock in ms) and
``state_of`` (every key matching a pattern with its full content). The fixtures are
registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisColdLimiter
from tests.support.redis_clients import CountingRedis, closed_at_teardown

#: What the limiter's scripts answer: an acquire (granted, queued, refused full) and a poll.
GRANTED, QUEUED, FULL = 1, 2, 0
POLL_GRANTED, POLL_WAITING, POLL_TIMEOUT, POLL_CANCELLED = 1, 2, 3, 4


@pytest.fixture(name="make_limiter")
def make_limiter_fixture(client: CountingRedis) -> Iterator[Callable[..., RedisColdLimiter]]:
    """``make_limiter(**kwargs)``: a limiter on the test's client (or ``client=``, or a
    subclass as ``cls=``); every one made is closed at teardown."""
    def build(**kwargs: Any) -> RedisColdLimiter:
        cls = kwargs.pop("cls", RedisColdLimiter)
        lim: RedisColdLimiter = cls(kwargs.pop("client", client), **kwargs)
        return lim

    yield from closed_at_teardown(build)


@pytest.fixture(name="factory")
def factory_fixture(
    make_limiter: Callable[..., RedisColdLimiter],
) -> Callable[[type[RedisColdLimiter]], Callable[..., RedisColdLimiter]]:
    """``factory(cls)``: a limiter factory with ColdLimiter's signature
    (``make(active, queue, wait, clock)``), making ``cls`` on a fresh name each call. Every
    wait is a minute, except with a ``clock`` that steps on each read (a check that needs its
    waits to run out): then 0.05 s. Every limiter made is closed at teardown."""
    names = itertools.count()

    def for_class(cls: type[RedisColdLimiter]) -> Callable[..., RedisColdLimiter]:
        def make(
            active: int = 2, queue: int = 8, wait: float = 3.0, clock: Any = None, **_: Any
        ) -> RedisColdLimiter:
            runs_out = getattr(clock, "step", 0) > 0
            return make_limiter(
                cls=cls, name=f"check-{next(names)}", active=active, queue=queue,
                wait=0.05 if runs_out else 60.0,
            )  # fmt: skip

        return make

    return for_class


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def state_of(client: redis.Redis, pattern: str = "*") -> dict[str, Any]:
    """Every key matching ``pattern`` with its full content."""
    out: dict[str, Any] = {}
    for key in sorted(client.keys(pattern)):
        kind = client.type(key).decode()
        if kind == "zset":
            out[key.decode()] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[key.decode()] = client.hgetall(key)
        elif kind == "list":
            out[key.decode()] = client.lrange(key, 0, -1)
        elif kind == "set":  # the prefix's registry of limiter names
            out[key.decode()] = client.smembers(key)
        else:
            out[key.decode()] = client.get(key)
    return out
