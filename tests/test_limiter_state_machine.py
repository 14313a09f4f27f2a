"""ColdLimiter against a model, step by step, and the same races free running.

* ``test_limiter_state_machine``: a Hypothesis ``RuleBasedStateMachine``. Every rule starts,
  releases (normally, early, twice, or from a raising body), cancels, expires or breaks (a
  cancel object or clock that raises) one real client thread, or a crowd of them, or hands a
  slot to a waiter pinned outside the lock and then cancels / expires / breaks it, or
  displaces a pinned waiter and then cancels / expires it; then it waits, on Events and on
  ``stats()`` polled with a bounded timeout, for exactly the effect the model predicts. Each
  leader asks for a client drawn from the example's set (four, two, one heavy and two light,
  or one alone). The model is the rules of fair admission (``tests/support/stress.py``,
  ``FairQueue``): which waiter a freed slot goes to (round-robin across the waiting clients
  in the order their waits began, FIFO within each), which waiter a leader finding the queue
  full displaces (the newest of the client holding most places, if it holds two more than
  the leader's) and that the displaced one's call ends with "displaced" while nobody else
  moves, queue_full otherwise. It checks every counter (``displaced`` too), the bounds, one
  gate place per waiter, no idle slot while anybody waits, the limiter's own queues and turn
  against the model's, and that neither the fast path nor the refusal path reads the clock.
  Deadlines come from an injected per-client clock, so a timeout is caused on purpose, never
  by the machine being slow. Teardown drains everything and checks that nothing leaked.
* ``test_release_races``: the same races free running (a release against a cancel, an expiry,
  a raising cancel object or clock, started together from a Barrier with a random skew):
  either side may win, exactly one does, nothing is lost.

Each test prints what it tried (run with ``-s`` to see it).

Short form (the default, part of every run)::

    python -m pytest tests/test_limiter_state_machine.py -s

Long form (about 10x the examples and rounds, with shrinking)::

    REACHTEST_STRESS=long python -m pytest tests/test_limiter_state_machine.py -s

``REACHTEST_STRESS_SEED=<int>`` changes the seed (default 20261129); a failure prints the
seed and the state machine's failing program of rules (every step), which
``REACHTEST_STRESS_SHRINK=1`` (implied by the long form) shrinks to a minimal one.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import pytest
from hypothesis import seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from reachlimit import ColdLimiter
from tests.support import stress
from tests.support.limiter import check_white_box

# The client threads live in tests/support/stress.py; tests/test_redis_stress.py reaches them
# (and WAIT) through this module.
from tests.support.stress import (
    LOSER_OUTCOME,
    WAIT,
    Client,
    ClockBroken,
    per_client_clock,
    trigger,
)

pytestmark = stress.MARKS

#: Shrinking a failure that shows up as a hang costs stress.STEP_TIMEOUT per attempt, far beyond the
#: short form's budget: the short form reports the failing program as found (every step is
#: printed); the long form, or REACHTEST_STRESS_SHRINK=1, shrinks it to a minimal one.
SHRINK = stress.LONG or os.environ.get("REACHTEST_STRESS_SHRINK", "") == "1"


# The state machine
#: Cancel-slice length used by the machine (the library allows at most 50 ms); a documented
#: class attribute, shortened on the instance so a cancel or an expiry lands in a few ms.
SLICE = 0.002


#: Figures printed at the end of the state-machine test.
MACHINE_COUNTS: Counter[str] = Counter()


#: The clients leaders come from (``acquire(cancel, client)``; None is the anonymous client
#: of ``acquire(cancel)``). Each example draws one set: four clients alike, one client alone
#: (then the rules are strict FIFO with a refusal when full), two alike, or one heavy client
#: and two light ones (displacements are frequent). A leader's client is the set's entry at
#: its drawn index (modulo the set's length), so each entry of a set is drawn equally often.
CLIENT_SETS: list[tuple[Hashable, ...]] = [
    ("a", "b", "c", None),
    (None,),
    ("a", "b"),
    ("a", "a", "b", "c"),
]


class LimiterMachine(RuleBasedStateMachine):
    """Model: ``holders`` (clients holding a slot) and ``model`` (the admitted waiters as the
    rules of fair admission keep them: each client's own FIFO, and the turn of the clients;
    see :class:`~tests.support.stress.FairQueue`). A freed slot must go to
    ``model.next_in_turn()``; a leader that finds the queue full must displace
    ``model.victim_for(...)``, or be refused when that is nobody; nothing else may move.
    ``queue`` lists the waiters in the order the model would promote them (``queue[0]`` is
    next in turn).

    What depends on the limiter's kind is in three hooks, which
    ``tests/test_redis_stress.py`` overrides to run this machine on ``RedisColdLimiter``:
    ``_admitted`` (a waiter has joined the queue), ``_trigger`` (end a waiter's wait) and
    ``_check_backend`` (the invariants read from the limiter's own state)."""

    def __init__(self) -> None:
        super().__init__()
        self.lim: ColdLimiter | None = None
        self.clients: list[Client] = []
        self.holders: list[Client] = []
        self.model: stress.FairQueue[Client] = stress.FairQueue()
        self.names: tuple[Hashable, ...] = CLIENT_SETS[0]
        self.expected: Counter[str] = Counter()
        self.ended = threading.Event()  # set by each client whose call ends

    # -- helpers -----------------------------------------------------------------------------

    @property
    def limiter(self) -> ColdLimiter:
        assert self.lim is not None
        return self.lim

    @property
    def queue(self) -> Sequence[Client]:
        """The waiters in the order the model promotes them: ``queue[0]`` is next in turn."""
        return self.model.promotion_order()

    def _spawn(self, *, cancel: bool, preset: bool = False, who: Hashable = None) -> Client:
        client = Client(
            len(self.clients), self.limiter, cancel=cancel, preset=preset, who=who,
            ended=self.ended,
        )
        self.clients.append(client)
        MACHINE_COUNTS["threads"] += 1
        return client.start()

    @staticmethod
    def _outcome(client: Client) -> str:
        assert client.done.wait(stress.STEP_TIMEOUT), f"{client}: acquire() did not return"
        assert client.outcome is not None
        return client.outcome

    def _expect(self, client: Client, outcome: str) -> None:
        got = self._outcome(client)
        assert got == outcome, f"{client} got {got} ({client.error!r}); the model says {outcome}"

    def _wait_for_move(self, what: str, mover: Client, also: tuple[Client, ...] = ()) -> None:
        """Wait until ``mover``'s call ends, or that of any other waiter of the model or of
        ``also``: then it must be ``mover``'s and nobody else's (``what`` is the model's
        word for the move)."""
        others = [w for w in self.model.arrival_order() if w is not mover] + list(also)
        deadline = time.monotonic() + stress.STEP_TIMEOUT
        while True:
            self.ended.clear()  # before the look: a call ending after it sets it again
            if mover.done.is_set() or any(w.done.is_set() for w in others):
                break
            left = deadline - time.monotonic()
            assert left > 0 and self.ended.wait(left), f"gave up waiting for: {what}"
        moved = [w for w in others if w.done.is_set()]
        assert not moved, f"{moved[0]} ended its call ({moved[0].outcome}), but the model: {what}"

    def _promote_next(self) -> None:
        """A slot was freed: the next waiter in turn must get it, nobody else may move."""
        if len(self.model):
            oldest = self.model.arrival_order()[0]
            nxt = self.model.next_in_turn()
            MACHINE_COUNTS["round_robin"] += nxt is not oldest  # fairness changed the order
            self._wait_for_move(f"the freed slot goes to {nxt}, next in turn", nxt)
            self._expect(nxt, "grant")
            self.holders.append(nxt)
            self.expected["acquired"] += 1
            MACHINE_COUNTS["promotions"] += 1
        self._settle()

    def _displaced(self, victim: Client, newcomer: Client) -> None:
        """``newcomer`` took ``victim``'s place: the victim's call ends with "displaced", the
        newcomer waits in its place, the counter moves, and nothing else does."""
        self._expect(victim, "displaced")
        self._wait_finished(victim)
        self.model.leave(victim)
        self.model.join(newcomer, newcomer.who)
        self.expected["displaced"] += 1
        lim = self.limiter
        stress.wait_for_step(
            "the displacement counted", lambda: lim.stats().displaced == self.expected["displaced"]
        )
        self._admitted(newcomer)
        MACHINE_COUNTS["displaced"] += 1

    def _settle(self) -> None:
        """Wait until the limiter shows the model's state, then check no waiter moved."""
        lim = self.limiter
        want = (len(self.holders), len(self.model))
        stress.wait_for_step(
            f"active/queued == {want}", lambda: (lim.stats().active, lim.stats().queued) == want
        )
        for waiter in self.model.arrival_order():
            assert not waiter.done.is_set(), (
                f"{waiter} left the queue ({waiter.outcome}) although it was not its turn"
            )

    def _wait_finished(self, client: Client) -> None:
        assert client.finished.wait(stress.STEP_TIMEOUT), f"{client} did not finish"
        if client.outcome == "grant":
            assert client.exit_result == "ok", f"{client}: {client.exit_result}"

    def _displacers(self) -> list[Hashable]:
        """The clients whose next leader would displace a waiter that has a cancel object."""
        lim = self.lim
        if lim is None or not len(self.model) or len(self.model) < lim.capacity_queue:
            return []
        found = []
        for who in dict.fromkeys(self.names):
            victim = self.model.victim_for(self.model.places(who))
            if victim is not None and victim.token is not None:
                found.append(who)
        return found

    # -- rules -------------------------------------------------------------------------------

    @initialize(active=st.integers(1, 3), queue=st.sampled_from([2, 0, 1, 3, 4, 2]))
    def make_limiter(self, active: int, queue: int) -> None:
        self.lim = ColdLimiter(active, queue, wait=WAIT, retry_after=2, clock=per_client_clock)
        self.lim.CANCEL_POLL_INTERVAL = SLICE  # type: ignore[misc]
        MACHINE_COUNTS["examples"] += 1

    @initialize(names=st.sampled_from(CLIENT_SETS))
    def choose_clients(self, names: tuple[Hashable, ...]) -> None:
        """The clients this example's leaders come from."""
        self.names = names

    @rule(
        kind=st.sampled_from(["cancel", "plain", "cancel", "plain", "preset"]),
        who=st.integers(0, 3),
    )
    def arrive(self, kind: str, who: int) -> None:
        """A new leader of client ``names[who % len(names)]`` calls acquire(), with a cancel object
        ("cancel"), without one ("plain": one long timed wait, it leaves the queue only by
        promotion or displacement) or with one already set ("preset": Cancelled at once,
        nothing changes). Otherwise: fast path, queued, displacing, or refused at once."""
        self._arrive(kind, self.names[who % len(self.names)])

    @rule(
        kind=st.sampled_from(["cancel", "plain"]), who=st.integers(0, 3), count=st.integers(2, 4)
    )
    def crowd(self, kind: str, who: int, count: int) -> None:
        """Up to ``count`` leaders of one client arrive one after another (each as in
        ``arrive``), as long as each one gets a slot or a place (a refusal is ``arrive``'s
        business): one client takes many places at once, which the rules then share out."""
        name, lim = self.names[who % len(self.names)], self.limiter
        for _ in range(count):
            full = len(self.model) >= lim.capacity_queue and (
                len(self.model) or len(self.holders) == lim.capacity_active
            )
            if full and self.model.victim_for(self.model.places(name)) is None:
                return
            self._arrive(kind, name)

    def _arrive(self, kind: str, who: Hashable) -> Client:
        lim = self.limiter
        MACHINE_COUNTS["steps"] += 1
        client = self._spawn(cancel=kind != "plain", preset=kind == "preset", who=who)
        if kind == "preset":
            self._expect(client, "cancelled")
            assert client.clock_reads == 0, "a cancel set beforehand read the clock"
            self._wait_finished(client)
            MACHINE_COUNTS["cancelled_at_once"] += 1
        elif len(self.holders) < lim.capacity_active and not len(self.model):
            self._expect(client, "grant")
            assert client.clock_reads == 0, "the fast path read the clock"
            self.holders.append(client)
            self.expected["acquired"] += 1
            MACHINE_COUNTS["fast_path"] += 1
        elif len(self.model) < lim.capacity_queue:
            self.model.join(client, who)
            stress.wait_for_step(
                f"{client} admitted",
                lambda: client.done.is_set() or lim.stats().queued == len(self.model),
            )
            assert not client.done.is_set(), f"{client} got {client.outcome}, not a queue place"
            self._admitted(client)
            MACHINE_COUNTS["queued"] += 1
        else:
            victim = self.model.victim_for(self.model.places(who))
            if victim is None:
                self._expect(client, "queue_full")
                assert client.clock_reads == 0, "the refusal path read the clock"
                self.expected["rejected_full"] += 1
                MACHINE_COUNTS["refused_full"] += 1
            else:
                self._wait_for_move(f"{client} displaces {victim}", victim, also=(client,))
                self._displaced(victim, client)
        self._settle()
        return client

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), mode=st.sampled_from(["exit", "release", "raise", "double"]))
    def leave(self, data: st.DataObject, mode: str) -> None:
        """A holder leaves its with-block: normally, after release(), raising, or after a
        double release (which must raise RuntimeError and create no capacity)."""
        self._leave(data.draw(st.sampled_from(self.holders), label="holder"), mode)

    def _leave(self, holder: Client, mode: str) -> None:
        MACHINE_COUNTS["steps"] += 1
        self.holders.remove(holder)
        holder.leave(mode)
        self._wait_finished(holder)
        self._promote_next()

    @precondition(lambda self: any(c.token for c in self.queue))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """A queued waiter's client leaves: Cancelled; its place is returned; nobody moves
        (its client, if that was its last waiter, is out of the turn)."""
        MACHINE_COUNTS["steps"] += 1
        victim = data.draw(st.sampled_from([c for c in self.queue if c.token]), label="victim")
        assert victim.token is not None
        victim.token.event.set()
        self._expect(victim, "cancelled")
        self.model.leave(victim)
        self.expected["cancelled"] += 1
        self._settle()

    @precondition(lambda self: any(c.token for c in self.queue))
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """A queued waiter's deadline passes (its own clock jumps to it): Busy(timeout)."""
        MACHINE_COUNTS["steps"] += 1
        victim = data.draw(st.sampled_from([c for c in self.queue if c.token]), label="victim")
        self._trigger(victim, "expire")
        self._expect(victim, "timeout")
        self.model.leave(victim)
        self.expected["rejected_timeout"] += 1
        self._settle()

    @precondition(lambda self: any(c.token for c in self.queue))
    @rule(data=st.data(), what=st.sampled_from(["token", "clock"]))
    def fault_while_waiting(self, data: st.DataObject, what: str) -> None:
        """The cancel object or the clock raises inside the wait: the error reaches the caller
        unchanged and the waiter's place is returned."""
        MACHINE_COUNTS["steps"] += 1
        victim = data.draw(st.sampled_from([c for c in self.queue if c.token]), label="victim")
        assert victim.token is not None
        if what == "token":
            victim.token.broken = True
        else:
            victim.break_clock()
        self._expect(victim, "error")
        wanted = stress.TokenBroken if what == "token" else ClockBroken
        assert isinstance(victim.error, wanted), repr(victim.error)
        self.model.leave(victim)
        self._settle()

    @precondition(lambda self: self._displacers())
    @rule(
        data=st.data(),
        what=st.sampled_from(["cancel", "expire"]),
        kind=st.sampled_from(["cancel", "plain"]),
    )
    def displace_then(self, data: st.DataObject, what: str, kind: str) -> None:
        """The waiter a newcomer displaces is pinned outside the lock (in its cancel object)
        when it is displaced; then its wait also ends another way (cancelled, or its deadline
        passes), then it wakes. The displacement was decided first, under the lock: it reports
        "displaced", and the newcomer keeps the place."""
        MACHINE_COUNTS["steps"] += 1
        who = data.draw(st.sampled_from(self._displacers()), label="client")
        victim = self.model.victim_for(self.model.places(who))
        assert victim is not None and victim.token is not None
        victim.token.pause_next_call()
        assert victim.token.paused.wait(stress.STEP_TIMEOUT), f"{victim} never looked at cancel"
        newcomer = self._spawn(cancel=kind == "cancel", who=who)
        lim, want = self.limiter, self.expected["displaced"] + 1
        stress.wait_for_step(
            f"{newcomer} displaces {victim}",
            lambda: newcomer.done.is_set() or lim.stats().displaced == want,
        )
        assert not newcomer.done.is_set(), (
            f"{newcomer} got {newcomer.outcome}; the model says it displaces {victim}"
        )
        assert not victim.done.is_set()
        self._trigger(victim, what)
        victim.token.resume.set()
        self._wait_for_move(f"{newcomer} displaces {victim}", victim, also=(newcomer,))
        MACHINE_COUNTS[f"race displace-then-{what}: {victim.outcome}"] += 1
        self._displaced(victim, newcomer)
        self._settle()

    # The slot is handed to the next waiter in turn while that waiter is pinned outside the
    # lock (in its cancel object's is_set()); then it is cancelled / expires / fails; then it
    # wakes. Whichever wins, exactly one does: the waiter keeps the slot, or passes it on to
    # the next waiter in turn (its own client has had its turn) or back to free. The schedule
    # is pinned, so the outcome is reproducible, as Hypothesis needs; the free-running
    # versions of these races are test_release_races.

    @precondition(lambda self: self.holders and self.queue and self.queue[0].token)
    @rule(data=st.data())
    def handoff_then_cancel(self, data: st.DataObject) -> None:
        self._race(data, "cancel")

    @precondition(lambda self: self.holders and self.queue and self.queue[0].token)
    @rule(data=st.data())
    def handoff_then_expire(self, data: st.DataObject) -> None:
        self._race(data, "expire")

    @precondition(lambda self: self.holders and self.queue and self.queue[0].token)
    @rule(data=st.data(), what=st.sampled_from(["token", "clock"]))
    def handoff_then_fault(self, data: st.DataObject, what: str) -> None:
        self._race(data, what)

    def _race(self, data: st.DataObject, what: str) -> None:
        MACHINE_COUNTS["steps"] += 1
        victim = self.queue[0]
        holder = data.draw(st.sampled_from(self.holders), label="holder")
        mode = data.draw(st.sampled_from(["exit", "release", "raise"]), label="mode")
        assert victim.token is not None
        victim.token.pause_next_call()
        assert victim.token.paused.wait(stress.STEP_TIMEOUT), f"{victim} never looked at cancel"
        self.holders.remove(holder)
        holder.leave(mode)
        self._wait_finished(holder)
        left = len(self.model) - 1
        stress.wait_for_step(
            f"the hand-off to {victim}", lambda: self.limiter.stats().queued == left
        )
        assert self.model.next_in_turn() is victim
        assert not victim.done.is_set()
        self._trigger(victim, what)
        victim.token.resume.set()
        outcome = self._outcome(victim)
        self._wait_finished(holder)
        MACHINE_COUNTS[f"race handoff-then-{what}: {outcome}"] += 1
        if outcome == "grant":
            # The hand-off won. The waiter holds the slot; its trigger is now moot except a
            # broken clock/token, which a holder never reads again.
            self.holders.append(victim)
            self.expected["acquired"] += 1
            self._settle()
            return
        wanted = LOSER_OUTCOME[what]
        assert outcome == wanted, f"{victim}: {outcome} ({victim.error!r}), expected {wanted}"
        if outcome == "cancelled":
            self.expected["cancelled"] += 1
        elif outcome == "timeout":
            self.expected["rejected_timeout"] += 1
        self._promote_next()  # the freed slot must reach the next waiter in turn, or be free

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def bounds_and_counters(self) -> None:
        if self.lim is None:
            return
        s = self.lim.stats()
        assert 0 <= s.active <= s.capacity_active
        assert 0 <= s.queued <= s.capacity_queue
        assert s.peak_active <= s.capacity_active and s.peak_queued <= s.capacity_queue
        assert (s.active, s.queued) == (len(self.holders), len(self.model))
        got = {k: getattr(s, k) for k in COUNTERS}
        want = {k: self.expected[k] for k in got}
        assert got == want, f"counters {got} != model {want}"
        self._check_backend()

    # -- what depends on the limiter's kind -----------------------------------------------------

    def _admitted(self, client: Client) -> None:
        """``client`` has just joined the queue."""
        if client.token is not None:  # its deadline must be fixed before it may expire
            assert client.deadline_fixed.wait(stress.STEP_TIMEOUT), (
                f"{client} never read the clock"
            )

    def _trigger(self, victim: Client, what: str) -> None:
        """End ``victim``'s wait the way ``what`` says (see :func:`trigger`)."""
        trigger(victim, what)

    def _check_backend(self) -> None:
        """The invariants only the limiter's own state shows: one gate place per waiter, no
        idle slot while anybody waits, and its clients' queues and turn those of the model."""
        check_white_box(self.limiter)
        turn, arrival = stress.limiter_queue(self.limiter)
        got = [(who, len(mine)) for who, mine in turn]
        want = [(who, len(fifo)) for who, fifo in self.model.turn()]
        assert got == want, f"the limiter's turn (client, places) {got}, the model's {want}"
        got_whos = [w.client for w in arrival]
        assert got_whos == [c.who for c in self.model.arrival_order()], got_whos

    # -- teardown ----------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.lim is not None:
                # Drain: every release promotes the next waiter until nobody is left.
                while self.holders:
                    holder = self.holders.pop(0)
                    holder.leave("exit")
                    self._wait_finished(holder)
                    self._promote_next()
                assert not len(self.model)
                s = self.lim.stats()
                assert (s.active, s.queued) == (0, 0), s
                for name, outcome in (("acquired", "grant"), ("displaced", "displaced")):
                    assert (
                        getattr(s, name)
                        == self.expected[name]
                        == sum(c.outcome == outcome for c in self.clients)
                    ), (name, s)
                self._check_backend()
        finally:
            stuck = self.cleanup()
        assert not stuck, f"threads still running after the drain: {stuck}"

    def cleanup(self) -> list[Client]:
        """Unblock every client thread (after a failure too: each waiter that is promoted
        then leaves at once, so the releases drain the queue) and join them; returns the
        ones still running."""
        for client in self.clients:
            if client.token is not None:
                client.token.event.set()
            client.go.set()
        deadline = time.monotonic() + stress.STEP_TIMEOUT
        for client in self.clients:
            client.thread.join(max(0.0, deadline - time.monotonic()))
        return [c for c in self.clients if c.thread.is_alive()]


