"""Visibility: a hidden or blacklisted identity never shows through the API.

design: the session's tiny demo database is read once with no rules to find identities that
really do show up in other nodes' reports - the node most often linked (also a direct
observer), a stand-alone observer (not in ``nodes``) that hears packets directly, a repeater
linked from several reports. Each test hides some of them (blacklist, hidden name prefix, at
start-up or at run time) and then reads *everything* the API offers, cold and warm: every
node's report for 7 and 30 days, every page and search of /api/nodes, /api/health, and the
error bodies. "Never appears" is checked on the bytes (full pubkey, either case; the name)
and on the structure (no link or direct observer that the rules hide).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import webapp.api
import webapp.db
import webapp.report
import webapp.snapshot
import webapp.visibility
from webapp import reach_state
from webapp.api import reach_limit

NOW = 1_780_000_000  # conftest.REACH_DEMO_NOW: the session database's "now"
DAYS = (7, 30)
DEADLINE = 15.0
#: Room for every report of the database (150 nodes x 2 windows), so "warm" means warm.
CACHE_SIZE = 1000


@dataclass(frozen=True)
class Mesh:
    """What the unfiltered demo database shows."""

    nodes: list[str]  # every node pubkey
    names: dict[str, str]  # pubkey -> the name a report shows (nodes and observers)
    linked: list[str]  # pubkeys by how many other reports link them, most first
    observer_only: list[str]  # direct observers that are not nodes
    report_of: dict[str, str]  # a linked pubkey -> a node whose 30-day report shows it


@pytest.fixture(scope="module")
def mesh(reach_demo_db: Path) -> Mesh:
    conn = webapp.db.open_readonly(reach_demo_db)
    try:
        index = webapp.snapshot.load_node_index(conn)
        no_rules = webapp.visibility.Visibility()
        linked: Counter[str] = Counter()
        observers: Counter[str] = Counter()
        report_of: dict[str, str] = {}
        for key in sorted(index.nodes):
            report = webapp.report.build_report(conn, key, 30, now=NOW, visibility=no_rules,
                                               index=index)
            assert report is not None
            for entry in report["links"] + report["direct_observers"]:
                report_of.setdefault(entry["pubkey"], key)
            linked.update(entry["pubkey"] for entry in report["links"])
            observers.update(entry["pubkey"] for entry in report["direct_observers"])
        names = {key: index.describe(key)[0] for key in set(index.nodes) | set(index.observers)}
        return Mesh(
            nodes=sorted(index.nodes),
            names=names,
            linked=[key for key, _ in linked.most_common()],
            observer_only=sorted(k for k in observers if k not in index.nodes),
            report_of=report_of,
        )
    finally:
        conn.close()


@pytest.fixture
def db_copy(reach_demo_db: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "reach.sqlite"
    shutil.copyfile(reach_demo_db, copy)
    return copy


def hidden_set(mesh: Mesh, rules: webapp.visibility.VisibilityRules) -> set[str]:
    return {key for key, name in mesh.names.items() if rules.is_hidden(key, name)}


class Reader:
    """Reads everything the API offers and checks none of it shows a hidden identity."""

    def __init__(self, app: Any, mesh: Mesh) -> None:
        self.app = app
        self.client = app.test_client()
        self.mesh = mesh
        unknown = self.client.get(f"/api/nodes/{'f' * 64}/reach")
        assert unknown.status_code == 404
        self.not_found = (unknown.status_code, unknown.content_type, unknown.data)
        self.requests = 0

    @property
    def rules(self) -> webapp.visibility.VisibilityRules:
        return reach_state(self.app).visibility.current

    def check_body(self, body: bytes, hidden: set[str], where: str) -> None:
        visible_names = [n for k, n in self.mesh.names.items() if k not in hidden]
        for key in hidden:
            assert key.encode() not in body and key.upper().encode() not in body, (where, key)
            name = self.mesh.names.get(key, "")
            if name and not any(name in other for other in visible_names):
                assert name.encode() not in body, (where, name)

    def read_all(self) -> dict[str, bytes]:
        """Every report, every node page and search, health; returns the 200 report bodies."""
        rules = self.rules
        hidden = hidden_set(self.mesh, rules)
        bodies: dict[str, bytes] = {}
        for key in self.mesh.nodes:
            for days in DAYS:
                url = f"/api/nodes/{key}/reach?days={days}"
                response = self.client.get(url)
                self.requests += 1
                if key in hidden:
                    assert (response.status_code, response.content_type, response.data) == \
                        self.not_found, (url, "a hidden target must look unknown")
                    continue
                assert response.status_code == 200, (url, response.data[:200])
                self.check_body(response.data, hidden, url)
                report = response.get_json()
                for entry in report["links"] + report["direct_observers"]:
                    assert not rules.is_hidden(entry["pubkey"], entry["name"]), (url, entry)
                bodies[url] = response.data
        listing = self.client.get("/api/nodes?limit=500")
        self.requests += 1
        assert listing.status_code == 200
        self.check_body(listing.data, hidden, "/api/nodes")
        visible_nodes = [k for k in self.mesh.nodes if k not in hidden]
        assert listing.get_json()["total"] == len(visible_nodes)
        assert sorted(n["pubkey"] for n in listing.get_json()["nodes"]) == visible_nodes
        for key in hidden:
            for q in (self.mesh.names.get(key, ""), key[:8], key[:8].upper(), key):
                found = self.client.get("/api/nodes", query_string={"q": q, "limit": 500})
                self.requests += 1
                assert found.status_code == 200
                self.check_body(found.data, hidden, f"/api/nodes?q={q}")
        health = self.client.get("/api/health")
        self.requests += 1
        self.check_body(health.data, hidden, "/api/health")
        return bodies


def _rules_for(mesh: Mesh) -> tuple[list[str], list[str]]:
    """A blacklist (the most linked node) and hidden prefixes (a stand-alone observer's name
    and a linked repeater's full name)."""
    assert mesh.linked and mesh.observer_only, "the demo database should have both"
    blacklisted = mesh.linked[0]
    repeater = next(k for k in mesh.linked[1:] if "RPT" in mesh.names[k])
    return [blacklisted], [mesh.names[mesh.observer_only[0]], mesh.names[repeater].lower()]


def test_hidden_identities_never_appear_cold_or_warm(
    reach_app_factory: Any, mesh: Mesh,
) -> None:
    blacklist, prefixes = _rules_for(mesh)
    app = reach_app_factory(REACH_BLACKLIST=[k.upper() for k in blacklist],
                            REACH_HIDDEN_PREFIXES=prefixes, REACHLIMIT_CACHE_SIZE=CACHE_SIZE)
    reader = Reader(app, mesh)
    hidden = hidden_set(mesh, reader.rules)
    assert set(blacklist) <= hidden and mesh.observer_only[0] in hidden and len(hidden) >= 3
    # The hidden identities really are in the unfiltered reports these requests build.
    assert all(k in mesh.report_of for k in hidden if k in mesh.linked or k in
               mesh.observer_only)
    cold = reader.read_all()
    with app.app_context():
        builds = reach_limit.stats().builds
    warm = reader.read_all()
    with app.app_context():
        stats = reach_limit.stats()
    assert stats.builds == builds, "the second pass should be served from the warm cache"
    assert warm == cold
    print(f"\n[visibility] {len(hidden)} hidden identities, {reader.requests} requests, "
          f"{stats.hits} warm hits")


def test_run_time_rule_changes_reach_cached_reports(reach_app_factory: Any, mesh: Mesh) -> None:
    """Warm every report with no rules; hide (blacklist, then a name prefix) an identity that
    those cached reports show; then lift the rule: it disappears from every answer at once,
    its own cached report is 404, and afterwards every report is byte-identical again."""
    app = reach_app_factory(REACHLIMIT_CACHE_SIZE=CACHE_SIZE)
    reader = Reader(app, mesh)
    original = reader.read_all()
    visibility = reach_state(app).visibility
    linked = mesh.linked[0]
    observer = mesh.observer_only[0]
    assert any(linked.encode() in body for body in original.values())
    assert any(observer.encode() in body for body in original.values())

    visibility.set_blacklist([linked])
    assert linked in hidden_set(mesh, reader.rules)
    reader.read_all()
    visibility.set_blacklist([])
    assert reader.read_all() == original

    visibility.set_hidden_prefixes([mesh.names[observer][:-1]])  # a true prefix of its name
    assert observer in hidden_set(mesh, reader.rules)
    reader.read_all()
    visibility.set_hidden_prefixes([])
    assert reader.read_all() == original


def test_a_rule_change_during_a_build_never_leaks_afterwards(
    reach_app_factory: Any, mesh: Mesh, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A report build that started under the old rules may answer its own request with
    them, but its result is never served to a request that starts after the change."""
    victim = mesh.linked[0]
    target = mesh.report_of[victim]
    url = f"/api/nodes/{target}/reach?days=30"
    app = reach_app_factory()
    go = threading.Event()
    started = threading.Semaphore(0)
    real = webapp.api.build_report

    def held_build(*args: Any, **kwargs: Any) -> Any:
        started.release()
        assert go.wait(DEADLINE)
        return real(*args, **kwargs)

    monkeypatch.setattr(webapp.api, "build_report", held_build)
    results: dict[str, Any] = {}

    def request(name: str) -> None:
        results[name] = app.test_client().get(url)

    before = threading.Thread(target=request, args=("before",), daemon=True)
    after = threading.Thread(target=request, args=("after",), daemon=True)
    before.start()
    assert started.acquire(timeout=DEADLINE)  # built under generation 0
    reach_state(app).visibility.set_blacklist([victim])
    after.start()
    assert started.acquire(timeout=DEADLINE)  # its own build, under generation 1
    go.set()
    for thread in (before, after):
        thread.join(DEADLINE)
        assert not thread.is_alive()
    assert results["before"].status_code == 200  # may show the victim: it started first
    assert results["after"].status_code == 200
    assert victim.encode() not in results["after"].data
    for _ in range(3):
        again = app.test_client().get(url)
        assert again.status_code == 200 and victim.encode() not in again.data
    with app.app_context():
        assert reach_limit.stats().builds == 2  # the old-generation result was never reused


def _rename(db: Path, pubkey: str, name: str) -> None:
    conn = sqlite3.connect(db, timeout=DEADLINE)
    try:
        with conn:
            conn.execute("UPDATE nodes SET name = ? WHERE public_key = ?", (name, pubkey))
    finally:
        conn.close()


def test_a_node_renamed_into_a_hidden_prefix_leaves_the_list_and_fresh_reports_at_once(
    reach_app_factory: Any, mesh: Mesh, db_copy: Path,
) -> None:
    """A rename in the database (no rule change): every answer computed after it - the node
    list, a search, a report of the node built after it - already hides the node."""
    victim = next(k for k in mesh.linked if k in mesh.nodes)
    app = reach_app_factory(REACH_DB=str(db_copy), REACH_HIDDEN_PREFIXES=["zz-private"])
    client = app.test_client()
    assert client.get(f"/api/nodes/{victim}/reach?days=30").status_code == 200
    _rename(db_copy, victim, "ZZ-Private node")
    assert client.get(f"/api/nodes/{victim}/reach?days=29").status_code == 404  # a new build
    listing = client.get("/api/nodes?limit=500")
    assert victim.encode() not in listing.data
    found = client.get("/api/nodes", query_string={"q": victim[:10]})
    assert victim.encode() not in found.data


@pytest.mark.xfail(strict=True, reason=(
    "a node renamed in the database into a hidden prefix (no rule change, so no new cache "
    "generation) still shows in answers computed before the rename or from the node-index "
    "snapshot: cached reports - other nodes', and with the snapshot-based target check its "
    "own - until they expire (5 min) or a cold build refreshes the snapshot, other nodes' "
    "fresh reports until the snapshot is rebuilt (up to 60 s)"))
def test_a_node_renamed_into_a_hidden_prefix_leaves_every_answer_at_once(
    reach_app_factory: Any, mesh: Mesh, db_copy: Path,
) -> None:
    victim = next(k for k in mesh.linked if k in mesh.nodes)
    target = mesh.report_of[victim]
    app = reach_app_factory(REACH_DB=str(db_copy), REACH_HIDDEN_PREFIXES=["zz-private"])
    client = app.test_client()
    own = f"/api/nodes/{victim}/reach?days=30"
    warm = f"/api/nodes/{target}/reach?days=30"
    cold = f"/api/nodes/{target}/reach?days=29"
    assert client.get(own).status_code == 200  # cached
    assert victim.encode() in client.get(warm).data  # cached, showing the victim
    _rename(db_copy, victim, "ZZ-Private node")
    failures = []
    if client.get(own).status_code != 404:
        failures.append("its own cached report is still served")
    if victim.encode() in client.get(warm).data:
        failures.append("another node's cached report shows it")
    if victim.encode() in client.get(cold).data:
        failures.append("another node's fresh report shows it")
    assert not failures, failures
