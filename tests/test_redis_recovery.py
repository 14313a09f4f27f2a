"""Redis back, noticed without traffic: while Redis is down a daemon thread of its health
(``RedisHealth(url, client=...)``, as the extension makes it) probes it on the backoff, so a
process that serves nothing still learns that it is back; from then on every call goes to
Redis and none is admitted by the fallback.

design:

    unit      ``RedisHealth`` with a ``FakeClock`` and a fake probe. The schedule is read off
              the fake clock at each probe; between probes the clock stands still just before
              the next one is due until the thread has read it again, so a thread that
              probed early would be caught, and then it is set to the due time. Also: the
              first success marks Redis up and ends the thread; ``available()`` is False for
              every caller while down (a probe held in the thread meanwhile); ``close``; a
              failure right after a probe's success (the same outage); a new outage, a new
              thread; a forked child that starts its own.
    redis     a ``ResilientLimiter`` (``tests/support/redis_fallback.Stack``) whose
              redis-server is stopped and started again is back on Redis with no call in
              between, awaited through the health; a node of a real Redis Cluster stopped and
              started again; ``ReachLimit.close()`` stopping the thread.
    gunicorn  the sequence that failed before: 2 servers x 2 workers
              (``tests.apps.build_log_app``, 300 ms builds) on one redis-server; every worker
              notices the outage and then serves nothing; Redis killed and started again on
              its port and in its directory; every worker's log says that Redis "answers
              again" (a bounded poll of the servers' logs); then a burst of distinct cold
              keys: never more than ``active`` builds at once in the service's build log, and
              only 200s and 429s.
"""

from __future__ import annotations

import os
import re
import select
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from reachlimit import ColdLimiter
from reachlimit.flask import ReachLimit
from reachlimit.redis import (
    RedisColdLimiter,
    RedisHealth,
    ResilientLimiter,
    connect,
)
from tests.apps.build_log_app import at_once_along
from tests.support.clients import Herd, Reply, check_refusal
from tests.support.clock import FakeClock
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.redis_cluster import RedisCluster, redis_cluster_fixture  # noqa: F401
from tests.support.redis_fallback import Stack, warnings_about_redis
from tests.support.redis_sentinel import Gate, build_log_server, gate_fixture  # noqa: F401
from tests.support.redis_server import RedisServer
from tests.support.refreshes import threads_named
from tests.support.threads import JOIN_TIMEOUT, ThreadRunner
from tests.support.waiting import DEADLINE, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


class FakeProbe:
    """A probe the test scripts: each call records the fake clock's time, then waits while
    ``hold`` is clear, then fails (``fail`` calls left, counted down) or succeeds."""

    def __init__(self, clock: FakeClock, fail: int = 10**9) -> None:
        self.clock = clock
        self.fail = fail
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()  # set at each call
        self._lock = threading.Lock()
        self.times: list[float] = []  # guarded by _lock

    def __call__(self) -> None:
        with self._lock:
            self.times.append(self.clock.now)
        self.entered.set()
        assert self.hold.wait(JOIN_TIMEOUT), "the test never let the probe go on"
        with self._lock:
            if self.fail > 0:
                self.fail -= 1
                raise redis.ConnectionError("refused (fake)")

    def calls(self) -> int:
        with self._lock:
            return len(self.times)

    def times_now(self) -> list[float]:
        with self._lock:
            return list(self.times)


#: The name of a health's probe thread.
PROBE = "reachlimit-redis-probe"


def probe_threads(before: Collection[threading.Thread] = ()) -> list[threading.Thread]:
    """The probe threads alive now that were not among ``before`` (those alive before the
    test's health could start one): that health's."""
    return [t for t in threads_named(PROBE) if t not in before]


def the_probe_thread(before: Collection[threading.Thread]) -> threading.Thread:
    """The one probe thread alive that was not among ``before``."""
    (thread,) = probe_threads(before)
    return thread


