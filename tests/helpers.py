"""Constants and helpers shared by the in-process tests of the library and of its Flask
extension (the servers and the helpers of the tests that talk to them: ``tests/servers.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from reachlimit import ColdLimiter, Grant

#: The figures of ``LimiterStats.as_dict()`` that SPEC §2 names.
LIMITER_FIELDS = frozenset(
    {
        "active",
        "queued",
        "peak_active",
        "peak_queued",
        "acquired",
        "rejected_full",
        "rejected_timeout",
        "cancelled",
        "capacity_active",
        "capacity_queue",
        "wait",
    }
)
#: The figures ``ColdPathStats.as_dict()`` adds to those of its limiter.
PATH_FIELDS = frozenset({"hits", "misses", "builds", "coalesced"})


@contextlib.contextmanager
def slots_held(limiter: ColdLimiter) -> Iterator[list[Grant]]:
    """Every build slot of ``limiter``, held by the test until the block ends."""
    grants = [limiter.acquire() for _ in range(limiter.capacity_active)]
    try:
        yield grants
    finally:
        for grant in grants:
            grant.__exit__(None, None, None)
