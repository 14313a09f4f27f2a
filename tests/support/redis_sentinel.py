"""Redis processes beyond the one test server: a primary, its replica and three sentinels
watching them, each in a temporary directory of its own, for the Sentinel tests.

design:

    :class:`Node` is one ``redis-server`` (or ``redis-sentinel``) subprocess of the test
    process on 127.0.0.1, on a port that was free a moment ago, with its log in its own
    directory: a ``RedisServer`` (``tests/support/redis_server.py``: started with retries
    on another port, stopped by PID) whose command line and readiness check are given
    (``ready(port)``: a PING, or a TLS server's own check). ``kill`` is SIGKILL by PID, the
    fault a test makes.

    :class:`Gate` is the directory the builds of ``tests.apps.build_log_app`` share (their
    log, and the file that lets held builds go on); the ``gate`` fixture opens it on the
    way out.

    :class:`SentinelSet` is the deployment of a service behind Sentinel, kept small:

        primary    redis-server, no persistence
        replica    redis-server --replicaof 127.0.0.1 <primary>, ready once in sync
        sentinels  three, each ``redis-sentinel <its own sentinel.conf>`` (a sentinel
                   rewrites its file) monitoring the primary as SERVICE with quorum 2,
                   down-after 1000 ms and failover-timeout 5000 ms, hostnames not resolved

    ``start`` returns once every sentinel sees the primary with its replica and the two other
    sentinels: a failover can then be agreed on (two of three). ``replica_is_primary`` and
    ``named_primary`` say what the replica and the sentinels think; ``cut_replication``
    stops replication with both servers up (what a lagging replica misses, made certain).
    Everything is stopped by PID (``stop``), whatever state the test left it in.

A binary that is missing skips the test, except under CI (``$CI`` set), where it fails
(``require_binary``): CI installs them (``.ci/run``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import redis

from tests.support import HOST
from tests.support.gunicorn_server import WEBAPP_CONFIG, GunicornServer
from tests.support.processes import free_port
from tests.support.redis_server import RedisServer, require_binary
from tests.support.waiting import wait_until

#: The service name the sentinels monitor the primary under.
SERVICE = "svc"
#: The sentinels' failure detection and failover bounds, in milliseconds.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
#: How long a node may take to start or stop, and the sentinels to agree on a state.
DEADLINE = 15.0


def pings(port: int, **options: object) -> bool:
    """True when a Redis (or a sentinel) on ``port`` answers PING; ``options`` go to the
    client (TLS files, a password)."""
    client = redis.Redis(HOST, port, socket_timeout=0.5, socket_connect_timeout=0.5,
                         **options)  # type: ignore[arg-type]
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class Node(RedisServer):
    """One Redis or sentinel process: ``command(port)`` is its argument list, ``ready(port)``
    says it answers. Started, restarted and stopped as a :class:`RedisServer` (by PID)."""

    def __init__(
        self,
        directory: Path,
        command: Callable[[int], list[str]],
        ready: Callable[[int], bool] = pings,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(directory)
        self._command = command
        self._ready = ready

    def _spawn(self) -> None:
        with (self.directory / "node.log").open("ab") as log:
            self.process = subprocess.Popen(
                self._command(self.port), cwd=self.directory, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )

    def _wait_ready(self) -> bool:
        """True once it answers; False if it exited first (its port was taken, say)."""
        process = self.process
        assert process is not None
        wait_until(f"{self.directory.name} answering on {self.port}",
                   lambda: process.poll() is not None or self._ready(self.port),
                   timeout=DEADLINE, interval=0.01)
        return process.poll() is None

    def kill(self) -> None:
        """SIGKILL by PID, and wait for it to be gone."""
        process = self.process
        assert process is not None and process.poll() is None, "not running"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(DEADLINE)

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(HOST, self.port, socket_timeout=2, **options)  # type: ignore[arg-type]

    def log(self) -> str:
        path = self.directory / "node.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Gate:
    """The directory every build of ``tests.apps.build_log_app`` shares: its log, and the
    file whose existence lets the held builds (``hold-`` keys) go on."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory

    def open(self) -> None:
        (self.dir / "open").touch()


@pytest.fixture(name="gate")
def gate_fixture(tmp_path: Path) -> Iterator[Gate]:
    """A :class:`Gate` in the test's directory, opened on the way out whatever happened, so
    that no held build is left waiting for the server's stop."""
    gate = Gate(tmp_path / "gate")
    try:
        yield gate
    finally:
        gate.open()


def server_command(binary: str, directory: Path, *extra: str) -> Callable[[int], list[str]]:
    def command(port: int) -> list[str]:
        return [binary, "--port", str(port), "--bind", HOST, "--save", "",
                "--appendonly", "no", "--dir", str(directory), *extra]

    return command


