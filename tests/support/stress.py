"""Settings of the randomized limiter tests (the ``stress`` marker): short or long form, the
seed, how long one step may wait, and the exceptions they raise on purpose.

Short form by default (part of every run). ``REACHTEST_STRESS=long`` runs about ten times
the examples, rounds and operations; ``REACHTEST_STRESS_SEED=<int>`` changes the seed of
every randomized test (default 20261129).

The state machine's client threads are here too (:class:`Client`, its cancel object
:class:`Token`, its clock :func:`per_client_clock`, :func:`trigger`), so that the machine's
module holds the machine. So are the rules of fair admission, as a model,
:class:`FairQueue`: the state machine steps it along with the limiter, and
:class:`FairnessWatch` (a ``ColdLimiter`` the storms use) consults it at every decision of its
queue.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import pytest

from reachlimit import Busy, Cancelled, ColdLimiter
from tests.support.waiting import wait_until

LONG = os.environ.get("REACHTEST_STRESS", "").strip().lower() == "long"
SEED = int(os.environ.get("REACHTEST_STRESS_SEED", "20261129"))

#: The marks of a stress test file: the marker, and a timeout that fits the form.
MARKS = [pytest.mark.stress, pytest.mark.timeout(1800 if LONG else 60)]

#: How long one step may wait for the effect it caused. A healthy run needs milliseconds; the
#: bound only turns a lost wake-up or a leaked slot into a failure instead of a hang.
STEP_TIMEOUT = 3.0

#: ``wait_until`` with the step's bound, polled often: a run waits for thousands of steps.
wait_for_step = functools.partial(wait_until, timeout=STEP_TIMEOUT, interval=0.0005)


class TokenBroken(Exception):
    """Raised by a cancel object's is_set() on purpose."""


class BodyError(Exception):
    """Raised inside a grant's with-block on purpose."""


