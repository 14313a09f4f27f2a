"""Worker processes for the cross-process Redis tests, and the fixture that starts them.

design: a :class:`Worker` is one ``tests/support/redis_worker.py`` subprocess (a Python
process with its own ``RedisColdLimiter``), driven over its stdin and read line by line from
its stdout by a daemon thread of the test process. ``preload``/``env`` let a test run it under
an ``LD_PRELOAD`` library such as libfaketime: the preload is set in the environment of the
Python process itself (never through a wrapper program that forks), so the PID the test holds
is the PID of the process that runs the limiter, which the worker confirms in its ``ready``
line. The fixture ``start_workers`` stops every worker it started by PID (SIGKILL, which also
ends a SIGSTOPped process, then a bounded wait) at the end of the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.processes import die_with_parent
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

WORKER = Path(__file__).resolve().parent / "redis_worker.py"
#: How long a process may take to start, or a state to be reached, before the test fails.
#: Generous: only a failing (or hopelessly overloaded) run gets near it.
DEADLINE = 30.0
#: What a worker reports once an ``acquire`` ends.
OUTCOMES = frozenset({"granted", "queue_full", "timeout", "displaced", "cancelled", "error"})


class LineProcess:
    """A Python subprocess driven by lines on its stdin, reporting one JSON object a line on
    its stdout, read into :attr:`events` by a daemon thread of the test process. It gets
    SIGTERM if the test process dies (``die_with_parent``); :meth:`kill` stops it by PID."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
            preexec_fn=die_with_parent(),
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self.events.append(json.loads(line))

    def seen(self, event: str | None = None) -> list[dict[str, Any]]:
        """The events reported so far (of kind ``event`` only, if given)."""
        with self._lock:
            return [e for e in self.events if event is None or e["event"] == event]

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL by PID (no clean-up of any kind runs), and reap it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(DEADLINE)
        self._reader.join(DEADLINE)


class Worker(LineProcess):
    """One ``redis_worker.py`` process (its own ``RedisColdLimiter``) and its events."""

    def __init__(
        self,
        port: int,
        name: str,
        settings: dict[str, Any],
        *,
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
    ) -> None:
        args = [str(port), name] + [str(settings[k]) for k in ("active", "queue", "wait", "lease")]
        super().__init__([str(WORKER), *args, *options], env)

    def pause(self, client: Any) -> None:
        """SIGSTOP the worker and return once nothing it sent can still reach Redis: every
        thread of it is stopped (``/proc``), then one round trip on ``client`` (Redis reads
        a command that arrived before ours in the same or an earlier turn of its loop, so a
        poll sent just before the stop is executed before anything the test sends next)."""
        os.kill(self.pid, signal.SIGSTOP)

        def all_stopped() -> bool:
            for stat in Path(f"/proc/{self.pid}/task").glob("*/stat"):
                try:
                    state = stat.read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue  # a thread that just ended
                if state not in ("T", "t"):
                    return False
            return True

        wait_until(f"worker {self.pid} stopped", all_stopped, timeout=DEADLINE)
        client.ping()

    def event(self, attempt: str, kinds: frozenset[str] = OUTCOMES) -> dict[str, Any] | None:
        """The first event of ``attempt`` whose kind is in ``kinds`` (its outcome by default)."""
        for event in self.seen():
            if event.get("id") == attempt and event["event"] in kinds:
                return event
        return None

    def outcome(self, attempt: str) -> str | None:
        event = self.event(attempt)
        return None if event is None else str(event["event"])

    def wait_outcome(self, attempt: str, timeout: float = DEADLINE) -> dict[str, Any]:
        """Wait (bounded) until ``attempt`` has ended; its outcome event."""
        wait_until(f"{attempt} ended", lambda: self.event(attempt) is not None, timeout=timeout)
        event = self.event(attempt)
        assert event is not None
        return event

    def ask(self, command: str, kind: str, timeout: float = DEADLINE) -> dict[str, Any]:
        """Send ``command`` and wait (bounded) for the next event of ``kind`` it answers."""
        before = sum(1 for e in self.seen() if e["event"] == kind)
        self.send(command)
        wait_until(
            f"worker {self.pid}: reply to {command!r}",
            lambda: sum(1 for e in self.seen() if e["event"] == kind) > before,
            timeout=timeout,
        )
        return [e for e in self.seen() if e["event"] == kind][before]

@pytest.fixture(name="start_workers")
def start_workers_fixture(redis_server: RedisServer) -> Iterator[Callable[..., list[Worker]]]:
    """``start_workers(n, name="procs", env=None, options=(), **settings)``: ``n`` workers,
    each ready (it reported ``ready`` with its own PID); every one killed by PID at teardown.
    Registered for the whole suite by ``tests/conftest.py`` (``pytest_plugins``)."""
    started: list[Worker] = []

    def start(
        n: int,
        name: str = "procs",
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
        **settings: Any,
    ) -> list[Worker]:
        merged = {"active": 2, "queue": 8, "wait": 60.0, "lease": 10.0, **settings}
        workers = [
            Worker(redis_server.port, name, merged, env=env, options=options) for _ in range(n)
        ]
        started.extend(workers)
        for w in workers:
            wait_until(
                f"worker {w.pid} ready",
                lambda w=w: any(e["event"] == "ready" for e in w.seen()),
                timeout=DEADLINE,
            )
            ready = next(e for e in w.seen() if e["event"] == "ready")
            assert ready["pid"] == w.pid, "the worker is not the process the test started"
        return workers

    yield start
    for w in started:
        w.kill()
    assert all(w.process.poll() is not None for w in started)
