"""webapp: mesh reach reports over a CoreScope SQLite database, served by Flask.

``create_app(config=None)`` builds the app. Configuration comes from the environment, read
here and never at import time, and ``config`` overrides it (``webapp/README.md``,
"Configuration"):

===========================  ===============================================================
``REACH_DB``                 the database to serve, opened read-only. Unset or empty: the
                             embedded demo database ``webapp/data/demo.sqlite``, written
                             when missing (or a day stale) before the first request needs
                             it - ``webapp.wsgi`` does it at start-up.
``REACH_BLACKLIST``          comma-separated pubkeys never shown (404, and left out of other
                             nodes' reports).
``REACH_HIDDEN_PREFIXES``    comma-separated name prefixes hidden the same way (ignoring case).
``REACH_PROXIES``            how many trusted proxies stand in front (default 0). N > 0 wraps
                             the app in werkzeug's ``ProxyFix(x_for=N)``: the client address
                             (and so the fair-admission client, ``REACHLIMIT_CLIENT``) is the
                             N-th ``X-Forwarded-For`` entry from the right, the one the
                             outermost trusted proxy wrote - never the leftmost, which any
                             client can write. Only set it when the service cannot be reached
                             but through those proxies.
``REACHLIMIT_*``             the cold limiter and warm cache (see ``reachlimit.flask``), e.g.
                             ``REACHLIMIT_ACTIVE=2``, ``REACHLIMIT_QUEUE=8``,
                             ``REACHLIMIT_RETRY_AFTER=auto``. The service
                             turns ``REACHLIMIT_METRICS`` on (``GET /metrics``);
                             ``REACHLIMIT_METRICS=false`` turns it off (then a 404).
                             It ships ``REACHLIMIT_STALE=300``: a report past its TTL is
                             answered stale (``Cache-Status: ...; ttl=-N``) while one
                             refresh rebuilds it; 0 turns that off.
                             ``REACHLIMIT_REDIS_URL`` shares the limiter, the warm cache
                             and the singleflight between workers and hosts.
===========================  ===============================================================

In ``config``, ``REACH_BLACKLIST`` and ``REACH_HIDDEN_PREFIXES`` may also be lists. Three more
keys exist for tests and tuning: ``REACH_SNAPSHOT_INTERVAL`` (seconds between rebuilds of the
degree table and node index, default 60), ``REACH_DEMO_STALE_AFTER`` (seconds, default one
day; None never rewrites a demo database) and ``REACH_WALL_CLOCK`` (a callable returning the
unix time report windows end at, default ``time.time``).

A configuration the service cannot run with - an explicit ``REACH_DB`` that is missing,
unreadable or not a CoreScope database, a malformed blacklist entry, a ``REACH_PROXIES`` that
is not a whole number >= 0, a bad ``REACHLIMIT_*`` value - stops start-up with ``SystemExit``
and one line naming the problem, not a traceback.

The blacklist and hidden prefixes can be changed while running through
``app.extensions["reach"].visibility`` (``set_blacklist``, ``set_hidden_prefixes``): the
change bumps the generation in every cache key and empties the warm cache on the next request.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.middleware.proxy_fix import ProxyFix

from reachlimit.flask import CONFIG_KEYS

from .api import bp, json_error, reach_limit
from .cli import demo_db_command
from .db import DatabaseError, check_database
from .state import ReachState
from .visibility import Visibility

__all__ = ["create_app", "DEFAULT_DB", "reach_state", "proxy_count", "trust_proxies"]

log = logging.getLogger("webapp")

#: The embedded demo database, served when REACH_DB is not set (webapp/data/ is gitignored).
DEFAULT_DB = Path(__file__).resolve().parent / "data" / "demo.sqlite"

_ENV_KEYS = ("REACH_DB", "REACH_BLACKLIST", "REACH_HIDDEN_PREFIXES", "REACH_PROXIES")


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The configuration keys present in the environment, as strings."""
    found: dict[str, Any] = {k: environ[k] for k in _ENV_KEYS if k in environ}
    for key in CONFIG_KEYS:
        if key in environ:
            found[key] = environ[key]  # the extension parses and validates the strings
    return found


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part for part in value.split(",") if part.strip()]
    if isinstance(value, Iterable):
        return [str(part) for part in value]
    raise TypeError(f"expected a comma-separated string or a list, got {value!r}")


