"""Saturation of the real service: ``webapp`` under a real gunicorn, on 127.0.0.1.

design:

    The server is started the way an operator starts it - ``gunicorn -c
    webapp/gunicorn.conf.py webapp.wsgi:app`` - with only the environment the config file
    reads overridden: ``REACH_BIND`` (a free loopback port), ``REACH_WORKERS=1`` (so the
    figures of ``/api/health`` are those of the one process that serves every request),
    ``REACH_DB`` (a demo database written once for this module) and ``REACH_LOG_LEVEL=debug``
    (so gunicorn prints the configuration it runs with, and the test can check that the
    config file's own settings - gthread, 16 threads, preload - are the ones in force). It
    is stopped by its PID; ``tests/support/gunicorn_server.py`` checks that the master and
    its workers are gone.

    The demo database (800 nodes, 200,000 observations, written in about 3 s) is sized so
    that a cold 7-day report of a relay scans tens of thousands of rows - tens of ms - and a
    30-day one more. Keys are relays with a reliable hop token (their reports really scan),
    handed out so that no two tests share one: every key a test calls cold has never been
    asked of this server before.

    Nothing here holds a build: these are real database scans, so whether a burst finds the
    limiter full depends on the machine. The assertions therefore never depend on timing -
    they hold for every interleaving: the set of statuses is within {200, 429}, every 429 is
    the documented refusal, the limiter never saw more than two builds at once, and the
    counters of ``/api/health`` account for every request exactly. How many were refused, and
    where the bystanders' replies fell among the burst's, is printed, not asserted.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Herd, Reply, check_refusal
from tests.support.gunicorn_server import GunicornServer, reach_service, serving
from tests.support.processes import pid_alive
from tests.support.waiting import wait_until

pytestmark = pytest.mark.gunicorn

#: Demo database size: a cold 7-day relay report takes tens of ms, the file takes ~3 s.
DB_NODES = 800
DB_OBSERVATIONS = 200_000
DB_SEED = 11
RELAY_ROLES = ("repeater", "room_server", "room")

#: The warning ReachLimit.init_app logs when gunicorn gives a worker too few threads.
THREAD_WARNING = "thread(s) per worker, fewer than active + queue"

#: Requests released with each burst that never touch the cold path.
BYSTANDERS = ["/", "/api/nodes?limit=5", "/", "/api/nodes?limit=5"]


# -- the database and its keys --------------------------------------------------------------


@dataclass
class DemoDb:
    path: Path
    relays: list[str]  # relays with a reliable hop token, by pubkey
    _next: int = 0  # the first relay no test has taken yet

    def take(self, n: int) -> list[str]:
        """``n`` relay pubkeys no test has used before."""
        keys = self.relays[self._next : self._next + n]
        assert len(keys) == n, f"the demo database has only {len(self.relays)} usable relays"
        self._next += n
        return keys


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> DemoDb:
    from webapp.db import open_readonly
    from webapp.demodb import write_demo_db
    from webapp.snapshot import load_node_index

    path = tmp_path_factory.mktemp("webapp-gunicorn-db") / "demo.sqlite"
    # `now` is the default (the start of this hour): the server's report windows end at the
    # real wall clock, so the data must lead up to the present.
    summary = write_demo_db(path, nodes=DB_NODES, observations=DB_OBSERVATIONS, seed=DB_SEED)
    print(f"demo database: {summary.as_dict()}")
    with contextlib.closing(open_readonly(path)) as conn:
        index = load_node_index(conn)
        marks = ",".join("?" * len(RELAY_ROLES))
        rows = conn.execute(
            f"SELECT public_key FROM nodes WHERE role IN ({marks}) ORDER BY public_key",
            RELAY_ROLES,
        )
        relays = [pk for (pk,) in rows if index.reliable_tokens(pk)]
    return DemoDb(path, relays)


def report_path(pubkey: str, days: int | None = 7) -> str:
    suffix = "" if days is None else f"?days={days}"
    return f"/api/nodes/{pubkey}/reach{suffix}"


# -- the server -----------------------------------------------------------------------------


def webapp_server(log_dir: Path, db: Path, name: str, workers: int = 1) -> GunicornServer:
    """The service as an operator starts it: the config file, and the environment it reads."""
    return reach_service(log_dir, db, name, workers=workers, env={"REACH_LOG_LEVEL": "debug"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_db: DemoDb) -> Iterator[GunicornServer]:
    srv = webapp_server(tmp_path_factory.mktemp("webapp-gunicorn"), demo_db.path, "webapp")
    with serving(srv):
        yield srv


def health(server: GunicornServer) -> dict[str, Any]:
    body = server.get_json("/api/health")
    assert body["status"] == "ok"
    figures: dict[str, Any] = body["default"]
    return figures


def wait_idle(server: GunicornServer) -> dict[str, Any]:
    """The figures once no build runs and nobody is queued."""
    return wait_until(  # type: ignore[no-any-return]
        "the server to be idle",
        lambda: (lambda h: h if h["active"] == h["queued"] == 0 else None)(health(server)),
    )


def delta(after: dict[str, Any], before: dict[str, Any], name: str) -> int:
    value: int = after[name] - before[name]
    return value


def check_report(reply: Reply, pubkey: str, days: int) -> None:
    assert reply.status == 200, reply
    assert reply.headers["content-type"].split(";")[0].strip() == "application/json"
    report = reply.json()
    assert report["node"]["pubkey"] == pubkey
    assert report["window"]["days"] == days


def check_bystanders(paths: list[str], replies: list[Reply]) -> None:
    """The page and the node list answered, with what they are."""
    for path, reply in zip(paths, replies, strict=True):
        assert reply.status == 200, (path, reply)
        if path == "/":
            assert reply.headers["content-type"].startswith("text/html")
            assert b"<title>Mesh reach reports</title>" in reply.body
        else:
            assert path.startswith("/api/nodes?")
            body = reply.json()
            assert len(body["nodes"]) == 5
            assert body["total"] >= 5


def positions(herd: Herd, first: int, count: int) -> list[int]:
    """Where (1-based) the replies to paths ``first .. first+count-1`` came back."""
    order = list(herd.order)
    return [order.index(i) + 1 for i in range(first, first + count)]


# -- the configuration in force ---------------------------------------------------------------


def configuration(stderr: str) -> dict[str, str]:
    """gunicorn's "Current configuration" dump (logged at debug level) as {name: value}."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "Current configuration:" in line)
    settings: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        name, _, value = line.strip().partition(": ")
        settings[name] = value
    return settings


