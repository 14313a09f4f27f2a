"""The database: the CoreScope tables the service reads, opening them read-only, checking a
file can be served, and every SQL statement the service runs.

Nothing here knows about Flask or HTTP, and nothing outside this module writes SQL against the
served database. ``webapp/README.md`` ("The data model") describes the tables and columns.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .meshcore import has_gps

__all__ = [
    "BUSY_TIMEOUT_S",
    "SCAN_ROW_CAP",
    "SCHEMA",
    "DatabaseError",
    "NodeInfo",
    "check_database",
    "check_schema",
    "fetch_node",
    "iso_utc",
    "open_readonly",
    "read_edges",
    "read_nodes",
    "read_observers",
    "scan_query",
    "scan_rows",
]

#: The CoreScope ingestor's tables, column for column, as far as the service is concerned;
#: the demo database is written with exactly this. A served database may hold more tables and
#: columns; the service reads only the columns named in the statements below.
SCHEMA = """
CREATE TABLE nodes (
    public_key TEXT PRIMARY KEY,
    name TEXT,
    role TEXT,
    lat REAL,
    lon REAL,
    last_seen TEXT,
    first_seen TEXT,
    advert_count INTEGER DEFAULT 0
);
CREATE TABLE observers (
    id TEXT PRIMARY KEY,
    name TEXT,
    iata TEXT,
    last_seen TEXT,
    first_seen TEXT,
    packet_count INTEGER DEFAULT 0
);
CREATE TABLE transmissions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hash TEXT NOT NULL UNIQUE,
    first_seen TEXT NOT NULL,
    route_type INTEGER,
    payload_type INTEGER,
    payload_version INTEGER,
    decoded_json TEXT,
    from_pubkey TEXT
);
CREATE TABLE observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    transmission_id INTEGER NOT NULL REFERENCES transmissions(id),
    observer_idx INTEGER,
    direction TEXT,
    snr REAL,
    rssi REAL,
    score INTEGER,
    path_json TEXT,
    timestamp INTEGER NOT NULL
);
CREATE TABLE neighbor_edges (
    node_a TEXT NOT NULL,
    node_b TEXT NOT NULL,
    count INTEGER DEFAULT 1,
    PRIMARY KEY (node_a, node_b)
);
"""

#: Most rows one scan reads. A module value, read at call time, so tests can lower it.
SCAN_ROW_CAP = 200_000

#: How long a read waits for a writer (the CoreScope ingestor) to let go of the database.
BUSY_TIMEOUT_S = 5.0

_NODE_COLUMNS = "public_key, name, role, lat, lon, first_seen"


def iso_utc(unix_s: int) -> str:
    """Unix seconds as the database's TEXT timestamps write them: ``2026-06-01T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def open_readonly(
    path: str | os.PathLike[str], *, timeout: float = BUSY_TIMEOUT_S
) -> sqlite3.Connection:
    """Open ``path`` read-only (``file:...?mode=ro``); waits up to ``timeout`` s on a busy db.

    The connection belongs to the calling thread (sqlite3's default check): the webapp keeps
    one per handler thread. A missing file raises ``sqlite3.OperationalError`` rather than
    creating an empty database. TEXT that is not valid UTF-8 is decoded with replacement
    characters (sqlite3's default raises ``OperationalError`` for the whole query)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout)
    conn.text_factory = _decode_text
    conn.execute("PRAGMA query_only = ON")
    return conn


# -- can this file be served? ----------------------------------------------------------------


class DatabaseError(Exception):
    """The configured database cannot be served; the message is one line for an operator."""


def check_schema(conn: sqlite3.Connection) -> None:
    """Raise ``sqlite3.Error`` unless every table and column the webapp reads exists."""
    conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes LIMIT 0").fetchall()
    conn.execute("SELECT id, name FROM observers LIMIT 0").fetchall()
    conn.execute("SELECT node_a, node_b, count FROM neighbor_edges LIMIT 0").fetchall()
    sql, params = scan_query(["00"], 0)
    conn.execute(f"SELECT 1 FROM ({sql}) LIMIT 0", params).fetchall()


def check_database(path: Path) -> None:
    """Raise :class:`DatabaseError` unless ``path`` is a readable CoreScope-schema database."""
    if not path.exists():
        raise DatabaseError(f"no database file at {path}")
    if not path.is_file():
        raise DatabaseError(f"{path} is not a file")
    try:
        conn = open_readonly(path)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {path}: {exc}") from None
    try:
        check_schema(conn)
    except sqlite3.OperationalError as exc:  # no such table / column
        raise DatabaseError(f"{path} is not a CoreScope database ({exc})") from None
    except sqlite3.Error as exc:  # "file is not a database", corruption
        raise DatabaseError(f"cannot read {path}: {exc}") from None
    finally:
        conn.close()


# -- rows ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One ``nodes`` row as reports show it; lat/lon are None without GPS."""

    pubkey: str
    name: str
    role: str
    lat: float | None
    lon: float | None
    first_seen: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> NodeInfo:
        pubkey, name, role, lat, lon, first_seen = row
        gps = has_gps(lat, lon)
        return cls(
            pubkey=str(pubkey).lower(),
            name=str(name) if name is not None else "",
            role=str(role) if role is not None else "",
            lat=float(lat) if gps else None,
            lon=float(lon) if gps else None,
            first_seen=str(first_seen) if first_seen is not None else "",
        )


