"""One service out of several REAL gunicorn servers and workers on one Redis: one cold-build
budget, one singleflight, one warm cache, one set of figures (health and metrics).

design:

    Each server is ``gunicorn -c webapp/gunicorn.conf.py 'tests.apps.file_gate_app:create_app()'``
    - the shipped config file (workers from REACH_WORKERS, child_exit, preload) serving a test
    app whose builds wait for a gate FILE shared by every process, and record in that directory
    how many builds were running when each one started (``tests/apps/file_gate_app.py``). The
    test watches the shared limiter through a RedisColdLimiter of its own on the same name and
    prefix (``watch``), and opens the gate by creating the file.

    Nothing here depends on timing: the burst's outcome is fixed by the budget (2 building, 8
    waiting in Redis with a 30 s wait, every other leader refused at once; on a loaded machine
    a waiter whose worker missed its presence period is dropped and refused, and a later
    leader may take its place: the figures are awaited until every request is accounted for,
    ``burst_refused``), the builds are released only by the test, and every wait is for a
    state (the shared figures included). The durations the brief asks for
    (slot back after a SIGKILL, with child_exit and with the lease only; fallback after Redis
    dies; back after it returns) are printed, and only bounded far above what they measure
    where the bound is the contract (a slot back via child_exit long before its lease).
"""

from __future__ import annotations

import os
import runpy
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from reachlimit.gunicorn import BOOT_ID_VARIABLE, MASTER_VARIABLE, TEMPORARY_VARIABLE
from reachlimit.redis import RedisColdLimiter, RedisLimiterStats, owner_prefix
from tests.apps.file_gate_app import build_pids, running_counts
from tests.support.clients import Herd, Reply, check_refusal, http_request
from tests.support.gunicorn_server import WEBAPP_CONFIG, GunicornServer, reach_service, serving
from tests.support.limiter import LIMITER_FIELDS
from tests.support.redis_limiters import burst_accounted, refusals
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.gunicorn, pytest.mark.timeout(180)]

APP = "tests.apps.file_gate_app:create_app()"
PREFIX = "gtest"


@pytest.fixture
def redis_url(live_redis: RedisServer) -> str:
    return live_redis.url()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "gate"
    directory.mkdir()
    yield directory
    (directory / "open").touch()  # never leave a build waiting on the way out


def gate_server(
    tmp_path: Path,
    name: str,
    gate: Path,
    redis_url: str | None,
    *,
    workers: int = 2,
    env: dict[str, str] | None = None,
    config: Path = WEBAPP_CONFIG,
    workers_env: str = "REACH_WORKERS",
) -> GunicornServer:
    environment = {
        "GATE_DIR": str(gate),
        "REACHLIMIT_REDIS_PREFIX": PREFIX,
        "REACHLIMIT_WAIT": "30",
        **(env or {}),
    }
    if redis_url is not None:
        environment["REACHLIMIT_REDIS_URL"] = redis_url
    return GunicornServer(
        APP,
        tmp_path,
        name,
        env=environment,
        workers=workers,
        workers_env=workers_env,
        bind_env="REACH_BIND",
        threads=None,
        worker_class=None,
        access_log=False,
        graceful_timeout=None,
        config=config,
        ready_path="/health",
        token_env="SLOW_APP_TOKEN",
        identity_path="/debug/health",
        die_with_parent=True,
    )


class Watch:
    """The test's own view of the shared limiter (same Redis, name, prefix and figures). Its
    settings must be the servers' (the defaults are those of ``gate_server``: the extension's
    defaults but REACHLIMIT_WAIT=30): one budget, one set of settings, or its first call
    raises ``ValueError``."""

    def __init__(
        self, url: str, active: int = 2, queue: int = 8, wait: float = 30.0, lease: float = 10.0
    ) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=2)
        self.limiter = RedisColdLimiter(
            self.client, "cold", active, queue, wait, lease=lease, prefix=PREFIX
        )

    def stats(self) -> Any:
        return self.limiter.stats()

    def holders(self) -> list[str]:
        return [t.decode() for t in self.client.zrange(self.limiter.keys[0], 0, -1)]

    def held_by(self, pid: int) -> list[str]:
        """The holders' tokens made by process ``pid`` of this host. A token starts with
        ``owner_prefix(pid)``, ``<hostname>:<boot id>:<pid>:``, where the boot id is the
        gunicorn master's (its config file draws it), not this process's: so the hostname
        and the PID are compared, around whatever boot id the server drew."""
        host = owner_prefix(pid).split(":", 1)[0]
        return [
            t for t in self.holders()
            if t.startswith(host + ":") and t.rsplit(":", 2)[1] == str(pid)
        ]

    def close(self) -> None:
        self.limiter.close()
        self.client.close()


