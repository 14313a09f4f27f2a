"""The metered cold path and limiters of ``reachlimit.prometheus``: the library's own classes
with their admissions counted and timed and their builds timed, reported to a ``Meter`` (a
:class:`~reachlimit.prometheus.ReachMetrics`).

Standard library only: every prometheus_client object stays behind the ``Meter``, in
``reachlimit.prometheus`` (which re-exports these classes and holds their design note).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from time import perf_counter
from typing import Any, Protocol

from ._cancel import CancelToken
from ._errors import Busy, Cancelled
from ._limiter import ColdLimiter, Grant
from ._path import Answer, Cache, ColdPath, Flight, Limiter

__all__ = ["Meter", "MeteredColdPath", "MeteredLimiter", "MeteredSharedLimiter"]


class _Observes(Protocol):
    def observe(self, amount: float) -> None: ...


class _BuildHistogram(Protocol):
    @property
    def build(self) -> _Observes: ...


class Meter(Protocol):
    """What the metered classes report to (``ReachMetrics``)."""

    @property
    def per_process(self) -> bool: ...

    def granted(self, seconds: float) -> None: ...

    def refused(self, reason: str, seconds: float) -> None: ...

    def cancelled(self) -> None: ...

    def publish(self, gauges: bool = True) -> None: ...  # pragma: no mutate (a protocol's)

    def instruments(self) -> _BuildHistogram: ...


class MeteredLimiter(ColdLimiter):
    """A :class:`~reachlimit.ColdLimiter` that reports each admission and each wait to
    ``metrics`` (its ``ReachMetrics``), a leader the queue admits too (its own admission
    observer, ``on_queued``). Admission itself is the parent's, unchanged; so are the other
    arguments."""

    def __init__(
        self, active: int = 2, queue: int = 8, wait: float = 3.0, retry_after: int = 2,
        *,
        metrics: Meter,
        clock: Callable[[], float] = time.monotonic,
        deadline: bool = True,
    ) -> None:
        super().__init__(active, queue, wait, retry_after, clock=clock, deadline=deadline)
        self.metrics = metrics
        self.on_queued = self._queued

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        """The parent's ``acquire``, timed and counted by result. Runs in the caller's
        thread; the metrics are written after the limiter's lock is released."""
        return _timed_admission(self.metrics, super().acquire, cancel, client)

    def _queued(self) -> None:
        """The admission observer (``on_queued``): a leader the queue has just admitted, in
        its own thread, with the lock free: publish its new place."""
        if self.metrics.per_process:
            self.metrics.publish(gauges=True)


def _timed_admission(
    metrics: Meter,
    acquire: Callable[[CancelToken | None, Hashable], Grant],
    cancel: CancelToken | None,
    client: Hashable,
) -> Grant:
    """``acquire(cancel, client)``, timed and counted by result (both metered limiters')."""
    started = perf_counter()
    try:
        grant = acquire(cancel, client)
    except Busy as busy:
        metrics.refused(busy.reason, perf_counter() - started)
        raise
    except Cancelled:
        metrics.cancelled()
        raise
    metrics.granted(perf_counter() - started)
    return grant


class MeteredSharedLimiter:
    """A shared limiter (one whose ``stats()`` count the whole service) whose admissions are
    counted and timed like :class:`MeteredLimiter`'s; everything else is the limiter's own
    (``inner``), its four figures too."""

    def __init__(self, inner: Limiter, metrics: Meter) -> None:
        self.inner = inner
        self.metrics = metrics

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        return _timed_admission(self.metrics, self.inner.acquire, cancel, client)

    def stats(self) -> Any:
        return self.inner.stats()

    @property
    def capacity_active(self) -> int:
        return self.inner.capacity_active

    @property
    def capacity_queue(self) -> int:
        return self.inner.capacity_queue

    @property
    def wait(self) -> float:
        return self.inner.wait

    @property
    def retry_after(self) -> int:
        return self.inner.retry_after

    def close(self) -> None:
        """Close the wrapped limiter (its background threads, on Redis)."""
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


class _TimedBuild:
    """A build that records its duration (and that it ran) when called."""

    __slots__ = ("build", "metrics", "ran")

    def __init__(self, build: Callable[[], Any], metrics: Meter) -> None:
        self.build = build
        self.metrics = metrics
        self.ran = False

    def __call__(self) -> Any:
        self.ran = True
        started = perf_counter()
        try:
            return self.build()
        finally:
            self.metrics.instruments().build.observe(perf_counter() - started)


class MeteredColdPath(ColdPath):
    """A :class:`~reachlimit.ColdPath` whose builds are timed and whose figures are published
    after each request (when the figures are kept per process)."""

    def __init__(
        self,
        metrics: Meter,
        limiter: MeteredLimiter | MeteredSharedLimiter,
        cache: Cache | None = None,
        flight: Flight | None = None,
        **options: Any,
    ) -> None:
        super().__init__(limiter, cache, flight, **options)
        self._metrics = metrics

    def fetch_warm_fields(
        self, key: Hashable, build: Callable[[], Any]
    ) -> tuple[Any, str, float | None] | None:
        metrics = self._metrics
        # (a refresh the answer hands out runs the build later: timed then)
        answer = super().fetch_warm_fields(key, _TimedBuild(build, metrics))
        if answer is not None and metrics.per_process:
            metrics.publish(gauges=False)
        return answer

    def fetch_cold(
        self, key: Hashable, build: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> Answer:
        metrics = self._metrics
        timed = _TimedBuild(build, metrics)
        try:
            return super().fetch_cold(key, timed, cancel, client)
        finally:
            if metrics.per_process:
                # A build that ran held a slot, released before fetch_cold() returned.
                metrics.publish(gauges=timed.ran)
