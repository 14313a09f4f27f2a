"""The flight's checks catch a broken flight script: every operation of ``RedisSingleFlight``'s
script has a mutant.

A mutant is the real script text with one piece replaced (``tests/support/redis_mutants.py``:
the piece asserted to be there exactly once, in the script and in its ``.lua`` file), put on
every flight object a check makes in place of the script it registered (``lua/flight.lua``:
every operation in one file), or, for ``release_claims``, which registers it at each call,
in place of ``lua.FLIGHT``. Each check passes with the real script and fails, with the
message it names, with each mutant that names it. Several flight objects on one Redis and
name stand for several processes (the ``make_flight`` fixture of
``tests/test_redis_flight.py``: each with a client of its own).

==================  =============================================  ==============================
section             mutant                                         the check that catches it
==================  =============================================  ==============================
join                every join claims a new flight, whether one    one_build_across_processes
                    is led or not (``JOIN_ALWAYS_CLAIMS``)
check               a follower's check overlooks the outcome of    one_build_across_processes
                    its own flight, and leads it again
                    (``CHECK_OVERLOOKS_OUTCOME``)
claim (join and     a claim is SET without its lease               a_claim_ends_with_its_lease
check)              (``CLAIM_WITHOUT_LEASE``: a leader that dies
                    holds its key for good)
publish             the publish leaves the claim in place          a_call_after_a_flight_ended_
                    (``PUBLISH_KEEPS_CLAIM``)                      leads_anew
renew               a renewal pushes no lease end                  a_renewed_claim_outlives_its_
                    (``RENEW_DOES_NOT_EXTEND``)                    lease
drop                a dead owner's claim is found and kept         a_dead_owners_claim_is_dropped
                    (``DROP_KEEPS_CLAIM``: its followers wait for
                    its lease)
==================  =============================================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

from reachlimit.redis import RedisSingleFlight, owner_prefix, release_claims
from tests import test_redis_flight
from tests.support.redis_mutants import Mutant, caught_alike, check_id, checks, in_file, rows
from tests.support.threads import Outcome, ThreadRunner, start_call
from tests.support.waiting import wait_until
from tests.test_redis_flight import KEY, Gate, MakeFlight, renewed, start_leading, waiters

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

#: The flight tests' fixture: ``make_flight(**kwargs)``, a flight object with a client of its
#: own (a "process"), closed at teardown.
make_flight = test_redis_flight.make_flight


@contextmanager
def leading(threads: ThreadRunner, leader: RedisSingleFlight, gate: Gate) -> Iterator[Outcome]:
    """``leader`` leads KEY, its build held by ``gate`` for the block; on the way out
    (a failed check too) the build is let finish, and the leader's call waited for."""
    lead = start_leading(threads, leader, gate)
    try:
        yield lead
    finally:
        gate.finish.set()
        lead.wait_done()


