"""Helpers of the reach service's tests (``tests/test_webapp.py``,
``tests/test_webapp_review.py``, ``tests/test_demodb.py``): the ``busy_repeater`` fixture (a
repeater of the demo database whose 30-day report has links and direct observers), ``query``
(rows from a database file), ``dump`` (a database file as SQL text), ``health`` (the default
budget's figures in ``/api/health``) and the bodies the service answers with."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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


def dump(db: Path) -> list[str]:
    """The SQL text of every table and row of a database file (``iterdump``)."""
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture(scope="module", name="busy_repeater")
def busy_repeater_fixture(reach_demo_db: Path) -> str:
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
    return response.get_json()["default"]  # type: ignore[no-any-return]
