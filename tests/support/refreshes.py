"""Refreshes watched from outside the library: which refresh jobs of a ``Refresher`` wait or
run, and which threads are a refresher's, for the tests of stale answers.

design: :func:`install` (called once by ``tests/conftest.py``) wraps ``Refresher.submit``, a
public method, so that every job queued from then on notes, per refresher and key, that it
waits or runs until it has ended (a job the refresher drops, full or closed, was never
queued), and which thread ran it. :func:`refreshing` reads the first note, which is what a
test waits on before it looks at what a refresh stored; :func:`threads_of` the second (the
``paths`` fixture, :func:`closed_paths`, checks with it that a closed path left no refresher
thread behind). The
library keeps no such hook of its own. The notes live in weak dictionaries: a refresher that
dies takes its notes with it, so tests never see each other's jobs. A job dropped by
``close`` while it waited stays noted as waiting.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from reachlimit import ColdPath, Refresher
from tests.support.threads import JOIN_TIMEOUT

__all__ = ["Builds", "closed_paths", "install", "refreshing", "threads_of", "threads_named"]

_lock = threading.Lock()
# refresher -> key -> jobs of that key queued and not ended; guarded by _lock
_open: weakref.WeakKeyDictionary[Refresher, Counter[Hashable]] = weakref.WeakKeyDictionary()
# refresher -> the threads that ran its jobs; guarded by _lock
_ran: weakref.WeakKeyDictionary[Refresher, weakref.WeakSet[threading.Thread]] = (
    weakref.WeakKeyDictionary()
)
_submit = Refresher.submit


def _note(refresher: Refresher, key: Hashable, change: int) -> None:
    with _lock:
        counts = _open.setdefault(refresher, Counter())
        counts[key] += change


def _watched_submit(refresher: Refresher, key: Hashable, job: Callable[[], None]) -> bool:
    def run() -> None:
        with _lock:
            _ran.setdefault(refresher, weakref.WeakSet()).add(threading.current_thread())
        try:
            job()
        finally:
            _note(refresher, key, -1)

    _note(refresher, key, +1)  # before the job can run, and end
    queued = _submit(refresher, key, run)
    if not queued:
        _note(refresher, key, -1)
    return queued


def install() -> None:
    """Watch every refresh job queued from now on (once per process)."""
    Refresher.submit = _watched_submit  # type: ignore[method-assign]


def refreshing(refresher: Refresher, key: Hashable) -> bool:
    """Whether a job of ``key`` queued on ``refresher`` waits or runs."""
    with _lock:
        return _open.get(refresher, Counter())[key] > 0


def threads_named(prefix: str) -> list[threading.Thread]:
    """The threads alive whose name starts with ``prefix`` (a refresher's ``name``)."""
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def threads_of(refresher: Refresher) -> list[threading.Thread]:
    """The threads that ran a job of ``refresher`` and are still alive."""
    with _lock:
        ran = list(_ran.get(refresher, ()))
    return [t for t in ran if t.is_alive()]


def closed_paths() -> Iterator[list[ColdPath]]:
    """The list a test puts the ``ColdPath`` objects it makes in (the ``paths`` fixture of
    ``tests/conftest.py``): at teardown each is closed, and none of its refresher's threads
    may be left alive."""
    made: list[ColdPath] = []
    yield made
    for path in made:
        path.close(JOIN_TIMEOUT)
        assert not threads_of(path.refresher), "a closed path left a refresher thread alive"


class Builds:
    """A build for the stale tests: it counts its runs and answers ``"v<n>"`` (n: its runs so
    far); it says it started (``started``), waits while ``gate`` (when given) is not set,
    raises ``error`` once set, and answers ``gone[0]`` once set (the thing is gone:
    ``NOT_FOUND`` or None)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.runs = 0
        self.gate = gate
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.gone: list[Any] = []  # [what to answer] once the thing is gone
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.runs += 1
            n = self.runs
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(JOIN_TIMEOUT)
        if self.error is not None:
            raise self.error
        if self.gone:
            return self.gone[0]
        return f"v{n}"
