"""Tests of SingleFlight: one call per in-flight key, its outcome shared."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Cancelled, SingleFlight
from tests.support.threads import (
    HeldCall,
    Outcome,
    ThreadRunner,
    leader_and_followers,
    start_call,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Call(Outcome):
    """What one ``flight.do`` call running in a thread returned (``value`` and ``shared``, the
    pair ``do`` returns) or raised (``error``)."""

    shared: bool | None = None


def start_do(
    threads: ThreadRunner,
    flight: SingleFlight[Any],
    key: Any,
    fn: Callable[[], Any],
    cancel: Any = None,
    name: str = "caller",
    before: Callable[[], Any] | None = None,
) -> Call:
    """``flight.do(key, fn, cancel)`` in a thread of ``threads``; ``before()`` runs first."""

    def unpack(call: Call) -> None:
        call.value, call.shared = call.value

    return start_call(
        threads,
        lambda: flight.do(key, fn, cancel),
        name=name,
        outcome=Call(name),
        before=before,
        then=unpack,
    )


def followers_of(flight: SingleFlight[Any], key: Any) -> int:
    """White box: how many followers have joined the key's in-flight call."""
    with flight._lock:
        call = flight._calls.get(key)
        return -1 if call is None else call.followers


def test_single_caller_runs_fn_and_is_not_shared() -> None:
    flight: SingleFlight[int] = SingleFlight()
    assert flight.do("k", lambda: 42) == (42, False)
    assert flight.in_flight() == 0


@pytest.mark.parametrize("followers", [1, 7])
def test_concurrent_callers_share_one_call(threads: Any, followers: int) -> None:
    flight: SingleFlight[Any] = SingleFlight()
    result = object()
    fn = HeldCall(result)
    leader = start_do(threads, flight, "key", fn, name="leader")
    assert fn.started.wait(5.0)
    # All followers arrive at once while the leader is held inside fn.
    barrier = threading.Barrier(followers, timeout=5.0)

    def follower_fn() -> Any:
        raise AssertionError("a follower ran fn")

    outcomes = [
        start_do(threads, flight, "key", follower_fn, name=f"follower-{i}", before=barrier.wait)
        for i in range(followers)
    ]
    wait_until("followers joined", lambda: followers_of(flight, "key") == followers)
    assert not any(o.done.is_set() for o in outcomes)  # really waiting on the leader
    assert not leader.done.is_set()
    fn.finish.set()
    threads.join_all()
    assert fn.runs == 1
    assert (leader.value, leader.shared, leader.error) == (result, False, None)
    for o in outcomes:
        assert o.error is None
        assert o.value is result and o.shared is True
    assert flight.in_flight() == 0


def test_exception_is_shared_by_leader_and_followers(threads: Any) -> None:
    flight: SingleFlight[Any] = SingleFlight()
    error = LookupError("database down")
    fn = HeldCall(error=error)
    leader, followers = leader_and_followers(
        lambda name: start_do(threads, flight, "key", fn, name=name), fn.started, 3,
        lambda: followers_of(flight, "key"),
    )
    fn.finish.set()
    threads.join_all()
    assert fn.runs == 1
    assert leader.error is error
    assert all(f.error is error for f in followers)
    assert flight.in_flight() == 0


def test_key_is_forgotten_after_the_call() -> None:
    flight: SingleFlight[int] = SingleFlight()
    runs = []

    def fn() -> int:
        runs.append(1)
        return len(runs)

    assert flight.do("k", fn) == (1, False)
    assert flight.do("k", fn) == (2, False)  # a later call runs fn again
    with pytest.raises(ZeroDivisionError):
        flight.do("k", lambda: 1 // 0)
    assert flight.in_flight() == 0  # forgotten after an error too
    assert flight.do("k", fn) == (3, False)


def test_distinct_keys_do_not_share(threads: Any) -> None:
    flight: SingleFlight[Any] = SingleFlight()
    a, b = HeldCall("a"), HeldCall("b")
    first = start_do(threads, flight, "a", a)
    second = start_do(threads, flight, "b", b)
    assert a.started.wait(5.0) and b.started.wait(5.0)  # both ran at once
    assert flight.in_flight() == 2
    a.finish.set()
    b.finish.set()
    threads.join_all()
    assert (first.value, first.shared, second.value, second.shared) == ("a", False, "b", False)


def test_key_deleted_only_if_still_this_calls() -> None:
    """If the key was re-registered by another call while ``fn`` ran, the leader's cleanup
    must leave the newer registration alone."""
    flight: SingleFlight[Any] = SingleFlight()
    newer = object()

    def fn() -> str:
        with flight._lock:
            flight._calls["k"] = newer  # type: ignore[assignment]
        return "done"

    assert flight.do("k", fn) == ("done", False)
    assert flight._calls.get("k") is newer


def test_follower_cancel_raises_cancelled_while_leader_continues(threads: Any) -> None:
    flight: SingleFlight[Any] = SingleFlight()
    fn = HeldCall("value")
    leader = start_do(threads, flight, "key", fn, name="leader")
    assert fn.started.wait(5.0)
    cancel = threading.Event()
    quitter = start_do(threads, flight, "key", fn, cancel=cancel, name="quitter")
    stayer = start_do(threads, flight, "key", fn, cancel=threading.Event(), name="stayer")
    wait_until("2 followers", lambda: followers_of(flight, "key") == 2)
    assert not quitter.done.is_set()
    cancel.set()
    assert quitter.done.wait(5.0)
    assert isinstance(quitter.error, Cancelled)
    assert not leader.done.is_set() and not stayer.done.is_set()
    assert flight.in_flight() == 1  # the call is still running
    fn.finish.set()
    threads.join_all()
    assert fn.runs == 1
    assert (leader.value, leader.shared) == ("value", False)
    assert (stayer.value, stayer.shared, stayer.error) == ("value", True, None)


def test_base_exception_from_fn_is_shared_and_key_forgotten(threads: Any) -> None:
    class Abort(BaseException):
        pass

    flight: SingleFlight[Any] = SingleFlight()
    abort = Abort()
    fn = HeldCall(error=abort)
    leader = start_do(threads, flight, "key", fn)
    assert fn.started.wait(5.0)
    follower = start_do(threads, flight, "key", fn)
    wait_until("1 followers", lambda: followers_of(flight, "key") == 1)
    fn.finish.set()
    threads.join_all()
    assert leader.error is abort and follower.error is abort
    assert flight.in_flight() == 0