def proxy_count(value: object) -> int:
    """``REACH_PROXIES``: a whole number >= 0 (a string of ASCII digits from the environment);
    anything else stops start-up with one line naming the variable."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.isascii() and text.isdigit():
        return int(text)
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    raise SystemExit(f"webapp: REACH_PROXIES must be a whole number >= 0, got {value!r}")


def trust_proxies(app: Flask, count: int) -> None:
    """Trust ``count`` proxies in front of ``app``: with ``count`` > 0 its WSGI app is wrapped
    in ``ProxyFix(x_for=count)``, so ``request.remote_addr`` is the ``count``-th
    ``X-Forwarded-For`` entry from the right (the address the outermost trusted proxy saw);
    a request with fewer entries keeps its peer address. ProxyFix's other default,
    ``x_proto=1``, also takes the scheme from the nearest proxy's ``X-Forwarded-Proto``; no
    host, port or prefix header is trusted."""
    if count > 0:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=count)  # type: ignore[method-assign]


def reach_state(app: Flask) -> ReachState:
    """The app's :class:`~webapp.state.ReachState` (database, visibility, snapshots)."""
    state = app.extensions["reach"]
    assert isinstance(state, ReachState)
    return state


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the reach-report app (see the module docstring for the configuration)."""
    app = Flask(__name__)
    app.config.update(
        REACH_DB=None,
        REACH_BLACKLIST="",
        REACH_HIDDEN_PREFIXES="",
        REACH_PROXIES=0,
        REACH_SNAPSHOT_INTERVAL=60.0,
        REACH_DEMO_STALE_AFTER=86_400.0,
        REACH_WALL_CLOCK=time.time,
    )
    app.config.update(_from_env(os.environ))
    if config:
        app.config.update(config)
    # The service serves GET /metrics (prometheus_client comes with the webapp extra).
    app.config.setdefault("REACHLIMIT_METRICS", True)
    # A report past its TTL is answered from its stale copy for up to 5 more minutes while one
    # refresh rebuilds it (REACHLIMIT_STALE=0 turns that off).
    app.config.setdefault("REACHLIMIT_STALE", 300)
    # The extension's own refusal sentence names its budget; the service speaks of reports.
    app.config.setdefault(
        "REACHLIMIT_REFUSAL_MESSAGE",
        "Too many reports are being built right now; please retry in {retry_after} s.",
    )
    if app.logger.level == logging.NOTSET:
        app.logger.setLevel(logging.INFO)  # our start-up and cache messages are INFO

    try:
        visibility = Visibility(
            _as_list(app.config["REACH_BLACKLIST"]),
            _as_list(app.config["REACH_HIDDEN_PREFIXES"]),
        )
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"webapp: REACH_BLACKLIST / REACH_HIDDEN_PREFIXES: {exc}") from None

    trust_proxies(app, proxy_count(app.config["REACH_PROXIES"]))

    raw_db = app.config["REACH_DB"]
    explicit = raw_db is not None and str(raw_db).strip() != ""
    db_path = Path(str(raw_db)).expanduser().resolve() if explicit else DEFAULT_DB
    if explicit:
        try:
            check_database(db_path)
        except DatabaseError as exc:
            raise SystemExit(f"webapp: REACH_DB: {exc}") from None

    app.extensions["reach"] = ReachState(
        db_path=db_path,
        create_demo=not explicit,
        visibility=visibility,
        snapshot_interval=float(app.config["REACH_SNAPSHOT_INTERVAL"]),
        demo_stale_after=app.config["REACH_DEMO_STALE_AFTER"],
        wall_clock=app.config["REACH_WALL_CLOCK"],
    )
    try:
        reach_limit.init_app(app)
    except ValueError as exc:
        raise SystemExit(f"webapp: {exc}") from None

    app.register_blueprint(bp)
    _register_error_handlers(app)
    app.cli.add_command(demo_db_command)
    return app


def _sentence(name: str) -> str:
    """'Method Not Allowed' -> 'Method not allowed' (so 404 reads 'Not found' everywhere)."""
    return name[:1] + name[1:].lower()


def _register_error_handlers(app: Flask) -> None:
    """Every error is JSON ``{"error": "..."}``: never a traceback, a server path or HTML."""

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> ResponseReturnValue:
        if exc.response is not None:
            # A finished response (reachlimit's 429 / 499, an abort(Response)): send as is.
            return exc.response
        response = json_error(exc.code or 500, _sentence(exc.name))
        for header, value in exc.get_headers():
            if header.lower() != "content-type":
                response.headers[header] = value  # e.g. Allow on a 405
        return response

    @app.errorhandler(InternalServerError)
    def internal_error(exc: InternalServerError) -> Response:
        # Flask has already logged the original exception with its traceback.
        return json_error(500, "Internal server error")

    @app.errorhandler(sqlite3.Error)
    def database_error(exc: sqlite3.Error) -> Response:
        log.error("database error: %s", exc, exc_info=exc)
        return json_error(500, "database unavailable")