@pytest.fixture
def watch(redis_url: str) -> Iterator[Watch]:
    w = Watch(redis_url)
    yield w
    w.close()


def answered(herds: list[Herd]) -> list[Reply]:
    out = []
    for herd in herds:
        out += [r for r in herd.replies if isinstance(r, Reply)]
    return out


def warm_in_every_worker(
    servers: list[GunicornServer], path: str, body: bytes, workers: set[int]
) -> Counter[str]:
    """Ask ``path`` of ``servers`` in turn until every one of ``workers`` has answered it with
    ``body`` (a bounded number of tries); the answers by worker PID."""
    answered_by: Counter[str] = Counter()
    for _ in range(400):
        for server in servers:
            reply = server.get(path)
            assert reply.status == 200 and reply.body == body
            answered_by[reply.headers["x-worker-pid"]] += 1
        if len(answered_by) == len(workers):
            break
    print(f"\nwarm answers by worker: {dict(answered_by)}")
    assert {int(pid) for pid in answered_by} == workers
    return answered_by


def burst_refused(herds: list[Herd], watch: Watch, gate: Path) -> RedisLimiterStats:
    """A burst of 40 distinct cold keys held against the shared budget (2 + 8): 2 building,
    every queue place taken, the rest refused at once with the refusal every layer promises
    (30 finding the queue full), and 2 builds running. Returns the shared figures, every
    request of the burst accounted for in them.

    On a loaded machine a waiter whose worker did not poll within its presence period is
    dropped from the queue, refused "waited too long", and a later request of the burst may
    take its place (``burst_accounted``): so every place the queue lacks is such a waiter's,
    and each place a later request took is one refusal fewer for a full queue."""
    stats = burst_accounted(watch.limiter, 40)
    assert (stats.active, stats.peak_active, stats.peak_queued) == (2, 2, 8), stats
    assert stats.queued + stats.rejected_timeout >= 8 and stats.rejected_full <= 30, stats
    counted = refusals(stats)
    wait_until("every refusal counted answered", lambda: len(answered(herds)) >= counted)
    for reply in answered(herds):
        check_refusal(reply)
    wait_until("2 builds running", lambda: len(build_pids(gate)) == 2)
    return stats


def check_burst_answers(replies: list[Reply], watch: Watch) -> None:
    """Once the held burst is over: 200 for each request the shared budget admitted (10: 2
    building and 8 waiting, unless a loaded machine dropped a waiter that nobody replaced)
    and the refusal for every other one, each counted in Redis."""
    statuses = Counter(r.status for r in replies)
    stats = watch.stats()
    assert set(statuses) <= {200, 429} and sum(statuses.values()) == 40, statuses
    assert statuses[200] == stats.acquired <= 10, (statuses, stats)
    assert statuses[429] == refusals(stats), (statuses, stats)
    assert statuses[200] == 10 or stats.rejected_timeout > 0, (statuses, stats)


def scrape(server: GunicornServer) -> dict[str, float]:
    """One scrape of ``server``'s /metrics: every sample by name (labels in braces)."""
    from prometheus_client.parser import text_string_to_metric_families

    reply = server.get("/metrics")
    assert reply.status == 200, reply
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())
                              if (k, v) != ("budget", "default"))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def debug_health(server: GunicornServer) -> dict[str, Any]:
    reply = server.get("/debug/health")
    assert reply.status == 200, reply
    body: dict[str, Any] = reply.json()
    return body


# -- one budget for 2 servers x 2 workers ------------------------------------------------------


