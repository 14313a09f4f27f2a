"""The lease renewer: one daemon thread that keeps an owner's leases alive in Redis.

design:

    An owner (a ``RedisColdLimiter``: its grants; a ``RedisSingleFlight``: the claims of the
    flights it leads) holds its leases here, by key. One daemon thread per owner, started with
    the first lease held, wakes every ``interval`` seconds and hands every lease held to
    ``renew`` in one call, outside the lock; ``renew`` answers the keys Redis no longer
    knows, and ``on_lost`` marks those still held (under the lock: it is the owner's own
    bookkeeping, never user code). A lease is never revived: Redis decides what is still
    held.

    Idle: with nothing held the thread waits untimed until a lease is held (``hold`` notifies
    it) or ``close``. Once woken it waits a whole interval before it may go idle again, so an
    owner whose leases come and go wakes it at most once an interval, not on every hold.

    After a fork (``_daemon``): the child holds none of the leases (their holders are the
    parent's threads, and the parent renews them; a child renewing them would keep a dead
    parent's slots alive), has a new lock and no thread; its first lease held starts one.

    ``lock`` guards the leases held, the closed and idle flags and the thread; an owner may
    use it for state of its own that goes with its leases (a grant's ``held`` flag), reading
    it as ``renewer.lock`` each time (it is replaced after a fork). No Redis call is made
    under it. A renewal that fails (``redis.RedisError``) is logged, reported to
    ``on_error`` and tried again at the next interval; a lease it could not renew ends in
    Redis when its time is up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ._common import REDIS_ERRORS
from ._daemon import Daemon

__all__ = ["LeaseRenewer"]

log = logging.getLogger("reachlimit")

T = TypeVar("T")


class LeaseRenewer(Daemon, Generic[T]):
    """Renews the leases held by one owner (module design). ``what`` names them in logs."""

    def __init__(
        self,
        thread_name: str,
        interval: float,
        renew: Callable[[list[T]], Iterable[str]],
        *,
        what: str,
        on_lost: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        # The condition is notified by close, and by a lease held while the thread is idle
        # (it found nothing held: then it waits untimed).
        super().__init__(thread_name)
        self._interval = interval
        self._renew = renew
        self._what = what
        self._on_lost = on_lost
        self._on_error = on_error
        self._held: dict[str, T] = {}  # guarded by lock

    def hold(self, key: str, lease: T) -> None:
        """Renew ``lease`` from now on, until :meth:`drop`. Starts the thread if need be."""
        with self.lock:
            self.hold_locked(key, lease)

    def hold_locked(self, key: str, lease: T) -> None:
        """:meth:`hold`, for a caller that holds :attr:`lock` already."""
        self._wake_locked()
        self._held[key] = lease
        self._start_locked()

    def drop(self, key: str) -> T | None:
        """Stop renewing ``key``'s lease; the lease, or None if it was not held."""
        with self.lock:
            return self._held.pop(key, None)

    def drop_locked(self, key: str) -> T | None:
        """:meth:`drop`, for a caller that holds :attr:`lock` already."""
        return self._held.pop(key, None)

    def _after_fork(self) -> None:
        self._held = {}  # the parent's holders' leases: the parent renews them

    def _run(self) -> None:
        """The thread: every interval, renew every lease held in one call to ``renew``."""
        while True:
            with self.lock:
                if not self._next_round_locked(bool(self._held), self._interval):
                    return
                held = dict(self._held)
            if not held:
                continue
            try:
                lost = list(self._renew(list(held.values())))
            except REDIS_ERRORS as exc:
                log.warning("reachlimit: could not renew %d %s: %s", len(held), self._what, exc)
                if self._on_error is not None:
                    self._on_error(exc)
                continue
            if self._on_lost is None:
                continue
            with self.lock:
                for key in lost:
                    lease = self._held.get(key)  # released meanwhile: not lost, just gone
                    if lease is not None:
                        self._on_lost(lease)
