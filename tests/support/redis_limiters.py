"""Limiters on the test Redis and reads of what they keep there, shared by the Redis test
modules: the ``make_limiter`` fixture (``make_limiter(**kwargs)``: a ``RedisColdLimiter`` on
the test's ``client``, or on ``client=``, or a subclass as ``cls=``; every one made is closed at
teardown), ``server_ms`` (Redis's own clock in ms) and ``state_of`` (every key matching a
pattern with its full content). A module using the fixture imports it::

    from tests.support.redis_limiters import (
        make_limiter_fixture,  # noqa: F401 (the make_limiter fixture)
    )
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisColdLimiter
from tests.support.redis_clients import CountingRedis


@pytest.fixture(name="make_limiter")
def make_limiter_fixture(client: CountingRedis) -> Iterator[Callable[..., RedisColdLimiter]]:
    """``make_limiter(**kwargs)``: a limiter on the test's client (or ``client=``, or a
    subclass as ``cls=``); every one made is closed at teardown."""
    made: list[RedisColdLimiter] = []

    def make(**kwargs: Any) -> RedisColdLimiter:
        cls = kwargs.pop("cls", RedisColdLimiter)
        lim: RedisColdLimiter = cls(kwargs.pop("client", client), **kwargs)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        lim.close()


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
        else:
            out[key.decode()] = client.get(key)
    return out
