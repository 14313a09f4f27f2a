"""Threads a test starts: each one joined with a timeout, and what each call returned.

:class:`ThreadRunner` is behind the ``threads`` fixture: at teardown it joins every thread it
started, and the test fails if one is still alive or raised. :func:`start_call` runs one call
in such a thread and hands back its :class:`Outcome`, to be read once ``done`` is set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tests.support.waiting import wait_until

#: How long a test waits for a thread it started to finish (or a call in it to return).
#: Generous on purpose: it only matters when something is already wrong.
JOIN_TIMEOUT = 5.0

OutcomeT = TypeVar("OutcomeT", bound="Outcome")


class ThreadRunner:
    """Starts daemon threads and remembers them, so that none can outlive its test unseen.

    An exception escaping a thread's function is recorded; :meth:`join_all` fails with it
    unless the test took it with :meth:`take_errors`.
    """

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []  # guarded by _lock
        self._errors: list[tuple[str, BaseException]] = []  # guarded by _lock
        self._lock = threading.Lock()

    def start(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any
    ) -> threading.Thread:
        thread_name = name or getattr(fn, "__name__", "worker")

        def run() -> None:
            try:
                fn(*args, **kwargs)
            except BaseException as exc:  # recorded, reported at join
                with self._lock:
                    self._errors.append((thread_name, exc))

        thread = threading.Thread(target=run, name=thread_name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()
        return thread

    def join_all(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Join every thread started so far, within ``timeout`` seconds in all; fail (with
        ``AssertionError``) if any is still alive or raised."""
        with self._lock:
            threads, self._threads = self._threads, []
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise AssertionError(f"threads still alive after {timeout} s: {alive}")
        errors = self.take_errors()
        if errors:
            name, exc = errors[0]
            raise AssertionError(f"{len(errors)} thread(s) raised; first: {name}: {exc!r}") from exc

    def take_errors(self) -> list[tuple[str, BaseException]]:
        with self._lock:
            errors, self._errors = self._errors, []
        return errors


class Outcome:
    """What one call running in its own thread returned (``value``) or raised (``error``).

    Written by that thread only; ``done`` is set once it has, so read the rest after that."""

    def __init__(self, name: str = "call") -> None:
        self.name = name
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def wait_done(self, timeout: float = JOIN_TIMEOUT) -> None:
        assert self.done.wait(timeout), f"{self.name}: the call did not return in {timeout} s"


def start_call(
    threads: ThreadRunner,
    fn: Callable[[], Any],
    *,
    name: str = "call",
    outcome: OutcomeT | None = None,
    before: Callable[[], None] | None = None,
    then: Callable[[OutcomeT], None] | None = None,
) -> OutcomeT:
    """Run ``fn()`` in a thread of ``threads``; its :class:`Outcome` (``outcome``, or a new
    one) gets what it returned or raised. ``before()`` runs in the thread first (a Barrier
    wait, say); ``then(outcome)`` runs there after a return, before ``done`` is set."""
    result: Any = outcome if outcome is not None else Outcome(name)

    def run() -> None:
        try:
            if before is not None:
                before()
            result.value = fn()
        except BaseException as exc:  # the test reads it from the outcome
            result.error = exc
            result.done.set()
            return
        if then is not None:
            then(result)
        result.done.set()

    threads.start(run, name=name)
    return result  # type: ignore[no-any-return]


class HeldCall:
    """A leader's ``fn`` that says it started (``started``), then blocks until the test sets
    ``finish`` (for ``HOLD`` seconds at most); counts its runs; returns ``result`` or raises
    ``error``."""

    HOLD = 5.0

    def __init__(self, result: Any = "value", error: BaseException | None = None) -> None:
        self.started = threading.Event()
        self.finish = threading.Event()
        self.result = result
        self.error = error
        self.runs = 0
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.runs += 1
        self.started.set()
        assert self.finish.wait(self.HOLD), "the test never let the leader finish"
        if self.error is not None:
            raise self.error
        return self.result


def leader_and_followers(
    start: Callable[[str], OutcomeT], held: threading.Event, count: int,
    following: Callable[[], int],
) -> tuple[OutcomeT, list[OutcomeT]]:
    """A leader and ``count`` followers of one key: ``start("leader")``, and once ``held`` is
    set (the leader is held where the test holds it), ``start("f0")``, ``start("f1")``...;
    returns them once ``following()`` counts all the followers joined."""
    leader = start("leader")
    assert held.wait(JOIN_TIMEOUT)
    followers = [start(f"f{i}") for i in range(count)]
    wait_until(f"{count} followers", lambda: following() == count)
    return leader, followers
