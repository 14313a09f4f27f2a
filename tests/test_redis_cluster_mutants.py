"""The mutants only a Redis Cluster shows, on a REAL three-primary cluster
(``tests/support/redis_cluster.py``; the module's ``client`` is ``connect`` of it, as in
``tests/test_redis_cluster.py``, so the suite's ``factory`` makes limiters on the cluster).

On one Redis a script may touch any key, and the cache keeps its entries under its own hash
tag; on a Cluster a script touches its own slot only, and the cache's entries spread over the
nodes: the set and the clear are then operations of their own (``index`` and ``drain`` of
``lua/cache.lua``) followed by commands on the entries' nodes. A mutant is the real script
text with one piece replaced (``tests/support/redis_mutants.py``: the piece asserted to be
there exactly once), put on the object in place of the script it registered; each check
passes with the real scripts and fails with each mutant that names it.

==================  =============================================  ==============================
script (section)    mutant                                         the check that catches it
==================  =============================================  ==============================
limiter (its keys)  the tag the script builds its own keys from    gate_place_returned_after_
                    (a client's waiters, doorbells) loses its      timeout (of ``limiter_
                    opening brace (``TAG_LOSES_BRACE``)            checks``): an acquire that
                                                                   queues fails, its client's
                                                                   queue in another slot
cache (set and      the digest indexed is the size argument        the_size_bound_evicts_the_
index)              (``SPREAD_WRONG_DIGEST``: one index entry for  oldest
                    every key, nothing evicted)
cache (index)       the digests evicted are not answered           the_size_bound_evicts_the_
                    (``TAIL_DROPS_EVICTED``: their entries stay)   oldest
cache (drain)       the drain answers no digest                    clear_empties_the_cache_for_
                    (``DRAIN_ANSWERS_NOTHING``: the entries stay)  every_process
==================  =============================================  ==============================

The cache's checks are those of ``tests/test_redis_cache_mutants.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisColdLimiter
from tests.support.limiter_checks import check_gate_place_returned_after_timeout
from tests.support.redis_cluster import redis_cluster_fixture  # noqa: F401 (a fixture)
from tests.support.redis_mutants import Mutant, caught_alike, check_id, checks, in_file, rows
from tests.support.threads import ThreadRunner
from tests.test_redis_cache_mutants import (
    MakeCache,
    check_clear_empties_the_cache_for_every_process,
    check_the_size_bound_evicts_the_oldest,
    real_cache,
)
from tests.test_redis_cluster import (  # noqa: F401 (the client fixtures)
    cluster_client_fixture,
    cluster_plain_client_fixture,
)
from tests.test_redis_mutants import mutant

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

TAG_LOSES_BRACE = mutant(
    in_file("limiter", ("local tag = string.sub(holders, 1, -8)",
                        "local tag = string.sub(holders, 2, -8)")),
)
#: The digest indexed is the size argument; the digests evicted are not answered.
SPREAD_WRONG_DIGEST, TAIL_DROPS_EVICTED = caught_alike(
    check_the_size_bound_evicts_the_oldest, "the size bound kept the oldest entry",
    in_file("cache", ("local digest = ARGV[5]", "local digest = ARGV[4]")),
    in_file(
        "cache", ("  for _, old in ipairs(evicted) do reply[#reply + 1] = old end\n", "")
    ),
)
DRAIN_ANSWERS_NOTHING = Mutant(in_file("cache", ("return digests", "return {}")),
                               check_clear_empties_the_cache_for_every_process,
                               "an entry survived clear")



def test_the_limiter_check_passes_on_a_cluster(
    factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    check_gate_place_returned_after_timeout(factory(RedisColdLimiter), threads)


def test_a_tag_without_its_brace_fails_every_script_that_builds_a_key(
    factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    with pytest.raises(redis.ResponseError, match="non local key"):
        check_gate_place_returned_after_timeout(factory(TAG_LOSES_BRACE), threads)


@pytest.mark.parametrize("check", checks(globals()), ids=check_id)
def test_each_cache_check_passes_on_a_cluster(
    check: Callable[[MakeCache, Any], None], client: Any
) -> None:
    check(real_cache(client), client)


@pytest.mark.parametrize("row", rows(globals()))
def test_a_cluster_cache_with_a_broken_script_fails_the_check_for_it(
    row: Mutant, client: Any
) -> None:
    row.caught(real_cache(client), client)