def ended(before: Collection[threading.Thread]) -> bool:
    """The test's probe thread is gone (none started, or the one started has ended)."""
    return not probe_threads(before)


def stepping_health(
    fail: int = 0, url: str = "redis://h:1/0", **kwargs: Any
) -> tuple[RedisHealth, FakeProbe, list[threading.Thread]]:
    """A health whose fake clock moves a second at each read (every pause has passed: no real
    wait at all); its probe, which fails ``fail`` times, then answers; and the probe threads
    alive before the health was made (``before`` of ``probe_threads``)."""
    before = probe_threads()
    clock = FakeClock(step=1.0)
    probe = FakeProbe(clock, fail=fail)
    return RedisHealth(url, probe=probe, clock=clock, **kwargs), probe, before


def probed_until_up(health: RedisHealth, before: Collection[threading.Thread]) -> None:
    """Redis fails once: the health's probe thread probes until Redis answers, marks it up
    and ends by itself."""
    health.failed(redis.ConnectionError("refused"))
    thread = the_probe_thread(before)
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive() and health.up


# -- unit: the probe thread ------------------------------------------------------------------


def test_no_thread_until_redis_fails_then_one() -> None:
    clock = FakeClock()
    probe = FakeProbe(clock)
    before = probe_threads()
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        for _ in range(3):
            assert health.available()
            health.succeeded(health.failures)
        assert probe_threads(before) == []  # a process that only ever saw Redis up has none
        health.failed(redis.ConnectionError("refused"))
        thread = the_probe_thread(before)  # named reachlimit-redis-probe
        assert thread.daemon and thread.is_alive()
        health.failed(redis.TimeoutError("a straggler of the same outage"))
        assert probe_threads(before) == [thread]  # one thread per health
    finally:
        health.close()
    assert ended(before)


def probes_on_schedule(health: RedisHealth, clock: FakeClock, probe: FakeProbe,
                       pauses: list[float]) -> list[float]:
    """Walk the thread through ``pauses`` failed probes: before each, the clock stands just
    short of the time it is due until the thread has read it twice more (it must not probe
    then), then it is set to that time and the probe must come. The probes' times."""
    due = clock.now
    for n, pause in enumerate(pauses):
        due += pause
        clock.now = due - pause / 100
        reads = clock.calls
        wait_until("the thread reading the clock before the probe is due",
                   lambda r=reads: clock.calls >= r + 2, interval=0.0005)
        assert probe.calls() == n, f"probe {n + 1} came before it was due"
        clock.now = due
        wait_until(f"probe {n + 1}", lambda k=n + 1: probe.calls() == k, interval=0.0005)
        wait_until("the probe's failure recorded",
                   lambda k=n + 1: health.failures == 1 + k, interval=0.0005)
    return probe.times_now()


def test_the_thread_probes_on_the_backoff_doubling_to_the_cap() -> None:
    clock = FakeClock(start=1000.0)
    probe = FakeProbe(clock)
    # A scaled-down backoff (the real one is 0.25 s through an outage's first 5 s, then
    # doubles up to 5 s: the next test): the thread's pauses are real waits for whatever the
    # clock still lacks. Probes that fail at once (refused): the first pause through the
    # outage's first max_retry, then doubled each time up to it (powers of two: the sums
    # are exact).
    first, cap = 1 / 128, 1 / 16
    before = probe_threads()
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock,
                         first_retry=first, max_retry=cap)
    try:
        health.failed(redis.ConnectionError("refused"))
        pauses = [first] * 8 + [2 * first, 4 * first, cap, cap]
        times = probes_on_schedule(health, clock, probe, pauses)
        expected, at = [], 1000.0
        for pause in pauses:
            at += pause
            expected.append(at)
        assert times == pytest.approx(expected, abs=1e-9)
        assert not health.up and not health.available()
    finally:
        health.close()
    assert ended(before)


