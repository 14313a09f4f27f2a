"""ColdLimiter's arguments, defaults and exceptions: what a caller can rely on before any
concurrency is involved.
"""

from __future__ import annotations

from typing import Any

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter, ReachLimitError
from tests.support.arguments import assert_value_error, invalid_arguments
from tests.support.clock import FakeClock
from tests.support.threads import ThreadRunner

pytestmark = pytest.mark.timeout(30)


@invalid_arguments(
    active=("active >= 1", [0, -1, True, 1.5, "2"]),
    queue=("queue >= 0", [-1, True, 2.0]),
    wait=("wait > 0", [0, -0.5, float("nan"), float("inf"), True, "3"]),
    retry_after=("retry_after >= 1", [0, -2, 1.5, True]),
)
def test_invalid_arguments_raise_value_error_with_exact_message(
    kwargs: dict[str, Any], message: str
) -> None:
    assert_value_error(lambda: ColdLimiter(**kwargs), message)


def test_defaults_and_valid_edges() -> None:
    lim = ColdLimiter()
    s = lim.stats()
    assert (s.capacity_active, s.capacity_queue, s.wait) == (2, 8, 3.0)
    assert lim.retry_after == 2
    assert (lim.capacity_active, lim.capacity_queue, lim.wait) == (2, 8, 3.0)
    edge = ColdLimiter(active=1, queue=0, wait=0.001, retry_after=1)
    assert (edge.capacity_active, edge.capacity_queue, edge.retry_after) == (1, 0, 1)
    assert isinstance(ColdLimiter(wait=2).wait, float)
    assert "active=0/2" in repr(lim) and "queued=0/8" in repr(lim)


def test_cancel_poll_interval_is_at_most_50ms() -> None:
    assert 0 < ColdLimiter.CANCEL_POLL_INTERVAL <= 0.05


def test_busy_and_cancelled_share_the_package_base() -> None:
    assert issubclass(Busy, ReachLimitError) and issubclass(Cancelled, ReachLimitError)
    assert issubclass(ReachLimitError, Exception)
    busy = Busy("queue_full", 2)
    assert (busy.reason, busy.retry_after) == ("queue_full", 2)
    assert (Busy.QUEUE_FULL, Busy.TIMEOUT) == ("queue_full", "timeout")
    assert str(busy) == "busy (queue_full); retry after 2 s"
    assert str(Cancelled()) == "cancelled while waiting"


def test_busy_carries_the_limiters_retry_after(threads: ThreadRunner) -> None:
    lim = ColdLimiter(active=1, queue=0, retry_after=7)
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
    assert (info.value.reason, info.value.retry_after) == ("queue_full", 7)
    lim = ColdLimiter(active=1, queue=1, wait=1.0, retry_after=5, clock=FakeClock(step=10.0))
    with lim.acquire():
        with pytest.raises(Busy) as info:
            lim.acquire()
    assert (info.value.reason, info.value.retry_after) == ("timeout", 5)
