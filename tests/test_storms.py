"""Seeded thread storms: many threads, every kind of caller, invariants checked throughout.

* ``test_randomized_run_never_exceeds_the_bounds``: 16 threads acquiring with and without
  cancel objects, for several clients, while a sampler checks the bounds and one gate place
  per waiter.
* ``test_limiter_thread_storm``: seeded ``random.Random`` threads doing thousands of acquires
  with every kind of cancel object, timeouts, early/double releases and raising bodies, for
  several clients (one crawler with most of the threads, whose waiters the others keep
  displacing), while a sampler checks the invariants continuously; afterwards the counters
  must add up (``displaced`` too), every waiter must have left the queue exactly one way and
  the full capacity (every slot, every queue place) must still be usable.
* ``test_coldpath_storm``: the same kind of storm through ColdPath (singleflight, cache,
  builds that raise or return NOT_FOUND/None, leaders whose client leaves).

The limiter of each storm is a ``FairnessWatch`` (``tests/support/stress.py``): it holds every
promotion and every displacement, at the moment the limiter makes it, to the rules of fair
admission (round-robin across the waiting clients, FIFO within each, the newest waiter of the
client holding most places displaced), and the samplers compare its queues with the model's.

Each test prints what it tried (run with ``-s`` to see it); ``REACHTEST_STRESS=long`` runs
about ten times the operations (see ``tests/support/stress.py``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pytest

from reachlimit import NOT_FOUND, Busy, Cancelled, ColdLimiter, ColdPath, TTLCache
from tests.support import stress
from tests.support.limiter import assert_exact_capacity, check_white_box, gate_size
from tests.support.threads import ThreadRunner

pytestmark = stress.MARKS

_tls = threading.local()


class TimedCancel:
    """A cancel object that becomes set at a given monotonic instant (a client that leaves at
    a random moment), with no thread behind it. Remembers what its first read (the "already
    cancelled?" check) said, so a test knows which ``Cancelled`` the counter must show."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.first: bool | None = None

    def is_set(self) -> bool:
        value = time.monotonic() >= self.at
        if self.first is None:
            self.first = value
        return value


@pytest.mark.timeout(30)
def test_randomized_run_never_exceeds_the_bounds(threads: ThreadRunner) -> None:
    seed = int(os.environ.get("REACHTEST_SEED", "20240611"))
    long_form = os.environ.get("REACHTEST_STRESS") == "long"
    workers, ops = 16, (400 if long_form else 40)
    lim = stress.FairnessWatch(active=2, queue=8, wait=0.02)
    start = threading.Barrier(workers + 1, timeout=5.0)
    stop = threading.Event()
    violations: list[str] = []
    samples = [0]
    tallies: list[Counter[str]] = [Counter() for _ in range(workers)]

    def sampler() -> None:
        while not stop.is_set():
            s = lim.stats()
            if not (0 <= s.active <= 2 and 0 <= s.queued <= 8):
                violations.append(f"out of bounds: {s}")
            with lim._lock:
                assert lim._gate is not None
                if lim._gate.qsize() != len(lim._waiters):
                    violations.append(
                        f"gate places {lim._gate.qsize()} != waiters {len(lim._waiters)}"
                    )
            if not violations:  # a broken rule stays broken: report it once
                violations.extend(lim.check())
            samples[0] += 1

    def worker(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        tally = tallies[index]
        start.wait()
        for _ in range(ops):
            kind = rng.choice(["plain", "plain", "cancel", "cancel", "preset"])
            cancel: Any = None
            if kind == "cancel":
                cancel = TimedCancel(time.monotonic() + rng.uniform(0.0, 0.03))
            elif kind == "preset":
                cancel = threading.Event()
                cancel.set()
            try:
                grant = lim.acquire(cancel, rng.choice(("a", "a", "b", "c", None)))
            except Busy as exc:
                tally[exc.reason] += 1
                continue
            except Cancelled:
                if isinstance(cancel, TimedCancel) and cancel.first is False:
                    tally["cancelled_waiting"] += 1
                else:
                    tally["cancelled_at_once"] += 1
                continue
            tally["granted"] += 1
            hold = rng.choice([0.0, 0.0, 0.001, 0.003])  # the "build"; not a synchronisation
            style = rng.randrange(3)
            if style == 0:
                time.sleep(hold)
                grant.release()
            elif style == 1:
                with grant:
                    time.sleep(hold)
            else:
                try:
                    with grant:
                        time.sleep(hold)
                        raise ValueError("build failed")
                except ValueError:
                    pass

    threads.start(sampler)
    worker_threads = [threads.start(worker, i, name=f"worker-{i}") for i in range(workers)]
    start.wait()
    deadline = time.monotonic() + 25.0
    for thread in worker_threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    assert not any(t.is_alive() for t in worker_threads), "workers did not finish"
    threads.join_all()
    total: Counter[str] = sum(tallies, Counter())
    assert not violations, violations[:5]
    assert samples[0] > 0
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0)
    assert s.peak_active <= 2 and s.peak_queued <= 8
    assert sum(total.values()) == workers * ops
    assert s.acquired == total["granted"]
    assert s.rejected_full == total["queue_full"]
    assert s.rejected_timeout == total["timeout"]
    assert s.cancelled == total["cancelled_waiting"]
    assert s.displaced == total["displaced"] == lim.counts["displaced"]
    assert total["granted"] > 0 and total["queue_full"] + total["timeout"] > 0
    assert gate_size(lim) == 0
    _assert_every_place_left_once(lim)
    assert_exact_capacity(lim)


class FailingToken:
    """A cancel object whose ``is_set()`` raises on its n-th call."""

    def __init__(self, calls_before_failing: int) -> None:
        self.left = calls_before_failing

    def is_set(self) -> bool:
        if self.left <= 0:
            raise stress.TokenBroken("cancel object failed")
        self.left -= 1
        return False


class StormClock:
    """The real monotonic clock, counting reads per thread (to prove which paths read it).
    ``freeze()`` stops it, so that no wait can time out any more: the final capacity check
    then depends on no machine's speed."""

    def __init__(self) -> None:
        self.frozen: float | None = None

    def __call__(self) -> float:
        _tls.reads = getattr(_tls, "reads", 0) + 1
        frozen = self.frozen
        return time.monotonic() if frozen is None else frozen

    def freeze(self) -> None:
        self.frozen = time.monotonic()


def _reads() -> int:
    return int(getattr(_tls, "reads", 0))


class Storm:
    """Shared state of one storm: the set of live cancel Events, violations, figures."""

    def __init__(self, active: int) -> None:
        self.active = active
        self.lock = threading.Lock()
        self.holding = 0  # guarded by lock: grants held by storm threads right now
        self.max_holding = 0  # guarded by lock
        self.events: list[threading.Event] = []  # guarded by lock: cancel Events in use
        self.violations: list[str] = []  # appended from any thread (list.append is atomic)
        self.stop = threading.Event()

    def hold(self, delta: int) -> None:
        with self.lock:
            self.holding += delta
            self.max_holding = max(self.max_holding, self.holding)
            if self.holding > self.active:
                self.violations.append(f"{self.holding} grants held at once")


def _storm_worker(
    lim: ColdLimiter,
    storm: Storm,
    rng: random.Random,
    ops: int,
    tally: Counter[str],
    clients: Sequence[Hashable] = (None,),
    think: float = 0.0,
) -> None:
    """``ops`` acquires of every kind, each for a client drawn from ``clients`` (None is the
    anonymous client, asked for as ``acquire(cancel)``). Before each call the thread thinks
    for up to ``think`` seconds (a pace, not a synchronisation: a place freed meanwhile can go
    to another client, and a refused caller keeps arriving all through the storm instead of
    spending its calls at once)."""
    wait = lim.wait
    for _ in range(ops):
        if storm.stop.is_set():
            return
        if think:
            time.sleep(rng.uniform(0, think))
        who = rng.choice(clients)
        kind = rng.random()
        cancel: Any = None
        event: threading.Event | None = None
        preset = False
        if kind < 0.35:
            cancel = None
        elif kind < 0.55:
            event = cancel = threading.Event()
            with storm.lock:
                storm.events.append(event)
        elif kind < 0.72:
            cancel = TimedCancel(time.monotonic() + rng.uniform(0, 2 * wait))
        elif kind < 0.77:
            cancel = threading.Event()
            cancel.set()
            preset = True
        elif kind < 0.82:
            cancel = FailingToken(rng.randint(1, 4))
        else:
            cancel = threading.Event()  # never set
        reads_before = _reads()
        try:
            grant = lim.acquire(cancel) if who is None else lim.acquire(cancel, who)
        except Busy as busy:
            tally[busy.reason] += 1
            if busy.reason == "queue_full" and _reads() != reads_before:
                storm.violations.append("a queue_full refusal read the clock")
            if busy.retry_after != lim.retry_after:
                storm.violations.append(f"retry_after {busy.retry_after}")
            continue
        except Cancelled:
            # A cancel seen before waiting raises at once, reads no clock and moves no
            # counter; a cancel seen while waiting has fixed a deadline first.
            waited = _reads() != reads_before
            tally["cancelled" if waited else "cancelled_at_once"] += 1
            if preset and waited:
                storm.violations.append("a pre-set cancel read the clock")
            continue
        except stress.TokenBroken:
            tally["token_error"] += 1
            # Displaced first: counted as displaced, but the call raises the token's error.
            if isinstance(lim, stress.FairnessWatch) and lim.displaced_here():
                tally["token_error_displaced"] += 1
            continue
        except BaseException as exc:  # noqa: BLE001
            storm.violations.append(f"acquire raised {exc!r}")
            continue
        finally:
            if event is not None:
                with storm.lock:
                    storm.events.remove(event)
        if preset:
            storm.violations.append("a pre-set cancel got a grant")
        tally["grant"] += 1
        tally["fast_path" if _reads() == reads_before else "promoted"] += 1
        mode = rng.choice(("exit", "exit", "release", "raise", "double"))
        storm.hold(+1)

        def build() -> None:
            # The build's work (not synchronisation): mostly short, sometimes longer than the
            # wait, so that queued waiters time out.
            pick = rng.random()
            if pick < 0.2:
                time.sleep(rng.uniform(wait / 2, wait * 1.5))
            elif pick < 0.5:
                time.sleep(rng.uniform(0, wait / 4))
            storm.hold(-1)

        left = stress.leave_grant(grant, mode, work=build)
        if left != "ok":
            storm.violations.append(f"leaving a grant ({mode}): {left}")
        elif mode == "double":
            tally["double_release_refused"] += 1
        elif mode == "raise":
            tally["body_raised"] += 1


def _storm_canceller(storm: Storm, rng: random.Random, pause: float, tally: Counter[str]) -> None:
    """Sets random live cancel Events at random moments: clients leaving from outside."""
    while not storm.stop.wait(rng.uniform(0, pause)):
        with storm.lock:
            event = rng.choice(storm.events) if storm.events else None
        if event is not None:
            event.set()
            tally["events_set"] += 1


def _storm_sampler(lim: ColdLimiter, storm: Storm, tally: Counter[str]) -> None:
    """Checks the invariants continuously while the storm runs."""
    while not storm.stop.is_set():
        s = lim.stats()
        tally["samples"] += 1
        if not (0 <= s.active <= s.capacity_active and 0 <= s.queued <= s.capacity_queue):
            storm.violations.append(f"bounds broken: {s}")
        if s.peak_active > s.capacity_active or s.peak_queued > s.capacity_queue:
            storm.violations.append(f"peak beyond capacity: {s}")
        try:
            check_white_box(lim)
        except AssertionError as exc:
            storm.violations.append(str(exc))
        if isinstance(lim, stress.FairnessWatch) and len(storm.violations) < 10:
            storm.violations.extend(lim.check())
        tally["saturated_samples"] += s.queued > 0
        time.sleep(0)  # yield: let the storm threads take the lock too


def _assert_full_capacity_usable(lim: ColdLimiter, clock: StormClock) -> None:
    """Every slot and every queue place is still there: ``active`` fast-path grants with no
    clock read, then ``queue`` admitted waiters, then an immediate queue_full refusal.
    (The clock is frozen first: the waiters leave only when cancelled.)"""
    clock.freeze()
    before = _reads()
    grants = [lim.acquire() for _ in range(lim.capacity_active)]
    assert _reads() == before, "a fast-path acquire read the clock"
    tokens = [threading.Event() for _ in range(lim.capacity_queue)]
    results: list[str] = []

    def wait_in_queue(token: threading.Event) -> None:
        try:
            lim.acquire(token).release()
            results.append("grant")
        except Cancelled:
            results.append("cancelled")
        except Busy as busy:
            results.append(busy.reason)

    threads = [threading.Thread(target=wait_in_queue, args=(t,), daemon=True) for t in tokens]
    try:
        for thread in threads:
            thread.start()
        stress.wait_for_step("the queue to fill", lambda: lim.stats().queued == lim.capacity_queue)
        with pytest.raises(Busy) as refused:
            lim.acquire()
        assert refused.value.reason == "queue_full"
    finally:
        for token in tokens:
            token.set()
        for thread in threads:
            thread.join(stress.STEP_TIMEOUT)
        for grant in grants:
            grant.release()
    assert all(not t.is_alive() for t in threads)
    assert results == ["cancelled"] * lim.capacity_queue, results
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), s


