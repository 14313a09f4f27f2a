"""The checks of fair admission catch an unfair ColdLimiter.

Three mutants, each monkeypatched into ``ColdLimiter`` (each keeps the limiter's books
straight, so only the rule it breaks can give it away):

* never displaces: ``_displace_for`` always says no, so a full queue refuses everybody;
* global FIFO: ``_next_in_turn`` promotes the oldest waiter of all (``_waiters[0]``), whatever
  its client, and leaves the turn of the clients as it was;
* displaces the oldest: ``_displace_for`` takes the oldest waiter of the biggest client, not
  its newest.

Each must fail (``AssertionError``) three checks: the state machine's model
(``tests/test_limiter_state_machine.py``), driven through a short fixed program; the rule of
``tests/support/fairness.py`` it breaks; and ``FairnessWatch`` (``tests/support/stress.py``,
the storms' judge), which must name the broken decision. And each must still pass a program
and a rule it leaves intact, so it is caught for the right reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from reachlimit import ColdLimiter
from tests.support import fairness, stress
from tests.support.clock import FakeClock
from tests.support.limiter import Attempt, leave_queue_keeping_the_place
from tests.support.threads import ThreadRunner
from tests.test_limiter_state_machine import LimiterMachine

pytestmark = pytest.mark.timeout(60)


# -- the mutants ------------------------------------------------------------------------------


def _never_displaces(self: ColdLimiter, places: int) -> bool:
    return False  # mutant: a full queue refuses everybody, whoever holds its places


def _global_fifo(self: ColdLimiter) -> Any:
    waiter = self._waiters[0]  # mutant: the oldest of all, not the next client's
    # Out of the queue with the real bookkeeping (its gate place is returned by the hand-off,
    # as after the real method): only the order is wrong.
    leave_queue_keeping_the_place(self, waiter)
    return waiter


def _displaces_the_oldest(self: ColdLimiter, places: int) -> bool:
    biggest = max(self._clients.values(), key=lambda q: (len(q), q[-1].seq))
    if len(biggest) < places + 2:
        return False
    victim = biggest.popleft()  # mutant: its oldest waiter, not its newest (pop())
    self._waiters.remove(victim)
    victim.displaced = True
    victim.cond.notify()
    self._displaced += 1
    return True


MUTANTS = {
    "never-displaces": ("_displace_for", _never_displaces),
    "global-fifo": ("_next_in_turn", _global_fifo),
    "displaces-the-oldest": ("_displace_for", _displaces_the_oldest),
}


@pytest.fixture
def mutant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Patch the mutant named by the test's parameter into ColdLimiter (FairnessWatch, a
    subclass, calls it through super()). A check that fails by waiting for a call that never
    ends waits 2 s, not 5."""
    name: str = request.param
    attribute, function = MUTANTS[name]
    monkeypatch.setattr(ColdLimiter, attribute, function)
    monkeypatch.setattr(Attempt.wait_done, "__defaults__", (2.0,))
    return name


# -- the state machine's model on fixed programs ------------------------------------------------


@contextmanager
def machine(active: int, queue: int) -> Iterator[LimiterMachine]:
    """A LimiterMachine outside Hypothesis, its steps called by the test; torn down (drained
    and checked) at the end, or, after a failure, only unblocked and joined."""
    m = LimiterMachine()
    m.make_limiter(active=active, queue=queue)
    try:
        yield m
    except BaseException:
        stuck = m.cleanup()
        assert not stuck, f"threads left running by the failed program: {stuck}"
        raise
    m.teardown()


def arrive(m: LimiterMachine, whos: str, *, invariants: bool = True) -> None:
    """Leaders (with cancel objects) of the clients named, one after another ("-" is the
    anonymous one), each step checked against the model (and the invariants, if asked)."""
    for who in whos.split():
        m._arrive("cancel", None if who == "-" else who)
        if invariants:
            m.bounds_and_counters()


def release(m: LimiterMachine, times: int, *, invariants: bool = True) -> None:
    """The oldest holder leaves, ``times`` times; each freed slot goes where the model says."""
    for _ in range(times):
        m._leave(m.holders[0], "exit")
        if invariants:
            m.bounds_and_counters()


def program_displacement(*, invariants: bool = True) -> None:
    """a holds the slot and all 3 places; b's leader displaces a's newest, then the slot
    goes to a's oldest waiter, then to b (its turn), then to a."""
    with machine(active=1, queue=3) as m:
        arrive(m, "a a a a b", invariants=invariants)
        release(m, 3, invariants=invariants)


def program_round_robin(*, invariants: bool = True) -> None:
    """No displacement (the queue never fills): a1 a2 b1 wait, promoted a1, b1, a2."""
    with machine(active=1, queue=4) as m:
        arrive(m, "a a a b", invariants=invariants)
        release(m, 3, invariants=invariants)


def program_one_client(*, invariants: bool = True) -> None:
    """One anonymous client alone: strict FIFO, and queue_full once every place is taken."""
    with machine(active=1, queue=2) as m:
        arrive(m, "- - - -", invariants=invariants)
        release(m, 3, invariants=invariants)