def test_config_file_settings_apply(server: GunicornServer) -> None:
    stderr = server.stderr()
    settings = configuration(stderr)
    # The config file's own settings ...
    assert settings["worker_class"] == "gthread"
    assert settings["threads"] == "16"
    assert settings["preload_app"] == "True"
    assert settings["timeout"] == "30"
    assert settings["accesslog"] == "-"
    # ... and the environment overrides it reads.
    assert settings["workers"] == "1"
    assert settings["bind"] == f"['127.0.0.1:{server.port}']"
    assert "Using worker: gthread" in stderr
    assert f"Listening at: http://127.0.0.1:{server.port} ({server.pid})" in stderr
    assert stderr.count("Booting worker with pid:") == 1
    assert len(server.worker_pids()) == 1
    # 16 threads >= active + queue + 4: no sizing warning.
    assert THREAD_WARNING not in stderr
    figures = health(server)
    assert figures["capacity_active"] == 2
    assert figures["capacity_queue"] == 8
    # The access log goes to stdout, as the config file says.
    wait_until(
        "an access log line", lambda: '"GET /api/health HTTP/1.1" 200 ' in server.stdout()
    )


# -- saturation: a burst, a herd, a warm report ---------------------------------------------


def test_forty_distinct_cold_keys_get_only_200s_and_429s(
    server: GunicornServer, demo_db: DemoDb
) -> None:
    before = wait_idle(server)
    keys = demo_db.take(40)
    reports = [report_path(k, 7) for k in keys]
    herd = Herd(server.port, reports + BYSTANDERS)
    replies = herd.results()
    burst, bystanders = replies[:40], replies[40:]
    after = wait_idle(server)

    statuses = Counter(r.status for r in burst)
    print(
        f"webapp under gunicorn, 40 distinct cold keys: {dict(statuses)}; "
        f"bystanders answered as reply {positions(herd, 40, len(BYSTANDERS))} "
        f"of {len(replies)}; peak_active {after['peak_active']}, "
        f"peak_queued {after['peak_queued']}"
    )
    assert set(statuses) <= {200, 429}, statuses  # never a 5xx (nor anything else)
    ok = statuses[200]
    refused = statuses[429]
    for key, reply in zip(keys, burst, strict=True):
        if reply.status == 200:
            check_report(reply, key, 7)
        else:
            check_refusal(reply)

    # Never more than two builds at once, as the limiter saw it.
    assert 1 <= after["peak_active"] <= 2
    assert after["peak_queued"] <= 8
    # Every request was cold; each 200 is one build, each 429 a refusal and no build.
    assert delta(after, before, "misses") == 40
    assert delta(after, before, "hits") == 0
    assert delta(after, before, "coalesced") == 0
    assert delta(after, before, "builds") == ok
    assert delta(after, before, "acquired") == ok
    assert delta(after, before, "rejected_full") + delta(after, before, "rejected_timeout") == (
        refused
    )

    # The page and the node list answered alongside the burst.
    check_bystanders(BYSTANDERS, bystanders)

    # Asked again, each built report is a warm hit with the very same bytes, and no build.
    before = after
    for key, reply in zip(keys, burst, strict=True):
        if reply.status == 200:
            warm = server.get(report_path(key, 7))
            assert warm.status == 200
            assert warm.body == reply.body
    after = health(server)
    assert delta(after, before, "hits") == ok
    assert delta(after, before, "builds") == 0

    # Nothing about a refusal was cached: each refused key, asked alone, is built now.
    before = after
    for key, reply in zip(keys, burst, strict=True):
        if reply.status == 429:
            check_report(server.get(report_path(key, 7)), key, 7)
    after = health(server)
    assert delta(after, before, "builds") == refused
    assert delta(after, before, "misses") == refused
    assert after["peak_active"] <= 2