def test_the_default_backoff_is_a_quarter_second_then_doubled_after_five() -> None:
    assert (RedisHealth.FIRST_RETRY, RedisHealth.MAX_RETRY) == (0.25, 5.0)
    clock = FakeClock(start=50.0)
    probe = FakeProbe(clock)
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        health.failed(redis.ConnectionError("refused"))
        times = probes_on_schedule(health, clock, probe, [0.25] * 20 + [0.5, 1.0])
        assert times[:2] == pytest.approx([50.25, 50.5], abs=1e-9)
        assert times[-3:] == pytest.approx([55.0, 55.5, 56.5], abs=1e-9)
    finally:
        health.close()


def test_the_first_successful_probe_marks_redis_up_and_ends_the_thread(
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    health, probe, before = stepping_health(fail=2, url="redis://:pw@h:1/0", max_retry=0.5)
    probed_until_up(health, before)
    assert health.available()
    assert probe.calls() == 3  # two failures, then the success: no probe after it
    assert ended(before)
    back = warnings_about_redis(reachlimit_log, "answers again")
    assert len(back) == 1 and "redis://:***@h:1/0" in back[0]
    assert len(warnings_about_redis(reachlimit_log, "is unavailable")) == 1
    assert health.figures()["outages"] == 1
    health.close()


def test_the_before_up_hooks_run_before_redis_is_marked_up(
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    # What a process must tell Redis first (the fallback's builds still running) is told
    # while every other caller still sees Redis down; a hook failing with a Redis error is
    # a failed probe, any other error is logged and does not keep Redis down.
    health, probe, before = stepping_health(max_retry=0.5)
    seen: list[tuple[str, bool]] = []
    hook_fails = [redis.ConnectionError("refused (a hook)")]

    def tells_redis() -> None:
        seen.append(("tells", health.up))
        if hook_fails:
            raise hook_fails.pop()

    def has_a_bug() -> None:
        seen.append(("bug", health.up))
        raise KeyError("a bug of the hook's own")

    health.before_up(tells_redis)
    health.before_up(has_a_bug)
    try:
        probed_until_up(health, before)
        # Two probes succeeded: the first one's hook failed (so did not mark Redis up, and
        # the second hook was not run), the second's hooks ran, both while still down.
        assert probe.calls() == 2
        assert seen == [("tells", False), ("tells", False), ("bug", False)]
        assert health.failures == 2  # the outage's failure and the hook's
        assert any("a hook run as Redis" in r.getMessage() and r.exc_info
                   for r in reachlimit_log.records)
    finally:
        health.close()


def test_a_call_that_worked_while_down_leaves_marking_up_to_the_probe_and_its_hooks() -> None:
    # A call that read the failures just after another failed, and then worked (Redis had
    # resumed): with before_up hooks, it does not mark Redis up itself - the hooks would be
    # skipped (a recovery's reservations, the fallback's builds) - but sends the probe now,
    # which runs them and marks it up. Without hooks a call still marks it up at once.
    health, probe, before = stepping_health(max_retry=0.5)
    told = threading.Event()
    health.before_up(told.set)
    release = threading.Event()
    probe.hold = release  # the probe thread waits here until the test lets it go
    try:
        health.failed(redis.ConnectionError("refused"))
        since = health.failures  # read after the failure, as a call that began just then
        health.succeeded(since)
        assert not health.up and not told.is_set()  # not marked up by the call
        release.set()
        thread = the_probe_thread(before)
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive() and health.up and told.is_set()
    finally:
        health.close()
    bare, bare_probe, _ = stepping_health(max_retry=0.5)
    bare_probe.hold = threading.Event()  # its probe held: only the call can mark it up
    try:
        bare.failed(redis.ConnectionError("refused"))
        bare.succeeded(bare.failures)
        assert bare.up
    finally:
        bare_probe.hold.set()
        bare.close()


def test_a_probe_that_waited_out_its_timeout_is_followed_at_once() -> None:
    # A Redis that hangs (paused, overloaded): each probe takes its whole timeout (here the
    # fake clock moves 0.6 s during it, more than the 0.25 s pause before it), so the next
    # goes at once and a probe is always waiting when Redis answers again; one that fails
    # at once (refused) is still followed after the pause.
    clock = FakeClock(start=0.0)
    times: list[float] = []
    hangs = [True, True, False, True]  # hang, hang, refused at once, hang (then answer)

    def probe() -> None:
        times.append(clock.now)
        if len(times) > len(hangs):
            return  # Redis answers
        if hangs[len(times) - 1]:
            clock.advance(0.6)
            raise redis.TimeoutError("timed out (fake)")
        raise redis.ConnectionError("refused (fake)")

    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        health.failed(redis.ConnectionError("refused"))
        clock.now = 0.25  # the first probe is due
        wait_until("the refused probe", lambda: len(times) == 3)
        assert times == pytest.approx([0.25, 0.85, 1.45])  # no pause after a hang
        clock.now = 1.45 + 0.24  # after the refused one, the pause again
        reads = clock.calls
        wait_until("the thread reading the clock short of the pause",
                   lambda: clock.calls >= reads + 2)
        assert len(times) == 3
        clock.now = 1.70
        wait_until("Redis marked up", lambda: health.up)
        assert times == pytest.approx([0.25, 0.85, 1.45, 1.70, 2.30])
    finally:
        health.close()


def test_a_long_outage_of_a_redis_that_hangs_is_probed_on_the_backoff() -> None:
    # Past the outage's first max_retry seconds, a probe that hung is followed after the
    # doubled pause, not at once: a Redis that hangs for minutes is not probed without rest.
    clock = FakeClock(start=0.0)
    times: list[float] = []

    def probe() -> None:
        times.append(clock.now)
        if len(times) < 3:
            clock.advance(0.6)
            raise redis.TimeoutError("timed out (fake)")

    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        health.failed(redis.ConnectionError("refused"))
        clock.now = 5.0  # the outage's first 5 s have passed: this probe is due
        wait_until("the first probe failed", lambda: health.failures == 2)
        clock.now = 5.6 + 0.49  # it hung 0.6 s: the next after a pause of 0.5 s, not now
        reads = clock.calls
        wait_until("the thread reading the clock short of the pause",
                   lambda: clock.calls >= reads + 2)
        assert times == [5.0]
        clock.now = 6.1
        wait_until("the second probe", lambda: len(times) == 2)
        assert times == pytest.approx([5.0, 6.1])
    finally:
        health.close()


def test_a_call_that_timed_out_is_followed_by_a_probe_at_once() -> None:
    # The failure that marks Redis down waited out its timeout: the first PING goes at once
    # (the clock stands still), not after the first pause; a refusal waits the pause.
    clock = FakeClock(start=0.0)
    probe = FakeProbe(clock, fail=1)
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        health.failed(redis.TimeoutError("timed out"))
        wait_until("the first probe", lambda: probe.calls() == 1)
        assert probe.times_now() == [0.0]
        wait_until("its failure recorded", lambda: health.failures == 2)
        clock.now = 0.25  # it failed at once: the pause before the next
        wait_until("Redis marked up", lambda: health.up)
        assert probe.times_now() == [0.0, 0.25]
    finally:
        health.close()
    request_probes = RedisHealth("redis://h:1/0", clock=clock)  # no thread: requests probe
    request_probes.failed(redis.TimeoutError("timed out"))
    assert not request_probes.available()  # a request does not pay that timeout again now
    clock.now = 0.5
    assert request_probes.available()


def test_a_call_that_began_before_redis_came_back_cannot_start_an_outage() -> None:
    # A call sent into the outage (to a paused Redis) that times out just as Redis answers
    # again says nothing about Redis now; one that began after does.
    health, probe, _ = stepping_health()
    try:
        straggler = health.failures  # read as the call began, while Redis was up
        health.failed(redis.ConnectionError("the outage begins"))
        wait_until("marked up by the probe", lambda: health.up)
        health.failed(redis.TimeoutError("the straggler times out"), straggler)
        assert health.up and health.figures()["outages"] == 1
        assert health.failures == 2  # recorded all the same
        after = health.failures  # a call that began once Redis was up
        health.failed(redis.TimeoutError("a new failure"), after)
        assert not health.up
    finally:
        health.close()


def test_probe_soon_brings_the_next_probe_forward_to_now() -> None:
    # A members' announce that works says Redis answers: the probe thread, waiting out a
    # backoff of a minute, probes at once (and marks Redis up).
    clock = FakeClock()  # stands still: the backoff never passes by itself
    probe = FakeProbe(clock)
    probe.fail = 0
    before = probe_threads()
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock,
                         first_retry=60.0, max_retry=60.0)
    try:
        health.probe_soon()  # up: nothing to do, no thread
        assert probe_threads(before) == []
        health.failed(redis.ConnectionError("refused"))
        assert the_probe_thread(before).is_alive()
        assert probe.calls() == 0 and not health.up  # a minute to go, on a clock that stands
        health.probe_soon()
        wait_until("Redis marked up by a probe at once", lambda: health.up)
        assert probe.calls() == 1
    finally:
        health.close()


def test_available_is_false_for_every_caller_while_down(threads: ThreadRunner) -> None:
    clock = FakeClock(step=10.0)  # the backoff has always passed: request probes would go
    probe = FakeProbe(clock, fail=1)
    probe.hold.clear()  # the thread's probe is held in flight
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    try:
        health.failed(redis.ConnectionError("refused"))
        assert probe.entered.wait(JOIN_TIMEOUT)
        answers: list[bool] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def ask() -> None:
            start.wait(JOIN_TIMEOUT)
            mine = [health.available() for _ in range(200)]
            with lock:
                answers.extend(mine)

        for _ in range(8):
            threads.start(ask)
        threads.join_all()
        assert len(answers) == 1600 and not any(answers)  # not one request probe
        probe.hold.set()  # the held probe fails, the next one succeeds
        wait_until("Redis up", lambda: health.up)
        assert all(health.available() for _ in range(100))
        assert probe.calls() == 2
    finally:
        probe.hold.set()
        health.close()


def test_close_stops_the_thread_and_none_starts_again() -> None:
    clock = FakeClock()  # frozen: the first probe is never due
    probe = FakeProbe(clock)
    before = probe_threads()
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock)
    health.failed(redis.ConnectionError("refused"))
    thread = the_probe_thread(before)
    assert thread.is_alive()
    closed_at = time.monotonic()
    health.close()
    assert not thread.is_alive()
    print(f"\nthe probe thread ended {(time.monotonic() - closed_at) * 1000:.1f} ms after close")
    assert probe.calls() == 0
    clock.advance(0.25)
    assert health.available()  # closed: a request probe, as without a client
    health.failed(redis.ConnectionError("still refused"))
    assert not health.up and ended(before) and probe.calls() == 0
    health.close()  # twice is fine


