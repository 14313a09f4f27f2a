"""The key checks catch a broken limiter: each check of ``tests/support/limiter_checks.py``
passes on ColdLimiter and fails, for the reason it names, on a limiter changed on purpose
(no gate; a gate place kept when a waiter gives up; a gate place kept at promotion; a release
that frees nothing). The mutants of fair admission are in ``tests/test_fairness_mutants.py``.
"""

from __future__ import annotations

import queue
import types
from typing import Any

import pytest

from reachlimit import ColdLimiter
from reachlimit import _limiter as _limiter_module
from tests.support.limiter import leave_queue_keeping_the_place
from tests.support.limiter_checks import (
    check_gate_place_returned_after_cancel,
    check_gate_place_returned_after_promotion,
    check_gate_place_returned_after_timeout,
    check_queue_bound,
    check_slots_come_back,
)
from tests.support.threads import ThreadRunner

pytestmark = pytest.mark.timeout(30)


def test_the_checks_pass_on_the_real_limiter(threads: ThreadRunner) -> None:
    check_queue_bound(ColdLimiter, threads)
    check_gate_place_returned_after_timeout(ColdLimiter, threads)
    check_gate_place_returned_after_cancel(ColdLimiter, threads)
    check_gate_place_returned_after_promotion(ColdLimiter, threads)
    check_slots_come_back(ColdLimiter, threads)


class _GatelessQueue(queue.Queue):  # type: ignore[type-arg]
    """What the mutant builds for its gate: a queue that ignores ``maxsize``, so that no
    caller is ever refused. (``queue.Queue(maxsize=0)`` is unbounded.)"""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(0)


def test_a_limiter_without_the_gate_fails_the_queue_bound_check(
    monkeypatch: pytest.MonkeyPatch, threads: ThreadRunner
) -> None:
    # The limiter module's view of the ``queue`` module, with Queue swapped for a gate that
    # admits everyone: the limiter code itself is unchanged, it just has no bound any more.
    gateless = types.SimpleNamespace(Queue=_GatelessQueue, Full=queue.Full, Empty=queue.Empty)
    monkeypatch.setattr(_limiter_module, "_queue", gateless)
    with pytest.raises(AssertionError, match="queue bound broken"):
        check_queue_bound(ColdLimiter, threads)


# Each mutant below is the limiter's own method less one line; the bookkeeping of fair
# admission (each client's queue, the turn) is kept, so only the forgotten line shows. The
# one of ``_leave_queue`` is the real method run with the forgotten call made a no-op
# (``leave_queue_keeping_the_place``), so that it follows any change of the real one.


def _hand_off_keeping_the_place(self: ColdLimiter) -> None:
    if self._waiters:
        waiter = self._next_in_turn()  # mutant: forgets self._return_gate_place()
        waiter.granted = True
        waiter.cond.notify()
    else:
        self._active -= 1


TIMEOUT = (check_gate_place_returned_after_timeout, "gate place not returned after timeout")
CANCEL = (check_gate_place_returned_after_cancel, "gate place not returned after cancel")
PROMOTION = (check_gate_place_returned_after_promotion, "gate place not returned after promotion")


@pytest.mark.parametrize(
    ("attribute", "broken", "failing", "intact"),
    [
        # Keeps the place of a waiter that gives up: the promotion path is intact.
        pytest.param("_leave_queue", leave_queue_keeping_the_place, (TIMEOUT, CANCEL),
                     (PROMOTION,), id="waiter-that-gives-up"),
        # Keeps the place of a promoted waiter: the timeout and cancel paths are intact.
        pytest.param("_hand_off_or_free", _hand_off_keeping_the_place, (PROMOTION,),
                     (TIMEOUT, CANCEL), id="promoted-waiter"),
    ],
)
def test_a_limiter_keeping_a_gate_place_fails_the_check_for_it(
    monkeypatch: pytest.MonkeyPatch,
    threads: ThreadRunner,
    attribute: str,
    broken: Any,
    failing: tuple[tuple[Any, str], ...],
    intact: tuple[tuple[Any, str], ...],
) -> None:
    """The mutant fails each check of the path it broke, with that check's message, and
    passes the checks of the paths it left intact (it is caught for the right reason)."""
    monkeypatch.setattr(ColdLimiter, attribute, broken)
    for check, reason in failing:
        with pytest.raises(AssertionError, match=reason):
            check(ColdLimiter, threads)
    for check, _ in intact:
        check(ColdLimiter, threads)


def test_a_limiter_whose_release_frees_nothing_fails_the_slots_check(
    monkeypatch: pytest.MonkeyPatch, threads: ThreadRunner
) -> None:
    monkeypatch.setattr(ColdLimiter, "_hand_off_or_free", lambda self: None)
    with pytest.raises(AssertionError, match="slot not returned after release"):
        check_slots_come_back(ColdLimiter, threads)
