"""``REACHLIMIT_RETRY_AFTER="auto"``: a refusal's Retry-After worked out from recent build times.

Used by ``reachlimit.flask`` (which re-exports :class:`AutoRetryAfter`): one per app, in
``app.extensions["reachlimit"].retry_auto``; the extension times each build with
:meth:`AutoRetryAfter.timed` and asks :meth:`AutoRetryAfter.seconds` on each refusal.
Standard library only.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["AutoRetryAfter"]


class AutoRetryAfter:
    """``REACHLIMIT_RETRY_AFTER="auto"``: each refusal's Retry-After from recent build times.

    ``base = ceil(mean build time x (queued + 1) / active)``, clamped to [1, 30]: about how
    long until the leaders ahead (``queued``) and one more have had a slot. 2 until a build
    has been timed. Each refusal then adds ``randint(0, max(1, base // 4))`` so clients
    refused together do not come back together; a sum above 30 takes the spread off instead
    (``base - spread``), so every figure is a whole number of seconds in [1, 30].

    Build times are this process's (per app), the last ``SAMPLES`` builds that ran, whatever
    they returned or raised. ``clock`` (monotonic seconds) and ``randint`` (``random.randint``'s
    signature) are attributes a test may replace: ``app.extensions["reachlimit"].retry_auto``.
    Thread-safe: the samples are guarded by a lock taken once per build and per refusal."""

    SAMPLES = 16
    LOWEST = 1
    HIGHEST = 30
    #: The base before any build has been timed: the fixed default.
    UNMEASURED = 2

    def __init__(
        self,
        active: int,
        queue: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        randint: Callable[[int, int], int] = random.randint,
    ) -> None:
        self.active = active
        self.queue = queue
        self.clock = clock
        self.randint = randint
        self._lock = threading.Lock()
        self._durations: deque[float] = deque(maxlen=self.SAMPLES)  # guarded by _lock

    def timed(self, build: Callable[[], Any]) -> Callable[[], Any]:
        """``build``, recording how long each run of it takes."""
        clock, record = self.clock, self.record

        def timed_build() -> Any:
            started = clock()
            try:
                return build()
            finally:
                record(clock() - started)

        return timed_build

    def record(self, seconds: float) -> None:
        with self._lock:
            self._durations.append(max(0.0, seconds))

    def mean(self) -> float | None:
        """The mean of the recent build times, None before the first."""
        with self._lock:
            if not self._durations:
                return None
            return sum(self._durations) / len(self._durations)

    def base(self, queued: int) -> int:
        mean = self.mean()
        if mean is None:
            return self.UNMEASURED
        wait = math.ceil(mean * (queued + 1) / self.active)
        return min(self.HIGHEST, max(self.LOWEST, wait))

    def seconds(self, queued: int) -> int:
        """One refusal's Retry-After with ``queued`` leaders waiting."""
        base = self.base(queued)
        spread = self.randint(0, max(1, base // 4))
        figure = base + spread
        if figure > self.HIGHEST:
            figure = base - spread
        return max(self.LOWEST, min(self.HIGHEST, figure))
