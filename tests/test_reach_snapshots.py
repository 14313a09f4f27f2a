"""The reach service's snapshots and the data it must survive: the periodic snapshot, the node
index, hostile rows, and a node index gone stale (refreshed, and for hidden targets).

The meshes are hand-built in ``tmp_path`` as in ``tests/test_reach.py``
(``tests/support/mesh.py``), never taken from the demo generator.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.mesh import (
    NOW,
    Mesh,
    h,
    links_by_key,
    pk,
)
from webapp import db, scan, snapshot
from webapp.meshcore import haversine_km
from webapp.nodelist import list_nodes
from webapp.report import build_report
from webapp.snapshot import DegreeTable, NodeIndex, PeriodicSnapshot
from webapp.visibility import Visibility

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



def report_never_reloading(mesh: Mesh, target: str, why: str) -> Any:
    """The 7-day report of ``target`` on a node index loaded now, whose reload fails the test
    (with ``why`` it was not needed) if the report asks for it."""
    conn = db.open_readonly(mesh.path)
    try:
        index = snapshot.load_node_index(conn)

        def reload(c: sqlite3.Connection) -> NodeIndex:
            raise AssertionError(why)

        return build_report(conn, target, 7, now=NOW, visibility=Visibility(), index=index,
                            reload_index=reload)
    finally:
        conn.close()

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
        assert report_never_reloading(mesh, target, "no reload needed") is not None


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
        assert report_never_reloading(
            mesh, pk("ff"), "the index agrees: the node is in neither"
        ) is None
