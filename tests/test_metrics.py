"""Prometheus metrics in one process: ``reachlimit.prometheus`` and ``rl.metrics_view``.

design:

    Every scrape is parsed with prometheus_client's own parser, and every figure is compared
    with what the test made happen and with the path's own ``stats()``. Builds wait on a
    ``threading.Event`` the test opens, so "two builds and eight waiting leaders" is a state
    read back from the limiter, not a duration hoped for. The only timed wait is the one a
    leader is meant to time out of (0.2 s, with the slot held for as long as it takes).

    prometheus_client picks its one-process or several-process mode when it is first
    imported, from ``PROMETHEUS_MULTIPROC_DIR``; this file runs in the one-process mode. The
    several-process mode, under real gunicorn workers, is ``tests/test_metrics_gunicorn.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from reachlimit import Busy, Cancelled, ColdLimiter, ColdPath
from reachlimit.flask import ReachLimit
from reachlimit.prometheus import MeteredColdPath, MeteredLimiter, ReachMetrics
from tests.support.clock import FakeClock
from tests.support.deadline import learn, promote
from tests.support.refreshes import refreshing
from tests.support.waiting import DEADLINE, wait_until

ROOT = Path(__file__).resolve().parents[1]

#: Every metric family the service promises, with its type.
FAMILIES = {
    "reachlimit_admissions": "counter",
    "reachlimit_builds_active": "gauge",
    "reachlimit_queue_waiting": "gauge",
    "reachlimit_capacity_active": "gauge",
    "reachlimit_capacity_queue": "gauge",
    "reachlimit_cache_requests": "counter",
    "reachlimit_coalesced": "counter",
    "reachlimit_wait_seconds": "histogram",
    "reachlimit_build_seconds": "histogram",
}


# -- reading a scrape -----------------------------------------------------------------------


class Scrape:
    """One scrape, parsed with prometheus_client's parser."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        labels.setdefault("budget", "default")  # every figure is labelled by its budget
        return self.values[(name, tuple(sorted(labels.items())))]

    def admissions(self, result: str) -> float:
        return self("reachlimit_admissions_total", result=result)

    def cache(self, result: str) -> float:
        return self("reachlimit_cache_requests_total", result=result)

    def gauges(self) -> tuple[float, float, float, float]:
        return (
            self("reachlimit_builds_active"),
            self("reachlimit_queue_waiting"),
            self("reachlimit_capacity_active"),
            self("reachlimit_capacity_queue"),
        )


# -- an app whose builds the test holds -------------------------------------------------------


class Held:
    """A Flask app on ReachLimit(metrics=True) whose builds wait for ``gate``."""

    def __init__(self, **overrides: Any) -> None:
        self.gate = threading.Event()
        self.building: set[str] = set()  # keys whose build has started
        self.app = Flask(__name__)
        self.rl = ReachLimit(self.app, metrics=True, **overrides)
        self.app.add_url_rule("/metrics", view_func=self.rl.metrics_view)

        @self.app.get("/r/<key>")
        def report(key: str) -> Any:
            return self.rl.cold(key, lambda: self.build(key))

    def build(self, key: str) -> bytes:
        self.building.add(key)
        if not self.gate.wait(DEADLINE):
            raise RuntimeError("the test never opened the gate")
        return key.encode()

    def get(self, path: str) -> tuple[int, bytes]:
        with self.app.test_client() as client:
            reply = client.get(path)
            return reply.status_code, reply.get_data()

    def scrape(self) -> Scrape:
        with self.app.test_client() as client:
            reply = client.get("/metrics")
        assert reply.status_code == 200, reply.get_data()
        assert reply.content_type.startswith("text/plain; version=")
        assert reply.headers["Cache-Control"] == "no-store"
        return Scrape(reply.get_data(as_text=True))

    def stats(self) -> dict[str, Any]:
        with self.app.app_context():
            return self.rl.stats().as_dict()