def test_a_failure_before_any_call_worked_after_a_probe_is_the_same_outage(
    reachlimit_log: pytest.LogCaptureFixture,
) -> None:
    """A PING can work where calls fail (out of memory, a cluster down): the outage goes on,
    with the backoff doubled, instead of a new one at 0.25 s every time."""
    clock = FakeClock(start=0.0)
    probe = FakeProbe(clock, fail=0)
    health = RedisHealth("redis://h:1/0", probe=probe, clock=clock,
                         first_retry=0.01, max_retry=0.08)
    try:
        health.failed(redis.ConnectionError("refused"))
        clock.now = 0.01
        wait_until("up on the probe's word", lambda: health.up)
        health.failed(redis.ResponseError("OOM command not allowed"))  # the first call fails
        assert health.figures()["outages"] == 1  # the same outage
        assert len(warnings_about_redis(reachlimit_log, "failed again")) == 1
        clock.now = 0.01 + 0.01  # the pause was doubled: not due yet
        reads = clock.calls
        wait_until("the thread reading the clock", lambda: clock.calls >= reads + 2,
                   interval=0.0005)
        assert probe.calls() == 1
        clock.now = 0.01 + 0.02
        wait_until("up again", lambda: health.up)
        assert probe.times_now() == pytest.approx([0.01, 0.03])
        health.succeeded(health.failures)  # a call works: the probe's word was good
        health.failed(redis.ConnectionError("reset"))  # a new outage now
        assert health.figures()["outages"] == 2
        assert len(warnings_about_redis(reachlimit_log, "is unavailable")) == 2
        clock.now = 0.03 + 0.01  # its backoff begins again at the first pause
        wait_until("the new outage's first probe", lambda: probe.calls() == 3)
        assert probe.times_now()[-1] == pytest.approx(0.04)
    finally:
        health.close()


