"""What the test apps run under real servers share: their config from the environment, the
gate file their held builds wait for, the build log every process appends to, and the routes
that tell which worker answered.

Test-only: ``/debug/*`` is never in a real service.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask, jsonify

from reachlimit.flask import ReachLimit


def config_from_environment(app: Flask) -> None:
    """Copy every ``REACHLIMIT_*`` environment variable into ``app.config`` as the string it
    is (which also exercises the extension's handling of strings). Called in ``create_app``,
    never at import time."""
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("REACHLIMIT_")})


@dataclass(frozen=True)
class GateFiles:
    """``$GATE_DIR`` (``dir``), the directory the builds of every worker of every server
    share: their log, and the ``open`` file the test creates to let the held builds go on;
    ``$GATE_TIMEOUT`` (``timeout``, default 40 s), the longest a held build waits for it.
    Files, not Redis, so that the gate keeps working while a test stops a Redis."""

    dir: Path
    timeout: float

    @classmethod
    def from_environment(cls) -> GateFiles:
        return cls(Path(os.environ["GATE_DIR"]), float(os.environ.get("GATE_TIMEOUT", "40")))

    def wait(self, key: str) -> None:
        """Wait (20 ms polls) until ``dir/open`` exists; after ``timeout`` seconds raise
        RuntimeError, so that a test that forgets to open the gate fails loudly."""
        deadline = time.monotonic() + self.timeout
        while not (self.dir / "open").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"nobody opened the gate for {key!r} within {self.timeout:g} s")
            time.sleep(0.02)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` in one ``write`` of a file opened with
    ``O_APPEND`` (far below ``PIPE_BUF``): lines of different processes never mix, and their
    order in the file is the order they were written."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def add_debug_health(app: Flask, rl: ReachLimit) -> None:
    """``GET /debug/health``: ``{"pid", "token", "reach": rl.stats()}``, the figures and who
    answered (``token``: ``$SLOW_APP_TOKEN``, which tells a test's own server from whatever
    else answers on its port)."""

    @app.get("/debug/health")
    def debug_health() -> Any:
        return jsonify(
            pid=os.getpid(), token=os.environ.get("SLOW_APP_TOKEN"), reach=rl.stats().as_dict()
        )


def add_worker_pid(app: Flask) -> None:
    """Every answer carries ``X-Worker-Pid``: the PID of the worker that answered it."""

    @app.after_request
    def who_answered(response: Any) -> Any:
        response.headers["X-Worker-Pid"] = str(os.getpid())
        return response
