"""TTLCache's constructor: the keywords it shares with RedisCache (``ttl=``, ``size=``), the
older positional order ``(maxsize, ttl)`` and the ``maxsize=`` keyword, and the mixes that
are a TypeError."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from reachlimit import TTLCache
from reachlimit.redis import RedisCache


def _filled(cache: TTLCache[int], count: int) -> list[int]:
    """Put ``count`` keys into ``cache``; the keys it still holds."""
    for n in range(count):
        cache.set(n, n)
    return [n for n in range(count) if cache.get(n) == n]


def test_ttl_and_size_keywords_set_the_ttl_and_the_bound(fake_clock: Any) -> None:
    cache: TTLCache[int] = TTLCache(ttl=10, size=3, clock=fake_clock)
    assert (cache.ttl, cache.size, cache.maxsize) == (10.0, 3, 3)
    assert _filled(cache, 5) == [2, 3, 4]  # the bound is 3: the oldest two went ...
    cache.set(5, 5)
    assert len(cache) == 3  # ... and it stays 3
    fake_clock.advance(10)
    assert cache.get(5) is None  # and the ttl is 10 s


def test_the_old_positional_order_and_the_maxsize_keyword_still_work() -> None:
    positional: TTLCache[int] = TTLCache(2, 7)
    keyword: TTLCache[int] = TTLCache(maxsize=2, ttl=7)
    mixed: TTLCache[int] = TTLCache(2, ttl=7)
    for cache in (positional, keyword, mixed):
        assert (cache.size, cache.maxsize, cache.ttl) == (2, 2, 7.0)
        assert _filled(cache, 4) == [2, 3]  # bound 2


def test_the_defaults_are_unchanged() -> None:
    cache: TTLCache[int] = TTLCache()
    assert (cache.size, cache.maxsize, cache.ttl, cache.stale) == (256, 256, 300.0, 0.0)
    assert TTLCache(ttl=5).size == 256 and TTLCache(size=9).ttl == 300.0


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"size": 4, "maxsize": 4}),
        ((), {"size": 4, "maxsize": 8}),
        ((4,), {"size": 4}),
        ((4,), {"maxsize": 4}),
        ((4, 10), {"ttl": 10}),
        ((4, 10), {"size": 4}),
    ],
    ids=["size+maxsize", "size+other-maxsize", "positional+size", "positional+maxsize",
         "positional+ttl", "two-positionals+size"],
)
def test_a_bound_or_a_ttl_given_twice_is_a_type_error(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(TypeError):
        TTLCache(*args, **kwargs)


def test_size_and_maxsize_together_say_which_to_keep() -> None:
    with pytest.raises(TypeError) as info:
        TTLCache(size=4, maxsize=4)
    assert str(info.value) == (
        "TTLCache() takes size or maxsize (its old name, or the first positional argument), "
        "not both"
    )


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "8"])
def test_a_bad_bound_is_named_as_it_was_given(bad: Any) -> None:
    with pytest.raises(ValueError) as by_size:
        TTLCache(size=bad)
    with pytest.raises(ValueError) as by_maxsize:
        TTLCache(maxsize=bad)
    with pytest.raises(ValueError) as by_position:
        TTLCache(bad)
    assert str(by_size.value) == "size >= 1"
    assert str(by_maxsize.value) == str(by_position.value) == "maxsize >= 1"


def test_the_in_process_and_the_shared_cache_take_the_same_keywords() -> None:
    """One set of keywords makes either cache with the same TTL and bound (a RedisCache is
    made without connecting: nothing here talks to a server)."""
    client = redis.Redis(host="127.0.0.1", port=1)
    try:
        settings: dict[str, Any] = {"ttl": 42.0, "size": 17, "stale": 3.0}
        local: TTLCache[Any] = TTLCache(**settings)
        shared = RedisCache(client, "args", **settings)
        assert (local.ttl, local.size, local.stale) == (shared.ttl, shared.size, shared.stale)
        assert (local.ttl, local.size, local.stale) == (42.0, 17, 3.0)
    finally:
        client.close()
