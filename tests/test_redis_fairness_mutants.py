"""The fairness checks catch a Redis limiter that is unfair in the scripts.

Each mutant is the real script text with one piece replaced (the general steps of
``lua/limiter.lua``; ``in_file`` checks the piece is there exactly once), and each must fail
the rule of ``tests/support/fairness.py`` it breaks while passing one it leaves intact:

* never displaces: a full queue refuses everybody (rule 2);
* promotes in global ticket order, ignoring clients (rule 3);
* displaces the oldest waiter of the biggest client instead of its newest (rule 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reachlimit.redis import RedisColdLimiter
from tests.support import fairness
from tests.support.redis_mutants import in_file
from tests.support.threads import ThreadRunner
from tests.test_redis_mutants import mutant

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

_NEVER = "  if not victim or most < mine + 2 or not redis.call('ZSCORE', queue, victim) then\n"
_BY_CLIENT = "  while redis.call('ZCARD', clients) > 1 do\n"
_NEWEST = "local last = redis.call('ZRANGE', of_client .. id, -1, -1, 'WITHSCORES')"
NEVER_DISPLACES = mutant(in_file("limiter", (_NEVER, "  if true then\n")))
GLOBAL_FIFO = mutant(in_file("limiter", (_BY_CLIENT, "  while false do\n")))
DISPLACES_THE_OLDEST = mutant(
    in_file("limiter", (_NEWEST, _NEWEST.replace("-1, -1, 'WITHSCORES'", "0, 0, 'WITHSCORES'")))
)


@pytest.mark.parametrize(
    ("cls", "broken", "intact"),
    [
        pytest.param(
            NEVER_DISPLACES,
            fairness.check_newest_of_the_biggest_is_displaced,
            fairness.check_round_robin_across_clients,
            id="never-displaces",
        ),
        pytest.param(
            GLOBAL_FIFO,
            fairness.check_round_robin_across_clients,
            fairness.check_ties_go_to_the_newest_waiter,
            id="global-fifo",
        ),
        pytest.param(
            DISPLACES_THE_OLDEST,
            fairness.check_newest_of_the_biggest_is_displaced,
            fairness.check_round_robin_across_clients,
            id="displaces-the-oldest",
        ),
    ],
)
def test_an_unfair_redis_limiter_fails_the_rule_it_breaks(
    cls: type[RedisColdLimiter],
    broken: Callable[..., None],
    intact: Callable[..., None],
    factory: Callable[[type[RedisColdLimiter]], Any],
    threads: ThreadRunner,
) -> None:
    make = factory(cls)
    with pytest.raises(AssertionError):
        broken(threads, make)
    intact(threads, make)  # caught for the right reason: the rest of it is fair
