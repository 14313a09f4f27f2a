"""Faults: what the reach service does when a build raises, the database goes away or is
locked, a gunicorn worker is killed, a client never reads, or a client leaves mid-request.

design:

    in-process, Flask test client (one app per test, on a copy of the session's tiny demo DB)
      a build that raises ............ leader and every follower get the same 500 JSON; the
                                       slot is given back; nothing is cached
      the database locked mid-build .. BEGIN EXCLUSIVE from another sqlite connection: 500
                                       {"error": "reach computation failed"}, not cached; the
                                       next request after COMMIT/ROLLBACK is a 200
      the database renamed / removed . cold reports 500 JSON while it is gone (cached ones
                                       are still served), 200 once it is back
      a warm report, database locked .. served at once from the cache
    in-process, Werkzeug's threaded server (real sockets, so the client-gone watch runs)
      a client leaves while queued ... its queue place comes back; a follower of it leads
      a client leaves while building . the build completes, its value is cached, the slot
                                       comes back
    real gunicorn -k gthread on 127.0.0.1 (subprocess, stopped by its PID; tests/support/)
      a worker SIGKILLed under load .. the master replaces it, the service answers again,
                                       every client request ends within its timeout
      clients that never read ........ the server keeps answering everybody else

Builds are held on a gate (a ``threading.Event``) the test opens, so "the build is running"
is a fact, not a duration. Every wait is bounded; every thread is joined with a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import webapp.api
import webapp.db
import webapp.meshcore
import webapp.snapshot
import webapp.state
from tests.support import HOST, ROOT
from tests.support.clients import Reply, http_request, raw_client
from tests.support.gunicorn_server import GunicornServer, reach_service, serving
from tests.support.processes import pid_alive
from tests.support.waiting import wait_until
from tests.support.werkzeug_server import werkzeug_serving
from webapp.api import reach_limit

#: Bound on anything a passing test waits for; only a failing run gets near it.
DEADLINE = 15.0
FAILED = {"error": "reach computation failed"}
INTERNAL = {"error": "Internal server error"}
#: Text that must never reach a client: a traceback, a source line, a server path.
LEAKS = (b"Traceback", b'File "', b"/work", b"/tmp", b"site-packages", str(ROOT).encode())



def assert_json_error(status: int, content_type: str, body: bytes, want_status: int,
                      want: dict[str, Any] | list[dict[str, Any]]) -> None:
    """A JSON error answer with ``want`` as its body (or one of them) and nothing leaked."""
    assert status == want_status, (status, body[:300])
    assert content_type.split(";")[0].strip() == "application/json", content_type
    assert json.loads(body) in (want if isinstance(want, list) else [want]), body[:300]
    for leak in LEAKS:
        assert leak not in body, (leak, body[:300])


def path_capable_targets(db: Path) -> list[str]:
    """Pubkeys whose report runs a real scan (path-capable, with a reliable token)."""
    conn = webapp.db.open_readonly(db)
    try:
        index = webapp.snapshot.load_node_index(conn)
    finally:
        conn.close()
    return sorted(
        key for key, node in index.nodes.items()
        if webapp.meshcore.is_path_capable(node.role) and index.reliable_tokens(key)
    )


def figures(app: Any) -> dict[str, Any]:
    """The app's ColdPath figures (read in-process, no request needed)."""
    with app.app_context():
        return reach_limit.stats().as_dict()


class BuildGate:
    """Wraps the webapp's build: every build announces itself and waits for ``go``."""

    def __init__(self, real: Callable[..., Any], before: Callable[[], None] | None = None):
        self.real = real
        self.before = before  # runs in the build, after the gate opened
        self.go = threading.Event()
        self.started = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.running = 0  # guarded by _lock
        self.finished = 0  # guarded by _lock

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.running += 1
        self.started.release()
        try:
            assert self.go.wait(DEADLINE), "the test never opened the build gate"
            if self.before is not None:
                self.before()
            return self.real(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1
                self.finished += 1

    def wait_started(self, n: int = 1) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=DEADLINE), "a build never started"


