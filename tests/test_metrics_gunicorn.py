"""``GET /metrics`` under real gunicorn: one scrape of any worker counts the whole server.

design:

    Servers run ``webapp/gunicorn.conf.py`` - the file an operator runs, with its metrics
    directory, its ``child_exit`` hook and ``preload_app`` - serving the slow test app
    (``tests/apps/slow_app.py``, builds held on a gate the test opens) or the reach service
    itself, with one worker and with three, on 127.0.0.1, stopped by PID.
    ``PROMETHEUS_MULTIPROC_DIR`` is a directory of the test in which a stale file of a
    process of an "earlier run" is planted first: the config file must wipe it at start.

    "Whichever worker answers" is made deterministic rather than hoped for: to talk to one
    worker, the test stops every other worker of the server with SIGSTOP (by PID, checked in
    /proc), so only that one can accept the connection, checks who answered (the slow app's
    ``/debug/builds`` names its PID), and resumes the others with SIGCONT. Loads are put on
    each worker that way too, so the test knows exactly what every worker did, and every
    scrape, from every worker, must show the sum.

    Slow-app builds are held on the gate, ``REACHLIMIT_WAIT`` is 30 s (no queued leader can
    time out while a test runs) and each worker's gate is closed from the start: two builds
    and eight waiting leaders per worker are states read back from ``/health``; every other
    distinct leader is a 429. Followers are avoided (distinct keys), so each 429 is one
    refusal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from reachlimit.gunicorn import TEMPORARY_PREFIX
from reachlimit.prometheus import _HELP
from tests.support.clients import Herd, Reply, check_refusal
from tests.support.gunicorn_server import WEBAPP_CONFIG, GunicornServer, reach_service, serving
from tests.support.processes import pid_alive
from tests.support.waiting import wait_until
from tests.test_metrics import Scrape

pytestmark = [pytest.mark.gunicorn, pytest.mark.timeout(180)]

APP = "tests.apps.slow_app:create_app()"
#: Threads per worker: active + queue + spare, as the service runs.
THREADS = 16
#: The PID of the stale files planted before start: no process of the test has it.
STALE_PID = 4_000_000


# -- directing requests at one worker -------------------------------------------------------


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def only(server: GunicornServer, pid: int) -> Iterator[None]:
    """For the block, every worker of ``server`` but ``pid`` is stopped (SIGSTOP), so a new
    connection can only be accepted by ``pid``; they are resumed (SIGCONT) on the way out."""
    others = [p for p in server.worker_pids() if p != pid]
    assert pid in server.worker_pids(), f"{pid} is not a worker of the server"
    stopped: list[int] = []
    try:
        for p in others:
            os.kill(p, signal.SIGSTOP)
            stopped.append(p)
        for p in others:
            wait_until(f"worker {p} to stop", lambda p=p: _state(p) in ("T", "t", None))
        yield
    finally:
        for p in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)


def scrape(server: GunicornServer) -> Scrape:
    reply = server.get("/metrics")
    assert reply.status == 200, reply
    assert reply.headers["content-type"].startswith("text/plain; version=")
    return Scrape(reply.body.decode())


def scrape_each_worker(server: GunicornServer, check_pid: bool = True) -> list[Scrape]:
    """One scrape answered by each worker in turn (with ``check_pid``, the slow app's
    ``/debug/builds`` confirms the answer came from it)."""
    scrapes = []
    for pid in server.worker_pids():
        with only(server, pid):
            if check_pid:
                assert server.get_json("/debug/builds")["pid"] == pid
            scrapes.append(scrape(server))
    return scrapes


def health(server: GunicornServer) -> dict[str, Any]:
    figures: dict[str, Any] = server.get_json("/health")["reach"]
    return figures


# -- the servers ------------------------------------------------------------------------------


def plant_stale_files(directory: Path) -> None:
    """What a crashed earlier run leaves behind: a worker's gauges (5 builds running) and
    counters (7 grants). Counted, they would show in every figure below."""
    gauges = MmapedDict(str(directory / f"gauge_livesum_{STALE_PID}.db"))
    name = "reachlimit_builds_active"
    gauges.write_value(mmap_key(name, name, (), (), _HELP["builds_active"]), 5.0, 0.0)
    gauges.close()
    counters = MmapedDict(str(directory / f"counter_{STALE_PID}.db"))
    key = mmap_key("reachlimit_admissions", "reachlimit_admissions_total", ("result",),
                   ("granted",), _HELP["admissions"])
    counters.write_value(key, 7.0, 0.0)
    counters.close()


def slow_server(tmp: Path, workers: int, name: str) -> GunicornServer:
    metrics_dir = tmp / "metrics"
    metrics_dir.mkdir()
    plant_stale_files(metrics_dir)
    return GunicornServer(
        APP,
        tmp,
        name,
        config=WEBAPP_CONFIG,  # its metrics directory, child_exit, preload_app
        env={
            "REACHLIMIT_METRICS": "true",
            "REACHLIMIT_WAIT": "30",
            "SLOW_GATE": "closed",
            "SLOW_GATE_TIMEOUT": "45",
            "SLOW_APP_TOKEN": uuid.uuid4().hex,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        },
        workers=workers,
        threads=THREADS,
        ready_path="/health",
    )


def key_paths(prefix: str, n: int) -> list[str]:
    return [f"/report/{prefix}-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]


def check_idle(s: Scrape, granted: int, refused: int, misses: int) -> None:
    assert s.admissions("granted") == granted
    assert s("reachlimit_build_seconds_count") == granted
    assert s.admissions("queue_full") + s.admissions("timeout") == refused
    assert s.admissions("cancelled") == 0
    assert s.cache("miss") == misses
    assert s.gauges() == (0, 0, 2, 8)


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 3])
def test_a_burst_is_counted_once_whichever_worker_answers(
    tmp_path_factory: pytest.TempPathFactory, workers: int
) -> None:
    """Each worker in turn gets 10 distinct cold keys (2 build, 8 wait) and 3 + i more
    (refused); every scrape, from every worker, shows the sums - while held and after."""
    server = slow_server(tmp_path_factory.mktemp(f"metrics-{workers}"), workers, "metrics")
    herds: list[Herd] = []
    with serving(server):
        pids = server.worker_pids()
        assert len(pids) == workers
        for s in scrape_each_worker(server):  # nothing of the planted files is counted
            check_idle(s, granted=0, refused=0, misses=0)

        refusals: list[Reply] = []
        try:
            for i, pid in enumerate(pids):
                with only(server, pid):
                    herds.append(Herd(server.port, key_paths(f"w{i}", 10)))
                    wait_until("2 building and 8 waiting",
                               lambda: (lambda h: (h["active"], h["queued"]) == (2, 8))(
                                   health(server)))
                    assert server.get_json("/debug/builds")["pid"] == pid
                    refusals += [server.get(p) for p in key_paths(f"full{i}", 3 + i)]
                    held = scrape(server)
                    # This worker's figures and those of the workers held before it.
                    assert held.gauges() == (2 * (i + 1), 8 * (i + 1), 2, 8)
            for reply in refusals:
                check_refusal(reply)
            refused = len(refusals)
            for s in scrape_each_worker(server):
                assert s.gauges() == (2 * workers, 8 * workers, 2, 8)
                assert s.admissions("queue_full") == refused
                assert s.admissions("granted") == 2 * workers
        finally:
            for pid in server.worker_pids():
                with only(server, pid):
                    server.request("POST", "/debug/release")
        replies = [r for herd in herds for r in herd.results()]
        assert Counter(r.status for r in replies) == {200: 10 * workers}

        for pid in pids:
            with only(server, pid):
                wait_until("the worker to be idle",
                           lambda: (lambda h: h["active"] == h["queued"] == 0)(health(server)))
        for s in scrape_each_worker(server):
            check_idle(s, granted=10 * workers, refused=refused, misses=10 * workers + refused)
            assert s("reachlimit_wait_seconds_count") == 10 * workers  # grants only
            assert s.cache("hit") == 0


def test_a_worker_killed_mid_run_leaves_no_stale_gauge(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("metrics-kill")
    server = slow_server(tmp, 2, "metrics-kill")
    with serving(server):
        victim, survivor = server.worker_pids()
        with only(server, victim):
            herd = Herd(server.port, key_paths("doomed", 10))
            wait_until("2 building and 8 waiting",
                       lambda: (lambda h: (h["active"], h["queued"]) == (2, 8))(health(server)))
            assert scrape(server).gauges() == (2, 8, 2, 8)
        assert (tmp / "metrics" / f"gauge_livesum_{victim}.db").exists()

        os.kill(victim, signal.SIGKILL)
        wait_until("the worker to die", lambda: not pid_alive(victim))
        replacement = wait_until(
            "the master to fork a replacement",
            lambda: (set(server.worker_pids()) - {victim, survivor}) or None,
        )
        herd.join()  # its clients lost their connections with the worker
        assert all(not isinstance(r, Reply) for r in herd.replies), herd.replies

        # child_exit ran before the replacement was forked, so at once:
        for s in scrape_each_worker(server):
            assert s.gauges() == (0, 0, 2, 8)  # no stale 2 and 8 of the dead worker
            assert s.admissions("granted") == 2  # its counters are kept: it did grant twice
            assert s("reachlimit_build_seconds_count") == 0  # neither build finished
        assert not list((tmp / "metrics").glob(f"gauge_live*_{victim}.db"))
        assert sorted(server.worker_pids()) == sorted({survivor, *replacement})
        for pid in server.worker_pids():
            with only(server, pid):
                server.request("POST", "/debug/release")


# -- the reach service ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from webapp.demodb import write_demo_db

    path = tmp_path_factory.mktemp("metrics-db") / "demo.sqlite"
    write_demo_db(path, nodes=200, observations=20_000, seed=5)
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_the_reach_service_counts_a_burst_across_its_workers(
    tmp_path_factory: pytest.TempPathFactory, demo_db: Path, workers: int
) -> None:
    """Real database scans, so how many are refused depends on the machine; what is checked
    holds for every interleaving: each 429 is one refusal, each 200 one grant and one build."""
    tmp = tmp_path_factory.mktemp(f"metrics-webapp-{workers}")
    server = reach_service(tmp, demo_db, "webapp", workers=workers,
                           env={"PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics")})
    with serving(server):
        nodes = server.get_json("/api/nodes?limit=40")["nodes"]
        paths = [f"/api/nodes/{n['pubkey']}/reach?days=30" for n in nodes]
        herd = Herd(server.port, paths)
        replies = herd.results()
        statuses = Counter(r.status for r in replies)
        assert set(statuses) <= {200, 429}, statuses
        for reply in replies:
            if reply.status == 429:
                check_refusal(reply)

        def idle(s: Scrape) -> bool:
            return s.gauges()[:2] == (0, 0)

        wait_until("the service to be idle", lambda: idle(scrape(server)))
        print(f"\n[metrics webapp x{workers}] {dict(statuses)}")
        for s in scrape_each_worker(server, check_pid=False):
            check_idle(s, granted=statuses[200], refused=statuses[429], misses=len(paths))


# -- the metrics directory's life ------------------------------------------------------------


def mapped_metrics_files(pid: int) -> set[Path]:
    """The metrics files process ``pid`` has mapped (prometheus_client mmaps them)."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[5:]
        if path and path[0].endswith(".db"):
            found.add(Path(path[0]))
    return found


