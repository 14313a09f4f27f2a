"""The app of the soak (``benchmarks/soak.py``): ``tests.apps.build_log_app`` (builds that write
when they started and ended, in server time, to one log shared by every process, and that the
soak can make fail or hold; see its design), with longer builds by default and answers that
tell which worker gave them:

    GET /report/<key>   as in the build-log app; ``BUILD_SECONDS`` defaults to 0.2
    every answer        carries ``X-Worker-Pid``: the PID of the worker that answered it
    any 500             ``{"error": "build failed", "path"}`` as JSON

The soak reads the log with the build-log app's ``read_log`` and ``at_once``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import InternalServerError

from tests.apps import build_log_app
from tests.apps.common import add_worker_pid


def create_app() -> Flask:
    app = build_log_app.create_app(default_build_seconds=0.2)

    @app.errorhandler(InternalServerError)
    def failed(error: InternalServerError) -> Any:
        return jsonify(error="build failed", path=request.path), 500

    add_worker_pid(app)
    return app
