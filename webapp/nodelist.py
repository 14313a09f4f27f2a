"""The node list: one page of the visible nodes matching a search, for the page's picker."""

from __future__ import annotations

import sqlite3
from typing import Any

from .db import NodeInfo, read_nodes
from .visibility import Hider

__all__ = ["list_nodes"]


def list_nodes(
    conn: sqlite3.Connection,
    *,
    q: str = "",
    limit: int = 50,
    offset: int = 0,
    visibility: Hider,
) -> tuple[list[dict[str, Any]], int]:
    """One page of the visible nodes matching ``q``, and how many match in all.

    ``q`` (trimmed) matches a node when it is a case-insensitive *substring* of its name
    (so "ridge" finds "North Ridge RPT") or a *prefix* of its pubkey (any case). Nodes are
    ordered by name (ignoring case; nameless nodes last), then pubkey, so pages are stable.
    Each node is ``{pubkey, name, role, lat, lon}`` with lat/lon null without GPS.
    """
    needle = q.strip()
    folded = needle.casefold()
    key_prefix = needle.lower()
    matches: list[NodeInfo] = []
    for node in read_nodes(conn):
        if visibility.is_hidden(node.pubkey, node.name):
            continue
        if needle and folded not in node.name.casefold() and not node.pubkey.startswith(
            key_prefix
        ):
            continue
        matches.append(node)
    matches.sort(key=lambda n: (n.name == "", n.name.casefold(), n.pubkey))
    page = matches[offset : offset + limit] if limit > 0 else []
    return [
        {"pubkey": n.pubkey, "name": n.name, "role": n.role, "lat": n.lat, "lon": n.lon}
        for n in page
    ], len(matches)
