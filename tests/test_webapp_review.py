"""webapp: the reach service against hostile data and its own edges, through Flask's test
client: rows a review found could break a report, the integer parser, a stale node index, and
the warm path that touches no database. The database and the report windows are those of
``tests/test_webapp.py``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import webapp.api
import webapp.report
from tests.support.reach_app import UNKNOWN, Factory, health, query
from webapp import reach_state

# -- review findings -------------------------------------------------------------------------


@pytest.fixture
def db_copy(reach_demo_db: Path, tmp_path: Path) -> Path:
    """A private copy of the session demo database that a test may write to."""
    copy = tmp_path / "reach.sqlite"
    copy.write_bytes(reach_demo_db.read_bytes())
    return copy


def write(db: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(sql, args)
    finally:
        conn.close()


def strict_json(body: bytes) -> Any:
    """Parse ``body`` as RFC 8259 JSON: NaN and Infinity are refused."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


def test_text_that_is_not_utf8_is_served_with_replacement_characters(
    reach_app_factory: Factory, db_copy: Path, busy_repeater: str
) -> None:
    """Names cut mid-character by firmware used to make every report and /api/nodes 500."""
    write(db_copy, "UPDATE nodes SET name = CAST(x'ff41' AS TEXT) WHERE public_key != ?",
          busy_repeater)
    write(db_copy, "UPDATE observers SET name = CAST(x'ff41' AS TEXT)")
    client = reach_app_factory(REACH_DB=str(db_copy)).test_client()
    listing = client.get("/api/nodes?limit=500")
    assert listing.status_code == 200
    assert "\ufffdA" in {n["name"] for n in listing.get_json()["nodes"]}
    report = client.get(f"/api/nodes/{busy_repeater}/reach?days=30")
    assert report.status_code == 200
    names = {e["name"] for e in report.get_json()["direct_observers"] + report.get_json()["links"]}
    assert names == {"\ufffdA"}


def test_hostile_rows_do_not_break_a_report(
    reach_app_factory: Factory, db_copy: Path, busy_repeater: str
) -> None:
    """A deeply nested path (RecursionError), an infinite SNR (NaN average, invalid JSON) and
    latitudes past the pole (haversine's sqrt of a hair below 0) in one database."""
    [(obs_id, path_json)] = query(
        db_copy, "SELECT o.id, o.path_json FROM observations o WHERE o.path_json LIKE ? "
        "AND o.timestamp >= ? ORDER BY o.id LIMIT 1",
        f'%"{busy_repeater[:4].upper()}"%', 1_780_000_000 - 30 * 86_400)
    nested = "[" * 100_000 + json.dumps(json.loads(path_json)[0]) + "]" * 100_000
    write(db_copy, "UPDATE observations SET path_json = ? WHERE id = ?", nested, obs_id)
    write(db_copy, "UPDATE observations SET snr = 9e999")
    write(db_copy, "UPDATE nodes SET lat = 89.97, lon = 180.0")
    write(db_copy, "UPDATE nodes SET lat = 90.03, lon = 0.0 WHERE public_key = ?",
          busy_repeater)
    client = reach_app_factory(REACH_DB=str(db_copy)).test_client()
    response = client.get(f"/api/nodes/{busy_repeater}/reach?days=30")
    assert response.status_code == 200, response.data[:200]
    report = strict_json(response.data)
    assert report["direct_observers"] and report["links"]
    assert all(o["avg_snr"] is None and o["count"] > 0 for o in report["direct_observers"])
    assert all(link["distance_km"] is not None for link in report["links"] if link["lat"])


