"""Tests of reachlimit.redis.RedisSingleFlight against a real redis-server, in one process.

Several flight objects on the same Redis and name stand for several processes; each has its
own in-process SingleFlight in front, exactly as a process has. A *ghost* leader is a claim
made by the join script for a token nobody renews: what a leader whose process died looks
like from Redis. Waits are for states (``wait_until``), in this process or in Redis; the
tests with real processes are in ``tests/test_redis_flight_processes.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from redis.crc import key_slot

from reachlimit import (
    NOT_FOUND,
    Busy,
    Cancelled,
    ColdLimiter,
    ColdPath,
    Flight,
    LeaderFailed,
    ReachLimitError,
    SingleFlight,
)
from reachlimit._path import LEADER_CANCELLED
from reachlimit.redis import RedisCache, RedisColdLimiter, RedisSingleFlight
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.processes import free_port
from tests.support.redis_clients import CountingRedis, LostReply, PausedRenewals, ScriptTrap
from tests.support.refreshes import threads_named
from tests.support.threads import HeldCall, Outcome, ThreadRunner, start_call
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

KEY = "the-key"

#: ``make_flight``'s type: makes a flight object (``RedisSingleFlight``'s arguments after the
#: client; ``client=`` for a client of the test's own).
MakeFlight = Callable[..., RedisSingleFlight]


@pytest.fixture
def make_flight(
    make_client: Callable[..., CountingRedis], client: CountingRedis
) -> Iterator[MakeFlight]:
    """``make_flight(**kwargs)``: a flight object with a client of its own (a "process");
    every one is closed at teardown."""
    made: list[RedisSingleFlight] = []

    def make(**kwargs: Any) -> RedisSingleFlight:
        flight = RedisSingleFlight(kwargs.pop("client", None) or make_client(), **kwargs)
        made.append(flight)
        return flight

    yield make
    for flight in made:
        flight.close()


def waiters(client: redis.Redis, flight: RedisSingleFlight, number: int = 1) -> int:
    """How many processes are counted as followers of flight ``number`` of KEY."""
    return int(client.get(flight.base_of(KEY) + f"w:{number}") or 0)


class Gate(HeldCall):
    """A leader's ``fn`` held for the test: a follower in Redis may take longer to join."""

    HOLD = 30.0


def never() -> Any:
    raise AssertionError("a follower ran fn")


def start_leading(
    threads: ThreadRunner, flight: RedisSingleFlight, gate: Gate, name: str = "leader"
) -> Outcome:
    """``flight.do(KEY, gate)`` in a thread, once it leads: its build (``gate``) started."""
    lead: Outcome = start_call(threads, lambda: flight.do(KEY, gate), name=name)
    assert gate.started.wait(10), "the leader never started its build"
    return lead


def renewed(client: redis.Redis, lead_key: str, times: int) -> Callable[[], bool]:
    """A probe for ``wait_until``: true once the claim at ``lead_key`` was pushed back up
    ``times`` times; it fails the test if the claim ended meanwhile (no renewal came)."""
    last, renewals = [client.pttl(lead_key)], [0]

    def probe() -> bool:
        ttl = client.pttl(lead_key)
        assert ttl > 0, "the claim ended while its leader ran: no renewal pushed its lease"
        if ttl > last[0]:
            renewals[0] += 1  # pushed back up
        last[0] = ttl
        return renewals[0] >= times

    return probe


def lead_and_follow(
    threads: ThreadRunner,
    client: redis.Redis,
    leader: RedisSingleFlight,
    follower: RedisSingleFlight,
    gate: Gate,
) -> tuple[Any, Any]:
    """A leader in one "process" and a follower in another, released once the follower is
    counted in Redis. Returns both outcomes, finished."""
    lead = start_leading(threads, leader, gate)
    follow = start_call(threads, lambda: follower.do(KEY, never))
    wait_until("the follower counted in Redis", lambda: waiters(client, leader) == 1)
    gate.finish.set()
    wait_until("both done", lambda: lead.done.is_set() and follow.done.is_set())
    return lead, follow


# -- construction and keys --------------------------------------------------------------------