class SentinelSet:
    """A primary, its replica and three sentinels (see the module's design note)."""

    def __init__(self, directory: Path) -> None:
        self.server = require_binary("redis-server", "redis-server")
        self.sentinel = require_binary("redis-sentinel", "redis-sentinel")
        self.directory = directory
        # No wait for more replicas before a full sync (redis-server waits 5 s by default).
        self.primary = Node(directory / "primary", server_command(
            self.server, directory / "primary", "--repl-diskless-sync-delay", "0"))
        self.replica: Node | None = None
        self.sentinels: list[Node] = []

    def _sentinel_command(
        self, directory: Path, me: int, ports: list[int], ids: list[str]
    ) -> Callable[[int], list[str]]:
        """Sentinel ``me`` of three on ``ports`` with run ids ``ids``: told of the replica
        and of the two others from the start, so none waits for the periodic discovery
        (INFO every 10 s, hellos every 2 s) before a failover can be agreed on."""
        assert self.replica is not None
        replica = self.replica.port

        def command(port: int) -> list[str]:
            others = "".join(
                f"sentinel known-sentinel {SERVICE} {HOST} {ports[n]} {ids[n]}\n"
                for n in range(len(ports)) if n != me
            )
            conf = directory / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind {HOST}\nprotected-mode no\ndaemonize no\n"
                f"dir {directory}\nsentinel resolve-hostnames no\nsentinel myid {ids[me]}\n"
                f"sentinel monitor {SERVICE} {HOST} {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
                f"sentinel known-replica {SERVICE} {HOST} {replica}\n{others}"
            )
            return [self.sentinel, str(conf)]

        return command

    def start(self) -> None:
        self.primary.start()
        where = self.directory / "replica"
        self.replica = Node(where, server_command(
            self.server, where, "--replicaof", HOST, str(self.primary.port)))
        self.replica.start()
        replica = self.replica.client()
        try:
            wait_until("the replica in sync", lambda: replica.info("replication").get(
                "master_link_status") == "up", timeout=DEADLINE, interval=0.02)
        finally:
            replica.close()
        ports: list[int] = []
        while len(ports) < 3:  # each sentinel's config names the others' ports up front
            port = free_port()
            if port not in ports:
                ports.append(port)
        ids = [secrets.token_hex(20) for _ in ports]
        for n, port in enumerate(ports):
            directory = self.directory / f"sentinel-{n}"
            node = Node(directory, self._sentinel_command(directory, n, ports, ids))
            self.sentinels.append(node)
            node.start(port=port, attempts=1)
        wait_until("every sentinel seeing the replica and the two others",
                   lambda: all(self._agreed(s) for s in self.sentinels),
                   timeout=DEADLINE, interval=0.05)

    def _agreed(self, sentinel: Node) -> bool:
        client = sentinel.client(decode_responses=True)
        try:
            state = client.sentinel_master(SERVICE)
        except redis.RedisError:
            return False
        finally:
            client.close()
        return bool(
            state.get("port") == self.primary.port
            and state.get("num-slaves") == 1
            and state.get("num-other-sentinels") == 2
        )

    def url(self, auth: str = "") -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/0"

    def named_primary(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for sentinel in self.sentinels:
            client = sentinel.client(decode_responses=True)
            try:
                return int(client.sentinel_get_master_addr_by_name(SERVICE)[1])
            except (redis.RedisError, TypeError, IndexError):
                continue
            finally:
                client.close()
        return None

    def replica_is_primary(self) -> bool:
        """The replica says it is a primary (read with ROLE, which a replica answers)."""
        assert self.replica is not None
        client = self.replica.client()
        try:
            return bool(client.execute_command("ROLE")[0] == b"master")
        except redis.RedisError:
            return False
        finally:
            client.close()

    def cut_replication(self) -> None:
        """Cut the replica off its primary, both still running and still seen by the
        sentinels: the replica is given a primary password the primary does not have
        (``masterauth``) and its link is dropped, so each reconnection fails at AUTH and
        what is written to the primary from now on never reaches the replica."""
        assert self.replica is not None
        replica = self.replica.client()
        try:
            replica.config_set("masterauth", "not-the-primarys")
            replica.client_kill_filter(_type="master")
            wait_until("the replica's link down", lambda: replica.info("replication").get(
                "master_link_status") == "down", timeout=DEADLINE, interval=0.01)
        finally:
            replica.close()

    def stop(self) -> None:
        for node in [*self.sentinels, self.replica, self.primary]:
            if node is not None:
                node.stop()


class Runs(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


R = TypeVar("R", bound=Runs)


@contextlib.contextmanager
def running(thing: R) -> Iterator[R]:
    """``thing`` started, and stopped on the way out whatever happened (a start that
    failed half-way included)."""
    try:
        thing.start()
        yield thing
    finally:
        thing.stop()


@pytest.fixture(name="sentinels")
def sentinels_fixture(tmp_path: Path) -> Iterator[SentinelSet]:
    """A started :class:`SentinelSet`, every process stopped by PID at teardown."""
    with running(SentinelSet(tmp_path / "sentinel")) as deployment:
        yield deployment


def build_log_server(
    log_dir: Path, name: str, gate: Gate, url: str, env: dict[str, str] | None = None,
    workers: int = 2,
) -> GunicornServer:
    """``tests.apps.build_log_app`` under gunicorn as an operator starts a service on Redis
    (the shipped ``webapp/gunicorn.conf.py``: workers from REACH_WORKERS, child_exit),
    with ``url`` as its REACHLIMIT_REDIS_URL and builds logged in ``gate``."""
    return GunicornServer(
        "tests.apps.build_log_app:create_app()", log_dir, name,
        env={"GATE_DIR": str(gate.dir), "REACHLIMIT_REDIS_URL": url, **(env or {})},
        workers=workers, workers_env="REACH_WORKERS", bind_env="REACH_BIND",
        threads=None, worker_class=None, access_log=False, graceful_timeout=None,
        config=WEBAPP_CONFIG, ready_path="/health", token_env="SLOW_APP_TOKEN",
        identity_path="/debug/health", die_with_parent=True,
    )


def worker_figures(server: GunicornServer, workers: int = 2) -> dict[int, dict[str, Any]]:
    """The budget's figures as each worker of ``server`` answers them (``/debug/health``,
    the latest of each), once every worker has answered: each has then made its first call
    of the budget."""
    seen: dict[int, dict[str, Any]] = {}

    def all_answered() -> bool:
        reply = server.get("/debug/health")
        assert reply.status == 200, reply
        body = reply.json()
        seen[body["pid"]] = body["reach"]
        return len(seen) >= workers

    wait_until(f"every worker's figures of {server.name}", all_answered, interval=0.005)
    return seen
