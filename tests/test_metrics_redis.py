"""Prometheus metrics over a shared (Redis-backed) limiter, in one process, real redis-server.

design:

    Two ``ReachMetrics`` on one Redis name stand for two workers (or two hosts) of one
    service. The promise under test: the gauges are the *service's* figures, read from Redis
    when a scrape arrives, so both "workers" answer the same whichever one is scraped and
    nothing is counted once per worker; admissions are still counted where they happened.
    A lost lease is made by pausing a holder's renewals (its client's, ``PausedRenewals``), and
    every wait is for a state of Redis (``wait_until``), never a sleep.
    The same figures across real gunicorn workers and servers are in
    ``tests/test_redis_gunicorn.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from reachlimit import Busy
from reachlimit.prometheus import MeteredSharedLimiter, ReachMetrics
from reachlimit.redis import RedisColdLimiter, RedisLimiterStats
from tests.support.redis_clients import PausedRenewals
from tests.support.redis_limiters import LimiterScript
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
def make_limiter(client: redis.Redis) -> Iterator[Callable[..., RedisColdLimiter]]:
    made: list[RedisColdLimiter] = []

    def make(**kwargs: Any) -> RedisColdLimiter:
        lim = RedisColdLimiter(kwargs.pop("client", client), **kwargs)
        made.append(lim)
        return lim

    yield make
    for lim in made:
        lim.close()


def scrape(metrics: ReachMetrics) -> dict[str, float]:
    """Every sample of one scrape, by name and labels (``name{label=value}``)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if (k, v) != ("budget", "default"))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_gauges_are_the_services_whichever_worker_is_scraped(
    make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    one = ReachMetrics(limiter=make_limiter(active=2, queue=1, wait=5.0))
    two = ReachMetrics(limiter=make_limiter(active=2, queue=1, wait=5.0))
    assert isinstance(one.limiter, MeteredSharedLimiter)
    first = one.limiter.acquire()
    second = two.limiter.acquire()
    a, b = scrape(one), scrape(two)
    for figures in (a, b):
        assert figures["reachlimit_builds_active"] == 2  # not 1 per worker, not 4
        assert figures["reachlimit_capacity_active"] == 2
        assert figures["reachlimit_capacity_queue"] == 1
        assert figures["reachlimit_queue_waiting"] == 0
        assert figures["reachlimit_backend_degraded"] == 0
        assert figures["reachlimit_lease_lost_total"] == 0
    # Admissions are counted where they were made: one grant in each "worker".
    assert a['reachlimit_admissions_total{result=granted}'] == 1
    assert b['reachlimit_admissions_total{result=granted}'] == 1
    first.release()
    second.release()
    assert scrape(two)["reachlimit_builds_active"] == 0


def test_a_refusal_and_a_waiter_are_seen_by_every_worker(
    client: redis.Redis, make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    one = ReachMetrics(limiter=make_limiter(active=1, queue=1, wait=30.0))
    two = ReachMetrics(limiter=make_limiter(active=1, queue=1, wait=30.0))
    held = one.limiter.acquire()
    waiter = two.limiter.inner
    assert isinstance(waiter, RedisColdLimiter)
    # A waiter admitted by the script itself (it never polls: a "ghost" that stays until its
    # presence ends), so the test decides when the queue is full.
    token = "ghost-token"
    assert LimiterScript(client, waiter).acquire(token)[0] == 2  # queued
    with pytest.raises(Busy) as refused:
        two.limiter.acquire()
    assert refused.value.reason == Busy.QUEUE_FULL
    for metrics in (one, two):
        figures = scrape(metrics)
        assert figures["reachlimit_builds_active"] == 1
        assert figures["reachlimit_queue_waiting"] == 1
    assert scrape(two)['reachlimit_admissions_total{result=queue_full}'] == 1
    assert scrape(one)['reachlimit_admissions_total{result=queue_full}'] == 0
    held.release()


def test_a_lost_lease_is_counted_once_for_the_service(
    make_client: Callable[..., PausedRenewals], make_limiter: Callable[..., RedisColdLimiter],
) -> None:
    stopped = make_client(PausedRenewals)
    paused = make_limiter(client=stopped, active=1, queue=0, lease=0.5)
    one = ReachMetrics(limiter=paused)
    two = ReachMetrics(limiter=make_limiter(active=1, queue=0, lease=0.5))
    stopped.paused.set()  # the holder's renewals stop, as a paused process's would
    stale = one.limiter.acquire()
    wait_until("the lease ran out", lambda: paused.stats().lease_lost == 1)
    stopped.paused.clear()
    for metrics in (one, two):
        assert scrape(metrics)["reachlimit_lease_lost_total"] == 1
    stale.release()  # late: frees nothing, counts nothing more
    assert scrape(two)["reachlimit_lease_lost_total"] == 1
    assert scrape(two)["reachlimit_builds_active"] == 0


class _Degraded:
    """A shared limiter on its fallback: this process's figures, ``degraded`` true."""

    def acquire(self, cancel: Any = None, client: Any = None) -> Any:
        raise Busy("unavailable", 2)

    def stats(self) -> RedisLimiterStats:
        return RedisLimiterStats(
            active=0, queued=0, peak_active=0, peak_queued=0, acquired=0, rejected_full=0,
            rejected_timeout=0, cancelled=0, capacity_active=2, capacity_queue=8, wait=3.0,
            backend="local", degraded=True, lease_lost=3,
        )


def test_degraded_is_read_from_the_limiter_at_scrape_time() -> None:
    metrics = ReachMetrics(limiter=_Degraded())
    figures = scrape(metrics)
    assert figures["reachlimit_backend_degraded"] == 1
    assert figures["reachlimit_lease_lost_total"] == 3
    with pytest.raises(Busy):
        metrics.limiter.acquire()
    # A refusal the backend made (not queue_full, not timeout) is still counted by its reason.
    assert scrape(metrics)['reachlimit_admissions_total{result=unavailable}'] == 1


def test_a_local_limiter_has_no_backend_figures() -> None:
    figures = scrape(ReachMetrics())
    assert "reachlimit_backend_degraded" not in figures
    assert "reachlimit_lease_lost_total" not in figures
