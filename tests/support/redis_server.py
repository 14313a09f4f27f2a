"""A real ``redis-server`` for the tests of ``reachlimit.redis``.

design: :class:`RedisServer` runs Debian's ``redis-server`` (``$REACHTEST_REDIS_SERVER`` to
use another binary) as a subprocess of the test process, on 127.0.0.1 only, on a port that
was free a moment ago, with no persistence (``--save ''``, ``--appendonly no``) and its working
directory in a temporary directory. ``start`` waits, with one bounded deadline, until the
process answers ``PING``; if the port was taken meanwhile it stops the process and tries
another port. ``stop`` is by PID: SIGTERM, SIGKILL after a bounded wait. ``restart`` stops it
and starts a new, empty one on the same port: what a Redis restarted without persistence is.

Without ``redis-server`` the tests that need it are skipped, except under CI (``$CI`` set),
where a missing server is a failure (``require_redis_server``; ``require_binary`` for any
other binary a test needs). The fixture ``redis_server``
(module-scoped) is registered for the whole suite by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import HOST
from tests.support.processes import free_port
from tests.support.waiting import wait_until

REDIS_SERVER = os.environ.get("REACHTEST_REDIS_SERVER", "redis-server")
#: How long a starting or stopping server may take before the test fails.
DEADLINE = 10.0


def require_binary(binary: str, package: str) -> str:
    """The path of ``binary``; skip the test (fail under CI) when it is not installed
    (``package`` is the Debian package that has it)."""
    path = shutil.which(binary)
    if path is None:
        message = f"{binary} is not installed (Debian: apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_redis_server() -> str:
    """The path of ``redis-server``; skip the test (fail under CI) when there is none."""
    return require_binary(REDIS_SERVER, "redis-server")


def _pings(port: int) -> bool:
    """True if something on ``port`` answers a RESP ``PING`` with ``+PONG``."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process; see the module's design note."""

    def __init__(self, directory: Path) -> None:
        self.binary = require_redis_server()
        self.directory = directory
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def start(self, port: int | None = None, attempts: int = 3) -> None:
        """Start on ``port`` (a free one if None) and wait until it answers PING."""
        for _ in range(attempts):
            self.port = port or free_port()
            self._spawn()
            if self._wait_ready():
                return
            self.stop()
        raise AssertionError(f"redis-server did not start; see {self.directory}")

    def _spawn(self) -> None:
        self._starts += 1
        log = self.directory / f"redis-{self._starts}.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(self.port),
                    "--bind", HOST,
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.directory),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _wait_ready(self) -> bool:
        process = self.process
        assert process is not None

        def ready() -> bool | None:
            if process.poll() is not None:
                return True  # exited (the port was taken, say): stop waiting
            return _pings(self.port)

        wait_until("redis-server answering PING", ready, timeout=DEADLINE)
        return process.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after a bounded wait; a process still there fails."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(DEADLINE)

    def restart_empty(self) -> None:
        """Stop the server and start a new, empty one on the same port."""
        port = self.port
        self.stop()
        self.start(port=port, attempts=1)

    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"


@pytest.fixture(name="redis_server", scope="module")
def redis_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A :class:`RedisServer` for the test module, stopped (by PID) after its last test.
    Registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``)."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
