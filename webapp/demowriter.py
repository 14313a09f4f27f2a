"""The demo database: a demo mesh (``webapp/demomesh.py``) written into SQLite in the CoreScope
schema.

``write_demo_db(path, nodes=, observations=, seed=, now=)`` writes the same content for the
same arguments. The writer makes no random decision of its own: every value it stores comes
from the mesh, so the order of its inserts cannot change the content. Beside the CoreScope
tables (``db.SCHEMA``) it writes the index ``idx_observations_timestamp`` the reach scan uses
and a ``demo_meta`` table recording how the file was made (:func:`read_meta`).

The file is written under a temporary name next to ``path`` and renamed into place, so a
reader never sees half a database.

Calibration (2-core Intel Xeon VM shared with other work, load 1-2, SQLite 3.40, warm OS page
cache; ``benchmarks/reach_cold.py --db`` on 30 random path-capable nodes, three runs): the
defaults - 1,500 nodes (572 path-capable), 37 observers, 800,000 observations, 428,026
transmissions - write a 111 MB file in 12-30 s. A 7-day window then holds ~300,000 rows and a
cold 7-day report takes 0.08-0.22 s (median 0.12-0.13 s); a cold 30-day report 0.22-0.46 s
(median 0.32-0.36 s); a 1-day one ~0.02 s; a warm one about 0.4 ms.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .db import SCHEMA, open_readonly
from .demomesh import DemoMesh

__all__ = [
    "DEFAULT_NODES",
    "DEFAULT_OBSERVATIONS",
    "DEFAULT_SEED",
    "DemoSummary",
    "demo_now",
    "read_meta",
    "write_demo_db",
]

DEFAULT_NODES = 1_500
#: Sized so a cold 7-day report takes about 0.1 s (see the module docstring).
DEFAULT_OBSERVATIONS = 800_000
DEFAULT_SEED = 1

#: Observation rows per executemany batch; progress is reported after each batch.
BATCH = 20_000

#: The demo's own table, beside the CoreScope ones: how the file was made, so a stale demo
#: database can be rewritten with the same seed and sizes.
_DEMO_META = "CREATE TABLE demo_meta (key TEXT PRIMARY KEY, value TEXT);"

#: ``demo_meta``'s ``generator``: which generator wrote the file. /2: every part of the mesh
#: draws from a stream of its own (/1 drew everything from one).
GENERATOR = "webapp.demodb/2"

# Built after the rows are in: faster than maintaining them row by row.
_INDEXES = """
CREATE INDEX idx_observations_timestamp ON observations(timestamp);
CREATE INDEX idx_nodes_last_seen ON nodes(last_seen);
"""

_INSERT_NODE = ("INSERT INTO nodes (public_key, name, role, lat, lon, last_seen, first_seen) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)")
_INSERT_OBSERVER = ("INSERT INTO observers (rowid, id, name, iata, last_seen, first_seen) "
                    "VALUES (?, ?, ?, ?, ?, ?)")
_INSERT_TX = "INSERT INTO transmissions VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_OBS = "INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_EDGE = "INSERT INTO neighbor_edges (node_a, node_b, count) VALUES (?, ?, ?)"
_SET_ADVERTS = "UPDATE nodes SET advert_count = ? WHERE public_key = ?"


@dataclass(frozen=True)
class DemoSummary:
    """What :func:`write_demo_db` wrote."""

    path: str
    seed: int
    now: int
    nodes: int
    repeaters: int  # path-capable nodes
    observers: int
    transmissions: int
    observations: int
    neighbor_edges: int
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def demo_now(at: float | None = None) -> int:
    """The default ``now`` of a demo database: the start of the current hour, so the last
    days hold data right up to the present, and one hour's runs with the same seed and sizes
    write the same content."""
    t = time.time() if at is None else at
    return int(t // 3600) * 3600


def read_meta(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``demo_meta`` of a demo database ({} for a database that is not one)."""
    try:
        conn = open_readonly(path)
    except sqlite3.Error:
        return {}
    try:
        return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM demo_meta")}
    except sqlite3.Error:
        return {}
    finally:
        conn.close()


def write_demo_db(
    path: str | os.PathLike[str],
    *,
    nodes: int = DEFAULT_NODES,
    observations: int = DEFAULT_OBSERVATIONS,
    seed: int = DEFAULT_SEED,
    now: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DemoSummary:
    """Write the demo mesh to ``path`` (replacing any file there) and describe it.

    ``now`` (unix seconds) ends the 30-day window; it defaults to :func:`demo_now`.
    ``progress(done, total)`` is called after every batch of observation rows."""
    started = time.perf_counter()
    now = demo_now() if now is None else int(now)
    mesh = DemoMesh(nodes=nodes, seed=seed, now=now)
    traffic = mesh.traffic(observations)

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    try:
        conn.execute("PRAGMA journal_mode = OFF")  # a throw-away file until the rename
        conn.execute("PRAGMA synchronous = OFF")
        conn.executescript(SCHEMA + _DEMO_META)
        with conn:
            conn.executemany(_INSERT_NODE, [
                (n.pubkey, n.name, n.role, n.lat, n.lon, n.last_seen, n.first_seen)
                for n in mesh.nodes
            ])
            conn.executemany(_INSERT_OBSERVER, [
                (k, o.pubkey.upper(), o.name, "DEM", o.last_seen, o.first_seen)
                for k, o in enumerate(mesh.observers, start=1)
            ])

        written = 0
        tx_batch: list[tuple[object, ...]] = []
        obs_batch: list[tuple[object, ...]] = []

        def flush() -> None:
            nonlocal written
            with conn:
                conn.executemany(_INSERT_TX, tx_batch)
                conn.executemany(_INSERT_OBS, obs_batch)
            written += len(obs_batch)
            tx_batch.clear()
            obs_batch.clear()
            if progress is not None:
                progress(written, observations)

        for tx_row, rows in traffic:
            tx_batch.append(tx_row)
            obs_batch.extend(rows)
            if len(obs_batch) >= BATCH:
                flush()
        if obs_batch:
            flush()

        with conn:
            conn.executemany(_INSERT_EDGE,
                             sorted((a, b, c) for (a, b), c in traffic.edges.items()))
            conn.executemany(_SET_ADVERTS, [(c, mesh.nodes[i].pubkey)
                                            for i, c in enumerate(traffic.adverts) if c])
        conn.executescript(_INDEXES)
        with conn:
            meta = {"seed": seed, "now": now, "nodes": nodes, "observations": observations,
                    "generator": GENERATOR}
            conn.executemany("INSERT INTO demo_meta VALUES (?, ?)",
                             [(k, str(v)) for k, v in meta.items()])
        conn.close()
        os.replace(tmp, target)
    except BaseException:
        conn.close()
        tmp.unlink(missing_ok=True)
        raise
    return DemoSummary(
        path=str(target), seed=seed, now=now, nodes=nodes, repeaters=mesh.repeaters,
        observers=len(mesh.observers), transmissions=traffic.transmissions,
        observations=written, neighbor_edges=len(traffic.edges),
        seconds=round(time.perf_counter() - started, 2),
    )
