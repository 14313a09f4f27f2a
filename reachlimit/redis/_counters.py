"""The cold path's own counters (hits, misses, builds, coalesced, stale, refreshes) added up
over every process.

design:

    The gauges of a shared limiter are exact because every admission goes through Redis. The
    path's counters move on the warm path, where a round trip per hit would cost more than
    the hit itself; so each process counts in memory, as ``ColdPath`` always does, and a
    daemon thread adds what changed since its last flush to one Redis hash, about once a
    second:

        {<prefix>:<name>}:path   HASH  the fields of PathCounts (HINCRBY, one pipeline)

    The hash carries the limiter's hash tag, so the pipeline touches one Cluster slot.
    ``totals()`` first flushes this process's own changes (so the process that answers a
    health check is exact), then reads the hash: every process answers the same figures, each
    other process at most one flush interval behind.

    The thread is started by the first request the process serves (``ensure_running``), never
    at construction: under a preloading server (gunicorn ``preload_app``) the master builds the
    app and forks, and a thread does not survive a fork. After any fork (``reachlimit._fork``)
    the child forgets the parent's thread and gets new locks (one may have been held at that
    instant by a thread that is not there), and takes the counts it inherited as flushed:
    what the parent had not flushed yet is the parent's to flush, so the child adds only what
    it counts itself. Its first request starts its own thread.

    A flush that fails (Redis down) keeps its delta for the next one: nothing is lost while
    Redis is away, nothing is added twice (a pipeline that fails part-way is the one case that
    can add some counters twice; counters are figures for people, not limits). A Redis
    restarted empty starts the totals again from what is flushed next.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from .._fork import reset_after_fork
from .._path import ColdPath, ColdPathStats, PathCounts
from ._common import REDIS_ERRORS, Client

__all__ = ["SharedPathCounters"]

log = logging.getLogger("reachlimit")

_FIELDS = PathCounts._fields  # hits, misses, builds, coalesced, stale and the refreshes


class SharedPathCounters:
    """The counters of ``path`` in this process, added to the service's totals in Redis.

    ``client`` is a ``redis.Redis``; ``name`` and ``prefix`` are the shared limiter's (the
    hash lives under its hash tag)."""

    def __init__(
        self,
        client: Client,
        path: ColdPath,
        name: str = "reachlimit",
        *,
        prefix: str = "reachlimit",
        interval: float = 1.0,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval > 0")
        self._client = client
        self._path = path
        self.key = "{" + prefix + ":" + name + "}:path"
        self._interval = float(interval)
        self._flush_lock = threading.Lock()  # one flush at a time: thread and totals()
        self._flushed: tuple[int, ...] = (0,) * len(_FIELDS)  # guarded by _flush_lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        reset_after_fork(self, SharedPathCounters._forked)

    # -- the thread ---------------------------------------------------------------------

    def ensure_running(self) -> None:
        """Start the flushing thread of this process if it is not running (cheap when it is)."""
        if self._thread is not None or self._stop.is_set():
            return
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="reachlimit-counters", daemon=True
                )
                self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Flush once more and stop the thread for good."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        try:
            self.flush()
        except REDIS_ERRORS:
            log.debug("reachlimit: last flush of the path counters failed", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except REDIS_ERRORS:
                pass  # kept for the next flush; the fallback layer logs the outage
            except Exception:  # never let the thread die silently
                log.exception("reachlimit: flushing the path counters failed")

    def _forked(self) -> None:
        """In a forked child (module design): no thread, new locks and a new stop flag (an
        Event has a lock of its own), stopped if this object was; the counts inherited are
        the parent's. (The path was made first, so its own lock was replaced already.)"""
        self._flushed = self.local()
        stopped = self._stop.is_set()
        self._stop = threading.Event()
        if stopped:
            self._stop.set()
        self._thread = None
        self._start_lock = threading.Lock()
        self._flush_lock = threading.Lock()

    # -- flushing and reading -------------------------------------------------------------

    def local(self) -> tuple[int, ...]:
        """This process's counters, in the order of ``_FIELDS`` (ColdPath's ``PathCounts``)."""
        return tuple(self._path.counts())

    def flush(self) -> None:
        """Add this process's changes since the last flush to the totals in Redis."""
        with self._flush_lock:
            now = self.local()
            delta = [a - b for a, b in zip(now, self._flushed, strict=True)]
            if not any(delta):
                return
            pipe = self._client.pipeline(transaction=False)
            for field, step in zip(_FIELDS, delta, strict=True):
                if step:
                    pipe.hincrby(self.key, field, step)
            pipe.execute()
            self._flushed = now

    def totals(self) -> dict[str, int]:
        """The service's counters: this process's changes flushed first, then the hash read.
        Raises redis-py's errors."""
        self.flush()
        raw: dict[Any, Any] = self._client.hgetall(self.key)
        found = {
            (k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()
        }
        return {field: found.get(field, 0) for field in _FIELDS}

    def apply(self, stats: ColdPathStats) -> ColdPathStats:
        """``stats`` with the service's counters in place of this process's."""
        totals = self.totals()
        # Named one by one: ColdPathStats also has str and bool fields, which a ** of ints
        # cannot be checked against.
        return dataclasses.replace(
            stats,
            hits=totals["hits"],
            misses=totals["misses"],
            builds=totals["builds"],
            coalesced=totals["coalesced"],
            stale=totals["stale"],
        )
