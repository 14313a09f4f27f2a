"""The demo's mesh: a deterministic synthetic MeshCore network, made in memory.

``DemoMesh(nodes=, seed=, now=)`` makes the nodes and the observers; ``mesh.traffic(n)`` then
makes ``n`` observation rows and the transmissions they belong to. Nothing here touches SQL:
``webapp/demowriter.py`` writes what this module makes into SQLite, and
``webapp/demodb.py`` keeps the service's demo database written and fresh.

design: every random decision is drawn from the stream of the part that makes it. A part's
stream is ``random.Random`` seeded from the seed and the part's name (:func:`stream`), so
adding a draw to one part, or making the parts in another order, never changes what another
part draws. The parts and their streams:

- ``towns``: where the dozen towns lie;
- ``nodes``: each node's role, town, position, name, GPS and pubkey;
- ``collisions``: which relays are made to share a 2- or 3-byte pubkey prefix;
- ``observers``: which nodes are observers, and the stand-alone stations;
- ``seen``: when each node and observer was first and last seen;
- ``traffic`` and ``routes``: each transmission and observation (a new stream pair for every
  :meth:`DemoMesh.traffic`, so the traffic can be made again, identically), and the hop chosen
  at each step of a route.

Nothing iterates a set or depends on hash order. What the mesh looks like to the report:

- nodes clustered around a dozen towns: repeaters, room servers (roles ``room_server`` and a
  few ``room``), companions and sensors; most with GPS, some without, some at (0, 0);
- repeaters link to the others within radio range; other nodes reach the mesh through the
  repeaters near them;
- observers (ids upper-case when written): most are nodes, a few are stand-alone stations
  that are not among the nodes;
- a transmission is heard by one to five observers, each along its own route towards that
  observer through the repeater graph. A path holds the relays' hop hashes, origin to
  observer, all of one size per packet (1, 2 or 3 bytes: 2, 4 or 6 hex chars). With a few
  hundred repeaters the 1-byte hashes collide all the time, and some repeaters are made to
  share a 2-byte or even a 3-byte prefix, so every kind of token and ambiguity occurs;
- ADVERTs (payload_type 4) carry their originator; some other packets do, most do not;
- SNR per observation (about 10 % NULL), a few empty or NULL paths (direct receptions);
- timestamps over the 30 days before ``now``, ids in time order, with traffic growing over
  the month so the last 7 days hold over a third of the rows;
- neighbour edges counted from the adjacent pairs of the generated paths, and each node's
  ADVERT count.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .db import iso_utc
from .meshcore import ADVERT, HOP_HASH_SIZES, is_path_capable

__all__ = [
    "WINDOW_DAYS",
    "DemoMesh",
    "DemoNode",
    "DemoObserver",
    "Traffic",
    "stream",
]

#: The days of traffic before ``now``.
WINDOW_DAYS = 30

_DAY_S = 86_400
_RANGE_KM = 11.0  # radio range between relays, and between a relay and an observer
_MAX_DEPTH = 6  # an observer hears packets at most 7 relays away (the flood dies out)
_GROWTH_START = 0.2  # row density at the window's start, relative to the mean (see _when)

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


def stream(seed: int, part: str) -> random.Random:
    """The random stream of one part of the mesh: seeded from ``seed`` and the part's name
    (through SHA-256, so it is the same on every platform and Python version)."""
    digest = hashlib.sha256(f"webapp.demomesh/{seed}/{part}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


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


# -- nodes and observers ---------------------------------------------------------------------


@dataclass
class DemoNode:
    """One node: what the ``nodes`` table holds, and where it really is."""

    pubkey: str  # 64 lower-case hex chars
    name: str
    role: str
    lat: float | None  # what the node reports
    lon: float | None
    x: float  # true position, km east of the region's south-west corner
    y: float  # km north
    relay: bool  # path-capable
    last_seen: str = ""  # ISO UTC, drawn from the "seen" stream once every node is made
    first_seen: str = ""


@dataclass
class DemoObserver:
    """One receiving station: a node, or a stand-alone station that is not among the nodes."""

    pubkey: str  # 64 lower-case hex chars (``observers.id`` holds it upper-case)
    name: str
    x: float
    y: float
    last_seen: str = ""  # ISO UTC, drawn from the "seen" stream
    first_seen: str = ""


def _make_nodes(seed: int, count: int) -> list[DemoNode]:
    places = stream(seed, "towns")
    towns = [(places.uniform(10, _WIDTH_KM - 10), places.uniform(10, _HEIGHT_KM - 10), name)
             for name in _TOWNS[:12]]
    rng = stream(seed, "nodes")
    nodes: list[DemoNode] = []
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
        nodes.append(DemoNode(pubkey, name, role, lat, lon, x, y, relay=is_path_capable(role)))
    # Prefix collisions beyond the 1-byte ones that happen by themselves: some relays share
    # a 2-byte prefix with another (only their 3-byte token is reliable), a few even a
    # 3-byte prefix (they have no reliable token at all).
    collide = stream(seed, "collisions")
    relays = [n for n in nodes if n.relay]
    for k, node in enumerate(relays[1:], start=1):
        r = collide.random()
        if r < 0.06:
            shared = 4 if r < 0.05 else 6
            node.pubkey = relays[collide.randrange(k)].pubkey[:shared] + node.pubkey[shared:]
    return nodes


def _make_observers(seed: int, nodes: list[DemoNode]) -> list[DemoObserver]:
    """Four in five are nodes (relays and some companions), the rest stand-alone stations
    that are not among the nodes."""
    rng = stream(seed, "observers")
    wanted = max(3, len(nodes) // 40)
    observers: list[DemoObserver] = []
    order = list(range(len(nodes)))
    rng.shuffle(order)
    for i in order:
        if len(observers) >= wanted * 4 // 5:
            break
        node = nodes[i]
        if node.relay or (node.role == "companion" and rng.random() < 0.3):
            observers.append(DemoObserver(node.pubkey, node.name, node.x, node.y))
    while len(observers) < wanted:
        k = len(observers)
        observers.append(DemoObserver(f"{rng.getrandbits(256):064x}",
                                      f"Observer {_TOWNS[k % len(_TOWNS)]} {k}",
                                      rng.uniform(0, _WIDTH_KM), rng.uniform(0, _HEIGHT_KM)))
    return observers


def _draw_seen(seed: int, now: int, nodes: list[DemoNode],
               observers: list[DemoObserver]) -> None:
    """When each node and observer was last and first seen: nodes in the 3 days before
    ``now`` and 30-200 days before it, observers in its last hour and 40-90 days before it."""
    rng = stream(seed, "seen")
    for node in nodes:
        node.last_seen = iso_utc(now - rng.randrange(0, 3 * _DAY_S))
        node.first_seen = iso_utc(now - rng.randrange(30 * _DAY_S, 200 * _DAY_S))
    for observer in observers:
        observer.last_seen = iso_utc(now - rng.randrange(0, 3600))
        observer.first_seen = iso_utc(now - rng.randrange(40 * _DAY_S, 90 * _DAY_S))


# -- the radio graph -------------------------------------------------------------------------


class _Graph:
    """The radio graph of the relays and, for each observer, the routes towards it. Draws
    nothing: a route's hops are chosen from the stream its caller passes."""

    def __init__(self, nodes: list[DemoNode], observers: list[DemoObserver]):
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
        positions = [(o.x, o.y) for o in observers]
        for o, heard in enumerate(_within(pts, positions, _RANGE_KM)):
            # An observer that is itself a relay never appears in the paths it receives.
            own = self.index_of.get(observers[o].pubkey, -1)
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


