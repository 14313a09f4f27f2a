"""Tests of reachlimit.redis.RedisCache against a real redis-server, in one process.

Several cache objects on the same Redis and name stand for several processes (the tests with
real processes are in ``tests/test_redis_flight_processes.py``). A client that counts the
commands it sends proves when the first level answered without Redis.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from reachlimit import TTLCache
from reachlimit.redis import RedisCache
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.clock import FakeClock
from tests.support.processes import free_port
from tests.support.redis_clients import CountingRedis
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def entries(client: redis.Redis) -> int:
    return len(client.keys("*:e:*"))


# -- construction -----------------------------------------------------------------------------


@invalid_arguments(
    ttl=("ttl > 0", [0, float("inf"), True]),
    local_ttl=("local_ttl > 0", [-1]),
    size=("size >= 1", [0, 2.5]),
    local_size=("local_size >= 1", [0]),
    codec=('codec must be "json", "bytes" or "auto"', ["pickle"]),
    name=("name must be a non-empty string without braces", ["a{b"]),
    prefix=("prefix must be a non-empty string without braces", [""]),
)
def test_invalid_arguments_raise_value_error(
    client: CountingRedis, kwargs: dict[str, Any], message: str
) -> None:
    before = client.total()
    assert_value_error(lambda: RedisCache(client, **kwargs), message)
    assert client.total() == before


def test_a_decoding_client_is_refused(make_client: Callable[..., CountingRedis]) -> None:
    with pytest.raises(ValueError, match="decode_responses"):
        RedisCache(make_client(decode_responses=True))


# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"a": [1, 2.5, "x", None, True]}, [1, 2], "text é 🙂", 7, 1.5, True, {"nested": {"k": []}}],
)
def test_json_values_round_trip_across_objects(client: CountingRedis, value: Any) -> None:
    RedisCache(client).set("k", value)
    assert RedisCache(client).get("k") == value  # another object: read from Redis


def test_json_turns_tuples_into_lists(client: CountingRedis) -> None:
    RedisCache(client).set("k", (1, 2))
    assert RedisCache(client).get("k") == [1, 2]


def test_bytes_values_round_trip(client: CountingRedis) -> None:
    RedisCache(client, codec="bytes").set("k", b"\x00\xffraw")
    assert RedisCache(client, codec="bytes").get("k") == b"\x00\xffraw"


@pytest.mark.parametrize(("codec", "value"), [("json", object()), ("json", float("nan")),
                                              ("json", {1j: 1}), ("bytes", "text")])
def test_a_value_the_codec_cannot_store_is_a_type_error_and_stores_nothing(
    client: CountingRedis, codec: str, value: Any
) -> None:
    cache = RedisCache(client, codec=codec)
    with pytest.raises(TypeError, match=f'codec "{codec}"'):
        cache.set("k", value)
    assert entries(client) == 0 and cache.get("k") is None


def test_none_stores_nothing(client: CountingRedis) -> None:
    cache = RedisCache(client)
    cache.set("k", None)
    assert entries(client) == 0


def test_one_round_trip_per_set(client: CountingRedis) -> None:
    cache = RedisCache(client)
    cache.set("first", 1)  # may load the script
    before = client.total()
    cache.set("second", 2)
    assert client.total() - before == 1 and client.sent["EVALSHA"] >= 1


# -- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["{braces}", "}{", "x" * 100_000, "ünïcödé ✓ 🙂", "\ud800 lone surrogate", b"\x00\xff{",
     -(10**40), pytest.param(10**5000, id="huge-int"), ("a", 1, b"b", ("nested", 2)), "", ()],
)
def test_any_key_is_safe_and_bounded(client: CountingRedis, key: Any) -> None:
    cache = RedisCache(client)
    cache.set(key, "v")
    redis_key = cache.key_of(key)
    assert len(redis_key) < 100 and redis_key.count("{") == 1 and redis_key.count("}") == 1
    assert RedisCache(client).get(key) == "v"
    # The entry and the index are in one Cluster slot, whatever the key.
    assert key_slot(redis_key.encode()) == key_slot(b"{reachlimit:reachlimit:cache}:index")


def test_keys_of_different_types_or_shapes_never_collide(client: CountingRedis) -> None:
    keys: list[Any] = ["1", 1, b"1", ("1",), (1,), ("1", "2"), ("12",), (("1",), "2"), "1,2",
                       0, -1, 255, 256, -256, 2**64, -(2**64)]
    cache = RedisCache(client)
    for i, key in enumerate(keys):
        cache.set(key, i)
    assert len({cache.key_of(k) for k in keys}) == len(keys)
    other = RedisCache(client)
    assert [other.get(k) for k in keys] == list(range(len(keys)))


@pytest.mark.parametrize(
    "key", [1.5, None, object(), frozenset({1}), ("ok", 2.0), ["list"], {"a": 1}]
)
def test_a_key_of_another_type_is_a_clear_type_error(client: CountingRedis, key: Any) -> None:
    cache = RedisCache(client)
    with pytest.raises(TypeError, match="str, bytes, int or a tuple"):
        cache.set(key, 1)
    with pytest.raises(TypeError, match="str, bytes, int or a tuple"):
        cache.get(key)


# -- ttl and size -----------------------------------------------------------------------------


def test_entries_carry_the_ttl_in_redis(client: CountingRedis) -> None:
    cache = RedisCache(client, ttl=30.0)
    cache.set("k", 1)
    assert 0 < client.pttl(cache.key_of("k")) <= 30_000
    assert 0 < client.pttl("{reachlimit:reachlimit:cache}:index") <= 30_000


def test_an_expired_entry_is_a_miss_everywhere(client: CountingRedis) -> None:
    RedisCache(client, ttl=0.2).set("k", 1)
    other = RedisCache(client, ttl=0.2)
    wait_until("the entry expired in Redis", lambda: entries(client) == 0, timeout=10)
    assert other.get("k") is None


def test_the_size_bound_evicts_the_oldest_one_at_a_time(client: CountingRedis) -> None:
    cache = RedisCache(client, size=3)
    for key in ("a", "b", "c"):
        cache.set(key, key)
    cache.set("a", "a2")  # a re-set key becomes the newest
    cache.set("d", "d")
    other = RedisCache(client, size=3)
    assert [other.get(k) for k in ("a", "b", "c", "d")] == ["a2", None, "c", "d"]
    assert entries(client) == 3
    cache.set("e", "e")
    # (Every cache object of a name has its settings: one name, one set of settings.)
    assert RedisCache(client, size=3).get("c") is None and entries(client) == 3
    assert client.zcard("{reachlimit:reachlimit:cache}:index") == 3


def test_many_sets_within_a_millisecond_keep_their_order(client: CountingRedis) -> None:
    cache = RedisCache(client, size=10)
    for i in range(40):  # far more sets than milliseconds
        cache.set(i, i)
    other = RedisCache(client, size=10)  # the name's settings
    assert [k for k in range(40) if other.get(k) is not None] == list(range(30, 40))
    digests = client.zrange("{reachlimit:reachlimit:cache}:index", 0, -1)
    assert [d.decode() for d in digests] == [cache.key_of(k).rsplit(":", 1)[1]
                                             for k in range(30, 40)]


def test_expired_entries_leave_the_index_before_anything_is_evicted(
    client: CountingRedis,
) -> None:
    # One name, one set of settings: a ttl short enough for "old" to expire during the
    # test, long enough for "a" and "b" to outlive the few commands that follow their sets.
    short = RedisCache(client, ttl=1.5, size=2)
    short.set("old", 1)
    wait_until("the entry expired", lambda: entries(client) == 0, timeout=10)
    cache = RedisCache(client, ttl=1.5, size=2)
    cache.set("a", 1)
    cache.set("b", 2)
    assert entries(client) == 2 and client.zcard("{reachlimit:reachlimit:cache}:index") == 2


# -- hostile or corrupt values ----------------------------------------------------------------

RAN: list[str] = []


def _record(what: str) -> str:
    RAN.append(what)
    return what


class _Trap:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_record, ("unpickled",))


HOSTILE = [
    pickle.dumps(_Trap()),
    b"",
    b"garbage",
    b"j{not json",
    b"j\xff\xfe",
    b"j" + b"[" * 100_000,
    b"j" + b"9" * 100_000,
    b"b\x00bytes under the json codec",
    b"jnull",
]


@pytest.mark.parametrize("data", HOSTILE)
def test_a_hostile_value_is_a_miss_and_runs_nothing(
    client: CountingRedis, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    cache = RedisCache(client)
    client.set(cache.key_of("k"), data)
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        assert cache.get("k") is None
        assert cache.get("k") is None
    assert RAN == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (0 if data == b"jnull" else 1)  # logged once, not per read


def test_a_json_value_is_a_miss_under_the_bytes_codec(client: CountingRedis) -> None:
    RedisCache(client).set("k", "text")
    assert RedisCache(client, codec="bytes").get("k") is None


# -- the first level --------------------------------------------------------------------------


def test_a_warm_hit_through_the_first_level_makes_no_redis_call(client: CountingRedis) -> None:
    cache = RedisCache(client)
    cache.set("k", {"v": 1})
    before = client.total()
    for _ in range(5):
        assert cache.get("k") == {"v": 1}
    assert client.total() == before


def test_a_hit_from_redis_fills_the_first_level(
    client: CountingRedis, make_client: Callable[..., CountingRedis]
) -> None:
    RedisCache(client).set("k", 1)
    reader_client = make_client()
    reader = RedisCache(reader_client)
    assert reader.get("k") == 1
    assert reader_client.sent["GET"] == 1
    assert reader.get("k") == 1
    assert reader_client.sent["GET"] == 1


def test_a_miss_is_not_cached_so_a_value_set_elsewhere_is_seen_at_once(
    client: CountingRedis, make_client: Callable[..., CountingRedis]
) -> None:
    reader_client = make_client()
    reader = RedisCache(reader_client)
    assert reader.get("k") is None
    RedisCache(client).set("k", "new")
    assert reader.get("k") == "new"
    assert reader_client.sent["GET"] == 2


def test_a_changed_value_is_stale_in_another_first_level_for_at_most_local_ttl(
    client: CountingRedis,
) -> None:
    writer = RedisCache(client, local_ttl=1.0)
    reader = RedisCache(client, local_ttl=1.0)
    clock = FakeClock()
    reader._local = TTLCache(256, 1.0, clock=clock)
    writer.set("k", "v1")
    assert reader.get("k") == "v1"
    writer.set("k", "v2")
    assert writer.get("k") == "v2"  # the writer's own first level is updated
    clock.advance(0.99)
    assert reader.get("k") == "v1"  # still within local_ttl
    clock.advance(0.02)
    assert reader.get("k") == "v2"


# -- Redis failing ----------------------------------------------------------------------------


def test_redis_errors_propagate_from_get_and_set() -> None:
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=0.2,
                       socket_connect_timeout=0.2)
    cache = RedisCache(dead)
    with pytest.raises(redis.exceptions.ConnectionError):
        cache.get("k")
    with pytest.raises(redis.exceptions.ConnectionError):
        cache.set("k", 1)
    assert cache.local.get("k") is None  # a failed set stores nothing here either


def test_the_auto_codec_keeps_bytes_as_bytes_and_the_rest_as_json(client: CountingRedis) -> None:
    cache = RedisCache(client, codec="auto", local_ttl=0.001)
    cache.set("body", b"{\"rendered\":1}")
    cache.set("dict", {"a": [1, 2]})
    other = RedisCache(client, codec="auto")  # another process: nothing in its first level
    assert other.get("body") == b"{\"rendered\":1}"
    assert other.get("dict") == {"a": [1, 2]}
    with pytest.raises(TypeError):
        cache.set("object", object())
