"""A Flask app whose builds wait for a gate FILE, for tests with several gunicorn processes.

design: the builds of every worker of every server share one directory, ``$GATE_DIR``:

    GET /report/<key>   rl.cold(key, build). The build, under an exclusive ``flock`` of
                        ``GATE_DIR/lock``, appends to ``log`` a line of its PID, its key and
                        the number of builds running (its own included) - so the largest
                        number ever written is the most builds that ran at once across
                        processes - and then creates ``running-<key>`` holding the same line
                        (so a build seen running is in the log already); then it waits
                        (20 ms polls) until ``GATE_DIR/open`` exists, for at most
                        ``GATE_TIMEOUT`` s (default 40; then it fails, so a forgotten gate
                        fails loudly); then removes its ``running-`` file and returns
                        {"key", "pid"}.
    GET /health         rl.health_view
    GET /debug/health   {"pid", "token", "reach": rl.stats()}: the figures and who answered
    every answer        carries ``X-Worker-Pid``: the PID of the worker that answered it

Files, not Redis, so that the gate keeps working while the tests stop the Redis the limiter
uses. ``REACHLIMIT_*`` variables are copied into the config as strings (``create_app`` reads
the environment, never at import time). Test-only: ``/debug/*`` is never in a real service.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from flask import Flask

from reachlimit.flask import ReachLimit
from tests.apps.common import (
    GateFiles,
    add_debug_health,
    add_worker_pid,
    config_from_environment,
)
from tests.apps.slow_app import add_cold_routes


def running_counts(gate_dir: Path) -> list[int]:
    """The number of builds running that each build saw when it started (see the design)."""
    log = gate_dir / "log"
    if not log.exists():
        return []
    return [int(line.split()[2]) for line in log.read_text().splitlines() if line.strip()]


def build_pids(gate_dir: Path) -> dict[str, int]:
    """key -> PID of every build running now."""
    out = {}
    for path in gate_dir.glob("running-*"):
        try:
            out[path.name[len("running-"):]] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # being written or removed this instant
    return out


def create_app() -> Flask:
    app = Flask(__name__)
    config_from_environment(app)
    gate = GateFiles.from_environment()
    rl = ReachLimit(app)

    def build(key: str) -> dict[str, Any]:
        running = gate.dir / f"running-{key}"
        with open(gate.dir / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                count = len(list(gate.dir.glob("running-*"))) + 1
                line = f"{os.getpid()} {key} {count}\n"
                # The log first: a test that sees the running- file finds its line logged.
                with open(gate.dir / "log", "a") as log:
                    log.write(line)
                running.write_text(line)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            gate.wait(key)
            return {"key": key, "pid": os.getpid()}
        finally:
            running.unlink(missing_ok=True)

    add_cold_routes(app, rl, build)

    add_worker_pid(app)
    add_debug_health(app, rl)

    return app
