"""The reach report and the node list: the data model, one small hand-built database per rule.

Each test builds its mesh with :class:`Mesh` in ``tmp_path`` using only the columns that
``webapp/README.md`` lists, so the report is checked against those rules rather
than against the demo generator.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.support.mesh import (
    ADVERT,
    DAY,
    NOW,
    TXT,
    Mesh,
    h,
    links_by_key,
    pk,
)
from webapp import db, meshcore
from webapp.meshcore import haversine_km, normalize_pubkey
from webapp.nodelist import list_nodes
from webapp.report import build_report
from webapp.snapshot import DegreeTable
from webapp.visibility import Visibility

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
