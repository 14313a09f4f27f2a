"""The refresher: a small bounded set of daemon threads that run ColdPath's refreshes.

design:

    A refresh (a stale entry, or a fresh one drawn for early refresh) must never delay the
    answer that asked for it, nor run on that request's thread or connection: ``submit``
    only records the job and returns. Jobs wait in an insertion-ordered dict by key, so a
    key asked for again while its refresh waits or runs is not queued twice (a herd of stale
    hits starts one refresh per process; the singleflight makes it one per service).

    Threads are started on the first submit, one more whenever a job waits and no thread
    is idle, up to ``threads`` (ColdPath gives its limiter's ``active``: a refresh holds a
    build slot while it builds, so more threads than slots would only wait), and again in
    a process forked since (threads do not survive a fork). They stay, idle on one
    condition, until :meth:`Refresher.close`. At most ``max_pending`` jobs wait; more are
    dropped (counted in ``dropped``): the entries they were for stay stale and are asked
    for again by the next reader.

    ``_cond`` guards the jobs, the running keys, the threads and the flags; no job runs
    under it. A job's own exceptions are its business (ColdPath's jobs catch everything);
    one that escapes is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

__all__ = ["Refresher", "Episodes"]

log = logging.getLogger("reachlimit")


class Refresher:
    """Runs refresh jobs by key on at most ``threads`` daemon threads (module design)."""

    def __init__(
        self, threads: int, *, max_pending: int = 256, name: str = "reachlimit-refresher"
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError("threads >= 1")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError("max_pending >= 1")
        self.threads = threads
        self.max_pending = max_pending
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[Hashable, Callable[[], None]] = {}  # guarded by _cond
        self._running: set[Hashable] = set()  # guarded by _cond
        self._workers: list[threading.Thread] = []  # guarded by _cond
        self._idle = 0  # guarded by _cond
        self._closed = False  # guarded by _cond
        #: Jobs not queued because ``max_pending`` were waiting (racy read).
        self.dropped = 0

    def submit(self, key: Hashable, job: Callable[[], None]) -> bool:
        """Run ``job`` soon on a refresher thread, unless a job for ``key`` waits or runs
        already (or the refresher is closed, or full). True if it was queued."""
        with self._cond:
            if self._closed or key in self._pending or key in self._running:
                return False
            if len(self._pending) >= self.max_pending:
                self.dropped += 1
                return False
            self._pending[key] = job
            self._cond.notify()
            if self._idle < len(self._pending):  # the idle threads are not enough
                self._start_locked()
            return True

    def busy(self, key: Hashable) -> bool:
        """Whether a job for ``key`` waits or runs (a racy read, for tests and figures)."""
        return key in self._pending or key in self._running

    @property
    def alive(self) -> int:
        """How many refresher threads are alive (racy read)."""
        return sum(1 for t in self._workers if t.is_alive())

    def close(self, timeout: float = 5.0) -> None:
        """Stop for good: jobs still waiting are dropped, running ones finish; every thread
        is joined for up to ``timeout`` seconds in all."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            workers = list(self._workers)
        for thread in workers:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def _start_locked(self) -> None:
        self._workers = [t for t in self._workers if t.is_alive()]  # a fork leaves none
        if len(self._workers) >= self.threads:
            return
        thread = threading.Thread(
            target=self._run, name=f"{self._name}-{len(self._workers) + 1}", daemon=True
        )
        self._workers.append(thread)
        thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._pending:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if self._closed:
                    return
                key = next(iter(self._pending))
                job = self._pending.pop(key)
                self._running.add(key)
            try:
                job()
            except BaseException:  # a job's own business; never the end of the thread
                log.exception("reachlimit: a refresh of %r failed", key)
            finally:
                with self._cond:
                    self._running.discard(key)


class Episodes:
    """The keys whose refresh was refused or failed and that were not built since, so that a
    failing refresh is logged once per key and episode, not once per try. At most ``LIMIT``
    keys are remembered (the oldest episode is forgotten first)."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[Hashable, None] = {}  # guarded by _lock

    def failed(self, key: Hashable, why: str) -> None:
        """A refresh of ``key`` ended without a value (``why``): logged if it is the first of
        its episode."""
        with self._lock:
            first = key not in self._failing
            if first:
                if len(self._failing) >= self.LIMIT:
                    del self._failing[next(iter(self._failing))]
                self._failing[key] = None
        if first:
            log.warning(
                "reachlimit: the refresh of %r was %s; its stale entry is served until its "
                "stale window ends (logged once until it is built again)", key, why,
            )

    def ended(self, key: Hashable) -> None:
        """``key`` was built: its next failure starts a new episode."""
        if self._failing:  # racy read, on purpose: the common case costs no lock
            with self._lock:
                self._failing.pop(key, None)
