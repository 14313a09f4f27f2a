"""Tests of TTLCache, the default warm cache. Time moves only through a FakeClock."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reachlimit import ColdLimiter, ColdPath, Entry, TTLCache
from reachlimit.redis import RedisHealth, ResilientCache
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.caches import DictCache

pytestmark = pytest.mark.timeout(30)


@invalid_arguments(
    maxsize=("maxsize >= 1", [0, -3, True, 2.0]),
    ttl=("ttl > 0", [0, -1.0, True, "300", float("nan")]),
    stale=("stale >= 0 (seconds a stale entry may still be served)",
           [-1, -0.5, True, "30", float("inf"), float("nan")]),
)
def test_invalid_arguments_raise_value_error_with_exact_message(
    kwargs: dict[str, Any], message: str
) -> None:
    assert_value_error(lambda: TTLCache(**kwargs), message)


def test_defaults_are_five_minutes_and_256_entries() -> None:
    cache: TTLCache[Any] = TTLCache()
    assert (cache.maxsize, cache.ttl) == (256, 300.0)


def test_hit_and_miss(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=4, ttl=10, clock=fake_clock)
    assert cache.get("a") is None
    cache.set("a", "A")
    assert cache.get("a") == "A"
    assert cache.get("b") is None
    assert len(cache) == 1


def test_entry_expires_after_ttl(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=4, ttl=10, clock=fake_clock)
    cache.set("a", "A")
    fake_clock.advance(9.999)
    assert cache.get("a") == "A"
    fake_clock.advance(0.001)  # exactly ttl after the set: expired
    assert cache.get("a") is None
    assert len(cache) == 0  # an expired entry found by get is dropped


def test_reset_refreshes_the_ttl(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=4, ttl=10, clock=fake_clock)
    cache.set("a", "A1")
    fake_clock.advance(6)
    cache.set("a", "A2")
    fake_clock.advance(6)
    assert cache.get("a") == "A2"


def test_full_cache_drops_only_the_oldest_never_wipes(fake_clock: Any) -> None:
    cache: TTLCache[int] = TTLCache(maxsize=5, ttl=100, clock=fake_clock)
    for i in range(5):
        cache.set(i, i)
        fake_clock.advance(1)
    cache.set(5, 5)
    assert len(cache) == 5
    assert cache.get(0) is None
    assert [cache.get(i) for i in range(1, 6)] == [1, 2, 3, 4, 5]


def test_full_cache_evicts_expired_entries_first(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=4, ttl=10, clock=fake_clock)
    cache.set("old1", "x")
    cache.set("old2", "x")
    fake_clock.advance(5)
    cache.set("young1", "y")
    cache.set("young2", "y")
    fake_clock.advance(6)  # old1, old2 expired; young1, young2 live for 4 s more
    cache.set("new", "n")
    assert len(cache) == 3  # both expired entries went, no live entry did
    assert [cache.get(k) for k in ("young1", "young2", "new")] == ["y", "y", "n"]
    assert cache.get("old1") is None and cache.get("old2") is None


def test_reset_moves_the_key_to_the_back(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=3, ttl=100, clock=fake_clock)
    for key in "abc":
        cache.set(key, key.upper())
    cache.set("a", "A2")  # a is now the youngest
    cache.set("d", "D")  # so b, not a, is the oldest and goes
    assert cache.get("b") is None
    assert [cache.get(k) for k in "acd"] == ["A2", "C", "D"]
    assert len(cache) == 3


def test_reset_of_a_present_key_in_a_full_cache_evicts_nothing(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(maxsize=2, ttl=100, clock=fake_clock)
    cache.set("a", "A")
    cache.set("b", "B")
    cache.set("b", "B2")
    assert (cache.get("a"), cache.get("b"), len(cache)) == ("A", "B2", 2)


def test_clear(fake_clock: Any) -> None:
    cache: TTLCache[int] = TTLCache(maxsize=3, ttl=100, clock=fake_clock)
    cache.set("a", 1)
    cache.clear()
    assert (len(cache), cache.get("a")) == (0, None)


def test_concurrent_use_keeps_the_bound(threads: Any) -> None:
    cache: TTLCache[int] = TTLCache(maxsize=16, ttl=100)
    start = threading.Barrier(8, timeout=5.0)

    def worker(n: int) -> None:
        start.wait()
        for i in range(500):
            cache.set((n, i), i)
            value = cache.get((n, i))
            assert value in (None, i)  # None only if another writer evicted it since
            assert len(cache) <= 16

    for n in range(8):
        threads.start(worker, n, name=f"writer-{n}")
    threads.join_all(timeout=20.0)
    assert len(cache) == 16


# A reference model: same TTL for all, insertion-ordered, expired-first then oldest.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 7), st.integers()),
        st.tuples(st.just("get"), st.integers(0, 7), st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 6), st.just(0)),
    ),
    max_size=60,
)


# No deadline and no too_slow check: how fast examples run is the machine's, not the cache's.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(maxsize=st.integers(1, 5), ops=operations)
def test_matches_a_reference_model(maxsize: int, ops: list[tuple[str, int, int]]) -> None:
    now = [0.0]
    ttl = 10.0
    cache: TTLCache[int] = TTLCache(maxsize=maxsize, ttl=ttl, clock=lambda: now[0])
    model: dict[int, tuple[float, int]] = {}  # key -> (expires, value), insertion-ordered
    for op, key, value in ops:
        if op == "tick":
            now[0] += key
        elif op == "get":
            entry = model.get(key)
            expected = None
            if entry is not None:
                if entry[0] <= now[0]:
                    del model[key]
                else:
                    expected = entry[1]
            assert cache.get(key) == expected
        else:
            model.pop(key, None)
            if len(model) >= maxsize:
                for k in [k for k, (exp, _) in model.items() if exp <= now[0]]:
                    del model[k]
                if len(model) >= maxsize:
                    del model[next(iter(model))]
            model[key] = (now[0] + ttl, value)
            cache.set(key, value)
            assert len(cache._data) <= maxsize  # never over the bound
        live = {k: v for k, (exp, v) in model.items() if exp > now[0]}
        assert {k: e[1] for k, e in cache._data.items() if e[0] > now[0]} == live


def test_the_eviction_sweep_drops_entries_that_expire_exactly_now(fake_clock: Any) -> None:
    """``get`` treats an entry whose expiry equals "now" as gone; so does the sweep."""
    cache: TTLCache[str] = TTLCache(maxsize=2, ttl=10.0, clock=fake_clock)
    cache.set("a", "A")
    cache.set("b", "B")
    fake_clock.advance(10.0)  # both expire exactly now
    cache.set("c", "C")
    assert len(cache) == 1  # both expired entries swept, not just the one oldest
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, None, "C")


def test_ttls_below_one_second_are_accepted_and_honoured(fake_clock: Any) -> None:
    cache: TTLCache[str] = TTLCache(ttl=0.25, clock=fake_clock)
    cache.set("k", "v")
    fake_clock.advance(0.2)
    assert cache.get("k") == "v"
    fake_clock.advance(0.05)
    assert cache.get("k") is None


# -- what ColdPath and ResilientCache ask of any cache: lookup, put, or get and set only ----


class PutCache(DictCache):
    """A cache that also takes a value's build time (``put``)."""

    def put(self, key: Any, value: Any, build_time: float) -> None:
        self.calls.append(("put", key, build_time))
        self.data[key] = value


