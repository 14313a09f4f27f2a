"""The reach report of one node: who it hears, who hears it, and which observers receive it
directly, as the JSON-ready dict the endpoint serialises.

design:

    build_report(conn, pubkey, days, now=, visibility=, degrees=, index=, reload_index=)
      target row (one primary-key lookup) ........ None when unknown or hidden
      node index checked against the target row .. reloaded when it disagrees (see below)
      reliable tokens (from the node index) ...... none -> empty report, no scan
      the scan (webapp.scan) ..................... only rows whose path names a token
      assembly ................................... hidden identities dropped, sorted, JSON-ready

A build reads its *target* fresh, so "unknown" and "hidden" are decided again on the current
row, and it checks the node index against that row: when the target is missing from the index
(or deleted but still in it), or the index has another name for it or another path capability
(a companion that became a repeater, or back), the index is reloaded - else the target would
get the wrong tokens (a promoted repeater: none, so an empty report that is then cached). The
fresh index goes through ``reload_index`` (the webapp passes its snapshot's
:meth:`~webapp.snapshot.PeriodicSnapshot.refresh`), so it is kept rather than reloaded by
every cold build until the next interval. The endpoint decides visibility *before* the warm
cache from that snapshot alone (see ``webapp.api``), so keeping it current after a build has
seen a rename or a deletion is what closes that window early.

``webapp/README.md`` ("How a report is computed", "Decisions") gives every rule and every
choice made where the rules were silent: unrounded numbers, null positions, non-finite SNRs,
undecodable text, the row cap.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from typing import Any

from .db import NodeInfo, fetch_node, iso_utc
from .meshcore import haversine_km, is_path_capable
from .scan import Tally, scan
from .snapshot import DegreeTable, NodeIndex, load_degrees, load_node_index
from .visibility import Hider

__all__ = ["build_report"]

_DAY_S = 86_400


def _distance(lat1: float | None, lon1: float | None,
              lat2: float | None, lon2: float | None) -> float | None:
    if lat1 is None or lon1 is None or lat2 is None or lon2 is None:
        return None
    return haversine_km(lat1, lon1, lat2, lon2)


def _index_disagrees(index: NodeIndex, pubkey: str, target: NodeInfo | None) -> bool:
    """Whether ``index`` is older than the target's row (None: no row) in a way that matters:
    the target was added or deleted, renamed (its name decides visibility), or has changed
    path capability (so its tokens)."""
    known = index.nodes.get(pubkey)
    if known is None or target is None:
        return known is not target
    return known.name != target.name or is_path_capable(known.role) != is_path_capable(
        target.role
    )


def _mean(total: float, n: float) -> float | None:
    if not n:
        return None
    mean = total / n
    return mean if math.isfinite(mean) else None  # finite SNRs whose sum overflowed


def build_report(
    conn: sqlite3.Connection,
    pubkey: str,
    days: int,
    *,
    now: float,
    visibility: Hider,
    degrees: DegreeTable | None = None,
    index: NodeIndex | None = None,
    reload_index: Callable[[sqlite3.Connection], NodeIndex] | None = None,
) -> dict[str, Any] | None:
    """The reach report of ``pubkey`` over the ``days`` before ``now`` (unix seconds).

    Returns None when the node is unknown or hidden. ``degrees`` and ``index`` default to a
    fresh load from ``conn`` (the webapp passes its once-a-minute snapshots). When ``index``
    disagrees with the target's row (added, deleted, renamed, path capability changed), a
    fresh one is loaded for the report with ``reload_index`` (default
    :func:`load_node_index`). A caller that passes ``reload_index`` keeps what it loads, so
    it is called on a disagreement also when the answer is None: the caller's snapshot then
    stops calling a deleted or newly hidden node visible. Raises ``sqlite3.Error`` when the
    database fails."""
    if days < 1:
        raise ValueError("days >= 1")
    target = fetch_node(conn, pubkey)
    visible = target is not None and not visibility.is_hidden(target.pubkey, target.name)
    if index is not None and (visible or reload_index is not None) and _index_disagrees(
        index, pubkey, target
    ):
        index = (reload_index or load_node_index)(conn)  # a snapshot older than the target
    if target is None or not visible:
        return None
    if index is None:
        index = load_node_index(conn)
    if degrees is None:
        degrees = load_degrees(conn)

    since = math.floor(now) - days * _DAY_S
    tokens = index.reliable_tokens(target.pubkey)
    tally = scan(conn, target.pubkey, tokens, since, index) if tokens else Tally()

    links: list[dict[str, Any]] = []
    for key in sorted(set(tally.we_hear) | set(tally.they_hear)):
        name, role, lat, lon = index.describe(key)
        if visibility.is_hidden(key, name):
            continue
        we, they = tally.we_hear[key], tally.they_hear[key]
        links.append({
            "pubkey": key, "name": name, "role": role, "lat": lat, "lon": lon,
            "we_hear": we, "they_hear": they, "bottleneck": min(we, they),
            "bidir": we > 0 and they > 0,
            "distance_km": _distance(target.lat, target.lon, lat, lon),
        })
    links.sort(key=lambda k: (not k["bidir"], -k["bottleneck"],
                              -(k["we_hear"] + k["they_hear"]), k["pubkey"]))

    observers: list[dict[str, Any]] = []
    for key, (count, snr_sum, snr_n) in tally.direct.items():
        name, _role, lat, lon = index.describe(key)
        if visibility.is_hidden(key, name):
            continue
        observers.append({
            "pubkey": key, "name": name, "count": int(count),
            "avg_snr": _mean(snr_sum, snr_n),
            "lat": lat, "lon": lon,
            "distance_km": _distance(target.lat, target.lon, lat, lon),
        })
    observers.sort(key=lambda o: (-o["count"], o["pubkey"]))

    degree, rank = degrees.importance(target.pubkey)
    return {
        "node": {
            "pubkey": target.pubkey, "name": target.name, "role": target.role,
            "lat": target.lat, "lon": target.lon, "first_seen": target.first_seen,
        },
        "window": {"days": days, "since": iso_utc(since)},
        "reliable_tokens": tokens,
        "importance": {
            "neighbor_degree": degree,
            "degree_rank": rank,
            "nodes_with_edges": degrees.nodes_with_edges,
            "relay_observations": tally.relay_rows,
            "bidirectional_links": sum(1 for k in links if k["bidir"]),
            "direct_observers": len(observers),
        },
        "direct_observers": observers,
        "links": links,
    }
