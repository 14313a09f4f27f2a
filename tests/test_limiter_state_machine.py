"""ColdLimiter against a model, step by step, and the same races free running.

* ``test_limiter_state_machine``: a Hypothesis ``RuleBasedStateMachine``. Every rule starts,
  releases (normally, early, twice, or from a raising body), cancels, expires or breaks (a
  cancel object or clock that raises) one real client thread, or hands a slot to a waiter
  pinned outside the lock and then cancels / expires / breaks it; then it waits, on Events and
  on ``stats()`` polled with a bounded timeout, for exactly the effect the model predicts.
  The model checks strict FIFO promotion, every counter, the bounds, one gate place per
  waiter, no idle slot while anybody waits, and that neither the fast path nor the refusal
  path reads the clock. Deadlines come from an injected per-client clock, so a timeout is
  caused on purpose, never by the machine being slow. Teardown drains everything and checks
  that nothing leaked.
* ``test_release_races``: the same races free running (a release against a cancel, an expiry,
  a raising cancel object or clock, started together from a Barrier with a random skew):
  either side may win, exactly one does, nothing is lost.

Each test prints what it tried (run with ``-s`` to see it).

Short form (the default, part of every run)::

    python -m pytest tests/test_limiter_state_machine.py -s

Long form (about 10x the examples and rounds, with shrinking)::

    REACHLIMIT_STRESS=long python -m pytest tests/test_limiter_state_machine.py -s

``REACHLIMIT_STRESS_SEED=<int>`` changes the seed (default 20261129); a failure prints the
seed and the state machine's failing program of rules (every step), which
``REACHLIMIT_STRESS_SHRINK=1`` (implied by the long form) shrinks to a minimal one.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from reachlimit import Busy, Cancelled, ColdLimiter
from tests.support import stress
from tests.support.limiter import check_white_box

pytestmark = stress.MARKS

#: Shrinking a failure that shows up as a hang costs stress.STEP_TIMEOUT per attempt, far beyond the
#: short form's budget: the short form reports the failing program as found (every step is
#: printed); the long form, or REACHLIMIT_STRESS_SHRINK=1, shrinks it to a minimal one.
SHRINK = stress.LONG or os.environ.get("REACHLIMIT_STRESS_SHRINK", "") == "1"


# The state machine
#: Each client's clock starts at 0 and moves only when a rule moves it, so a waiter's deadline
#: is exactly WAIT and "expire" is an exact event. A client without a cancel object waits in
#: one real timed wait of this length: it leaves only by promotion (or the final drain).
WAIT = 100_000.0


#: Cancel-slice length used by the machine (the library allows at most 50 ms); a documented
#: class attribute, shortened on the instance so a cancel or an expiry lands in a few ms.
SLICE = 0.002


_tls = threading.local()


#: Figures printed at the end of the state-machine test.
MACHINE_COUNTS: Counter[str] = Counter()


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
            self.resume.wait(stress.STEP_TIMEOUT)
        if self.broken:
            raise stress.TokenBroken("cancel object failed")
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

    def __init__(self, cid: int, lim: ColdLimiter, *, cancel: bool, preset: bool = False):
        self.cid = cid
        self.lim = lim
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
        return f"client{self.cid}"

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
                grant = self.lim.acquire(self.token)
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
            if self.outcome != "grant":
                return
            if not self.go.wait(stress.STEP_TIMEOUT * 6):
                self.exit_result = "never told to leave"
            self.exit_result = (
                stress.leave_grant(grant, self.mode)
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


class LimiterMachine(RuleBasedStateMachine):
    """Model: ``holders`` (clients holding a slot) and ``queue`` (admitted waiters in arrival
    order). A freed slot must go to ``queue[0]``; nothing else may move.

    What depends on the limiter's kind is in three hooks, which
    ``tests/test_redis_stress.py`` overrides to run this machine on ``RedisColdLimiter``:
    ``_admitted`` (a waiter has joined the queue), ``_trigger`` (end a waiter's wait) and
    ``_check_backend`` (the invariants read from the limiter's own state)."""

    def __init__(self) -> None:
        super().__init__()
        self.lim: ColdLimiter | None = None
        self.clients: list[Client] = []
        self.holders: list[Client] = []
        self.queue: list[Client] = []
        self.expected: Counter[str] = Counter()

    # -- helpers -----------------------------------------------------------------------------

    @property
    def limiter(self) -> ColdLimiter:
        assert self.lim is not None
        return self.lim

    def _spawn(self, *, cancel: bool, preset: bool = False) -> Client:
        client = Client(len(self.clients), self.limiter, cancel=cancel, preset=preset)
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

    def _promote_next(self) -> None:
        """A slot was freed: the oldest waiter must get it, nobody else may move."""
        if self.queue:
            nxt = self.queue.pop(0)
            self._expect(nxt, "grant")
            self.holders.append(nxt)
            self.expected["acquired"] += 1
            MACHINE_COUNTS["promotions"] += 1
        self._settle()

    def _settle(self) -> None:
        """Wait until the limiter shows the model's state, then check no waiter moved."""
        lim = self.limiter
        want = (len(self.holders), len(self.queue))
        stress.wait_for_step(
            f"active/queued == {want}", lambda: (lim.stats().active, lim.stats().queued) == want
        )
        for waiter in self.queue:
            assert not waiter.done.is_set(), (
                f"{waiter} left the queue ({waiter.outcome}) although it was not its turn"
            )

    def _wait_finished(self, client: Client) -> None:
        assert client.finished.wait(stress.STEP_TIMEOUT), f"{client} did not finish"
        if client.outcome == "grant":
            assert client.exit_result == "ok", f"{client}: {client.exit_result}"

    # -- rules -------------------------------------------------------------------------------

    @initialize(active=st.integers(1, 3), queue=st.sampled_from([2, 0, 1, 3, 4, 2]))
    def make_limiter(self, active: int, queue: int) -> None:
        self.lim = ColdLimiter(active, queue, wait=WAIT, retry_after=2, clock=per_client_clock)
        self.lim.CANCEL_POLL_INTERVAL = SLICE  # type: ignore[misc]
        MACHINE_COUNTS["examples"] += 1

    @rule(kind=st.sampled_from(["cancel", "plain", "cancel", "plain", "preset"]))
    def arrive(self, kind: str) -> None:
        """A new leader calls acquire(), with a cancel object ("cancel"), without one
        ("plain": one long timed wait, it leaves the queue only by promotion) or with one
        already set ("preset": Cancelled at once, nothing changes). Otherwise: fast path,
        queued, or refused at once."""
        lim = self.limiter
        MACHINE_COUNTS["steps"] += 1
        client = self._spawn(cancel=kind != "plain", preset=kind == "preset")
        if kind == "preset":
            self._expect(client, "cancelled")
            assert client.clock_reads == 0, "a cancel set beforehand read the clock"
            self._wait_finished(client)
            MACHINE_COUNTS["cancelled_at_once"] += 1
        elif len(self.holders) < lim.capacity_active and not self.queue:
            self._expect(client, "grant")
            assert client.clock_reads == 0, "the fast path read the clock"
            self.holders.append(client)
            self.expected["acquired"] += 1
            MACHINE_COUNTS["fast_path"] += 1
        elif len(self.queue) < lim.capacity_queue:
            self.queue.append(client)
            stress.wait_for_step(
                f"{client} admitted", lambda: lim.stats().queued == len(self.queue)
            )
            self._admitted(client)
            MACHINE_COUNTS["queued"] += 1
        else:
            self._expect(client, "queue_full")
            assert client.clock_reads == 0, "the refusal path read the clock"
            self.expected["rejected_full"] += 1
            MACHINE_COUNTS["refused_full"] += 1
        self._settle()

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), mode=st.sampled_from(["exit", "release", "raise", "double"]))
    def leave(self, data: st.DataObject, mode: str) -> None:
        """A holder leaves its with-block: normally, after release(), raising, or after a
        double release (which must raise RuntimeError and create no capacity)."""
        MACHINE_COUNTS["steps"] += 1
        holder = data.draw(st.sampled_from(self.holders), label="holder")
        self.holders.remove(holder)
        holder.leave(mode)
        self._wait_finished(holder)
        self._promote_next()

    @precondition(lambda self: any(c.token for c in self.queue))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """A queued waiter's client leaves: Cancelled; its place is returned; nobody moves."""
        MACHINE_COUNTS["steps"] += 1
        victim = data.draw(st.sampled_from([c for c in self.queue if c.token]), label="victim")
        assert victim.token is not None
        victim.token.event.set()
        self._expect(victim, "cancelled")
        self.queue.remove(victim)
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
        self.queue.remove(victim)
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
        self.queue.remove(victim)
        self._settle()

    # A slot is handed to the oldest waiter while that waiter is pinned outside the lock (in
    # its cancel object's is_set()); then it is cancelled / expires / fails; then it wakes.
    # Whichever wins, exactly one does: the waiter keeps the slot, or passes it on to the next
    # waiter (or back to free). The schedule is pinned, so the outcome is reproducible, as
    # Hypothesis needs; the free-running versions of these races are test_release_races.

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
        stress.wait_for_step(
            f"the hand-off to {victim}", lambda: self.limiter.stats().queued == len(self.queue) - 1
        )
        assert not victim.done.is_set()
        self._trigger(victim, what)
        victim.token.resume.set()
        outcome = self._outcome(victim)
        self._wait_finished(holder)
        MACHINE_COUNTS[f"race handoff-then-{what}: {outcome}"] += 1
        if outcome == "grant":
            # The hand-off won. The waiter holds the slot; its trigger is now moot except a
            # broken clock/token, which a holder never reads again.
            self.queue.remove(victim)
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
        self.queue.remove(victim)
        self._promote_next()  # the freed slot must reach the next waiter, or become free

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def bounds_and_counters(self) -> None:
        if self.lim is None:
            return
        s = self.lim.stats()
        assert 0 <= s.active <= s.capacity_active
        assert 0 <= s.queued <= s.capacity_queue
        assert s.peak_active <= s.capacity_active and s.peak_queued <= s.capacity_queue
        assert (s.active, s.queued) == (len(self.holders), len(self.queue))
        got = {
            k: getattr(s, k) for k in ("acquired", "rejected_full", "rejected_timeout", "cancelled")
        }
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
        """The invariants only the limiter's own state shows."""
        check_white_box(self.limiter)

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
                assert not self.queue
                s = self.lim.stats()
                assert (s.active, s.queued) == (0, 0), s
                assert (
                    s.acquired
                    == self.expected["acquired"]
                    == sum(c.outcome == "grant" for c in self.clients)
                ), s
                self._check_backend()
        finally:
            for client in self.clients:  # after a failure: unblock whatever is left
                if client.token is not None:
                    client.token.event.set()
                client.go.set()
            deadline = time.monotonic() + stress.STEP_TIMEOUT
            for client in self.clients:
                client.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [c for c in self.clients if c.thread.is_alive()]
        assert not stuck, f"threads still running after the drain: {stuck}"


