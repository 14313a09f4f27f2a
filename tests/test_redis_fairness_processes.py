"""Fair admission across real processes: each client's leaders in a process of its own
(``tests/support/redis_worker.py``), one queue in Redis.

A crawler process fills the queue; leaders of two other clients, each in its own process,
displace the crawler's newest waiters (told so in the crawler's process, through their
doorbells); freed slots then go to the three clients in turn. Then the crawler's process is
SIGKILLed with waiters queued: the places it held come back, and the places its displaced
waiters lost stay with the newcomers. Every process is stopped by its PID at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from reachlimit.redis import RedisColdLimiter
from tests.support.redis_procs import (
    DEADLINE,
    Worker,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture
def watch(client: redis.Redis) -> Iterator[RedisColdLimiter]:
    """The test process's own limiter on the workers' budget (1 slot, 4 places)."""
    lim = RedisColdLimiter(client, "procs", 1, 4, 60.0)
    yield lim
    lim.close()


def _queue(worker: Worker, attempt: str, client: str, watch: RedisColdLimiter) -> None:
    """``attempt`` of ``client`` joins, alone: the next only once the queue counts it."""
    before = watch.stats()
    worker.send(f"acquire {attempt} {client}")
    wait_until(
        f"{attempt} queued",
        lambda: watch.stats().queued == before.queued + 1
        or watch.stats().displaced == before.displaced + 1,
        timeout=DEADLINE,
    )


def test_clients_in_three_processes_share_the_queue_fairly(
    watch: RedisColdLimiter, start_workers: Callable[..., list[Worker]]
) -> None:
    crawler, polite, other = start_workers(3, active=1, queue=4)
    holder = watch.acquire(None, "test")
    for i in range(1, 5):
        _queue(crawler, f"c{i}", "crawler", watch)
    _queue(polite, "p1", "polite", watch)
    assert crawler.wait_outcome("c4")["event"] == "displaced"
    _queue(other, "o1", "other", watch)
    assert crawler.wait_outcome("c3")["event"] == "displaced"
    s = watch.stats()
    assert (s.active, s.queued, s.displaced, s.rejected_full) == (1, 4, 2, 0)
    # The crawler holds 2 places, the others 1 each: nobody may take one over now.
    polite.send("acquire p2 polite")
    assert polite.wait_outcome("p2")["event"] == "queue_full"

    order: list[str] = []
    holder.release()
    owners = {"c": crawler, "p": polite, "o": other}
    for _ in range(4):
        def granted() -> str | None:
            for w in owners.values():
                for e in w.seen("granted"):
                    if e["id"] not in order:
                        return str(e["id"])
            return None

        attempt = wait_until("the next grant", granted, timeout=DEADLINE)
        order.append(attempt)
        owners[attempt[0]].send(f"release {attempt}")
    # In turn: the crawler's wait began first, then polite's, then other's; FIFO within each.
    assert order == ["c1", "p1", "o1", "c2"]
    wait_until("drained", lambda: watch.stats().active == 0, timeout=DEADLINE)
    s = watch.stats()
    assert (s.queued, s.acquired, s.displaced, s.rejected_full, s.rejected_timeout) == (
        0, 5, 2, 1, 0,
    )


def test_a_crawler_killed_with_waiters_queued_leaves_the_newcomers_their_places(
    watch: RedisColdLimiter, start_workers: Callable[..., list[Worker]]
) -> None:
    crawler, polite = start_workers(2, active=1, queue=4)
    holder = watch.acquire(None, "test")
    for i in range(1, 5):
        _queue(crawler, f"c{i}", "crawler", watch)
    _queue(polite, "p1", "polite", watch)
    assert crawler.wait_outcome("c4")["event"] == "displaced"
    crawler.kill()  # SIGKILL, by PID: its three waiters stop polling
    wait_until("the dead crawler's waiters dropped", lambda: watch.stats().queued == 1,
               timeout=DEADLINE)
    holder.release()
    assert polite.wait_outcome("p1")["event"] == "granted"
    polite.send("release p1")
    wait_until("drained", lambda: watch.stats().active == 0, timeout=DEADLINE)
    s = watch.stats()
    assert (s.queued, s.displaced, s.rejected_timeout) == (0, 1, 0)
