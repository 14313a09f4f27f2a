"""Prometheus figures counted for the whole service, in this process: prometheus_client's
several-process mode (each worker's files in ``PROMETHEUS_MULTIPROC_DIR``, added up by a
scrape of any one) and shared limiters (whose figures are the whole service's already).

design:

    prometheus_client picks its mode when first imported; the ``per_process`` fixture puts
    this process in the several-process mode for one test: the directory is the test's own
    and the value class is the one that mode uses, with a process id the test chooses, so
    two apps here write the files of two "workers" (``as_process(pid)``) and a "fork" is a
    change of that id. A scrape is read back with prometheus_client's own parser, by the
    app's view or straight from the files (``in_files``: what a scrape of another worker
    would see, without this one publishing first). Builds block on an Event of their own
    key (``tests.support.fair_app``), so "2 building, 1 waiting" is a state the limiter
    reports, never a duration. A shared limiter is a stand-in (``SharedLimiter``): an
    in-process ``ColdLimiter`` admitting, with the figures of a Redis limiter
    (``degraded``, ``lease_lost``) as the test sets them; the real one is in
    ``tests/test_metrics_redis.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

import reachlimit.prometheus as metrics_module
from reachlimit import Busy, Cancelled, ColdLimiter
from reachlimit.prometheus import MetricsGroup, ReachMetrics
from reachlimit.redis._stats import RedisLimiterStats
from tests.support.fair_app import App
from tests.support.threads import ThreadRunner, start_call
from tests.support.waiting import DEADLINE, wait_until

pytestmark = pytest.mark.timeout(60)

Series = tuple[str, frozenset[tuple[str, str]]]


class Figures:
    """One scrape, parsed: each series' value, and how many times each series appeared."""

    def __init__(self, text: str) -> None:
        self.values: dict[Series, float] = {}
        self.times: dict[Series, int] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series = (sample.name, frozenset(sample.labels.items()))
                self.values[series] = sample.value
                self.times[series] = self.times.get(series, 0) + 1

    def __call__(self, name: str, budget: str = "default", **labels: str) -> float:
        return self.values[(name, frozenset({"budget": budget, **labels}.items()))]

    def has(self, name: str, budget: str = "default") -> bool:
        return (name, frozenset({("budget", budget)})) in self.values

    def gauges(self, budget: str = "default") -> tuple[float, ...]:
        return tuple(self(f"reachlimit_{n}", budget) for n in
                     ("builds_active", "queue_waiting", "capacity_active", "capacity_queue"))

    def every_series_once(self) -> bool:
        return set(self.times.values()) == {1}


class PerProcess:
    """The several-process mode for one test (see the module's design)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.monkeypatch = monkeypatch
        self.directory = directory

    def as_process(self, pid: int | Callable[[], int]) -> None:
        """Metric values made from now on are those of process ``pid`` (a callable: read on
        every write, as prometheus_client reads os.getpid)."""
        ident = pid if callable(pid) else (lambda: pid)
        self.monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(ident))

    def files(self) -> list[str]:
        return sorted(p.name for p in self.directory.iterdir())

    def in_files(self) -> Figures:
        """What the files say now, as a scrape of any worker adds them up."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.directory))  # type: ignore[no-untyped-call]
        return Figures(generate_latest(registry).decode())

    def files_say(self, gauges: tuple[int, int, int, int]) -> Figures:
        """The files once their gauges are ``gauges``: a worker writes its figures just after
        the change the test waited for (its grant returned, its place taken), in its own
        thread."""

        def read() -> Figures | None:
            try:
                figures = self.in_files()
            except struct.error:  # a file being made as it is read: read it again
                return None
            known = figures.has("reachlimit_capacity_active")
            return figures if known and figures.gauges() == gauges else None

        found: Figures = wait_until(f"the files to say {gauges}", read, interval=0.01)
        return found


@pytest.fixture
def per_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[PerProcess]:
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    # The budgets metered in this process so far, in this test's own record.
    monkeypatch.setattr(metrics_module, "_per_process_owners", {})
    mode = PerProcess(monkeypatch, directory)
    mode.as_process(101)
    yield mode
    # The files this test's values opened: prometheus_client 0.26 and newer close them on
    # demand; older ones only when their objects are collected.
    close_files = getattr(values, "close_all_multiprocess_files", None)
    if close_files is not None:
        close_files()


def scrape(app: App) -> Figures:
    reply = app.app.test_client().get("/metrics")
    assert reply.status_code == 200, reply.get_data()
    return Figures(reply.get_data(as_text=True))


def second_set_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "reachlimit" and "second reachlimit metrics set" in r.getMessage()]


