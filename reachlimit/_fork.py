"""After a fork: the objects that keep daemon threads start afresh in the child.

design:

    A fork (gunicorn's ``preload_app``, ``multiprocessing`` with the fork start method, a
    plain ``os.fork()``) copies the whole memory of the process but only the thread that
    called it. An object that keeps daemon threads then holds, in the child, what threads
    that are not there were doing: a count of idle threads nobody will wake, the keys of
    jobs nobody runs, leases nobody should renew, and perhaps a lock that one of them held
    at that instant and nobody will ever release.

    ``reset_after_fork(obj, reset)`` puts ``obj`` in one weak dictionary (it keeps nothing
    alive); one ``os.register_at_fork(after_in_child=...)`` callback, registered once at
    import, calls ``reset(obj)`` for each object still alive in the child of every fork,
    inside ``os.fork()`` itself, while the child has its one thread and before its own code
    goes on, in the order the objects were registered (an object made from another, such as
    the path counters from their path, is reset after it). A ``reset`` replaces every lock
    and condition of the object with new ones (never acquiring the old: it may be held by a
    thread that is gone), forgets the threads and the work they held, and starts nothing:
    the next piece of work starts a thread, as it would in a new process. No other path
    checks for a fork (no ``os.getpid()`` per call), so the hot paths cost what they did.

    Used by the Refresher (``reachlimit._refresh``) and by every daemon of
    ``reachlimit.redis`` (its ``_daemon.Daemon`` base: lease renewers, the waker, probes;
    and the path counters' flusher).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["reset_after_fork"]

log = logging.getLogger("reachlimit")

T = TypeVar("T")

# Object -> its reset. Added to by any thread (a dict store is atomic); read only in the child
# of a fork, where one thread is left. Weak keys: an object that dies drops out by itself.
_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def reset_after_fork(obj: T, reset: Callable[[T], None]) -> None:
    """Call ``reset(obj)`` in the child of every fork from now on, for as long as ``obj``
    lives (module design). ``reset`` must not hold a reference to ``obj`` (pass a function
    or an unbound method), must not acquire any of its old locks and must start no thread."""
    _resets[obj] = reset


def _in_child() -> None:
    for obj, reset in list(_resets.items()):
        try:
            reset(obj)
        except Exception:  # never let one object's reset break the child's fork
            # pragma: no mutate start (a log's words)
            log.exception("reachlimit: resetting %r after a fork failed", obj)
            # pragma: no mutate end


os.register_at_fork(after_in_child=_in_child)
