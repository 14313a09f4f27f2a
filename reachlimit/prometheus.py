"""Prometheus metrics of a :class:`~reachlimit.ColdPath`, counted for the whole service.

Needs ``prometheus_client`` (``pip install 'reachlimit[prometheus]'``). Only the Flask
extension imports this module, and only when metrics are turned on, so the core stays
standard-library only and an app without metrics pays nothing.

design (every family is labelled ``budget``: one value per budget of the app, so bounded)::

    figure                                  counted where
    reachlimit_admissions_total{result}     MeteredLimiter.acquire: one event per call -
    reachlimit_wait_seconds                 granted, queue_full, timeout, displaced,
                                            deadline, cancelled; the wait is timed for
                                            grants, timeouts, displacements and deadline
                                            refusals (at once: a wait of about 0)
    reachlimit_build_seconds                MeteredColdPath.get times the build it passes on
    reachlimit_cache_requests_total{result} copied from the path's own counters, the same
    reachlimit_coalesced_total              numbers as ``stats()`` (hit, miss, stale;
    reachlimit_refreshes_total{result}      coalesced; refreshes done, refused, failed)
    reachlimit_builds_active, _queue_waiting, _capacity_active, _capacity_queue
                                            the limiter's ``stats()``

One app's budgets are one :class:`MetricsGroup`: one set of families (made on first use), one
registry, one scrape; each budget's :class:`ReachMetrics` writes its own children.

Two modes; prometheus_client picks one when it is first imported::

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

In the second mode a process must publish its own figures: :meth:`ReachMetrics.publish` reads
the path's counters and the limiter's ``stats()`` under one lock and writes only what changed
(counters by their increase, gauges by their value), after each request through the path,
each admission that moved a slot or a place, and before this process answers a scrape; so the
files hold figures true a moment ago, exact once the process is idle. Nothing is written at
import or construction: a preloading gunicorn master leaves no file behind for its workers.

The metered classes (``reachlimit._metered``, standard library only; re-exported here) are
subclasses of the library's own, with two seams used: ``ColdLimiter.acquire`` (timed and
counted) and the limiter's admission observer ``on_queued`` (a leader the queue has just
admitted, with the lock free: the moment to publish its new place).

Shared limiters (``ReachMetrics(limiter=...)``, the Redis-backed one): their ``stats()`` are
the whole service's already, so summing them over processes would count every slot once per
worker. Such a limiter is wrapped by :class:`MeteredSharedLimiter` (admissions counted where
they were made, added up as above) and its gauges are read from it when a scrape arrives (one
Redis round trip per budget), in both modes, with two figures only it has:
``reachlimit_backend_degraded`` (1 while the answering process runs on its fallback) and
``reachlimit_lease_lost_total`` (grants whose lease ran out before their release, counted in
Redis for the whole service). While degraded, the gauges are the answering process's own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from ._errors import Busy
from ._metered import MeteredColdPath, MeteredLimiter, MeteredSharedLimiter
from ._path import Cache, Flight, Limiter

__all__ = [
    "CONTENT_TYPE", "MeteredColdPath", "MeteredLimiter", "MeteredSharedLimiter", "MetricsGroup",
    "ReachMetrics",
]

log = logging.getLogger("reachlimit")

#: The Content-Type of :meth:`ReachMetrics.exposition` (the Prometheus text format).
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Upper bounds (seconds) of the wait histogram; the configured wait is added, so a request
#: that waited its whole bound is told apart from one that waited almost nothing.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Upper bounds (seconds) of the build histogram: a cold build takes 0.1 to 1 s.
BUILD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

RESULTS = ("granted", "queue_full", "timeout", "cancelled", "displaced", "deadline")

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


#: The environment variables that put prometheus_client in its multiprocess mode, as it reads
#: them (the second is its older name, still read).
MULTIPROC_VARIABLES = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def multiprocess_mode() -> bool:
    """True when prometheus_client writes to ``PROMETHEUS_MULTIPROC_DIR``: the variable (or
    its older lower-case name) is set, the signal prometheus_client documents and reads
    itself. It decides when first imported, so the variable is set before that, as its
    documentation asks (in the server's environment, or by ``reachlimit.gunicorn.prepare``
    first in the gunicorn config file, which leaves it unset when it comes too late)."""
    return any(name in os.environ for name in MULTIPROC_VARIABLES)


@dataclass(frozen=True)
class _Families:
    """The metric families of one :class:`MetricsGroup`, each labelled by ``budget``."""

    admissions: Counter
    cache: Counter
    refreshes: Counter
    coalesced: Counter
    wait: Histogram
    build: Histogram
    # Only when gauges are published per process (else read at scrape time).
    gauges: Sequence[Gauge] | None


@dataclass(frozen=True)
class _Instruments:
    """The prometheus_client objects of one :class:`ReachMetrics` (its budget's children)."""

    admissions: Callable[[str], Counter]
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


_T = TypeVar("_T")


def _made_once(owner: object, name: str, lock: threading.Lock, make: Callable[[], _T]) -> _T:
    """``owner.<name>``, made by ``make`` (with ``lock`` held) if it is still None. (The
    first read only saves the lock: without it, the answer is the same.)"""
    # Read as None, the lock is taken and the second read answers (no mutate: the same).
    made: _T | None = getattr(owner, name)  # pragma: no mutate
    if made is None:
        with lock:
            made = getattr(owner, name)
            if made is None:
                made = make()
                setattr(owner, name, made)
    return made


class _LimiterGauges:
    """A collector that reads the gauges of its group's limiters when scraped (one sample
    per budget); for shared limiters, also whether each is degraded and how many leases
    were lost (figures only such a limiter has)."""

    def __init__(self, group: MetricsGroup, shared_only: bool) -> None:
        self._group = group
        self._shared_only = shared_only

    def collect(self) -> Iterator[Metric]:
        members = [m for m in self._group.members if m.shared or not self._shared_only]
        figures = [(m.budget, m.limiter.stats()) for m in members]
        names = ("builds_active", "queue_waiting", "capacity_active", "capacity_queue")
        for i, name in enumerate(names):
            family = GaugeMetricFamily(f"reachlimit_{name}", _HELP[name], labels=["budget"])
            for budget, s in figures:
                family.add_metric([budget], (s.active, s.queued, s.capacity_active,
                                             s.capacity_queue)[i])
            yield family
        # (figures is made from members: strict never fails, no mutate)
        shared = [(budget, s) for (budget, s), m in zip(figures, members,
                                                        strict=True)  # pragma: no mutate
                  if m.shared]
        if shared:
            degraded = GaugeMetricFamily(
                "reachlimit_backend_degraded", _HELP["backend_degraded"], labels=["budget"]
            )
            lost = CounterMetricFamily(
                "reachlimit_lease_lost", _HELP["lease_lost"], labels=["budget"]
            )
            for budget, s in shared:
                degraded.add_metric([budget], int(bool(getattr(s, "degraded", False))))
                lost.add_metric([budget], int(getattr(s, "lease_lost", 0)))
            yield degraded
            yield lost


class MetricsGroup:
    """The figures of several cold paths (one app's budgets) as one set of metric families
    labelled by ``budget``, in one registry, answered by one scrape (:meth:`exposition`).

    The families are made on first use, never at construction (see the module's design);
    the wait histogram's buckets are :data:`WAIT_BUCKETS` plus the ``wait`` of every member
    that joined before then."""

    def __init__(self) -> None:
        self.per_process = multiprocess_mode()
        self.registry = CollectorRegistry()  # the one-process mode's
        self.members: list[ReachMetrics] = []
        self._lock = threading.Lock()
        self._families: _Families | None = None  # made on first use; under _lock
        #: The several-process mode's collector of the shared limiters' gauges.
        self._scraped: _LimiterGauges | None = None

    def families(self) -> _Families:
        return _made_once(self, "_families", self._lock, self._make_families)

    def _make_families(self) -> _Families:
        """Called once, with _lock held."""
        # Per process, a scrape reads the files, never a registry: none is needed then.
        registry = None if self.per_process else self.registry
        budget = ["budget"]
        shared = any(m.shared for m in self.members)
        gauges: list[Gauge] | None = None
        if self.per_process and not all(m.shared for m in self.members):
            # Live processes only: a dead worker's gauges drop out once it is marked dead.
            # Slots and places in use add up; a capacity is the limit each process enforces.
            # In no registry, like the counters of this mode: a scrape reads the files, and
            # prometheus_client's global registry would refuse a second app's of this process.
            gauges = [
                Gauge(f"reachlimit_{n}", _HELP[n], budget, multiprocess_mode="livesum",
                      registry=registry)
                for n in ("builds_active", "queue_waiting")
            ] + [
                Gauge(f"reachlimit_{n}", _HELP[n], budget, multiprocess_mode="livemax",
                      registry=registry)
                for n in ("capacity_active", "capacity_queue")
            ]
        if not self.per_process:
            self.registry.register(_LimiterGauges(self, shared_only=False))
        elif shared:  # read from the shared limiters at scrape time, in exposition()
            self._scraped = _LimiterGauges(self, shared_only=True)
        waits = {float(m.wait) for m in self.members}
        return _Families(
            admissions=Counter("reachlimit_admissions", _HELP["admissions"],
                               [*budget, "result"], registry=registry),
            cache=Counter("reachlimit_cache_requests", _HELP["cache_requests"],
                          [*budget, "result"], registry=registry),
            refreshes=Counter("reachlimit_refreshes", _HELP["refreshes"],
                              [*budget, "result"], registry=registry),
            coalesced=Counter("reachlimit_coalesced", _HELP["coalesced"], budget,
                              registry=registry),
            wait=Histogram("reachlimit_wait_seconds", _HELP["wait"], budget,
                           buckets=tuple(sorted({*WAIT_BUCKETS, *waits})), registry=registry),
            build=Histogram("reachlimit_build_seconds", _HELP["build"], budget,
                            buckets=BUILD_BUCKETS, registry=registry),
            gauges=gauges,
        )

    def exposition(self) -> bytes:
        """The scrape body: every member's metrics in the Prometheus text format."""
        for member in list(self.members):
            member.publish(gauges=self.per_process)
        if not self.per_process:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        self.families()
        if self._scraped is not None:
            registry.register(self._scraped)
        return generate_latest(registry)


# The ReachMetrics of this process in the several-process mode, by budget: a second one of
# a budget would write the same series into the same files.
_per_process_owners: dict[str, weakref.ref[ReachMetrics]] = {}
_owner_lock = threading.Lock()


class ReachMetrics:
    """One cold path (``.path``, over ``.limiter``) and its Prometheus figures, every one
    labelled ``budget="<budget>"``.

    ``exposition()`` is the body of a scrape (Prometheus text format, :data:`CONTENT_TYPE`):
    this process's figures in the one-process mode, every process's in the several-process
    mode (see the module's design notes); with ``group=`` (a :class:`MetricsGroup`: one app's
    budgets), those of every member of the group.

    By default the limiter is a new in-process :class:`MeteredLimiter` made from ``active``,
    ``queue``, ``wait``, ``retry_after`` and ``deadline``. ``limiter=`` passes a shared
    limiter instead (these figures are then the shared limiter's business and ignored here,
    but for ``wait``, a bucket of the wait histogram); ``flight=`` a shared singleflight."""

    #: The Content-Type of :meth:`exposition`.
    content_type = CONTENT_TYPE

    def __init__(
        self, active: int = 2, queue: int = 8, wait: float = 3.0, retry_after: int = 2,
        *,
        cache: Cache | None = None,
        clock: Callable[[], float] = time.monotonic,
        limiter: Limiter | None = None,
        flight: Flight | None = None,
        budget: str = "default",
        group: MetricsGroup | None = None,
        deadline: bool = True,
    ) -> None:
        #: Figures are written to per-process files and published by each process.
        self.per_process = multiprocess_mode()
        #: The limiter's figures are the whole service's (read at scrape time, never summed).
        self.shared = limiter is not None
        self.budget = budget
        self.wait = wait
        self.limiter: MeteredLimiter | MeteredSharedLimiter
        if limiter is None:
            self.limiter = MeteredLimiter(
                active, queue, wait, retry_after, metrics=self, clock=clock, deadline=deadline
            )
        else:
            self.limiter = MeteredSharedLimiter(limiter, self)
        self.path = MeteredColdPath(self, self.limiter, cache, flight)
        self.group = group if group is not None else MetricsGroup()
        self.group.members.append(self)
        self.registry = self.group.registry  # the one-process mode's
        self._lock = threading.Lock()
        self._instruments: _Instruments | None = None  # made on first use; under _lock
        self._published_counts: tuple[int, ...] = (0,) * 7  # guarded by _lock
        # The first publish writes every gauge whatever these two start as: no process has
        # pid 0, so it resets them (no mutate: any other start is the same).
        self._published_gauges: tuple[int, int, int, int] | None = None  # pragma: no mutate
        self._published_pid = 0  # pragma: no mutate (guarded by _lock, as is the line above)
        if self.per_process:
            with _owner_lock:
                owner = _per_process_owners.get(budget)
                if owner is not None and owner() is not None:
                    # The words are no behaviour (no mutate); what the line names is tested.
                    log.warning(
                        "a second reachlimit metrics set of budget %r in "  # pragma: no mutate
                        "process %d: in the several-process mode both write "  # pragma: no mutate
                        "the same series, so their figures are unreliable; "  # pragma: no mutate
                        "meter one app per process",  # pragma: no mutate
                        budget, os.getpid(),
                    )
                _per_process_owners[budget] = weakref.ref(self)

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
        # inst.timeout is admissions("timeout") itself (a label's child is made once).
        (inst.timeout if reason == Busy.TIMEOUT else inst.admissions(reason)).inc()
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
                # Both tuples have the seven counts (strict never fails: no mutate); an
                # unchanged count would only add 0.
                for counter, now, before in zip(
                    (inst.hits, inst.misses, inst.coalesced, inst.stale, inst.refreshed,
                     inst.refresh_refused, inst.refresh_failed),
                    counts, last, strict=True,  # pragma: no mutate
                ):
                    if now > before:
                        counter.inc(now - before)
                self._published_counts = counts
            # Writing the gauges more often than this (when not asked, or all four every
            # time) would write the same true figures: only the figures are tested.
            if not (gauges and inst.builds_active is not None):
                return
            pid = os.getpid()
            if pid != self._published_pid:
                # A forked child: its gauge files start empty whatever the parent wrote.
                # (no mutate: a pid not kept would only reset the figures each time, and
                # every gauge would be written again: the same true figures.)
                self._published_pid = pid  # pragma: no mutate
                self._published_gauges = None
            s = self.limiter.stats()
            figures = (s.active, s.queued, s.capacity_active, s.capacity_queue)
            old = self._published_gauges
            for i, gauge in enumerate(
                (inst.builds_active, inst.queue_waiting, inst.capacity_active,
                 inst.capacity_queue)
            ):
                # (Past the return above the four gauges exist: "gauge is not None" holds.)
                if gauge is not None and (old is None or old[i] != figures[i]):
                    gauge.set(figures[i])
            # (no mutate: figures not kept would only write every gauge next time)
            self._published_gauges = figures  # pragma: no mutate

    def exposition(self) -> bytes:
        """The scrape body: every metric of this path's group in the Prometheus text format."""
        return self.group.exposition()

    # -- the prometheus_client objects --------------------------------------------------------

    def instruments(self) -> _Instruments:
        """The metric objects, made on first use (never at construction; see the design)."""
        return _made_once(self, "_instruments", self._lock, self._make_instruments)

    def _make_instruments(self) -> _Instruments:
        """Called once, with _lock held: this budget's children of the group's families."""
        f = self.group.families()
        budget = self.budget

        def admission(result: str) -> Counter:
            return f.admissions.labels(budget, result)

        gauges: Sequence[Gauge | None] = (
            [g.labels(budget) for g in f.gauges] if f.gauges is not None and not self.shared
            else (None,) * 4
        )
        granted, queue_full, timeout, cancelled, *_ = (admission(r) for r in RESULTS)
        return _Instruments(
            admissions=admission,
            granted=granted,
            queue_full=queue_full,
            timeout=timeout,
            cancelled=cancelled,
            hits=f.cache.labels(budget, "hit"),
            misses=f.cache.labels(budget, "miss"),
            stale=f.cache.labels(budget, "stale"),
            refreshed=f.refreshes.labels(budget, "done"),
            refresh_refused=f.refreshes.labels(budget, "refused"),
            refresh_failed=f.refreshes.labels(budget, "failed"),
            coalesced=f.coalesced.labels(budget),
            wait=f.wait.labels(budget),
            build=f.build.labels(budget),
            builds_active=gauges[0],
            queue_waiting=gauges[1],
            capacity_active=gauges[2],
            capacity_queue=gauges[3],
        )
