"""The thread under the renewer and the waker: one daemon thread per object, on demand.

Both keep one daemon thread per owning object, started by the first piece of work (and
started again in a process forked since: threads do not survive a fork), sleeping on one
condition, and stopped for good by ``close``. :class:`Daemon` is that part; a subclass
writes its loop (``_run``), which must return once ``_closed`` is set.
"""

from __future__ import annotations

import threading

__all__ = ["Daemon"]


class Daemon:
    """A daemon thread started on demand and stopped by :meth:`close` (module docstring)."""

    def __init__(self, thread_name: str, cond: threading.Condition) -> None:
        self._thread_name = thread_name
        self._cond = cond
        self._closed = False  # guarded by _cond
        self._thread: threading.Thread | None = None  # guarded by _cond

    @property
    def closed(self) -> bool:
        """Racy read: whether :meth:`close` was called."""
        return self._closed

    @property
    def thread(self) -> threading.Thread | None:
        """Racy read: the thread, once started."""
        return self._thread

    def _start_locked(self) -> None:
        """Start the thread unless it runs (or the object is closed); under ``_cond``."""
        if not self._closed and (self._thread is None or not self._thread.is_alive()):
            # None yet, or the process forked since: threads do not survive a fork.
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

    def _run(self) -> None:
        raise NotImplementedError