def test_same_key_herd_runs_one_build(server: GunicornServer, demo_db: DemoDb) -> None:
    before = wait_idle(server)
    [key] = demo_db.take(1)
    path = report_path(key, 30)  # the longest window: the slowest build
    herd = Herd(server.port, [path] * 20 + BYSTANDERS)
    replies = herd.results()
    same, bystanders = replies[:20], replies[20:]
    after = wait_idle(server)
    print(
        f"webapp under gunicorn, 20-request same-key herd: "
        f"{delta(after, before, 'coalesced')} coalesced, {delta(after, before, 'hits')} warm; "
        f"bystanders answered as reply {positions(herd, 20, len(BYSTANDERS))} of {len(replies)}"
    )

    for reply in same:
        check_report(reply, key, 30)
    assert len({r.body for r in same}) == 1  # twenty identical bodies
    assert delta(after, before, "builds") == 1  # from one build
    assert delta(after, before, "acquired") == 1
    assert delta(after, before, "rejected_full") == 0
    assert delta(after, before, "rejected_timeout") == 0
    # Each request was either a warm hit (it came after the build was published) or a miss;
    # of the misses, one led and the others shared its build or found it in the cache on
    # the leader's recheck.
    assert delta(after, before, "hits") + delta(after, before, "misses") == 20
    assert delta(after, before, "coalesced") <= delta(after, before, "misses") - 1

    check_bystanders(BYSTANDERS, bystanders)

    warm = server.get(path)
    assert warm.body == same[0].body
    assert delta(health(server), after, "builds") == 0


def test_warm_report_is_byte_identical_to_the_cold_one(
    server: GunicornServer, demo_db: DemoDb
) -> None:
    before = wait_idle(server)
    [key] = demo_db.take(1)
    cold = server.get(report_path(key, 7))
    check_report(cold, key, 7)
    middle = health(server)
    assert delta(middle, before, "builds") == 1
    assert delta(middle, before, "hits") == 0

    warm = server.get(report_path(key, 7))
    default = server.get(report_path(key, None))  # no days: 7, the same cache key
    after = health(server)
    assert delta(after, middle, "builds") == 0
    assert delta(after, middle, "hits") == 2
    for reply in (warm, default):
        assert reply.status == 200
        assert reply.body == cold.body
        assert reply.headers["content-type"] == cold.headers["content-type"]


# -- stopping -------------------------------------------------------------------------------


def test_stop_leaves_no_master_and_no_worker(
    tmp_path_factory: pytest.TempPathFactory, demo_db: DemoDb
) -> None:
    """Two workers, so the harness must find both through /proc and see both gone."""
    srv = webapp_server(tmp_path_factory.mktemp("webapp-stop"), demo_db.path, "stop", workers=2)
    with serving(srv):
        master = srv.pid
        workers = srv.worker_pids()
        assert len(workers) == 2
        assert master not in workers
        # A worker is a process (seen above) a moment before it logs its boot line: wait for
        # the lines, then check there are exactly two, one for each worker.
        wait_until(
            "a boot line from each worker",
            lambda: all(f"Booting worker with pid: {pid}" in srv.stderr() for pid in workers),
        )
        assert srv.stderr().count("Booting worker with pid:") == 2
        assert srv.get("/api/health").status == 200
        assert all(pid_alive(pid) for pid in [master, *workers])
    # serving() has stopped it by PID and checked; check again, in plain words.
    assert srv.processes_gone()
    assert not pid_alive(master)
    for pid in workers:
        assert not pid_alive(pid)
    assert "Shutting down: Master" in srv.stderr()
