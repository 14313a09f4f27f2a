"""The reach report and the node list: the data model, one small hand-built database per rule.

Each test builds its mesh with :class:`Mesh` in ``tmp_path`` using only the columns that
``webapp/README.md`` lists, so the report is checked against those rules rather
than against the demo generator.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.clock import FakeClock
from webapp import db, meshcore, scan, snapshot
from webapp.meshcore import haversine_km, normalize_pubkey
from webapp.nodelist import list_nodes
from webapp.report import build_report
from webapp.snapshot import DegreeTable, NodeIndex, PeriodicSnapshot
from webapp.visibility import Visibility

NOW = 1_780_000_000
DAY = 86_400
ADVERT = 4
TXT = 2

SCHEMA = """
CREATE TABLE nodes(public_key TEXT PRIMARY KEY, name TEXT, role TEXT, lat REAL, lon REAL,
                   last_seen TEXT, first_seen TEXT);
CREATE TABLE observers(id TEXT PRIMARY KEY, name TEXT);
CREATE TABLE transmissions(id INTEGER PRIMARY KEY, from_pubkey TEXT, payload_type INTEGER);
CREATE TABLE observations(id INTEGER PRIMARY KEY, transmission_id INTEGER, observer_idx INTEGER,
                          snr REAL, path_json TEXT, timestamp INTEGER);
CREATE TABLE neighbor_edges(node_a TEXT, node_b TEXT, count INTEGER);
CREATE INDEX idx_observations_timestamp ON observations(timestamp);
"""

_filler = itertools.count(1)


def pk(prefix: str) -> str:
    """A unique lower-case pubkey starting with ``prefix`` (hex)."""
    body = f"{next(_filler):x}".rjust(64 - len(prefix), "0")
    return (prefix + body).lower()


class Mesh:
    """A tiny CoreScope-schema database written row by row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path)
        self.conn.executescript(SCHEMA)
        self.default_observer = self.observer(pk("0b5e"), "Default observer")

    def node(self, pubkey: str, name: str = "", role: str = "repeater",
             lat: float | None = None, lon: float | None = None) -> str:
        self.conn.execute(
            "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?)",
            (pubkey, name, role, lat, lon, "2026-05-01T00:00:00Z", "2026-01-01T00:00:00Z"),
        )
        return pubkey

    def observer(self, pubkey: str, name: str) -> int:
        cur = self.conn.execute("INSERT INTO observers (id, name) VALUES (?, ?)",
                                (pubkey.upper(), name))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def obs(self, path: list[str] | str | None, *, observer: int | None = None,
            snr: float | None = None, ptype: int = TXT, origin: str | None = None,
            ts: int = NOW - 3600) -> None:
        cur = self.conn.execute("INSERT INTO transmissions (from_pubkey, payload_type) "
                                "VALUES (?, ?)", (origin, ptype))
        path_json = json.dumps(path) if isinstance(path, list) else path
        self.conn.execute(
            "INSERT INTO observations (transmission_id, observer_idx, snr, path_json, "
            "timestamp) VALUES (?, ?, ?, ?, ?)",
            (cur.lastrowid, observer if observer is not None else self.default_observer,
             snr, path_json, ts),
        )

    def edge(self, a: str, b: str) -> None:
        self.conn.execute("INSERT INTO neighbor_edges VALUES (?, ?, 1)", (a, b))

    def report(self, target: str, days: int = 7, *,
               visibility: Visibility | None = None) -> dict[str, Any] | None:
        self.conn.commit()
        conn = db.open_readonly(self.path)
        try:
            return build_report(conn, target, days, now=NOW,
                                visibility=visibility or Visibility())
        finally:
            conn.close()


@pytest.fixture
def mesh(tmp_path: Path) -> Mesh:
    return Mesh(tmp_path / "mesh.sqlite")


