"""The key checks catch a broken Redis limiter too.

Each check of ``tests/support/limiter_checks.py`` passes on ``RedisColdLimiter`` and fails,
for the reason it names, on a ``RedisColdLimiter`` whose Lua scripts forget a place on
purpose. A mutant's script is the real script text with one piece replaced; the test first
asserts that the piece is there exactly once in every script it changes, so a change of the
real scripts makes the mutant fail loudly instead of quietly testing the unchanged code.

Mutants:

* the poll script's timeout branch keeps the waiter queued (its place is never given back);
* the poll script's give-up branch keeps the waiter queued (a cancel keeps the place);
* promotion (``fill``, in every script) moves the oldest waiter into the holders but leaves
  it in the queue too;
* the release script leaves the holder where it is (the slot is never given back).

The ``factory`` fixture (``tests/support/redis_limiters.py``) stands for
``ColdLimiter(active, queue, wait, clock=...)``: each call makes a limiter on a fresh name (so
no check sees another's leftovers). A ``FakeClock`` that steps
on every read means "the wait runs out at once" in the checks; on Redis, whose clock cannot
be faked, that becomes a 50 ms wait; otherwise the wait is a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit.redis import RedisColdLimiter, lua
from tests.support.limiter_checks import (
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_gate_place_returned_after_timeout,
    check_queue_bound,
    check_slots_come_back,
)
from tests.support.threads import ThreadRunner

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

#: Each script a limiter registers, and the attribute holding its EVALSHA head (the SHA and
#: the encoded keys the hot paths send themselves), if it has one.
SCRIPTS = {
    "_acquire_script": "_acquire_head",
    "_refusing_script": "_refusing_head",
    "_release_script": "_release_head",
    "_poll_script": "_poll_head",
    "_renew_script": None,
    "_stats_script": None,
    "_record_script": None,
}


def mutant(
    changes: tuple[tuple[str, str], ...], scripts: tuple[str, ...]
) -> type[RedisColdLimiter]:
    """A RedisColdLimiter whose ``scripts`` (attribute names) run the text the real limiter
    registers with each ``(old, new)`` of ``changes`` applied. The check that each ``old`` is
    found exactly once in each script is made on every limiter made, before it is used, on
    the text that limiter registered (the same for every limiter: each reads its settings
    from Redis)."""

    class Mutant(RedisColdLimiter):
        def __init__(self, client: redis.Redis, *args: Any, **kwargs: Any) -> None:
            super().__init__(client, *args, **kwargs)
            for attr in scripts:
                assert attr in SCRIPTS and hasattr(self, attr), f"no {attr} any more"
                text: str = getattr(self, attr).script
                broken = text
                for old, new in changes:
                    assert broken.count(old) == 1, f"{attr} no longer holds {old!r} once"
                    broken = broken.replace(old, new)
                assert broken != text
                script = client.register_script(broken)
                setattr(self, attr, script)
                head_attr = SCRIPTS[attr]
                if head_attr is not None:  # the hot paths send this SHA themselves
                    head = getattr(self, head_attr)
                    setattr(self, head_attr, (script.sha.encode(), *head[1:]))

    return Mutant


# The pieces replaced must be in the module's texts once; a change there fails here, at
# collection, and in each Mutant.__init__ for the texts built from them.
_PIECES = (
    (lua.POLL, "if remaining <= 0 then\n  forget_waiter(token)\n"),
    (lua.POLL, "if leaving ~= 0 then\n  forget_waiter(token)\n"),
    (lua.FRAGMENTS["limiter_steps"], "  if token then forget_waiter(token) end\n"),
    (lua.FRAGMENTS["limiter_release"], "local mine = redis.call('ZREM', holders, ARGV[4])"),
    (lua.FRAGMENTS["limiter_release_first"], "return redis.call('ZREM', holders, ARGV[4])"),
)
for _text, _piece in _PIECES:
    assert _text.count(_piece) == 1, f"the scripts no longer hold {_piece!r} once"

#: The poll script's timeout branch, without the line that gives the place back.
TIMEOUT_KEEPS_PLACE = mutant(
    (("if remaining <= 0 then\n  forget_waiter(token)\n", "if remaining <= 0 then\n"),),
    ("_poll_script",),
)
#: The poll script's give-up branch (cancelled, or an error), keeping the place.
GIVE_UP_KEEPS_PLACE = mutant(
    (("if leaving ~= 0 then\n  forget_waiter(token)\n", "if leaving ~= 0 then\n"),),
    ("_poll_script",),
)
#: Promotion that forgets to take the promoted waiter out of the queue (in every script,
#: since every script runs the shared steps and may promote): the next waiter in turn of a
#: queue with one client (the checks' anonymous one) is the oldest ticket.
PROMOTION_KEEPS_PLACE = mutant(
    (
        (
            "  if token then forget_waiter(token) end\n",
            "  if token then\n    redis.call('ZREM', alive, token)\n"
            "    redis.call('HDEL', deadlines, token)\n  end\n",
        ),
    ),
    tuple(SCRIPTS),
)
#: A release that answers as if it freed the slot, and frees nothing: on its common path
#: (a slot free besides) and on the general one.
RELEASE_KEEPS_SLOT = mutant(
    (
        (
            "return redis.call('ZREM', holders, ARGV[4])",
            "return redis.call('ZSCORE', holders, ARGV[4]) and 1 or 0",
        ),
        (
            "local mine = redis.call('ZREM', holders, ARGV[4])",
            "local mine = redis.call('ZSCORE', holders, ARGV[4]) and 1 or 0",
        ),
    ),
    ("_release_script",),
)


ALL_CHECKS = (
    check_queue_bound,
    check_gate_place_returned_after_timeout,
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_slots_come_back,
)


def test_the_checks_pass_on_the_real_redis_limiter(
    factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    for check in ALL_CHECKS:
        check(factory(RedisColdLimiter), threads)


TIMEOUT, CANCEL, PROMOTION = (
    check_gate_place_returned_after_timeout,
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
)


def case(
    cls: type[RedisColdLimiter],
    check: Callable[..., None],
    reason: str,
    name: str,
    left_out: tuple[Callable[..., None], ...] = (),
) -> Any:
    """A row of the table below: the mutant, the check it must fail with ``reason``, and the
    checks it must pass: every other one of ALL_CHECKS, in that order, but ``left_out``."""
    intact = tuple(c for c in ALL_CHECKS if c is not check and c not in left_out)
    return pytest.param(cls, check, reason, intact, id=name)


@pytest.mark.parametrize(
    ("cls", "check", "reason", "intact"),
    [
        case(TIMEOUT_KEEPS_PLACE, TIMEOUT, "gate place not returned after timeout",
             "timeout-keeps-place"),
        case(GIVE_UP_KEEPS_PLACE, CANCEL, "gate place not returned after cancel",
             "give-up-keeps-place"),
        case(PROMOTION_KEEPS_PLACE, PROMOTION, "gate place not returned after promotion",
             "promotion-keeps-place"),
        # No release at all: the promotion check would only wait for a hand-off that never
        # comes, so it is left out; the others never need a holder to leave.
        case(RELEASE_KEEPS_SLOT, check_slots_come_back, "slot not returned after release",
             "release-keeps-slot", left_out=(PROMOTION,)),
    ],
)
def test_a_redis_limiter_that_forgets_a_place_fails_the_check_for_it(
    cls: type[RedisColdLimiter],
    check: Callable[..., None],
    reason: str,
    intact: tuple[Callable[..., None], ...],
    factory: Callable[[type[RedisColdLimiter]], Any],
    threads: ThreadRunner,
) -> None:
    """The mutant fails the check named for its fault, with that check's message, and passes
    the checks of the paths it left intact (so it is caught for the right reason)."""
    make = factory(cls)
    with pytest.raises(AssertionError, match=reason):
        check(make, threads)
    for other in intact:
        other(make, threads)
