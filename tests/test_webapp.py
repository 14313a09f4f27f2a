"""webapp: the HTTP contract of the reach service, through Flask's test client.

Most tests run on the session's tiny demo database (``reach_demo_db`` in conftest.py), with
report windows ending at its fixed ``now``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import webapp.api
import webapp.report
from tests.support.reach_app import (
    BAD_PUBKEY,
    NOT_FOUND,
    UNKNOWN,
    Factory,
    dump,
    health,
    query,
)
from webapp import create_app, reach_state
from webapp.demodb import write_demo_db

# -- 400 / 404 -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    "abc", "a" * 63, "a" * 65, "g" * 64, "%20" + "a" * 63, "a" * 63 + "%0A",
    "%D9%A1" * 64,  # Arabic-Indic digit one
    "%EF%BD%81" * 64,  # full-width "a"
    "0x" + "a" * 62, "a" * 62 + "..",
])
def test_malformed_pubkey_is_400(reach_client: Any, raw: str) -> None:
    response = reach_client.get(f"/api/nodes/{raw}/reach")
    assert response.status_code == 400
    assert response.get_json() == BAD_PUBKEY
    assert response.content_type == "application/json"


def test_upper_case_pubkey_is_accepted(reach_client: Any, busy_repeater: str) -> None:
    lower = reach_client.get(f"/api/nodes/{busy_repeater}/reach")
    upper = reach_client.get(f"/api/nodes/{busy_repeater.upper()}/reach")
    assert lower.status_code == upper.status_code == 200
    assert lower.data == upper.data


def test_unknown_blacklisted_and_hidden_targets_get_the_same_404(
    reach_app_factory: Factory, reach_demo_db: Path, busy_repeater: str
) -> None:
    [(hidden_key, hidden_name)] = query(
        reach_demo_db, "SELECT public_key, name FROM nodes WHERE role = 'repeater' "
        "AND public_key != ? ORDER BY public_key LIMIT 1", busy_repeater)
    app = reach_app_factory(REACH_BLACKLIST=busy_repeater,
                            REACH_HIDDEN_PREFIXES=hidden_name[:8].swapcase())
    client = app.test_client()
    responses = [client.get(f"/api/nodes/{key}/reach?days=30")
                 for key in (UNKNOWN, busy_repeater, hidden_key)]
    assert [r.status_code for r in responses] == [404, 404, 404]
    assert responses[0].get_json() == NOT_FOUND
    assert len({(r.data, r.content_type) for r in responses}) == 1
    assert health(client)["misses"] == 0  # refused before the cache and the limiter


def test_a_target_hidden_after_its_report_was_cached_is_404(
    reach_app: Any, busy_repeater: str
) -> None:
    client = reach_app.test_client()
    url = f"/api/nodes/{busy_repeater}/reach"
    assert client.get(url).status_code == 200
    assert client.get(url).status_code == 200  # warm
    unknown = client.get(f"/api/nodes/{UNKNOWN}/reach")
    reach_state(reach_app).visibility.set_blacklist([busy_repeater])
    hidden = client.get(url)
    assert hidden.status_code == 404
    assert (hidden.data, hidden.content_type) == (unknown.data, unknown.content_type)


# -- days ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw,days", [
    (None, 7), ("7", 7), ("1", 1), ("30", 30), ("14", 14), ("0", 1), ("-5", 1), ("31", 30),
    ("99999999999999999999999999", 30), ("+3", 3), (" 3 ", 3), ("007", 7),
    ("abc", 7), ("", 7), ("7.5", 7), ("1e3", 7), ("NaN", 7), ("3d", 7), ("٣", 7),
])
def test_days_default_clamp_and_non_numbers(
    reach_client: Any, busy_repeater: str, raw: str | None, days: int
) -> None:
    url = f"/api/nodes/{busy_repeater}/reach"
    response = reach_client.get(url, query_string={} if raw is None else {"days": raw})
    assert response.status_code == 200
    assert response.get_json()["window"]["days"] == days


def test_days_picks_the_window(reach_client: Any, busy_repeater: str) -> None:
    one = reach_client.get(f"/api/nodes/{busy_repeater}/reach?days=1").get_json()
    month = reach_client.get(f"/api/nodes/{busy_repeater}/reach?days=30").get_json()
    assert one["window"]["since"] == "2026-05-27T20:26:40Z"
    assert month["window"]["since"] == "2026-04-28T20:26:40Z"
    assert (month["importance"]["relay_observations"]
            > one["importance"]["relay_observations"])


# -- the warm cache --------------------------------------------------------------------------


def test_a_cache_hit_returns_the_same_body_and_counts_as_a_hit(
    reach_client: Any, busy_repeater: str
) -> None:
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    before = health(reach_client)
    cold = reach_client.get(url)
    after_cold = health(reach_client)
    warm = reach_client.get(url)
    after_warm = health(reach_client)
    assert cold.status_code == warm.status_code == 200
    assert cold.data == warm.data
    assert cold.content_type == warm.content_type == "application/json"
    assert after_cold["builds"] == before["builds"] + 1
    assert after_warm["builds"] == after_cold["builds"]
    assert after_warm["hits"] == after_cold["hits"] + 1
    report = json.loads(warm.data)
    assert report["node"]["pubkey"] == busy_repeater
    assert report["links"] and report["direct_observers"]


def test_days_are_part_of_the_key(reach_client: Any, busy_repeater: str) -> None:
    reach_client.get(f"/api/nodes/{busy_repeater}/reach?days=7")
    builds = health(reach_client)["builds"]
    reach_client.get(f"/api/nodes/{busy_repeater}/reach?days=8")
    reach_client.get(f"/api/nodes/{busy_repeater}/reach?days=abc")  # = 7: a hit
    assert health(reach_client)["builds"] == builds + 1


def test_a_blacklist_change_invalidates_the_cache(reach_app: Any, busy_repeater: str) -> None:
    client = reach_app.test_client()
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    first = client.get(url).get_json()
    neighbour = first["links"][0]["pubkey"]
    assert client.get(url).get_json() == first  # warm
    builds = health(client)["builds"]

    reach_state(reach_app).visibility.set_blacklist([neighbour])
    client.get("/api/health")  # any request empties the cache once the generation moved
    with reach_app.app_context():
        assert len(webapp.api.reach_limit.path.cache) == 0  # type: ignore[arg-type]

    second = client.get(url).get_json()
    assert health(client)["builds"] == builds + 1  # rebuilt under the new generation
    assert neighbour not in [link["pubkey"] for link in second["links"]]
    assert neighbour not in [o["pubkey"] for o in second["direct_observers"]]
    assert client.get(f"/api/nodes/{neighbour}/reach").get_json() == NOT_FOUND


def test_the_generation_is_part_of_the_key(
    reach_app: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a report cached under the old rules and never emptied is not served again (a
    build under the old rules can finish after the cache was emptied)."""
    monkeypatch.setattr(webapp.api.reach_limit, "clear_cache", lambda: None)
    client = reach_app.test_client()
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    neighbour = client.get(url).get_json()["links"][0]["pubkey"]
    builds = health(client)["builds"]
    reach_state(reach_app).visibility.set_blacklist([neighbour])
    again = client.get(url).get_json()
    assert health(client)["builds"] == builds + 1
    assert neighbour not in [link["pubkey"] for link in again["links"]]


