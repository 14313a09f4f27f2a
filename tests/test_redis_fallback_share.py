"""The fallback keeps its share: while Redis is away each process admits ceil(active / N)
builds and ceil(queue / N) queue places, N the live processes of the budget as Redis last
counted them, instead of the whole budget each (``reachlimit.redis._members``,
``ResilientLimiter``), against a real redis-server.

design:

    members     ``Members`` objects with owners of their own stand for processes: N counted
                from several announcing members; a member that stops announcing drops out
                once its period has ended (Redis's clock), one that closes at once, every
                member of a dead worker when its master frees its places (``release_owner``);
                N kept while Redis is down, 1 before Redis ever answered; a forked child
                announcing as a member of its own.
    the share   ``tests/support/redis_fallback.Stack`` objects (each a process's wiring, with
                its own fallback and its own member): 4 of them with active 2 and queue 8,
                Redis stopped: each fallback admits 1 build and 2 places, its figures say so;
                the fallbacks' builds still running when Redis comes back are its holders
                (so it admits nobody beside them), a fallback waiter granted after that
                too; one alone keeps the whole budget; an outage with fewer processes than the
                last one gives a larger share; ``fallback="refuse"`` announces nothing.
    reserved    the first process back from an outage reserves the share of a process still
                on its fallback, so Redis admits nobody beside what that fallback may run
                until it is back too (restarted empty, so its share was reserved by name or
                anonymously: the same outcome); a reservation ends with its time without
                counting a lost lease, and with the death of its process (``release_owner``).
    gunicorn    the real claim: 2 servers x 2 workers (``tests.apps.share_app``, whose held
                builds write to one build log), every worker knowing N = 4, Redis paused
                with SIGSTOP, a burst of 40 distinct cold keys: at most one build at once in
                each worker and at most 4 across the service, where each worker admitting
                the whole budget would run 8.

Waits are for states (``wait_until``, a Herd's replies, the build log), never for a length of
time; the only figures asserted are the limiter's own (capacities, counts).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from reachlimit import Busy, Cancelled
from reachlimit.redis import FAILURES, RedisColdLimiter, connect, owner_prefix, release_owner
from reachlimit.redis._common import limiter_keys, members_key
from reachlimit.redis._members import Members
from tests.apps.build_log_app import at_once_along, read_log
from tests.support.clients import Herd, Reply, check_refusal
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.processes import free_port
from tests.support.redis_fallback import Stack
from tests.support.redis_limiters import server_ms
from tests.support.redis_sentinel import Gate, build_log_server, gate_fixture  # noqa: F401
from tests.support.redis_server import RedisServer
from tests.support.refreshes import threads_named
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner, start_call
from tests.support.waiting import wait_until
from tests.test_fork import in_child

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

#: The members key of the budget the unit tests use.
KEY = members_key("share", "unit")


def ids_in_redis(client: Any, key: str = KEY) -> list[str]:
    return [m.decode() for m in client.zrange(key, 0, -1)]


@pytest.fixture(name="members")
def members_fixture(client: redis.Redis) -> Any:
    """``members(**options)``: a ``Members`` of ``KEY`` on the test's client (or ``client=``),
    closed (and left) at teardown."""
    made: list[Members] = []

    def make(**options: Any) -> Members:
        m = Members(options.pop("client", client), options.pop("key", KEY), **options)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close(leave=True)


# -- N: the members --------------------------------------------------------------------------


def test_n_counts_every_announcing_member(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    procs = [members(owner=f"host{i}:b00t:{100 + i}:") for i in range(3)]
    assert [m.count for m in procs] == [1, 1, 1]  # before any announce
    assert [m.announce() for m in procs] == [1, 2, 3]
    assert procs[0].announce() == 3 and procs[0].count == 3  # again: still three
    for i, m in enumerate(procs):
        assert m.id.startswith(f"host{i}:b00t:{100 + i}:")
    twin = members(owner="host0:b00t:100:")  # a second fallback in one process: its own
    assert twin.announce() == 4
    assert sorted(ids_in_redis(client)) == sorted(m.id for m in [*procs, twin])
    procs[1].close()  # leaves at once
    assert procs[0].announce() == 3
    assert procs[1].id not in ids_in_redis(client)


def test_an_announce_that_works_tells_the_resilient_limiters_health(
    server: RedisServer, make_stack: Callable[..., Stack], members: Callable[..., Members]
) -> None:
    # The members' thread calls on_answer after each announce that worked: a
    # ResilientLimiter points it at its health's probe_soon (Redis back noticed within a
    # period, not a backoff).
    s = make_stack(server.url(), active=2, queue=8)
    assert s.limiter.members is not None
    assert s.limiter.members.on_answer == s.health.probe_soon
    heard = threading.Event()
    member = members(every=0.05)
    member.on_answer = heard.set
    member.start()
    assert heard.wait(JOIN_TIMEOUT), "no on_answer after an announce that worked"


def test_a_member_that_stops_announcing_drops_out_once_its_period_ended(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    gone = members(owner="deadhost:b00t:1:", period=1.0)  # announces once, then never
    live = members(every=0.05, period=1.0)
    before = server_ms(client)
    gone.announce()
    after = server_ms(client)
    ends = client.zscore(KEY, gone.id)
    assert ends is not None and before + 1000 <= ends <= after + 1000  # Redis's clock
    assert live.announce() == 2  # announced within gone's period
    before = threads_named(Members.THREAD_NAME)
    live.start()
    assert len([t for t in threads_named(Members.THREAD_NAME) if t not in before]) == 1
    wait_until("the silent member dropped out", lambda: live.count == 1)
    assert server_ms(client) >= ends  # not before its period ended
    assert ids_in_redis(client) == [live.id]
    assert client.pttl(KEY) > 0  # the key ends with its last member


def test_n_stays_the_last_known_while_redis_is_down_and_is_1_before_any_answer(
    live_redis: RedisServer, members: Callable[..., Members]
) -> None:
    never = members(client=connect(f"redis://127.0.0.1:{free_port()}/0"))
    with pytest.raises(FAILURES):
        never.announce()
    assert never.count == 1  # Redis never answered: this process alone
    url_client = connect(live_redis.url())
    a = members(client=url_client, owner="hosta:b00t:1:", every=0.05)
    b = members(client=url_client, owner="hostb:b00t:2:")
    a.announce()
    b.announce()
    assert a.announce() == 2
    before = threads_named(Members.THREAD_NAME)
    a.start()
    (thread,) = [t for t in threads_named(Members.THREAD_NAME) if t not in before]
    live_redis.stop()
    with pytest.raises(FAILURES):
        a.announce()
    assert a.count == 2  # the last N Redis gave
    assert thread.is_alive()  # still trying, every 0.05 s
    a.close(leave=True)  # leaving a Redis that is away is no error: it drops out later
    assert a.count == 2
    url_client.close()


def test_a_redis_that_forgot_the_members_leaves_n_as_it_was_for_one_period(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    # Redis restarted empty: each member is new to it at its next announce, so the first
    # ones back would count 1, 2, ... and a fallback sized by that count would admit more
    # than its share. A member Redis forgot keeps the count it knew for one period.
    procs = [members(owner=f"host{i}:b00t:{100 + i}:", period=1.0) for i in range(3)]
    assert [m.announce() for m in procs] == [1, 2, 3]
    assert [m.announce() for m in procs] == [3, 3, 3]  # each knows N now
    client.flushall()
    assert procs[0].announce() == 3 and procs[0].count == 3  # Redis counts 1
    assert client.zcard(KEY) == 1
    assert procs[1].announce() == 3  # Redis counts 2
    assert procs[2].announce() == 3  # Redis counts 3: the truth again
    # Only the first comes back after a second loss: once its period is over the count is
    # Redis's (the others were gone meanwhile, as after a restart that lost them for good).
    client.flushall()
    assert procs[0].announce() == 3
    wait_until("the count held for one period ended", lambda: procs[0].announce() == 1,
               interval=0.05)


def test_release_owner_removes_every_member_of_a_dead_worker(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    key = members_key("reachlimit", "shr")
    dead = "deadhost:0badb007:4242:"
    for _ in range(2):
        members(key=key, owner=dead).announce()
    live = members(key=key)
    assert live.announce() == 3
    assert release_owner(client, dead, name="shr") == (0, 0)
    assert ids_in_redis(client, key) == [live.id]
    assert live.announce() == 1
    live.close()
    assert client.exists(key) == 0  # the last member left: no key behind


def test_a_forked_child_announces_as_a_member_of_its_own(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    parent = members(every=0.05)
    parent.start()
    wait_until("the parent announced", lambda: parent.id in ids_in_redis(client))

    def child() -> dict[str, Any]:
        mine = parent.id  # the child's id already: a new one, from its own pid
        parent.start()  # no thread came with the fork: the child starts its own
        wait_until("the child announced", lambda: mine in ids_in_redis(client), timeout=10)
        wait_until("the child counts both", lambda: parent.count == 2, timeout=10)
        return {"id": mine, "pid": os.getpid()}

    report = in_child(child)
    assert report["id"] != parent.id
    assert report["id"].startswith(owner_prefix(report["pid"]))
    assert parent.id.startswith(owner_prefix())
    assert report["id"] in ids_in_redis(client)  # until its period ends: it did not leave
    wait_until("the parent counts both", lambda: parent.count == 2)


# -- the share -------------------------------------------------------------------------------


@pytest.fixture
def known_stacks(
    server: RedisServer, make_stack: Callable[..., Stack]
) -> Callable[..., list[Stack]]:
    """``known_stacks(n, active=2, queue=8)``: ``n`` stacks on one budget of the module's
    Redis (``n`` processes' worth), returned once each has made its first call (which starts
    its announcing) and knows N = n."""

    def make(n: int, active: int = 2, queue: int = 8) -> list[Stack]:
        stacks = [make_stack(server.url(), active=active, queue=queue) for _ in range(n)]
        for s in stacks:
            s.limiter.stats()
        wait_until(f"every stack counting {n} processes",
                   lambda: all(s.limiter.processes == n for s in stacks))
        return stacks

    return make


def test_four_processes_each_admit_a_quarter_of_the_budget_while_redis_is_down(
    server: RedisServer, known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    stacks = known_stacks(4)
    assert stacks[0].limiter.share() == (1, 2)
    server.stop()
    for s in stacks:
        stats = s.limiter.stats()  # the first call finds Redis down
        assert (stats.backend, stats.degraded) == ("local", True)
        assert (stats.capacity_active, stats.capacity_queue) == (1, 2)
    s = stacks[0]
    grant = s.limiter.acquire()
    assert s.local.stats().active == 1
    cancels = [threading.Event() for _ in range(2)]
    waiting = [start_call(runner, lambda c=c: s.limiter.acquire(c), name=f"waiter-{i}")
               for i, c in enumerate(cancels)]
    wait_until("two waiters queued on the fallback", lambda: s.local.stats().queued == 2)
    with pytest.raises(Busy) as info:
        s.limiter.acquire()  # a third would wait (its wait then ends in "timeout")
    assert info.value.reason == Busy.QUEUE_FULL  # refused at once
    for cancel in cancels:
        cancel.set()
    for outcome in waiting:
        outcome.wait_done()
        assert isinstance(outcome.error, Cancelled), outcome.error
    grant.release()
    local = s.local.stats()
    assert (local.peak_active, local.peak_queued, local.rejected_full) == (1, 2, 1)
    assert stacks[1].local.stats().acquired == 0  # the others' fallbacks saw nothing


def test_a_shared_build_running_when_redis_goes_counts_in_its_process_share(
    server: RedisServer, known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    # The outage's start: a process holding shared grants when Redis goes must not add its
    # whole share on top of them (without that the service ran active + N shares at once).
    stacks = known_stacks(2, active=4)
    holder, other = stacks
    shared = [holder.limiter.acquire() for _ in range(2)]  # 2 of Redis's 4, both here
    assert holder.local.stats().active == 2  # counted as running here (not as acquired)
    assert holder.local.stats().acquired == 0
    server.stop()
    assert holder.limiter.stats().capacity_active == 2  # the share: ceil(4 / 2)
    cancel = threading.Event()
    waiting = start_call(runner, lambda: holder.limiter.acquire(cancel), name="fallback")
    wait_until("the fallback's newcomer queued behind the shared builds",
               lambda: holder.local.stats().queued == 1)
    assert not waiting.done.is_set()
    with other.limiter.acquire(), other.limiter.acquire():  # nothing runs there: its share
        assert other.local.stats().active == 2
    shared[0].release()  # Redis is away: logged; the slot here goes to the waiter
    waiting.wait_done()
    assert waiting.error is None and waiting.value.held
    assert holder.local.stats().active == 2  # the fallback's grant and the other shared one
    shared[1].release()
    waiting.value.release()
    assert holder.local.stats().active == 0
    with pytest.raises(RuntimeError, match="twice"):
        shared[1].release()  # a second release is still an error, and frees nothing
    assert holder.local.stats().active == 0


def test_the_fallbacks_builds_still_running_when_redis_comes_back_count_there(
    server: RedisServer, known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    # The outage's end: Redis, back (restarted empty), must not admit its whole budget
    # beside the builds the fallbacks admitted that still run (without that the service ran
    # active + N shares at once). Each process tells Redis about them before it marks
    # Redis up, so once both are up Redis counts both builds and admits nobody beside them.
    stacks = known_stacks(2)
    port = server.port
    server.stop()
    running = [s.limiter.acquire() for s in stacks]  # each fallback's share: 1 build
    assert all(s.local.stats().active == 1 for s in stacks)
    server.start(port=port, attempts=1)
    wait_until("both processes back on Redis", lambda: all(s.health.up for s in stacks))
    first, second = stacks
    assert first.remote.stats().active == 2  # both builds are Redis's holders now
    waiting = start_call(runner, lambda: first.limiter.acquire(), name="after-recovery")
    wait_until("a newcomer queued in Redis behind them",
               lambda: first.remote.stats().queued == 1)
    running[1].release()  # the second process's build ends: its holder goes with it
    waiting.wait_done()
    assert waiting.error is None and waiting.value.held
    assert first.remote.stats().active == 2  # the first's fallback build and the newcomer
    assert second.local.stats().active == 0
    running[0].release()
    waiting.value.release()
    stats = first.remote.stats()
    assert (stats.active, stats.queued, stats.acquired) == (0, 0, 1)  # held over: not acquired
    assert first.local.stats().active == 0


def test_a_fallback_waiter_admitted_after_redis_came_back_counts_there(
    server: RedisServer, known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    # A waiter queued in the fallback when Redis came back keeps its place there; the grant
    # it is handed then is told to Redis at once.
    (alone,) = known_stacks(1, active=1, queue=2)
    port = server.port
    server.stop()
    first = alone.limiter.acquire()
    waiting = start_call(runner, lambda: alone.limiter.acquire(), name="fallback-waiter")
    wait_until("a waiter queued in the fallback", lambda: alone.local.stats().queued == 1)
    server.start(port=port, attempts=1)
    wait_until("back on Redis", lambda: alone.health.up)
    assert alone.remote.stats().active == 1  # the running build, told before Redis was up
    first.release()  # the fallback hands its slot to its waiter
    waiting.wait_done()
    assert waiting.error is None and waiting.value.held
    assert alone.remote.stats().active == 1  # the waiter's build, told as it was granted
    waiting.value.release()
    assert alone.remote.stats().active == 0


def test_one_process_alone_keeps_the_whole_budget(
    server: RedisServer, make_stack: Callable[..., Stack],
    known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    (alone,) = known_stacks(1)
    member = alone.limiter.members
    assert member is not None
    wait_until("it announced", lambda: member.id in ids_in_redis(alone.client,
                                                                 member.key))
    server.stop()
    stats = alone.limiter.stats()
    assert (stats.degraded, stats.capacity_active, stats.capacity_queue) == (True, 2, 8)
    grants = [alone.limiter.acquire() for _ in range(2)]
    cancels = [threading.Event() for _ in range(8)]
    waiting = [start_call(runner, lambda c=c: alone.limiter.acquire(c), name=f"waiter-{i}")
               for i, c in enumerate(cancels)]
    wait_until("eight waiters queued", lambda: alone.local.stats().queued == 8)
    with pytest.raises(Busy) as info:
        alone.limiter.acquire()
    assert info.value.reason == Busy.QUEUE_FULL
    for cancel in cancels:
        cancel.set()
    for outcome in waiting:
        outcome.wait_done()
        assert isinstance(outcome.error, Cancelled), outcome.error
    for grant in grants:
        grant.release()
    never = make_stack(f"redis://127.0.0.1:{free_port()}/0", active=2, queue=8)
    stats = never.limiter.stats()  # Redis never reached: N is 1
    assert (stats.degraded, stats.capacity_active, stats.capacity_queue) == (True, 2, 8)


def test_an_outage_with_fewer_processes_than_the_last_gives_a_larger_share(
    server: RedisServer, known_stacks: Callable[..., list[Stack]]
) -> None:
    stays, goes = known_stacks(2)
    port = server.port
    server.stop()
    stats = stays.limiter.stats()
    assert (stats.capacity_active, stats.capacity_queue) == (1, 4)
    server.start(port=port, attempts=1)  # empty: the members announce themselves again
    wait_until("back on Redis", lambda: stays.health.up and not stays.limiter.stats().degraded)
    goes.limiter.close()  # Redis is up: it leaves at once
    wait_until("one process left", lambda: stays.limiter.processes == 1)
    server.stop()
    stats = stays.limiter.stats()
    assert (stats.degraded, stats.capacity_active, stats.capacity_queue) == (True, 2, 8)
    with stays.limiter.acquire(), stays.limiter.acquire():  # grown: both slots at once
        assert stays.local.stats().active == 2


def reservations(client: Any, name: str = "fb", prefix: str = "reachlimit") -> list[str]:
    """The reservations among a budget's holders (``lua/limiter.lua``'s Reservations)."""
    holders = limiter_keys(prefix, name)[0]
    return [h.decode() for h in client.zrange(holders, 0, -1) if h.startswith(b"#")]


def test_redis_back_admits_nobody_beside_a_process_still_on_its_fallback(
    server: RedisServer, known_stacks: Callable[..., list[Stack]], runner: ThreadRunner
) -> None:
    # The outage's end, when the processes learn at different moments that Redis is back
    # (the soak saw them 50-175 ms apart after a restart): the first one back reserves the
    # share of the other, which may still run it on its fallback, so that Redis does not
    # admit its whole budget beside it. The other process is held on its fallback here (its
    # health has no probe thread any more) until the test brings it back.
    back, behind = known_stacks(2)
    back.limiter.RESERVE = 60.0  # long enough for any machine: it ends by the recovery below
    behind.health.close()
    port = server.port
    server.stop()
    running = behind.limiter.acquire()  # its fallback's share: 1 build
    assert behind.local.stats().active == 1
    assert back.limiter.stats().degraded  # the first process saw the outage too
    server.start(port=port, attempts=1)  # empty: the members too
    wait_until("the first process back on Redis", lambda: back.health.up)
    assert len(reservations(back.client)) == 1  # the other's share (ceil(2 / 2) = 1)
    assert back.remote.stats().active == 0  # a reservation is no build
    first = back.limiter.acquire()
    waiting = start_call(runner, lambda: back.limiter.acquire(), name="beside-the-fallback")
    wait_until("a second newcomer queued, not granted beside the reserved share",
               lambda: back.remote.stats().queued == 1)
    assert not waiting.done.is_set()
    behind.limiter.recover()  # back too: its reservation ends, its running build is told
    assert reservations(back.client) == []
    assert back.remote.stats().active == 2 and not waiting.done.is_set()
    running.release()  # the fallback's build ends, and its holder in Redis with it
    waiting.wait_done()
    assert waiting.error is None and waiting.value.held
    first.release()
    waiting.value.release()
    stats = back.remote.stats()
    assert (stats.active, stats.queued, stats.lease_lost) == (0, 0, 0)


def test_a_reservation_ends_with_its_time_and_with_its_process(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    lim = RedisColdLimiter(client, "unit", prefix="share", active=2, queue=2)
    try:
        mine, other, dead = (members(owner=f"h{i}:b:{i}:") for i in range(3))
        for m in (mine, other, dead):
            m.announce()
        lim.hold_fallback_builds(0, recovery=(mine.id, 3, 60.0))
        assert sorted(reservations(client, "unit", "share")) == sorted(
            [f"#{other.id}#1", f"#{dead.id}#1"])
        release_owner(client, "h2:b:2:", name="unit", prefix="share", active=2)
        assert reservations(client, "unit", "share") == [f"#{other.id}#1"]
        client.delete(limiter_keys("share", "unit")[0])  # a new outage's first recovery
        client.hdel(limiter_keys("share", "unit")[4], "reserved_until")
        lim.hold_fallback_builds(0, recovery=(mine.id, 2, 0.2))
        assert reservations(client, "unit", "share") == [f"#{other.id}#1"]

        def ended() -> bool:
            lim.stats()  # every operation reaps what ended
            return reservations(client, "unit", "share") == []

        wait_until("the reservation's time over on Redis's clock", ended)
        assert lim.stats().lease_lost == 0  # it was no build: nothing was lost
    finally:
        lim.close()


def test_redis_restarted_empty_reserves_the_others_anonymously(
    client: redis.Redis, members: Callable[..., Members]
) -> None:
    # Redis lost its members (restarted empty): the first back reserves N - 1 shares under
    # no name, and each other process back takes one share of them as its own.
    lim = RedisColdLimiter(client, "unit", prefix="share", active=4, queue=2)
    try:
        lim.hold_fallback_builds(0, recovery=("h0:b:0:m", 3, 60.0))
        assert sorted(reservations(client, "unit", "share")) == [
            "#?#1", "#?#2", "#?#3", "#?#4"]  # 2 processes x ceil(4 / 3) = 2 slots each
        lim.hold_fallback_builds(0, recovery=("h1:b:1:m", 3, 60.0))
        assert len(reservations(client, "unit", "share")) == 2
        with lim.acquire(), lim.acquire():  # the two slots the second one's share gave back
            assert lim.stats().active == 2
        lim.hold_fallback_builds(0, recovery=("h2:b:2:m", 3, 60.0))
        assert reservations(client, "unit", "share") == []
    finally:
        lim.close()


def test_refuse_mode_announces_nothing(
    server: RedisServer, make_stack: Callable[..., Stack]
) -> None:
    s = make_stack(server.url(), fallback="refuse", active=2, queue=8)
    s.limiter.acquire().release()
    assert s.limiter.members is None and s.limiter.processes == 1
    assert s.client.keys("*members*") == []


# -- gunicorn: 2 servers x 2 workers, Redis paused -------------------------------------------

ACTIVE, QUEUE = 2, 8  # the extension's defaults, the servers' budget
WORKERS = 4
BURST = 40


def share_server(tmp_path: Path, name: str, gate: Gate, url: str) -> GunicornServer:
    """``build_log_server``'s service, serving ``tests.apps.share_app`` (its ``/debug/share``)."""
    env = {"REACHLIMIT_REDIS_PREFIX": "share", "REACHLIMIT_WAIT": "1"}
    return dataclasses.replace(
        build_log_server(tmp_path, name, gate, url, env), app="tests.apps.share_app:create_app()"
    )