def test_each_outage_gets_a_thread_of_its_own() -> None:
    health, probe, before = stepping_health()
    try:
        seen = []
        for n in range(3):
            health.failed(redis.ConnectionError(f"outage {n}"))
            thread = the_probe_thread(before)
            seen.append(thread)
            thread.join(JOIN_TIMEOUT)
            assert not thread.is_alive() and health.up
            health.succeeded(health.failures)
        assert len(set(map(id, seen))) == 3 and probe.calls() == 3
    finally:
        health.close()


def test_a_forked_child_starts_its_own_probe_thread() -> None:
    parent = os.getpid()

    def probe() -> None:
        if os.getpid() == parent:
            raise redis.ConnectionError("refused, in the parent")  # the parent stays down

    before = probe_threads()
    health = RedisHealth("redis://h:1/0", probe=probe, first_retry=0.01, max_retry=0.02)
    health.failed(redis.ConnectionError("refused"))
    assert the_probe_thread(before).is_alive()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        code = 1
        try:
            inherited = len(probe_threads())  # the parent's thread is not in the child
            answered = health.available()  # down: the fallback, and a thread started
            deadline = time.monotonic() + JOIN_TIMEOUT
            while not health.up and time.monotonic() < deadline:
                time.sleep(0.001)
            os.write(write, f"{inherited} {answered} {health.up}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            ready, _, _ = select.select([pipe], [], [], DEADLINE)
            report = pipe.read().decode() if ready else "the child never reported"
        wait_until("the child to exit", lambda: os.waitpid(pid, os.WNOHANG)[0] == pid)
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        health.close()
    assert report == "0 False True", report  # the child's own thread found Redis up
    assert not health.up  # the parent's view is its own


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="a client or a probe, not both"):
        RedisHealth("redis://h:1/0", client=connect("redis://h:1/0"), probe=lambda: None)
    with pytest.raises(TypeError, match="probe must be a callable"):
        RedisHealth(probe=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="client must be a redis.Redis"):
        RedisHealth(client="redis://h:1/0")  # type: ignore[arg-type]