#: The counters the model keeps, checked after every step.
COUNTERS = ("acquired", "rejected_full", "rejected_timeout", "cancelled", "displaced")


seed(stress.SEED)(LimiterMachine)


# A hang guard longer than the module's: the run's work is fixed (250 programs of up to 50
# steps), so a loaded machine makes it take longer and nothing else (about 60-75 s with two
# CPU hogs beside the suite on 2 cores); a lost wake-up still fails within one step's bound
# (stress.STEP_TIMEOUT).
@pytest.mark.timeout(1800 if stress.LONG else 300)
def test_limiter_state_machine() -> None:
    MACHINE_COUNTS.clear()

    def report(elapsed: float) -> None:
        print(
            f"\n[state machine] seed={stress.SEED} examples={MACHINE_COUNTS['examples']} "
            f"steps={MACHINE_COUNTS['steps']} threads={MACHINE_COUNTS['threads']} "
            f"fast={MACHINE_COUNTS['fast_path']} queued={MACHINE_COUNTS['queued']} "
            f"promotions={MACHINE_COUNTS['promotions']} "
            f"refused_full={MACHINE_COUNTS['refused_full']} "
            f"displaced={MACHINE_COUNTS['displaced']} "
            f"promoted out of arrival order={MACHINE_COUNTS['round_robin']} in {elapsed:.1f} s"
        )
        print(f"[state machine] races: {stress.races(MACHINE_COUNTS)}")

    examples, steps = (3000, 80) if stress.LONG else (250, 50)
    stress.run_machine(LimiterMachine, examples, steps, SHRINK, report=report)
    assert MACHINE_COUNTS["steps"] > 0
    # The fairness rules really decided something: displacements, and promotions that the
    # turn of the clients took out of arrival order.
    assert MACHINE_COUNTS["displaced"] > 0 and MACHINE_COUNTS["round_robin"] > 0, MACHINE_COUNTS