@pytest.fixture
def held() -> Iterator[Held]:
    h = Held()
    yield h
    h.gate.set()


# -- the figures ------------------------------------------------------------------------------


def test_every_promised_family_is_scraped_with_its_type_before_any_request(held: Held) -> None:
    scrape = held.scrape()
    for name, kind in FAMILIES.items():
        assert scrape.types.get(name) == kind, name
    for result in ("granted", "queue_full", "timeout", "cancelled"):
        assert scrape.admissions(result) == 0
    assert scrape.cache("hit") == scrape.cache("miss") == 0
    assert scrape.gauges() == (0, 0, 2, 8)
    assert scrape("reachlimit_wait_seconds_count") == 0
    assert scrape("reachlimit_build_seconds_count") == 0


def test_a_burst_is_counted_exactly(held: Held, threads: Any) -> None:
    """2 builds held, 8 leaders queued, 3 followers of one of them, 5 refused; then every
    figure matches what happened and what ``stats()`` says."""
    statuses: list[int] = []
    lock = threading.Lock()

    def client(path: str) -> None:
        status, _ = held.get(path)
        with lock:
            statuses.append(status)

    for i in range(10):
        threads.start(client, f"/r/k{i}", name=f"leader-{i}")
    wait_until(
        "2 building, 8 queued",
        lambda: (held.stats()["active"], held.stats()["queued"]) == (2, 8),
    )
    during = held.scrape()
    assert during.gauges() == (2, 8, 2, 8)
    assert during.admissions("granted") == 2  # the two fast-path grants, building now

    # Followers of a queued leader take no place and are no admission.
    queued_key = next(f"k{i}" for i in range(10) if f"k{i}" not in held.building)
    for i in range(3):
        threads.start(client, f"/r/{queued_key}", name=f"follower-{i}")
    flight = held.app.extensions["reachlimit"].path.flight
    wait_until("3 followers", lambda: flight._calls[queued_key].followers == 3)

    refused = [held.get(f"/r/full{i}")[0] for i in range(5)]
    assert refused == [429] * 5
    assert held.scrape().admissions("queue_full") == 5

    held.gate.set()
    threads.join_all(DEADLINE)
    assert sorted(statuses) == [200] * 13
    assert held.get("/r/k0") == (200, b"k0")  # a warm hit

    after = held.scrape()
    stats = held.stats()
    assert after.admissions("granted") == 10 == stats["acquired"]
    assert after.admissions("queue_full") == 5 == stats["rejected_full"]
    assert after.admissions("timeout") == after.admissions("cancelled") == 0
    assert after("reachlimit_build_seconds_count") == 10 == stats["builds"]
    # Every grant is timed; a queue_full refusal never waited and is not.
    assert after("reachlimit_wait_seconds_count") == 10
    assert after.cache("miss") == 10 + 3 + 5 == stats["misses"]
    assert after.cache("hit") == 1 == stats["hits"]
    assert after("reachlimit_coalesced_total") == 3 == stats["coalesced"]
    assert after.gauges() == (0, 0, 2, 8)


