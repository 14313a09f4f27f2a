"""The HTTP endpoints: reach reports, the node list, health, and the page.

design: the reach report is the one expensive endpoint. Its request runs, in order:

    pubkey and days parsed .............................. 400 for a malformed pubkey
    target visible? from the node-index snapshot ........ 404 when hidden; no database work.
                                                          This runs before the cache, so a
                                                          node hidden after its report was
                                                          cached is 404 (same body as unknown)
      not in the snapshot: one primary-key read ......... 404 when unknown (or hidden)
    reach_limit.cold("pubkey|days|g<generation>", build)  warm hit, singleflight, limiter (429),
                                                          client gone (499): all untouched
    build: the report, serialised once to JSON bytes ..... the warm cache holds these bytes, so
                                                          a warm hit is served without
                                                          re-encoding and bodies are identical
    any other exception from the lookup or the build .... 500 {"error": "reach computation
                                                          failed"}, logged with its traceback;
                                                          never cached

So a warm hit, a queued leader and a refused leader for a node the snapshot knows run no SQL
and open no connection: a locked or missing database does not delay or fail a cached report
(``webapp/README.md``, "Caching"). Only a promoted leader's build touches the database; it runs
in the leader's own handler thread, on that thread's connection, and reads its target again.

The snapshot is the node index (names and roles, rebuilt at most once a minute by cold builds,
and at once by a build whose target disagrees with it; see ``webapp.report``). Consequences:

- A pubkey the snapshot does not know (unknown, or a node newer than the snapshot) costs one
  primary-key read on every request, warm or not, and fails with the 500 above while the
  database is unusable; it is then the unknown-node path.
- Blacklist and hidden-prefix changes apply at once (the rules are in memory). A node
  *renamed in the database* into a hidden prefix is judged by the name in the snapshot: its
  cached reports can still be served until a cold build reloads the snapshot - a build for
  this node reads its row, answers 404 and reloads at once; any build does once the snapshot
  is a minute old - or until they expire (the warm cache's TTL). Likewise a node deleted from
  the database. This is the price of a warm path without database work; before this, the
  target's row was read on every request, warm or not.

Parameter rules (also in ``webapp/README.md``, "Endpoints and errors" and "Decisions"):

- ``days`` must be a decimal integer (optional sign, surrounding spaces allowed); anything
  else, including ``7.5`` and an empty value, means 7. Integers are clamped to [1, 30].
- ``/api/nodes``: ``limit`` (default 50) and ``offset`` (default 0) must be decimal integers
  when given (else 400 with a JSON error naming the parameter); integers out of range are
  clamped, ``limit`` to [1, 500] and ``offset`` to [0, 10**9]. ``q`` is trimmed and cut to 100
  characters; see :func:`webapp.nodelist.list_nodes` for what it matches.
- An integer parameter longer than :data:`MAX_INTEGER_TEXT` characters (spaces and leading
  zeros included) is not a number, whatever its digits: ``days`` then means 7 and ``limit`` /
  ``offset`` are a 400. The cap bounds the parser's work on any input.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from reachlimit import NOT_FOUND, Unavailable
from reachlimit.flask import ReachLimit

from .db import fetch_node
from .meshcore import normalize_pubkey
from .nodelist import list_nodes
from .report import build_report
from .state import ReachState
from .visibility import VisibilityRules

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

#: Longest text an integer parameter may have (every sensible value is far shorter).
MAX_INTEGER_TEXT = 32

# Linear by construction: no two adjacent repeats can match the same characters (leading
# zeros are stripped afterwards, not by the pattern), and the length is capped before it runs.
_INTEGER = re.compile(r"\s*([+-]?)([0-9]+)\s*")

#: The one 404 body: unknown, blacklisted and hidden nodes are indistinguishable.
NOT_FOUND_MESSAGE = "Not found"


def json_error(status: int, message: str) -> Response:
    """``{"error": message}`` with ``status``."""
    response = jsonify(error=message)
    response.status_code = status
    return response


def _parse_int(raw: str, cap: int) -> int | None:
    """A decimal integer, saturated at ``±cap``, or None when ``raw`` is not one or is longer
    than :data:`MAX_INTEGER_TEXT` characters."""
    if len(raw) > MAX_INTEGER_TEXT:
        return None
    m = _INTEGER.fullmatch(raw)
    if m is None:
        return None
    sign, digits = m.groups()
    digits = digits.lstrip("0") or "0"
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
    generation = state.claim_cache_clear() if isinstance(state, ReachState) else 0
    if generation:
        assert isinstance(state, ReachState)
        try:
            reach_limit.clear_cache()
        except Unavailable as exc:
            # The request goes on: reports of older generations are never answered (the
            # generation is in the key); the next request tries the clear again.
            state.give_back_cache_clear(generation)
            log.warning("visibility rules changed (generation %d): the warm cache could not "
                        "be emptied (%s); the next request tries again", generation, exc)
            return
        log.info("visibility rules changed (generation %d): warm cache emptied", generation)


def _target_visible(state: ReachState, rules: VisibilityRules, pubkey: str) -> bool:
    """Whether ``pubkey`` is a node that ``rules`` let a client see.

    Decided from the node-index snapshot with no database work when the snapshot knows the
    node; otherwise (no snapshot yet, an unknown pubkey, a node newer than the snapshot) by
    one primary-key read, which raises ``sqlite3.Error`` when the database fails."""
    index = state.index.peek()  # racy read: any recent snapshot will do
    node = index.nodes.get(pubkey) if index is not None else None
    if node is None:
        node = fetch_node(state.connection(), pubkey)
        if node is None:
            return False
    return not rules.is_hidden(pubkey, node.name)


@bp.get("/api/nodes/<raw_pubkey>/reach")
def reach_report(raw_pubkey: str) -> Response:
    pubkey = normalize_pubkey(raw_pubkey)
    if pubkey is None:
        return json_error(400, "invalid pubkey: expected 64 hex chars")
    days = parse_days(request.args.get("days"))
    state = _state()
    rules = state.visibility.current  # one set of rules for the check, the key and the build

    def build() -> Any:
        # Runs in this (the leader's) thread, with a build slot: the only database work of a
        # report that is not a lookup of an unknown pubkey. A refresh of a stale report runs
        # it later on a refresher thread (REACHLIMIT_STALE): so it reads nothing of the request.
        conn = state.connection()
        report = build_report(
            conn, pubkey, days, now=state.wall_clock(), visibility=rules,
            degrees=state.degrees.get(conn), index=state.index.get(conn),
            reload_index=state.index.refresh,
        )
        if report is None:  # deleted, or hidden by its current row, since the snapshot
            return NOT_FOUND
        # allow_nan=False: a NaN or an infinity that slipped into a report is a failed build
        # (ValueError, a 500 below, not cached), never an invalid body cached for minutes.
        return json.dumps(report, separators=(",", ":"), allow_nan=False).encode()

    try:
        if not _target_visible(state, rules, pubkey):
            return json_error(404, NOT_FOUND_MESSAGE)
        body = reach_limit.cold(f"{pubkey}|{days}|g{rules.generation}", build)
    except HTTPException:
        raise  # the extension's finished 429 / 503 / 499: passed on untouched
    except Exception:
        # A database failure, or a bug or hostile row the build did not survive: the same
        # JSON 500 (never cached - ColdPath caches only values), details only in the log.
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
# Prometheus text format; the figures of every gunicorn worker (webapp/gunicorn.conf.py). Like
# /api/health, it never touches the database.
bp.add_url_rule("/metrics", "metrics", reach_limit.metrics_view, methods=["GET"])


@bp.after_request
def _options_as_json(response: Response) -> Response:
    """Flask answers OPTIONS by itself, with an empty text/html body; every answer of this
    service is JSON, so that one says which methods the URL allows, as JSON too."""
    if request.method == "OPTIONS" and not response.get_data():
        response.set_data(json.dumps({"allow": sorted(response.allow)}))
        response.mimetype = "application/json"
    return response

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
