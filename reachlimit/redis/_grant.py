"""``RedisGrant``: one build slot of a :class:`~reachlimit.redis.RedisColdLimiter`."""

from __future__ import annotations

from typing import Protocol

from .._limiter import Grant

__all__ = ["RedisGrant"]


class _Owner(Protocol):
    """What a grant needs of its limiter (a RedisColdLimiter)."""

    def _give_back(self, grant: RedisGrant, strict: bool) -> None: ...


class RedisGrant(Grant):
    """One build slot of a :class:`RedisColdLimiter`, held as a renewed lease.

    Same use as :class:`~reachlimit.Grant`: leaving the ``with`` block releases it;
    ``release()`` releases it early; a second ``release()`` raises ``RuntimeError``. The
    slot it frees is only ever its own: after a lost lease the release changes nothing.
    """

    __slots__ = ("_owner", "token", "_lost", "timed")

    def __init__(self, owner: _Owner, token: str, timed: bool = False) -> None:
        self._owner = owner
        self.token = token
        self._held = True  # guarded by owner._lock
        self._lost = False  # set (once) by the renewer or the release; racy read
        #: A waiter was promoted to it: Redis times it, and its release says so.
        self.timed = timed

    @property
    def lease_lost(self) -> bool:
        """Racy read: whether this grant is known to have lost its lease."""
        return self._lost

    def _give_back(self, strict: bool) -> None:
        self._owner._give_back(self, strict)

    def _mark_lost(self) -> None:
        """The renewer found this grant's lease gone (under the owner's lock)."""
        self._lost = True
