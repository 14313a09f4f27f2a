"""The HTTP endpoints: reach reports, the node list, health, and the page.

design: the reach report is the one expensive endpoint. Its request runs, in order:

    pubkey and days parsed .............................. 400 for a malformed pubkey
    target looked up (one primary-key read) ............. 404 when unknown or hidden; this runs
                                                          before the cache, so a node hidden
                                                          after its report was cached is 404
    reach_limit.cold("pubkey|days|g<generation>", build)  warm hit, singleflight, limiter (429),
                                                          client gone (499)
    build: the report, serialised once to JSON bytes ..... the warm cache holds these bytes, so
                                                          a warm hit is served without
                                                          re-encoding and bodies are identical
    sqlite3.Error from the lookup or the build ........... 500 {"error": "reach computation
                                                          failed"}; never cached

The build runs in the leader's own handler thread, so it uses that thread's connection.

Decisions where the specification is silent:

- ``days`` must be a decimal integer (optional sign, surrounding spaces allowed); anything
  else, including ``7.5`` and an empty value, means 7. Integers are clamped to [1, 30].
- ``/api/nodes``: ``limit`` (default 50) and ``offset`` (default 0) must be decimal integers
  when given (else 400 with a JSON error naming the parameter); integers out of range are
  clamped, ``limit`` to [1, 500] and ``offset`` to [0, 10**9]. ``q`` is trimmed and cut to 100
  characters; see :func:`webapp.reach.list_nodes` for what it matches.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from reachlimit import NOT_FOUND
from reachlimit.flask import ReachLimit

from .reach import build_report, fetch_node, list_nodes, normalize_pubkey
from .state import ReachState

__all__ = ["bp", "reach_limit", "json_error", "parse_days"]

log = logging.getLogger("webapp.api")

#: The Flask extension that runs the cold path; configured per app by ``init_app``.
reach_limit = ReachLimit()

bp = Blueprint("api", __name__)

DEFAULT_DAYS = 7
MAX_DAYS = 30
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 10**9
MAX_QUERY = 100

_INTEGER = re.compile(r"\s*([+-]?)0*([0-9]+)\s*")

#: The one 404 body: unknown, blacklisted and hidden nodes are indistinguishable.
NOT_FOUND_MESSAGE = "Not found"


def json_error(status: int, message: str) -> Response:
    """``{"error": message}`` with ``status``."""
    response = jsonify(error=message)
    response.status_code = status
    return response


def _parse_int(raw: str, cap: int) -> int | None:
    """A decimal integer, saturated at ``±cap`` (so a thousand digits never reach int()),
    or None when ``raw`` is not one."""
    m = _INTEGER.fullmatch(raw)
    if m is None:
        return None
    sign, digits = m.groups()
    value = cap if len(digits) > len(str(cap)) else min(int(digits), cap)
    return -value if sign == "-" else value


def parse_days(raw: str | None) -> int:
    """The report window: an integer clamped to [1, 30]; anything else means 7."""
    value = _parse_int(raw, MAX_DAYS) if raw is not None else None
    if value is None:
        return DEFAULT_DAYS
    return min(MAX_DAYS, max(1, value))


def _state() -> ReachState:
    state = current_app.extensions["reach"]
    assert isinstance(state, ReachState)
    return state


@bp.before_app_request
def _empty_cache_after_visibility_change() -> None:
    """A visibility change empties the warm cache on the next request."""
    state = current_app.extensions.get("reach")
    if isinstance(state, ReachState) and state.claim_cache_clear():
        reach_limit.clear_cache()
        log.info("visibility rules changed (generation %d): warm cache emptied",
                 state.visibility.generation)


@bp.get("/api/nodes/<raw_pubkey>/reach")
def reach_report(raw_pubkey: str) -> Response:
    pubkey = normalize_pubkey(raw_pubkey)
    if pubkey is None:
        return json_error(400, "invalid pubkey: expected 64 hex chars")
    days = parse_days(request.args.get("days"))
    state = _state()
    rules = state.visibility.current  # one set of rules for the check, the key and the build
    try:
        conn = state.connection()
        target = fetch_node(conn, pubkey)
        if target is None or rules.is_hidden(pubkey, target.name):
            return json_error(404, NOT_FOUND_MESSAGE)

        def build() -> Any:
            report = build_report(
                conn, pubkey, days, now=state.wall_clock(), visibility=rules,
                degrees=state.degrees.get(conn), index=state.index.get(conn),
            )
            if report is None:  # deleted or hidden since the check above
                return NOT_FOUND
            return json.dumps(report, separators=(",", ":")).encode()

        body = reach_limit.cold(f"{pubkey}|{days}|g{rules.generation}", build)
    except sqlite3.Error:
        log.exception("reach report for %s (%d days) failed", pubkey, days)
        return json_error(500, "reach computation failed")
    if body is NOT_FOUND:
        return json_error(404, NOT_FOUND_MESSAGE)
    return Response(body, mimetype="application/json")


@bp.get("/api/nodes")
def nodes() -> Response:
    args = request.args
    paging: dict[str, int] = {}
    for name, default, low, high in (("limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
                                     ("offset", 0, 0, MAX_OFFSET)):
        raw = args.get(name, "")
        if raw.strip() == "":
            paging[name] = default
            continue
        value = _parse_int(raw, high)
        if value is None:
            return json_error(400, f"invalid {name}: expected a whole number")
        paging[name] = min(high, max(low, value))
    q = args.get("q", "").strip()[:MAX_QUERY]
    state = _state()
    found, total = list_nodes(
        state.connection(), q=q, limit=paging["limit"], offset=paging["offset"],
        visibility=state.visibility.current,
    )
    return jsonify(nodes=found, total=total)


bp.add_url_rule("/api/health", "health", reach_limit.health_view, methods=["GET"])

_PLACEHOLDER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Mesh reach reports</title></head>
<body><h1>Mesh reach reports</h1>
<p>The page is not installed. The API answers at <a href="/api/nodes">/api/nodes</a>,
<code>/api/nodes/&lt;pubkey&gt;/reach?days=7</code> and <a href="/api/health">/api/health</a>.</p>
</body></html>
"""


@bp.get("/")
def index() -> Response:
    """The report page (``webapp/static/index.html``), or a placeholder without it."""
    static = current_app.static_folder
    if static is not None and Path(static, "index.html").is_file():
        return current_app.send_static_file("index.html")
    return Response(_PLACEHOLDER, mimetype="text/html")
