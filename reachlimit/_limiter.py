"""The cold limiter: bounded concurrent builds, a bounded fair queue, a bounded wait.

design:

    acquire(cancel, client)
      cancel already set ............................ raise Cancelled        (nothing changes)
      lock held:
        free slot and nobody waiting ................ take it, return Grant  (fast path)
        the gate is full:
          the client holding most places holds two
          or more places more than ``client`` ....... its newest waiter is displaced, and
                                                      this call takes over its gate place
          else ...................................... raise Busy(queue_full) (refusal path)
        else append a waiter record
      with a build-time estimate: read the clock, fix the deadline, and under the lock
        its place cannot start within its wait ...... raise Busy(deadline)    (at once)
      fix one deadline, wait on the record's Condition
      the wait ends in exactly one way, decided under the lock:
        promoted (a releaser handed us its slot) .... return Grant
        displaced (a newcomer took our place) ....... raise Busy(displaced)
        refused late (the estimate grew) ............ raise Busy(deadline)
        deadline passed ............................. raise Busy(timeout)
        cancel set .................................. raise Cancelled
                                                     (a slot handed over at that same instant
                                                      is passed on, never dropped)

One ``threading.Lock`` guards every field. Each waiter owns a ``threading.Condition`` built on
that lock; it is notified when, and only when, a releaser hands that waiter a slot, a newcomer
displaces it or a walk refuses it late (see below). A freed slot goes straight to a waiter, so
``_active`` does not drop and a newcomer on the fast path can never overtake a waiter (no
barging).

Fairness among clients (``client`` is any hashable name for whoever asks; None is one anonymous
client). ``_clients`` maps each client with waiters to its own FIFO of them, in turn order: a
freed slot goes to the oldest waiter of the first client in turn, and that client, if it still
waits, goes to the back of the turn (round-robin in the order the clients' waits began, FIFO
within each). A full queue displaces the newest waiter of the client holding most places when
that client holds at least two more than the newcomer's (longest-queue drop; ties: the client
whose newest waiter joined last), so a client with few places always gets in while another holds
many. With one client this is exactly a strict FIFO queue with a refusal when full. ``_waiters``
holds the same records in arrival order, for the counts.

The admission gate is a ``queue.Queue(maxsize=queue)``, the one count of queue places. It is
only ever touched under our lock and never blocks: a newcomer asks it ``full()``, and when it is
not, takes a place with ``put_nowait`` (which then cannot fail: nobody else touches the gate
meanwhile); a place is returned with ``get_nowait``. Asking first, rather than letting a
refused ``put_nowait`` raise ``queue.Full``, spares the refusal path an exception raised and
caught inside it: that alone cost about a third of a refused ``put_nowait`` (see
``benchmarks/micro.py``). So "holds a gate place" and "is in ``_waiters``" are the same
statement whenever the lock is free.
Whoever takes a waiter out of ``_waiters`` returns its gate place: the releaser on promotion,
the refuser of a late waiter, the waiter itself on timeout, cancellation or an error during
the wait. A displaced waiter's
place is not returned: it passes, under the lock, to the newcomer that displaced it (the gate
was tried first and was full; it stays full). ``queue=0`` builds no gate at all, because
``queue.Queue(maxsize=0)`` would be unbounded.

No wasted waits (``deadline=True``, the default). A grant a waiter was promoted to is timed,
from its promotion (the waiter's last clock reading before it saw its slot) to its release (a
reading taken just before the lock): a grant is held for exactly its build, so the limiter
measures build time itself, whatever the build's outcome (a build that raised held its slot
too: the queue drains at the pace slots come free, and a quick failure only lowers the
estimate, the safe way). Fast-path grants are not timed: the fast path never reads the clock.
The estimate is a low percentile of the last ``ESTIMATE_SAMPLES`` timings (the
``(n - 1) // 4``-th smallest of n: the smallest of four, the fourth of sixteen), none before
``ESTIMATE_AFTER`` of them: conservative on purpose, since refusing a leader who would have
got in is worse than letting it wait, and most builds take longer than it.

With an estimate E, a waiter's estimated start is worked out by walking the queue in the
order it will be promoted (round-robin across clients, FIFO within each: the order of
``_clients`` is the turn order, so the k-th waiter of a client is served in round k, after
every client before it in turn that still has k + 1 waiters):

    start(p) = now + free[p % active] + (p // active) * E

p being the number of waiters kept ahead of it, ``free`` the times until each slot frees,
soonest first: E less the time already run for a timed holder (0 once it overran), E for a
slot just handed over, 0 for any other (a fast-path grant, whose start is unknown: counted
as finishing now). A waiter whose estimated start is later than its deadline (exactly at it
is in time; a deadline already passed is the waiter's own timeout, and a waiter that has not
fixed its deadline yet is skipped) is refused with ``Busy("deadline")``, its turn passing to
the next waiter of its client; its Retry-After is ``ceil(start - deadline)`` (when the same
place would have been in time), but never less than the limiter's ``retry_after``: the
estimate may lengthen the figure every refusal carries, never shorten it. Refused waiters do
not count in anybody's p, and taking a waiter out never moves another one back, so one
refusal never causes another.

The walk runs when a newcomer has just queued (it reads the clock first, outside the lock,
then fixes its deadline and walks under the lock: refused, it never waits) and at each
release of a timed grant (the estimate may have grown, and the line moved): a waiter refused
then is woken at once, taken out of the queue and its gate place returned by the refuser,
and counted by it. A newcomer that displaced a waiter and is then refused late displaced one
that was late too: the victim, the newest waiter of a client holding more places, comes
after it in line. ``deadline=False``, or fewer than ``ESTIMATE_AFTER`` timings, change
nothing at all.

Resizing (``resize(active, queue)``, under the lock; what the Redis fallback uses to admit
only its process's share of a budget). Growing promotes at once: while a waiter is queued and
fewer than ``active`` slots are held, the next waiter in turn gets a new slot (``_active``
grows, its gate place is returned), as a release would hand it one. Shrinking evicts
nobody: ``_active`` and the queue may stay above the new figures until builds end and
waiters leave. Meanwhile a release hands its slot over only while no more slots are held
than there are (``_hand_off_or_free``: otherwise the slot goes back, ``_active`` drops),
and the walk above counts as freeing a slot for a waiter only the last ``active`` of the
slots held (the first ones to end bring ``_active`` down to size). The gate follows: its
``maxsize`` is set to the new size under the Queue's own mutex (a gate fuller than that
is full, and takes places back as before); at ``queue=0`` it stays, for the places still
taken, but is asked no more (``_always_full``). ``_max_places_to_displace`` (the
displacement bound) and ``_timing`` follow the new size. So every rule above holds again
once the limiter is back within its figures, and a slot or a place is never lost or counted
twice on the way.

The fast path and the refusal path never read the clock and allocate nothing but the grant or
the exception they return; the fast path does no client bookkeeping at all. The refusal path
compares the caller with ``_alone_in_queue`` (the one client waiting, if only one is): with one
client, the common case of a caller that passes none, that is all it adds; otherwise one
dictionary look-up, and a look at the other clients only when a displacement is possible (a
client holding ``c`` places can take one over only from a client holding ``c + 2``, which
needs ``queue >= 2c + 2``: a client holding more than ``_max_places_to_displace`` is refused
without a look at the others).
"""