# -- a real redis-server ---------------------------------------------------------------------


@pytest.fixture(name="stacks")
def stacks_fixture() -> Iterator[Callable[..., Stack]]:
    made: list[Stack] = []

    def make(url: str, **figures: Any) -> Stack:
        made.append(Stack(url, **figures))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_limiter_whose_redis_came_back_is_on_redis_without_any_acquire(
    live_redis: RedisServer, stacks: Callable[..., Stack], reachlimit_log: pytest.LogCaptureFixture
) -> None:
    before = probe_threads()
    s = stacks(live_redis.url(), active=2)
    s.limiter.acquire().release()
    port = live_redis.port
    live_redis.stop()
    s.limiter.acquire().release()  # noticed: the fallback's
    assert not s.health.up and s.local.stats().acquired == 1
    assert s.limiter.stats().backend == "local"
    live_redis.start(port=port, attempts=1)  # empty, on the same port
    wait_until("the health up again, with no call made", lambda: s.health.up)
    assert s.limiter.stats().backend == "redis"
    # The probe thread logs it just after it marks Redis up (outside the health's lock).
    wait_until("Redis back, logged",
               lambda: warnings_about_redis(reachlimit_log, "answers again") != [])
    assert len(warnings_about_redis(reachlimit_log, "answers again")) == 1
    wait_until("the probe thread ended", lambda: ended(before))
    for _ in range(5):  # every acquire from now on is Redis's
        s.limiter.acquire().release()
    assert s.local.stats().acquired == 1 and s.remote.stats().acquired == 5