def run_machine(
    machine: Any, examples: int, steps: int, shrink: bool,
    report: Callable[[float], object] | None = None,
) -> None:
    """Run a Hypothesis state machine as the suite's state-machine tests do: ``examples``
    programs of up to ``steps`` steps, no example database, no deadline, shrinking a failure
    only if ``shrink``; a failure carries the seed that replays it (``SEED``). However the run
    ends, ``report(seconds it took)`` is called after it (to print what it counted)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    started = time.monotonic()
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                database=None,
                deadline=None,
                print_blob=True,
                phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    except BaseException as exc:
        exc.add_note(f"state machine seed: REACHTEST_STRESS_SEED={SEED}")
        raise
    finally:
        if report is not None:
            report(time.monotonic() - started)


def races(counts: Counter[str]) -> dict[str, int]:
    """The races a state machine counted (its counts named ``race ...``), by name."""
    return {k: v for k, v in sorted(counts.items()) if k.startswith("race")}


def run_storm_threads(
    workers: list[threading.Thread], helpers: list[threading.Thread], stop: threading.Event,
    bound: float,
) -> float:
    """Start ``helpers`` and ``workers``, join the workers within ``bound`` seconds in all,
    then set ``stop`` and join the helpers (each within ``STEP_TIMEOUT``). Fails naming every
    thread still alive; returns the seconds from the start to the last join."""
    started = time.monotonic()
    for thread in helpers + workers:
        thread.start()
    deadline = time.monotonic() + bound
    for thread in workers:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    for thread in helpers:
        thread.join(STEP_TIMEOUT)
    elapsed = time.monotonic() - started
    stuck = [t.name for t in workers + helpers if t.is_alive()]
    assert not stuck, f"threads did not finish within {bound:.0f} s: {stuck}"
    return elapsed


#: Every way one storm operation ends: each operation is counted under exactly one of these.
STORM_OUTCOMES = (
    "grant", "queue_full", "timeout", "cancelled", "cancelled_at_once", "token_error",
    "displaced", "deadline",
)


def storm_tally(
    label: str, tallies: list[Counter[str]], ops: int, threads: int, elapsed: float,
    more: str = "",
) -> Counter[str]:
    """The storm's tallies summed, after printing its one-line summary: ``label`` (its
    settings), the seed, the operations and their outcomes, then ``more``."""
    tally: Counter[str] = sum(tallies, Counter())
    print(
        f"\n[{label}] seed={SEED} {ops * threads} operations on {threads} threads in "
        f"{elapsed:.1f} s: {dict(sorted(tally.items()))}{more}"
    )
    return tally


def assert_storm_counted(s: Any, tally: Counter[str], operations: int) -> None:
    """The limiter's stats ``s`` count what the storm's callers saw: each grant, refusal and
    cancel; and every one of the ``operations`` ended in one of ``STORM_OUTCOMES``."""
    assert s.acquired == tally["grant"]
    assert s.rejected_full == tally["queue_full"]
    assert s.rejected_timeout == tally["timeout"]
    assert s.cancelled == tally["cancelled"]  # a cancel seen at once moves no counter
    # A waiter refused late whose cancel token then raised is counted by its refuser (as a
    # displaced one is by its displacer), and the caller sees the token's error.
    assert tally["deadline"] <= s.deadline <= tally["deadline"] + tally["token_error"], (
        s.deadline, tally["deadline"], tally["token_error"])
    assert sum(tally[k] for k in STORM_OUTCOMES) == operations


def leave_grant(grant: Any, mode: str, work: Callable[[], object] | None = None) -> str:
    """Hold ``grant`` in a with-block, run ``work()`` there, and leave the way ``mode`` says:
    ``exit`` (the block's end releases), ``release`` (released early, inside the block),
    ``double`` (released twice: the second must raise RuntimeError) or ``raise`` (the body
    raises BodyError, which must come out of the block). Returns "ok", or what went wrong."""
    try:
        with grant:
            if work is not None:
                work()
            if mode == "release":
                grant.release()
            elif mode == "double":
                grant.release()
                try:
                    grant.release()
                except RuntimeError:
                    pass
                else:
                    return "a second release() did not raise RuntimeError"
            elif mode == "raise":
                raise BodyError()
    except BodyError:
        return "ok" if mode == "raise" else "unexpected BodyError"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        return f"leaving the grant raised {exc!r}"
    return "ok" if mode != "raise" else "the body's exception was swallowed"


# -- the state machine's client threads (tests/test_limiter_state_machine.py) ---------------

#: Each client's clock starts at 0 and moves only when a rule moves it, so a waiter's deadline
#: is exactly WAIT and "expire" is an exact event. A client without a cancel object waits in
#: one real timed wait of this length: it leaves only by promotion (or the final drain).
WAIT = 100_000.0

_tls = threading.local()


class ClockBroken(Exception):
    """Raised by the clock on purpose."""


class Token:
    """A cancel object: an Event that can also be made to raise from ``is_set()``, or to
    pause its next ``is_set()`` call (the waiter is then outside the lock, not yet promoted)
    until the test resumes it: that pins the waiter down while a hand-off happens."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.broken = False
        self._pause_next = False
        self.paused = threading.Event()
        self.resume = threading.Event()

    def pause_next_call(self) -> None:
        self._pause_next = True

    def is_set(self) -> bool:
        if self._pause_next:
            self._pause_next = False
            self.paused.set()
            self.resume.wait(STEP_TIMEOUT)
        if self.broken:
            raise TokenBroken("cancel object failed")
        return self.event.is_set()


def per_client_clock() -> float:
    """The limiter's clock: each client thread has its own, moved only by the test."""
    client: Client | None = getattr(_tls, "client", None)
    if client is None:
        return 0.0
    return client.read_clock()


class Client:
    """One thread calling ``acquire`` once and, if granted, holding the slot until told how
    to leave the with-block."""

    def __init__(
        self, cid: int, lim: ColdLimiter, *, cancel: bool, preset: bool = False,
        who: Hashable = None, ended: threading.Event | None = None,
    ):
        self.cid = cid
        self.ended = ended  # shared by several clients: set when any one's call ends
        self.lim = lim
        self.who = who  # the client it asks for (None: acquire(cancel), the anonymous one)
        self.token = Token() if cancel else None
        if preset:
            assert self.token is not None
            self.token.event.set()
        # Written by the client thread, read by the test after done/finished fire.
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self.exit_result: str | None = None
        self.done = threading.Event()  # acquire returned or raised
        self.finished = threading.Event()  # the thread is about to end
        # The clock: written by the test, read by the client thread.
        self._clock_lock = threading.Lock()
        self.now = 0.0
        self.clock_raises = False
        self.clock_reads = 0  # written by the client thread only
        self.deadline_fixed = threading.Event()  # first clock read: the deadline is fixed
        # How to leave the with-block; set before ``go``.
        self.mode = "exit"
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"client-{cid}", daemon=True)

    def __repr__(self) -> str:
        return f"client{self.cid}[{self.who}]"

    def read_clock(self) -> float:
        with self._clock_lock:
            now, raises = self.now, self.clock_raises
        self.clock_reads += 1
        self.deadline_fixed.set()
        if raises:
            raise ClockBroken("clock failed")
        return now

    def set_clock(self, now: float) -> None:
        with self._clock_lock:
            self.now = now

    def break_clock(self) -> None:
        with self._clock_lock:
            self.clock_raises = True

    def start(self) -> Client:
        self.thread.start()
        return self

    def leave(self, mode: str) -> None:
        self.mode = mode
        self.go.set()

    def _run(self) -> None:
        _tls.client = self
        try:
            try:
                if self.who is None:
                    grant = self.lim.acquire(self.token)
                else:
                    grant = self.lim.acquire(self.token, self.who)
            except Busy as busy:
                self.outcome = busy.reason
            except Cancelled:
                self.outcome = "cancelled"
            except BaseException as exc:  # noqa: BLE001 - recorded and checked by the test
                self.outcome = "error"
                self.error = exc
            else:
                self.outcome = "grant"
            self.done.set()
            if self.ended is not None:
                self.ended.set()
            if self.outcome != "grant":
                return
            if not self.go.wait(STEP_TIMEOUT * 6):
                self.exit_result = "never told to leave"
            self.exit_result = (
                leave_grant(grant, self.mode)
                if self.exit_result is None
                else self.exit_result
            )
        finally:
            self.finished.set()