def run_in_threads(fns: list[Callable[[], Any]]) -> list[Any]:
    """Run each function in its own thread; return their results (or exceptions)."""
    results: list[Any] = [None] * len(fns)

    def runner(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=runner, args=(i, fn), daemon=True)
               for i, fn in enumerate(fns)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + DEADLINE
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "request threads did not finish"
    return results


class Spawned:
    """Requests started in their own threads (test clients), collected with a timeout."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.results[name] = fn()
            except BaseException as exc:  # noqa: BLE001
                self.results[name] = exc

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        assert not alive, f"requests still running: {alive}"
        return self.results


def get(app: Any, url: str) -> tuple[int, str, bytes]:
    """One request through a fresh test client, in the calling thread."""
    response = app.test_client().get(url)
    return response.status_code, response.content_type or "", response.data


def followers_of(app: Any, key: str) -> int:
    """White-box: requests attached to the in-flight build of ``key``."""
    with app.app_context():
        call = reach_limit.path.flight._calls.get(key)
    return call.followers if call is not None else 0


@pytest.fixture
def db_copy(reach_demo_db: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "reach.sqlite"
    shutil.copyfile(reach_demo_db, copy)
    return copy


@pytest.fixture
def targets(reach_demo_db: Path) -> list[str]:
    found = path_capable_targets(reach_demo_db)
    assert len(found) >= 6
    return found


# --------------------------------------------------------------------------------------------
# A build that raises
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error,want", [
    (sqlite3.OperationalError("disk I/O error at /work/secret.sqlite"), FAILED),
    # Only a database failure has a fixed answer (the reach 500); for a bug, any JSON sentence
    # of the service will do, as long as it is the same for everybody and shows no detail.
    (RuntimeError("boom in /work/main/webapp/reach.py"), [FAILED, INTERNAL]),
], ids=["sqlite-error", "unexpected-error"])
def test_a_build_that_raises_fails_its_followers_frees_its_slot_and_is_not_cached(
    reach_app_factory: Any, db_copy: Path, targets: list[str], monkeypatch: pytest.MonkeyPatch,
    error: Exception, want: dict[str, Any] | list[dict[str, Any]],
) -> None:
    app = reach_app_factory(REACH_DB=str(db_copy), REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=2)
    real = webapp.api.build_report

    def fail() -> None:
        raise error

    gate = BuildGate(real, before=fail)
    monkeypatch.setattr(webapp.api, "build_report", gate)
    target = targets[0]
    url = f"/api/nodes/{target}/reach?days=30"
    key = f"{target}|30|g0"
    followers = 5
    spawned = Spawned()
    spawned.start("leader", lambda: get(app, url))
    gate.wait_started()
    for i in range(followers):
        spawned.start(f"follower{i}", lambda: get(app, url))
    wait_until("every follower to attach", lambda: followers_of(app, key) == followers)
    gate.go.set()
    results = spawned.join()
    for name, result in results.items():
        assert not isinstance(result, BaseException), (name, result)
        assert_json_error(*result, 500, want)
    assert len({result[2] for result in results.values()}) == 1, "followers got another error"
    stats = figures(app)
    # One build for all of them. (``coalesced`` counts only followers that got a value.)
    assert (stats["builds"], stats["misses"]) == (1, followers + 1), stats
    assert (stats["active"], stats["queued"]) == (0, 0), stats

    monkeypatch.setattr(webapp.api, "build_report", real)
    status, _, body = get(app, url)
    assert status == 200 and json.loads(body)["node"]["pubkey"] == target
    assert figures(app)["builds"] == 2, "the failure was cached"
    assert get(app, url)[2] == body and figures(app)["hits"] == 1  # the success was


# --------------------------------------------------------------------------------------------
# The database locked, renamed, removed
# --------------------------------------------------------------------------------------------


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    """Handler connections wait 0.3 s (not 5 s) for a locked database: same path, quicker."""
    timeout = 0.3
    monkeypatch.setattr(webapp.state, "open_readonly",
                        functools.partial(webapp.db.open_readonly, timeout=timeout))
    return timeout


@contextlib.contextmanager
def exclusive_lock(db: Path) -> Iterator[None]:
    """Another process's writer holding an exclusive lock (rollback-journal mode: readers are
    shut out until it ends)."""
    writer = sqlite3.connect(db, isolation_level=None, timeout=DEADLINE)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            writer.execute("ROLLBACK")
    finally:
        writer.close()


def test_a_database_locked_mid_build_is_500_not_cached_and_recovers(
    reach_app_factory: Any, db_copy: Path, targets: list[str], monkeypatch: pytest.MonkeyPatch,
    short_busy_timeout: float,
) -> None:
    app = reach_app_factory(REACH_DB=str(db_copy))
    warm_url = f"/api/nodes/{targets[1]}/reach?days=7"
    assert get(app, warm_url)[0] == 200  # cached before the trouble starts
    locked = threading.Event()
    unlock = threading.Event()

    def hold_lock() -> None:
        with exclusive_lock(db_copy):
            locked.set()
            unlock.wait(DEADLINE)

    locker = threading.Thread(target=hold_lock, daemon=True)
    gate = BuildGate(webapp.api.build_report)
    monkeypatch.setattr(webapp.api, "build_report", gate)
    url = f"/api/nodes/{targets[0]}/reach?days=30"
    try:
        spawned = Spawned()
        spawned.start("leader", lambda: get(app, url))
        gate.wait_started()  # the target lookup is done; the build holds the slot
        spawned.start("follower", lambda: get(app, url))
        wait_until("the follower", lambda: followers_of(app, f"{targets[0]}|30|g0") == 1)
        locker.start()
        assert locked.wait(DEADLINE)
        gate.go.set()  # the build now reads a locked database
        for name, result in spawned.join().items():
            assert not isinstance(result, BaseException), (name, result)
            assert_json_error(*result, 500, FAILED)
        stats = figures(app)
        assert (stats["builds"], stats["active"], stats["queued"]) == (2, 0, 0), stats

        # While it stays locked: every report answer is bounded and JSON; health is served.
        health_status, _, health_body = get(app, "/api/health")
        assert health_status == 200 and json.loads(health_body)["status"] == "ok"
        started = time.monotonic()
        status, content_type, body = get(app, url)
        assert_json_error(status, content_type, body, 500, FAILED)
        assert time.monotonic() - started < short_busy_timeout * 4 + 2.0
    finally:
        unlock.set()
        gate.go.set()
        locker.join(DEADLINE)
    assert not locker.is_alive()

    builds = figures(app)["builds"]
    status, _, body = get(app, url)
    assert status == 200 and json.loads(body)["node"]["pubkey"] == targets[0]
    assert figures(app)["builds"] == builds + 1, "a failure was cached"
    assert get(app, warm_url)[0] == 200


def test_a_warm_report_is_served_at_once_while_the_database_is_locked(
    reach_app_factory: Any, db_copy: Path, targets: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm bypass, the first layer of a request: a cached answer is served at once, so a
    locked database neither delays nor fails it (from a fresh handler thread, which has no
    connection open)."""
    busy_timeout = 3.0  # what a warm hit would wait if it touched the database
    monkeypatch.setattr(webapp.state, "open_readonly",
                        functools.partial(webapp.db.open_readonly, timeout=busy_timeout))
    app = reach_app_factory(REACH_DB=str(db_copy))
    url = f"/api/nodes/{targets[1]}/reach?days=7"
    status, _, warm = get(app, url)
    assert status == 200
    with exclusive_lock(db_copy):
        started = time.monotonic()
        result = run_in_threads([lambda: get(app, url)])[0]
        elapsed = time.monotonic() - started
    assert not isinstance(result, BaseException), result
    assert result[0] == 200 and result[2] == warm, result[:2]
    assert elapsed < busy_timeout, "the warm hit waited for the database"