class SharedLimiter(ColdLimiter):
    """A stand-in for a shared limiter: admits like a ColdLimiter, answers a Redis limiter's
    figures, ``degraded`` and ``lease_lost`` as the test sets them."""

    degraded = False
    lease_lost = 0

    def stats(self) -> RedisLimiterStats:
        mine = super().stats()
        figures = {f.name: getattr(mine, f.name) for f in dataclasses.fields(mine)}
        return RedisLimiterStats(**figures, degraded=self.degraded, lease_lost=self.lease_lost)


# -- the mode ---------------------------------------------------------------------------------


#: Run in a fresh interpreter: the mode reachlimit reads, then what a counter of
#: prometheus_client (imported after the environment was set, as in a worker) left in the
#: directory, as a scrape of another process reads it.
MODE_PROBE = """
import json, os, sys
from reachlimit.prometheus import multiprocess_mode
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
Counter("probe", "a probe", registry=None).inc()
directory = sys.argv[1]
read = CollectorRegistry()
MultiProcessCollector(read, path=directory)
print(json.dumps({"mode": multiprocess_mode(), "files": sorted(os.listdir(directory)),
                  "read": b"probe_total 1.0" in generate_latest(read)}))
"""


@pytest.mark.parametrize(
    ("variable", "files"),
    [("PROMETHEUS_MULTIPROC_DIR", True), ("prometheus_multiproc_dir", True), (None, False)],
    ids=["set", "older-name", "unset"],
)
def test_the_mode_is_the_one_prometheus_client_writes_in(
    tmp_path: Path, variable: str | None, files: bool
) -> None:
    """What reachlimit reads (the variable, or its older name) is what the installed
    prometheus_client decides at its import: values in files there, or in memory only."""
    env = {k: v for k, v in os.environ.items() if k not in metrics_module.MULTIPROC_VARIABLES}
    if variable is not None:
        env[variable] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", MODE_PROBE, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["mode"] is files
    assert bool(said["files"]) is files and said["read"] is files, said


# -- one worker -------------------------------------------------------------------------------


