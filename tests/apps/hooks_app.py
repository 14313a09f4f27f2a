"""A Flask app for the tests of ``reachlimit.gunicorn`` under real gunicorn
(``tests/test_gunicorn_module.py``).

    GET /who      one ``rl.cold`` call (so that this worker's metrics files exist), then
                  {"pid", "token", "boot_id", "metrics_dir"}: who answered, and what the
                  config's ``prepare()`` gave it (REACHLIMIT_BOOT_ID, PROMETHEUS_MULTIPROC_DIR)
    GET /say/<word>  logs "said <word>" at INFO on the logger ``webapp.probe`` and at WARNING
                  on ``reachlimit.probe`` (children of the loggers a gunicorn config may
                  set up), then {"pid"}
    GET /health   rl.health_view

Metrics are on (prometheus_client's multiprocess mode once the directory is set). The token
is ``HOOKS_APP_TOKEN``, read per request. Test-only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flask import Flask, jsonify

from reachlimit.flask import ReachLimit


def create_app() -> Flask:
    app = Flask("hooks_app")
    app.config["REACHLIMIT_METRICS"] = True
    rl = ReachLimit(app)
    app.add_url_rule("/health", "health", rl.health_view)

    @app.get("/who")
    def who() -> Any:
        rl.cold("who", lambda: {"built": True})
        return jsonify(
            pid=os.getpid(),
            token=os.environ.get("HOOKS_APP_TOKEN"),
            boot_id=os.environ.get("REACHLIMIT_BOOT_ID"),
            metrics_dir=os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        )

    @app.get("/say/<word>")
    def say(word: str) -> Any:
        logging.getLogger("webapp.probe").info("said %s", word)
        logging.getLogger("reachlimit.probe").warning("said %s", word)
        return jsonify(pid=os.getpid())

    return app