def test_without_a_directory_the_config_file_makes_a_fresh_one_and_removes_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("metrics-tempdir")
    server = GunicornServer(
        APP, tmp, "metrics-tempdir", config=WEBAPP_CONFIG,
        env={"REACHLIMIT_METRICS": "true", "SLOW_APP_TOKEN": uuid.uuid4().hex},
        workers=1, threads=THREADS, ready_path="/health",
    )
    with serving(server):
        assert server.get("/report/one").status == 200
        s = scrape(server)
        assert s.admissions("granted") == 1 and s.gauges() == (0, 0, 2, 8)
        [worker] = server.worker_pids()
        directories = {f.parent for f in mapped_metrics_files(worker)}
        assert len(directories) == 1, directories
        [directory] = directories
        assert directory.name.startswith(TEMPORARY_PREFIX)
        assert {f.name for f in directory.iterdir()} >= {f"counter_{worker}.db"}
    assert not directory.exists()  # on_exit removed it


def test_a_reload_keeps_the_counts_and_drops_the_old_workers_gauges(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SIGHUP: gunicorn reads its config file again and replaces every worker. The files must
    not be wiped (the counts stay), and the old workers' gauges must leave the sums."""
    server = slow_server(tmp_path_factory.mktemp("metrics-hup"), 2, "metrics-hup")
    with serving(server):
        old = set(server.worker_pids())
        for pid in sorted(old):
            with only(server, pid):
                server.request("POST", "/debug/release")
                assert server.get(key_paths("before", 1)[0]).status == 200
        assert all(s.admissions("granted") == 2 for s in scrape_each_worker(server))
        os.kill(server.pid, signal.SIGHUP)
        wait_until("every worker replaced",
                   lambda: len(new := set(server.worker_pids())) == 2 and not new & old)
        wait_until("the old workers gone", lambda: not any(pid_alive(p) for p in old))
        for s in scrape_each_worker(server):
            assert s.admissions("granted") == 2  # counted before the reload, still there
            assert s.gauges() == (0, 0, 2, 8)
