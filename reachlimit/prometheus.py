"""Prometheus metrics of a :class:`~reachlimit.ColdPath`, counted for the whole service.

Needs ``prometheus_client`` (``pip install 'reachlimit[prometheus]'``). Only the Flask
extension imports this module, and only when metrics are turned on, so the core stays
standard-library only and an app without metrics pays nothing.

design:

    figure                                  counted where
    reachlimit_admissions_total{result}     MeteredLimiter.acquire: one event per call -
    reachlimit_wait_seconds                 granted (fast path or promoted), queue_full,
                                            timeout, displaced, cancelled; the wait is timed
                                            for grants, timeouts and displacements (a
                                            queue_full refusal
                                            never waits, a cancelled wait has no answer)
    reachlimit_build_seconds                MeteredColdPath.get times the build it passes on
                                            (only a leader holding a grant ever runs it)
    reachlimit_cache_requests_total{result} copied from the path's own counters, the same
    reachlimit_coalesced_total              numbers as ``stats()`` (hit, miss, stale;
    reachlimit_refreshes_total{result}      coalesced) and the refreshes ended (done,
                                            refused, failed)
    reachlimit_builds_active                the limiter's ``stats()``: active, queued and
    reachlimit_queue_waiting                the two capacities
    reachlimit_capacity_active
    reachlimit_capacity_queue

Two modes; prometheus_client picks one when it is first imported:

    one process (``PROMETHEUS_MULTIPROC_DIR`` unset): counters and histograms live in this
        object's own registry; the gauges and the path's counters are read when scraped.
        Per request, a warm hit costs one more call frame; a leader's admission and build
        are counted as they happen.
    several processes (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client was first
        imported, as ``webapp/gunicorn.conf.py`` does for gunicorn): each process writes its
        figures to its own files in that directory and a scrape of any one of them reads
        every file (prometheus_client's MultiProcessCollector). Counters and histograms add
        up over every process that ever ran, dead ones included; ``builds_active`` and
        ``queue_waiting`` add up over the live processes (``livesum``); the capacities are
        the largest live value (``livemax``): the limit each process enforces. A process
        that dies must be marked dead (``prometheus_client.multiprocess.mark_process_dead``,
        gunicorn's ``child_exit``) so that its gauges drop out.

In the second mode a process must publish its own figures, because nobody else can read them.
:meth:`ReachMetrics.publish` reads the path's counters and the limiter's ``stats()`` under one
lock and writes only what changed: counters by their increase since the last publish, gauges
by their value. It runs after each request through the path, after each admission that moved
a slot or a queue place, when a leader starts to wait, and before this process answers a
scrape. Each publish happens after the change that caused it and reads the current figures,
so the files always hold figures that were true a moment ago and are exact once the process
is idle. (A grant taken directly on ``path.limiter``, outside ``path.get``, is published at
once; its release at the next event.) Nothing is written at import or at construction: under a
preloading server (gunicorn ``preload_app``) the master, which serves nothing, leaves no file
behind for the workers it forks.

The metered classes (in ``reachlimit._metered``, standard library only; re-exported here) are
subclasses, so the path and the limiter are the library's own, with
two seams used: ``ColdLimiter.acquire`` (wrapped: timed and counted) and the limiter's
admission observer ``on_queued`` (called only for a leader the queue has just admitted, with
the lock free: the moment to publish its new place). The fast path and the refusal path of the
limiter itself are not touched.

Shared limiters (``ReachMetrics(limiter=...)``, the Redis-backed one): their ``stats()``
already are the figures of the whole service, so adding them up over processes would count
every slot once per worker. Such a limiter is wrapped by :class:`MeteredSharedLimiter` (its
admissions counted and timed in the process that made them, added up as above), and its gauges
are never published per process: :class:`_LimiterGauges` reads them from the limiter when a
scrape arrives (one Redis round trip), in both modes. With them come two figures only a shared
backend has: ``reachlimit_backend_degraded`` (1 while the answering process runs on its
in-process fallback because Redis cannot be reached; an outage is seen by every process alike,
and the scrape itself tries Redis) and ``reachlimit_lease_lost_total`` (grants whose lease ran
out before they were released: a holder paused or cut off longer than the lease; counted in
Redis, once for the whole service). While degraded, the gauges are the answering process's own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as _values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from ._errors import Busy
from ._metered import MeteredColdPath, MeteredLimiter, MeteredSharedLimiter
from ._path import Cache, Flight, Limiter

__all__ = [
    "CONTENT_TYPE", "MeteredColdPath", "MeteredLimiter", "MeteredSharedLimiter", "ReachMetrics",
]

log = logging.getLogger("reachlimit")

#: The Content-Type of :meth:`ReachMetrics.exposition` (the Prometheus text format).
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Upper bounds (seconds) of the wait histogram; the configured wait is added, so a request
#: that waited its whole bound is told apart from one that waited almost nothing.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Upper bounds (seconds) of the build histogram: a cold build takes 0.1 to 1 s.
BUILD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

RESULTS = ("granted", "queue_full", "timeout", "cancelled", "displaced")

_HELP = {
    "admissions": "Cold leaders' admissions to the limiter, by result.",
    "builds_active": "Cold builds running now (slots held).",
    "queue_waiting": "Cold leaders waiting in the queue now.",
    "capacity_active": "Builds one limiter runs at once at most.",
    "capacity_queue": "Leaders one limiter lets wait at most.",
    "cache_requests": "Requests that found a fresh answer (hit), a stale one served while it "
                      "is refreshed (stale), or none (miss).",
    "refreshes": "Refreshes of cached answers ended: a value stored or found (done), refused "
                 "by the limiter (refused), the build raised (failed).",
    "coalesced": "Requests that shared another request's build instead of leading one.",
    "wait": "How long a cold leader waited before its grant or refusal.",
    "build": "How long a cold build ran.",
    "backend_degraded": "1 while the shared backend (Redis) cannot be reached and this process "
                        "runs on its in-process fallback, else 0.",
    "lease_lost": "Grants whose lease ran out before they were released (holder paused or cut "
                  "off past the lease), for the whole service.",
}


def multiprocess_mode() -> bool:
    """True when prometheus_client writes to ``PROMETHEUS_MULTIPROC_DIR`` (decided when it
    was first imported: setting the variable later changes nothing)."""
    return bool(getattr(_values.ValueClass, "_multiprocess", False))


@dataclass(frozen=True)
class _Instruments:
    """The prometheus_client objects of one :class:`ReachMetrics`."""

    admissions: Counter
    granted: Counter
    queue_full: Counter
    timeout: Counter
    cancelled: Counter
    hits: Counter
    misses: Counter
    coalesced: Counter
    stale: Counter
    refreshed: Counter
    refresh_refused: Counter
    refresh_failed: Counter
    wait: Histogram
    build: Histogram
    # Only when gauges are published per process (else read at scrape time).
    builds_active: Gauge | None
    queue_waiting: Gauge | None
    capacity_active: Gauge | None
    capacity_queue: Gauge | None


class _LimiterGauges:
    """A collector that reads the limiter's gauges when scraped; for a shared limiter, also
    whether it is degraded and how many leases were lost (figures only such a limiter has)."""

    def __init__(self, limiter: Limiter, shared: bool = False) -> None:
        self._limiter = limiter
        self._shared = shared

    def collect(self) -> Iterator[Metric]:
        s = self._limiter.stats()
        for name, value in (
            ("builds_active", s.active),
            ("queue_waiting", s.queued),
            ("capacity_active", s.capacity_active),
            ("capacity_queue", s.capacity_queue),
        ):
            yield GaugeMetricFamily(f"reachlimit_{name}", _HELP[name], value=value)
        if self._shared:
            degraded = bool(getattr(s, "degraded", False))
            yield GaugeMetricFamily(
                "reachlimit_backend_degraded", _HELP["backend_degraded"], value=int(degraded)
            )
            yield CounterMetricFamily(
                "reachlimit_lease_lost", _HELP["lease_lost"],
                value=int(getattr(s, "lease_lost", 0)),
            )


# The ReachMetrics of this process in the several-process mode: a second one would write the
# same series into the same files.
_per_process_owner: weakref.ref[ReachMetrics] | None = None
_owner_lock = threading.Lock()


class ReachMetrics:
    """One cold path (``.path``, over ``.limiter``) and its Prometheus figures.

    ``exposition()`` is the body of a scrape (Prometheus text format, :data:`CONTENT_TYPE`):
    this process's figures in the one-process mode, every process's in the several-process
    mode (see the module's design notes).

    By default the limiter is a new in-process :class:`MeteredLimiter` made from ``active``,
    ``queue``, ``wait`` and ``retry_after``. ``limiter=`` passes a shared limiter instead (the
    four numbers are then the shared limiter's business and ignored here); ``flight=`` a
    shared singleflight."""

    #: The Content-Type of :meth:`exposition`.
    content_type = CONTENT_TYPE

    def __init__(
        self, active: int = 2, queue: int = 8, wait: float = 3.0, retry_after: int = 2,
        *,
        cache: Cache | None = None,
        clock: Callable[[], float] = time.monotonic,
        limiter: Limiter | None = None,
        flight: Flight | None = None,
    ) -> None:
        global _per_process_owner
        #: Figures are written to per-process files and published by each process.
        self.per_process = multiprocess_mode()
        #: The limiter's figures are the whole service's (read at scrape time, never summed).
        self.shared = limiter is not None
        self.limiter: MeteredLimiter | MeteredSharedLimiter
        if limiter is None:
            self.limiter = MeteredLimiter(active, queue, wait, retry_after, clock=clock)
            self.limiter.metrics = self
            self.limiter.on_queued = self.limiter._queued
        else:
            self.limiter = MeteredSharedLimiter(limiter, self)
        self.path = MeteredColdPath(self, self.limiter, cache, flight)
        self.registry = CollectorRegistry()  # the one-process mode's
        self._wait_buckets = tuple(sorted({*WAIT_BUCKETS, float(wait)}))
        self._lock = threading.Lock()
        self._instruments: _Instruments | None = None  # made on first use; under _lock
        self._published_counts: tuple[int, ...] = (0,) * 7  # guarded by _lock
        self._published_gauges: tuple[int, int, int, int] | None = None  # guarded by _lock
        self._published_pid = 0  # guarded by _lock
        if self.per_process:
            with _owner_lock:
                other = _per_process_owner() if _per_process_owner is not None else None
                if other is not None:
                    log.warning(
                        "a second reachlimit metrics set in process %d: in the several-process "
                        "mode both write the same series, so their figures are unreliable; "
                        "meter one app per process", os.getpid(),
                    )
                _per_process_owner = weakref.ref(self)

    # -- events (request threads) -----------------------------------------------------------

    def granted(self, seconds: float) -> None:
        inst = self.instruments()
        inst.granted.inc()
        inst.wait.observe(seconds)
        if self.per_process:
            self.publish(gauges=True)

    def refused(self, reason: str, seconds: float) -> None:
        inst = self.instruments()
        if reason == Busy.QUEUE_FULL:
            # Nothing moved, and nothing waited: a queue_full refusal is decided before any
            # waiting state exists, so it is not timed (as a cancelled wait is not). Timing it
            # would add two writes to the shared files of the several-process mode on the
            # one answer that must stay the cheapest. The request's end publishes the rest.
            inst.queue_full.inc()
            return
        (inst.timeout if reason == Busy.TIMEOUT else inst.admissions.labels(reason)).inc()
        if self.per_process:
            self.publish(gauges=True)  # it left the queue
        inst.wait.observe(seconds)

    def cancelled(self) -> None:
        self.instruments().cancelled.inc()
        if self.per_process:
            self.publish(gauges=True)

    # -- publishing and scraping --------------------------------------------------------------

    def publish(self, gauges: bool = True) -> None:
        """Write this process's figures that changed since the last publish: the path's
        counters always, the gauges when ``gauges`` is true and they are kept per process."""
        inst = self.instruments()
        with self._lock:
            c = self.path.counts()
            counts = (c.hits, c.misses, c.coalesced, c.stale, c.refreshed, c.refresh_refused,
                      c.refresh_failed)
            last = self._published_counts
            if counts != last:
                for counter, now, before in zip(
                    (inst.hits, inst.misses, inst.coalesced, inst.stale, inst.refreshed,
                     inst.refresh_refused, inst.refresh_failed),
                    counts, last, strict=True,
                ):
                    if now > before:
                        counter.inc(now - before)
                self._published_counts = counts
            if not (gauges and inst.builds_active is not None):
                return
            pid = os.getpid()
            if pid != self._published_pid:
                # A forked child: its gauge files start empty whatever the parent wrote.
                self._published_pid = pid
                self._published_gauges = None
            s = self.limiter.stats()
            figures = (s.active, s.queued, s.capacity_active, s.capacity_queue)
            old = self._published_gauges
            for i, gauge in enumerate(
                (inst.builds_active, inst.queue_waiting, inst.capacity_active,
                 inst.capacity_queue)
            ):
                if gauge is not None and (old is None or old[i] != figures[i]):
                    gauge.set(figures[i])
            self._published_gauges = figures

    def exposition(self) -> bytes:
        """The scrape body: every metric in the Prometheus text format."""
        if self.per_process:
            self.publish(gauges=True)
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            if self.shared:
                registry.register(_LimiterGauges(self.limiter, shared=True))
            return generate_latest(registry)
        self.publish(gauges=False)
        return generate_latest(self.registry)

    # -- the prometheus_client objects --------------------------------------------------------

    def instruments(self) -> _Instruments:
        """The metric objects, made on first use (never at construction; see the design)."""
        inst = self._instruments
        if inst is not None:
            return inst
        with self._lock:
            if self._instruments is None:
                self._instruments = self._make_instruments()
            return self._instruments

    def _make_instruments(self) -> _Instruments:
        """Called once, with _lock held."""
        registry = None if self.per_process else self.registry
        admissions = Counter(
            "reachlimit_admissions", _HELP["admissions"], ["result"], registry=registry
        )
        cache = Counter(
            "reachlimit_cache_requests", _HELP["cache_requests"], ["result"], registry=registry
        )
        gauges: Sequence[Gauge | None] = (None,) * 4
        if self.per_process and self.shared:
            pass  # read from the shared limiter at scrape time, in exposition()
        elif self.per_process:
            # Live processes only: a dead worker's gauges drop out once it is marked dead.
            # Slots and places in use add up; a capacity is the limit each process enforces.
            gauges = [
                Gauge(f"reachlimit_{name}", _HELP[name], registry=None, multiprocess_mode="livesum")
                for name in ("builds_active", "queue_waiting")
            ] + [
                Gauge(f"reachlimit_{name}", _HELP[name], registry=None, multiprocess_mode="livemax")
                for name in ("capacity_active", "capacity_queue")
            ]
        else:
            self.registry.register(_LimiterGauges(self.limiter, shared=self.shared))
        granted, queue_full, timeout, cancelled, _ = (admissions.labels(r) for r in RESULTS)
        refreshes = Counter(
            "reachlimit_refreshes", _HELP["refreshes"], ["result"], registry=registry
        )
        return _Instruments(
            admissions=admissions,
            granted=granted,
            queue_full=queue_full,
            timeout=timeout,
            cancelled=cancelled,
            hits=cache.labels("hit"),
            misses=cache.labels("miss"),
            stale=cache.labels("stale"),
            refreshed=refreshes.labels("done"),
            refresh_refused=refreshes.labels("refused"),
            refresh_failed=refreshes.labels("failed"),
            coalesced=Counter("reachlimit_coalesced", _HELP["coalesced"], registry=registry),
            wait=Histogram(
                "reachlimit_wait_seconds", _HELP["wait"], buckets=self._wait_buckets,
                registry=registry,
            ),
            build=Histogram(
                "reachlimit_build_seconds", _HELP["build"], buckets=BUILD_BUCKETS,
                registry=registry,
            ),
            builds_active=gauges[0],
            queue_waiting=gauges[1],
            capacity_active=gauges[2],
            capacity_queue=gauges[3],
        )
