"""The checks of a budget's live processes catch a broken ``members.lua``.

``lua.MEMBERS`` (``reachlimit/redis/_members.py``) counts the processes that share a budget:
each announces itself, one that stops announcing drops out one period after its last
announce, and the parent of a process that died removes all of its members at once
(``release_owner``). A mutant is the real script text with one piece replaced
(``tests/support/redis_mutants.py``: the piece asserted to be there exactly once), put on a
``Members`` object in place of its script, or in place of ``lua.MEMBERS`` for
``release_owner``, which registers it at each call. Each check passes with the real script
and fails, with the message it names, with each mutant that names it. Two ``Members``
objects with other owners stand for two processes.

==================  =============================================  ==============================
script              mutant                                         the check that catches it
==================  =============================================  ==============================
members             a member whose period ended is never dropped   a_silent_member_drops_out
                    (``ENDED_KEPT``: a dead process counted for
                    good, every fallback's share too small)
members             leaving removes the exact id only, not every   release_owner_removes_a_dead_
                    member of an owner prefix (``LEAVE_EXACT_      owners_members
                    ONLY``: a dead worker stays counted a period)
members             an announce of a member on Redis keeps the     an_announce_on_redis_ends_
                    reservation of its share (``RESERVATION_       its_reservation
                    KEPT``: Redis admits less than its budget
                    until the reservation's time is over)
==================  =============================================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from reachlimit.redis import release_owner
from reachlimit.redis._common import limiter_keys, members_key
from reachlimit.redis._members import Members
from tests.support.redis_limiters import server_ms
from tests.support.redis_mutants import Mutant, check_id, checks, in_file, rows
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

NAME = "shared"
KEY = members_key("reachlimit", NAME)
HOLDERS = limiter_keys("reachlimit", NAME)[0]
DEAD, LIVE = "deadhost:0000:4242:", "livehost:0000:7:"

MakeMembers = Callable[..., Members]


@pytest.fixture(name="make_members")
def make_members_fixture(client: redis.Redis) -> Iterator[MakeMembers]:
    """``make_members(owner, period)``: a member of the budget NAME (no thread: the check
    announces), closed at teardown without leaving."""
    made: list[Members] = []

    def make(owner: str, period: float) -> Members:
        member = Members(client, KEY, owner=owner, period=period, holders=HOLDERS)
        made.append(member)
        return member

    yield make
    for member in made:
        member.close(leave=False)


def check_a_silent_member_drops_out(make: MakeMembers, client: redis.Redis) -> None:
    """A member that stops announcing (its process died) is no longer counted once its
    period (0.3 s) is over on Redis's clock."""
    dead, live = make(DEAD, 0.3), make(LIVE, 60.0)
    assert dead.announce() == 1
    start = server_ms(client)
    assert live.announce() == 2
    wait_until("the silent member's period ended on Redis's clock",
               lambda: server_ms(client) > start + 300)  # fmt: skip
    count = live.announce()
    assert count == 1, f"a silent member is still counted: {count} live, not 1"


def check_release_owner_removes_a_dead_owners_members(
    make: MakeMembers, client: redis.Redis
) -> None:
    """Two members of a process that died (two apps on one budget) leave at once when its
    parent releases its owner prefix, long before their periods end."""
    live = make(LIVE, 60.0)
    make(DEAD, 60.0).announce()
    make(DEAD, 60.0).announce()
    assert live.announce() == 3
    assert release_owner(client, DEAD, name=NAME) == (0, 0)
    count = live.announce()
    assert count == 1, f"a dead owner's members outlived release_owner: {count} live, not 1"


def check_an_announce_on_redis_ends_its_reservation(
    make: MakeMembers, client: redis.Redis
) -> None:
    """A member whose share another member's recovery reserved (``lua/limiter.lua``'s
    Reservations) ends that reservation with its next announce once it uses Redis (it admits
    nothing on a fallback), and keeps it while it does not; another member's stays."""
    mine, other = make(LIVE, 60.0), make(DEAD, 60.0)
    ends = server_ms(client) + 60_000
    client.zadd(HOLDERS, {f"#{mine.id}#1": ends, f"#{other.id}#1": ends})
    mine.uses_redis = lambda: False
    mine.announce()
    assert len(client.zrange(HOLDERS, 0, -1)) == 2, "a member on its fallback lost its share"
    mine.uses_redis = lambda: True
    mine.announce()
    left = [h.decode() for h in client.zrange(HOLDERS, 0, -1)]
    assert left == [f"#{other.id}#1"], f"an announce on Redis kept its reservation: {left}"


ENDED_KEPT = Mutant(in_file(
    "members", ("redis.call('ZREMRANGEBYSCORE', members, '-inf', now)", "local _ = now")
), check_a_silent_member_drops_out, "a silent member is still counted")
#: ``release_owner`` registers ``lua.MEMBERS`` at each call (and so does each ``Members`` made
#: meanwhile): the test puts the mutant there.
LEAVE_EXACT_ONLY = Mutant(
    in_file("members", ("if string.sub(id, 1, n) == who then", "if id == who then")),
    check_release_owner_removes_a_dead_owners_members,
    "a dead owner's members outlived release_owner",
    in_lua="MEMBERS",
)
RESERVATION_KEPT = Mutant(in_file(
    "members", ("then redis.call('ZREM', KEYS[2], holder) end", "then local _ = holder end")
), check_an_announce_on_redis_ends_its_reservation, "an announce on Redis kept its reservation")


@pytest.mark.parametrize("check", checks(globals()), ids=check_id)
def test_each_check_passes_with_the_real_script(
    check: Callable[[MakeMembers, redis.Redis], None], make_members: MakeMembers,
    client: redis.Redis,
) -> None:
    check(make_members, client)


@pytest.mark.parametrize("row", rows(globals()))
def test_a_broken_members_script_fails_the_check_for_it(
    row: Mutant, make_members: MakeMembers, client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row.caught(make_members, client, monkeypatch=monkeypatch)