# Free-running races: a release and a cancel / expiry / failure of the oldest waiter
def _race_round(rng: random.Random, what: str, outcomes: Counter[str]) -> None:
    """One holder, the victim (oldest waiter) and a second waiter; the holder's release and
    the victim's trigger start together from a Barrier, with a random skew. Whoever wins,
    exactly one client holds the slot afterwards, the second waiter is next in line, and the
    drain leaves nothing behind."""
    lim = ColdLimiter(1, 2, wait=WAIT, retry_after=2, clock=per_client_clock)
    lim.CANCEL_POLL_INTERVAL = rng.choice([0.0005, 0.001, 0.002])  # type: ignore[misc]
    clients: list[Client] = []
    try:
        holder = Client(0, lim, cancel=False).start()
        clients.append(holder)
        assert holder.done.wait(stress.STEP_TIMEOUT) and holder.outcome == "grant"
        victim = Client(1, lim, cancel=True).start()
        clients.append(victim)
        assert victim.deadline_fixed.wait(stress.STEP_TIMEOUT)
        second = Client(2, lim, cancel=rng.random() < 0.5).start()
        clients.append(second)
        stress.wait_for_step("two waiters queued", lambda: lim.stats().queued == 2)
        barrier = threading.Barrier(2, timeout=stress.STEP_TIMEOUT)
        # A random skew (up to about one cancel slice) for one side: who gets there first.
        skew = rng.choice([0.0, rng.uniform(0, 0.0002), rng.uniform(0, 0.003)])

        def after_barrier(action: Callable[[], None], delay: float) -> Callable[[], None]:
            def run() -> None:
                barrier.wait()
                if delay:
                    # The skew, not a synchronisation (a spin would hold the GIL and stop
                    # the very thread it waits for).
                    time.sleep(delay)
                action()

            return run

        releaser_first = rng.random() < 0.5
        mode = rng.choice(["exit", "release", "raise"])
        racers = [
            threading.Thread(
                target=after_barrier(lambda: holder.leave(mode), 0.0 if releaser_first else skew),
                daemon=True,
            ),
            threading.Thread(
                target=after_barrier(
                    lambda: trigger(victim, what), skew if releaser_first else 0.0
                ),
                daemon=True,
            ),
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(stress.STEP_TIMEOUT)
        assert not any(r.is_alive() for r in racers)
        assert victim.done.wait(stress.STEP_TIMEOUT), "the victim never left its wait"
        assert holder.finished.wait(stress.STEP_TIMEOUT) and holder.exit_result == "ok"
        outcomes[f"{what}: {victim.outcome}"] += 1
        if victim.outcome == "grant":
            owner, queued = victim, 1
        else:
            assert victim.outcome == LOSER_OUTCOME[what], (victim.outcome, victim.error)
            assert second.done.wait(stress.STEP_TIMEOUT), "the slot the victim gave up was lost"
            owner, queued = second, 0
        stress.wait_for_step(
            f"one owner and {queued} waiter(s)",
            lambda: (lim.stats().active, lim.stats().queued) == (1, queued),
        )
        check_white_box(lim)
        assert owner.outcome == "grant"
        if queued:
            assert not second.done.is_set()
            owner.leave("exit")
            assert second.done.wait(stress.STEP_TIMEOUT) and second.outcome == "grant"
        second.leave("exit")
        for client in clients:
            assert client.finished.wait(stress.STEP_TIMEOUT), f"{client} did not finish"
        s = lim.stats()
        assert (s.active, s.queued) == (0, 0), s
        assert s.acquired == sum(c.outcome == "grant" for c in clients)
        assert s.cancelled == (victim.outcome == "cancelled")
        assert s.rejected_timeout == (victim.outcome == "timeout")
    finally:
        for client in clients:
            if client.token is not None:
                client.token.event.set()
            client.go.set()
        for client in clients:
            client.thread.join(stress.STEP_TIMEOUT)


def test_release_races() -> None:
    """Release racing cancel / expiry / a failing cancel object / a failing clock, free
    running: either side may win, exactly one does, and no slot or place is lost."""
    rounds = 4000 if stress.LONG else 400
    rng = random.Random(f"{stress.SEED}-races")
    outcomes: Counter[str] = Counter()
    started = time.monotonic()
    for _ in range(rounds):
        _race_round(rng, rng.choice(["cancel", "expire", "token", "clock"]), outcomes)
    print(
        f"\n[release races] seed={stress.SEED} {rounds} rounds in "
        f"{time.monotonic() - started:.1f} s: {dict(sorted(outcomes.items()))}"
    )
    assert sum(outcomes.values()) == rounds