def trigger(victim: Client, what: str) -> None:
    """End ``victim``'s wait: cancel it, expire it, or make its cancel object or clock fail."""
    assert victim.token is not None
    if what == "cancel":
        victim.token.event.set()
    elif what == "expire":
        victim.set_clock(WAIT)
    elif what == "token":
        victim.token.broken = True
    else:
        victim.break_clock()


#: What a waiter whose trigger won ends with.
LOSER_OUTCOME = {"cancel": "cancelled", "expire": "timeout", "token": "error", "clock": "error"}



# -- fair admission: the rules as a model -------------------------------------------------------

T = TypeVar("T")


class FairQueue(Generic[T]):
    """The queue of fair admission as the rules say it, over any waiters (the state
    machine's client threads, or a ``ColdLimiter``'s own records in :class:`FairnessWatch`).

    Each waiter belongs to a client (``who``, any hashable) and has an arrival number. The
    waiting clients take turns, in the order their waits began: a freed slot goes to the
    oldest waiter of the first client in turn, which goes to the back of the turn if it still
    waits; a client whose waiters all left is out of the turn, and comes back at its back.
    A newcomer of a client holding ``c`` places that finds the queue full displaces the
    newest waiter of the client holding most places (ties: the one whose newest waiter
    joined last) if that client holds ``c + 2`` or more; otherwise it is refused."""

    def __init__(self) -> None:
        self._fifo: dict[Hashable, list[T]] = {}  # each waiting client's waiters, oldest first
        self._turn: list[Hashable] = []  # the waiting clients, the next one served first
        self._seq: dict[int, int] = {}  # id(waiter) -> arrival number
        self._who: dict[int, Hashable] = {}  # id(waiter) -> its client
        self._joined = 0
        self._order: tuple[T, ...] | None = None  # promotion_order(), until the next change

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, waiter: object) -> bool:
        return id(waiter) in self._seq

    def who(self, waiter: T) -> Hashable:
        return self._who[id(waiter)]

    def places(self, who: Hashable) -> int:
        """Queue places ``who`` holds."""
        return len(self._fifo.get(who, ()))

    def turn(self) -> list[tuple[Hashable, list[T]]]:
        """The waiting clients in turn order, each with its waiters, oldest first."""
        return [(who, list(self._fifo[who])) for who in self._turn]

    def arrival_order(self) -> list[T]:
        waiters = [w for fifo in self._fifo.values() for w in fifo]
        return sorted(waiters, key=lambda w: self._seq[id(w)])

    def promotion_order(self) -> tuple[T, ...]:
        """Who would be promoted, in order, if slots were freed and nobody came or left."""
        if self._order is None:
            turn = [(who, list(self._fifo[who])) for who in self._turn]
            order: list[T] = []
            while turn:
                who, fifo = turn.pop(0)
                order.append(fifo.pop(0))
                if fifo:
                    turn.append((who, fifo))
            self._order = tuple(order)
        return self._order

    def join(self, waiter: T, who: Hashable) -> None:
        """``waiter`` of ``who`` takes a place (a client new to the queue waits last in turn)."""
        assert id(waiter) not in self._seq, f"{waiter!r} joined twice"
        self._order = None
        if who not in self._fifo:
            self._fifo[who] = []
            self._turn.append(who)
        self._fifo[who].append(waiter)
        self._seq[id(waiter)] = self._joined
        self._who[id(waiter)] = who
        self._joined += 1

    def leave(self, waiter: T) -> None:
        """``waiter`` leaves the queue (gave up, or displaced)."""
        who = self._who.pop(id(waiter))
        del self._seq[id(waiter)]
        self._order = None
        fifo = self._fifo[who]
        fifo.remove(waiter)
        if not fifo:
            del self._fifo[who]
            self._turn.remove(who)

    def next_in_turn(self) -> T:
        """The waiter a freed slot goes to, taken out of the queue; its client goes to the
        back of the turn if it still waits."""
        who = self._turn[0]
        waiter = self._fifo[who][0]
        self.leave(waiter)  # takes who out of the turn if it has nobody left
        if who in self._fifo:
            self._turn.remove(who)
            self._turn.append(who)
        return waiter

    def victim_for(self, places: int) -> T | None:
        """The queue is full and a newcomer's client holds ``places``: the waiter it
        displaces, or None (it is refused)."""
        if not self._turn:
            return None
        biggest = max(
            self._turn, key=lambda who: (len(self._fifo[who]), self._seq[id(self._fifo[who][-1])])
        )
        fifo = self._fifo[biggest]
        return fifo[-1] if len(fifo) >= places + 2 else None