@invalid_arguments(
    lease=("lease > 0", [0, float("nan")]),
    outcome_ttl=("outcome_ttl > 0", [-1]),
    codec=('codec must be "json", "bytes" or "auto"', ["pickle"]),
    name=("name must be a non-empty string without braces", ["}"]),
)
def test_invalid_arguments_raise_value_error(
    client: CountingRedis, kwargs: dict[str, Any], message: str
) -> None:
    assert_value_error(lambda: RedisSingleFlight(client, **kwargs), message)


def test_it_is_a_flight_for_coldpath(make_flight: MakeFlight) -> None:
    flight: Flight = make_flight()
    assert ColdPath(ColdLimiter(), flight=flight).flight is flight
    assert issubclass(LeaderFailed, ReachLimitError)


def test_a_key_of_another_type_is_a_type_error_before_any_redis_call(
    client: CountingRedis, make_flight: MakeFlight
) -> None:
    flight = make_flight(client=client)
    before = sum(client.sent.values())
    with pytest.raises(TypeError, match="str, bytes, int or a tuple"):
        flight.do(1.5, never)
    assert sum(client.sent.values()) == before


@pytest.mark.parametrize("key", ["{x}", "}" * 5000, "ü🙂", b"\xff", ("a", (1, b"")), 10**30])
def test_any_key_runs_once_with_keys_in_one_slot(
    make_flight: MakeFlight, client: CountingRedis, key: Any
) -> None:
    flight = make_flight()
    assert flight.do(key, lambda: {"v": 1}) == ({"v": 1}, False)
    base = flight.base_of(key)
    assert len(base) < 100
    slots = {key_slot(k) for k in client.keys("*")}
    assert slots == {key_slot((base + "n").encode())}


# -- what followers get -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [{"a": [1, "x"]}, "text", 0, [], NOT_FOUND, None])
def test_a_follower_elsewhere_shares_the_leaders_value(
    threads: ThreadRunner,
    client: CountingRedis,
    make_flight: MakeFlight,
    value: Any,
) -> None:
    leader, follower = make_flight(), make_flight()
    gate = Gate(result=value)
    lead, follow = lead_and_follow(threads, client, leader, follower, gate)
    assert lead.value == (value, False)
    assert follow.value == (value, True)
    if value is NOT_FOUND:
        assert follow.value[0] is NOT_FOUND
    assert gate.runs == 1