def test_a_burst_over_two_servers_admits_exactly_the_shared_budget(
    tmp_path: Path, gate: Path, redis_url: str, watch: Watch
) -> None:
    metrics_on = {"REACHLIMIT_METRICS": "true"}
    a = gate_server(tmp_path, "a", gate, redis_url, env=metrics_on)
    b = gate_server(tmp_path, "b", gate, redis_url, env=metrics_on)
    with serving(a), serving(b):
        paths = [f"/report/burst-{n}" for n in range(40)]
        herds = [Herd(a.port, paths[0::2]), Herd(b.port, paths[1::2])]
        stats = burst_refused(herds, watch, gate)

        # Every worker of both servers reports the same global figures.
        seen: dict[int, dict[str, Any]] = {}
        for _ in range(200):
            for server in (a, b):
                body = debug_health(server)
                seen[body["pid"]] = body["reach"]
            if len(seen) == 4:
                break
        print(f"\nworkers that answered /debug/health: {len(seen)} of 4")
        assert len(seen) >= 2
        figures = {
            pid: {k: v for k, v in reach.items() if k in LIMITER_FIELDS | {"backend", "degraded"}}
            for pid, reach in seen.items()
        }
        first = next(iter(figures.values()))
        assert all(f == first for f in figures.values()), figures
        assert (first["backend"], first["degraded"], first["active"]) == ("redis", False, 2)
        assert 0 < first["queued"] <= 8  # 8, less any waiter dropped since (burst_refused)

        # A scrape of either server shows the service's gauges (read from Redis), while the
        # admissions are counted by the workers that made them: the queue-full refusals over
        # both (30, unless a dropped waiter's place went to a later request: burst_refused).
        queue_full = 0.0
        for server in (a, b):
            samples = scrape(server)
            assert samples["reachlimit_builds_active"] == 2  # not 2 per worker
            assert 0 < samples["reachlimit_queue_waiting"] <= 8  # not 8 per worker
            assert (samples["reachlimit_capacity_active"],
                    samples["reachlimit_capacity_queue"]) == (2, 8)
            assert samples["reachlimit_backend_degraded"] == 0
            queue_full += samples.get('reachlimit_admissions_total{result="queue_full"}', 0)
        assert queue_full == stats.rejected_full  # each counted before it was answered

        (gate / "open").touch()
        replies = [r for h in herds for r in h.results()]
        check_burst_answers(replies, watch)
        counts = running_counts(gate)
        pids = {r.json()["pid"] for r in replies if r.status == 200}
        admitted = sum(r.status == 200 for r in replies)
        assert len(counts) == admitted and max(counts) == 2, counts  # never 3 builds at once
        assert watch.stats().active == 0
        print(f"the {admitted} builds ran in {len(pids)} worker process(es)")


# -- one singleflight and one warm cache for 2 servers x 2 workers ------------------------------


def test_a_same_key_herd_over_two_servers_builds_once_and_is_warm_in_every_worker(
    tmp_path: Path, gate: Path, redis_url: str, watch: Watch
) -> None:
    a = gate_server(tmp_path, "a", gate, redis_url)
    b = gate_server(tmp_path, "b", gate, redis_url)
    with serving(a), serving(b):
        workers = set(a.worker_pids()) | set(b.worker_pids())
        assert len(workers) == 4
        herds = [Herd(a.port, ["/report/herd"] * 10), Herd(b.port, ["/report/herd"] * 10)]
        wait_until("the one build running", lambda: len(build_pids(gate)) == 1)
        (gate / "open").touch()
        replies = [r for h in herds for r in h.results()]
        assert Counter(r.status for r in replies) == {200: 20}
        assert len({r.body for r in replies}) == 1  # one answer: the one build's
        assert len(running_counts(gate)) == 1  # built once in the whole service

        # Warm: every worker of both servers answers from the shared cache, without a build.
        answered_by = warm_in_every_worker([a, b], "/report/herd", replies[0].body, workers)
        assert len(running_counts(gate)) == 1
        assert watch.stats().acquired == 1  # one admission in all: the one build's
        warm = sum(answered_by.values())

        # The health figures add up every worker's counters (each flushed within about 1 s).
        def service_figures() -> dict[str, Any]:
            return {s.port: debug_health(s)["reach"] for s in (a, b)}

        def flushed() -> bool:
            figures = service_figures()
            return all(
                f["builds"] == 1 and f["hits"] + f["misses"] == 20 + warm
                for f in figures.values()
            )

        wait_until("every worker's counters in Redis", flushed)
        figures = list(service_figures().values())
        assert figures[0]["hits"] == figures[1]["hits"] >= warm


# -- a worker killed while it holds a slot ------------------------------------------------------


NO_RELEASE_CONFIG = """\
# The shipped config without its child_exit: a dead worker's slots wait for their lease.
exec(compile(open({path!r}).read(), {path!r}, "exec"))


def child_exit(server, worker):
    pass
"""


