"""Same-key singleflight: concurrent calls for one key share one computation.

design:

    do(key, fn, cancel)
      lock held: look up the key's in-flight call
        none  -> register a new call; we are its leader
        found -> we are a follower of that call
      leader:   run fn() with no lock held; record its value or exception; forget the key
                (only if it is still this call's); set the call's Event
      follower: wait on the call's Event (in short slices when a cancel object is given),
                then return the same value or raise the same exception

One ``threading.Lock`` guards ``_calls``. Each in-flight call has one ``threading.Event``, set
exactly once, after its outcome is recorded; followers read the outcome only after the Event
is set, so they never need the lock.
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
    """One in-flight computation. Written by its leader before ``done`` is set; read by
    followers only after."""

    __slots__ = ("done", "value", "error", "followers")

    def __init__(self) -> None:
        self.done = threading.Event()
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
        with self._lock:
            call = self._calls.get(key)
            if call is None:
                call = _Call()
                self._calls[key] = call
                leader = True
            else:
                call.followers += 1
                leader = False
        if leader:
            return self._lead(key, call, fn), False
        self._follow(call, cancel, self.CANCEL_POLL_INTERVAL)
        if call.error is not None:
            raise call.error
        return call.value, True  # type: ignore[return-value]  # set before done

    def in_flight(self) -> int:
        """Racy read: how many keys have a computation running."""
        return len(self._calls)

    def _lead(self, key: Hashable, call: _Call[T], fn: Callable[[], T]) -> T:
        try:
            call.value = value = fn()
            return value
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                if self._calls.get(key) is call:
                    del self._calls[key]
            call.done.set()

    @staticmethod
    def _follow(call: _Call[T], cancel: CancelToken | None, slice_s: float) -> None:
        if cancel is None:
            call.done.wait()
            return
        while not call.done.wait(slice_s):
            if cancel.is_set():
                raise Cancelled()