@pytest.mark.parametrize(
    ("mutant", "broken", "message", "intact"),
    [
        pytest.param(
            "never-displaces", program_displacement,
            r"client4\[b\] ended its call \(queue_full\), but the model: "
            r"client4\[b\] displaces client3\[a\]",
            [program_round_robin, program_one_client],
            id="never-displaces",
        ),
        pytest.param(
            "global-fifo", program_round_robin,
            r"client2\[a\] ended its call \(grant\), but the model: "
            r"the freed slot goes to client3\[b\]",
            [program_one_client],
            id="global-fifo",
        ),
        pytest.param(
            "displaces-the-oldest", program_displacement,
            r"client1\[a\] ended its call \(displaced\), but the model: "
            r"client4\[b\] displaces client3\[a\]",
            [program_round_robin, program_one_client],
            id="displaces-the-oldest",
        ),
    ],
    indirect=["mutant"],
)
def test_the_model_catches_the_mutant(
    mutant: str, broken: Callable[..., None], message: str, intact: list[Callable[..., None]]
) -> None:
    # The model alone (the invariants off): the step itself sees the wrong waiter move.
    with pytest.raises(AssertionError, match=message):
        broken(invariants=False)
    for program in intact:
        program()


@pytest.mark.parametrize("mutant", ["global-fifo"], indirect=True)
def test_the_machine_invariants_see_a_turn_that_does_not_move(mutant: str) -> None:
    """With the invariants on, the limiter's own turn of the clients differs from the model's
    one step before the wrong promotion: a client served stayed first in turn."""
    with pytest.raises(AssertionError, match=re.escape(
        "the limiter's turn (client, places) [('a', 1), ('b', 1)], the model's [('b', 1), ('a', 1)]"
    )):
        program_round_robin()
    program_one_client()  # one client: its FIFO is the global one


def test_the_programs_pass_on_the_real_limiter() -> None:
    for program in (program_displacement, program_round_robin, program_one_client):
        program()
        program(invariants=False)


# -- the rules of tests/support/fairness.py, and FairnessWatch ---------------------------------


def watched() -> tuple[fairness.Make, list[stress.FairnessWatch]]:
    """``make(active, queue)`` for the fairness checks, building FairnessWatch limiters, and
    the list of those it made."""
    made: list[stress.FairnessWatch] = []

    def make(active: int, queue: int) -> stress.FairnessWatch:
        lim = stress.FairnessWatch(active, queue, wait=30.0, clock=FakeClock())
        made.append(lim)
        return lim

    return make, made


@pytest.mark.parametrize(
    ("mutant", "broken", "fails", "judged", "intact"),
    [
        pytest.param(
            "never-displaces", fairness.check_newest_of_the_biggest_is_displaced,
            r"a4: acquire\(\) did not return",  # a4 was never told it was displaced
            "a newcomer holding 0 place(s) was refused; the rules displace waiter 4 of 'a'",
            [fairness.check_round_robin_across_clients],
            id="never-displaces",
        ),
        pytest.param(
            "global-fifo", fairness.check_round_robin_across_clients,
            r"assert queue\.promoted == ",  # the order of promotions
            "promoted waiter 1 of 'a'; the rules promote waiter 3 of 'b'",
            [fairness.check_ties_go_to_the_newest_waiter],
            id="global-fifo",
        ),
        pytest.param(
            "displaces-the-oldest", fairness.check_newest_of_the_biggest_is_displaced,
            r"a4: acquire\(\) did not return",  # a4 was not the one displaced
            "displaced waiter 0 of 'a'; the rules displace waiter 4 of 'a'",
            [fairness.check_round_robin_across_clients],
            id="displaces-the-oldest",
        ),
    ],
    indirect=["mutant"],
)
def test_the_fairness_rules_and_the_watch_catch_the_mutant(
    threads: ThreadRunner,
    mutant: str,
    broken: Callable[..., None],
    fails: str,
    judged: str,
    intact: list[Callable[..., None]],
) -> None:
    make, made = watched()
    with pytest.raises(AssertionError) as info:
        broken(threads, make)
    # The check failed where it looks at the rule (its message, or the failing statement: the
    # support modules' asserts are not rewritten, so a bare one has no message).
    reason = str(info.value) or str(info.traceback[-1].statement)
    assert re.search(fails, reason), reason
    # The watch named the broken decision as the limiter made it (the first one it judged).
    assert made[0].violations and made[0].violations[0].startswith(judged), made[0].violations
    for check in intact:
        check(threads, make)
    # One client alone: every mutant behaves as the real limiter, and the watch says so (it
    # does not flag a limiter for what the rules allow).
    del made[:]
    fairness.check_one_client_alone(threads, make)
    assert not made[0].violations and not made[0].check(), made[0].violations


def test_the_watch_passes_the_real_limiter(threads: ThreadRunner) -> None:
    make, made = watched()
    for check in fairness.RULES:
        check(threads, make)
    assert made and all(not lim.violations and not lim.check() for lim in made)
    assert sum(lim.counts["displaced"] for lim in made) >= 3
    assert sum(lim.counts["promoted_out_of_arrival_order"] for lim in made) >= 3