def test_a_non_finite_number_in_a_report_is_500_and_not_cached(
    reach_client: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Belt and braces: whatever a report holds, the body is strict JSON or a 500."""
    report = {"node": {"pubkey": busy_repeater}, "links": [{"distance_km": float("nan")}]}
    monkeypatch.setattr(webapp.api, "build_report", lambda *a, **k: report)
    url = f"/api/nodes/{busy_repeater}/reach"
    for builds in (1, 2):
        response = reach_client.get(url)
        assert response.status_code == 500
        assert response.get_json() == {"error": "reach computation failed"}
        assert health(reach_client)["builds"] == builds  # never cached


@pytest.mark.parametrize("error", [
    RecursionError("maximum recursion depth exceeded"), ValueError("math domain error"),
    RuntimeError("secret detail at /srv/private/path"),
])
def test_any_build_error_is_the_reach_500_and_is_logged(
    reach_client: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, error: Exception,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(webapp.api, "build_report", broken)
    url = f"/api/nodes/{busy_repeater}/reach"
    with caplog.at_level("ERROR", logger="webapp.api"):
        response = reach_client.get(url)
    assert response.status_code == 500
    assert response.get_json() == {"error": "reach computation failed"}
    assert b"secret" not in response.data and b"Traceback" not in response.data
    [record] = [r for r in caplog.records if r.name == "webapp.api"]
    assert record.exc_info is not None and record.exc_info[1] is error
    figures = health(reach_client)
    assert (figures["builds"], figures["active"]) == (1, 0)
    monkeypatch.undo()
    assert reach_client.get(url).status_code == 200
    assert health(reach_client)["builds"] == 2  # the failure was not cached


# -- the integer parser ----------------------------------------------------------------------


LONG = 100_000


@pytest.mark.parametrize("raw,days", [
    ("0" * LONG + "x", 7), ("0" * LONG + "5", 7), (" " * LONG + "5", 7), ("5" + " " * LONG, 7),
    ("0" * 30 + "12", 12), (" " * 28 + "+012", 12), ("0" * 31 + "12", 7),
])
def test_long_values_are_not_numbers(raw: str, days: int) -> None:
    """More than MAX_INTEGER_TEXT characters is not a number (the days default applies)."""
    assert webapp.api.parse_days(raw) == days


def test_a_long_value_never_reaches_the_regex(monkeypatch: pytest.MonkeyPatch) -> None:
    """The length guard runs first, so the regex's cost is bounded whatever it is."""
    real = webapp.api._INTEGER
    seen: list[int] = []

    class Spy:
        def fullmatch(self, text: str) -> Any:
            seen.append(len(text))
            return real.fullmatch(text)

    monkeypatch.setattr(webapp.api, "_INTEGER", Spy())
    assert webapp.api.parse_days("0" * LONG + "x") == 7
    assert webapp.api.parse_days("0" * LONG + "7") == 7
    assert seen == []
    assert webapp.api.parse_days("007") == 7 and webapp.api.parse_days("0") == 1
    assert seen == [3, 1]


@pytest.mark.parametrize("name", ["limit", "offset"])
def test_a_long_paging_value_is_400(reach_client: Any, name: str) -> None:
    for raw in ("0" * LONG + "x", "0" * LONG + "1"):
        response = reach_client.get("/api/nodes", query_string={name: raw})
        assert response.status_code == 400
        assert response.get_json() == {"error": f"invalid {name}: expected a whole number"}
    assert reach_client.get("/api/nodes", query_string={name: "0" * 20 + "3"}).status_code == 200


# -- a stale node index ----------------------------------------------------------------------


def test_a_target_promoted_since_the_snapshot_gets_a_full_report_and_a_fresh_snapshot(
    reach_app_factory: Factory, db_copy: Path, busy_repeater: str
) -> None:
    [(companion,)] = query(db_copy, "SELECT public_key FROM nodes WHERE role = 'companion' "
                           "ORDER BY public_key LIMIT 1")
    app = reach_app_factory(REACH_DB=str(db_copy))
    client = app.test_client()
    state = reach_state(app)
    assert client.get(f"/api/nodes/{busy_repeater}/reach").status_code == 200
    assert state.index.loads == 1
    write(db_copy, "UPDATE nodes SET role = 'repeater' WHERE public_key = ?", companion)
    report = client.get(f"/api/nodes/{companion}/reach?days=30").get_json()
    assert report["node"]["role"] == "repeater"
    assert report["reliable_tokens"], "built with the stale index: no token, empty report"
    index = state.index.peek()
    assert index is not None and index.nodes[companion].role == "repeater"  # kept
    assert state.index.loads == 2
    assert client.get(f"/api/nodes/{busy_repeater}/reach?days=30").status_code == 200
    assert client.get(f"/api/nodes/{companion}/reach?days=29").status_code == 200
    assert state.index.loads == 2  # not reloaded by every cold build until the next interval


# -- the warm path touches no database -------------------------------------------------------


def test_a_warm_report_is_served_without_the_database(
    reach_app: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached report is served at once, without the limiter. Visibility of a target the node-index
    snapshot knows is decided from the snapshot, so an unusable (locked, gone) database
    does not turn a cached report into a wait and a 500 - and hiding still works."""
    client = reach_app.test_client()
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    warm = client.get(url)
    assert warm.status_code == 200
    name = warm.get_json()["node"]["name"]
    neighbour = warm.get_json()["links"][0]["pubkey"]
    state = reach_state(reach_app)
    unknown = client.get(f"/api/nodes/{UNKNOWN}/reach")

    def unusable() -> sqlite3.Connection:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(state, "connection", unusable)
    again = client.get(url)
    assert again.status_code == 200
    assert (again.data, again.content_type) == (warm.data, warm.content_type)
    cold = client.get(f"/api/nodes/{neighbour}/reach?days=30")  # needs the database
    assert cold.status_code == 500
    assert cold.get_json() == {"error": "reach computation failed"}

    state.visibility.set_hidden_prefixes([name[:4].swapcase()])
    hidden = client.get(url)
    assert hidden.status_code == 404
    assert (hidden.data, hidden.content_type) == (unknown.data, unknown.content_type)
    state.visibility.set_hidden_prefixes([])
    state.visibility.set_blacklist([busy_repeater])
    assert client.get(url).data == unknown.data


def test_a_refused_request_runs_no_database_query(
    reach_app_factory: Factory, busy_repeater: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued and refused requests run no database work, through the HTTP layer: with every
    slot held and no queue, a cold request for a known node is refused without one SQL
    statement or a new connection."""
    import webapp.state

    app = reach_app_factory(REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=0)
    client = app.test_client()
    assert client.get(f"/api/nodes/{busy_repeater}/reach").status_code == 200  # the snapshot
    index = reach_state(app).index.peek()
    assert index is not None
    # Another node whose cold report scans the observations (it has a reliable token).
    other = next(key for key in sorted(index.nodes)
                 if key != busy_repeater and index.reliable_tokens(key))
    statements: list[str] = []
    reach_state(app).connection().set_trace_callback(statements.append)  # this thread's
    opened: list[Any] = []
    real_open = webapp.state.open_readonly
    monkeypatch.setattr(webapp.state, "open_readonly",
                        lambda *a, **k: opened.append(a) or real_open(*a, **k))
    grant = app.extensions["reachlimit"].path.limiter.acquire()
    try:
        refused = client.get(f"/api/nodes/{other}/reach")
        warm = client.get(f"/api/nodes/{busy_repeater}/reach")
    finally:
        grant.release()
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"
    assert warm.status_code == 200
    assert statements == [] and opened == []
    assert client.get(f"/api/nodes/{other}/reach").status_code == 200  # once the slot is free
    assert any("FROM observations" in s for s in statements)  # the trace does see queries


@pytest.mark.parametrize("change", ["rename", "delete"])
def test_a_cold_build_that_finds_its_target_renamed_hidden_or_deleted_repairs_the_snapshot(
    reach_app_factory: Factory, db_copy: Path, busy_repeater: str, change: str
) -> None:
    """The documented window of deciding visibility from the snapshot: a report cached before
    its node was renamed into a hidden prefix (or deleted) in the database is still served
    until the snapshot learns of it. The first cold build for that node reads its row, answers
    404 and refreshes the snapshot, which closes the window for its cached reports too."""
    app = reach_app_factory(REACH_DB=str(db_copy), REACH_HIDDEN_PREFIXES="zz-private")
    client = app.test_client()
    cached = f"/api/nodes/{busy_repeater}/reach?days=30"
    assert client.get(cached).status_code == 200
    unknown = client.get(f"/api/nodes/{UNKNOWN}/reach")
    if change == "rename":
        write(db_copy, "UPDATE nodes SET name = 'ZZ-Private node' WHERE public_key = ?",
              busy_repeater)
    else:
        write(db_copy, "DELETE FROM nodes WHERE public_key = ?", busy_repeater)
    assert client.get(cached).status_code == 200  # warm; the snapshot has not seen it yet
    builds = health(client)["builds"]
    cold = client.get(f"/api/nodes/{busy_repeater}/reach?days=29")
    assert (cold.status_code, cold.data) == (404, unknown.data)
    assert reach_state(app).index.loads == 2
    for url in (cached, f"/api/nodes/{busy_repeater}/reach?days=28"):
        response = client.get(url)
        assert (response.status_code, response.data) == (404, unknown.data)
    assert health(client)["builds"] == builds + 1  # decided before the limiter again