def check_one_build_across_processes(
    make: MakeFlight, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A leader in one process, a second call of its key in another: the second follows,
    builds nothing, and gets the leader's value."""
    leader, other = make(), make()
    gate, second = Gate(result="built"), Gate(result="built again")
    second.finish.set()
    lead = start_leading(threads, leader, gate)
    try:
        follow: Outcome = start_call(threads, lambda: other.do(KEY, second), name="follower")
        wait_until("the second call follows in Redis, or builds",
                   lambda: waiters(client, leader) == 1 or second.runs)  # fmt: skip
        assert second.runs == 0, "built twice: a second process led a key that was led"
    finally:
        gate.finish.set()
    wait_until("both done", lambda: lead.done.is_set() and follow.done.is_set())
    assert lead.value == ("built", False)
    assert second.runs == 0 and follow.value == ("built", True), (
        f"built twice: the follower got {follow.value!r} ({second.runs} build of its own)"
    )


def check_a_claim_ends_with_its_lease(
    make: MakeFlight, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A leader's claim lives its lease (0.5 s) unless renewed: a leader whose process dies
    lets a follower take its flight over then."""
    leader = make(lease=0.5)
    with leading(threads, leader, Gate(result="v")):
        pttl = client.pttl(leader.base_of(KEY) + "lead")
        assert 0 < pttl <= 500, f"a claim without its lease (PTTL {pttl})"


def check_a_call_after_a_flight_ended_leads_anew(
    make: MakeFlight, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A flight that ended is over: the next call of its key, in another process, builds."""
    first, later = make(), make()
    assert first.do(KEY, lambda: "first") == ("first", False)
    got = later.do(KEY, lambda: "later")
    assert got == ("later", False), (
        f"a finished flight's claim outlived it: a later call got {got!r} instead of building"
    )


def check_a_renewed_claim_outlives_its_lease(
    make: MakeFlight, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A leader's claim (lease 1 s) is pushed back up every third of its lease while its
    build runs: three renewals seen, and the claim never ended meanwhile."""
    leader = make(lease=1.0)
    with leading(threads, leader, Gate(result="v")) as lead:
        lead_key = leader.base_of(KEY) + "lead"
        wait_until("three renewals", renewed(client, lead_key, 3), interval=0.02)
    assert lead.value == ("v", False)


def check_a_dead_owners_claim_is_dropped(
    make: MakeFlight, client: redis.Redis, threads: ThreadRunner
) -> None:
    """A leader's claim (lease a minute) is dropped by ``release_claims`` of its owner, and
    only of its owner: the claim of a live process stays."""
    leader = make(lease=60.0)
    with leading(threads, leader, Gate(result="v")):
        lead_key = leader.base_of(KEY) + "lead"
        assert release_claims(client, "elsewhere:b00t:1:") == 0
        assert client.exists(lead_key), "a live owner's claim was dropped"
        dropped = release_claims(client, owner_prefix())
        assert dropped == 1 and not client.exists(lead_key), (
            f"a dead owner's claim outlived release_claims ({dropped} dropped)"
        )
        assert release_claims(client, owner_prefix()) == 0  # nothing left to drop


#: Every join claims a new flight; a follower's check overlooks its own flight's outcome.
JOIN_ALWAYS_CLAIMS, CHECK_OVERLOOKS_OUTCOME = caught_alike(
    check_one_build_across_processes, "built twice",
    in_file("flight", (
        "  local current = read_claim()\n  if current then\n    local n = flight_of(current)\n"
        "    local out = outcome(n)\n",
        "  local current = read_claim()\n  if false then\n    local n = flight_of(current)\n"
        "    local out = outcome(n)\n",
    )),
    in_file(
        "flight", ("  local out = outcome(mine)\n  if out then return {2, mine, out} end\n",
                   "  local out\n")
    ),
)
CLAIM_WITHOUT_LEASE = Mutant(in_file(
    "flight", ("redis.call('SET', lead, n .. ':' .. token, 'PX', lease)",
               "redis.call('SET', lead, n .. ':' .. token)")
), check_a_claim_ends_with_its_lease, "a claim without its lease")
PUBLISH_KEEPS_CLAIM = Mutant(in_file(
    "flight", ("  if redis.call('GET', lead) == n .. ':' .. token then "
               "redis.call('DEL', lead) end\n", "")
), check_a_call_after_a_flight_ended_leads_anew, "a finished flight's claim outlived it")
RENEW_DOES_NOT_EXTEND = Mutant(in_file("flight", ("    redis.call('PEXPIRE', lead, lease)\n", "")),
                               check_a_renewed_claim_outlives_its_lease,
                               "the claim ended while its leader ran")
#: ``release_claims`` registers ``lua.FLIGHT`` when called: the test puts the mutant there
#: (the flights the check makes run it too: it changes the drop only).
DROP_KEEPS_CLAIM = Mutant(
    in_file("flight", ("    redis.call('DEL', lead)\n    return 1\n", "    return 1\n")),
    check_a_dead_owners_claim_is_dropped, "a dead owner's claim outlived release_claims",
    in_lua="FLIGHT",
)


@pytest.mark.parametrize("check", checks(globals()), ids=check_id)
def test_each_check_passes_with_the_real_scripts(
    check: Callable[..., None], make_flight: MakeFlight, client: redis.Redis,
    threads: ThreadRunner,
) -> None:
    check(make_flight, client, threads)


@pytest.mark.parametrize("row", rows(globals()))
def test_a_flight_with_a_broken_script_fails_the_check_for_it(
    row: Mutant, make_flight: MakeFlight, client: redis.Redis, threads: ThreadRunner,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row.caught(make_flight, client, threads, monkeypatch=monkeypatch)
