"""The thread under the renewer, the waker and the probes: one daemon thread per object, on
demand, started afresh in a forked child.

design:

    Each keeps one daemon thread per owning object, started by the first piece of work,
    sleeping on one condition, and stopped for good by ``close``. :class:`Daemon` is that
    part; a subclass writes its loop (``_run``), which must return once ``_closed`` is set,
    and reaches its lock and condition as ``self.lock`` and ``self._cond`` every time (never
    a reference of its own: both are replaced after a fork).

    After a fork (``reachlimit._fork``), in the child: the thread is not there and the lock
    may have been held by it at that instant, so the child gets a new lock and condition and
    no thread, and the subclass's ``_after_fork`` forgets what the thread was working on (the
    parent's leases, its wake-up times...). The next piece of work starts a thread, as in a
    new process; nothing on any other path checks for a fork. A closed object stays closed.

    ``lock`` guards ``_closed``, ``_thread`` and whatever the subclass says it guards; the
    condition is on it, notified by ``close`` and by the subclass's own work.
"""

from __future__ import annotations

import threading

from .._fork import reset_after_fork

__all__ = ["Daemon"]


class Daemon:
    """A daemon thread started on demand and stopped by :meth:`close` (module design)."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._closed = False  # guarded by lock
        self._thread: threading.Thread | None = None  # guarded by lock
        self._idle = False  # guarded by lock: a rounds thread waiting untimed for work
        reset_after_fork(self, Daemon._forked)

    @property
    def closed(self) -> bool:
        """Racy read: whether :meth:`close` was called."""
        return self._closed

    def _start_locked(self) -> None:
        """Start the thread unless it runs (or the object is closed); under ``lock``."""
        if not self._closed and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread for good (joined for up to ``timeout`` seconds)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _wake_locked(self) -> None:
        """New work for a rounds thread (``_next_round_locked``), under ``lock``: wake it if
        it waits untimed."""
        if self._idle:
            self._idle = False
            self._cond.notify()

    def _next_round_locked(self, busy: bool, interval: float) -> bool:
        """Pacing for a thread that works in rounds (the renewer, the republisher), under
        ``lock``: with no work (``busy`` False) wait untimed until ``_wake_locked`` or
        ``close``; then wait one whole ``interval`` (so work that comes and goes wakes the
        thread at most once an interval). False once closed: the loop returns."""
        if not self._closed and not busy:
            self._idle = True
            while not self._closed and self._idle:
                self._cond.wait()
            self._idle = False
        if self._closed:
            return False
        self._cond.wait(interval)
        return not self._closed

    def _run(self) -> None:
        raise NotImplementedError

    def _after_fork(self) -> None:
        """In a forked child (the only thread there; no lock needed): forget what the
        parent's thread was working on. Nothing to forget here."""

    def _forked(self) -> None:
        """In a forked child (module design): a new lock and condition, no thread."""
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._thread = None
        self._idle = False
        self._after_fork()