def test_no_call_while_down_touches_a_redis_that_hangs(
    live_redis: RedisServer, stacks: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that hangs (SIGSTOP): only the call that noticed paid the socket timeout; the
    calls after it never ask Redis (no request probe), whatever the backoff; the thread's
    probes do."""
    s = stacks(live_redis.url(), active=4)
    s.limiter.acquire().release()
    asked_by: list[str] = []
    # Counted where every command takes its connection (as in test_redis_fallback_cache).
    pool = s.client.connection_pool
    real = pool.get_connection

    def counting(*args: Any, **options: Any) -> Any:
        asked_by.append(threading.current_thread().name)
        return real(*args, **options)

    monkeypatch.setattr(pool, "get_connection", counting)
    os.kill(live_redis.pid, signal.SIGSTOP)
    try:
        s.limiter.acquire().release()  # times out: noticed
        assert not s.health.up
        wait_until("two of the thread's probes timed out", lambda: s.health.failures >= 3,
                   interval=0.01)
        asked_by.clear()
        spans = []
        for _ in range(20):
            began = time.monotonic()
            s.limiter.acquire().release()
            assert s.limiter.stats().degraded
            spans.append(time.monotonic() - began)
        me = threading.current_thread().name
        assert me not in asked_by, asked_by  # only the probe thread asked Redis meanwhile
        assert s.local.stats().acquired == 21
    finally:
        os.kill(live_redis.pid, signal.SIGCONT)
    wait_until("back on Redis", lambda: s.health.up)
    print(f"\nacquires while Redis hung: the slowest took {max(spans) * 1000:.1f} ms; "
          f"Redis asked by {sorted(set(asked_by))}")


def test_a_cluster_node_stopped_and_started_again_is_noticed_by_the_probe(
    redis_cluster: RedisCluster,
) -> None:
    client = connect(redis_cluster.url())
    health = RedisHealth(redis_cluster.url(), client=client)
    lim = RedisColdLimiter(client, "probe-cluster", 2, 1)
    shared = ResilientLimiter(lim, ColdLimiter(2, 1), health)
    node = redis_cluster.owner(lim.keys[0])
    try:
        shared.acquire().release()
        port = node.port
        node.stop()
        shared.acquire().release()  # the limiter's node is gone: the fallback's
        assert not health.up
        # Every primary is PINGed: the other nodes answer, yet Redis stays down.
        wait_until("two probes failed", lambda: health.failures >= 3, interval=0.01)
        assert not health.up
        node.start(port=port, attempts=1)
        redis_cluster.wait_ok()
        wait_until("the health up again, with no call made", lambda: health.up)
        assert shared.stats().backend == "redis"
        shared.acquire().release()
        assert lim.stats().acquired == 1  # the restarted node's fresh count
    finally:
        health.close()
        lim.close()
        client.close()


def test_the_extensions_close_stops_the_probe_thread(
    redis_app: Flask, live_redis: RedisServer
) -> None:
    client = redis_app.test_client()
    assert client.get("/report/a").status_code == 200
    before = probe_threads()
    live_redis.stop()
    assert client.get("/report/b").status_code == 200  # the fallback's
    health = redis_app.extensions["reachlimit"].redis
    assert isinstance(health, RedisHealth) and not health.up
    thread = the_probe_thread(before)
    assert thread.is_alive()
    ReachLimit().close(redis_app)
    assert not thread.is_alive() and health.closed


# -- real gunicorn: the sequence that over-admitted ------------------------------------------

#: The budget of the servers below (the extension's defaults): builds at once, queue places.
ACTIVE, QUEUE = 2, 8
BUILD_SECONDS = 0.3
#: A line of the shipped gunicorn config's log format that says Redis is back, and who says.
BACK_LINE = re.compile(r"\[pid (\d+)\] reachlimit: reachlimit: Redis at \S+ answers again")


def every_worker(servers: list[GunicornServer], ok: Callable[[dict[str, Any]], bool],
                 what: str) -> set[int]:
    """Ask each server's /debug/health until each of its workers has answered with figures
    that pass ``ok`` (the workers it answered with otherwise are asked again)."""
    pids: set[int] = set()
    for server in servers:
        mine: set[int] = set()

        def all_of_its_workers(server: GunicornServer = server, mine: set[int] = mine) -> bool:
            reply = server.get("/debug/health")
            assert reply.status == 200, reply
            body = reply.json()
            if ok(body["reach"]):
                mine.add(body["pid"])
            return mine >= set(server.worker_pids()) and len(mine) >= server.workers

        wait_until(f"every worker of {server.name} {what}", all_of_its_workers, interval=0.002)
        pids |= mine
    return pids


def said_back(servers: list[GunicornServer]) -> set[int]:
    """The workers whose log says Redis answers again."""
    return {int(m.group(1)) for s in servers for m in BACK_LINE.finditer(s.stderr())}


@pytest.mark.gunicorn
def test_a_worker_idle_through_an_outage_admits_nothing_beside_redis_after_it(
    tmp_path: Path, gate: Gate, live_redis: RedisServer
) -> None:
    env = {"REACHLIMIT_REDIS_PREFIX": "recovery", "REACHLIMIT_WAIT": "30",
           "BUILD_SECONDS": str(BUILD_SECONDS)}
    servers = [build_log_server(tmp_path, name, gate, live_redis.url(), env) for name in "ab"]
    with serving(servers[0]), serving(servers[1]):
        workers = every_worker(servers, lambda f: f["backend"] == "redis", "on Redis")
        assert len(workers) == 4
        port = live_redis.port
        os.kill(live_redis.pid, signal.SIGKILL)
        live_redis.stop()  # reaped
        # Each worker notices (its /debug/health reads the figures from Redis, which fails),
        # then serves nothing more until Redis is back: no build runs during the outage.
        assert every_worker(servers, lambda f: f["degraded"], "degraded") == workers
        assert said_back(servers) == set()
        live_redis.start(port=port, attempts=1)  # same port, same directory, empty
        wait_until("every worker's log saying Redis answers again",
                   lambda: said_back(servers) >= workers, interval=0.05)
        assert at_once_along(gate.dir) == []  # nothing was built before the burst

        paths = [f"/report/after-{n}" for n in range(40)]
        herds = [Herd(servers[0].port, paths[0::2]), Herd(servers[1].port, paths[1::2])]
        replies = [r for h in herds for r in h.results()]
        statuses = Counter(r.status for r in replies if isinstance(r, Reply))
        print(f"\nstatuses after the recovery: {dict(statuses)}")
        assert set(statuses) <= {200, 429} and sum(statuses.values()) == 40, statuses
        for reply in replies:
            if reply.status == 429:
                check_refusal(reply)
        counts = at_once_along(gate.dir)
        print(f"builds at once along the build log: most {max(counts)} (active {ACTIVE})")
        assert len(counts) == 2 * statuses[200]  # every 200 is one build, started and ended
        assert max(counts) <= ACTIVE, counts  # the fallback admitted nothing beside Redis
        assert statuses[200] >= ACTIVE
        # And every worker is on Redis, with the service's figures.
        every_worker(servers, lambda f: f["backend"] == "redis" and not f["degraded"],
                     "back on Redis")