def test_a_database_renamed_away_then_back_is_500_meanwhile_then_200(
    reach_app_factory: Any, db_copy: Path, targets: list[str],
) -> None:
    """While the file is gone a cold report is 500 JSON and not cached, /api/nodes is 500
    JSON, a cached report and /api/health are still served; once it is back, 200.

    Each phase runs in fresh threads: a handler thread opens its connection on first use,
    as a new gthread worker thread does. (A thread whose connection is already open keeps
    reading the file it opened, renamed or not: SQLite semantics, not a failure.)"""
    app = reach_app_factory(REACH_DB=str(db_copy))
    warm_url = f"/api/nodes/{targets[0]}/reach?days=7"
    status, _, warm_body = run_in_threads([lambda: get(app, warm_url)])[0]
    assert status == 200
    aside = db_copy.with_name("aside.sqlite")

    for how, cold_target in (("rename", targets[1]), ("remove", targets[2])):
        cold_url = f"/api/nodes/{cold_target}/reach?days=7"
        if how == "rename":
            db_copy.rename(aside)
        else:
            shutil.copyfile(db_copy, aside)
            db_copy.unlink()
        cold, warm, nodes, health = run_in_threads([
            functools.partial(get, app, cold_url), lambda: get(app, warm_url),
            lambda: get(app, "/api/nodes"), lambda: get(app, "/api/health"),
        ])
        assert_json_error(*cold, 500, FAILED)
        assert warm[0] == 200 and warm[2] == warm_body, "a cached report needs no database"
        assert_json_error(*nodes, 500, {"error": "database unavailable"})
        # Answered while the cold request may still hold its slot; the slot's return is
        # checked once every thread has finished, just below.
        assert health[0] == 200 and "active" in json.loads(health[2])["reach"]
        stats = figures(app)
        assert (stats["active"], stats["queued"]) == (0, 0), stats
        builds = stats["builds"]
        aside.rename(db_copy)  # it is back
        cold, nodes = run_in_threads([functools.partial(get, app, cold_url),
                                      lambda: get(app, "/api/nodes")])
        assert cold[0] == 200 and json.loads(cold[2])["node"]["pubkey"] == cold_target
        assert nodes[0] == 200
        assert figures(app)["builds"] == builds + 1, "the failure was cached"


