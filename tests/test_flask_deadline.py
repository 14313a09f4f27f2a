"""No wasted waits through the Flask extension: a leader whose place cannot start within its
wait is answered at once with 429, Retry-After and its own sentence (like a full queue), with
``REACHLIMIT_RETRY_AFTER="auto"`` worked out from who still waits, and never with
``REACHLIMIT_DEADLINE`` false (config, argument or a budget's option).

design:

    The app's in-process limiter gets a fake clock before its first use (a white-box write of
    its ``_clock``: the extension builds the limiter itself), and its estimate of build time
    is taught straight on it (``tests.support.deadline.learn``). A slot is then held by a
    grant promoted just now, so the estimate says it needs two more seconds while the wait is
    one: the next leader cannot start in time. Requests run in threads of their own through
    Flask's test client (``tests/support/fair_app.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import Busy, ColdLimiter, Grant
from tests.support.clock import FakeClock
from tests.support.deadline import learn, promote
from tests.support.fair_app import App, default_sentence, refusal, response
from tests.support.threads import ThreadRunner

pytestmark = pytest.mark.timeout(60)

DEADLINE = default_sentence(Busy.DEADLINE)

CONFIG = {"REACHLIMIT_ACTIVE": 1, "REACHLIMIT_QUEUE": 4, "REACHLIMIT_WAIT": 1}


def taught(lim: ColdLimiter, threads: ThreadRunner) -> Grant:
    """Teach ``lim`` (on a fake clock) builds of 2 s and return a grant just promoted: with
    a wait of 1 s, nobody behind it can start in time."""
    clock = FakeClock()
    lim._clock = clock  # before its first use: the extension made the limiter
    learn(lim, clock, threads, [2.0] * 4)
    return promote(lim, threads, lim.acquire())


def test_a_leader_that_cannot_start_in_time_gets_429_at_once(
    make: Callable[..., App], threads: ThreadRunner
) -> None:
    app = make(CONFIG)
    holder = taught(app.limiter, threads)
    refused = app.get("late")  # in this thread: a wait would never end (the clock stands)
    assert refusal(refused, retry_after=2) == DEADLINE
    # (2: the limiter's own figure, above ceil(2 - 1) = 1)
    assert refused.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; fwd-status=429"
    figures = app.stats()
    assert (figures["deadline"], figures["rejected_timeout"], figures["queued"]) == (1, 0, 0)
    assert app.builds.started == []
    holder.release()


def test_the_sentence_names_the_budget_and_the_apps_message_wins(
    make: Callable[..., App], threads: ThreadRunner
) -> None:
    app = make({**CONFIG, "REACHLIMIT_REFUSAL_MESSAGE": "Busy ({budget}), {retry_after} s"})
    holder = taught(app.limiter, threads)
    assert refusal(app.get("late"), retry_after=2) == "Busy (default), 2 s"
    holder.release()


def test_auto_retry_after_counts_who_still_waits(
    make: Callable[..., App], threads: ThreadRunner
) -> None:
    app = make({**CONFIG, "REACHLIMIT_RETRY_AFTER": "auto"})
    auto = app.state.retry_auto
    auto.randint = lambda low, high: low
    auto.record(10.0)
    holder = taught(app.limiter, threads)
    # Nobody waits once the leader is refused: ceil(10 x (0 + 1) / 1) = 10 (a full queue's
    # figure would be ceil(10 x 5 / 1) = 50, capped at 30).
    assert refusal(app.get("late"), retry_after=10) == DEADLINE
    holder.release()


@pytest.mark.parametrize(
    ("config", "overrides"),
    [({"REACHLIMIT_DEADLINE": "false"}, {}), ({}, {"deadline": False})],
    ids=["config-key", "argument"],
)
def test_deadline_false_lets_the_leader_wait(
    make: Callable[..., App], threads: ThreadRunner, config: dict[str, Any],
    overrides: dict[str, Any],
) -> None:
    app = make({**CONFIG, **config}, **overrides)
    assert app.state.settings.deadline is False
    holder = taught(app.limiter, threads)
    assert app.limiter.build_estimate is None  # nothing timed, nothing refused
    waiting = app.queue("late")
    holder.release()
    app.builds.wait_started("late")
    app.builds.let_go("late")
    assert response(waiting).status_code == 200
    assert app.stats()["deadline"] == 0


def test_a_budget_may_turn_it_off(make: Callable[..., App], threads: ThreadRunner) -> None:
    app = make(CONFIG)
    reports = app.rl.budget("reports", deadline=False)
    with app.app.app_context():
        assert reports.settings().deadline is False
        limiter = reports.path.limiter
    assert isinstance(limiter, ColdLimiter)
    clock = FakeClock()
    limiter._clock = clock
    learn(limiter, clock, threads, [2.0] * 4)
    assert limiter.build_estimate is None
    assert app.state.settings.deadline is True  # the default budget keeps it


def test_a_metered_budget_gets_every_setting_of_its_own_limiter(
    make: Callable[..., App], threads: ThreadRunner
) -> None:
    """With metrics on, the limiter is the metered one the metrics make: each budget's still
    gets that budget's figures, its deadline choice, and its own name."""
    app = make(CONFIG, metrics=True)
    reports = app.rl.budget(
        "reports", active=1, queue=5, wait=1.5, retry_after=4, deadline=False
    )
    with app.app.app_context():
        limiter = reports.path.limiter
        stats = reports.stats()
    assert isinstance(limiter, ColdLimiter)
    assert (stats.capacity_active, stats.capacity_queue, stats.wait) == (1, 5, 1.5)
    assert limiter.retry_after == 4
    clock = FakeClock()
    limiter._clock = clock
    learn(limiter, clock, threads, [2.0] * 4)
    assert limiter.build_estimate is None  # deadline=False: nothing timed
    # The default budget is still its own (a queue of 4, the deadline on), not replaced by it.
    assert app.stats()["capacity_queue"] == 4 and app.limiter is not limiter
    assert app.state.settings.deadline is True
    health = app.app.test_client().get("/health").get_json()
    assert health["budgets"]["reports"]["capacity_queue"] == 5


def test_the_option_is_checked() -> None:
    from flask import Flask

    from reachlimit.flask import ReachLimit

    app = Flask("bad")
    app.config["REACHLIMIT_DEADLINE"] = "sometimes"
    with pytest.raises(ValueError, match="REACHLIMIT_DEADLINE must be true or false"):
        ReachLimit(app)
