"""Teaching a ``ColdLimiter`` its estimate of build time on a fake clock, for the tests of
no wasted waits (``Busy("deadline")``): ``promote`` (a waiter promoted behind a grant, so its
grant is timed) and ``learn`` (one timed grant per given duration, each held that long on the
clock and then released, the limiter idle at the end).

Only promoted grants are timed (the fast path never reads the clock), so each timing needs one
leader to queue behind another; nobody waits while the clock moves, so no deadline is near.
"""

from __future__ import annotations

from collections.abc import Sequence

from reachlimit import ColdLimiter, Grant
from tests.support.clock import FakeClock
from tests.support.limiter import start_acquire
from tests.support.threads import ThreadRunner
from tests.support.waiting import wait_until


def promote(lim: ColdLimiter, threads: ThreadRunner, holder: Grant, client: object = None
            ) -> Grant:
    """Queue one leader (of ``client``) behind ``holder`` (which must hold the last free
    slot, with nobody waiting), release ``holder`` and return the promoted leader's grant:
    a timed one, from the clock's time now."""
    queued = lim.stats().queued
    attempt = start_acquire(threads, lim, name="promoted", client=client)
    wait_until("the leader to queue", lambda: lim.stats().queued == queued + 1)
    holder.release()
    attempt.wait_done()
    assert attempt.grant is not None, attempt.error
    return attempt.grant


def learn(lim: ColdLimiter, clock: FakeClock, threads: ThreadRunner,
          durations: Sequence[float]) -> None:
    """Time one promoted grant per duration (held that long on ``clock``), in order, and
    release the last: the limiter is idle afterwards and its timings are ``durations``.
    Every slot but one must be held by the caller (or ``active`` be 1), and the durations
    must be well within the wait: once there is an estimate, the leader queued for the next
    timing is refused if its place (behind a holder the estimate says is not done) is not."""
    grant = lim.acquire()  # the fast path: not timed
    for seconds in durations:
        grant = promote(lim, threads, grant)  # the previous grant's timing recorded
        clock.advance(seconds)
    grant.release()
