"""A Flask app whose builds write when they start and end, in server time, to one log shared
by every process, for the tests that run several gunicorn workers across a Redis failover
(and, with a little more, for the soak: ``tests.apps.soak_app``).

design: the builds of every worker share one directory, ``$GATE_DIR``:

    GET /report/<key>   rl.cold(key, build). The build appends ``start <time> <pid> <key>``
                        to ``GATE_DIR/log`` (``time.time()``, the wall clock every process
                        of the machine shares), then:
                          ``raise-...``  raises (a 500, never cached);
                          ``hold-...``   waits (20 ms polls) until ``GATE_DIR/open`` exists,
                                         for at most ``GATE_TIMEOUT`` s (default 40, then it
                                         fails loudly), and returns at once;
                          any other key  sleeps ``BUILD_SECONDS`` (default 0.05: a short
                                         build under a steady load).
                        Then (also when it raised) it appends ``end <time> <pid> <key>`` and
                        returns ``{"key", "pid", "built"}``: ``built`` is the time the build
                        ended, so a client reads how old the answer it got is.
    GET /health         rl.health_view
    GET /debug/health   {"pid", "token", "reach": rl.stats()}: the figures and who answered

Each line is one ``write`` of a file opened with ``O_APPEND`` (far below ``PIPE_BUF``), so
lines of different processes never mix and their order in the file is the order they were
written. A build runs between its two lines, inside its grant, so the running count of
starts minus ends along the file (``at_once``) is never below the builds that really ran at
once and never above the grants held at once: the most builds one budget admitted together,
across every process. A worker killed by SIGKILL never writes the ends of its builds:
``at_once`` ends them at the kill (the first line written at or after it), since they died
with it. ``REACHLIMIT_*`` variables are copied into the config as strings. Test-only:
``/debug/*`` and failing builds on request are never in a real service.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
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

#: The keys whose build raises, and those whose build waits for the gate file.
RAISE, HOLD = "raise-", "hold-"


@dataclass(frozen=True)
class LogLine:
    """One line of the build log."""

    event: str  # "start" or "end"
    at: float  # time.time() in the process that wrote it
    pid: int
    key: str


def read_log(gate_dir: Path) -> list[LogLine]:
    """Every line of the build log, in the order written."""
    path = gate_dir / "log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        event, at, pid, key = line.split(" ", 3)
        out.append(LogLine(event, float(at), int(pid), key))
    return out


def at_once(lines: list[LogLine], killed: Mapping[int, float]) -> list[int]:
    """The builds running after each line of ``lines`` (starts minus ends, in the log's
    order). ``killed`` maps the PID of each worker killed to when: its builds that never
    ended are taken as ended at the first line written at or after that time."""
    running: dict[int, int] = {}  # pid -> its builds started and not ended (nor killed)
    gone: set[int] = set()
    counts = []
    for line in lines:
        for pid, when in killed.items():
            if pid not in gone and line.at >= when:
                gone.add(pid)
                running.pop(pid, None)
        if line.pid not in gone:
            running[line.pid] = running.get(line.pid, 0) + (1 if line.event == "start" else -1)
        counts.append(sum(running.values()))
    return counts


def at_once_along(gate_dir: Path) -> list[int]:
    """The builds running after each line of the log in ``gate_dir``, no worker killed: its
    largest value is the most builds one budget admitted at once (see the design)."""
    return at_once(read_log(gate_dir), {})


def running_now(gate_dir: Path) -> int:
    """Builds started and not ended, per the log."""
    counts = at_once_along(gate_dir)
    return counts[-1] if counts else 0


def _note(gate_dir: Path, event: str, key: str) -> None:
    append_line(gate_dir / "log", f"{event} {time.time():.6f} {os.getpid()} {key}")


class BuildFailed(RuntimeError):
    """The failure a ``raise-`` key's build raises on purpose."""


def create_app(default_build_seconds: float = 0.05) -> Flask:
    """The app factory (gunicorn: ``'tests.apps.build_log_app:create_app()'``);
    ``default_build_seconds`` is the build's sleep when ``$BUILD_SECONDS`` is not set."""
    app = Flask(__name__)
    config_from_environment(app)
    gate = GateFiles.from_environment()
    build_seconds = float(os.environ.get("BUILD_SECONDS", default_build_seconds))
    rl = ReachLimit(app)

    def build(key: str) -> dict[str, Any]:
        _note(gate.dir, "start", key)
        try:
            if key.startswith(RAISE):
                raise BuildFailed(f"the test asked the build of {key!r} to fail")
            if key.startswith(HOLD):
                gate.wait(key)
            else:
                time.sleep(build_seconds)  # the work itself, not a synchronisation
            return {"key": key, "pid": os.getpid(), "built": time.time()}
        finally:
            _note(gate.dir, "end", key)

    add_cold_routes(app, rl, build)
    add_debug_health(app, rl)
    return app
