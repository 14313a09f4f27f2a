"""A Flask app with two budgets and a decorated view, for the budget tests under real gunicorn.

design: builds wait for a gate FILE shared by every worker, ``$GATE_DIR``:

    GET /d/<key>        rl.cold (default budget)
    GET /r/<key>        reports.cold (budget "reports": active 1, queue 0, declared at import
                        time next to ``rl = ReachLimit()``, built per app by init_app)
    GET /c/<name>       @rl.cached(): the view is the build; answers {"name", "args", "pid"}
    every build         writes ``running-<label>`` (its PID) and a line "<pid> <label>" to
                        ``log``, waits until ``GATE_DIR/open`` exists (20 ms polls, at most
                        ``GATE_TIMEOUT`` s, then fails loudly), then removes ``running-``
    GET /health         rl.health_view;  GET /metrics  rl.metrics_view
    GET /debug/health   {"pid", "token"}: who answered (the harness's identity check)

``REACHLIMIT_*`` variables are copied into the config as strings. Test-only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, request

from reachlimit.flask import ReachLimit
from tests.apps.common import GateFiles, config_from_environment

rl = ReachLimit()
reports = rl.budget("reports", active=1, queue=0)


def builds_logged(gate_dir: Path) -> list[str]:
    """The label of every build that ever started, in order."""
    log = gate_dir / "log"
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


def running(gate_dir: Path) -> dict[str, int]:
    """label -> PID of every build running now."""
    out = {}
    for path in gate_dir.glob("running-*"):
        try:
            out[path.name[len("running-"):]] = int(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed this instant
    return out


def _gated(gate: GateFiles, label: str, value: Any) -> Any:
    marker = gate.dir / f"running-{label}"
    marker.write_text(str(os.getpid()))
    with open(gate.dir / "log", "a") as log:
        log.write(f"{os.getpid()} {label}\n")
    try:
        gate.wait(label)
        return value
    finally:
        marker.unlink(missing_ok=True)


def create_app() -> Flask:
    app = Flask(__name__)
    config_from_environment(app)
    gate = GateFiles.from_environment()
    rl.init_app(app)

    @app.get("/d/<key>")
    def default(key: str) -> Any:
        return rl.cold(key, lambda: _gated(gate, f"d-{key}", {"key": key}))

    @app.get("/r/<key>")
    def report(key: str) -> Any:
        return reports.cold(key, lambda: _gated(gate, f"r-{key}", {"report": key}))

    @app.get("/c/<name>")
    @rl.cached()
    def decorated(name: str) -> Any:
        args = sorted(request.args.items(multi=True))
        return _gated(gate, f"c-{name}", {"name": name, "args": args, "pid": os.getpid()})

    app.add_url_rule("/health", view_func=rl.health_view)
    app.add_url_rule("/metrics", view_func=rl.metrics_view)

    @app.get("/debug/health")
    def debug_health() -> Any:
        return jsonify(pid=os.getpid(), token=os.environ.get("SLOW_APP_TOKEN"))

    return app