# --------------------------------------------------------------------------------------------
# Clients that leave, under a real (in-process, threaded Werkzeug) server
# --------------------------------------------------------------------------------------------


def read_reply(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_clients_that_leave_while_queued_or_building(
    reach_app_factory: Any, db_copy: Path, targets: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slot, two queue places. A builds K1 (held). B leads K2 in the queue, C follows B.
    B leaves: its place comes back and C leads K2 in its stead. A leaves while building: the
    build completes, K1 is cached, the slot passes to C, whose report arrives."""
    app = reach_app_factory(REACH_DB=str(db_copy), REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=2,
                            REACHLIMIT_WAIT=30)
    gate = BuildGate(webapp.api.build_report)
    monkeypatch.setattr(webapp.api, "build_report", gate)
    k1 = f"/api/nodes/{targets[0]}/reach?days=30"
    k2 = f"/api/nodes/{targets[1]}/reach?days=30"
    with werkzeug_serving(app, poll_interval=0.05, join_timeout=DEADLINE) as server:
        port = server.port
        sockets: list[socket.socket] = []
        try:
            a = raw_client(port, k1, DEADLINE)
            sockets.append(a)
            gate.wait_started()
            b = raw_client(port, k2, DEADLINE)
            sockets.append(b)
            wait_until("B queued", lambda: figures(app)["queued"] == 1)
            c = raw_client(port, k2, DEADLINE)
            sockets.append(c)
            wait_until("C following B", lambda: followers_of(app, f"{targets[1]}|30|g0") == 1)

            left = time.monotonic()
            b.close()  # B leaves while queued
            wait_until("B's cancellation", lambda: figures(app)["cancelled"] == 1)
            delay = time.monotonic() - left
            # C takes over as leader and queues in B's stead; K2 is not built yet.
            wait_until("C to queue in B's stead", lambda: figures(app)["queued"] == 1)
            stats = figures(app)
            assert (stats["active"], stats["queued"], stats["builds"]) == (1, 1, 1), stats
            assert followers_of(app, f"{targets[1]}|30|g0") == 0  # C leads now

            a.close()  # A leaves while its build runs
            gate.go.set()
            status, body = read_reply(c)
            assert status == 200 and json.loads(body)["node"]["pubkey"] == targets[1]
            wait_until("both builds done", lambda: gate.finished == 2)
            wait_until("the slot back", lambda: figures(app)["active"] == 0)
        finally:
            gate.go.set()
            for sock in sockets:
                sock.close()
    stats = figures(app)
    assert (stats["active"], stats["queued"], stats["builds"]) == (0, 0, 2), stats
    hits = stats["hits"]
    status, _, body = get(app, k1)  # A's build was cached although nobody read it
    assert status == 200 and json.loads(body)["node"]["pubkey"] == targets[0]
    assert (figures(app)["hits"], figures(app)["builds"]) == (hits + 1, 2)
    print(f"\n[client gone] queue place back {delay * 1000:.0f} ms after the client closed")


# --------------------------------------------------------------------------------------------
# A real gunicorn
# --------------------------------------------------------------------------------------------


def http_get(port: int, path: str, timeout: float) -> Reply:
    return http_request(port, "GET", path, timeout)


@pytest.fixture(scope="module")
def live_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny demo database whose 30-day window ends this hour (the server's clock is real)."""
    from webapp.demodb import write_demo_db

    path = tmp_path_factory.mktemp("live-db") / "reach.sqlite"
    write_demo_db(path, nodes=150, observations=6_000, seed=11)
    return path


@pytest.fixture(scope="module")
def live_server(
    tmp_path_factory: pytest.TempPathFactory, live_db: Path,
) -> Iterator[GunicornServer]:
    """The real service (webapp.wsgi:app with webapp/gunicorn.conf.py) under gunicorn: two
    workers of 16 threads; stopped by its PID, with a check that its workers are gone."""
    server = reach_service(
        tmp_path_factory.mktemp("gunicorn"), live_db, "faults",
        workers=2, workers_env=None, threads=16, graceful_timeout=5,
        ready_timeout=DEADLINE * 2, stripped_env=("REACH_", "REACHLIMIT_", "GUNICORN_"),
    )
    with serving(server, check_log=False):
        yield server


CLIENT_TIMEOUT = 10.0  # longer than any bounded wait: 3 s queue wait + a sub-second build
OK_STATUSES = {200, 429}


class Load:
    """Client threads sending report requests (mostly distinct cold keys, some warm) until
    stopped; every request has a socket timeout and its outcome and duration are kept."""

    def __init__(self, port: int, keys: list[str], clients: int, seed: int) -> None:
        self.port = port
        self.keys = keys
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[tuple[float, float, str]] = []  # (start, duration, outcome)
        self.threads = [
            threading.Thread(target=self._run, args=(random.Random(seed + i),), daemon=True)
            for i in range(clients)
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        deadline = time.monotonic() + CLIENT_TIMEOUT + DEADLINE
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "load clients did not finish"

    def count(self) -> int:
        with self.lock:
            return len(self.outcomes)

    def _run(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            key = rng.choice(self.keys[:3]) if rng.random() < 0.2 else rng.choice(self.keys)
            days = rng.randint(1, 30)
            started = time.monotonic()
            try:
                status, headers, body = http_get(
                    self.port, f"/api/nodes/{key}/reach?days={days}", CLIENT_TIMEOUT)
                outcome = str(status)
                if status == 429 and headers.get("retry-after") != "2":
                    outcome = "429 without Retry-After: 2"
                elif not headers.get("content-type", "").startswith("application/json"):
                    outcome = f"{status} not JSON"
                else:
                    json.loads(body)
            except TimeoutError:
                outcome = "timeout"
            except (OSError, http.client.HTTPException) as exc:
                outcome = f"connection error: {type(exc).__name__}"
            with self.lock:
                self.outcomes.append((started, time.monotonic() - started, outcome))


@pytest.mark.gunicorn
def test_a_worker_killed_under_load_is_replaced_and_no_request_outlives_its_bounds(
    live_server: GunicornServer, live_db: Path,
) -> None:
    keys = path_capable_targets(live_db)
    workers = live_server.worker_pids()
    assert len(workers) == 2
    victim = sorted(workers)[0]
    clients = 12
    with Load(live_server.port, keys, clients, seed=7) as load:
        wait_until("some load", lambda: load.count() >= 40)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_until("the worker to die", lambda: not pid_alive(victim))
        replacement = wait_until(
            "the master to fork a replacement",
            lambda: (set(live_server.worker_pids()) - set(workers)) or None,
        )
        replaced_at = time.monotonic()
        after = load.count()
        wait_until("load served after the replacement", lambda: load.count() >= after + 40)
    outcomes = Counter(outcome for _, _, outcome in load.outcomes)
    worst = max(duration for _, duration, _ in load.outcomes)
    print(f"\n[worker kill] {len(load.outcomes)} requests, {dict(outcomes)}; replacement "
          f"{sorted(replacement)} after {replaced_at - killed_at:.2f} s; slowest {worst:.2f} s")
    assert victim not in live_server.worker_pids()
    assert len(live_server.worker_pids()) == 2
    bad = {o: n for o, n in outcomes.items()
           if not (o.isdigit() and int(o) in OK_STATUSES) and not o.startswith("connection")}
    assert not bad, bad  # never a 5xx, a non-JSON body or a timeout
    errors = [(s, o) for s, _, o in load.outcomes if o.startswith("connection")]
    # Only requests the killed worker had in hand can fail: at most one per client thread,
    # and none started after the replacement was up.
    assert len(errors) <= clients, errors
    assert all(s <= replaced_at for s, _ in errors), errors
    assert worst < CLIENT_TIMEOUT
    for _ in range(10):  # answers again, on every worker that picks the connection up
        assert http_get(live_server.port, "/api/health", 5)[0] == 200


@pytest.mark.gunicorn
def test_clients_that_never_read_do_not_stop_the_server(live_server: GunicornServer) -> None:
    """Four connections pipeline hundreds of /api/nodes requests (15 kB answers each) and
    never read: once the socket buffers fill, each pins one handler thread in a blocking
    send. Everybody else is still answered promptly; closing the sockets frees the threads."""
    port = live_server.port
    workers = live_server.worker_pids()
    slow: list[socket.socket] = []
    request = f"GET /api/nodes?limit=500 HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(1)
            sock.connect((HOST, port))
            with contextlib.suppress(TimeoutError, socket.timeout, OSError):
                for _ in range(400):  # stops when the server stops reading us, too
                    sock.sendall(request)
            slow.append(sock)
            sock.settimeout(DEADLINE)
        # The server has answered into those sockets (it is serving them), and they read
        # nothing.
        for sock in slow:
            wait_until("the server to answer into a slow socket",
                       lambda sock=sock: len(sock.recv(1, socket.MSG_PEEK)) == 1)
        for i in range(30):
            path = ("/api/health", "/api/nodes?limit=5", "/api/nodes?q=a")[i % 3]
            started = time.monotonic()
            status, _, body = http_get(port, path, 5)
            assert status == 200, (path, status, body[:200])
            assert time.monotonic() - started < 5
    finally:
        for sock in slow:
            sock.close()
    for _ in range(5):
        assert http_get(port, "/api/health", 5)[0] == 200
    assert live_server.worker_pids() == workers, "a worker died or was replaced"