def links_by_key(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    assert report is not None
    return {link["pubkey"]: link for link in report["links"]}


def h(pubkey: str, size: int = 2) -> str:
    """The hop hash of ``pubkey`` for a ``size``-byte hash."""
    return pubkey[: 2 * size].upper()


# -- pubkeys ---------------------------------------------------------------------------------


class TestNormalizePubkey:
    def test_lower_cases_a_valid_key(self) -> None:
        key = "AbCdEf" + "0" * 58
        assert normalize_pubkey(key) == key.lower()

    @pytest.mark.parametrize("raw", [
        "", "a" * 63, "a" * 65, "g" * 64, " " + "a" * 63, "a" * 63 + "\n",
        "\u0661" * 64,  # Arabic-Indic digit one: str.isdigit() but not hex
        "\uff41" * 64,  # full-width "a"
        "a" * 62 + "-1", "0x" + "a" * 62,
    ])
    def test_rejects_everything_else(self, raw: str) -> None:
        assert normalize_pubkey(raw) is None

    def test_rejects_non_strings(self) -> None:
        assert normalize_pubkey(None) is None
        assert normalize_pubkey(b"a" * 64) is None


# -- tokens ----------------------------------------------------------------------------------


class TestReliableTokens:
    def test_prefixes_only_the_target_has(self, mesh: Mesh) -> None:
        target = mesh.node(pk("ab12cd"))
        mesh.node(pk("ab99"))  # shares the 1-byte prefix
        report = mesh.report(target)
        assert report is not None
        assert report["reliable_tokens"] == ["AB12", "AB12CD"]

    def test_only_path_capable_nodes_compete(self, mesh: Mesh) -> None:
        target = mesh.node(pk("cd34"), role="Room_Server")
        mesh.node(pk("cd"), role="companion")
        mesh.node(pk("cd"), role="sensor")
        report = mesh.report(target)
        assert report is not None
        assert report["reliable_tokens"] == ["CD", "CD34", h(target, 3)]

    @pytest.mark.parametrize("role,capable", [
        ("repeater", True), ("REPEATER", True), ("room_server", True), ("room", True),
        ("Room", True), ("chatroom", False), ("companion", False), ("", False),
    ])
    def test_path_capable_roles(self, role: str, capable: bool) -> None:
        assert meshcore.is_path_capable(role) is capable

    def test_three_byte_token_when_two_bytes_collide(self, mesh: Mesh) -> None:
        target = mesh.node(pk("ab12cd"))
        other = mesh.node(pk("ab12ef"))
        n1, n2 = mesh.node(pk("5101")), mesh.node(pk("5202"))
        mesh.obs([h(n1, 3), "AB12CD", h(n2, 3)])  # 3-byte path: resolvable
        mesh.obs([h(n1), "AB12", h(n2)])  # 2-byte path: AB12 is ambiguous, not ours
        report = mesh.report(target)
        assert report is not None
        assert report["reliable_tokens"] == ["AB12CD"]
        assert report["importance"]["relay_observations"] == 1
        links = links_by_key(report)
        assert links[n1]["we_hear"] == 1 and links[n2]["they_hear"] == 1
        assert other not in links

    def test_companion_target_gets_an_empty_report_without_a_scan(self, mesh: Mesh) -> None:
        target = mesh.node(pk("e0"), name="Phone", role="companion")
        mesh.obs(["E0"])
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        report = build_report(conn, target, 7, now=NOW, visibility=Visibility())
        conn.close()
        assert report is not None
        assert report["reliable_tokens"] == []
        assert report["links"] == [] and report["direct_observers"] == []
        assert report["importance"]["relay_observations"] == 0
        assert not any("FROM observations" in s for s in statements)

    def test_unknown_target_is_none(self, mesh: Mesh) -> None:
        assert mesh.report(pk("ff")) is None


# -- attribution -----------------------------------------------------------------------------


class TestAttribution:
    def test_predecessor_and_successor(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        before, after = mesh.node(pk("b2b2"), "Before"), mesh.node(pk("c3c3"), "After")
        mesh.obs([h(before), h(target), h(after)])
        links = links_by_key(mesh.report(target))
        assert links[before]["we_hear"] == 1 and links[before]["they_hear"] == 0
        assert links[after]["they_hear"] == 1 and links[after]["we_hear"] == 0
        assert links[before]["name"] == "Before" and links[before]["role"] == "repeater"
        assert not links[before]["bidir"] and links[before]["bottleneck"] == 0

    def test_both_directions_make_a_bidirectional_link(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        peer = mesh.node(pk("b2b2"))
        mesh.obs([h(peer), h(target), h(pk("9999"))])
        mesh.obs([h(peer), h(target)])
        mesh.obs([h(target), h(peer)])
        report = mesh.report(target)
        link = links_by_key(report)[peer]
        assert (link["we_hear"], link["they_hear"], link["bottleneck"], link["bidir"]) == (
            2, 1, 1, True)
        assert report is not None and report["importance"]["bidirectional_links"] == 1

    def test_last_hop_credits_the_observer_with_snr_over_non_null_values(
        self, mesh: Mesh
    ) -> None:
        target = mesh.node(pk("a1a1"))
        station = pk("0b5e")
        obs_idx = mesh.observer(station, "Roof station")
        for snr in (5.0, None, 7.0):
            mesh.obs([h(target)], observer=obs_idx, snr=snr)
        report = mesh.report(target)
        assert report is not None
        [direct] = report["direct_observers"]
        assert direct == {"pubkey": station, "name": "Roof station", "count": 3,
                          "avg_snr": 6.0, "lat": None, "lon": None, "distance_km": None}
        link = links_by_key(report)[station]
        assert link["they_hear"] == 3 and link["role"] == "observer"
        assert report["importance"]["direct_observers"] == 1

    def test_all_null_snr_gives_null_average(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        mesh.obs([h(target)], snr=None)
        report = mesh.report(target)
        assert report is not None and report["direct_observers"][0]["avg_snr"] is None

    def test_observer_that_is_a_node_is_described_as_the_node(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), lat=52.0, lon=5.0)
        station = mesh.node(pk("d4d4"), "Hilltop", role="repeater", lat=52.0, lon=5.1)
        idx = mesh.observer(station, "hilltop-observer")
        mesh.obs([h(target)], observer=idx, snr=-3.5)
        report = mesh.report(target)
        assert report is not None
        [direct] = report["direct_observers"]
        assert direct["name"] == "Hilltop" and direct["lat"] == 52.0
        assert direct["distance_km"] == pytest.approx(haversine_km(52.0, 5.0, 52.0, 5.1))
        assert links_by_key(report)[station]["role"] == "repeater"

    def test_advert_first_hop_credits_the_originator(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        origin = mesh.node(pk("e5e5"), "Sender", role="companion")
        mesh.obs([h(target), h(pk("9999"))], ptype=ADVERT, origin=origin.upper())
        links = links_by_key(mesh.report(target))
        assert links[origin]["we_hear"] == 1 and links[origin]["role"] == "companion"

    def test_non_advert_first_hop_credits_nobody(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        origin = mesh.node(pk("e5e5"), role="companion")
        mesh.obs([h(target), h(pk("9999"))], ptype=TXT, origin=origin)
        report = mesh.report(target)
        assert report is not None
        assert report["links"] == []
        assert report["importance"]["relay_observations"] == 1

    def test_ambiguous_hops_are_skipped(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        mesh.node(pk("7777aa"))
        mesh.node(pk("7777bb"))  # two path-capable nodes hash to 7777
        mesh.node(pk("8888"))
        mesh.obs(["7777", h(target), "EEEE"])  # and nobody hashes to EEEE
        report = mesh.report(target)
        assert report is not None
        assert report["links"] == [] and report["importance"]["relay_observations"] == 1

    def test_hop_of_a_companion_prefix_does_not_resolve(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        mesh.node(pk("6666"), role="companion")  # companions do not relay
        mesh.obs(["6666", h(target), "9999"])
        report = mesh.report(target)
        assert report is not None
        assert report["links"] == [] and report["importance"]["relay_observations"] == 1

    def test_target_is_never_its_own_neighbour(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        own_station = mesh.observer(target, "Self observer")
        mesh.obs([h(target), h(target)])  # adjacent to itself
        mesh.obs([h(target)], ptype=ADVERT, origin=target)  # its own advert
        mesh.obs([h(target)], observer=own_station, snr=1.0)  # heard by itself
        report = mesh.report(target)
        assert report is not None
        keys = [link["pubkey"] for link in report["links"]]
        assert target not in keys
        assert target not in [o["pubkey"] for o in report["direct_observers"]]
        assert report["importance"]["relay_observations"] == 3

    def test_relay_observations_count_rows_not_hits(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        mesh.obs([h(target), h(pk("9999")), h(target)])
        report = mesh.report(target)
        assert report is not None and report["importance"]["relay_observations"] == 1

    def test_empty_and_malformed_paths_are_skipped(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        tok = h(target)
        for bad in ("[]", "", None, f'["{tok}"', f'{{"x": "{tok}"}}', f'[["{tok}"], 1]',
                    f'["{tok}", 7]'):
            mesh.obs(bad)
        mesh.obs(f'["{tok.lower()}"]')  # lower-case hops still count (LIKE ignores case)
        report = mesh.report(target)
        assert report is not None and report["importance"]["relay_observations"] == 1

    def test_window_starts_at_now_minus_days(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        since = NOW - 7 * DAY
        mesh.obs([h(target)], ts=since)  # on the boundary: in
        mesh.obs([h(target)], ts=since - 1)  # just before: out
        report = mesh.report(target, 7)
        assert report is not None
        assert report["importance"]["relay_observations"] == 1
        assert report["window"] == {"days": 7, "since": "2026-05-21T20:26:40Z"}
        wide = mesh.report(target, 30)
        assert wide is not None and wide["importance"]["relay_observations"] == 2

    def test_row_cap_truncates_the_scan(self, mesh: Mesh,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
        target = mesh.node(pk("a1a1"))
        for _ in range(5):
            mesh.obs([h(target)])
        monkeypatch.setattr(db, "SCAN_ROW_CAP", 3)
        sql, _params = db.scan_query([h(target)], NOW)
        assert sql.endswith("LIMIT 3")
        report = mesh.report(target)
        assert report is not None and report["importance"]["relay_observations"] == 3

    def test_scan_query_binds_sorted_tokens(self) -> None:
        sql, params = db.scan_query(["AB12CD", "AB", "AB12"], 123)
        assert params == {"since": 123, "tok0": '%"AB"%', "tok1": '%"AB12"%',
                          "tok2": '%"AB12CD"%'}
        assert "o.timestamp >= :since AND (o.path_json LIKE :tok0 OR " in sql
        assert "LEFT JOIN observers obs ON obs.rowid = o.observer_idx" in sql
        assert sql.endswith(f"LIMIT {db.SCAN_ROW_CAP}")


# -- the JSON --------------------------------------------------------------------------------


class TestReportShape:
    def test_exact_keys_and_empty_arrays(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), name="Solo", lat=0.0, lon=0.0)
        report = mesh.report(target)
        assert report == {
            "node": {"pubkey": target, "name": "Solo", "role": "repeater", "lat": None,
                     "lon": None, "first_seen": "2026-01-01T00:00:00Z"},
            "window": {"days": 7, "since": "2026-05-21T20:26:40Z"},
            "reliable_tokens": ["A1", "A1A1", h(target, 3)],
            "importance": {"neighbor_degree": 0, "degree_rank": 0, "nodes_with_edges": 0,
                           "relay_observations": 0, "bidirectional_links": 0,
                           "direct_observers": 0},
            "direct_observers": [],
            "links": [],
        }
        assert json.loads(json.dumps(report)) == report

    def test_link_keys_in_order(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        peer = mesh.node(pk("b2b2"))
        mesh.obs([h(peer), h(target), h(pk("9999"))])
        report = mesh.report(target)
        assert report is not None
        assert list(report["links"][0]) == ["pubkey", "name", "role", "lat", "lon", "we_hear",
                                            "they_hear", "bottleneck", "bidir", "distance_km"]

    def test_links_sorted_with_a_stable_tie_break(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        far = "9999"  # unresolvable hop, so only one side of each row counts
        weak_bidir = mesh.node(pk("b1"))  # we 1, they 1
        strong_bidir = mesh.node(pk("b2"))  # we 2, they 3
        loud = mesh.node(pk("c1"))  # we 5: most traffic, but one-way
        tie_a, tie_b = mesh.node(pk("d1")), mesh.node(pk("d0"))  # we 1 each
        for node, we, they in ((weak_bidir, 1, 1), (strong_bidir, 2, 3), (loud, 5, 0),
                               (tie_a, 1, 0), (tie_b, 1, 0)):
            for _ in range(we):
                mesh.obs([h(node), h(target), far])
            for _ in range(they):
                mesh.obs([far, h(target), h(node)])
        report = mesh.report(target)
        assert report is not None
        assert [link["pubkey"] for link in report["links"]] == [
            strong_bidir, weak_bidir, loud, tie_b, tie_a]

    def test_direct_observers_sorted_by_count_then_pubkey(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        a, b, c = pk("0a"), pk("0b"), pk("0c")
        for key, count in ((a, 1), (c, 2), (b, 1)):
            station = mesh.observer(key, key[:2])
            for _ in range(count):
                mesh.obs([h(target)], observer=station)
        report = mesh.report(target)
        assert report is not None
        assert [o["pubkey"] for o in report["direct_observers"]] == [c, a, b]

    def test_distance_needs_gps_at_both_ends(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), lat=52.0, lon=5.0)
        with_gps = mesh.node(pk("b2b2"), lat=52.1, lon=5.0)
        no_fix = mesh.node(pk("c3c3"), lat=0.0, lon=0.0)
        half = mesh.node(pk("d4d4"), lat=52.1, lon=None)
        for peer in (with_gps, no_fix, half):
            mesh.obs([h(peer), h(target), "9999"])
        links = links_by_key(mesh.report(target))
        assert links[with_gps]["distance_km"] == pytest.approx(11.119, abs=1e-3)
        assert links[no_fix]["distance_km"] is None and links[no_fix]["lat"] is None
        assert links[half]["distance_km"] is None and links[half]["lat"] is None

    def test_haversine_radius(self) -> None:
        assert haversine_km(0, 0, 0, 1) == pytest.approx(math.pi * 6371.0 / 180)
        assert haversine_km(10, 20, 10, 20) == 0.0


# -- importance ------------------------------------------------------------------------------


class TestDegrees:
    def test_degree_rank_and_nodes_with_edges(self, mesh: Mesh) -> None:
        hub, a, b, c = (mesh.node(pk(p)) for p in ("a1a1", "b1", "c1", "d1"))
        for x, y in ((hub, a), (b, hub), (hub, c), (a, b), (c, "e" * 64)):
            mesh.edge(x, y)
        report_hub, report_a = mesh.report(hub), mesh.report(a)
        assert report_hub is not None and report_a is not None
        assert report_hub["importance"]["neighbor_degree"] == 3
        assert report_hub["importance"]["degree_rank"] == 1
        assert report_hub["importance"]["nodes_with_edges"] == 5
        # a, b and c all have degree 2: each is ranked 2 (one node is strictly higher)
        assert report_a["importance"]["neighbor_degree"] == 2
        assert report_a["importance"]["degree_rank"] == 2

    def test_no_edge_means_rank_zero(self) -> None:
        table = DegreeTable.from_edges([("aa", "bb")])
        assert table.importance("cc") == (0, 0)
        assert table.importance("aa") == (1, 1)

    def test_edges_are_case_insensitive_and_self_edges_count_once(self) -> None:
        table = DegreeTable.from_edges([("AA", "bb"), ("aa", "aa")])
        assert table.degree == {"aa": 2, "bb": 1}


# -- visibility ------------------------------------------------------------------------------


class TestVisibility:
    def test_hidden_neighbours_are_left_out(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        shown = mesh.node(pk("b2b2"), "Public")
        banned = mesh.node(pk("c3c3"), "Banned")
        private = mesh.node(pk("d4d4"), "PRIVATE roof")
        station = pk("0e0e")
        private_station = mesh.observer(station, "private station")
        for peer in (shown, banned, private):
            mesh.obs([h(peer), h(target), h(peer)])
        mesh.obs([h(shown), h(target)], observer=private_station)
        vis = Visibility(blacklist=[banned.upper()], hidden_prefixes=["private"])
        report = mesh.report(target, visibility=vis)
        assert report is not None
        assert [link["pubkey"] for link in report["links"]] == [shown]
        assert report["direct_observers"] == []
        assert report["importance"]["bidirectional_links"] == 1
        assert report["importance"]["direct_observers"] == 0
        assert report["importance"]["relay_observations"] == 4

    def test_hidden_target_is_none(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), "Test node")
        assert mesh.report(target, visibility=Visibility(hidden_prefixes=["tEsT"])) is None
        assert mesh.report(target, visibility=Visibility(blacklist=[target])) is None

    def test_generation_moves_only_on_a_change(self) -> None:
        vis = Visibility(blacklist=["a" * 64])
        assert vis.generation == 0
        assert vis.set_blacklist(["A" * 64]) == 0  # same set, other case
        assert vis.set_blacklist(["b" * 64]) == 1
        assert vis.set_hidden_prefixes(["x"]) == 2
        assert vis.set_hidden_prefixes([" X "]) == 2
        assert vis.current.generation == 2

    def test_malformed_blacklist_entry_is_refused(self) -> None:
        with pytest.raises(ValueError, match="not a 64-hex-char pubkey"):
            Visibility(blacklist=["abc"])

    def test_empty_prefix_hides_nothing(self) -> None:
        vis = Visibility(hidden_prefixes=["", "  "])
        assert not vis.is_hidden("a" * 64, "anything")


# -- the node list ---------------------------------------------------------------------------


class TestListNodes:
    def test_paging_search_and_visibility(self, mesh: Mesh) -> None:
        names = ["alpha", "Bravo", "charlie", "Delta ridge", "echo", "", "Hidden one"]
        keys = [mesh.node(pk(f"{i:x}0"), name, role="companion") for i, name in enumerate(names)]
        mesh.node(pk("ff"), "Zulu", lat=0, lon=0)
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        vis = Visibility(blacklist=[keys[4]], hidden_prefixes=["hidden"])
        page, total = list_nodes(conn, limit=3, offset=0, visibility=vis)
        assert total == 6
        assert [n["name"] for n in page] == ["alpha", "Bravo", "charlie"]
        page2, _ = list_nodes(conn, limit=3, offset=3, visibility=vis)
        assert [n["name"] for n in page2] == ["Delta ridge", "Zulu", ""]  # nameless last
        assert page2[1]["lat"] is None  # (0, 0) is no GPS
        found, total = list_nodes(conn, q="RIDGE", visibility=vis)
        assert [n["name"] for n in found] == ["Delta ridge"] and total == 1
        found, _ = list_nodes(conn, q=keys[1][:6].upper(), visibility=vis)
        assert [n["pubkey"] for n in found] == [keys[1]]
        found, total = list_nodes(conn, q="hidden", visibility=vis)
        assert found == [] and total == 0
        assert set(page[0]) == {"pubkey", "name", "role", "lat", "lon"}
        conn.close()


# -- snapshots -------------------------------------------------------------------------------


def held_reload(values: list[str]) -> tuple[PeriodicSnapshot[str], Any]:
    """A snapshot whose first load returns ``values[0]`` and whose second load (the one
    after the interval) is held until the test lets it finish. Returns the snapshot and
    a handle: ``start()`` runs that second load in another thread and returns once it is
    under way; ``finish()`` lets it end and returns what its caller got."""
    clock = FakeClock()
    started, release = threading.Event(), threading.Event()
    loads = iter(values)

    def load(_conn: sqlite3.Connection) -> str:
        value = next(loads)
        if value == values[1]:
            started.set()
            assert release.wait(10)
        return value

    snap = PeriodicSnapshot(load, interval=60, clock=clock)
    assert snap.get(None) == values[0]  # type: ignore[arg-type]
    clock.now += 60
    got: list[str] = []
    reloader = threading.Thread(target=lambda: got.append(snap.get(None)))  # type: ignore[arg-type]

    class Handle:
        @staticmethod
        def start() -> None:
            reloader.start()
            assert started.wait(10)

        @staticmethod
        def finish() -> list[str]:
            release.set()
            reloader.join(10)
            assert not reloader.is_alive()
            return got

    return snap, Handle


class TestPeriodicSnapshot:
    def test_reloads_at_most_once_per_interval(self) -> None:
        clock = FakeClock()
        calls: list[int] = []

        def load(_conn: sqlite3.Connection) -> int:
            calls.append(1)
            return len(calls)

        snap = PeriodicSnapshot(load, interval=60, clock=clock)
        conn: Any = None
        assert snap.get(conn) == 1
        clock.now += 59.9
        assert snap.get(conn) == 1
        clock.now += 0.1
        assert snap.get(conn) == 2
        assert len(calls) == 2

    def test_failed_rebuild_keeps_the_previous_value(self) -> None:
        clock = FakeClock()
        results: list[object] = [DegreeTable(), sqlite3.OperationalError("locked")]
        first = results[0]

        def load(_conn: sqlite3.Connection) -> object:
            value = results.pop(0)
            if isinstance(value, Exception):
                raise value
            return value

        snap: PeriodicSnapshot[object] = PeriodicSnapshot(load, interval=60, clock=clock)
        assert snap.get(None) is first  # type: ignore[arg-type]
        clock.now += 61
        assert snap.get(None) is first  # type: ignore[arg-type]  # failed, still served
        assert snap.failures == 1
        clock.now += 1
        assert snap.get(None) is first  # type: ignore[arg-type]  # no retry before the interval

    def test_failed_first_load_raises_and_the_next_call_retries(self) -> None:
        attempts: list[int] = []

        def load(_conn: sqlite3.Connection) -> str:
            attempts.append(1)
            if len(attempts) == 1:
                raise sqlite3.OperationalError("no such table: neighbor_edges")
            return "ok"

        snap = PeriodicSnapshot(load, interval=60, clock=FakeClock())
        with pytest.raises(sqlite3.OperationalError):
            snap.get(None)  # type: ignore[arg-type]
        assert snap.get(None) == "ok"  # type: ignore[arg-type]

    def test_one_thread_rebuilds_while_the_others_keep_the_old_value(self) -> None:
        snap, reload = held_reload(["old", "new"])
        reload.start()
        # The rebuild is in progress in the other thread: we are not blocked and not
        # made to rebuild (the loader would raise StopIteration on a third call).
        assert snap.get(None) == "old"  # type: ignore[arg-type]
        assert reload.finish() == ["new"]
        assert snap.get(None) == "new"  # type: ignore[arg-type]
        assert snap.loads == 2


def test_node_index_resolves_only_unique_path_capable_prefixes() -> None:
    nodes = [
        db.NodeInfo("ab" + "1" * 62, "", "repeater", None, None, ""),
        db.NodeInfo("ab" + "2" * 62, "", "repeater", None, None, ""),
        db.NodeInfo("cd" + "3" * 62, "", "companion", None, None, ""),
    ]
    index = NodeIndex.build(nodes, [])
    assert index.resolve("AB") is None
    assert index.resolve("AB11") == "ab" + "1" * 62
    assert index.resolve("CD") is None
    assert index.describe("cd" + "3" * 62)[1] == "companion"
    assert index.describe("ee" * 32) == ("", "", None, None)


def test_a_target_newer_than_the_node_index_is_still_reported(mesh: Mesh) -> None:
    old = mesh.node(pk("b2b2"))
    mesh.conn.commit()
    conn = db.open_readonly(mesh.path)
    stale_index = snapshot.load_node_index(conn)  # taken before the target existed
    target = mesh.node(pk("a1a1"))
    mesh.obs([h(old), h(target)])
    mesh.conn.commit()
    report = build_report(conn, target, 7, now=NOW, visibility=Visibility(), index=stale_index)
    conn.close()
    assert report is not None
    assert report["reliable_tokens"] == ["A1", "A1A1", h(target, 3)]
    assert report["importance"]["relay_observations"] == 1


# -- hostile data (review findings) ------------------------------------------------------------


def bad_text(conn: sqlite3.Connection, table: str, column: str, where: str, *args: Any) -> None:
    """Overwrite ``column`` with text that is not valid UTF-8 (``ff 41``: a cut character, "A")."""
    conn.execute(f"UPDATE {table} SET {column} = CAST(x'ff41' AS TEXT) WHERE {where}", args)


class TestHostileData:
    def test_text_that_is_not_utf8_is_replaced_not_fatal(self, mesh: Mesh) -> None:
        """A name cut mid-character by firmware, or a path with a bad byte, used to raise
        ``OperationalError`` out of every read of the table (index, target, scan)."""
        target = mesh.node(pk("a1a1"), "Target")
        peer = mesh.node(pk("b2b2"), "Peer")
        station = pk("0c0c")
        idx = mesh.observer(station, "Station")
        mesh.obs([h(peer), h(target)], observer=idx, snr=4.0)
        tok = h(target)
        mesh.conn.execute(  # matches the scan's LIKE, but is not UTF-8: skipped as malformed
            "INSERT INTO transmissions (id, from_pubkey, payload_type) VALUES (9999, NULL, 2)")
        mesh.conn.execute(
            "INSERT INTO observations (transmission_id, observer_idx, snr, path_json, timestamp)"
            f" VALUES (9999, ?, NULL, CAST(x'5b22{tok.encode().hex()}2220ff5d' AS TEXT), ?)",
            (idx, NOW - 60))
        for table, column, key in (("nodes", "name", target), ("nodes", "name", peer)):
            bad_text(mesh.conn, table, column, "public_key = ?", key)
        bad_text(mesh.conn, "observers", "name", "id = ?", station.upper())
        report = mesh.report(target)
        assert report is not None
        assert report["node"]["name"] == "\ufffdA"
        assert links_by_key(report)[peer]["name"] == "\ufffdA"
        assert [(o["pubkey"], o["name"]) for o in report["direct_observers"]] == [
            (station, "\ufffdA")]
        assert report["importance"]["relay_observations"] == 1  # the bad path is skipped
        conn = db.open_readonly(mesh.path)
        try:
            assert snapshot.load_node_index(conn).nodes[peer].name == "\ufffdA"
            page, total = list_nodes(conn, visibility=Visibility())
            assert total == 2 and {n["name"] for n in page} == {"\ufffdA"}
        finally:
            conn.close()

    def test_a_hidden_prefix_still_applies_to_a_repaired_name(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), "x")
        bad_text(mesh.conn, "nodes", "name", "public_key = ?", target)
        assert mesh.report(target, visibility=Visibility(hidden_prefixes=["\ufffd"])) is None

    def test_deeply_nested_path_is_skipped(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        deep = "[" * 100_000 + f'"{h(target)}"' + "]" * 100_000
        assert scan._parse_path(deep) is None
        mesh.obs(deep)
        mesh.obs([h(target)])
        report = mesh.report(target)
        assert report is not None and report["importance"]["relay_observations"] == 1

    def test_an_infinite_snr_counts_the_observation_but_not_its_snr(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        station = pk("0c0c")
        idx = mesh.observer(station, "Station")
        for snr in (math.inf, -math.inf, 6.0):
            mesh.obs([h(target)], observer=idx, snr=snr)
        mesh.conn.execute("UPDATE observations SET snr = 9e999 WHERE snr = ?", (math.inf,))
        report = mesh.report(target)
        assert report is not None
        [direct] = report["direct_observers"]
        assert (direct["count"], direct["avg_snr"]) == (3, 6.0)
        json.dumps(report, allow_nan=False)  # strict JSON: no NaN / Infinity anywhere

    def test_an_average_that_overflows_is_null(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"))
        for _ in range(2):
            mesh.obs([h(target)], snr=1.5e308)  # each finite; their sum is not
        report = mesh.report(target)
        assert report is not None
        [direct] = report["direct_observers"]
        assert direct["count"] == 2 and direct["avg_snr"] is None
        json.dumps(report, allow_nan=False)

    def test_haversine_survives_latitudes_past_the_pole(self) -> None:
        # a rounds to a hair below 0 here: sqrt() used to raise "math domain error"
        distance = haversine_km(90.03, 0.0, 89.97, 180.0)
        assert math.isfinite(distance) and distance >= 0.0
        assert haversine_km(-200.0, 0.0, 380.0, 180.0) >= 0.0

    def test_a_report_between_out_of_range_latitudes(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), lat=90.03, lon=0.0)
        peer = mesh.node(pk("b2b2"), lat=89.97, lon=180.0)
        mesh.obs([h(peer), h(target)])
        link = links_by_key(mesh.report(target))[peer]
        assert math.isfinite(link["distance_km"])


# -- a stale node index ------------------------------------------------------------------------


class TestStaleIndex:
    @staticmethod
    def report_after_role_change(mesh: Mesh, target: str, role: str) -> dict[str, Any] | None:
        """The target's report built with a node index taken before its role became
        ``role``."""
        conn = db.open_readonly(mesh.path)
        try:
            stale = snapshot.load_node_index(conn)
            mesh.conn.execute("UPDATE nodes SET role = ? WHERE public_key = ?", (role, target))
            mesh.conn.commit()
            return build_report(conn, target, 7, now=NOW, visibility=Visibility(), index=stale)
        finally:
            conn.close()

    def test_a_target_whose_role_changed_gets_a_fresh_index(self, mesh: Mesh) -> None:
        """Taken while the target was a companion, the index gives it no token: the build
        must notice that the row says repeater now (else an empty report is cached)."""
        target = mesh.node(pk("01fa01"), "T", role="companion")
        peer = mesh.node(pk("aa"), "A")
        mesh.obs([h(peer), h(target)])
        mesh.conn.commit()
        report = self.report_after_role_change(mesh, target, "repeater")
        assert report is not None
        assert report["node"]["role"] == "repeater"
        assert report["reliable_tokens"] == ["01", "01FA", "01FA01"]
        assert links_by_key(report)[peer]["we_hear"] == 1

    def test_the_fresh_index_comes_from_reload_index(self, mesh: Mesh) -> None:
        """The webapp passes its snapshot's ``refresh`` so the fresh index is kept."""
        mesh.node(pk("b2b2"))
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        try:
            stale = snapshot.load_node_index(conn)
            target = mesh.node(pk("a1a1"), "New")  # newer than the index
            mesh.conn.commit()
            reloads: list[NodeIndex] = []

            def reload(c: sqlite3.Connection) -> NodeIndex:
                reloads.append(snapshot.load_node_index(c))
                return reloads[-1]

            report = build_report(conn, target, 7, now=NOW, visibility=Visibility(),
                                  index=stale, reload_index=reload)
        finally:
            conn.close()
        assert report is not None and report["reliable_tokens"]
        assert len(reloads) == 1 and reloads[0].nodes[target].name == "New"

    def test_a_demoted_target_gets_a_fresh_index_too(self, mesh: Mesh) -> None:
        target = mesh.node(pk("01fa01"), "T")
        mesh.obs([h(target)])
        mesh.conn.commit()
        report = self.report_after_role_change(mesh, target, "companion")
        assert report is not None and report["reliable_tokens"] == []

    def test_an_index_that_agrees_with_the_target_is_not_reloaded(self, mesh: Mesh) -> None:
        target = mesh.node(pk("a1a1"), "T")
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        try:
            index = snapshot.load_node_index(conn)

            def reload(c: sqlite3.Connection) -> NodeIndex:
                raise AssertionError("no reload needed")

            report = build_report(conn, target, 7, now=NOW, visibility=Visibility(),
                                  index=index, reload_index=reload)
        finally:
            conn.close()
        assert report is not None


class TestSnapshotRefresh:
    def test_refresh_loads_now_and_is_kept_until_the_next_interval(self) -> None:
        clock = FakeClock()
        values = iter(["first", "forced", "periodic"])
        snap = PeriodicSnapshot(lambda _conn: next(values), interval=60, clock=clock)
        assert snap.get(None) == "first"  # type: ignore[arg-type]
        clock.now += 30
        assert snap.refresh(None) == "forced"  # type: ignore[arg-type]
        assert snap.peek() == "forced" and snap.loads == 2
        clock.now += 59  # 89 s after the first load, 59 s after the forced one
        assert snap.get(None) == "forced"  # type: ignore[arg-type]
        clock.now += 1
        assert snap.get(None) == "periodic"  # type: ignore[arg-type]

    def test_a_failed_refresh_raises_and_changes_nothing(self) -> None:
        clock = FakeClock()
        calls: list[int] = []

        def load(_conn: sqlite3.Connection) -> str:
            calls.append(1)
            if len(calls) == 2:
                raise sqlite3.OperationalError("database is locked")
            return f"v{len(calls)}"

        snap = PeriodicSnapshot(load, interval=60, clock=clock)
        assert snap.get(None) == "v1"  # type: ignore[arg-type]
        with pytest.raises(sqlite3.OperationalError):
            snap.refresh(None)  # type: ignore[arg-type]
        assert snap.peek() == "v1" and (snap.loads, snap.failures) == (1, 1)

    def test_a_slower_older_load_does_not_replace_a_newer_refresh(self) -> None:
        """A periodic reload that began before a forced refresh and ends after it must not
        put its older value back."""
        snap, reload = held_reload(["first", "older", "newer"])
        reload.start()
        assert snap.refresh(None) == "newer"  # type: ignore[arg-type]
        assert reload.finish() == ["older"]  # its own caller may use what it loaded
        assert snap.peek() == "newer"


class TestStaleIndexForHiddenTargets:
    """With ``reload_index`` (a caller that keeps the index) a disagreement is repaired even
    when the answer is None, so the caller stops calling the node visible."""

    @pytest.mark.parametrize("change", ["rename", "delete"])
    def test_a_target_renamed_hidden_or_deleted_reloads_the_index(
        self, mesh: Mesh, change: str
    ) -> None:
        target = mesh.node(pk("a1a1"), "Roof")
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        try:
            stale = snapshot.load_node_index(conn)
            if change == "rename":
                mesh.conn.execute("UPDATE nodes SET name = 'ZZ private' WHERE public_key = ?",
                                  (target,))
            else:
                mesh.conn.execute("DELETE FROM nodes WHERE public_key = ?", (target,))
            mesh.conn.commit()
            reloads: list[NodeIndex] = []

            def reload(c: sqlite3.Connection) -> NodeIndex:
                reloads.append(snapshot.load_node_index(c))
                return reloads[-1]

            vis = Visibility(hidden_prefixes=["zz"])
            assert build_report(conn, target, 7, now=NOW, visibility=vis, index=stale,
                                reload_index=reload) is None
            assert len(reloads) == 1
            if change == "rename":
                assert reloads[0].nodes[target].name == "ZZ private"
            else:
                assert target not in reloads[0].nodes
            # Without a caller to keep it, a None answer loads nothing.
            assert build_report(conn, target, 7, now=NOW, visibility=vis, index=stale) is None
        finally:
            conn.close()

    def test_an_unknown_target_missing_from_the_index_reloads_nothing(self, mesh: Mesh) -> None:
        mesh.conn.commit()
        conn = db.open_readonly(mesh.path)
        try:
            index = snapshot.load_node_index(conn)

            def reload(c: sqlite3.Connection) -> NodeIndex:
                raise AssertionError("the index agrees: the node is in neither")

            assert build_report(conn, pk("ff"), 7, now=NOW, visibility=Visibility(),
                                index=index, reload_index=reload) is None
        finally:
            conn.close()