@pytest.mark.parametrize("way", ["child_exit", "lease"])
def test_a_sigkilled_workers_slot_comes_back(
    tmp_path: Path, gate: Path, redis_url: str, way: str
) -> None:
    lease = 30.0 if way == "child_exit" else 3.0
    config = WEBAPP_CONFIG
    if way == "lease":
        config = tmp_path / "no_release.conf.py"
        config.write_text(NO_RELEASE_CONFIG.format(path=str(WEBAPP_CONFIG)))
    watch = Watch(redis_url, active=1, queue=1, lease=lease)  # the server's settings
    server = gate_server(
        tmp_path, f"kill-{way}", gate, redis_url, config=config,
        env={"REACHLIMIT_ACTIVE": "1", "REACHLIMIT_QUEUE": "1", "REACHLIMIT_LEASE": str(lease)},
    )
    outcomes: dict[str, Any] = {}

    def ask(path: str) -> None:
        try:
            outcomes[path] = http_request(server.port, "GET", path, timeout=60)
        except OSError as exc:  # the worker that had the connection was killed
            outcomes[path] = exc

    threads = []
    try:
        with serving(server):
            threads.append(threading.Thread(target=ask, args=("/report/victim",), daemon=True))
            threads[-1].start()
            pids = wait_until("the victim's build running", lambda: build_pids(gate))
            victim = pids["victim"]
            assert watch.held_by(victim)
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)

            def slot_back() -> bool:
                watch.stats()  # a script: reaps holders whose lease ended
                return not watch.held_by(victim)

            wait_until("the dead worker's slot back", slot_back, timeout=lease + 20,
                       interval=0.005)
            back = time.monotonic() - killed_at
            print(f"\nslot back {back * 1000:.0f} ms after SIGKILL via {way} (lease {lease} s)")
            if way == "child_exit":
                assert back < lease / 2  # the contract: at once, not after the lease
            (gate / "running-victim").unlink(missing_ok=True)  # the dead build's marker
            (gate / "open").touch()
            reply = server.get("/report/after")  # the budget is whole again
            assert reply.status == 200, reply
            wait_until("the master replaced the worker", lambda: len(server.worker_pids()) == 2)
            if way == "child_exit":
                assert "freed 1 build slot(s)" in server.stderr()
    finally:
        (gate / "open").touch()
        for t in threads:
            t.join(70)
        watch.close()


# -- Redis killed under gunicorn -------------------------------------------------------------


def test_redis_dying_under_gunicorn_falls_back_and_comes_back(
    tmp_path: Path, gate: Path, redis_server: RedisServer, redis_url: str
) -> None:
    (gate / "open").touch()
    server = gate_server(tmp_path, "fallback", gate, redis_url)
    statuses: Counter[int] = Counter()
    with serving(server):
        for n in range(6):
            reply = server.get(f"/report/up-{n}")
            statuses[reply.status] += 1
        assert debug_health(server)["reach"]["backend"] == "redis"
        port = redis_server.port
        stopped = time.monotonic()
        redis_server.stop()
        n = 0

        def degraded_answer() -> bool:
            nonlocal n
            n += 1
            reply = server.get(f"/report/down-{n}")
            statuses[reply.status] += 1
            return reply.status == 200 and debug_health(server)["reach"]["degraded"]

        wait_until("an answer on the fallback", degraded_answer, timeout=20, interval=0.01)
        fell_back = time.monotonic() - stopped
        for _ in range(20):  # every request answered while Redis is down
            n += 1
            statuses[server.get(f"/report/down-{n}").status] += 1
        restarted_at = time.monotonic()
        redis_server.start(port=port, attempts=1)
        started = time.monotonic()
        streak = 0

        def back_on_redis() -> bool:
            nonlocal n, streak
            n += 1
            statuses[server.get(f"/report/again-{n}").status] += 1
            streak = streak + 1 if debug_health(server)["reach"]["backend"] == "redis" else 0
            return streak >= 10

        wait_until("every worker back on Redis", back_on_redis, timeout=30, interval=0.02)
        first_back = time.monotonic() - started
    print(f"\nfallback {fell_back * 1000:.0f} ms after Redis died; back on Redis "
          f"(10 answers in a row) {first_back * 1000:.0f} ms after it answered again "
          f"(restart took {(started - restarted_at) * 1000:.0f} ms); statuses {dict(statuses)}")
    assert set(statuses) == {200}, statuses  # never a 5xx, nothing refused on "local"
    assert "is unavailable" in server.stderr() and "answers again" in server.stderr()


# -- the shipped config's worker count -------------------------------------------------------


def _load_config(monkeypatch: pytest.MonkeyPatch, tmp: Path, **env: str) -> dict[str, Any]:
    """The shipped config file's settings, loaded in this process. Every variable it reads
    or sets is put under monkeypatch first, so that the test process gets its environment
    back (the metrics directory variables would otherwise leak into later tests)."""
    for name in ("REACH_WORKERS", "REACH_THREADS", "REACHLIMIT_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp / "metrics"))
    for name in (MASTER_VARIABLE, TEMPORARY_VARIABLE, BOOT_ID_VARIABLE):
        monkeypatch.setenv(name, "")  # so that each load prepares, and teardown undoes it
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(WEBAPP_CONFIG))