from __future__ import annotations

import math
import queue as _queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from ._cancel import POLL_INTERVAL, CancelToken
from ._errors import Busy, Cancelled
from ._grant import Grant, LimiterStats
from ._grant import LimiterFigures as LimiterFigures  # where reachlimit.redis imports it from

# Module-level names: the refusal path is a handful of bytecodes, and lookups show.
_QUEUE_FULL = Busy.QUEUE_FULL
_DISPLACED = Busy.DISPLACED
_DEADLINE = Busy.DEADLINE

__all__ = ["ColdLimiter", "Grant", "LimiterStats"]


class _LocalGrant(Grant):
    """A slot of a :class:`ColdLimiter` in this process."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: ColdLimiter) -> None:
        self._limiter = limiter
        self._held = True  # guarded by limiter._lock once the grant is handed out

    def _give_back(self, strict: bool) -> None:
        limiter = self._limiter
        lock = limiter._lock
        lock.acquire()
        try:  # Grant._mark_released, written out: the hot release saves the call
            if not self._held:
                if strict:
                    raise RuntimeError("grant released twice")
                return
            self._held = False
            limiter._hand_off_or_free()
        finally:
            lock.release()


class _TimedGrant(_LocalGrant):
    """A slot a waiter was promoted to, held since ``started`` (the limiter's clock): its
    release records how long it was held (see the module's design note)."""

    __slots__ = ("_started",)

    def __init__(self, limiter: ColdLimiter, started: float) -> None:
        self._limiter = limiter
        self._held = True  # guarded by limiter._lock once the grant is handed out
        self._started = started

    def _give_back(self, strict: bool) -> None:
        limiter = self._limiter
        try:
            now = limiter._clock()  # before the lock: never later than the release
        except BaseException:
            with limiter._lock:  # the slot is returned all the same, untimed
                if self._held:
                    self._held = False
                    limiter._holding.discard(self)
                    limiter._hand_off_or_free()
            raise
        with limiter._lock:
            if self._mark_released(strict):
                limiter._timed_release(self, now)


class _Waiter:
    """A queued leader of ``client``, the ``seq``-th to join. ``granted``, ``displaced`` and
    ``late`` are guarded by the limiter's lock; at most one of them is ever set. ``deadline``
    (the clock's time its wait ends; None until the waiter fixed it) and ``retry`` (a late
    refusal's Retry-After) are guarded by the lock too."""

    __slots__ = ("cond", "granted", "displaced", "late", "client", "seq", "deadline", "retry")

    def __init__(self, lock: threading.Lock, client: Hashable, seq: int) -> None:
        self.cond = threading.Condition(lock)
        self.granted = False
        self.displaced = False
        self.late = False
        self.client = client
        self.seq = seq
        self.deadline: float | None = None
        self.retry = 1


class ColdLimiter(LimiterFigures):
    """At most ``active`` builds at once; at most ``queue`` leaders waiting, each at most
    ``wait`` seconds, shared fairly between clients (``acquire(client=...)``): first-in
    first-out within a client, freed slots round-robin across the waiting clients, and a full
    queue displaces the newest waiter of the client holding most places when that client holds
    at least two more than the newcomer's. With one client (``None`` for everyone) it is a
    strict first-in first-out queue.

    ``retry_after`` is the whole number of seconds put on every :class:`Busy` (a
    ``"deadline"`` one's may be longer: worked out from the estimate). ``clock`` is a
    monotonic clock in seconds, read only by callers that really wait and by the releases
    of the grants they were promoted to.

    ``deadline`` (default True): once ``ESTIMATE_AFTER`` promoted grants have been timed, a
    leader whose place in the queue cannot start within its wait by the estimate of build
    time is refused with ``Busy("deadline")`` at once, and a waiter whose place falls behind
    as the estimate grows is refused then (see the module's design note). False: never.
    """

    #: Timed grants the estimate of build time needs before the first ``deadline`` refusal.
    ESTIMATE_AFTER = 4
    #: How many of the latest timed grants the estimate is taken from.
    ESTIMATE_SAMPLES = 16

    #: Longest single wait when a cancel token must be watched (see ``reachlimit._cancel``);
    #: an instance attribute of the same name overrides it (tests wake waiters more often).
    CANCEL_POLL_INTERVAL = POLL_INTERVAL

    #: The admission observer: called with no argument in a leader's own thread, with the
    #: lock free, once the leader has joined the queue and before it waits (never on the fast
    #: path or the refusal path). A metrics exporter publishes the new queue length from it.
    #: It must not raise: an exception from it propagates, with the place given back.
    on_queued: Callable[[], None] | None = None

    def __init__(
        self, active: int = 2, queue: int = 8, wait: float = 3.0, retry_after: int = 2,
        *,
        clock: Callable[[], float] = time.monotonic,
        deadline: bool = True,
    ) -> None:
        self._set_figures(active, queue, wait, retry_after)
        if not isinstance(deadline, bool):
            raise ValueError("deadline is True or False")
        self._clock = clock
        # Promoted grants are timed, for the estimate (never without a queue: nobody waits).
        self._deadline_on = deadline  # kept for resize, which sets _timing again
        self._timing = deadline and queue > 0
        self._lock = threading.Lock()
        # The admission gate; None for queue=0 (maxsize=0 would mean "unbounded").
        self._gate: _queue.Queue[None] | None = _queue.Queue(maxsize=queue) if queue else None
        self._gate_full = self._gate.full if self._gate is not None else _always_full
        # Everything below is guarded by _lock.
        self._active = 0
        self._waiters: deque[_Waiter] = deque()  # every waiter, in arrival order
        # Each waiting client's own waiters (FIFO), the clients in turn order: the first one
        # is served next. A client is here exactly while it has a waiter.
        self._clients: dict[Hashable, deque[_Waiter]] = {}
        self._waiters_of = self._clients.get  # bound once: the refusal path calls it
        # The one client with waiters while there is exactly one, else _NOT_ALONE (compared
        # with "is": an equal but distinct name just takes the general look).
        self._alone_in_queue: Hashable = _NOT_ALONE
        self._joined = 0  # waiters ever queued: the next waiter's seq
        self._max_places_to_displace = (queue - 2) // 2
        self._displaced = 0
        self._peak_active = 0
        self._peak_queued = 0
        self._acquired = 0
        self._rejected_full = 0
        self._rejected_timeout = 0
        self._cancelled = 0
        self._rejected_deadline = 0
        # The timed grants held now (promotions; each knows its start), the latest timings
        # and the estimate of build time from them (None before ESTIMATE_AFTER timings).
        self._holding: set[_TimedGrant] = set()
        self._durations: deque[float] = deque(maxlen=self.ESTIMATE_SAMPLES)
        self._estimate: float | None = None

    # -- public ---------------------------------------------------------------------------

    def acquire(
        self, cancel: CancelToken | None = None, client: Hashable = None
    ) -> Grant:
        """Take a build slot, waiting in the queue if needed; return the :class:`Grant`.

        ``client`` names whoever asks (any hashable; None is one anonymous client): queue
        places are shared fairly among clients (see the module's design note).

        Raises ``Cancelled`` if ``cancel`` is set before or while waiting, ``Busy("queue_full")``
        at once when every queue place is taken (and none can be taken over),
        ``Busy("displaced")`` when a leader of a client holding fewer places took this
        waiter's place, ``Busy("deadline")`` (at once, or while waiting) when its place cannot
        start within its wait by the estimate of build time, ``Busy("timeout")`` when the
        wait ends without a slot. On every raise the limiter is left exactly as if the call
        never happened (but for its counters and the estimate).
        """
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        # Explicit acquire/release rather than "with": the two hot paths are short enough
        # that the context-manager protocol is a measurable share of their cost.
        lock = self._lock
        lock.acquire()
        try:
            if self._active < self._capacity and not self._waiters:
                self._active += 1
                self._acquired += 1
                if self._active > self._peak_active:
                    self._peak_active = self._active
                return _LocalGrant(self)
            if self._gate_full():
                # Every place is taken: the client alone in the queue holds them all and can
                # take none over; another may displace a waiter (the module's design note).
                if client is self._alone_in_queue:
                    self._rejected_full += 1
                    waiter = None
                else:
                    mine = self._waiters_of(client)
                    places = 0 if mine is None else len(mine)
                    if places > self._max_places_to_displace or not self._displace_for(places):
                        self._rejected_full += 1
                        waiter = None
                    else:
                        waiter = self._join(client, mine)
            else:
                assert self._gate is not None  # (only a gate can have room)
                self._gate.put_nowait(None)
                waiter = self._join(client, self._clients.get(client))
                if len(self._waiters) > self._peak_queued:
                    self._peak_queued = len(self._waiters)
        finally:
            lock.release()
        if waiter is None:
            raise Busy(_QUEUE_FULL, self._retry_after)
        # Racy read: an estimate, once made, stays; one made just now is used from the next
        # walk on (a timed release's), so reading it unlocked only delays the first check.
        if self._estimate is not None:
            self._refuse_if_late(waiter)
        observer = self.on_queued
        if observer is not None:
            try:
                observer()
            except BaseException:
                with lock:
                    self._give_up(waiter)
                raise
        return self._wait_for_slot(waiter, cancel)

    def occupy(self) -> Grant:
        """A slot for a build admitted by another limiter (a shared limiter's grant running
        in this process), taken at once, whatever the capacity, so that this limiter counts
        it as running: its own admissions wait for it as for any build. It never waits, is
        never refused and is not counted as acquired; its release is a grant's release (a
        slot freed while more are held than ``active`` goes back to the pool, as after a
        shrink). Used by ``reachlimit.redis``'s fallback, so that what a process admits
        while Redis is away includes the shared builds it was running when Redis went."""
        with self._lock:
            self._active += 1
            return _LocalGrant(self)

    def stats(self) -> LimiterStats:
        with self._lock:
            return LimiterStats(
                active=self._active,
                queued=len(self._waiters),
                peak_active=self._peak_active,
                peak_queued=self._peak_queued,
                acquired=self._acquired,
                rejected_full=self._rejected_full,
                rejected_timeout=self._rejected_timeout,
                cancelled=self._cancelled,
                capacity_active=self._capacity,
                capacity_queue=self._queue_capacity,
                wait=self._wait,
                displaced=self._displaced,
                deadline=self._rejected_deadline,
            )

    def resize(self, active: int | None = None, queue: int | None = None) -> None:
        """Change the limiter's capacities from now on: at most ``active`` builds at once
        and ``queue`` queue places (a figure left out, or None, stays as it is), checked as
        at construction (``ValueError``, the same messages; nothing changes then).

        Growing takes effect at once: each new slot goes to the next waiter in turn (the
        waiter is promoted now, as by a release), and newcomers find the new places.
        Shrinking takes nothing away from anybody: every build running goes on to its
        end, every queued waiter keeps its place and its wait; only newcomers see the
        smaller figures. Until enough builds have ended, a freed slot goes back to the pool
        instead of to a waiter, and the queue takes a newcomer only below its new size (a
        full queue may still displace, by the fairness rule, as for the new size: the
        count does not grow). So for a while ``stats()`` may show ``active`` above
        ``capacity_active`` or ``queued`` above ``capacity_queue``, both only going down.
        ``queue=0`` stops queueing (waiters already queued stay); the estimate of build
        time is kept. Callable from any thread; see the module's design note."""
        with self._lock:
            self._set_figures(
                self._capacity if active is None else active,
                self._queue_capacity if queue is None else queue,
                self._wait,
                self._retry_after,
            )
            places = self._queue_capacity
            if places:
                if self._gate is None:  # built with queue=0
                    self._gate = _queue.Queue(maxsize=places)
                else:
                    with self._gate.mutex:  # the Queue's own lock guards its maxsize
                        self._gate.maxsize = places
                self._gate_full = self._gate.full
            else:
                # The gate stays, for the places still taken, but takes nobody more.
                self._gate_full = _always_full
            self._max_places_to_displace = (places - 2) // 2
            self._timing = self._deadline_on and places > 0
            while self._waiters and self._active < self._capacity:
                waiter = self._next_in_turn()
                self._return_gate_place()
                self._active += 1  # a new slot, straight to the waiter
                waiter.granted = True
                waiter.cond.notify()
            if self._active > self._peak_active:
                self._peak_active = self._active

    @property
    def build_estimate(self) -> float | None:
        """Racy read: the conservative estimate of one build's time in seconds that
        ``deadline`` refusals use (see the module's design note), None until
        ``ESTIMATE_AFTER`` promoted grants have been timed or with ``deadline=False``."""
        return self._estimate

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<ColdLimiter active={s.active}/{s.capacity_active} "
            f"queued={s.queued}/{s.capacity_queue} wait={s.wait}>"
        )

    # -- the queue and its clients, under _lock --------------------------------------------

    def _join(self, client: Hashable, mine: deque[_Waiter] | None) -> _Waiter:
        """Queue a waiter of ``client`` (whose waiters are ``mine``), its gate place taken."""
        waiter = _Waiter(self._lock, client, self._joined)
        self._joined += 1
        self._waiters.append(waiter)
        if mine is None:
            self._clients[client] = deque((waiter,))  # a new client waits last in turn
            self._alone_in_queue = client if len(self._clients) == 1 else _NOT_ALONE
        else:
            mine.append(waiter)
        return waiter

    def _displace_for(self, places: int) -> bool:
        """A newcomer whose client holds ``places`` found the queue full: displace the newest
        waiter of the client holding most places (ties: the one whose newest waiter joined
        last) if that client holds at least ``places + 2``. Its gate place is left taken, for
        the newcomer. Returns whether a waiter was displaced."""
        biggest = max(self._clients.values(), key=lambda q: (len(q), q[-1].seq))
        if len(biggest) < places + 2:
            return False
        victim = biggest.pop()  # never its last waiter: it held two or more
        self._waiters.remove(victim)
        victim.displaced = True
        victim.cond.notify()
        self._displaced += 1
        return True

    def _next_in_turn(self) -> _Waiter:
        """Take the waiter to promote out of the queue: the oldest of the first client in
        turn, which then goes to the back of the turn if it still waits."""
        clients = self._clients
        client = next(iter(clients))
        mine = clients.pop(client)
        waiter = mine.popleft()
        if mine:
            clients[client] = mine
        else:
            self._alone_in_queue = next(iter(clients)) if len(clients) == 1 else _NOT_ALONE
        if waiter is self._waiters[0]:  # always so with one client
            self._waiters.popleft()
        else:
            self._waiters.remove(waiter)
        return waiter

    def _leave_queue(self, waiter: _Waiter) -> None:
        """Take a waiter that was neither promoted nor displaced out of the queue and return
        its gate place. Called with _lock held, by the waiter itself (timeout, cancellation,
        error)."""
        self._waiters.remove(waiter)
        mine = self._clients[waiter.client]
        mine.remove(waiter)
        if not mine:
            del self._clients[waiter.client]
            clients = self._clients
            self._alone_in_queue = next(iter(clients)) if len(clients) == 1 else _NOT_ALONE
        self._return_gate_place()

    def _return_gate_place(self) -> None:
        assert self._gate is not None
        self._gate.get_nowait()

    # -- slots ----------------------------------------------------------------------------

    def _hand_off_or_free(self) -> bool:
        """A slot is free: give it to the next waiter in turn, else back to the pool (also
        while more slots are held than there are since a shrink: ``resize``). Whether it
        was handed over. Called with _lock held."""
        if self._waiters and self._active <= self._capacity:
            waiter = self._next_in_turn()
            self._return_gate_place()
            waiter.granted = True  # _active is unchanged: the slot changes hands
            waiter.cond.notify()
            return True
        self._active -= 1
        return False

    def _wait_for_slot(self, waiter: _Waiter, cancel: CancelToken | None) -> Grant:
        """Wait as a queued leader until promoted, timed out or cancelled.

        Runs in the requesting thread, with _lock not held on entry. ``cancel.is_set()`` and
        the clock are called outside the lock."""
        outcome: str | type[Cancelled] | None = None  # a Busy reason, Cancelled or granted
        try:
            # Fixed already (by _refuse_if_late, in this thread) when there is an estimate.
            deadline = waiter.deadline
            if deadline is None:
                deadline = self._clock() + self._wait
            while True:
                # Checked first on every turn, so a cancel that arrives together with the
                # promotion wins: its client is gone, and _give_up passes the slot on.
                if cancel is not None and cancel.is_set():
                    outcome = Cancelled
                    break
                now = self._clock()  # a promotion seen below is timed from here
                remaining = deadline - now
                with self._lock:
                    waiter.deadline = deadline  # from now on the walk can refuse it late
                    # Promotion is looked at before the deadline: a slot handed over before
                    # the waiter noticed its time was up is kept (a grant, not a timeout).
                    if waiter.granted:
                        break
                    if waiter.displaced or waiter.late or remaining <= 0:
                        outcome = (
                            _DISPLACED if waiter.displaced
                            else _DEADLINE if waiter.late
                            else Busy.TIMEOUT
                        )
                        break
                    if cancel is not None and remaining > self.CANCEL_POLL_INTERVAL:
                        remaining = self.CANCEL_POLL_INTERVAL
                    # A huge (finite) wait is waited in pieces the OS timer can hold.
                    waiter.cond.wait(min(remaining, threading.TIMEOUT_MAX))
        except BaseException:
            # An exception thrown into cond.wait() or out of cancel.is_set() or the clock.
            with self._lock:
                self._give_up(waiter)
            raise
        with self._lock:
            if outcome is None:
                self._acquired += 1
                if not self._timing:
                    return _LocalGrant(self)
                grant = _TimedGrant(self, now)
                self._holding.add(grant)
                return grant
            if waiter.displaced:
                # Displaced before we could leave (counted by the displacer), whatever we
                # were about to report: the place is already the newcomer's.
                outcome = _DISPLACED
            elif waiter.late:
                # Refused late before we could leave (counted and taken out of the queue by
                # the refuser), whatever we were about to report.
                outcome = _DEADLINE
            else:
                self._give_up(waiter)
                if outcome is Cancelled:
                    self._cancelled += 1
                else:
                    self._rejected_timeout += 1
        if outcome is Cancelled:
            raise Cancelled()
        raise Busy(outcome, waiter.retry if outcome is _DEADLINE else self._retry_after)

    def _give_up(self, waiter: _Waiter) -> None:
        """The waiter leaves without keeping a slot. Called with _lock held."""
        if waiter.granted:
            # Promoted at the instant we gave up: pass the slot on, never drop it.
            self._hand_off_or_free()
        elif not (waiter.displaced or waiter.late):
            # (a displaced waiter's place is the newcomer's already; a late one's was
            # returned by its refuser)
            self._leave_queue(waiter)

    # -- no wasted waits: the estimate of build time and the deadline refusals -------------

    def _refuse_if_late(self, waiter: _Waiter) -> None:
        """A newcomer has just queued and there is an estimate: fix its deadline and walk the
        queue; raise ``Busy("deadline")`` if its place cannot start in time. Runs in the
        newcomer's thread, with _lock not held on entry; the clock is read outside it."""
        try:
            now = self._clock()
        except BaseException:
            with self._lock:
                self._give_up(waiter)
            raise
        with self._lock:
            if waiter.granted or waiter.displaced:
                return  # promoted or displaced meanwhile: the wait sees it at once
            waiter.deadline = now + self._wait
            self._refuse_late(now)
            if not waiter.late:
                return
            retry = waiter.retry
        raise Busy(_DEADLINE, retry)

    def _timed_release(self, grant: _TimedGrant, now: float) -> None:
        """A timed grant was released at ``now``: record how long it was held, pass its slot
        on, and refuse the waiters who are now late. Called with _lock held."""
        self._holding.discard(grant)
        durations = self._durations
        durations.append(max(0.0, now - grant._started))
        if len(durations) >= self.ESTIMATE_AFTER:
            self._estimate = sorted(durations)[(len(durations) - 1) // 4]
        handed_over = self._hand_off_or_free()
        if handed_over and self._waiters and self._estimate is not None:
            self._refuse_late(now, fresh=1)

    def _refuse_late(self, now: float, fresh: int = 0) -> None:
        """Refuse, with ``Busy("deadline")``, every waiter whose estimated start is later
        than its deadline (see the module's design note for the formula). ``fresh`` slots
        were handed over just now. Called with _lock held and an estimate made."""
        estimate = self._estimate
        assert estimate is not None
        active = self._capacity
        # When each slot frees next, soonest first (a holder that read the clock after this
        # walk's reading has run nothing yet). More held than there are slots (a shrink,
        # ``resize``): the first ones to end free no slot for a waiter, only the rest do.
        free = [estimate - min(estimate, max(0.0, now - g._started)) for g in self._holding]
        free.extend([estimate] * fresh)
        free.extend([0.0] * (max(self._active, active) - len(free)))
        free.sort()
        del free[:len(free) - active]
        late: list[tuple[_Waiter, float]] = []
        kept = 0  # waiters kept so far, in the order they will be promoted
        turn = [iter(mine) for mine in self._clients.values()]  # one round-robin round
        while turn:
            next_round = []
            for mine in turn:
                for waiter in mine:  # this client's next waiter (a late one passes its turn)
                    start = now + free[kept % active] + (kept // active) * estimate
                    # (a waiter past its deadline is timing out: that is its own to see)
                    deadline = waiter.deadline
                    if deadline is not None and now < deadline < start:
                        late.append((waiter, start))
                        continue
                    kept += 1
                    next_round.append(mine)
                    break
            turn = next_round
        for waiter, start in late:
            self._leave_queue(waiter)
            waiter.late = True
            assert waiter.deadline is not None
            waiter.retry = max(self._retry_after, math.ceil(start - waiter.deadline))
            waiter.cond.notify()
            self._rejected_deadline += 1


#: ``_alone_in_queue`` when no client, or several, wait: a name nobody passes.
_NOT_ALONE: Hashable = object()


def _always_full() -> bool:
    """The gate of a limiter without queue places (built, or resized, with queue=0)."""
    return True
