"""Probes of a ``ColdLimiter`` for the tests: calls of ``acquire`` in threads, cancel objects
that never block or that pause on cue, and looks at its state under its own lock.

The white-box reads (``gate_size``, ``check_white_box``) take the limiter's lock, where the
library itself touches the gate, so what they read is never half an update.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from reachlimit import Busy, Cancelled, ColdLimiter, Grant, LimiterStats
from reachlimit import _limiter as _limiter_module
from tests.support.threads import JOIN_TIMEOUT, Outcome, ThreadRunner, start_call

#: The real method, taken before any test patches a mutant over it.
_REAL_LEAVE_QUEUE = ColdLimiter._leave_queue


def leave_queue_keeping_the_place(lim: ColdLimiter, waiter: Any) -> None:
    """``ColdLimiter._leave_queue`` less its last step, for the mutants of
    ``tests/test_limiter_mutants.py`` and ``tests/test_fairness_mutants.py``: the waiter is
    taken out of the queue and out of its client's by the real bookkeeping (each client's
    queue, the sole client), and its gate place is kept (``_return_gate_place`` is a no-op for
    the call). Called with the limiter's lock held, as the real method is."""
    lim._return_gate_place = lambda: None  # type: ignore[method-assign]
    try:
        _REAL_LEAVE_QUEUE(lim, waiter)
    finally:
        del lim._return_gate_place


#: The figures ``LimiterStats.as_dict()`` promises (the contract of ``stats()``).
# Kept apart from the list in reachlimit/redis/_stats.py: this is the contract the tests
# hold the library to, so it is written out here, never read from the library.
LIMITER_FIELDS = frozenset(
    {
        "active",
        "queued",
        "peak_active",
        "peak_queued",
        "acquired",
        "rejected_full",
        "rejected_timeout",
        "cancelled",
        "capacity_active",
        "capacity_queue",
        "wait",
        "displaced",
        "deadline",
    }
)
#: The figures ``ColdPathStats.as_dict()`` adds to those of its limiter.
PATH_FIELDS = frozenset(
    {"hits", "misses", "builds", "coalesced", "backend", "degraded", "lease_lost"}
)


@contextlib.contextmanager
def slots_held(limiter: ColdLimiter) -> Iterator[list[Grant]]:
    """Every build slot of ``limiter``, held by the test until the block ends."""
    grants = [limiter.acquire() for _ in range(limiter.capacity_active)]
    try:
        yield grants
    finally:
        for grant in grants:
            grant.__exit__(None, None, None)


class Attempt(Outcome):
    """One ``limiter.acquire(cancel)`` call running in its own thread (:func:`start_acquire`).

    ``done`` is set once the call returned (``grant``) or raised (``error``); the thread then
    ends, and the test releases ``grant`` itself (a grant may be released from any thread).
    """

    @property
    def grant(self) -> Grant | None:
        grant: Grant | None = self.value
        return grant

    def wait_done(self, timeout: float = JOIN_TIMEOUT) -> None:
        assert self.done.wait(timeout), f"{self.name}: acquire() did not return in {timeout} s"

    def release(self) -> None:
        assert self.grant is not None, f"{self.name} holds no grant"
        self.grant.release()


def start_acquire(
    threads: ThreadRunner,
    limiter: Any,
    cancel: Any = None,
    name: str = "attempt",
    on_grant: Callable[[Attempt], None] | None = None,
    client: Any = None,
) -> Attempt:
    """``limiter.acquire(cancel)`` (``acquire(cancel, client)`` when ``client`` is given) in a
    thread of ``threads``; ``on_grant(attempt)`` runs in that thread once it holds the grant,
    before ``done`` is set."""
    def call() -> Any:
        return limiter.acquire(cancel) if client is None else limiter.acquire(cancel, client)

    return start_call(threads, call, name=name, outcome=Attempt(name), then=on_grant)


class ProbeCancel:
    """A cancel object that reads "not set" once, then "set" for ever.

    ``acquire(ProbeCancel())`` therefore never blocks: the first read is the "already
    cancelled?" check, so a free slot is taken on the fast path; otherwise the caller is
    admitted (or refused) and, if admitted, gives up on its first look at the cancel object.
    It is how a test asks "is a slot free right now?" without risking a hang.
    """

    def __init__(self) -> None:
        self.calls = 0

    def is_set(self) -> bool:
        self.calls += 1
        return self.calls > 1


class PausingCancel:
    """Reads "not set"; once ``pause`` is set, the next ``is_set()`` call blocks (``paused``
    is set) until ``resume``; it then returns ``result`` or raises ``error``. It holds a
    waiter between two wait slices, outside the lock, while the test acts."""

    def __init__(self) -> None:
        self.pause = threading.Event()
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.result = False
        self.error: BaseException | None = None

    def is_set(self) -> bool:
        if self.pause.is_set() and not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(5.0), "PausingCancel never resumed"
            if self.error is not None:
                raise self.error
            return self.result
        return False


def gate_size(lim: ColdLimiter) -> int:
    """Gate places taken. Read under the limiter's lock, where the library touches the gate."""
    assert lim._gate is not None
    with lim._lock:
        return lim._gate.qsize()


def check_white_box(lim: ColdLimiter) -> None:
    """Under the limiter's own lock: one gate place per queued waiter, no idle slot while
    anybody waits (a slot that is neither held nor handed on is a leak), and the refusal
    path's note of the one waiting client agrees with the clients that wait."""
    with lim._lock:
        waiters = len(lim._waiters)
        gate = lim._gate.qsize() if lim._gate is not None else 0
        active = lim._active
        clients = list(lim._clients)
        alone = lim._alone_in_queue
    assert gate == waiters, f"gate holds {gate} places for {waiters} queued waiters"
    if len(clients) == 1:
        assert alone is clients[0], f"the one waiting client is {clients[0]!r}, noted {alone!r}"
    else:
        assert alone is _limiter_module._NOT_ALONE, f"{len(clients)} clients wait, noted {alone!r}"
    assert waiters == 0 or active == lim.capacity_active, (
        f"{waiters} waiter(s) queued while only {active}/{lim.capacity_active} slots are held"
    )


def try_acquire_now(lim: ColdLimiter) -> Grant | None:
    """A grant if a slot is free right now, else None. Never blocks (see ProbeCancel)."""
    try:
        return lim.acquire(ProbeCancel())
    except (Busy, Cancelled):
        return None


def assert_exact_capacity(lim: ColdLimiter) -> None:
    """With nobody else around: exactly ``capacity_active`` slots can be taken at once, no
    fewer (a slot lost) and no more (a slot double counted); then they are given back."""
    grants = [try_acquire_now(lim) for _ in range(lim.capacity_active)]
    taken = [g for g in grants if g is not None]
    assert len(taken) == lim.capacity_active, (
        f"slot lost: only {len(taken)} of {lim.capacity_active} slots could be taken"
    )
    extra = try_acquire_now(lim)
    if extra is not None:
        extra.release()
    assert extra is None, "slot double counted: one more grant than capacity_active"
    for grant in taken:
        grant.release()
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)


def stats_diff(before: LimiterStats, after: LimiterStats) -> dict[str, tuple[Any, Any]]:
    """The figures that changed from ``before`` to ``after``: ``{name: (before, after)}``."""
    b, a = before.as_dict(), after.as_dict()
    return {k: (b[k], a[k]) for k in b if b[k] != a[k]}