def limiter_queue(lim: ColdLimiter) -> tuple[list[tuple[Hashable, list[Any]]], list[Any]]:
    """A ``ColdLimiter``'s own queue, read under its lock: its clients in turn order, each
    with its waiter records, and every record in arrival order. Checks, on the way, that the
    two hold the same records and that each client's are in arrival order."""
    with lim._lock:
        return _read_queue(lim)


def _read_queue(lim: ColdLimiter) -> tuple[list[tuple[Hashable, list[Any]]], list[Any]]:
    """:func:`limiter_queue`, with the limiter's lock already held."""
    turn = [(who, list(mine)) for who, mine in lim._clients.items()]
    arrival = list(lim._waiters)
    held = [w for _, mine in turn for w in mine]
    assert sorted(map(id, held)) == sorted(map(id, arrival)), (
        f"the clients' queues hold {len(held)} waiters, the arrival queue {len(arrival)}"
    )
    for who, mine in turn:
        assert mine, f"client {who!r} is in the turn with no waiter"
        assert all(w.client == who for w in mine), f"a waiter of another client filed under {who!r}"
        assert [w.seq for w in mine] == sorted(w.seq for w in mine), f"{who!r}'s queue out of order"
    assert [w.seq for w in arrival] == sorted(w.seq for w in arrival), "arrival queue out of order"
    return turn, arrival


