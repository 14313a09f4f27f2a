"""A Flask app whose cold build the test controls, for runs under real servers.

design:

    GET  /report/<key>     rl.cold(key, build): the build waits for the gate (or sleeps
                           SLOW_BUILD_SECONDS), then returns {"key", "build", "pid"}
    GET  /health           rl.health_view: the limiter's and the path's figures
    GET  /metrics          rl.metrics_view (REACHLIMIT_METRICS=true; else 404)
    GET  /debug/builds     {"in_flight", "max_in_flight", "total", "gate_open",
                            "gate_timeouts", "pid", "token"}: builds seen by this process
    GET  /debug/followers/<key>
                           {"followers": n}: requests waiting on the in-flight build of
                           ``key`` (white-box: read from the singleflight's private table)
    POST /debug/hold       close the gate: builds that start from now on wait
    POST /debug/release    open the gate: every waiting build goes on

The gate is a ``threading.Event`` shared by every build of one app. A build waits on it for at
most ``SLOW_GATE_TIMEOUT`` seconds (default 40) and then *fails* (500), so a test that forgets
to open it fails loudly instead of passing on a slow build. With ``SLOW_BUILD_SECONDS`` set, a
build sleeps that long instead and ignores the gate.

Configuration comes from the environment, read in ``create_app`` (never at import time):
every ``REACHLIMIT_*`` variable is copied into ``app.config`` as the string it is, which also
exercises the extension's handling of strings. The gate starts open unless ``SLOW_GATE=closed``.

A test-only app: ``/debug/*`` must never be routed in a real service.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, jsonify

from reachlimit import NOT_FOUND
from reachlimit.flask import ReachLimit
from tests.apps.common import config_from_environment


class BuildGate:
    """The builds of one app: the gate they wait on and what they have done so far.

    Runs in the request threads; every counter is guarded by ``_lock``."""

    def __init__(self, open_: bool, gate_timeout: float, sleep: float | None) -> None:
        self.gate = threading.Event()
        if open_:
            self.gate.set()
        self.gate_timeout = gate_timeout
        self.sleep = sleep
        self._lock = threading.Lock()
        self.in_flight = 0  # guarded by _lock
        self.max_in_flight = 0  # guarded by _lock
        self.total = 0  # guarded by _lock
        self.gate_timeouts = 0  # guarded by _lock

    def build(self, key: str) -> dict[str, Any]:
        with self._lock:
            self.in_flight += 1
            self.total += 1
            number = self.total
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.sleep is not None:
                time.sleep(self.sleep)
            elif not self.gate.wait(self.gate_timeout):
                with self._lock:
                    self.gate_timeouts += 1
                raise RuntimeError(f"the test never opened the build gate for {key!r}")
            return {"key": key, "build": number, "pid": os.getpid()}
        finally:
            with self._lock:
                self.in_flight -= 1

    def figures(self) -> dict[str, Any]:
        with self._lock:
            return {
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "total": self.total,
                "gate_open": self.gate.is_set(),
                "gate_timeouts": self.gate_timeouts,
                "pid": os.getpid(),
                # Lets a test tell its own server from whatever else answers on a port.
                "token": os.environ.get("SLOW_APP_TOKEN"),
            }


def add_cold_routes(app: Flask, rl: ReachLimit, build: Callable[[str], Any]) -> None:
    """The two routes every test app has: ``GET /report/<key>`` (``build(key)`` through
    ``rl.cold``; ``NOT_FOUND`` is a 404 JSON answer) and ``GET /health``."""

    @app.get("/report/<key>")
    def report(key: str) -> Any:
        value = rl.cold(key, lambda: build(key))
        if value is NOT_FOUND:
            return jsonify(error="Not found"), 404
        return jsonify(value)

    app.add_url_rule("/health", "health", rl.health_view)
    app.add_url_rule("/metrics", "metrics", rl.metrics_view)  # 404 unless REACHLIMIT_METRICS


def create_app(**config: Any) -> Flask:
    """The app factory (gunicorn: ``'tests.apps.slow_app:create_app()'``).

    ``config`` (in-process tests) wins over the environment."""
    app = Flask(__name__)
    config_from_environment(app)
    app.config.update(config)

    sleep = os.environ.get("SLOW_BUILD_SECONDS")
    gate = BuildGate(
        open_=os.environ.get("SLOW_GATE", "open") != "closed",
        gate_timeout=float(os.environ.get("SLOW_GATE_TIMEOUT", "40")),
        sleep=float(sleep) if sleep else None,
    )
    app.extensions["slow_app"] = gate
    rl = ReachLimit(app)

    add_cold_routes(app, rl, gate.build)

    @app.get("/debug/builds")
    def debug_builds() -> Any:
        return jsonify(gate.figures())

    @app.get("/debug/followers/<key>")
    def debug_followers(key: str) -> Any:
        # White-box, test-only: a follower is counted once it has attached to the leader's
        # call, which no public figure shows until the call ends.
        call = rl.path.flight._calls.get(key)
        return jsonify(followers=call.followers if call is not None else 0)

    @app.post("/debug/hold")
    def debug_hold() -> Any:
        gate.gate.clear()
        return jsonify(gate.figures())

    @app.post("/debug/release")
    def debug_release() -> Any:
        gate.gate.set()
        return jsonify(gate.figures())

    return app