def test_timeout_and_cancelled_are_counted_apart(threads: Any) -> None:
    """The library without Flask: a leader that times out and one whose cancel is set."""
    metrics = ReachMetrics(active=1, queue=2, wait=0.2)
    path = metrics.path
    gate = threading.Event()
    outcomes: dict[str, str] = {}

    def lead(key: str, cancel: threading.Event | None = None) -> None:
        try:
            path.get(key, lambda: gate.wait(DEADLINE) and key, cancel)
            outcomes[key] = "value"
        except Busy as busy:
            outcomes[key] = busy.reason
        except Cancelled:
            outcomes[key] = "cancelled"

    threads.start(lead, "building")
    wait_until("1 building", lambda: metrics.limiter.stats().active == 1)
    leave = threading.Event()
    threads.start(lead, "leaving", leave)
    threads.start(lead, "timing-out")
    wait_until("2 queued", lambda: metrics.limiter.stats().queued == 2)
    leave.set()
    # The slot stays held until the second waiter has timed out, whatever the machine's speed.
    wait_until("both waits ended", lambda: len(outcomes) == 2, timeout=DEADLINE)
    gate.set()
    threads.join_all(DEADLINE)
    assert outcomes == {"leaving": "cancelled", "timing-out": "timeout", "building": "value"}

    scrape = Scrape(metrics.exposition().decode())
    assert scrape.admissions("granted") == 1
    assert scrape.admissions("timeout") == 1
    assert scrape.admissions("cancelled") == 1
    assert scrape.admissions("queue_full") == 0
    # The wait is timed for grants and timeouts: the grant waited nothing, the timeout its
    # whole bound, which is one of the bucket bounds.
    assert scrape("reachlimit_wait_seconds_count") == 2
    assert scrape("reachlimit_wait_seconds_bucket", le="0.1") == 1
    assert scrape("reachlimit_wait_seconds_bucket", le="+Inf") == 2
    assert scrape("reachlimit_wait_seconds_bucket", le="0.2") >= 1  # the wait is a bucket
    assert scrape.gauges() == (0, 0, 1, 2)


def test_deadline_refusals_are_counted_apart(threads: Any) -> None:
    """A leader refused at once because its place cannot start within its wait (the limiter's
    estimate of build time, taught on a fake clock): ``result="deadline"``, and in stats()."""
    clock = FakeClock()
    metrics = ReachMetrics(active=1, queue=4, wait=1.0, clock=clock)
    scrape = Scrape(metrics.exposition().decode())
    assert scrape.admissions("deadline") == 0  # the series is there before any refusal
    learn(metrics.limiter, clock, threads, [2.0] * 4)
    holder = promote(metrics.limiter, threads, metrics.limiter.acquire())  # 2 s to go
    with pytest.raises(Busy) as info:
        metrics.path.get("late", lambda: "never built")
    assert info.value.reason == "deadline"
    holder.release()
    scrape = Scrape(metrics.exposition().decode())
    assert scrape.admissions("deadline") == 1
    assert scrape.admissions("timeout") == 0 and scrape.admissions("queue_full") == 0
    assert metrics.path.stats().deadline == 1


def test_a_build_that_raises_is_timed_and_frees_its_slot() -> None:
    metrics = ReachMetrics()

    def fail() -> bytes:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError):
        metrics.path.get("k", fail)
    scrape = Scrape(metrics.exposition().decode())
    assert scrape("reachlimit_build_seconds_count") == 1
    assert scrape.admissions("granted") == 1
    assert scrape.gauges() == (0, 0, 2, 8)


# -- the extension's switch and view ----------------------------------------------------------


def test_metrics_are_off_by_default_and_the_view_says_so() -> None:
    app = Flask(__name__)
    rl = ReachLimit(app)
    app.add_url_rule("/metrics", view_func=rl.metrics_view)
    with app.app_context():
        assert type(rl.path) is ColdPath and type(rl.path.limiter) is ColdLimiter
    reply = app.test_client().get("/metrics")
    assert reply.status_code == 404
    assert reply.get_json() == {"error": "metrics are off: set REACHLIMIT_METRICS=true"}


@pytest.mark.parametrize("raw", ["true", "1", "on", True])
def test_the_config_key_turns_metrics_on(raw: Any) -> None:
    app = Flask(__name__)
    app.config["REACHLIMIT_METRICS"] = raw
    rl = ReachLimit(app)
    with app.app_context():
        assert isinstance(rl.path, MeteredColdPath)
        assert isinstance(rl.path.limiter, MeteredLimiter)
        assert isinstance(rl.path.limiter, ColdLimiter)  # a limiter like any other
        assert rl.settings().metrics is True