def test_a_path_gives_a_cache_that_has_put_the_time_its_build_took() -> None:
    cache = PutCache()
    path = ColdPath(ColdLimiter(), cache)
    assert path.fetch("k", lambda: "v").status == "stored"
    assert [call[:2] for call in cache.calls] == [("get", "k"), ("get", "k"), ("put", "k")]
    took = cache.calls[-1][2]
    assert isinstance(took, float) and took >= 0.0
    assert path.fetch("k", lambda: "other") == ("v", "hit", None)


def test_a_plain_cache_under_a_resilient_one_answers_entries_of_unknown_freshness() -> None:
    """ResilientCache.lookup asks its shared cache, and then its fallback, for an entry: a
    cache with only ``get`` answers its value as one fresh for an unknown time (infinite),
    built in an unknown time (0), and a miss as None. No Redis is reached."""
    remote, local = DictCache(), DictCache()
    health = RedisHealth("redis://127.0.0.1")  # up until a call fails; no probe thread
    cache = ResilientCache(remote, local, health)
    remote.data["k"] = "shared"
    assert cache.lookup("k") == Entry("shared", math.inf, 0.0)
    assert cache.lookup("other") is None
    assert remote.calls == [("get", "k"), ("get", "other")]

    class Down(DictCache):
        def get(self, key: Any) -> Any:
            raise redis.ConnectionError("Redis is down")

    local.data["k"] = "fallback"
    cache = ResilientCache(Down(), local, RedisHealth("redis://127.0.0.1"))
    assert cache.lookup("k") == Entry("fallback", math.inf, 0.0)
    assert local.calls == [("get", "k")]
