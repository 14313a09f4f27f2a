"""A Flask app whose builds write when they start and end to one log shared by every
process, for the tests that run several gunicorn workers across a Redis failover.

design: the builds of every worker share one directory, ``$GATE_DIR``:

    GET /report/<key>   rl.cold(key, build). The build appends ``start <pid> <key>`` to
                        ``GATE_DIR/log``, then: a key starting with ``hold-`` waits (20 ms
                        polls) until ``GATE_DIR/open`` exists, for at most ``GATE_TIMEOUT`` s
                        (default 40, then it fails loudly); any other key sleeps
                        ``BUILD_SECONDS`` (default 0.05: a short build under a steady load).
                        Then it appends ``end <pid> <key>`` and returns {"key", "pid"}.
    GET /health         rl.health_view
    GET /debug/health   {"pid", "token", "reach": rl.stats()}: the figures and who answered

Each line is one ``write`` of a file opened with ``O_APPEND`` (far below ``PIPE_BUF``), so
lines of different processes never mix and their order in the file is the order they were
written. A build runs between its two lines, inside its grant, so the running count of
starts minus ends along the file (``at_once_along``) is never below the builds that really
ran at once and never above the grants held at once: the most builds one budget admitted
together, across every process. ``REACHLIMIT_*`` variables are copied into the config as
strings. Test-only: ``/debug/*`` is never in a real service.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flask import Flask

from reachlimit.flask import ReachLimit
from tests.apps.common import (
    GateFiles,
    add_debug_health,
    append_line,
    config_from_environment,
)
from tests.apps.slow_app import add_cold_routes


def at_once_along(gate_dir: Path) -> list[int]:
    """The builds running (starts minus ends) after each line of the log, in its order:
    its largest value is the most builds one budget admitted at once (see the design)."""
    log = gate_dir / "log"
    lines = log.read_text().splitlines() if log.exists() else []
    counts, running = [], 0
    for line in lines:
        running += 1 if line.startswith("start ") else -1
        counts.append(running)
    return counts


def running_now(gate_dir: Path) -> int:
    """Builds started and not ended, per the log."""
    counts = at_once_along(gate_dir)
    return counts[-1] if counts else 0


def _note(gate_dir: Path, event: str, key: str) -> None:
    append_line(gate_dir / "log", f"{event} {os.getpid()} {key}")


def create_app() -> Flask:
    app = Flask(__name__)
    config_from_environment(app)
    gate = GateFiles.from_environment()
    build_seconds = float(os.environ.get("BUILD_SECONDS", "0.05"))
    rl = ReachLimit(app)

    def build(key: str) -> dict[str, Any]:
        _note(gate.dir, "start", key)
        try:
            if key.startswith("hold-"):
                gate.wait(key)
            else:
                time.sleep(build_seconds)  # the work itself, not a synchronisation
            return {"key": key, "pid": os.getpid()}
        finally:
            _note(gate.dir, "end", key)

    add_cold_routes(app, rl, build)

    add_debug_health(app, rl)

    return app