def fetch_node(conn: sqlite3.Connection, pubkey: str) -> NodeInfo | None:
    """The node with this (lower-case) pubkey: one primary-key lookup."""
    row = conn.execute(
        f"SELECT {_NODE_COLUMNS} FROM nodes WHERE public_key = ?", (pubkey,)
    ).fetchone()
    return NodeInfo.from_row(row) if row is not None else None


def read_nodes(conn: sqlite3.Connection) -> Iterator[NodeInfo]:
    """Every node, in no particular order."""
    for row in conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes"):
        yield NodeInfo.from_row(row)


def read_observers(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """``(lower-case observer id, name)`` of every observer with an id."""
    return [
        (str(oid).lower(), str(name) if name is not None else "")
        for oid, name in conn.execute("SELECT id, name FROM observers")
        if oid
    ]


def read_edges(conn: sqlite3.Connection) -> Iterator[tuple[str, str]]:
    """``(node_a, node_b)`` of every ``neighbor_edges`` row, as stored."""
    yield from conn.execute("SELECT node_a, node_b FROM neighbor_edges")


# -- the scan --------------------------------------------------------------------------------


def scan_query(tokens: Sequence[str], since: int) -> tuple[str, dict[str, Any]]:
    """The cold build's one SELECT and its parameters.

    Tokens are sorted and bound as ``:tok0``, ``:tok1``... so the SQL text depends only on
    their number (and stays in sqlite3's statement cache); the row cap is read from
    :data:`SCAN_ROW_CAP` at call time."""
    ordered = sorted(tokens)
    if not ordered:
        raise ValueError("scan_query needs at least one token")
    cap = int(SCAN_ROW_CAP)
    likes = " OR ".join(f"o.path_json LIKE :tok{i}" for i in range(len(ordered)))
    sql = (
        "SELECT LOWER(COALESCE(obs.id,'')), LOWER(COALESCE(t.from_pubkey,'')), "
        "COALESCE(t.payload_type,0), o.path_json, o.snr "
        "FROM observations o "
        "JOIN transmissions t ON t.id = o.transmission_id "
        "LEFT JOIN observers obs ON obs.rowid = o.observer_idx "
        f"WHERE o.timestamp >= :since AND ({likes}) "
        f"LIMIT {cap}"
    )
    params: dict[str, Any] = {"since": since}
    for i, tok in enumerate(ordered):
        params[f"tok{i}"] = f'%"{tok}"%'
    return sql, params


def scan_rows(conn: sqlite3.Connection, tokens: Sequence[str], since: int) -> sqlite3.Cursor:
    """Run :func:`scan_query`: rows ``(observer, origin, payload_type, path_json, snr)``, the
    observer and origin lower-case ('' when unknown), payload_type 0 when NULL."""
    sql, params = scan_query(tokens, since)
    return conn.execute(sql, params)