def _assert_every_place_left_once(lim: stress.FairnessWatch) -> None:
    """With nobody waiting: the watch saw no rule broken and its model is as empty as the
    queue, and every waiter that joined left exactly one way (gave up, promoted or
    displaced)."""
    assert not lim.check(), lim.check()
    assert len(lim.model) == 0 and lim.stats().queued == 0
    c = lim.counts
    assert c["joined"] == c["left"] + c["promoted"] + c["displaced"], c


def _clients_of_workers(clients: Sequence[Hashable], threads: int) -> list[tuple[Hashable, ...]]:
    """Whom each storm thread asks for: one thread for each client but the first, and every
    other thread for the first, a crawler that takes every place it can, so that the others
    keep finding the queue full of its waiters and displace them."""
    polite = [(who,) for who in clients[1:]]
    return polite + [(clients[0],)] * (threads - len(polite))


STORM_CONFIGS = [  # (active, queue, wait seconds, threads, clients; the first one crawls)
    (2, 8, 0.02, 16, ("a", "b", "c", None)),
    (1, 0, 0.02, 6, ("a", "b")),
    (3, 2, 0.005, 10, ("a", "b", "c")),
    (1, 3, 0.01, 8, (None,)),
    (1, 4, 0.01, 8, ("a", "b")),
]