def most_at_once_per_process(gate_dir: Path) -> dict[int, int]:
    """For each PID in the build log, the most of its builds that ran at once."""
    running: Counter[int] = Counter()
    most: Counter[int] = Counter()
    for line in read_log(gate_dir):
        running[line.pid] += 1 if line.event == "start" else -1
        most[line.pid] = max(most[line.pid], running[line.pid])
    return dict(most)


def every_worker_knows(servers: list[GunicornServer], n: int) -> set[int]:
    """Ask every server's /debug/share, round after round, until each of their workers has
    said N = n (all servers in each round: a worker starts announcing with its first call,
    so none may wait for another server's workers to be done)."""
    told: dict[str, set[int]] = {server.name: set() for server in servers}

    def every_one() -> bool:
        for server in servers:
            body = server.get_json("/debug/share")
            if body["processes"] == n:
                told[server.name].add(body["pid"])
        return all(
            told[s.name] >= set(s.worker_pids()) and len(told[s.name]) >= s.workers
            for s in servers
        )

    wait_until(f"every worker counting {n}", every_one, interval=0.01)
    return set().union(*told.values())


@pytest.mark.gunicorn
def test_four_workers_on_a_paused_redis_run_at_most_the_budget_together(
    tmp_path: Path, gate: Gate, live_redis: RedisServer
) -> None:
    servers = [share_server(tmp_path, name, gate, live_redis.url()) for name in "ab"]
    with serving(servers[0]), serving(servers[1]):
        workers = every_worker_knows(servers, WORKERS)
        assert len(workers) == WORKERS
        os.kill(live_redis.pid, signal.SIGSTOP)
        try:
            paths = [f"/report/hold-{n}" for n in range(BURST)]
            herds = [Herd(servers[0].port, paths[0::2]), Herd(servers[1].port, paths[1::2])]

            def settled() -> bool:  # every request answered (refused) or building
                answered = sum(len(h.order) for h in herds)
                counts = at_once_along(gate.dir)
                return answered + (counts[-1] if counts else 0) == BURST

            wait_until("every request answered or building", settled, interval=0.02)
            per_process = most_at_once_per_process(gate.dir)
            counts = at_once_along(gate.dir)
            print(f"\nbuilds at once during the pause: most {max(counts)} across the service "
                  f"(budget {ACTIVE}, {WORKERS} processes), per worker {per_process}")
            assert set(per_process) <= workers
            assert max(per_process.values()) <= -(-ACTIVE // WORKERS), per_process
            assert max(counts) <= WORKERS * -(-ACTIVE // WORKERS), counts
            early = [r for h in herds for r in h.replies if r is not None]
            for reply in early:
                assert isinstance(reply, Reply), reply
                check_refusal(reply)  # refused: a full share, or a wait that ran out
            gate.open()
            replies = [r for h in herds for r in h.results()]
        finally:
            os.kill(live_redis.pid, signal.SIGCONT)
        statuses = Counter(r.status for r in replies)
        print(f"statuses: {dict(statuses)}")
        assert set(statuses) <= {200, 429}, statuses
        assert 2 * statuses[200] == len(at_once_along(gate.dir))  # each 200: one build
