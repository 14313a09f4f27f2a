"""A hand-built CoreScope-schema database for the reach tests: :class:`Mesh`, written row by
row in ``tmp_path`` with only the columns ``webapp/README.md`` lists, the ``mesh`` fixture, and
the small helpers the reach test modules share (``pk``, ``h``, ``links_by_key``)."""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from webapp import db
from webapp.report import build_report
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


@pytest.fixture(name="mesh")
def mesh_fixture(tmp_path: Path) -> Mesh:
    return Mesh(tmp_path / "mesh.sqlite")


def links_by_key(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    assert report is not None
    return {link["pubkey"]: link for link in report["links"]}


def h(pubkey: str, size: int = 2) -> str:
    """The hop hash of ``pubkey`` for a ``size``-byte hash."""
    return pubkey[: 2 * size].upper()
