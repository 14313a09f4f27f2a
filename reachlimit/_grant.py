"""What every cold limiter shares, in-process (``reachlimit._limiter``) or on Redis
(``reachlimit.redis``): the ``Grant`` its ``acquire`` returns, the ``LimiterStats`` it reports
and the four figures it is built with (``LimiterFigures``). Standard library only;
``reachlimit._limiter`` re-exports all three.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Grant", "LimiterFigures", "LimiterStats"]


@dataclass(frozen=True, slots=True)
class LimiterStats:
    """A consistent snapshot of a :class:`ColdLimiter`, taken under its lock."""

    active: int
    queued: int
    peak_active: int
    peak_queued: int
    acquired: int
    rejected_full: int
    rejected_timeout: int
    cancelled: int
    capacity_active: int
    capacity_queue: int
    wait: float
    #: Waiters whose place a leader of a client holding fewer places took (fair admission).
    displaced: int = 0
    #: Leaders refused because their place in the queue could not start within their wait
    #: by the estimate of build time (at once, or while waiting as the estimate grew).
    deadline: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Grant:
    """One build slot, held until released: what every cold limiter's ``acquire`` returns
    (this process's, and the shared ones of ``reachlimit.redis``).

    Leaving the ``with`` block releases it, also when the body raises. ``release()`` releases
    it early; a second ``release()`` is a programming error and raises ``RuntimeError``
    without creating capacity. Leaving the block after an explicit ``release()`` does nothing.

    A limiter's grant implements ``_give_back(strict)`` (``strict``: a second release raises)
    and sets ``_held`` (guarded by its limiter's lock) or overrides ``held``.
    """

    __slots__ = ("_held",)
    _held: bool

    @property
    def held(self) -> bool:
        """Racy read: whether this grant still holds its slot."""
        return self._held

    def _mark_released(self, strict: bool) -> bool:
        """Under the limiter's lock: whether this call is the release that gives the slot
        back (it clears ``_held``); a later one is a no-op, or ``RuntimeError`` if
        ``strict``."""
        if not self._held:
            if strict:
                raise RuntimeError("grant released twice")
            return False
        self._held = False
        return True

    def release(self) -> None:
        """Give the slot back: to the next waiter if any, else to the free pool."""
        self._give_back(strict=True)

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._give_back(strict=False)  # strict is tested for truth: None is False

    def _give_back(self, strict: bool) -> None:
        raise NotImplementedError


class LimiterFigures:
    """The four figures every cold limiter is built with (in-process or shared), checked
    the same way with the same messages, and read-only afterwards."""

    _capacity: int
    _queue_capacity: int
    _wait: float
    _retry_after: int

    def _set_figures(self, active: int, queue: int, wait: float, retry_after: int) -> None:
        """Check the figures (``ValueError`` naming the first bad one) and keep them."""
        if isinstance(active, bool) or not isinstance(active, int) or active < 1:
            raise ValueError("active >= 1")
        if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
            raise ValueError("queue >= 0")
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not 0 < wait < math.inf  # NaN fails too; an infinite wait would not be bounded
        ):
            raise ValueError("wait > 0")
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 1:
            raise ValueError("retry_after >= 1")
        self._capacity = active
        self._queue_capacity = queue
        self._wait = float(wait)
        self._retry_after = retry_after

    @property
    def capacity_active(self) -> int:
        """``active``: the most builds admitted at once."""
        return self._capacity

    @property
    def capacity_queue(self) -> int:
        """``queue``: the most leaders waiting for a slot at once (0: none wait, a leader that
        finds every slot held is refused at once)."""
        return self._queue_capacity

    @property
    def wait(self) -> float:
        """The longest a queued leader waits for a slot, in seconds."""
        return self._wait

    @property
    def retry_after(self) -> int:
        """The whole seconds every refusal (``Busy``) tells a client to wait before trying
        again, unless the refusal knows better (a late one: when its place could start)."""
        return self._retry_after
