"""The cache's checks catch a broken cache script: every operation of ``RedisCache``'s script
has a mutant.

A mutant is the real script text with one piece replaced (``tests/support/redis_mutants.py``:
the piece asserted to be there exactly once, in the script and in its ``.lua`` file), put on
one ``RedisCache`` in place of the script it registered (``lua/cache.lua``: every operation
of the cache in one file); ``settings.lua``, which ``record_settings`` registers at each
start, is put in place of ``lua.SETTINGS`` instead. Each check passes with the real scripts
and fails, with the message it names, with each mutant that names it. Another
``RedisCache`` of the same name, with a first level of its own, stands for another process.
The mutants only a Redis Cluster runs (``index`` and ``drain``: the set and the clear when
entries spread over slots) are in ``tests/test_redis_cluster_mutants.py``, with these checks.

==================  =============================================  ==============================
script (section)    mutant                                         the check that catches it
==================  =============================================  ==============================
cache (set)         the entry is SET without its expiry            an_entry_expires_in_redis
                    (``SET_WITHOUT_EXPIRY``)
cache (set)         the entry's header (build time, stale window)  an_entry_carries_its_build_
                    is not written (``HEADER_DROPPED``)            time_and_window
cache (settings)    an entry lives its ttl only, its stale window  a_stale_window_lengthens_an_
                    left out (``LIVES_WITHOUT_STALE``)             entrys_life
cache (index)       the index never evicts (``NO_EVICTION``)       the_size_bound_evicts_the_
                                                                   oldest
cache (set)         the evicted entries are not deleted            the_size_bound_evicts_the_
                    (``EVICTED_KEPT``)                             oldest
cache (clear)       clear deletes the index, not the entries       clear_empties_the_cache_for_
                    (``CLEAR_KEEPS_ENTRIES``)                      every_process
settings            a cache's start records nothing: the first     the_newest_start_sets_the_
                    set's write-back decides for good              cache
                    (``SETTINGS_RECORD_NOTHING``)
==================  =============================================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisCache
from tests.support.redis_mutants import Mutant, caught_alike, check_id, checks, in_file, rows

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

#: Makes a cache (``RedisCache``'s arguments after the client) running the scripts under test.
MakeCache = Callable[..., RedisCache]


def check_an_entry_expires_in_redis(make: MakeCache, client: redis.Redis) -> None:
    cache = make(ttl=30.0, stale=10.0)
    cache.put("k", "v", 0.25)
    pttl = client.pttl(cache.key_of("k"))
    assert 0 < pttl <= 40_000, f"an entry without its expiry in Redis (PTTL {pttl})"


def check_an_entry_carries_its_build_time_and_window(make: MakeCache, client: redis.Redis) -> None:
    """Another process reads an entry set with a 10 s stale window: it knows the build time
    and that the entry is fresh for its ttl only (30 s), not for its whole life."""
    make(ttl=30.0, stale=10.0).put("k", "v", 0.25)
    entry = RedisCache(client, ttl=30.0, stale=10.0).fetch_entry("k")
    assert entry is not None and entry.value == "v"
    assert entry.build_time == 0.25 and entry.fresh_for <= 30, (
        f"an entry lost its header: build time {entry.build_time}, fresh for "
        f"{entry.fresh_for:.1f} s of a 30 s ttl"
    )


def check_a_stale_window_lengthens_an_entrys_life(make: MakeCache, client: redis.Redis) -> None:
    """ttl 30 s, stale window 10 s: an entry lives 40 s in Redis, fresh for the first 30."""
    cache = make(ttl=30.0, stale=10.0)
    cache.put("k", "v", 0.25)
    pttl = client.pttl(cache.key_of("k"))
    entry = RedisCache(client, ttl=30.0, stale=10.0).fetch_entry("k")
    assert entry is not None
    assert pttl > 30_000 and entry.fresh_for > 25, (
        f"the stale window was cut out of an entry's life: PTTL {pttl} ms, fresh for "
        f"{entry.fresh_for:.1f} s of a 30 s ttl"
    )


def check_the_size_bound_evicts_the_oldest(make: MakeCache, client: redis.Redis) -> None:
    cache = make(size=2)
    for key in ("a", "b", "c"):
        cache.set(key, key)
    other = RedisCache(client, size=2)
    found = [other.get(k) for k in ("a", "b", "c")]
    assert found == [None, "b", "c"], f"the size bound kept the oldest entry: {found}"


def check_clear_empties_the_cache_for_every_process(make: MakeCache, client: redis.Redis) -> None:
    cache = make()
    cache.set("k", "v")
    cache.clear()
    left = RedisCache(client).get("k")
    assert left is None, f"an entry survived clear: another process read {left!r}"


def check_the_newest_start_sets_the_cache(make: MakeCache, client: redis.Redis) -> None:
    """The newest process to start (ttl 60 s) sets the ttl of the entries an older one sets."""
    first = make(ttl=300.0)
    first.set("k0", 0)  # its start, then its first set
    newest = make(ttl=60.0)
    assert newest.get("k0") == 0  # its start
    first.set("k1", 1)
    pttl = client.pttl(first.key_of("k1"))
    assert 0 < pttl <= 60_000, (
        f"an older process ignores the newest start: its entry lives {pttl} ms, not 60 s"
    )


SET_WITHOUT_EXPIRY = Mutant(in_file(
    "cache", ("redis.call('SET', KEYS[3], value, 'PX', lives)", "redis.call('SET', KEYS[3], value)")
), check_an_entry_expires_in_redis, "an entry without its expiry")
HEADER_DROPPED = Mutant(in_file(
    "cache", ("  if stale > 0 then value = 't' .. ARGV[7] .. ',' .. stale .. ';' .. value end\n",
              "")
), check_an_entry_carries_its_build_time_and_window, "an entry lost its header")
LIVES_WITHOUT_STALE = Mutant(in_file("cache", ("local lives = ttl + stale", "local lives = ttl")),
                             check_a_stale_window_lengthens_an_entrys_life,
                             "the stale window was cut out")
#: The index never evicts; the evicted entries are not deleted.
NO_EVICTION, EVICTED_KEPT = caught_alike(
    check_the_size_bound_evicts_the_oldest, "the size bound kept the oldest entry",
    in_file("cache", ("local over = redis.call('ZCARD', index) - size", "local over = 0")),
    in_file("cache", ("  redis.call('DEL', entries .. old)\n", "")),
)
CLEAR_KEEPS_ENTRIES = Mutant(in_file(
    "cache", ("deleted = deleted + redis.call('DEL', entries .. digest)", "deleted = deleted + 1")
), check_clear_empties_the_cache_for_every_process, "an entry survived clear")
#: ``record_settings`` registers ``lua.SETTINGS`` at each start: the test puts the mutant there.
SETTINGS_RECORD_NOTHING = Mutant(
    in_file("settings", ("redis.call('HSET', KEYS[1], 'by', unpack(ARGV))\n", "")),
    check_the_newest_start_sets_the_cache, "an older process ignores the newest start",
    in_lua="SETTINGS",
)


def real_cache(client: Any) -> MakeCache:
    """``make(**kwargs)``: a RedisCache on ``client`` (the real scripts, or a mutant's once
    a ``Mutant`` installs it)."""
    return lambda **kwargs: RedisCache(client, **kwargs)


@pytest.mark.parametrize("check", checks(globals()), ids=check_id)
def test_each_check_passes_with_the_real_scripts(
    check: Callable[[MakeCache, redis.Redis], None], client: redis.Redis
) -> None:
    check(real_cache(client), client)


@pytest.mark.parametrize("row", rows(globals()))
def test_a_cache_with_a_broken_script_fails_the_check_for_it(
    row: Mutant, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    row.caught(real_cache(client), client, monkeypatch=monkeypatch)
