"""``tests.apps.build_log_app`` with one more test-only route, for the tests of the fallback's
share (``tests/test_redis_fallback_share.py``):

    GET /debug/share    {"pid", "processes", "share"}: N, the live processes of the budget
                        as this worker last heard from Redis, and the (builds, places) its
                        fallback admits with it. It asks the limiter for its figures first,
                        which starts the worker's announcing, as a request's cold call does.

Test-only: ``/debug/*`` is never in a real service.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify

from tests.apps import build_log_app


def create_app() -> Flask:
    app = build_log_app.create_app()

    @app.get("/debug/share")
    def share() -> Any:
        limiter = app.extensions["reachlimit"].path.limiter  # the ResilientLimiter
        limiter.stats()
        return jsonify(
            pid=os.getpid(), processes=limiter.processes, share=list(limiter.share())
        )

    return app