def test_a_bad_value_names_the_key() -> None:
    app = Flask(__name__)
    app.config["REACHLIMIT_METRICS"] = "maybe"
    with pytest.raises(ValueError, match="REACHLIMIT_METRICS must be true or false"):
        ReachLimit(app)


def test_metrics_without_prometheus_client_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "reachlimit.prometheus", None)  # import fails
    with pytest.raises(ValueError, match=r"REACHLIMIT_METRICS needs prometheus_client"):
        ReachLimit(Flask(__name__), metrics=True)


def test_the_view_answers_503_never_a_traceback_when_figures_cannot_be_read(
    held: Held, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> bytes:
        raise OSError("metrics directory gone")

    with held.app.app_context():
        monkeypatch.setattr(held.app.extensions["reachlimit"].metrics, "exposition", broken)
    with held.app.test_client() as client:
        reply = client.get("/metrics")
    assert reply.status_code == 503
    assert reply.get_data() == b"metrics unavailable\n"
    assert "metrics directory gone" in caplog.text


# -- the reach service --------------------------------------------------------------------------


def test_the_reach_service_serves_metrics_without_its_database(
    reach_app_factory: Callable[..., Any], reach_demo_db: Path, tmp_path: Path
) -> None:
    db = tmp_path / "copy.sqlite"
    db.write_bytes(reach_demo_db.read_bytes())
    app = reach_app_factory(REACH_DB=str(db))
    client = app.test_client()
    pubkey = client.get("/api/nodes?limit=1").get_json()["nodes"][0]["pubkey"]
    assert client.get(f"/api/nodes/{pubkey}/reach").status_code == 200
    assert client.get(f"/api/nodes/{pubkey}/reach").status_code == 200
    db.rename(tmp_path / "gone.sqlite")
    reply = client.get("/metrics")
    assert reply.status_code == 200
    scrape = Scrape(reply.get_data(as_text=True))
    assert scrape.cache("hit") == 1 and scrape.cache("miss") == 1
    assert scrape.admissions("granted") == 1
    assert scrape("reachlimit_build_seconds_count") == 1


def test_the_reach_service_can_turn_metrics_off(reach_app_factory: Callable[..., Any]) -> None:
    app = reach_app_factory(REACHLIMIT_METRICS="false")
    assert app.test_client().get("/metrics").status_code == 404


# -- the core stays standard-library only -------------------------------------------------------


def test_the_core_imports_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"reachlimit", "__future__"}
    # The optional edges, each with the one third-party package it exists to use: the
    # extension, the metrics, the gunicorn hooks (prometheus_client inside child_exit only:
    # tests/test_gunicorn_module.py checks its import needs nothing else), and the Redis
    # backend (the package reachlimit.redis, every module of it).
    edges = {
        "flask.py": {"flask", "werkzeug"},
        "prometheus.py": {"prometheus_client"},
        "gunicorn.py": {"prometheus_client"},
    }
    package = ROOT / "reachlimit"
    for source in sorted(package.rglob("*.py")):
        in_redis = source.relative_to(package).parts[0] == "redis"
        allowed_here = allowed | ({"redis"} if in_redis else edges.get(source.name, set()))
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed_here, f"{source.name} imports {name}"
    probe = (
        "import sys, reachlimit, reachlimit.flask; "
        "assert 'prometheus_client' not in sys.modules, 'imported without metrics'; "
        "assert 'redis' not in sys.modules, 'imported without a Redis URL'"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


# -- the metered path's own arguments and figures ----------------------------------------------


def test_the_metered_limiter_is_made_from_the_arguments_with_the_librarys_defaults() -> None:
    default, plain = ReachMetrics().limiter, ColdLimiter()
    figures = ("capacity_active", "capacity_queue", "wait", "retry_after")
    assert [getattr(default, f) for f in figures] == [getattr(plain, f) for f in figures]
    given = ReachMetrics(active=3, queue=5, wait=1.5, retry_after=7).limiter
    assert [getattr(given, f) for f in figures] == [3, 5, 1.5, 7]


def test_without_deadline_a_late_leader_waits_instead_of_being_refused(
    threads: Any,
) -> None:
    """The same estimate as test_deadline_refusals_are_counted_apart; the leader's client
    has left already, so it leaves the queue instead of waiting there."""
    clock = FakeClock()
    metrics = ReachMetrics(active=1, queue=4, wait=1.0, clock=clock, deadline=False)
    learn(metrics.limiter, clock, threads, [2.0] * 4)
    holder = promote(metrics.limiter, threads, metrics.limiter.acquire())
    gone = threading.Event()
    gone.set()
    with pytest.raises(Cancelled):
        metrics.path.get("late", lambda: "never built", gone)
    holder.release()
    assert Scrape(metrics.exposition().decode()).admissions("deadline") == 0


def test_a_given_flight_and_cache_are_the_paths() -> None:
    from reachlimit import SingleFlight, TTLCache

    flight: SingleFlight[Any] = SingleFlight()
    cache: TTLCache[Any] = TTLCache(4, 60.0)
    metrics = ReachMetrics(flight=flight, cache=cache)
    assert metrics.path.flight is flight and metrics.path.cache is cache


def test_the_registry_is_the_one_a_scrape_reads_and_the_build_buckets_are_fixed() -> None:
    """``.registry``: for an app that serves the figures from a registry of its own."""
    from prometheus_client import generate_latest

    from reachlimit.prometheus import BUILD_BUCKETS

    metrics = ReachMetrics()
    assert metrics.path.get("k", lambda: "v") == "v"
    scrape = Scrape(generate_latest(metrics.registry).decode())
    assert scrape.admissions("granted") == 1
    for bound in (*BUILD_BUCKETS, "+Inf"):
        assert scrape("reachlimit_build_seconds_bucket", le=str(bound)) == 1


def test_refreshes_refused_and_failed_are_counted_by_result(threads: Any) -> None:
    """A stale entry is answered at once and refreshed by the refresher: refused while the
    only slot is held (no queue), failed when the build raises; on a fake clock."""
    from reachlimit import TTLCache

    clock = FakeClock(1000.0)
    metrics = ReachMetrics(
        active=1, queue=0, cache=TTLCache(8, 10.0, stale=60.0, clock=clock)
    )
    path = metrics.path
    path.clock = clock  # the refreshes' backoff, on the same clock
    for key in ("refused", "failed"):
        assert path.get(key, lambda k=key: k) == key
    clock.advance(11.0)  # both stale now
    gate = threading.Event()
    holder = threads.start(path.get, "held", lambda: gate.wait(DEADLINE))
    wait_until("the only slot held", lambda: metrics.limiter.stats().active == 1)
    assert path.get("refused", lambda: "never built") == "refused"  # stale, at once
    wait_until("the refused refresh", lambda: not refreshing(path.refresher, "refused"))
    gate.set()
    holder.join(DEADLINE)

    def fail() -> str:
        raise RuntimeError("database gone")

    assert path.get("failed", fail) == "failed"
    wait_until("the failed refresh", lambda: not refreshing(path.refresher, "failed"))
    counts = path.counts()
    assert (counts.refresh_refused, counts.refresh_failed) == (1, 1)
    scrape = Scrape(metrics.exposition().decode())
    assert scrape("reachlimit_refreshes_total", result="refused") == 1
    assert scrape("reachlimit_refreshes_total", result="failed") == 1
    assert scrape("reachlimit_refreshes_total", result="done") == 0
    path.close()


def test_the_503_of_unreadable_figures_is_plain_text(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> bytes:
        raise OSError("metrics directory gone")

    with held.app.app_context():
        monkeypatch.setattr(held.app.extensions["reachlimit"].metrics, "exposition", broken)
    reply = held.app.test_client().get("/metrics")
    assert reply.status_code == 503
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