seed(stress.SEED)(LimiterMachine)


def test_limiter_state_machine() -> None:
    MACHINE_COUNTS.clear()
    started = time.monotonic()
    try:
        run_state_machine_as_test(
            LimiterMachine,
            settings=settings(
                max_examples=3000 if stress.LONG else 250,
                stateful_step_count=80 if stress.LONG else 50,
                database=None,
                deadline=None,
                print_blob=True,
                phases=[Phase.generate, Phase.shrink] if SHRINK else [Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    except BaseException as exc:
        exc.add_note(f"state machine seed: REACHLIMIT_STRESS_SEED={stress.SEED}")
        raise
    finally:
        elapsed = time.monotonic() - started
        races = {k: v for k, v in sorted(MACHINE_COUNTS.items()) if k.startswith("race")}
        print(
            f"\n[state machine] seed={stress.SEED} examples={MACHINE_COUNTS['examples']} "
            f"steps={MACHINE_COUNTS['steps']} threads={MACHINE_COUNTS['threads']} "
            f"fast={MACHINE_COUNTS['fast_path']} queued={MACHINE_COUNTS['queued']} "
            f"promotions={MACHINE_COUNTS['promotions']} "
            f"refused_full={MACHINE_COUNTS['refused_full']} in {elapsed:.1f} s"
        )
        print(f"[state machine] races: {races}")
    assert MACHINE_COUNTS["steps"] > 0


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