@pytest.mark.parametrize("active,queue,wait,threads,clients", STORM_CONFIGS)
def test_limiter_thread_storm(
    active: int, queue: int, wait: float, threads: int, clients: tuple[Hashable, ...]
) -> None:
    ops = 2500 if stress.LONG else 250
    rng = random.Random(f"{stress.SEED}-{active}-{queue}-{wait}-{len(clients)}")
    clock = StormClock()
    lim = stress.FairnessWatch(active, queue, wait=wait, retry_after=2, clock=clock)
    storm = Storm(active)
    tallies = [Counter[str]() for _ in range(threads + 2)]
    whom = _clients_of_workers(clients, threads)
    workers = [
        threading.Thread(
            target=_storm_worker,
            args=(lim, storm, random.Random(rng.random()), ops, tallies[i], whom[i], wait / 4),
            name=f"storm-{i}",
            daemon=True,
        )
        for i in range(threads)
    ]
    helpers = [
        threading.Thread(target=_storm_sampler, args=(lim, storm, tallies[-1]), daemon=True),
        threading.Thread(
            target=_storm_canceller,
            args=(storm, random.Random(rng.random()), wait / 2, tallies[-2]),
            daemon=True,
        ),
    ]
    # Bounded: each operation waits at most `wait`, plus a hold of at most 1.5 x wait.
    elapsed = stress.run_storm_threads(workers, helpers, storm.stop, 30.0 + ops * wait * 4)

    # The summary ends with the local limiter's queue counts (a Redis limiter keeps none).
    label = f"storm A={active} Q={queue} wait={wait} clients={len(clients)}"
    queue_counts = f" queue={dict(lim.counts)}"
    tally = stress.storm_tally(label, tallies, ops, threads, elapsed, queue_counts)
    assert not storm.violations, storm.violations[:10]
    s = lim.stats()
    assert (s.active, s.queued) == (0, 0), s
    stress.assert_storm_counted(s, tally, ops * threads)
    assert s.displaced == tally["displaced"] + tally["token_error_displaced"]
    assert s.displaced == lim.counts["displaced"]
    if queue:
        assert gate_size(lim) == 0
    _assert_every_place_left_once(lim)
    assert storm.max_holding <= active and s.peak_active <= active and s.peak_queued <= queue
    # The storm really exercised the paths it claims to.
    assert tally["grant"] and tally["fast_path"] and tally["cancelled_at_once"]
    assert tally["queue_full"], "the storm never filled the queue"
    if queue:
        assert tally["promoted"] and tally["cancelled"], tally
    if queue and active <= 2:  # with 3 slots a timeout needs 3 long holds at once: rare
        assert tally["timeout"], tally
    if queue >= 2 and len(clients) > 1:  # the fairness rules decided something
        assert tally["displaced"], tally
    if queue >= 3 and len(clients) > 1:  # ... and the turn of the clients reordered some
        assert lim.counts["promoted_out_of_arrival_order"], lim.counts
    _assert_full_capacity_usable(lim, clock)
    _assert_every_place_left_once(lim)