def test_the_config_runs_one_worker_without_redis_and_two_with_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    load = _load_config
    assert load(monkeypatch, tmp_path)["workers"] == 1
    assert load(monkeypatch, tmp_path, REACHLIMIT_REDIS_URL="redis://h:6379/0")["workers"] == 2
    assert load(monkeypatch, tmp_path, REACH_WORKERS="3")["workers"] == 3
    assert load(monkeypatch, tmp_path, REACH_WORKERS="3",
                REACHLIMIT_REDIS_URL="redis://h/0")["workers"] == 3


@pytest.mark.parametrize(("name", "value"), [("REACH_WORKERS", "two"), ("REACH_WORKERS", "0"),
                                             ("REACH_THREADS", "1.5"), ("REACH_THREADS", "")])
def test_a_bad_worker_or_thread_count_stops_start_up_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    with pytest.raises(SystemExit) as info:
        _load_config(monkeypatch, tmp_path, **{name: value})
    assert str(info.value) == (
        f"webapp/gunicorn.conf.py: {name} must be a whole number >= 1, got {value!r}"
    )


def test_real_gunicorn_without_redis_runs_one_worker_and_warns_when_asked_for_more(
    tmp_path: Path, gate: Path
) -> None:
    (gate / "open").touch()
    one = gate_server(tmp_path, "one", gate, None, workers=1, workers_env="REACH_NOT_READ")
    with serving(one):
        assert len(one.worker_pids()) == 1
        assert one.get("/report/k").status == 200
        assert debug_health(one)["reach"]["backend"] == "local"
    assert "limits multiply" not in one.stderr() and "own cold limiter" not in one.stderr()
    two = gate_server(tmp_path, "two", gate, None, workers=2)
    with serving(two):
        assert len(two.worker_pids()) == 2
    assert "2 workers without REACHLIMIT_REDIS_URL" in two.stderr()



class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    info = warning


class _Server:
    def __init__(self) -> None:
        self.log = _Log()


class _Worker:
    pid = 424242


def test_child_exit_logs_and_never_raises_when_redis_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.support.processes import free_port

    secret = "child-exit-secret"
    config = _load_config(
        monkeypatch, tmp_path,
        REACHLIMIT_REDIS_URL=f"redis://u:{secret}@127.0.0.1:{free_port()}/0",
    )
    server = _Server()
    config["child_exit"](server, _Worker())  # must not raise
    assert len(server.log.lines) == 1, server.log.lines
    line = server.log.lines[0]
    assert "could not free the shared places of worker 424242" in line
    assert "u:***@127.0.0.1" in line and secret not in line


def test_the_reach_service_takes_its_redis_settings_from_the_environment(
    tmp_path: Path, redis_url: str
) -> None:
    """The reach service as an operator starts it, with REACHLIMIT_REDIS_URL (a password in
    it) in the environment: two workers on the shared limiter, metrics on (the gauges read
    from Redis), and the password in no answer and no log line."""
    from webapp.demodb import write_demo_db

    db = tmp_path / "demo.sqlite"
    write_demo_db(db, nodes=60, observations=2_000, seed=3)
    secret = "svc-secret"
    # The service's settings are the extension's defaults (a 3 s wait, not gate_server's 30).
    watch = Watch(redis_url, wait=3.0)
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    client.config_set("requirepass", secret)
    try:
        url = redis_url.replace("redis://", f"redis://default:{secret}@")
        server = reach_service(
            tmp_path, db, "reach-redis", workers=2,
            env={"REACHLIMIT_REDIS_URL": url, "REACHLIMIT_REDIS_PREFIX": PREFIX},
        )
        with serving(server):
            assert len(server.worker_pids()) == 2
            health = server.get_json("/api/health")
            assert (health["reach"]["backend"], health["reach"]["degraded"]) == ("redis", False)
            assert health["redis"]["up"] is True
            assert health["redis"]["url"].startswith("redis://default:***@")
            metrics = server.get("/metrics")
            assert metrics.status == 200
            assert b'reachlimit_backend_degraded{budget="default"} 0.0' in metrics.body
            assert secret.encode() not in metrics.body
            nodes = server.get_json("/api/nodes?limit=1")["nodes"]
            reply = server.get(f"/api/nodes/{nodes[0]['pubkey']}/reach?days=7")
            assert reply.status in (200, 404), reply
        assert secret not in server.stderr() + server.stdout()
    finally:
        authed = redis.Redis.from_url(redis_url, password=secret, socket_timeout=2)
        authed.config_set("requirepass", "")
        authed.close()
        client.close()
    try:
        assert watch.stats().acquired >= 1  # the report went through the shared limiter
    finally:
        watch.close()
