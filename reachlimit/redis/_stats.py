"""The figures of a :class:`~reachlimit.redis.RedisColdLimiter`: ``RedisLimiterStats``, and
their reading from the stats script's reply (``stats_from_reply``): the counts, the counters
and the budget's settings, all as Redis holds them."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from .._limiter import LimiterStats

__all__ = ["RedisLimiterStats", "stats_from_reply"]

log = logging.getLogger("reachlimit")

_COUNTERS = ("displaced", "peak_active", "peak_queued", "acquired", "rejected_full",
             "rejected_timeout", "cancelled", "lease_lost", "deadline")


@dataclass(frozen=True, slots=True)
class RedisLimiterStats(LimiterStats):
    """The figures of :class:`~reachlimit.LimiterStats`, for all processes together, plus
    ``backend`` (``"redis"``), ``degraded`` (False from Redis itself; True when
    :class:`ResilientLimiter` answers from its in-process fallback, Redis being unreachable)
    and ``lease_lost``: grants whose lease ran out before they were released.

    ``capacity_active``, ``capacity_queue`` and ``wait`` are the budget's settings as recorded
    in Redis (written by the newest process to start using the budget), not this process's
    own; the in-process fallback's figures (``degraded``) are its own settings."""

    backend: str = "redis"
    degraded: bool = False
    lease_lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stats_from_reply(reply: Any, where: str) -> RedisLimiterStats:
    """The figures from the stats script's reply ``(held, queued, flat counters hash,
    (active, queue, wait in ms))``; ``where`` (the budget's first key) names it in the warning
    about a counter that is not a number (read as 0, never an error)."""
    held, queued, flat, (capacity_active, capacity_queue, wait_ms) = reply
    counters = dict.fromkeys(_COUNTERS, 0)
    for field, value in zip(flat[::2], flat[1::2], strict=True):
        key = field.decode() if isinstance(field, bytes) else str(field)
        if key in counters:
            try:
                counters[key] = int(value)
            except ValueError:  # written by something else: read as 0, never an error
                log.warning("reachlimit: counter %r of %s is not a number: %r",
                            key, where, value)
    return RedisLimiterStats(
        active=int(held),
        queued=int(queued),
        # The fast path records a peak only above one: any grant made it at least one.
        peak_active=max(counters["peak_active"], min(1, counters["acquired"])),
        peak_queued=counters["peak_queued"],
        acquired=counters["acquired"],
        rejected_full=counters["rejected_full"],
        rejected_timeout=counters["rejected_timeout"],
        cancelled=counters["cancelled"],
        capacity_active=int(capacity_active),
        capacity_queue=int(capacity_queue),
        wait=int(wait_ms) / 1000,
        displaced=counters["displaced"],
        deadline=counters["deadline"],
        lease_lost=counters["lease_lost"],
    )