# The ColdPath storm
class BuildError(Exception):
    """What a failing build raises; carries its key."""


def test_coldpath_storm() -> None:
    """Many threads, few keys, builds that succeed / raise / return NOT_FOUND or None, cancel
    objects of every kind, a cache small enough to evict: every answer is the right one for
    its key, at most one build per key and at most ``active`` builds at a time, errors and
    misses are never cached, and nothing is left in flight or held afterwards."""
    active, queue, wait, threads = 2, 4, 0.02, 14
    ops = 1500 if stress.LONG else 200
    rng = random.Random(f"{stress.SEED}-coldpath")
    clock = StormClock()
    lim = stress.FairnessWatch(active, queue, wait=wait, clock=clock)
    cache: TTLCache[Any] = TTLCache(maxsize=4, ttl=3600)
    path = ColdPath(lim, cache)
    keys = list(range(12))
    lock = threading.Lock()
    running: Counter[int] = Counter()  # guarded by lock: builds running per key
    total_running = [0, 0]  # guarded by lock: now, peak
    builds: Counter[int] = Counter()  # guarded by lock
    violations: list[str] = []

    def expected(key: int) -> Any:
        return {0: BuildError, 1: NOT_FOUND, 2: None}.get(key % 6, f"value-{key}")

    def make_build(key: int, pause: float) -> Callable[[], Any]:
        def build() -> Any:
            with lock:
                running[key] += 1
                builds[key] += 1
                total_running[0] += 1
                total_running[1] = max(total_running)
                if running[key] > 1:
                    violations.append(f"two builds of key {key} at once")
                if total_running[0] > active:
                    violations.append(f"{total_running[0]} builds at once")
            try:
                time.sleep(pause)  # the scan's work, not synchronisation
                result = expected(key)
                if result is BuildError:
                    raise BuildError(key)
                return result
            finally:
                with lock:
                    running[key] -= 1
                    total_running[0] -= 1

        return build

    def worker(wrng: random.Random, tally: Counter[str]) -> None:
        for _ in range(ops):
            key = wrng.choice(keys)
            kind = wrng.random()
            if kind < 0.5:
                cancel: Any = None
            elif kind < 0.8:
                cancel = TimedCancel(time.monotonic() + wrng.uniform(0, 2 * wait))
            elif kind < 0.85:
                cancel = threading.Event()
                cancel.set()
            else:
                cancel = threading.Event()
            who = wrng.choice(("a", "a", "b", None))  # matters only when this get leads
            try:
                value = path.get(key, make_build(key, wrng.uniform(0, wait / 2)), cancel, who)
            except BuildError as exc:
                tally["build_error"] += 1
                if exc.args != (key,) or expected(key) is not BuildError:
                    violations.append(f"key {key} got another key's error {exc!r}")
                continue
            except Busy as busy:
                tally[busy.reason] += 1
                continue
            except Cancelled:
                tally["cancelled"] += 1
                continue
            except BaseException as exc:  # noqa: BLE001
                violations.append(f"get({key}) raised {exc!r}")
                continue
            tally["value"] += 1
            if value is not expected(key):
                if value != expected(key):
                    violations.append(f"key {key} got {value!r}")

    tallies = [Counter[str]() for _ in range(threads)]
    workers = [
        threading.Thread(target=worker, args=(random.Random(rng.random()), tallies[i]), daemon=True)
        for i in range(threads)
    ]
    started = time.monotonic()
    for thread in workers:
        thread.start()
    deadline = time.monotonic() + 30.0 + ops * wait * 3
    for thread in workers:
        thread.join(max(0.0, deadline - time.monotonic()))
    elapsed = time.monotonic() - started
    assert not [t for t in workers if t.is_alive()], "ColdPath storm threads did not finish"
    tally: Counter[str] = sum(tallies, Counter())
    s = path.stats()
    print(
        f"\n[coldpath storm] seed={stress.SEED} {ops * threads} gets on {threads} threads in "
        f"{elapsed:.1f} s: {dict(sorted(tally.items()))} builds={s.builds} hits={s.hits} "
        f"coalesced={s.coalesced} peak builds at once={total_running[1]}"
    )
    assert not violations, violations[:10]
    assert (s.active, s.queued) == (0, 0), s
    assert path.flight.in_flight() == 0
    assert s.builds == sum(builds.values())
    assert sum(tally.values()) == ops * threads
    for key in keys:  # only real values were ever cached
        cached = cache.get(key)
        assert cached is None or cached == expected(key), (key, cached)
        if expected(key) in (BuildError, NOT_FOUND, None):
            assert cached is None, f"key {key}: {cached!r} was cached"
    assert tally["value"] and tally["build_error"] and tally["cancelled"] and s.coalesced
    _assert_every_place_left_once(lim)
    _assert_full_capacity_usable(lim, clock)
