"""webapp: the HTTP contract of the reach service, through Flask's test client.

Most tests run on the session's tiny demo database (``reach_demo_db`` in conftest.py), with
report windows ending at its fixed ``now``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import webapp.api
import webapp.report
from webapp import create_app, reach_state
from webapp.demodb import write_demo_db

Factory = Callable[..., Any]

NOT_FOUND = {"error": "Not found"}
BAD_PUBKEY = {"error": "invalid pubkey: expected 64 hex chars"}
UNKNOWN = "f" * 64  # no demo node has this key


def query(db: Path, sql: str, *args: Any) -> list[Any]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def busy_repeater(reach_demo_db: Path) -> str:
    """A repeater whose 30-day report has links and direct observers."""
    from webapp.db import open_readonly
    from webapp.meshcore import is_path_capable
    from webapp.report import build_report
    from webapp.snapshot import load_node_index
    from webapp.visibility import Visibility

    conn = open_readonly(reach_demo_db)
    try:
        index = load_node_index(conn)
        best, best_links = "", -1
        for key, node in sorted(index.nodes.items()):
            if not is_path_capable(node.role) or not index.reliable_tokens(key):
                continue
            report = build_report(conn, key, 30, now=1_780_000_000,
                                  visibility=Visibility(), index=index)
            assert report is not None
            score = len(report["links"]) if report["direct_observers"] else -1
            if score > best_links:
                best, best_links = key, score
        assert best_links >= 3, "the demo database should have a well-connected repeater"
        return best
    finally:
        conn.close()


def health(client: Any) -> dict[str, Any]:
    response = client.get("/api/health")
    assert response.status_code == 200
    return response.get_json()["reach"]  # type: ignore[no-any-return]


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
        assert key in body["reach"]


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


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


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
    reach_app_factory: Factory, reach_demo_db: Path, busy_repeater: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued and refused requests run no database work, through the HTTP layer: with every
    slot held and no queue, a cold request for a known node is refused without one SQL
    statement or a new connection."""
    import webapp.state

    app = reach_app_factory(REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=0)
    client = app.test_client()
    assert client.get(f"/api/nodes/{busy_repeater}/reach").status_code == 200  # the snapshot
    [(other,)] = query(reach_demo_db, "SELECT public_key FROM nodes WHERE public_key != ? "
                       "ORDER BY public_key LIMIT 1", busy_repeater)
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