def test_bytes_values_cross_with_the_bytes_codec(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(codec="bytes"), make_flight(codec="bytes")
    lead, follow = lead_and_follow(threads, client, leader, follower, Gate(result=b"\x00raw"))
    assert follow.value == (b"\x00raw", True)


def test_a_refusal_reaches_followers_as_the_same_busy(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(), make_flight()
    gate = Gate(error=Busy(Busy.TIMEOUT, 7))
    lead, follow = lead_and_follow(threads, client, leader, follower, gate)
    assert isinstance(lead.error, Busy) and isinstance(follow.error, Busy)
    assert (follow.error.reason, follow.error.retry_after) == (Busy.TIMEOUT, 7)


def test_an_exception_reaches_followers_elsewhere_as_leader_failed(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(), make_flight()
    gate = Gate(error=KeyError("no such node " + "x" * 5000))
    lead, follow = lead_and_follow(threads, client, leader, follower, gate)
    assert isinstance(lead.error, KeyError)  # the leader raises its own exception
    assert isinstance(follow.error, LeaderFailed)
    assert follow.error.type_name == "KeyError"
    message = follow.error.message
    assert message.startswith("'no such node xxx") and len(message) == 1000
    assert "KeyError" in str(follow.error)


def test_in_the_leaders_process_followers_get_the_very_exception(
    threads: ThreadRunner, make_flight: MakeFlight
) -> None:
    flight = make_flight()
    error = ValueError("boom")
    gate = Gate(error=error)
    lead = start_leading(threads, flight, gate)
    follow = start_call(threads, lambda: flight.do(KEY, never))
    wait_until("the local follower", lambda: flight._local._calls[KEY].followers == 1)
    gate.finish.set()
    wait_until("both done", lambda: lead.done.is_set() and follow.done.is_set())
    assert lead.error is error and follow.error is error


def test_a_value_the_codec_cannot_carry_reaches_followers_elsewhere_as_leader_failed(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(), make_flight()
    thing = object()
    lead, follow = lead_and_follow(threads, client, leader, follower, Gate(result=thing))
    assert lead.value == (thing, False)
    assert isinstance(follow.error, LeaderFailed) and follow.error.type_name == "TypeError"


@pytest.mark.parametrize(
    "data", [b"v\x00garbage", b"vjnot json", b"b[1]", b'e["only one"]', b"q", b"", b"n!"]
)
def test_a_hostile_outcome_is_leader_failed_and_runs_nothing(
    client: CountingRedis, make_flight: MakeFlight, data: bytes
) -> None:
    flight = make_flight()
    base = flight.base_of(KEY)
    ghost_join(flight, "ghost")
    client.set(base + "out:1", data)
    with pytest.raises(LeaderFailed) as info:
        flight.do(KEY, never)
    assert info.value.type_name == "ValueError"


# -- one Redis wait per process ---------------------------------------------------------------


def test_a_same_process_herd_makes_one_redis_wait(
    threads: ThreadRunner,
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
) -> None:
    leader = make_flight()
    herd_client = make_client()
    herd = make_flight(client=herd_client)
    gate = Gate(result="v")
    lead = start_leading(threads, leader, gate)
    calls = [start_call(threads, lambda: herd.do(KEY, never)) for _ in range(6)]
    wait_until("one local leader and five local followers",
               lambda: KEY in herd._local._calls and herd._local._calls[KEY].followers == 5)
    wait_until("the herd's process counted in Redis", lambda: waiters(client, leader) == 1)
    gate.finish.set()
    wait_until("all done", lambda: lead.done.is_set() and all(c.done.is_set() for c in calls))
    assert [c.value for c in calls] == [("v", True)] * 6
    assert waiters(client, leader) == 0  # the publish rang for the one process and forgot it
    assert herd_client.sent["BLPOP"] >= 1  # the one local leader waited in Redis


# -- cancellation and the leader-cancelled marker ---------------------------------------------


def test_a_cancelled_follower_leaves_and_its_local_followers_go_round(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, other = make_flight(), make_flight()
    gate = Gate(result="v")
    lead = start_leading(threads, leader, gate)
    cancel = threading.Event()
    follow = start_call(threads, lambda: other.do(KEY, never, cancel))
    wait_until("the follower counted in Redis", lambda: waiters(client, leader) == 1)
    local = start_call(threads, lambda: other.do(KEY, never))
    wait_until("a local follower", lambda: other._local._calls[KEY].followers == 1)
    cancel.set()
    wait_until("the cancelled follower left", lambda: follow.done.is_set())
    assert isinstance(follow.error, Cancelled)
    wait_until("its local follower told to go round", lambda: local.done.is_set())
    assert local.value == (LEADER_CANCELLED, True)
    assert not lead.done.is_set()  # the leader goes on
    gate.finish.set()
    wait_until("leader done", lambda: lead.done.is_set())
    assert lead.value == ("v", False)


def test_the_leader_cancelled_marker_makes_followers_elsewhere_go_round(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(), make_flight()
    lead, follow = lead_and_follow(threads, client, leader, follower,
                                   Gate(result=LEADER_CANCELLED))
    assert follow.value == (LEADER_CANCELLED, True)
    # Going round starts a new flight, with a new number.
    assert follower.do(KEY, lambda: "second") == ("second", False)
    assert int(client.get(follower.base_of(KEY) + "n")) == 2


def test_a_cancelled_leader_elsewhere_reaches_followers_as_cancelled(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(), make_flight()
    lead, follow = lead_and_follow(threads, client, leader, follower, Gate(error=Cancelled()))
    assert isinstance(lead.error, Cancelled) and isinstance(follow.error, Cancelled)


# -- leases, dead leaders and take-overs ------------------------------------------------------


def flight_op(
    flight: RedisSingleFlight, op: str, token: str, *more: Any, lease_ms: int = 60_000
) -> Any:
    """One operation of the flight's script on ``KEY``'s flight, sent as ``token``."""
    base = flight.base_of(KEY)
    return flight._script(
        keys=[base + "lead", base + "n"], args=[op, token, lease_ms, 600_000, *more]
    )


def ghost_join(flight: RedisSingleFlight, token: str, lease_ms: int = 60_000) -> list[Any]:
    """The join of a leader that will never renew, publish, or do anything else."""
    reply: list[Any] = flight_op(flight, "join", token, lease_ms=lease_ms)
    return reply


def test_a_renewed_claim_outlives_many_leases(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    leader, follower = make_flight(lease=0.3), make_flight(lease=0.3)
    gate = Gate(result="v")
    lead = start_leading(threads, leader, gate)
    follow = start_call(threads, lambda: follower.do(KEY, never))
    lead_key = leader.base_of(KEY) + "lead"
    wait_until("five renewals", renewed(client, lead_key, 5), timeout=20, interval=0.02)
    gate.finish.set()
    wait_until("both done", lambda: lead.done.is_set() and follow.done.is_set())
    assert follow.value == ("v", True) and gate.runs == 1


def test_a_follower_takes_over_from_a_leader_that_stopped_renewing(
    threads: ThreadRunner,
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
) -> None:
    paused = make_client(PausedRenewals)
    leader, follower = make_flight(client=paused, lease=0.3), make_flight(lease=0.3)
    stalled = Gate(result="late")
    paused.paused.set()  # a paused process: its renewals never reach Redis, its claim ends
    lead = start_leading(threads, leader, stalled)
    second = Gate(result="fresh")
    second.finish.set()
    follow = start_call(threads, lambda: follower.do(KEY, second))
    wait_until("the follower took over and finished", lambda: follow.done.is_set(), timeout=20)
    assert follow.value == ("fresh", False) and second.runs == 1
    assert int(client.get(leader.base_of(KEY) + "n")) == 1  # the same flight, taken over
    stalled.finish.set()  # the late leader publishes after: its outcome is dropped
    wait_until("late leader done", lambda: lead.done.is_set())
    assert lead.value == ("late", False)
    assert client.get(leader.base_of(KEY) + "out:1") == b'vj"fresh"'


def test_a_finished_take_over_is_found_by_the_other_followers_not_rebuilt(
    client: CountingRedis, make_flight: MakeFlight
) -> None:
    """The earlier double build: follower X takes over from a dead leader and finishes; then
    follower Y checks, finds no claim, and must take X's outcome rather than build again."""
    x = make_flight()  # the script stands for both followers: only the tokens differ
    base = x.base_of(KEY)
    assert ghost_join(x, "ghost") == [0, 1]  # the leader of flight 1, about to die
    assert ghost_join(x, "x") == [1, 1]  # X and Y follow flight 1
    assert ghost_join(x, "y") == [1, 1]

    def check(token: str) -> list[Any]:
        reply: list[Any] = flight_op(x, "check", token, 1)
        return reply

    client.delete(base + "lead")  # the ghost's lease ended
    assert check("x") == [0, 1]  # X takes flight 1 over
    assert check("y") == [1, 1]  # Y keeps following flight 1
    flight_op(x, "publish", "x", 1, b'vj"built"', 5000)
    assert client.get(base + "lead") is None
    assert check("y") == [2, 1, b'vj"built"']  # found, not re-built
    assert int(client.get(base + "n")) == 1


def test_a_follower_of_a_lost_flight_joins_the_flight_that_replaced_it(
    client: CountingRedis, make_flight: MakeFlight
) -> None:
    f = make_flight()
    base = f.base_of(KEY)
    ghost_join(f, "ghost")
    ghost_join(f, "y")
    client.delete(base + "lead")
    assert ghost_join(f, "newcomer") == [0, 2]  # a newcomer found no claim: flight 2
    assert flight_op(f, "check", "y", 1) == [1, 2]  # Y follows flight 2 now
    assert int(client.get(base + "w:2")) == 1
    flight_op(f, "publish", "newcomer", 2, b"0", 5000)
    assert client.get(base + "lead") is None
    # Flight 2 finished and its claim is gone: a follower still asking about flight 1 finds
    # the outcome of the flight that replaced it, and nobody claims anything.
    assert flight_op(f, "check", "y", 1) == [2, 2, b"0"]
    assert client.get(base + "lead") is None


def test_a_dead_leader_costs_one_more_build_never_two(
    threads: ThreadRunner, client: CountingRedis, make_flight: MakeFlight
) -> None:
    followers = [make_flight(lease=0.3) for _ in range(3)]
    ghost_join(followers[0], "ghost", lease_ms=300)
    gates = [Gate(result="built") for _ in followers]
    for g in gates:
        g.finish.set()
    calls = [start_call(threads, lambda f=f, g=g: f.do(KEY, g))
             for f, g in zip(followers, gates, strict=True)]
    wait_until("all done", lambda: all(c.done.is_set() for c in calls), timeout=20)
    assert sum(g.runs for g in gates) == 1
    assert sorted(c.value[1] for c in calls) == [False, True, True]
    assert {c.value[0] for c in calls} == {"built"}


def test_a_corrupt_claim_counts_as_ended(
    client: CountingRedis, make_flight: MakeFlight
) -> None:
    flight = make_flight()
    client.set(flight.base_of(KEY) + "lead", b"\xffnot a claim")
    assert flight.do(KEY, lambda: "v") == ("v", False)


def test_close_stops_the_renewer_for_good(make_flight: MakeFlight) -> None:
    flight = make_flight()
    gate = Gate(result="v")
    gate.finish.set()
    before = threads_named("reachlimit-flight-renewer")
    assert flight.do(KEY, gate) == ("v", False)  # its first flight led starts its renewer
    started = [t for t in threads_named("reachlimit-flight-renewer") if t not in before]
    assert len(started) == 1
    renewer = started[0]
    flight.close()
    assert not renewer.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        flight.do(KEY, never)


# -- Redis failing ----------------------------------------------------------------------------


Trap = TypeVar("Trap", bound=ScriptTrap)


def logged(caplog: pytest.LogCaptureFixture, text: str) -> int:
    """How many records logged so far say ``text``."""
    return sum(text in record.getMessage() for record in caplog.records)


def trapped_flight(
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    cls: type[Trap],
    operation: str,
    lease: float,
) -> tuple[Trap, RedisSingleFlight]:
    """A flight with ``lease`` on a client of its own, a ``ScriptTrap`` subclass ``cls``
    whose calls of the script's ``operation`` go to its trap once the flight is made; both
    closed at teardown."""
    trap: Trap = make_client(cls)
    flight = make_flight(client=trap, lease=lease)
    trap.trap = operation
    return trap, flight


def lose_a_join(
    make_client: Callable[..., CountingRedis], make_flight: MakeFlight, deferred: bool = False
) -> tuple[LostReply, RedisSingleFlight]:
    """A flight whose first join loses its reply: the call fails with a timeout, the join
    having run in Redis (or, ``deferred``, kept in the client's ``late`` for the test to
    send). The lease is two minutes, far longer than the test's timeout."""
    lossy, lost = trapped_flight(make_client, make_flight, LostReply, "join", lease=120.0)
    lossy.deferred = deferred
    with pytest.raises(redis.exceptions.TimeoutError):
        lost.do(KEY, never)
    return lossy, lost


class FailingPublish(ScriptTrap):
    """Its publish (``trap``) fails as if Redis had gone away: every time, or while
    ``away`` is set when the test gives it one (Redis back once cleared)."""

    away: threading.Event | None = None
    tries = 0

    def trapped(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        self.tries += 1
        if self.away is None or self.away.is_set():
            raise redis.exceptions.ConnectionError("publish lost")
        return super().trapped(args, options)


def test_a_leader_whose_publish_fails_keeps_its_value_and_is_taken_over(
    threads: ThreadRunner,
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, leader = trapped_flight(make_client, make_flight, FailingPublish, "publish", 0.3)
    follower = make_flight(lease=0.3)
    gate = Gate(result="lost")
    lead = start_leading(threads, leader, gate)
    second = Gate(result="again")
    second.finish.set()
    follow = start_call(threads, lambda: follower.do(KEY, second))
    wait_until("the follower counted", lambda: waiters(client, leader) == 1)
    gate.finish.set()
    wait_until("both done", lambda: lead.done.is_set() and follow.done.is_set(), timeout=20)
    assert lead.value == ("lost", False)  # the publish failed: logged, not raised
    assert follow.value == ("again", False) and second.runs == 1  # took over after the lease
    assert any("could not publish" in r.getMessage() for r in caplog.records)


def test_an_outcome_not_published_while_redis_was_away_reaches_followers_once_it_is_back(
    threads: ThreadRunner,
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    # A lease far longer than the test's timeout: a follower that got its value by taking
    # the flight over (after the lease) could not finish in time, so "shared" proves the
    # late publish reached it.
    failing, leader = trapped_flight(make_client, make_flight, FailingPublish, "publish", 120.0)
    failing.away = threading.Event()
    failing.away.set()
    follower = make_flight(lease=120.0)
    gate = Gate(result="built while away")
    lead = start_leading(threads, leader, gate)
    follow = start_call(threads, lambda: follower.do(KEY, never))
    wait_until("the follower counted", lambda: waiters(client, leader) == 1)
    gate.finish.set()
    wait_until("the leader done", lead.done.is_set)
    assert lead.value == ("built while away", False)  # the leader's own answer, at once
    wait_until("a retry failed too", lambda: failing.tries >= 2)
    assert not follow.done.is_set()  # still following: the claim stands, nothing published
    assert logged(reachlimit_log, "published a flight outcome late") == 0  # (tried again: kept)
    failing.away.clear()  # Redis answers again
    wait_until("the follower done", follow.done.is_set)
    assert follow.value == ("built while away", True) and gate.runs == 1
    assert client.get(leader.base_of(KEY) + "lead") is None  # the claim went with it
    assert logged(reachlimit_log, "published a flight outcome late") == 1  # once, and done


def test_a_claim_a_lost_join_left_is_dropped_and_its_flight_taken_over(
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    # The join claimed the flight, but its caller never heard (it went on elsewhere: the
    # fallback). With the lost join's lease far longer than the test's timeout, only the
    # drop lets the next caller build.
    lose_a_join(make_client, make_flight)
    second = Gate(result="again")
    second.finish.set()
    other = make_flight(lease=120.0)
    assert other.do(KEY, second) == ("again", False) and second.runs == 1
    assert any("dropped a flight claim a lost reply left" in r.getMessage()
               for r in reachlimit_log.records)


def test_a_lost_join_that_runs_late_has_its_claim_dropped_once_it_ran(
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    # Sent to a Redis that was paused, the join runs only later: the drop finds nothing
    # until then, and is tried again until it finds the claim.
    lossy, lost = lose_a_join(make_client, make_flight, deferred=True)
    lead_key = lost.base_of(KEY) + "lead"
    drops = "EVALSHA drop"
    wait_until("the drop tried twice, finding nothing", lambda: lossy.sent[drops] >= 2)
    dropped = "dropped a flight claim a lost reply left"
    assert logged(reachlimit_log, dropped) == 0 and client.get(lead_key) is None
    client.execute_command(*lossy.late)  # the join runs now: its claim appears
    assert client.get(lead_key) is not None
    wait_until("the claim dropped", lambda: client.get(lead_key) is None)
    wait_until("the drop done", lambda: logged(reachlimit_log, dropped) == 1)


def test_an_outcome_is_given_up_after_the_lease_and_on_close(
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="reachlimit")
    failing, leader = trapped_flight(make_client, make_flight, FailingPublish, "publish", 0.3)
    before = threads_named("reachlimit-flight-republisher")
    assert leader.do(KEY, lambda: "once") == ("once", False)
    kept = "could not publish a flight outcome (it will be once Redis answers)"
    assert logged(caplog, kept) == 1  # handed to the republisher, whose thread it starts
    (republisher,) = [t for t in threads_named("reachlimit-flight-republisher")
                      if t not in before]
    wait_until("given up after the lease",
               lambda: logged(caplog, "gave up publishing a flight outcome") == 1)
    assert logged(caplog, "published a flight outcome late") == 0
    assert leader.do("other", lambda: "twice") == ("twice", False)
    assert logged(caplog, kept) == 2  # the next one, held to be tried again
    leader.close()  # gives it up, and stops the thread
    assert not republisher.is_alive()
    assert logged(caplog, "published a flight outcome late") == 0


def test_redis_errors_propagate_from_do() -> None:
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=0.2,
                       socket_connect_timeout=0.2)
    flight = RedisSingleFlight(dead)
    with pytest.raises(redis.exceptions.ConnectionError):
        flight.do(KEY, never)
    flight.close()


# -- ColdPath over Redis ----------------------------------------------------------------------


# Kept apart from test_a_same_process_herd_makes_one_redis_wait:its fixtures because pytest
# passes each test the fixtures it names; the two tests share nothing else.
def test_coldpath_composes_with_the_redis_limiter_cache_and_flight(
    threads: ThreadRunner,
    client: CountingRedis,
    make_client: Callable[..., CountingRedis],
    make_flight: MakeFlight,
) -> None:
    """Two "processes", each a ColdPath on its own client: one build for a herd of both, then
    warm in both; a leader whose client leaves while queued lets a follower elsewhere lead."""
    paths: list[ColdPath] = []
    limiters: list[RedisColdLimiter] = []
    for _ in range(2):
        c = make_client()
        limiters.append(RedisColdLimiter(c, "path", active=1, queue=4, wait=30.0))
        paths.append(ColdPath(limiters[-1], RedisCache(c, "path"), make_flight(client=c,
                                                                                name="path")))
    try:
        built: list[str] = []
        gate = threading.Event()

        def build() -> dict[str, str]:
            built.append(threading.current_thread().name)
            assert gate.wait(30)
            return {"report": "r"}

        a = start_call(threads, lambda: paths[0].get(KEY, build))
        wait_until("A builds", lambda: len(built) == 1)
        b = [start_call(threads, lambda: paths[1].get(KEY, build)) for _ in range(3)]
        base = paths[1].flight.base_of(KEY)  # type: ignore[attr-defined]
        wait_until("B follows in Redis", lambda: int(client.get(base + "w:1") or 0) == 1)
        # ... and B's other two calls follow B's first in its process (else one that starts
        # only after the build ends finds the value warm: a hit, not a coalesced call).
        local = paths[1].flight._local  # type: ignore[attr-defined]
        wait_until("B's other two follow locally",
                   lambda: KEY in local._calls and local._calls[KEY].followers == 2)
        gate.set()
        wait_until("all done", lambda: a.done.is_set() and all(x.done.is_set() for x in b))
        assert [x.value for x in (a, *b)] == [{"report": "r"}] * 4
        assert len(built) == 1
        assert paths[1].stats().coalesced == 3 and paths[1].stats().builds == 0
        assert paths[1].get(KEY, build) == {"report": "r"}  # warm in B without a build
        assert paths[1].stats().hits == 1

        # A leader whose client leaves while queued: the follower elsewhere goes round, leads.
        held = limiters[0].acquire()  # the only build slot
        cancel = threading.Event()
        lead = start_call(threads, lambda: paths[0].get("cold", build, cancel))
        wait_until("A queued", lambda: limiters[0].stats().queued == 1)
        follow = start_call(threads, lambda: paths[1].get("cold", build))
        cold_base = paths[1].flight.base_of("cold")  # type: ignore[attr-defined]
        wait_until("B follows", lambda: int(client.get(cold_base + "w:1") or 0) == 1)
        cancel.set()
        wait_until("A gave up", lambda: lead.done.is_set())
        assert isinstance(lead.error, Cancelled)
        wait_until("B leads and queues", lambda: limiters[0].stats().queued == 1)
        held.release()
        wait_until("B built", lambda: follow.done.is_set())
        assert follow.value == {"report": "r"} and len(built) == 2
        assert int(client.get(cold_base + "n")) == 2  # B led a new flight
    finally:
        for lim in limiters:
            lim.close()


def test_singleflight_still_satisfies_flight() -> None:
    flight: Flight = SingleFlight()
    assert flight.do("k", lambda: 1) == (1, False)
