"""A deterministic synthetic mesh in the CoreScope schema: the webapp's demo database.

``write_demo_db(path, nodes=, observations=, seed=, now=)`` writes the same content for the
same arguments: one ``random.Random(seed)`` drives everything, and nothing iterates a set or
depends on hash order. The mesh is made to look like a real MeshCore network to the report:

- nodes clustered around a dozen towns: repeaters, room servers (roles ``room_server`` and a
  few ``room``), companions and sensors; most with GPS, some without, some at (0, 0);
- repeaters link to the others within radio range; other nodes reach the mesh through the
  repeaters near them;
- observers (ids upper-case, ``observations.observer_idx = observers.rowid``): most are nodes,
  a few are stand-alone stations that are not in ``nodes``;
- a transmission is heard by one to five observers, each along its own route towards that
  observer through the repeater graph. A path holds the relays' hop hashes, origin to
  observer, all of one size per packet (1, 2 or 3 bytes: 2, 4 or 6 hex chars). With a few
  hundred repeaters the 1-byte hashes collide all the time, and some repeaters are made to
  share a 2-byte or even a 3-byte prefix, so every kind of token and ambiguity occurs;
- ADVERTs (payload_type 4) carry their originator; some other packets do, most do not;
- SNR per observation (about 10 % NULL), a few empty or NULL paths (direct receptions);
- timestamps over the 30 days before ``now``, ids in time order, with traffic growing over
  the month so the last 7 days hold over a third of the rows;
- ``neighbor_edges`` counted from the adjacent pairs of the generated paths, and the index
  ``idx_observations_timestamp`` the reach scan uses.

The file is written under a temporary name next to ``path`` and renamed into place, so a
reader never sees half a database.

Calibration (2-core AMD EPYC VM, warm OS page cache, gunicorn with one worker, 30 random
path-capable nodes, ``python`` timing each GET): the defaults - 1,500 nodes (571
path-capable), 37 observers, 800,000 observations, 431,418 transmissions - write a 111 MB
file in about 13 s. A 7-day window then holds ~300,000 rows and a cold 7-day report takes
0.08-0.17 s (median 0.12 s); a cold 30-day report 0.21-0.52 s (median 0.32 s); a 1-day one
~0.02 s; a warm one 1.2-1.6 ms.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .db import SCHEMA, iso_utc, open_readonly
from .meshcore import ADVERT, HOP_HASH_SIZES, is_path_capable

__all__ = [
    "DEFAULT_NODES",
    "DEFAULT_OBSERVATIONS",
    "DEFAULT_SEED",
    "DemoSummary",
    "demo_now",
    "ensure_demo_db",
    "read_meta",
    "write_demo_db",
]

DEFAULT_NODES = 1_500
#: Sized so a cold 7-day report takes about 0.1 s (see the module docstring).
DEFAULT_OBSERVATIONS = 800_000
DEFAULT_SEED = 1
WINDOW_DAYS = 30

#: Observation rows per executemany batch; progress is reported after each batch.
BATCH = 20_000

_DAY_S = 86_400
_RANGE_KM = 11.0  # radio range between relays, and between a relay and an observer
_MAX_DEPTH = 6  # an observer hears packets at most 7 relays away (the flood dies out)
_GROWTH_START = 0.2  # row density at the window's start, relative to the mean (see _when)

#: The demo's own table, beside the CoreScope ones: how the file was made, so a stale demo
#: database can be rewritten with the same seed and sizes.
_DEMO_META = "CREATE TABLE demo_meta (key TEXT PRIMARY KEY, value TEXT);"

# Built after the rows are in: faster than maintaining them row by row.
_INDEXES = """
CREATE INDEX idx_observations_timestamp ON observations(timestamp);
CREATE INDEX idx_nodes_last_seen ON nodes(last_seen);
"""

_INSERT_TX = "INSERT INTO transmissions VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_OBS = "INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

# MeshCore payload types: REQ 0, RESPONSE 1, TXT_MSG 2, ACK 3, ADVERT 4, GRP_TXT 5, PATH 8.
_TYPES_RELAY = ((4, 45), (8, 20), (1, 15), (3, 10), (0, 10))  # (type, weight)
_TYPES_CLIENT = ((4, 15), (2, 25), (5, 30), (3, 15), (0, 5), (1, 5), (8, 5))
_HASH_BYTES = ((1, 55), (2, 35), (3, 10))  # (bytes per hop hash, weight)

_TOWNS = (
    "Alder", "Brook", "Cairn", "Dunmore", "Elmstead", "Fenwick", "Glenholt", "Harrow",
    "Ivydale", "Kestrel", "Larchmont", "Marsh", "Northby", "Oakridge", "Penhallow",
)
_FIRST = ("Ada", "Bo", "Cleo", "Dax", "Eli", "Fay", "Gus", "Hal", "Ida", "Jo", "Kit", "Lou",
          "Max", "Nia", "Oz", "Pip", "Quin", "Rae", "Sol", "Tess", "Uma", "Vic", "Wes", "Xia",
          "Yves", "Zoe")
_DEVICES = ("T-Deck", "T1000", "Heltec", "RAK", "phone", "WisMesh", "Station")

_LAT0, _LON0 = 51.60, 4.20  # south-west corner of the region
_KM_PER_DEG_LAT = 111.2
_KM_PER_DEG_LON = 111.2 * math.cos(math.radians(52.1))
_WIDTH_KM, _HEIGHT_KM = 140.0, 110.0


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


# -- helpers ---------------------------------------------------------------------------------


def _weighted(rng: random.Random, table: Sequence[tuple[int, int]]) -> int:
    r = rng.random() * sum(w for _, w in table)
    for value, w in table:
        r -= w
        if r < 0:
            return value
    return table[-1][0]


def _when(share: float) -> float:
    """Where in the window (0 = its start, 1 = now) the row at ``share`` of all rows falls.

    The row density rises linearly from _GROWTH_START to 2 - _GROWTH_START times the mean
    (a growing mesh); this inverts its CDF ``a x + b x^2 / 2``."""
    a = _GROWTH_START
    b = 2.0 * (1.0 - a)
    return (-a + math.sqrt(a * a + 2.0 * b * share)) / b


def _within(points: Sequence[tuple[float, float]], targets: Sequence[tuple[float, float]],
            radius: float) -> list[list[tuple[int, float]]]:
    """For each target, ``(index, km)`` of the points within ``radius`` km, nearest first
    (ties by index). A grid of ``radius``-sized cells keeps it linear."""
    grid: dict[tuple[int, int], list[int]] = {}
    for i, (x, y) in enumerate(points):
        grid.setdefault((int(x // radius), int(y // radius)), []).append(i)
    out: list[list[tuple[int, float]]] = []
    for tx, ty in targets:
        cx, cy = int(tx // radius), int(ty // radius)
        found: list[tuple[float, int]] = []
        for gx in (cx - 1, cx, cx + 1):
            for gy in (cy - 1, cy, cy + 1):
                for i in grid.get((gx, gy), ()):
                    d = math.hypot(points[i][0] - tx, points[i][1] - ty)
                    if d <= radius:
                        found.append((d, i))
        found.sort()
        out.append([(i, d) for d, i in found])
    return out


def _nearest(points: Sequence[tuple[float, float]], x: float, y: float, k: int) -> list[int]:
    def key(i: int) -> tuple[float, int]:
        return math.hypot(points[i][0] - x, points[i][1] - y), i

    return sorted(range(len(points)), key=key)[:k]


# -- the mesh --------------------------------------------------------------------------------


@dataclass
class _Node:
    pubkey: str
    name: str
    role: str
    x: float  # true position, km east of the region's south-west corner
    y: float  # km north
    lat: float | None  # what the node reports
    lon: float | None
    relay: bool  # path-capable


def _make_nodes(rng: random.Random, count: int) -> list[_Node]:
    towns = [(rng.uniform(10, _WIDTH_KM - 10), rng.uniform(10, _HEIGHT_KM - 10), name)
             for name in _TOWNS[:12]]
    nodes: list[_Node] = []
    numbers: Counter[str] = Counter()
    for i in range(count):
        r = rng.random()
        role = ("repeater" if r < 0.33 else "room_server" if r < 0.36 else "room" if r < 0.37
                else "companion" if r < 0.93 else "sensor")
        tx, ty, town = towns[rng.randrange(len(towns))]
        if rng.random() < 0.2:  # scattered countryside nodes
            x, y = rng.uniform(0, _WIDTH_KM), rng.uniform(0, _HEIGHT_KM)
        else:
            x = min(max(rng.gauss(tx, 7.0), 0.0), _WIDTH_KM)
            y = min(max(rng.gauss(ty, 7.0), 0.0), _HEIGHT_KM)
        numbers[f"{town}/{role}"] += 1
        n = numbers[f"{town}/{role}"]
        if role == "repeater":
            name = f"{town} RPT {n}"
        elif role in ("room_server", "room"):
            name = f"{town} Room {n}"
        elif role == "sensor":
            name = f"{town} Sensor {n}"
        else:
            name = f"{rng.choice(_FIRST)} {rng.choice(_DEVICES)} {i}"
        if i % 500 == 7:
            name = f"Test {town} {i}"  # a few nodes a "test" hidden prefix would hide
        g = rng.random()
        lat: float | None
        lon: float | None
        if g < 0.80:
            lat = round(_LAT0 + y / _KM_PER_DEG_LAT, 5)
            lon = round(_LON0 + x / _KM_PER_DEG_LON, 5)
        elif g < 0.85:
            lat, lon = 0.0, 0.0  # the firmware's "no fix"
        else:
            lat = lon = None
        pubkey = f"{rng.getrandbits(256):064x}"
        nodes.append(_Node(pubkey, name, role, x, y, lat, lon,
                           relay=is_path_capable(role)))
    # Prefix collisions beyond the 1-byte ones that happen by themselves: some relays share
    # a 2-byte prefix with another (only their 3-byte token is reliable), a few even a
    # 3-byte prefix (they have no reliable token at all).
    relays = [n for n in nodes if n.relay]
    for k, node in enumerate(relays[1:], start=1):
        r = rng.random()
        if r < 0.06:
            shared = 4 if r < 0.05 else 6
            node.pubkey = relays[rng.randrange(k)].pubkey[:shared] + node.pubkey[shared:]
    return nodes


def _make_observers(rng: random.Random, nodes: list[_Node]) -> list[tuple[str, str, float, float]]:
    """``(pubkey, name, x, y)``: four in five are nodes (relays and some companions), the
    rest stand-alone stations that are not in ``nodes``."""
    wanted = max(3, len(nodes) // 40)
    observers: list[tuple[str, str, float, float]] = []
    order = list(range(len(nodes)))
    rng.shuffle(order)
    for i in order:
        if len(observers) >= wanted * 4 // 5:
            break
        node = nodes[i]
        if node.relay or (node.role == "companion" and rng.random() < 0.3):
            observers.append((node.pubkey, node.name, node.x, node.y))
    while len(observers) < wanted:
        k = len(observers)
        observers.append((f"{rng.getrandbits(256):064x}", f"Observer {_TOWNS[k % len(_TOWNS)]} {k}",
                          rng.uniform(0, _WIDTH_KM), rng.uniform(0, _HEIGHT_KM)))
    return observers


class _Mesh:
    """The radio graph of the relays and, for each observer, the routes towards it."""

    def __init__(self, nodes: list[_Node], observers: list[tuple[str, str, float, float]]):
        self.relays = [n for n in nodes if n.relay]
        self.index_of = {n.pubkey: i for i, n in enumerate(self.relays)}
        pts = [(n.x, n.y) for n in self.relays]
        self.pts = pts

        # adjacency: relays within range; an isolated relay still reaches its two nearest
        self.adj: list[list[int]] = []
        for i, near in enumerate(_within(pts, pts, _RANGE_KM)):
            links = [j for j, _km in near if j != i]
            if len(links) < 2:
                links = [j for j in _nearest(pts, pts[i][0], pts[i][1], 3) if j != i][:2]
            self.adj.append(links)
        for i in range(len(self.adj)):  # symmetric, appending in index order
            for j in list(self.adj[i]):
                if i not in self.adj[j]:
                    self.adj[j].append(i)

        # per observer: hops from each relay within _MAX_DEPTH, and the next-hop choices
        self.parents: list[dict[int, tuple[int, ...]]] = []
        self.last_hop_km: list[dict[int, float]] = []
        self.reachable: list[list[int]] = [[] for _ in self.relays]  # relay -> observers
        positions = [(x, y) for _pk, _name, x, y in observers]
        for o, heard in enumerate(_within(pts, positions, _RANGE_KM)):
            # An observer that is itself a relay never appears in the paths it receives.
            own = self.index_of.get(observers[o][0], -1)
            first = [(j, km) for j, km in heard if j != own]
            if not first:
                ox, oy = positions[o]
                j = next(j for j in _nearest(pts, ox, oy, 2) if j != own)
                first = [(j, math.hypot(pts[j][0] - ox, pts[j][1] - oy))]
            depth = {j: 0 for j, _km in first}
            frontier = [j for j, _km in first]
            for d in range(1, _MAX_DEPTH + 1):
                following: list[int] = []
                for j in frontier:
                    for k in self.adj[j]:
                        if k not in depth and k != own:
                            depth[k] = d
                            following.append(k)
                frontier = following
            self.parents.append({
                j: tuple(k for k in self.adj[j] if depth.get(k) == d - 1)
                for j, d in depth.items() if d > 0
            })
            self.last_hop_km.append(dict(first))
            for j in depth:
                self.reachable[j].append(o)  # o ascends, so each list stays sorted

    def route(self, rng: random.Random, entry: int, observer: int) -> list[int]:
        """Relays from ``entry`` to the observer, each one hop nearer than the last."""
        parents = self.parents[observer]
        path = [entry]
        while path[-1] in parents:
            path.append(rng.choice(parents[path[-1]]))
        return path


class _Traffic:
    """Transmissions and their observations, in time order."""

    def __init__(self, rng: random.Random, nodes: list[_Node],
                 observers: list[tuple[str, str, float, float]], now: int) -> None:
        self.rng = rng
        self.nodes = nodes
        self.observers = observers
        self.now = now
        self.mesh = mesh = _Mesh(nodes, observers)
        relays = mesh.relays
        self.hashes = [[n.pubkey[:chars].upper() for chars in HOP_HASH_SIZES] for n in relays]
        # where each node's packets enter the mesh: a relay's neighbours, else the relays
        # within range of the node (at most six), else the nearest relay
        self.entries: list[list[int]] = []
        near_all = _within(mesh.pts, [(n.x, n.y) for n in nodes], _RANGE_KM)
        for node, near in zip(nodes, near_all, strict=True):
            if node.relay:
                self.entries.append(list(mesh.adj[mesh.index_of[node.pubkey]]))
            else:
                self.entries.append([j for j, _km in near][:6]
                                    or _nearest(mesh.pts, node.x, node.y, 1))
        self.edges: Counter[tuple[str, str]] = Counter()
        self.adverts = [0] * len(nodes)
        self.transmissions = 0

    def _link(self, a: str, b: str) -> None:
        if a != b:
            self.edges[(a, b) if a < b else (b, a)] += 1

    def rows(self, total: int) -> Iterator[tuple[tuple[object, ...], list[tuple[object, ...]]]]:
        """Yield ``(transmission row, its observation rows)`` until ``total`` observation
        rows have been made. A transmission nobody heard yields nothing."""
        rng, mesh, relays = self.rng, self.mesh, self.mesh.relays
        window = WINDOW_DAYS * _DAY_S
        done = 0
        unheard = 0  # transmissions in a row that nobody heard
        while done < total:
            if unheard > 10_000:
                raise RuntimeError("the generated mesh has no route to any observer")
            # time advances with the rows made, so ids stay in time order
            t = int(self.now - window + window * _when((done + rng.random()) / total))
            oi = rng.randrange(len(self.nodes))
            origin = self.nodes[oi]
            ptype = _weighted(rng, _TYPES_RELAY if origin.relay else _TYPES_CLIENT)
            carries_origin = ptype == ADVERT or rng.random() < 0.3
            size = _weighted(rng, _HASH_BYTES)
            tx_hash = f"{rng.getrandbits(64):016X}"
            heard_by = 1 + min(4, int(rng.expovariate(1 / 1.5)))
            own = mesh.index_of.get(origin.pubkey)
            entries = self.entries[oi]
            rows: list[tuple[object, ...]] = []
            seen: list[int] = []
            for _ in range(min(heard_by, total - done)):
                entry = entries[rng.randrange(len(entries))]
                reach = mesh.reachable[entry]
                if not reach:
                    continue
                o = reach[rng.randrange(len(reach))]
                if o in seen:
                    continue
                r = rng.random()
                path_json: str | None
                if r < 0.03:  # heard directly: an empty or missing path
                    path_json = None if r < 0.01 else "[]"
                    hop_km = rng.uniform(0.5, _RANGE_KM)
                else:
                    route = mesh.route(rng, entry, o)
                    if own is not None and own in route:
                        continue  # a relay does not repeat its own packet
                    path_json = '["' + '","'.join([self.hashes[j][size - 1] for j in route]) + '"]'
                    for a, b in zip(route, route[1:], strict=False):
                        self._link(relays[a].pubkey, relays[b].pubkey)
                    self._link(relays[route[-1]].pubkey, self.observers[o][0])
                    if ptype == ADVERT:
                        self._link(origin.pubkey, relays[route[0]].pubkey)
                    hop_km = mesh.last_hop_km[o].get(route[-1], _RANGE_KM)
                seen.append(o)
                snr: float | None = None
                if rng.random() >= 0.1:
                    raw = 12.0 - 2.2 * hop_km + rng.gauss(0, 2.5)
                    snr = round(max(-20.0, min(14.0, raw)) * 4) / 4
                rssi = round(-60 - 4.5 * hop_km + rng.gauss(0, 4))
                rows.append((done + len(rows) + 1, self.transmissions + 1, o + 1, "rx", snr,
                             rssi, None, path_json, t + rng.randrange(0, 3)))
            if not rows:
                unheard += 1
                continue
            unheard = 0
            self.transmissions += 1
            if ptype == ADVERT:
                self.adverts[oi] += 1
            done += len(rows)
            # decoded_json stays NULL: the demo carries routes, not payloads
            yield ((self.transmissions, tx_hash, iso_utc(t), 1, ptype, 1, None,
                    origin.pubkey if carries_origin else None), rows)


# -- writing ---------------------------------------------------------------------------------


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
    if nodes < 10:
        raise ValueError("nodes >= 10")
    if observations < 1:
        raise ValueError("observations >= 1")
    started = time.perf_counter()
    now = demo_now() if now is None else int(now)
    rng = random.Random(seed)
    node_list = _make_nodes(rng, nodes)
    if sum(1 for n in node_list if n.relay) < 3:
        raise ValueError("too few path-capable nodes to form a mesh; use more nodes")
    observers = _make_observers(rng, node_list)
    traffic = _Traffic(rng, node_list, observers, now)

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
            conn.executemany(
                "INSERT INTO nodes (public_key, name, role, lat, lon, last_seen, first_seen) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(n.pubkey, n.name, n.role, n.lat, n.lon,
                  iso_utc(now - rng.randrange(0, 3 * _DAY_S)),
                  iso_utc(now - rng.randrange(30 * _DAY_S, 200 * _DAY_S))) for n in node_list],
            )
            conn.executemany(
                "INSERT INTO observers (rowid, id, name, iata, last_seen, first_seen) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(k + 1, key.upper(), name, "DEM", iso_utc(now - rng.randrange(0, 3600)),
                  iso_utc(now - rng.randrange(40 * _DAY_S, 90 * _DAY_S)))
                 for k, (key, name, _x, _y) in enumerate(observers)],
            )

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

        for tx_row, rows in traffic.rows(observations):
            tx_batch.append(tx_row)
            obs_batch.extend(rows)
            if len(obs_batch) >= BATCH:
                flush()
        if obs_batch:
            flush()

        with conn:
            conn.executemany(
                "INSERT INTO neighbor_edges (node_a, node_b, count) VALUES (?, ?, ?)",
                sorted((a, b, c) for (a, b), c in traffic.edges.items()),
            )
            conn.executemany(
                "UPDATE nodes SET advert_count = ? WHERE public_key = ?",
                [(c, node_list[i].pubkey) for i, c in enumerate(traffic.adverts) if c],
            )
        conn.executescript(_INDEXES)
        with conn:
            meta = {"seed": seed, "now": now, "nodes": nodes, "observations": observations,
                    "generator": "webapp.demodb/1"}
            conn.executemany("INSERT INTO demo_meta VALUES (?, ?)",
                             [(k, str(v)) for k, v in meta.items()])
        conn.close()
        os.replace(tmp, target)
    except BaseException:
        conn.close()
        tmp.unlink(missing_ok=True)
        raise
    return DemoSummary(
        path=str(target), seed=seed, now=now, nodes=nodes, repeaters=len(traffic.mesh.relays),
        observers=len(observers), transmissions=traffic.transmissions, observations=written,
        neighbor_edges=len(traffic.edges), seconds=round(time.perf_counter() - started, 2),
    )


# -- the embedded default --------------------------------------------------------------------


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on the lock file ``path``, held for the block."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock; the rename still keeps it safe
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def ensure_demo_db(
    path: str | os.PathLike[str],
    *,
    stale_after: float | None = 86_400.0,
    log: Callable[[str], None] | None = None,
) -> DemoSummary | None:
    """Write the demo database at ``path`` when it is missing, or when it is a demo database
    whose ``now`` is more than ``stale_after`` seconds old (its 7-day window would be running
    empty); a stale one is rewritten with its recorded seed and sizes. Returns what was
    written, or None when the file was fine. A file that is not a demo database is never
    touched.

    Concurrent callers (several processes) serialise on ``<path>.lock``; the second finds
    the database written and returns None."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_name(target.name + ".lock")):
        meta: dict[str, str] = {}
        if target.exists():
            meta = read_meta(target)
            if not meta or stale_after is None:
                return None
            age = demo_now() - int(meta.get("now", "0"))
            if age <= stale_after:
                return None
            reason = f"is {age // _DAY_S} day(s) old"
        else:
            reason = "is missing"
        if log is not None:
            log(f"demo database {target} {reason}; writing it (takes a few seconds)")
        return write_demo_db(
            target,
            nodes=int(meta.get("nodes", DEFAULT_NODES)),
            observations=int(meta.get("observations", DEFAULT_OBSERVATIONS)),
            seed=int(meta.get("seed", DEFAULT_SEED)),
        )
