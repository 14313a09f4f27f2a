"""Same-key singleflight: concurrent calls for one key share one computation.

design:

    do(key, fn, cancel)
      lock held: look up the key's in-flight call
        none  -> register a new call; we are its leader
        found -> we are a follower of that call; the first follower gives it its Event
      leader:   run fn() with no lock held; forget the key (only if it is still this
                call's); if the call has an Event, record fn's value or exception, set it
      follower: wait on the call's Event (in short slices when a cancel object is given),
                then return the same value or raise the same exception

One ``threading.Lock`` guards ``_calls`` and each call's ``done`` and ``followers``. A call
gets its ``threading.Event`` only when a follower arrives: most calls never have one, and an
Event (a Condition and a Lock) is the largest part of a lone leader's cost. The leader reads
``done`` under the lock in the same step that forgets the key, so a follower either joined
before that step (and its Event is set) or finds no call. The Event is set exactly once,
after the outcome is recorded; followers read the outcome only after it is set, so they never
need the lock for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ._cancel import POLL_INTERVAL, CancelToken
from ._errors import Cancelled

__all__ = ["SingleFlight"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One in-flight computation. ``value`` and ``error`` are written by its leader before
    ``done`` is set and read by followers only after."""

    __slots__ = ("done", "value", "error", "followers")

    def __init__(self) -> None:
        self.done: threading.Event | None = None  # guarded by SingleFlight._lock
        self.value: T | None = None
        self.error: BaseException | None = None
        self.followers = 0  # guarded by SingleFlight._lock


class SingleFlight(Generic[T]):
    """Collapse concurrent calls for one key into one call of ``fn``."""

    #: Longest single wait of a follower that watches a cancel token; an instance attribute
    #: of the same name overrides it.
    CANCEL_POLL_INTERVAL = POLL_INTERVAL

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[T]] = {}  # guarded by _lock

    def do(
        self, key: Hashable, fn: Callable[[], T], cancel: CancelToken | None = None
    ) -> tuple[T, bool]:
        """Run ``fn`` once for all concurrent callers of ``key``.

        Returns ``(value, shared)``: ``shared`` is False for the leader (the caller that ran
        ``fn``) and True for a follower. If ``fn`` raises, the leader and every follower
        raise that same exception. A follower whose ``cancel`` is set while it waits raises
        ``Cancelled`` and leaves the leader running.
        """
        # The lock is taken explicitly, and the leader's part is written out here rather
        # than in a method of its own: every cold request leads a call, a refused one too.
        lock = self._lock
        lock.acquire()
        try:
            call = self._calls.get(key)
            if call is None:
                call = self._calls[key] = _Call()
                done = None  # we lead
            else:
                call.followers += 1
                done = call.done
                if done is None:
                    done = call.done = threading.Event()
        finally:
            lock.release()
        if done is None:
            try:
                value = fn()
            except BaseException as exc:
                self._publish(key, call, None, exc)
                raise
            self._publish(key, call, value, None)
            return value, False
        self._follow(done, cancel, self.CANCEL_POLL_INTERVAL)
        if call.error is not None:
            raise call.error
        return call.value, True  # type: ignore[return-value]  # set before done

    def in_flight(self) -> int:
        """Racy read: how many keys have a computation running."""
        return len(self._calls)

    def _publish(
        self, key: Hashable, call: _Call[T], value: T | None, error: BaseException | None
    ) -> None:
        """Forget the key (only if it is still this call's), then hand the outcome to the
        followers, if any came. A call nobody followed keeps no outcome: its leader's
        exception would otherwise hold the call through its traceback, a reference cycle
        that only the garbage collector could free (one per refused leader)."""
        lock = self._lock
        lock.acquire()
        try:
            if self._calls.get(key) is call:
                del self._calls[key]
            done = call.done
        finally:
            lock.release()
        if done is not None:
            call.value, call.error = value, error
            done.set()

    @staticmethod
    def _follow(done: threading.Event, cancel: CancelToken | None, slice_s: float) -> None:
        if cancel is None:
            done.wait()
            return
        while not done.wait(slice_s):
            if cancel.is_set():
                raise Cancelled()