# -- failures --------------------------------------------------------------------------------


def test_a_database_failure_is_500_and_not_cached(
    reach_client: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"/api/nodes/{busy_repeater}/reach"
    real_build = webapp.report.build_report

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(webapp.api, "build_report", broken)
    failed = reach_client.get(url)
    assert failed.status_code == 500
    assert failed.get_json() == {"error": "reach computation failed"}
    assert b"locked" not in failed.data and b"Traceback" not in failed.data
    figures = health(reach_client)
    assert (figures["builds"], figures["active"]) == (1, 0)  # ran once, slot given back

    monkeypatch.setattr(webapp.api, "build_report", real_build)
    healed = reach_client.get(url)
    assert healed.status_code == 200
    assert health(reach_client)["builds"] == 2  # the failure was not cached


def test_a_failing_lookup_is_500_too(
    reach_client: Any, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.DatabaseError("file is not a database")

    monkeypatch.setattr(webapp.api, "fetch_node", broken)
    response = reach_client.get(f"/api/nodes/{busy_repeater}/reach")
    assert response.status_code == 500
    assert response.get_json() == {"error": "reach computation failed"}


def test_a_database_that_disappears_gives_json_500(
    reach_app_factory: Factory, reach_demo_db: Path, tmp_path: Path, busy_repeater: str
) -> None:
    copy = tmp_path / "gone.sqlite"
    copy.write_bytes(reach_demo_db.read_bytes())
    app = reach_app_factory(REACH_DB=str(copy))
    copy.unlink()  # gone before any handler thread opened it
    client = app.test_client()
    report = client.get(f"/api/nodes/{busy_repeater}/reach")
    assert report.status_code == 500
    assert report.get_json() == {"error": "reach computation failed"}
    listing = client.get("/api/nodes")
    assert listing.status_code == 500
    assert listing.get_json() == {"error": "database unavailable"}
    assert str(tmp_path).encode() not in report.data + listing.data


def test_refusals_pass_through_untouched(
    reach_app_factory: Factory, reach_demo_db: Path, busy_repeater: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extension's 429 reaches the client as the extension made it."""
    app = reach_app_factory(REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=0)
    started, release = threading.Event(), threading.Event()
    real_build = webapp.report.build_report

    def slow_build(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(10)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(webapp.api, "build_report", slow_build)
    statuses: list[int] = []
    holder = threading.Thread(target=lambda: statuses.append(
        app.test_client().get(f"/api/nodes/{busy_repeater}/reach").status_code))
    holder.start()
    try:
        assert started.wait(10)
        [(other,)] = query(reach_demo_db, "SELECT public_key FROM nodes WHERE public_key != ? "
                           "ORDER BY public_key LIMIT 1", busy_repeater)
        refused = app.test_client().get(f"/api/nodes/{other}/reach")
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "2"
        body = refused.get_json()
        assert body["retryAfter"] == 2 and isinstance(body["error"], str)
    finally:
        release.set()
        holder.join(10)
    assert not holder.is_alive()
    assert statuses == [200]


# -- visibility in other reports and in the list ---------------------------------------------


def test_hidden_neighbours_are_filtered_everywhere(
    reach_app_factory: Factory, busy_repeater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = reach_app_factory().test_client()
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    report = plain.get(url).get_json()
    banned = report["links"][0]
    named = next(link for link in report["links"][1:] if link["name"])
    total = plain.get("/api/nodes").get_json()["total"]

    # from the environment, as an operator would configure it
    monkeypatch.setenv("REACH_BLACKLIST", f" {banned['pubkey'].upper()} ,")
    monkeypatch.setenv("REACH_HIDDEN_PREFIXES", named["name"].upper())
    client = create_app({"REACH_DB": plain.application.config["REACH_DB"],
                         "REACH_WALL_CLOCK": plain.application.config["REACH_WALL_CLOCK"]}
                        ).test_client()
    filtered = client.get(url).get_json()
    shown = {link["pubkey"] for link in filtered["links"]}
    shown |= {o["pubkey"] for o in filtered["direct_observers"]}
    assert banned["pubkey"] not in shown and named["pubkey"] not in shown
    assert len(filtered["links"]) < len(report["links"])

    listing = client.get("/api/nodes?limit=500").get_json()
    listed = {n["pubkey"] for n in listing["nodes"]}
    hidden = {banned["pubkey"], named["pubkey"]} & {
        n["pubkey"] for n in plain.get("/api/nodes?limit=500").get_json()["nodes"]}
    assert hidden and not (hidden & listed)
    assert listing["total"] <= total - len(hidden)
    assert client.get(f"/api/nodes?q={banned['pubkey'][:10]}").get_json()["total"] == 0


# -- /api/nodes ------------------------------------------------------------------------------


def test_nodes_paging(reach_client: Any, reach_demo_db: Path) -> None:
    [(count,)] = query(reach_demo_db, "SELECT COUNT(*) FROM nodes")
    first = reach_client.get("/api/nodes?limit=20").get_json()
    second = reach_client.get("/api/nodes?limit=20&offset=20").get_json()
    assert first["total"] == second["total"] == count
    assert len(first["nodes"]) == len(second["nodes"]) == 20
    assert not {n["pubkey"] for n in first["nodes"]} & {n["pubkey"] for n in second["nodes"]}
    everything = reach_client.get("/api/nodes?limit=500").get_json()["nodes"]
    assert everything[:20] == first["nodes"] and everything[20:40] == second["nodes"]
    assert set(everything[0]) == {"pubkey", "name", "role", "lat", "lon"}
    default = reach_client.get("/api/nodes").get_json()
    assert len(default["nodes"]) == 50 and set(default) == {"nodes", "total"}


@pytest.mark.parametrize("args,expect_len", [
    ("limit=0", 1), ("limit=-4", 1), ("limit=100000", 150), ("limit=", 50),
    ("offset=-10&limit=5", 5), ("offset=100000", 0), ("offset=148&limit=10", 2),
])
def test_nodes_clamps_integers(reach_client: Any, args: str, expect_len: int) -> None:
    response = reach_client.get(f"/api/nodes?{args}")
    assert response.status_code == 200
    assert len(response.get_json()["nodes"]) == expect_len


@pytest.mark.parametrize("args,name", [
    ("limit=abc", "limit"), ("limit=1.5", "limit"), ("offset=x", "offset"),
    ("offset=1e2", "offset"),
])
def test_nodes_rejects_non_integers(reach_client: Any, args: str, name: str) -> None:
    response = reach_client.get(f"/api/nodes?{args}")
    assert response.status_code == 400
    assert response.get_json() == {"error": f"invalid {name}: expected a whole number"}


def test_nodes_search_by_name_or_pubkey_prefix(reach_client: Any, reach_demo_db: Path) -> None:
    [(key, name)] = query(reach_demo_db, "SELECT public_key, name FROM nodes "
                          "WHERE name LIKE '% RPT %' ORDER BY public_key LIMIT 1")
    middle = name.split(" ", 1)[1].lower()  # "rpt 3": a substring, in another case
    by_name = reach_client.get("/api/nodes", query_string={"q": middle.upper()}).get_json()
    assert key in {n["pubkey"] for n in by_name["nodes"]}
    assert all(middle in n["name"].lower() or n["pubkey"].startswith(middle)
               for n in by_name["nodes"])
    by_key = reach_client.get("/api/nodes", query_string={"q": key[:8].upper()}).get_json()
    assert [n["pubkey"] for n in by_key["nodes"]] == [key] and by_key["total"] == 1
    nothing = reach_client.get("/api/nodes?q=zzzz-no-such-node").get_json()
    assert nothing == {"nodes": [], "total": 0}


# -- the rest of the surface -----------------------------------------------------------------


def test_health_reports_the_limiter(reach_client: Any) -> None:
    response = reach_client.get("/api/health")
    body = response.get_json()
    assert body["status"] == "ok"
    for key in ("active", "queued", "capacity_active", "capacity_queue", "hits", "misses",
                "builds", "coalesced", "rejected_full", "rejected_timeout"):
        assert key in body["default"]


def test_errors_are_json(reach_client: Any) -> None:
    missing = reach_client.get("/no/such/page")
    assert missing.status_code == 404 and missing.get_json() == NOT_FOUND
    wrong = reach_client.post("/api/nodes")
    assert wrong.status_code == 405
    assert wrong.get_json() == {"error": "Method not allowed"}
    assert "GET" in wrong.headers["Allow"]


def test_unexpected_errors_are_json_without_a_traceback(
    reach_app_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = reach_app_factory()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail at /srv/private/path")

    monkeypatch.setattr(webapp.api, "list_nodes", boom)
    response = app.test_client().get("/api/nodes")
    assert response.status_code == 500
    assert response.get_json() == {"error": "Internal server error"}
    assert b"secret" not in response.data and b"Traceback" not in response.data


def test_index_serves_the_page_or_a_placeholder(reach_app: Any, tmp_path: Path) -> None:
    client = reach_app.test_client()
    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    reach_app.static_folder = str(tmp_path)  # no index.html there
    placeholder = client.get("/")
    assert placeholder.status_code == 200 and b"/api/nodes" in placeholder.data


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.usefixtures("reach_app_factory")  # it clears the run's own REACH_* environment
def test_reach_db_from_the_environment(
    reach_demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REACH_DB", str(reach_demo_db))
    monkeypatch.setenv("REACHLIMIT_ACTIVE", "3")
    app = create_app()
    assert reach_state(app).db_path == reach_demo_db.resolve()
    with app.app_context():
        assert webapp.api.reach_limit.settings().active == 3


@pytest.mark.parametrize("setup,needle", [
    ("missing", "no database file"),
    ("directory", "is not a file"),
    ("garbage", "file is not a database"),
    ("empty_db", "not a CoreScope database"),
])
def test_a_bad_reach_db_stops_start_up_with_one_line(
    reach_app_factory: Factory, tmp_path: Path, setup: str, needle: str
) -> None:
    path = tmp_path / "db.sqlite"
    if setup == "directory":
        path.mkdir()
    elif setup == "garbage":
        path.write_bytes(b"this is not sqlite" * 100)
    elif setup == "empty_db":
        sqlite3.connect(path).execute("CREATE TABLE unrelated (x)").connection.close()
    with pytest.raises(SystemExit) as exc:
        reach_app_factory(REACH_DB=str(path))
    message = str(exc.value.code)
    assert message.startswith("webapp: REACH_DB:") and needle in message
    assert "\n" not in message


def test_a_malformed_blacklist_stops_start_up(reach_app_factory: Factory) -> None:
    with pytest.raises(SystemExit, match="REACH_BLACKLIST.*'nope' is not a 64-hex-char"):
        reach_app_factory(REACH_BLACKLIST="nope")


def test_a_bad_limiter_setting_stops_start_up(reach_app_factory: Factory) -> None:
    with pytest.raises(SystemExit, match="REACHLIMIT_ACTIVE"):
        reach_app_factory(REACHLIMIT_ACTIVE="lots")


def test_the_default_demo_database_is_written_on_first_use(
    reach_app_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import webapp.demodb
    import webapp.state

    written: list[Path] = []

    def small_demo(path: Any, **kwargs: Any) -> Any:
        written.append(Path(path))
        return write_demo_db(path, nodes=40, observations=300, seed=1, now=1_780_000_000)

    monkeypatch.setattr(webapp.demodb, "write_demo_db", small_demo)
    monkeypatch.setattr(webapp, "DEFAULT_DB", tmp_path / "data" / "demo.sqlite")
    app = reach_app_factory(REACH_DB=None, REACH_DEMO_STALE_AFTER=None)
    assert written == []  # nothing is written just by building the app
    response = app.test_client().get("/api/nodes?limit=1")
    assert response.status_code == 200 and response.get_json()["total"] == 40
    assert written == [tmp_path / "data" / "demo.sqlite"]
    assert webapp.state  # the module that prepares it


# -- the demo database command ---------------------------------------------------------------


def test_demo_db_command_is_deterministic(reach_app: Any, tmp_path: Path) -> None:
    runner = reach_app.test_cli_runner()
    args = ["demo-db", "--nodes", "60", "--observations", "800", "--now", "1780000000", "-q"]
    results = [runner.invoke(args=[*args, "--out", str(tmp_path / name), *extra])
               for name, extra in (("a.sqlite", ["--seed", "5"]), ("b.sqlite", ["--seed", "5"]),
                                   ("c.sqlite", ["--seed", "6"]))]
    for result in results:
        assert result.exit_code == 0, result.output
        assert "800 observations" in result.output
    a, b, c = (dump(tmp_path / name) for name in ("a.sqlite", "b.sqlite", "c.sqlite"))
    assert a == b
    assert a != c


def test_demo_db_content_follows_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "demo.sqlite"
    summary = write_demo_db(path, nodes=200, observations=3_000, seed=2, now=1_780_000_000)
    assert summary.observations == 3_000
    rows = query(path, "SELECT o.path_json, o.snr, o.timestamp, obs.id, t.payload_type, "
                 "t.from_pubkey FROM observations o JOIN transmissions t "
                 "ON t.id = o.transmission_id LEFT JOIN observers obs "
                 "ON obs.rowid = o.observer_idx")
    assert len(rows) == 3_000
    sizes = set()
    for path_json, _snr, ts, observer, _ptype, _origin in rows:
        assert observer is not None and observer == observer.upper()
        assert 1_780_000_000 - 30 * 86_400 <= ts <= 1_780_000_000 + 2
        if path_json:
            hops = json.loads(path_json)
            assert len({len(hop) for hop in hops}) <= 1  # one hash size per packet
            sizes |= {len(hop) for hop in hops}
            assert all(hop == hop.upper() for hop in hops)
    assert sizes == {2, 4, 6}
    assert any(snr is None for _p, snr, *_ in rows) and any(snr is not None for _p, snr, *_ in rows)
    assert {ptype for *_, ptype, _o in rows} >= {4, 2}
    assert all(origin for *_, ptype, origin in rows if ptype == 4)
    assert any(origin is None for *_, ptype, origin in rows if ptype != 4)
    assert query(path, "SELECT COUNT(*) FROM neighbor_edges")[0][0] > 0
    assert query(path, "SELECT name FROM sqlite_master WHERE name = "
                 "'idx_observations_timestamp'") == [("idx_observations_timestamp",)]
    roles = {r for (r,) in query(path, "SELECT DISTINCT role FROM nodes")}
    assert {"repeater", "room_server", "companion"} <= roles
    # some observers are not nodes at all
    assert query(path, "SELECT COUNT(*) FROM observers WHERE LOWER(id) NOT IN "
                 "(SELECT public_key FROM nodes)")[0][0] > 0


def test_ensure_demo_db_writes_missing_and_stale_databases_only(tmp_path: Path) -> None:
    from webapp.demodb import demo_now, ensure_demo_db, read_meta

    path = tmp_path / "demo.sqlite"
    write_demo_db(path, nodes=30, observations=200, seed=4, now=demo_now())
    assert ensure_demo_db(path) is None  # fresh: left alone
    write_demo_db(path, nodes=30, observations=200, seed=4, now=demo_now() - 3 * 86_400)
    messages: list[str] = []
    summary = ensure_demo_db(path, log=messages.append)
    assert summary is not None  # stale: rewritten with its own seed and sizes
    assert (summary.seed, summary.nodes, summary.observations) == (4, 30, 200)
    assert read_meta(path)["now"] == str(summary.now)
    assert summary.now >= demo_now() - 3600  # anchored at this hour (or the one before)
    assert messages and "3 day(s) old" in messages[0]

    foreign = tmp_path / "corescope.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE nodes (public_key TEXT)").connection.close()
    before = foreign.read_bytes()
    assert ensure_demo_db(foreign, stale_after=0) is None  # not a demo database: untouched
    assert foreign.read_bytes() == before
