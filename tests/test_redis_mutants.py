"""The key checks catch a broken Redis limiter too: every operation of its script has a mutant.

A mutant's script is the real script text with one piece replaced; the test first asserts
that the piece is there exactly once in the script (and in the ``.lua`` file it is a mutant
of), so a change of the real script makes the mutant fail loudly instead of quietly testing
the unchanged code (``tests/support/redis_mutants.py`` builds them). The limiter's script is
one file, ``lua/limiter.lua``, every operation in it: a piece found once there belongs to
one operation's section, or to the steps several share, and its mutant breaks only that.

Each check passes on ``RedisColdLimiter`` and fails, for the reason it names (its message),
on each mutant that names it, where the mutant is defined (a ``Mutant``: the rows of the
module's parametrized tests are made of those). The first table's checks are those of
``tests/support/limiter_checks.py`` (each mutant there also passes the checks of the paths it
left intact); the second's are this module's. The cold lead's mutants are in
``tests/test_redis_lead_mutants.py``, fair admission's in
``tests/test_redis_fairness_mutants.py``, the ones only a Cluster shows (the hash tag the
script builds keys from) in ``tests/test_redis_cluster_mutants.py``; the cache's, the
flight's and the live members' in ``tests/test_redis_{cache,flight,members}_mutants.py``.
One test here checks that every ``.lua`` file of the backend has a mutant in one of them.

========================  ==========================================  ===========================
section of limiter.lua    mutant                                      the check that catches it
========================  ==========================================  ===========================
poll                      the timeout branch keeps the waiter queued  gate_place_returned_after_
                          (``TIMEOUT_KEEPS_PLACE``)                   timeout
poll                      the give-up branch keeps it queued          gate_place_returned_after_
                          (``GIVE_UP_KEEPS_PLACE``)                   cancel
general steps             promotion leaves the promoted waiter in     gate_place_returned_after_
(next_in_turn)            the queue too (``PROMOTION_KEEPS_PLACE``)   promotion
release (common case      the release frees nothing, on its common    slots_come_back
and general path)         and its general path
                          (``RELEASE_KEEPS_SLOT``)
------------------------  ------------------------------------------  ---------------------------
acquire (common cases)    the fast path grants with every slot held   no_more_grants_than_slots
                          (``FAST_PATH_OVERBOOKS``)
acquire (common cases)    the slots held are not counted (``held``    no_more_grants_than_slots
                          is 0: ``HELD_NOT_COUNTED``)
acquire (general path)    a full queue admits a newcomer of another   a_full_queue_stays_full
                          client beyond its bound, displacing nobody
                          (``QUEUE_UNBOUNDED``)
no wasted waits           no waiter is ever late (``NEVER_LATE``)     a_taught_budget_refuses_a_
(refuse_late)                                                         late_leader
no wasted waits (took)    the estimate is never made (it waits for    a_taught_budget_refuses_a_
                          17 times, the list keeps 16:                late_leader
                          ``NO_ESTIMATE``)
clock                     Redis's clock read in seconds, not ms       a_taught_budget_refuses_a_
                          (``CLOCK_IN_SECONDS``: every time it        late_leader
                          measures is 1000 times too short)
acquire (common cases:    the refusal counts the waiters whose        a_dead_waiters_place_comes_
the refusal)              presence ended too, so a queue of the dead  back
                          refuses instead of being reaped
                          (``REFUSAL_COUNTS_THE_DEAD``)
give_up                   a lost reply's slot is counted freed and    a_lost_release_frees_its_
                          kept (``GIVE_UP_KEEPS_SLOT``)               slot
settings (record)         a process's start writes nothing            every_process_follows_the_
                          (``RECORD_WRITES_NOTHING``)                 newest_start
settings                  the settings hash is never read: each       every_process_follows_the_
                          process runs its own                        newest_start
                          (``SETTINGS_NOT_READ``)
stats                     held and queued swapped in the figures      the_figures_count_holders_
                          (``STATS_SWAPPED``)                         and_waiters
renew                     a renewal pushes no lease end               a_renewed_grant_outlives_
                          (``RENEW_DOES_NOT_EXTEND``)                 its_lease
general steps (reap)      the reap leaves dead waiters in the queue   a_dead_waiters_place_comes_
                          (``REAP_KEEPS_DEAD_WAITERS``)               back
release_owner             a dead owner's slot is counted freed and    release_owner_frees_a_dead_
                          kept (``RELEASE_OWNER_KEEPS_SLOT``)         owners_places
hold_fallback_builds      a fallback's build, held over as Redis      fallback_builds_hold_their_
                          comes back, is counted and holds nothing    slots
                          (``FALLBACK_BUILDS_HOLD_NOTHING``)
hold_fallback_builds      the first process back reserves nothing     a_recovery_reserves_the_
(a recovery)              for the others, still on their fallbacks    other_processes_shares
                          (``RECOVERY_RESERVES_NOTHING``)
========================  ==========================================  ===========================

The ``factory`` fixture (``tests/support/redis_limiters.py``) stands for
``ColdLimiter(active, queue, wait, clock=...)`` in the first table: each call makes a limiter
on a fresh name (so no check sees another's leftovers). A ``FakeClock`` that steps
on every read means "the wait runs out at once" in the checks; on Redis, whose clock cannot
be faked, that becomes a 50 ms wait; otherwise the wait is a minute. The second table's
checks take ``make`` (``make_limiter``, its limiters running the mutant of the row: several
objects on one name stand for several processes), the test's client and ``threads``; where
a state must last (a lease, a presence, a grant held to teach the estimate) they wait for
Redis's own clock to move, never for this process's.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from reachlimit import Busy, Cancelled, Grant
from reachlimit.redis import RedisColdLimiter, lua, release_owner
from reachlimit.redis._common import ms
from tests.support.fairness import full_queue
from tests.support.limiter import (
    ProbeCancel,
    assert_exact_capacity,
    start_acquire,
    try_acquire_now,
)
from tests.support.limiter_checks import (
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_gate_place_returned_after_timeout,
    check_queue_bound,
    check_slots_come_back,
)
from tests.support.redis_clients import LostReply
from tests.support.redis_limiters import GRANTED, QUEUED, LimiterScript, server_ms
from tests.support.redis_mutants import (
    MUTATED,
    Change,
    Mutant,
    caught_alike,
    check_id,
    in_file,
    mutant_class,
    rows,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

def mutant(changes: tuple[Change, ...]) -> type[RedisColdLimiter]:
    """A RedisColdLimiter whose script is the text the real limiter registers with each
    ``(old, new)`` of ``changes`` applied. The check that each ``old`` is found exactly once
    is made on every limiter made, before it is used, on the text that limiter registered
    (the same for every limiter: each reads its settings from Redis)."""
    return mutant_class(RedisColdLimiter, changes)


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


def place_mutant(
    check: Callable[..., None],
    reason: str,
    *changes: Change,
    left_out: tuple[Callable[..., None], ...] = (),
) -> Mutant:
    """A mutant of ``limiter.lua`` that forgets a place: it fails ``check`` with ``reason``
    and passes every other one of ALL_CHECKS, in that order, but ``left_out``."""
    intact = tuple(c for c in ALL_CHECKS if c is not check and c not in left_out)
    return Mutant(in_file("limiter", *changes), check, reason, intact=intact)


TIMEOUT, CANCEL, PROMOTION = (
    check_gate_place_returned_after_timeout,
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
)

#: The poll's timeout branch, without the line that gives the place back.
TIMEOUT_KEEPS_PLACE = place_mutant(
    TIMEOUT, "gate place not returned after timeout",
    ("  if remaining <= 0 then\n    forget_waiter(token)\n", "  if remaining <= 0 then\n"),
)
#: The poll's give-up branch (cancelled, or an error), keeping the place.
GIVE_UP_KEEPS_PLACE = place_mutant(
    CANCEL, "gate place not returned after cancel",
    ("  if leaving ~= 0 then\n    forget_waiter(token)\n", "  if leaving ~= 0 then\n"),
)
#: Promotion that forgets to take the promoted waiter out of the queue (every operation
#: runs the general steps and may promote): the next waiter in turn of a queue with one
#: client (the checks' anonymous one) is the oldest ticket.
PROMOTION_KEEPS_PLACE = place_mutant(
    PROMOTION, "gate place not returned after promotion",
    ("  if first then forget_waiter(first) end\n",
     "  if first then\n    redis.call('ZREM', alive, first)\n"
     "    redis.call('HDEL', deadlines, first)\n  end\n"),
)
#: A release that answers as if it freed the slot, and frees nothing: on its common path
#: (a slot free besides) and on the general one. With no release at all, the promotion check
#: would only wait for a hand-off that never comes, so it is left out; the others never need
#: a holder to leave.
RELEASE_KEEPS_SLOT = place_mutant(
    check_slots_come_back, "slot not returned after release",
    ("    return redis.call('ZREM', holders, token)",
     "    return redis.call('ZSCORE', holders, token) and 1 or 0"),
    ("  local mine = redis.call('ZREM', holders, token)",
     "  local mine = redis.call('ZSCORE', holders, token) and 1 or 0"),
    left_out=(PROMOTION,),
)


@pytest.mark.parametrize("row", rows(globals(), ALL_CHECKS))
def test_a_redis_limiter_that_forgets_a_place_fails_the_check_for_it(
    row: Mutant, factory: Callable[[type[RedisColdLimiter]], Any], threads: ThreadRunner
) -> None:
    """The mutant fails the check named for its fault, with that check's message, and passes
    the checks of the paths it left intact (so it is caught for the right reason)."""
    row.caught(factory(RedisColdLimiter), threads)


# -- every other limiter script: a mutant each, and the check that catches it -----------------

Make = Callable[..., RedisColdLimiter]


def check_no_more_grants_than_slots(make: Make, client: redis.Redis, threads: ThreadRunner) -> None:
    """active=2, no queue: exactly two grants at once, never a third."""
    assert_exact_capacity(make(active=2, queue=0))


def check_a_full_queue_stays_full(make: Make, client: redis.Redis, threads: ThreadRunner) -> None:
    """active=1, queue=2, both places client a's: a newcomer of client b takes a's newest
    place (displacing it), never a third place."""
    with full_queue(threads, lambda active, queue: make(active=active, queue=queue, wait=60.0),
                    "a1 a2") as (lim, queue, _):
        queue.join("b1")
        s = lim.stats()
        assert s.queued <= 2, f"queue bound broken: {s.queued} waiters with queue=2"


def promoted_grant(threads: ThreadRunner, lim: RedisColdLimiter, n: int) -> Grant:
    """A grant a waiter was promoted to (timed in Redis): it queues behind a fast-path grant,
    which is then released."""
    holder = lim.acquire()
    waiter = start_acquire(threads, lim, threading.Event(), name=f"promoted-{n}")
    wait_until(f"waiter {n} queued", lambda: waiter.done.is_set() or lim.stats().queued == 1)
    holder.release()
    waiter.wait_done()
    assert waiter.grant is not None, f"waiter {n} not promoted: {waiter.error!r}"
    return waiter.grant


def check_a_taught_budget_refuses_a_late_leader(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """Four grants waiters were promoted to, each held 300 ms or more on Redis's clock, teach
    the budget an estimate of at least 300 ms. Then, its one slot held and a wait of 1 s,
    places 0, 1, 2, 3, 4 of the queue start 0, E, 2E, 3E, 4E >= 1.2 s from now: with four
    leaders queued (or refused already), the next is refused at once, Busy("deadline")."""
    lim = make(active=1, queue=8, wait=1.0)
    for n in range(4):
        grant = promoted_grant(threads, lim, n)
        start = server_ms(client)
        wait_until(f"grant {n} held 300 ms on Redis's clock",
                   lambda start=start: server_ms(client) >= start + 300)  # fmt: skip
        grant.release()
    with lim.acquire():  # a fast-path grant: counted as ending now
        ghosts = LimiterScript(client, lim)
        for n in range(4):
            ghosts.acquire(f"ghost-{n}")  # queued (or refused late): ghosts that never poll
        try:
            lim.acquire(ProbeCancel())  # refused at once, or queued and gone at its first look
        except Busy as busy:
            assert busy.reason == Busy.DEADLINE, f"refused for {busy.reason!r}, not the deadline"
            return
        except Cancelled:
            pass
    raise AssertionError("no refusal by the estimate: a leader that cannot start within its "
                         "wait was queued")


def check_a_refusal_ends_with_the_full_queue(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """active=1, queue=1: once the waiter that filled the queue has left, the queue has
    room again and the next acquire of a limiter just refused is admitted."""
    lim = make(active=1, queue=1, wait=60.0)
    with lim.acquire():
        cancel = threading.Event()
        waiter = start_acquire(threads, lim, cancel, name="waiter")
        wait_until("the waiter queued", lambda: lim.stats().queued == 1)
        with pytest.raises(Busy):
            lim.acquire()  # queue_full: the refusal
        cancel.set()
        waiter.wait_done()
        try:
            lim.acquire(ProbeCancel())
        except Busy as busy:
            raise AssertionError(
                f"a refusal outlasted the full queue: the next caller got {busy.reason!r} "
                "with a place free"
            ) from None
        except Cancelled:
            pass  # admitted, then gone at its first look at the cancel object


def check_a_lost_release_frees_its_slot(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A release whose call fails (a timeout: the caller cannot tell whether it ran) gives
    the grant's token up; the next round trip frees the slot, long before its lease ends."""
    port = client.connection_pool.connection_kwargs["port"]
    lossy = LostReply(host="127.0.0.1", port=port, socket_timeout=0.5)
    lossy.deferred = True  # the release is kept from Redis: never sent
    try:
        lim = make(client=lossy, active=1, queue=0, lease=60.0)
        grant = lim.acquire()
        lossy.trap = "release"
        with pytest.raises(redis.TimeoutError):
            grant.release()
        again = try_acquire_now(lim)  # queue=0: refused if the slot were still held
        assert again is not None, "a lost release kept its slot: the next caller was refused"
        again.release()
    finally:
        lossy.close()