# -- the mesh --------------------------------------------------------------------------------


class DemoMesh:
    """The nodes and observers of a demo mesh, and the radio graph between them.

    The same ``nodes``, ``seed`` and ``now`` (unix seconds, the end of the traffic's window)
    make the same mesh."""

    def __init__(self, *, nodes: int, seed: int, now: int) -> None:
        if nodes < 10:
            raise ValueError("nodes >= 10")
        self.seed = seed
        self.now = now
        node_list = _make_nodes(seed, nodes)
        if sum(1 for n in node_list if n.relay) < 3:
            raise ValueError("too few path-capable nodes to form a mesh; use more nodes")
        observers = _make_observers(seed, node_list)
        _draw_seen(seed, now, node_list, observers)
        self.nodes: tuple[DemoNode, ...] = tuple(node_list)
        self.observers: tuple[DemoObserver, ...] = tuple(observers)
        self.graph = _Graph(node_list, observers)

    @property
    def repeaters(self) -> int:
        """How many nodes are path-capable."""
        return len(self.graph.relays)

    def traffic(self, observations: int) -> Traffic:
        """The mesh's traffic: ``observations`` observation rows and their transmissions,
        made as they are iterated (each call starts the traffic's streams afresh)."""
        return Traffic(self, observations)


class Traffic:
    """Transmissions and their observations, in time order, made as they are iterated.

    Iterating yields ``(transmission, observations)``: a transmission as the ``transmissions``
    row ``(id, hash, first_seen, route_type, payload_type, payload_version, decoded_json,
    from_pubkey)`` and its observations as ``observations`` rows ``(id, transmission_id,
    observer_idx, direction, snr, rssi, score, path_json, timestamp)``, where
    ``observer_idx`` is the observer's 1-based position in :attr:`DemoMesh.observers`. A
    transmission nobody heard yields nothing. Once iterated, :attr:`edges`,
    :attr:`adverts` and :attr:`transmissions` describe what was made."""

    def __init__(self, mesh: DemoMesh, observations: int) -> None:
        if observations < 1:
            raise ValueError("observations >= 1")
        self.mesh = mesh
        self.total = observations
        graph = mesh.graph
        self.hashes = [[n.pubkey[:chars].upper() for chars in HOP_HASH_SIZES]
                       for n in graph.relays]
        # where each node's packets enter the mesh: a relay's neighbours, else the relays
        # within range of the node (at most six), else the nearest relay
        self.entries: list[list[int]] = []
        near_all = _within(graph.pts, [(n.x, n.y) for n in mesh.nodes], _RANGE_KM)
        for node, near in zip(mesh.nodes, near_all, strict=True):
            if node.relay:
                self.entries.append(list(graph.adj[graph.index_of[node.pubkey]]))
            else:
                self.entries.append([j for j, _km in near][:6]
                                    or _nearest(graph.pts, node.x, node.y, 1))
        #: Adjacent pairs of pubkeys seen in the paths (each pair sorted), and how often.
        self.edges: Counter[tuple[str, str]] = Counter()
        #: ADVERTs sent, per node (in :attr:`DemoMesh.nodes` order).
        self.adverts = [0] * len(mesh.nodes)
        #: Transmissions made so far.
        self.transmissions = 0
        self._started = False

    def _link(self, a: str, b: str) -> None:
        if a != b:
            self.edges[(a, b) if a < b else (b, a)] += 1

    def __iter__(self) -> Iterator[tuple[tuple[object, ...], list[tuple[object, ...]]]]:
        if self._started:
            raise RuntimeError("a Traffic is made once; ask the mesh for another")
        self._started = True
        return self._rows()

    def _rows(self) -> Iterator[tuple[tuple[object, ...], list[tuple[object, ...]]]]:
        rng = stream(self.mesh.seed, "traffic")
        hops = stream(self.mesh.seed, "routes")
        mesh, graph, total = self.mesh, self.mesh.graph, self.total
        relays, nodes, observers = graph.relays, mesh.nodes, mesh.observers
        window = WINDOW_DAYS * _DAY_S
        done = 0
        unheard = 0  # transmissions in a row that nobody heard
        while done < total:
            if unheard > 10_000:
                raise RuntimeError("the generated mesh has no route to any observer")
            # time advances with the rows made, so ids stay in time order
            t = int(mesh.now - window + window * _when((done + rng.random()) / total))
            oi = rng.randrange(len(nodes))
            origin = nodes[oi]
            ptype = _weighted(rng, _TYPES_RELAY if origin.relay else _TYPES_CLIENT)
            carries_origin = ptype == ADVERT or rng.random() < 0.3
            size = _weighted(rng, _HASH_BYTES)
            tx_hash = f"{rng.getrandbits(64):016X}"
            heard_by = 1 + min(4, int(rng.expovariate(1 / 1.5)))
            own = graph.index_of.get(origin.pubkey)
            entries = self.entries[oi]
            rows: list[tuple[object, ...]] = []
            seen: list[int] = []
            for _ in range(min(heard_by, total - done)):
                entry = entries[rng.randrange(len(entries))]
                reach = graph.reachable[entry]
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
                    route = graph.route(hops, entry, o)
                    if own is not None and own in route:
                        continue  # a relay does not repeat its own packet
                    path_json = '["' + '","'.join([self.hashes[j][size - 1] for j in route]) + '"]'
                    for a, b in zip(route, route[1:], strict=False):
                        self._link(relays[a].pubkey, relays[b].pubkey)
                    self._link(relays[route[-1]].pubkey, observers[o].pubkey)
                    if ptype == ADVERT:
                        self._link(origin.pubkey, relays[route[0]].pubkey)
                    hop_km = graph.last_hop_km[o].get(route[-1], _RANGE_KM)
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
