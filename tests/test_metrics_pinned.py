"""Prometheus figures pinned where the other metrics tests leave them open: a shared limiter
whose figures lack a Redis limiter's own (``degraded``, ``lease_lost``), the help texts and
types a scrape promises in the several-process mode, and what a second metrics set of a
budget in one process is told.

design: the several-process mode is the ``per_process`` fixture of
``tests/test_metrics_processes.py`` (a directory of the test's own, the value class that mode
uses, a process id the test chooses); a scrape is read back with prometheus_client's parser.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import reachlimit.prometheus as metrics_module
from reachlimit import ColdLimiter
from reachlimit.prometheus import MeteredLimiter, MetricsGroup, ReachMetrics, multiprocess_mode
from tests.support.clock import FakeClock
from tests.support.deadline import learn, promote
from tests.support.threads import Outcome, ThreadRunner, start_call
from tests.support.waiting import DEADLINE, wait_until
from tests.test_metrics_processes import Figures, PerProcess, per_process  # noqa: F401

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def several(request: pytest.FixtureRequest) -> PerProcess:
    """The several-process mode for one test: test_metrics_processes.py's per_process."""
    mode: PerProcess = request.getfixturevalue("per_process")
    return mode


def families(body: bytes) -> dict[str, tuple[str, str]]:
    """Each family of a scrape: its type and its help text."""
    return {f.name: (f.type, f.documentation)
            for f in text_string_to_metric_families(body.decode())}


# -- the mode -----------------------------------------------------------------------------------


def test_the_mode_is_either_name_of_the_variable_set_even_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As prometheus_client reads them: a variable that is there, whatever its value."""
    for name in metrics_module.MULTIPROC_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert multiprocess_mode() is False
    monkeypatch.setenv("prometheus_multiproc_dir", "/nowhere")
    assert multiprocess_mode() is True
    monkeypatch.delenv("prometheus_multiproc_dir")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    assert multiprocess_mode() is True


def test_in_the_several_process_mode_the_apps_registry_holds_nothing(
    several: PerProcess,
) -> None:
    """A scrape reads the files: the counters of this process in a registry too would be
    counted twice by anyone collecting it beside a MultiProcessCollector."""
    metrics = ReachMetrics()
    assert metrics.path.get("k", lambda: "built") == "built"
    assert b"reachlimit_" in metrics.exposition()
    assert generate_latest(metrics.registry) == b""


# -- shared limiters ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["one_process", "per_process"])
def test_a_shared_limiter_without_a_redis_limiters_figures_is_up_with_no_lease_lost(
    mode: str, request: pytest.FixtureRequest
) -> None:
    """A shared limiter whose stats() are a plain LimiterStats (no ``degraded``, no
    ``lease_lost``): it is not degraded and lost no lease."""
    if mode == "per_process":
        request.getfixturevalue("several")
    metrics = ReachMetrics(limiter=ColdLimiter(3, 4, 1.0), budget="plain")
    assert metrics.path.get("k", lambda: "built") == "built"
    figures = Figures(metrics.exposition().decode())
    assert figures.gauges("plain") == (0, 0, 3, 4)
    assert figures("reachlimit_backend_degraded", "plain") == 0
    assert figures("reachlimit_lease_lost_total", "plain") == 0


def test_the_several_process_scrape_promises_each_familys_type_and_help(
    several: PerProcess,
) -> None:
    """The gauges written to the files and the ones read from a shared limiter at scrape time
    have the same types and help texts as in the one-process mode."""
    group = MetricsGroup()
    ReachMetrics(limiter=ColdLimiter(1, 1, 1.0), budget="reports", group=group)
    local = ReachMetrics(group=group)
    got = families(local.exposition())
    for name in ("builds_active", "queue_waiting", "capacity_active", "capacity_queue",
                 "backend_degraded"):
        assert got[f"reachlimit_{name}"] == ("gauge", metrics_module._HELP[name])
    assert got["reachlimit_lease_lost"] == ("counter", metrics_module._HELP["lease_lost"])
    assert got["reachlimit_backend_degraded"][1].startswith("1 while the shared backend")


# -- construction -------------------------------------------------------------------------------


def test_deadline_false_reaches_the_metered_limiter(threads: ThreadRunner) -> None:
    """The setup of test_metrics.py's deadline refusal: without ``deadline`` the late leader
    queues and is granted once the holder is done, instead of being refused at once."""
    clock = FakeClock()
    metrics = ReachMetrics(active=1, queue=4, wait=1.0, clock=clock, deadline=False)
    limiter = metrics.limiter
    assert isinstance(limiter, MeteredLimiter)
    learn(limiter, clock, threads, [2.0] * 4)
    holder = promote(limiter, threads, limiter.acquire())  # 2 s to go
    late: Outcome = start_call(threads, lambda: metrics.path.get("late", lambda: "built"))
    wait_until("the late leader to queue", lambda: metrics.limiter.stats().queued == 1)
    holder.release()
    late.wait_done(DEADLINE)
    assert late.error is None and late.value == "built"
    assert metrics.path.stats().deadline == 0


def test_a_family_made_while_another_thread_waits_for_it_is_made_once(
    threads: ThreadRunner,
) -> None:
    """Two threads at first use: the one that waited for the lock finds the other's."""
    owner = type("Owner", (), {"made": None})()
    lock = threading.Lock()
    second_waits = threading.Event()
    release_first = threading.Event()
    made: list[object] = []

    class Watched:
        """The lock, telling when a thread is about to wait for it."""

        def __init__(self) -> None:
            self.calls = 0

        def __enter__(self) -> None:
            self.calls += 1
            if self.calls == 2:
                second_waits.set()
            lock.acquire()

        def __exit__(self, *exc: Any) -> None:
            lock.release()

    def make() -> object:
        assert release_first.wait(DEADLINE)
        made.append(object())
        return made[-1]

    watched: Any = Watched()

    def get() -> object:
        return metrics_module._made_once(owner, "made", watched, make)

    first: Outcome = start_call(threads, get)
    wait_until("the first to make it", lock.locked)
    second: Outcome = start_call(threads, get)
    assert second_waits.wait(DEADLINE)
    release_first.set()
    first.wait_done(DEADLINE)
    second.wait_done(DEADLINE)
    assert len(made) == 1
    assert first.value is made[0] and second.value is made[0]