def check_every_process_follows_the_newest_start(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """Two processes of one budget: the newest to start (active=3) sets it for both."""
    first = make(name="settled", active=1, queue=0)
    first.stats()  # its start: active=1 recorded
    newest = make(name="settled", active=3, queue=0)
    newest.stats()  # the newest start
    for who, lim in (("the newest", newest), ("the first", first)):
        active = lim.stats().capacity_active
        assert active == 3, (
            f"a process does not follow the newest start: {who} has active={active}, not 3"
        )
    grants = [try_acquire_now(first) for _ in range(3)]
    taken = [g for g in grants if g is not None]
    for grant in taken:
        grant.release()
    assert len(taken) == 3, (
        f"a process does not follow the newest start: {len(taken)} of 3 slots taken"
    )


def check_the_figures_count_holders_and_waiters(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    lim = make(active=2, queue=2, wait=60.0)
    grants = [lim.acquire(), lim.acquire()]
    cancel = threading.Event()
    waiter = start_acquire(threads, lim, cancel, name="waiter")
    try:
        wait_until("the waiter queued", lambda: waiter.done.is_set() or lim.stats().queued >= 1)
        s = lim.stats()
        assert (s.active, s.queued) == (2, 1), (
            f"the figures are wrong: {s.active} held and {s.queued} queued, not 2 and 1"
        )
    finally:
        cancel.set()
        waiter.wait_done()
        for grant in grants:
            grant.release()


def check_a_renewed_grant_outlives_its_lease(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A grant held past two of its 1.5 s leases (on Redis's clock) is still held: its
    process renews it every third of its lease."""
    lim = make(active=1, queue=0, lease=1.5)
    grant = lim.acquire()
    start = server_ms(client)
    try:
        wait_until("two leases passed on Redis's clock", lambda: server_ms(client) > start + 3100)
        s = lim.stats()
        assert (s.active, s.lease_lost) == (1, 0), (
            f"a renewed grant lost its lease: {s.active} held, {s.lease_lost} lost"
        )
    finally:
        grant.release()


def check_fallback_builds_hold_their_slots(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """active=1: two builds a fallback admitted, held over as Redis comes back, are two
    holders (over the capacity), so a newcomer is not granted until both have ended; then
    it is, and a fallback build is not counted as acquired."""
    lim = make(active=1, queue=0)
    held = lim.hold_fallback_builds(2)
    s = lim.stats()
    assert (s.active, s.acquired) == (2, 0), (
        f"a fallback build holds no slot: {s.active} held, {s.acquired} acquired"
    )
    for grant in held:
        extra = try_acquire_now(lim)
        if extra is not None:
            extra.release()
        assert extra is None, "a fallback build holds no slot: a newcomer granted beside it"
        grant.release()
    with lim.acquire():
        assert lim.stats().active == 1


def check_a_recovery_reserves_the_other_processes_shares(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """active=2, three live processes (members of other owners): the first back from an
    outage reserves the other two's shares (a slot each), so Redis grants nobody beside what
    their fallbacks may still run; a reservation is no build in the figures. The second's
    recovery ends its own reservation, which frees a slot at once; the third, which never
    left Redis, ends its own with its next announce. No lease was lost on the way."""
    lim = make(active=2, queue=0)
    first, second, third = (lim.members(owner=f"host-{i}:boot:{i}:") for i in range(3))
    for member in (first, second, third):
        member.announce()
    lim.hold_fallback_builds(0, recovery=(first.id, 3, 60.0))
    assert lim.stats().active == 0, "a reservation counted among the builds"
    extra = try_acquire_now(lim)
    if extra is not None:
        extra.release()
    assert extra is None, "a recovery reserved nothing: a newcomer granted beside the others"
    # The second process is back: its share ends.
    lim.hold_fallback_builds(0, recovery=(second.id, 3, 60.0))
    granted = try_acquire_now(lim)
    assert granted is not None, "a process back from the outage kept its reservation"
    assert try_acquire_now(lim) is None, "the third process's reservation ended early"
    third.uses_redis = lambda: True
    third.announce()  # it never left Redis: its reservation has no reason left
    last = try_acquire_now(lim)
    assert last is not None, "an announce of a process on Redis kept its reservation"
    granted.release()
    last.release()
    s = lim.stats()
    assert (s.active, s.acquired, s.lease_lost) == (0, 2, 0)


def check_a_dead_waiters_place_comes_back(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """queue=1: a waiter that stops polling (its process died) leaves the queue once its
    presence period is over, and the next caller is admitted to its place."""
    lim = make(active=1, queue=1, wait=60.0)
    with lim.acquire():
        assert LimiterScript(client, lim).acquire("dead")[0] == QUEUED  # its process died
        start = server_ms(client)
        wait_until("the dead waiter's presence ended on Redis's clock",
                   lambda: server_ms(client) > start + ms(lim.PRESENCE))  # fmt: skip
        try:
            lim.acquire(ProbeCancel())
        except Busy as busy:
            raise AssertionError(
                f"a dead waiter kept its place: the next caller got {busy.reason!r}"
            ) from None
        except Cancelled:
            pass  # admitted to the place that came back


#: The owner prefix of a process that died (the tokens of a limiter start with their owner's).
DEAD_OWNER = "deadhost:0000:4242:"


def check_release_owner_frees_a_dead_owners_places(
    make: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    """release_owner frees the slot and the queue place a dead process held, at once."""
    lim = make(name="owned", active=1, queue=2, wait=60.0)
    ghosts = LimiterScript(client, lim)
    assert ghosts.acquire(DEAD_OWNER + "holder")[0] == GRANTED
    assert ghosts.acquire(DEAD_OWNER + "waiter")[0] == QUEUED
    assert release_owner(client, DEAD_OWNER, name="owned") == (1, 1)
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), (
        f"a dead owner's places outlived release_owner: {s.active} held, {s.queued} queued"
    )
    assert_exact_capacity(lim)


MORE_CHECKS = (
    check_fallback_builds_hold_their_slots,
    check_a_recovery_reserves_the_other_processes_shares,
    check_no_more_grants_than_slots,
    check_a_full_queue_stays_full,
    check_a_taught_budget_refuses_a_late_leader,
    check_a_refusal_ends_with_the_full_queue,
    check_a_lost_release_frees_its_slot,
    check_every_process_follows_the_newest_start,
    check_the_figures_count_holders_and_waiters,
    check_a_renewed_grant_outlives_its_lease,
    check_a_dead_waiters_place_comes_back,
    check_release_owner_frees_a_dead_owners_places,
)


@pytest.mark.parametrize("check", MORE_CHECKS, ids=check_id)
def test_each_check_passes_on_the_real_redis_limiter(
    check: Callable[..., None], make_limiter: Make, client: redis.Redis, threads: ThreadRunner
) -> None:
    check(make_limiter, client, threads)


NEWEST_START = check_every_process_follows_the_newest_start

#: The fast path grants with every slot held; the slots held are not counted (``held`` is 0).
FAST_PATH_OVERBOOKS, HELD_NOT_COUNTED = caught_alike(
    check_no_more_grants_than_slots, "slot double counted",
    in_file("limiter", (
        "      if held >= capacity then\n        full = true",
        "      if held > capacity then\n        full = true",
    )),
    in_file("limiter", (
        "    held = redis.call('ZCARD', holders)\n    if held == 0 or",
        "    held = 0\n    if held == 0 or",
    )),
)
QUEUE_UNBOUNDED = Mutant(in_file("limiter", ("  if queued >= queue_cap then\n",
                                              "  if false then\n")),
                         check_a_full_queue_stays_full, "queue bound broken")
#: No waiter is ever late; the estimate is never made; Redis's clock is read in seconds.
NEVER_LATE, NO_ESTIMATE, CLOCK_IN_SECONDS = caught_alike(
    check_a_taught_budget_refuses_a_late_leader, "no refusal by the estimate",
    in_file(
        "limiter", ("if deadline and now < deadline and deadline < start then", "if false then")
    ),
    in_file("limiter", ("if #times >= 4 then", "if #times >= 17 then")),
    in_file(
        "limiter", ("tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)", "tonumber(t[1])")
    ),
)
#: The refusal counts the waiters whose presence ended; the reap leaves them in the queue.
REFUSAL_COUNTS_THE_DEAD, REAP_KEEPS_DEAD_WAITERS = caught_alike(
    check_a_dead_waiters_place_comes_back, "a dead waiter kept its place",
    in_file("limiter", (
        "  if full and redis.call('ZCOUNT', tag .. 'alive', '(' .. now, '+inf') >= queue_cap\n",
        "  if full and redis.call('ZCARD', tag .. 'alive') >= queue_cap\n",
    )),
    in_file("limiter", (
        "    for _, waiter in ipairs(dead) do\n      forget_waiter(waiter)\n",
        "    for _, waiter in ipairs(dead) do\n",
    )),
)
GIVE_UP_KEEPS_SLOT = Mutant(in_file("limiter", (
    "if redis.call('ZREM', holders, lost) == 1 then",
    "if redis.call('ZSCORE', holders, lost) then",
)), check_a_lost_release_frees_its_slot, "a lost release kept its slot")
RECORD_WRITES_NOTHING = Mutant(in_file(
    "limiter", ("  redis.call('DEL', settings)\n  redis.call('HSET', settings, 'by', ARGV[3])\n",
                "")
), NEWEST_START, "the newest has active=1")
SETTINGS_NOT_READ = Mutant(in_file("limiter", (
    "local recorded = redis.call('HMGET', settings,",
    "local recorded = {} or redis.call('HMGET', settings,",
)), NEWEST_START, "the first has active=1")
STATS_SWAPPED = Mutant(in_file("limiter", ("return {held, queued,", "return {queued, held,")),
                       check_the_figures_count_holders_and_waiters, "the figures are wrong")
RENEW_DOES_NOT_EXTEND = Mutant(in_file("limiter", (
    "    if redis.call('ZSCORE', holders, ARGV[i]) then\n"
    "      redis.call('ZADD', holders, now + lease_ms, ARGV[i])\n",
    "    if redis.call('ZSCORE', holders, ARGV[i]) then\n",
)), check_a_renewed_grant_outlives_its_lease, "a renewed grant lost its lease")
FALLBACK_BUILDS_HOLD_NOTHING = Mutant(in_file("limiter", (
    "      redis.call('ZADD', holders, now + lease_ms, ARGV[i])\n      added = added + 1\n",
    "      added = added + 1\n",
)), check_fallback_builds_hold_their_slots, "a fallback build holds no slot")
RECOVERY_RESERVES_NOTHING = Mutant(in_file("limiter", (
    "          for i = 1, share do redis.call('ZADD', holders, ends, '#' .. id .. '#' .. i)"
    " end\n", "",
)), check_a_recovery_reserves_the_other_processes_shares, "a recovery reserved nothing")
#: ``release_owner`` registers ``lua.LIMITER`` at each call, so the test puts this mutant
#: there (the limiters the check makes run it too: it changes release_owner only).
RELEASE_OWNER_KEEPS_SLOT = Mutant(
    in_file("limiter", (
        "      redis.call('ZREM', holders, holder)\n      redis.call('HDEL', since, holder)\n",
        "      redis.call('HDEL', since, holder)\n",
    )),
    check_release_owner_frees_a_dead_owners_places, "a dead owner's places outlived release_owner",
    in_lua="LIMITER",
)


@pytest.mark.parametrize("row", rows(globals(), MORE_CHECKS))
def test_a_redis_limiter_with_a_broken_script_fails_the_check_for_it(
    row: Mutant, make_limiter: Make, client: redis.Redis, threads: ThreadRunner,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row.caught(make_limiter, client, threads, monkeypatch=monkeypatch)


#: Where the mutants of each ``.lua`` file are (this module's are built at its import).
MUTANT_MODULES = (
    "tests.test_redis_cache_mutants",
    "tests.test_redis_lead_mutants",
    "tests.test_redis_cluster_mutants",
    "tests.test_redis_flight_mutants",
    "tests.test_redis_members_mutants",
)


def test_every_lua_file_has_a_mutant() -> None:
    """Each ``.lua`` file of the backend has a mutant in one of the mutant modules: a new
    script needs a check that catches it broken."""
    for name in MUTANT_MODULES:
        importlib.import_module(name)
    missing = sorted(set(lua.FILES) - MUTATED)
    assert not missing, f"no mutant test for {missing}"
