"""The refresher: a small bounded set of daemon threads that run ColdPath's refreshes.

design:

    A refresh (a stale entry, or a fresh one drawn for early refresh) must never delay the
    answer that asked for it, nor run on that request's thread or connection: ``submit``
    only records the job and returns. Jobs wait in an insertion-ordered dict by key, so a
    key asked for again while its refresh waits or runs is not queued twice (a herd of stale
    hits starts one refresh per process; the singleflight makes it one per service).

    Threads are started on the first submit, one more whenever a job waits and no thread
    is idle, up to ``threads`` (ColdPath gives its limiter's ``active``: a refresh holds a
    build slot while it builds, so more threads than slots would only wait). They stay,
    idle on one condition, until :meth:`Refresher.close`. At most ``max_pending`` jobs
    wait; more are dropped (counted in ``dropped``): the entries they were for stay stale
    and are asked for again by the next reader.

    After a fork (``reachlimit._fork``) the child has none of the threads: it gets a new
    condition (the old one's lock may have been held by a thread that is gone), no
    threads, no idle count and no jobs, waiting or running (the parent's to run); its next
    submit starts a thread, as in a new process.

    ``_cond`` guards the jobs, the running keys, the threads and the flags; no job runs
    under it. A job's own exceptions are its business (ColdPath's jobs catch everything);
    one that escapes is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

from ._fork import reset_after_fork

__all__ = ["Refresher", "RefreshBackoff"]

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
        # A Condition given None makes an RLock of its own: nothing here takes it twice.
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[Hashable, Callable[[], None]] = {}  # guarded by _cond
        self._running: set[Hashable] = set()  # guarded by _cond
        self._workers: list[threading.Thread] = []  # guarded by _cond
        self._idle = 0  # guarded by _cond
        self._closed = False  # guarded by _cond; only tested for truth (None would do)
        #: Jobs not queued because ``max_pending`` were waiting (racy read).
        self.dropped = 0
        reset_after_fork(self, Refresher._forked)

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

    def close(self, timeout: float = 5.0) -> None:  # pragma: no mutate (the bound's seconds)
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

    def _forked(self) -> None:
        """In the child of a fork, its one thread running (module design): start afresh."""
        self._cond = threading.Condition(threading.Lock())  # an RLock of None's: the same here
        self._pending = {}
        self._running = set()
        self._workers = []
        self._idle = 0

    def _start_locked(self) -> None:
        self._workers = [t for t in self._workers if t.is_alive()]
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
                log.exception("reachlimit: a refresh of %r failed", key)  # pragma: no mutate (log)
            finally:
                with self._cond:
                    self._running.discard(key)


class RefreshBackoff:
    """The keys whose last refresh ended without a value (refused, failed, or found nothing)
    and that were not built since: until when each is not refreshed again, and whether its
    episode of failures was logged, so that a failing refresh is tried once per backoff and
    logged once per key and episode, not once per stale hit.

    Times are the caller's clock's (ColdPath's ``clock``, monotonic). At most ``LIMIT`` keys
    are remembered, the one that ended longest ago forgotten first (forgotten, a key is at
    worst refreshed and logged once more). ``_lock`` guards the dictionary; ``__bool__``
    reads it without the lock, so that the common case, no key held back, costs neither the
    lock nor the clock.
    """

    LIMIT = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # guarded by _lock: key -> (its episode logged, not refreshed before this time)
        self._keys: dict[Hashable, tuple[bool, float]] = {}
        reset_after_fork(self, RefreshBackoff._forked)

    def __bool__(self) -> bool:
        """Racy read: whether any key is remembered."""
        return bool(self._keys)

    def allows(self, key: Hashable, now: float) -> bool:
        """Whether a refresh of ``key`` may be asked for at ``now`` (no backoff of it then)."""
        with self._lock:
            held = self._keys.get(key)
        return held is None or now >= held[1]

    def hold(self, key: Hashable, until: float, why: str | None) -> None:
        """A refresh of ``key`` ended without a value: none is asked for before ``until``.
        ``why`` (a failure: refused or failed) is logged if it is the first of its episode;
        None (the build found nothing) is not."""
        with self._lock:
            was = self._keys.pop(key, None)  # put back at the end: the newest
            logged = was is not None and was[0]
            first = why is not None and not logged
            if was is None and len(self._keys) >= self.LIMIT:
                del self._keys[next(iter(self._keys))]
            self._keys[key] = (logged or first, until)
        if first:
            # pragma: no mutate start (a log's words; how often it is logged is tested)
            log.warning(
                "reachlimit: the refresh of %r was %s; its stale entry is served until its "
                "stale window ends and not refreshed again for a backoff (logged once until "
                "it is built again)", key, why,
            )
            # pragma: no mutate end

    def ended(self, key: Hashable) -> None:
        """``key`` was built: no backoff, and its next failure starts a new episode."""
        if self._keys:  # racy read, on purpose: the common case costs no lock
            with self._lock:
                self._keys.pop(key, None)

    def _forked(self) -> None:
        """In the child of a fork (``reachlimit._fork``): a new lock, the keys kept."""
        self._lock = threading.Lock()
