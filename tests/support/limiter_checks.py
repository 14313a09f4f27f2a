"""The limiter's key properties, each written once as a check that takes a limiter factory.

The normal tests run them against ``ColdLimiter``; ``tests/test_limiter_mutants.py`` runs
them against limiters broken on purpose and shows that each check then fails, and fails for
the reason it names. ``tests/test_redis_mutants.py`` does the same for ``RedisColdLimiter``
(a factory that makes one on a fresh name, and mutants whose Lua scripts forget a place):
the checks only use the public ``acquire``/``stats`` and :func:`places_taken`, which reads
the queue where each limiter keeps it (the gate of a ``ColdLimiter``, the queue ZSET in
Redis).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, Grant
from tests.support.clock import FakeClock
from tests.support.limiter import (
    Attempt,
    ProbeCancel,
    gate_size,
    start_acquire,
    try_acquire_now,
)
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until

MakeLimiter = Callable[..., ColdLimiter]


def places_taken(lim: Any) -> int:
    """Queue places taken right now: the gate of a ``ColdLimiter`` (read under its lock), or
    the queue ZSET of a ``RedisColdLimiter``, read from Redis itself."""
    if isinstance(lim, ColdLimiter):
        return gate_size(lim)
    return int(lim._client.zcard(lim.keys[1]))


def check_queue_bound(make_limiter: MakeLimiter, threads: ThreadRunner) -> None:
    """2 active grants + 8 admitted waiters: the 11th caller is refused at once with
    ``queue_full``, and never more than 8 callers are admitted."""
    lim = make_limiter(active=2, queue=8, clock=FakeClock())
    holders = [lim.acquire(), lim.acquire()]
    cancels: list[threading.Event] = []
    try:
        for i in range(8):
            cancel = threading.Event()
            cancels.append(cancel)
            start_acquire(threads, lim, cancel, name=f"waiter-{i}")
            wait_until(f"waiter {i} queued", lambda i=i: lim.stats().queued == i + 1)
        probe = ProbeCancel()  # cannot block, even in a limiter that admits it
        try:
            grant = lim.acquire(probe)
        except (Busy, Cancelled) as exc:
            outcome: Any = exc
        else:
            grant.release()
            outcome = grant
        s = lim.stats()
        assert s.peak_queued <= 8 and s.queued <= 8, (
            f"queue bound broken: {s.peak_queued} callers admitted with queue=8"
        )
        assert isinstance(outcome, Busy) and outcome.reason == "queue_full", (
            f"queue bound broken: the 11th caller got {outcome!r}, not Busy(queue_full)"
        )
        assert probe.calls == 1, "the refusal looked at the cancel object again"
    finally:
        for cancel in cancels:
            cancel.set()
        threads.join_all()
        for grant in holders:
            grant.release()


def check_gate_place_returned_after_timeout(
    make_limiter: MakeLimiter, threads: ThreadRunner
) -> None:
    """queue=1: a waiter that times out gives its gate place back; the next caller is admitted
    (and times out too, rather than being refused with ``queue_full``)."""
    # Each clock read moves 10 s on: the first read fixes the deadline, the next is past it.
    lim = make_limiter(active=1, queue=1, wait=1.0, clock=FakeClock(step=10.0))
    holder = lim.acquire()
    try:
        for attempt in range(3):
            with pytest.raises(Busy) as info:
                lim.acquire()
            assert info.value.reason == "timeout", (
                f"gate place not returned after timeout: attempt {attempt} got "
                f"{info.value.reason!r} instead of being admitted"
            )
            assert places_taken(lim) == 0, "gate place not returned after timeout (qsize != 0)"
            assert lim.stats().queued == 0
        assert lim.stats().rejected_timeout == 3
    finally:
        holder.release()


def admit_a_waiter(
    threads: ThreadRunner,
    lim: ColdLimiter,
    cancels: list[threading.Event],
    attempt: int,
    after: str,
) -> Attempt:
    """A waiter with its own cancel Event (added to ``cancels``, for the caller to set at the
    end), checked to be admitted and waiting: a refusal means the previous ``after`` kept its
    gate place, and fails with that message."""
    cancel = threading.Event()
    cancels.append(cancel)
    waiter = start_acquire(threads, lim, cancel, name=f"waiter-{attempt}")
    wait_until("waiter refused or queued", lambda: waiter.done.is_set() or lim.stats().queued == 1)
    assert not waiter.done.is_set(), (
        f"gate place not returned after {after}: attempt {attempt} got {waiter.error!r}"
        " instead of being admitted"
    )
    return waiter


def check_gate_place_returned_after_cancel(
    make_limiter: MakeLimiter, threads: ThreadRunner
) -> None:
    """queue=1: a waiter cancelled while it waits gives its gate place back; the next caller
    is admitted and really waits."""
    lim = make_limiter(active=1, queue=1, clock=FakeClock())
    holder = lim.acquire()
    cancels: list[threading.Event] = []
    try:
        for attempt in range(3):
            waiter = admit_a_waiter(threads, lim, cancels, attempt, "cancel")
            cancels[-1].set()
            waiter.wait_done()
            assert isinstance(waiter.error, Cancelled)
            assert places_taken(lim) == 0, "gate place not returned after cancel (qsize != 0)"
            assert lim.stats().queued == 0
        assert lim.stats().cancelled == 3
    finally:
        for cancel in cancels:
            cancel.set()
        threads.join_all()
        holder.release()


def check_gate_place_returned_after_promotion(
    make_limiter: MakeLimiter, threads: ThreadRunner
) -> None:
    """queue=1: a promoted waiter's gate place is given back at promotion; while it holds the
    slot, the next caller is admitted and really waits."""
    lim = make_limiter(active=1, queue=1, clock=FakeClock())
    holder: Grant | None = lim.acquire()
    cancels: list[threading.Event] = []
    try:
        for attempt in range(3):
            waiter = admit_a_waiter(threads, lim, cancels, attempt, "promotion")
            assert holder is not None
            holder.release()
            holder = None
            waiter.wait_done()
            assert waiter.grant is not None, f"not promoted: {waiter.error!r}"
            holder = waiter.grant
            assert places_taken(lim) == 0, "gate place not returned after promotion (qsize != 0)"
            s = lim.stats()
            assert (s.active, s.queued) == (1, 0)
    finally:
        for cancel in cancels:
            cancel.set()
        threads.join_all()
        if holder is not None:
            holder.release()


def check_slots_come_back(make_limiter: MakeLimiter, threads: ThreadRunner) -> None:
    """Every release gives its slot back: three rounds of taking every slot at once
    (``active=2``, no queue) and releasing them all."""
    lim = make_limiter(active=2, queue=0, clock=FakeClock())
    for round_ in range(3):
        taken = [g for g in (try_acquire_now(lim) for _ in range(2)) if g is not None]
        for grant in taken:
            grant.release()
        assert len(taken) == 2, (
            f"slot not returned after release: round {round_} could take {len(taken)} of 2"
        )
        held = lim.stats().active
        assert held == 0, f"slot not returned after release: {held} still held"