def test_nothing_is_written_before_first_use_and_a_scrape_shows_the_capacities(
    per_process: PerProcess, make: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    """A preloading gunicorn master makes the app and forks: it must leave no file behind.
    The first scrape publishes this worker's figures first, so its capacities are there
    before any request; gauges are live (dropped when the worker is marked dead), the
    capacities the largest of the live workers'."""
    app = make(metrics=True)
    assert per_process.files() == []
    figures = scrape(app)
    assert figures.gauges() == (0, 0, 2, 8)
    assert figures("reachlimit_admissions_total", result="granted") == 0
    assert figures.every_series_once()
    assert {"gauge_livesum_101.db", "gauge_livemax_101.db", "counter_101.db",
            "histogram_101.db"} <= set(per_process.files())
    assert second_set_warnings(caplog) == []  # one metrics set in this process


def test_each_admission_that_moves_a_slot_or_a_place_is_in_the_files_at_once(
    per_process: PerProcess, make: Callable[..., App]
) -> None:
    """Another worker's scrape reads the files without this worker publishing first: a
    grant, a queued leader and a promotion are written when they happen."""
    app = make(metrics=True)
    first = app.building("b1")
    app.building("b2")
    per_process.files_say((2, 0, 2, 8))
    waiting = app.queue("q1")
    per_process.files_say((2, 1, 2, 8))
    app.builds.let_go("b1")
    assert first.done.wait(DEADLINE)
    app.builds.wait_started("q1")  # promoted
    per_process.files_say((2, 0, 2, 8))
    app.builds.let_all_go()
    assert waiting.done.wait(DEADLINE)
    wait_until("every request ended", app.idle)
    figures = per_process.files_say((0, 0, 2, 8))
    assert figures("reachlimit_admissions_total", result="granted") == 3
    assert figures("reachlimit_cache_requests_total", result="miss") == 3
    assert figures("reachlimit_build_seconds_count") == 3


def test_a_wait_that_ends_without_a_grant_leaves_the_queue_in_the_files(
    per_process: PerProcess, threads: ThreadRunner
) -> None:
    """The library alone: a waiter whose client left, then one that timed out."""
    metrics = ReachMetrics(active=1, queue=2, wait=0.2)
    gate = threading.Event()
    holder = start_call(threads, lambda: metrics.path.get("held", lambda: gate.wait(DEADLINE)))
    wait_until("1 building", lambda: metrics.limiter.stats().active == 1)
    leave = threading.Event()
    leaving = start_call(threads, lambda: metrics.path.get("leaving", lambda: "x", leave))
    per_process.files_say((1, 1, 1, 2))
    leave.set()
    leaving.wait_done(DEADLINE)
    assert isinstance(leaving.error, Cancelled)
    per_process.files_say((1, 0, 1, 2))
    late = start_call(threads, lambda: metrics.path.get("late", lambda: "x"))
    late.wait_done(DEADLINE)
    assert isinstance(late.error, Busy) and late.error.reason == "timeout"
    figures = per_process.files_say((1, 0, 1, 2))
    assert figures("reachlimit_admissions_total", result="cancelled") == 1
    assert figures("reachlimit_admissions_total", result="timeout") == 1
    gate.set()
    holder.wait_done(DEADLINE)
    assert holder.error is None


def test_publish_writes_the_gauges_unless_told_not_to(per_process: PerProcess) -> None:
    metrics = ReachMetrics(active=3, queue=4)
    metrics.publish(gauges=False)  # the counters only: the gauges' files hold their zeros
    assert per_process.in_files().gauges() == (0, 0, 0, 0)
    metrics.publish()  # the gauges too, by default
    assert per_process.in_files().gauges() == (0, 0, 3, 4)


# -- several workers ----------------------------------------------------------------------------


def test_two_workers_add_up_their_slots_and_show_the_largest_capacity(
    per_process: PerProcess, make: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    one = make(metrics=True, active=2, queue=8)
    one.building("a1")
    per_process.as_process(102)
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        two = make(metrics=True, active=3, queue=1)
    # Both are in this real process: the second metrics set of a budget is warned about.
    [warning] = second_set_warnings(caplog)
    assert "'default'" in warning and str(os.getpid()) in warning
    two.building("b1")
    two.building("b2")
    for figures in (scrape(one), scrape(two)):  # whichever worker answers
        # slots and places add up over the workers; a capacity is the largest one
        assert figures.gauges() == (3, 0, 3, 8)
        assert figures("reachlimit_admissions_total", result="granted") == 3
        assert figures.every_series_once()
    mark_process_dead(102, str(per_process.directory))  # type: ignore[no-untyped-call]
    assert per_process.in_files().gauges() == (1, 0, 2, 8)  # its counters stay
    assert per_process.in_files()("reachlimit_admissions_total", result="granted") == 3


def test_a_forked_worker_writes_every_gauge_again(
    per_process: PerProcess, make: Callable[..., App]
) -> None:
    """A fork gives the child files of its own, empty: its first publish must write every
    gauge, the unchanged capacities included. The fork is a change of the process id."""
    pid = {"now": 101}
    per_process.as_process(lambda: pid["now"])
    app = make(metrics=True)
    assert scrape(app).gauges() == (0, 0, 2, 8)
    pid["now"] = 202
    per_process.monkeypatch.setattr(
        metrics_module, "os", types.SimpleNamespace(getpid=lambda: pid["now"])
    )
    mark_process_dead(101, str(per_process.directory))  # type: ignore[no-untyped-call]
    assert scrape(app).gauges() == (0, 0, 2, 8)
    assert "gauge_livemax_202.db" in per_process.files()


# -- shared limiters ----------------------------------------------------------------------------


def shared_and_local(group: MetricsGroup) -> tuple[ReachMetrics, SharedLimiter, ReachMetrics]:
    """A budget on a shared limiter ("reports": 5 slots, 7 places) and one in process (the
    default: 2 and 8) of one app: an app on Redis with a budget turned off, say."""
    inner = SharedLimiter(5, 7, 1.0)
    shared = ReachMetrics(limiter=inner, budget="reports", group=group, wait=1.0)
    local = ReachMetrics(group=group)
    return shared, inner, local


@pytest.mark.parametrize("mode", ["one_process", "per_process"])
def test_a_shared_limiters_figures_are_read_from_it_at_scrape(
    mode: str, request: pytest.FixtureRequest
) -> None:
    if mode == "per_process":
        request.getfixturevalue("per_process")
    shared, inner, local = shared_and_local(MetricsGroup())
    assert shared.shared and not local.shared
    assert shared.path.get("r", lambda: "built") == "built"  # admitted by the shared one
    assert local.path.get("d", lambda: "built") == "built"
    inner.degraded, inner.lease_lost = True, 4
    held = inner.acquire()  # a slot some process holds now
    try:
        figures = Figures(shared.exposition().decode())
    finally:
        held.release()
    assert figures.every_series_once()
    assert figures.gauges("reports") == (1, 0, 5, 7)
    assert figures.gauges() == (0, 0, 2, 8)
    assert figures("reachlimit_admissions_total", "reports", result="granted") == 1
    assert figures("reachlimit_backend_degraded", "reports") == 1
    assert figures("reachlimit_lease_lost_total", "reports") == 4
    # figures only a shared limiter has: none for the in-process budget
    assert not figures.has("reachlimit_backend_degraded")
    assert not figures.has("reachlimit_lease_lost_total")
    inner.degraded = False
    assert Figures(local.exposition().decode())("reachlimit_backend_degraded", "reports") == 0