class FairnessWatch(ColdLimiter):
    """A ``ColdLimiter`` that holds every decision of its queue to :class:`FairQueue`, at the
    moment it is made (under its own lock): each promotion must be the waiter the rules name,
    each displacement the waiter they name (and only when they say so). A disagreement is
    recorded in ``violations`` (the hooks never raise into the limiter), after which the watch
    stops judging (its model no longer matches). ``counts``: joined, left (gave up),
    promoted, displaced (every waiter that joined must leave exactly one of those ways), and
    promoted_out_of_arrival_order (promotions the turn of the clients decided).

    What it does not see: a refusal decided before ``_displace_for`` is asked (the limiter's
    arithmetic shortcut) and the fast path; the state machine checks those step by step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model: FairQueue[Any] = FairQueue()
        self.violations: list[str] = []  # guarded by the limiter's lock
        self.counts: Counter[str] = Counter()  # guarded by the limiter's lock
        self._here = threading.local()  # .waiter: the record of this thread's current call

    def acquire(self, cancel: Any = None, client: Hashable = None) -> Any:
        self._here.waiter = None
        return super().acquire(cancel, client)

    def displaced_here(self) -> bool:
        """Whether this thread's last call was displaced (whatever it raised: a cancel object
        or clock that fails after the displacement raises its own error)."""
        waiter = getattr(self._here, "waiter", None)
        with self._lock:
            return waiter is not None and bool(waiter.displaced)

    def _judge(self, what: str) -> None:
        self.violations.append(what)

    def _model(self, step: Callable[[], T]) -> T | None:
        """Run one step of the model, unless it has stopped matching; a model that raises is
        a violation too (never an error inside the limiter)."""
        if self.violations:
            return None
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - reported, never raised under the lock
            self._judge(f"the model failed: {exc!r}")
            return None

    def _join(self, client: Hashable, mine: Any) -> Any:
        waiter = super()._join(client, mine)
        self._here.waiter = waiter  # _join runs in the caller's thread
        self.counts["joined"] += 1
        self._model(lambda: self.model.join(waiter, client))
        return waiter

    def _leave_queue(self, waiter: Any) -> None:
        super()._leave_queue(waiter)
        self.counts["left"] += 1
        self._model(lambda: self.model.leave(waiter))

    def _next_in_turn(self) -> Any:
        expected = self._model(self.model.next_in_turn)
        oldest = self._waiters[0]
        waiter = super()._next_in_turn()
        self.counts["promoted"] += 1
        self.counts["promoted_out_of_arrival_order"] += waiter is not oldest
        if expected is not None and waiter is not expected:
            self._judge(
                f"promoted {_describe(waiter)}; the rules promote {_describe(expected)} "
                "(round-robin across clients, FIFO within each)"
            )
        return waiter

    def _displace_for(self, places: int) -> bool:
        expected = self._model(lambda: self.model.victim_for(places))
        judging = not self.violations
        displaced = super()._displace_for(places)
        if displaced:
            self.counts["displaced"] += 1
        if not judging:
            return displaced
        if not displaced:
            if expected is not None:
                self._judge(
                    f"a newcomer holding {places} place(s) was refused; the rules displace "
                    f"{_describe(expected)}"
                )
            return displaced
        victims = [w for w in self.model.arrival_order() if w.displaced]
        if victims != [expected]:
            self._judge(
                f"displaced {', '.join(map(_describe, victims))}; the rules displace "
                f"{_describe(expected)} (the newest waiter of the client holding most places)"
            )
        else:
            self._model(lambda: self.model.leave(victims[0]))
        return displaced

    def check(self) -> list[str]:
        """What is wrong right now: a violation recorded, or a queue that is not the model's
        (both read in one hold of the limiter's lock)."""
        with self._lock:
            if self.violations:
                return list(self.violations)
            try:
                turn, arrival = _read_queue(self)
            except AssertionError as exc:
                return [str(exc)]
            want_turn = [(who, list(map(id, fifo))) for who, fifo in self.model.turn()]
            got_turn = [(who, list(map(id, mine))) for who, mine in turn]
            if got_turn == want_turn and list(map(id, arrival)) == list(
                map(id, self.model.arrival_order())
            ):
                return []
            return [
                f"turn {[(w, len(m)) for w, m in turn]}, the model's "
                f"{[(w, len(f)) for w, f in self.model.turn()]}"
            ]


def _describe(waiter: Any) -> str:
    return "nobody" if waiter is None else f"waiter {waiter.seq} of {waiter.client!r}"
