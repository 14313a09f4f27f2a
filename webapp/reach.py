"""The reach report: who a mesh node hears, who hears it, and which observers receive it directly.

This is the data layer of the webapp. It knows SQLite and the CoreScope schema, and nothing
about Flask or HTTP. ``shared/reach-reference.md`` is the contract; the decisions below are the
ones it leaves open.

design:

    build_report(conn, pubkey, days, now=, visibility=, degrees=, index=, reload_index=)
      target row (one primary-key lookup) ........ None when unknown or hidden
      node index checked against the target row .. reloaded when it disagrees (see below)
      reliable tokens (from the node index) ...... none -> empty report, no scan
      the scan (one SELECT, LIMIT SCAN_ROW_CAP) .. only rows whose path names a token
      attribution, per row, in Python ........... predecessor / successor / direct observer
      assembly ................................... hidden identities dropped, sorted, JSON-ready

Two inputs change slowly and are shared by every report, so the webapp keeps them in
:class:`PeriodicSnapshot` holders rebuilt at most once a minute, outside every request lock:

- :class:`DegreeTable` - the ``neighbor_edges`` degree and rank of every node;
- :class:`NodeIndex` - every node's name, role and GPS, the prefix map of path-capable nodes
  used to resolve hop hashes, and the observers' names.

The webapp refreshes them from inside a cold build: the first build that finds one due
reloads it on its own connection (inside its build slot, under no lock); concurrent builds
keep using the old one meanwhile. Consequence of the node index being a snapshot: a node
that first appears (or is renamed) is seen in *other* nodes' reports up to a minute later.

A build reads its *target* fresh, so "unknown" and "hidden" are decided again on the current
row when a report is built, and it checks the node index against that row: when the target is
missing from the index (or deleted but still in it), or the index has another name for it or
another path capability (a companion that became a repeater, or back), the index is reloaded -
else the target would get the wrong tokens (a promoted repeater: none, so an empty report that
is then cached). The fresh index goes through ``reload_index`` (the webapp passes its
snapshot's :meth:`PeriodicSnapshot.refresh`), so it is kept rather than reloaded by every
cold build until the next interval. The webapp decides visibility *before* the warm cache
from that snapshot alone (see ``webapp.api``), so keeping it current after a build has seen
a rename or a deletion is what closes that window early.

Decisions where the reference is silent:

- Numbers are reported unrounded (``avg_snr``, ``distance_km``); the page formats them.
- ``lat``/``lon`` are ``null`` whenever the node has no GPS by the reference's rule (both
  present and not both 0), so a (0, 0) position is never shown.
- An identity is hidden when its pubkey is blacklisted or when the name a report would show
  for it (``nodes.name``, else ``observers.name`` for an observer that is not a node) starts
  with a hidden prefix. Counts in ``importance`` that describe the arrays
  (``bidirectional_links``, ``direct_observers``) are taken after hidden identities are
  dropped, so they never reveal one; ``relay_observations`` counts rows and is unaffected.
- ``neighbor_degree`` and ``degree_rank`` rank every node with an edge, hidden or not: a rank
  names nobody.
- A path that is not a JSON array of strings is skipped like an empty one, and so is one
  nested too deeply for the JSON decoder (``RecursionError``). Hops are compared upper-cased.
- Text that is not valid UTF-8 (a name cut mid-character by firmware, a bad byte in a path)
  is decoded with U+FFFD replacement characters instead of failing the read: the name is
  shown (and matched against hidden prefixes) as repaired; such a path is not JSON and is
  skipped.
- An SNR that is not a finite number (SQLite stores ``9e999`` as infinity) is left out of
  ``avg_snr`` while its observation still counts, like a NULL one; an average that is not
  finite (finite SNRs so large that their sum overflows) is ``null``. Reports never hold NaN
  or an infinity, and the webapp serialises them with ``allow_nan=False``.
- Distances are computed for any finite coordinates, also out-of-range ones (a latitude of
  90.03 from a bad fix): the haversine term is clamped to [0, 1] against rounding.
- When the scan hits the row cap the report covers the rows read; a warning is logged.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "ADVERT",
    "EARTH_RADIUS_KM",
    "SCAN_ROW_CAP",
    "DegreeTable",
    "NodeIndex",
    "NodeInfo",
    "PeriodicSnapshot",
    "Visibility",
    "VisibilityRules",
    "build_report",
    "check_schema",
    "fetch_node",
    "haversine_km",
    "is_path_capable",
    "list_nodes",
    "load_degrees",
    "load_node_index",
    "normalize_pubkey",
    "open_readonly",
    "scan_query",
]

log = logging.getLogger("webapp.reach")

#: Most rows one scan reads. A module value (read at call time) so tests can lower it.
SCAN_ROW_CAP = 200_000

#: ``transmissions.payload_type`` of an advertisement: only its first hop is credited to
#: the originator, whose pubkey the packet carries.
ADVERT = 4

#: Mean Earth radius used by the haversine distance, as in the original server.
EARTH_RADIUS_KM = 6371.0

#: How long a read waits for a writer (the CoreScope ingestor) to let go of the database.
BUSY_TIMEOUT_S = 5.0

_DAY_S = 86_400
_HEX = frozenset("0123456789abcdef")
_TOKEN_SIZES = (2, 4, 6)  # hex chars of a 1-, 2- and 3-byte hop hash


# -- small helpers ---------------------------------------------------------------------------


def normalize_pubkey(raw: object) -> str | None:
    """The 64-hex-char pubkey in lower case, or None when ``raw`` is not one.

    Only ASCII hex digits count: full-width or other Unicode digits, whitespace and
    separators are rejected rather than cleaned up."""
    if not isinstance(raw, str) or len(raw) != 64 or not raw.isascii():
        return None
    key = raw.lower()
    return key if _HEX.issuperset(key) else None


def is_path_capable(role: str | None) -> bool:
    """Whether a node of this role relays packets, so its hash can appear in paths."""
    r = (role or "").lower()
    return "repeater" in r or "room_server" in r or r == "room"


def has_gps(lat: object, lon: object) -> bool:
    """Both coordinates present and not both 0 (the firmware's "no fix")."""
    if not isinstance(lat, (int, float)) or not isinstance(lon, (int, float)):
        return False
    if isinstance(lat, bool) or isinstance(lon, bool):
        return False
    if not (math.isfinite(lat) and math.isfinite(lon)):
        return False
    return not (lat == 0 and lon == 0)


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in km on a sphere of radius :data:`EARTH_RADIUS_KM`."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dphi = p2 - p1
    dlam = math.radians(lon2 - lon1)
    a = math.sin(dphi / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dlam / 2) ** 2
    # Rounding can push ``a`` a hair outside [0, 1] (out-of-range latitudes, antipodes).
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(max(0.0, min(1.0, a))))


def _iso_utc(unix_s: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def open_readonly(path: str | Path, *, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
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


# -- visibility ------------------------------------------------------------------------------


class _Hider(Protocol):
    def is_hidden(self, pubkey: str, name: str | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class VisibilityRules:
    """One immutable set of visibility rules and the generation it belongs to."""

    blacklist: frozenset[str] = frozenset()
    hidden_prefixes: tuple[str, ...] = ()  # case-folded, non-empty
    generation: int = 0

    def is_hidden(self, pubkey: str, name: str | None) -> bool:
        """Blacklisted pubkey, or a name starting with a hidden prefix (ignoring case)."""
        if pubkey in self.blacklist:
            return True
        if self.hidden_prefixes and name:
            return name.casefold().startswith(self.hidden_prefixes)
        return False


def _parse_blacklist(pubkeys: Iterable[str]) -> frozenset[str]:
    keys: set[str] = set()
    for raw in pubkeys:
        text = raw.strip()
        if not text:
            continue
        key = normalize_pubkey(text)
        if key is None:
            raise ValueError(f"blacklist entry {text!r} is not a 64-hex-char pubkey")
        keys.add(key)
    return frozenset(keys)


def _parse_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    # An empty prefix would hide every node: it is dropped, not honoured.
    return tuple(dict.fromkeys(p.strip().casefold() for p in prefixes if p.strip()))


class Visibility:
    """The blacklist and hidden name prefixes currently in force.

    Every change that alters the rules (blacklist or prefixes) bumps ``generation``, which
    is part of the warm-cache key, so no report built under old rules is served again.
    ``current`` is an immutable :class:`VisibilityRules`: a request takes it once and
    uses that one set throughout. Thread-safe.
    """

    def __init__(self, blacklist: Iterable[str] = (), hidden_prefixes: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._rules = VisibilityRules(  # replaced whole under _lock; read without it
            _parse_blacklist(blacklist), _parse_prefixes(hidden_prefixes), 0
        )

    @property
    def current(self) -> VisibilityRules:
        return self._rules

    @property
    def generation(self) -> int:
        return self._rules.generation

    def is_hidden(self, pubkey: str, name: str | None) -> bool:
        return self._rules.is_hidden(pubkey, name)

    def set_blacklist(self, pubkeys: Iterable[str]) -> int:
        """Replace the blacklist (raises ``ValueError`` on a malformed pubkey); returns the
        generation now in force, bumped only if the set actually changed."""
        keys = _parse_blacklist(pubkeys)
        with self._lock:
            old = self._rules
            if keys != old.blacklist:
                self._rules = VisibilityRules(keys, old.hidden_prefixes, old.generation + 1)
            return self._rules.generation

    def set_hidden_prefixes(self, prefixes: Iterable[str]) -> int:
        """Replace the hidden name prefixes; returns the generation now in force."""
        parsed = _parse_prefixes(prefixes)
        with self._lock:
            old = self._rules
            if parsed != old.hidden_prefixes:
                self._rules = VisibilityRules(old.blacklist, parsed, old.generation + 1)
            return self._rules.generation


# -- snapshots -------------------------------------------------------------------------------

T = TypeVar("T")


class PeriodicSnapshot(Generic[T]):
    """A value loaded from the database and reused for ``interval`` seconds.

    design: ``get(conn)`` returns the current value at once while it is fresh. When it is
    due, the first caller claims the reload (a flag set under ``_lock``) and runs the loader
    with no lock held, on its own connection; every other caller keeps getting the old value
    meanwhile. Only before the very first value exists do callers wait for the loader,
    on ``_loaded`` (notified whenever a load ends, well or badly). A failed reload logs and
    keeps serving the previous value until the next interval; a failed *first* load raises
    to the caller that ran it, and the next caller tries again.

    ``refresh(conn)`` is a forced load by a caller that knows the value is out of date; it
    runs beside a periodic reload if one is under way. Every load takes a ticket (a number,
    under ``_lock``) when it starts, and a value is installed only if its ticket is newer
    than the installed value's: a slow load that started first never puts an older value
    back over a newer one.

    The clock is injected (monotonic seconds) so tests never sleep.
    """

    def __init__(
        self,
        load: Callable[[sqlite3.Connection], T],
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "snapshot",
    ) -> None:
        if not interval > 0:
            raise ValueError("interval > 0")
        self._load = load
        self._interval = float(interval)
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._loaded = threading.Condition(self._lock)  # notified when a load ends
        self._value: T | None = None  # guarded by _lock
        self._due = 0.0  # guarded by _lock: when the value should next be reloaded
        self._loading = False  # guarded by _lock: a caller is running the periodic reload
        self._tickets = 0  # guarded by _lock: loads started so far; numbers each load
        self._value_ticket = 0  # guarded by _lock: the ticket of the load that made _value
        self.loads = 0  # guarded by _lock: values installed, for tests and logs
        self.failures = 0  # guarded by _lock

    def peek(self) -> T | None:
        """Racy read: the current value, without loading."""
        return self._value

    def get(self, conn: sqlite3.Connection) -> T:
        now = self._clock()
        with self._lock:
            while True:
                if self._value is not None and (now < self._due or self._loading):
                    return self._value
                if not self._loading:
                    self._loading = True  # we load; others serve the old value
                    previous = self._value
                    self._tickets += 1
                    ticket = self._tickets
                    break
                self._loaded.wait()  # no value yet: wait for the caller that is loading
        value: T | None = None
        try:
            value = self._load(conn)
        except Exception:
            if previous is None:
                raise
            log.warning("%s rebuild failed; serving the previous one", self._name,
                        exc_info=True)
            return previous
        finally:
            with self._lock:
                self._loading = False
                if value is not None:
                    self._install(value, ticket, now)
                elif previous is not None:
                    self.failures += 1
                    self._due = now + self._interval  # try again next interval
                else:
                    self.failures += 1
                self._loaded.notify_all()
        return value  # what this caller loaded, even if a newer refresh() was installed

    def refresh(self, conn: sqlite3.Connection) -> T:
        """Load now, in the calling thread, whether or not the value is due; install the
        result (unless a load that started later has already installed its own) and start a
        new interval. Returns what this call loaded. On failure the exception propagates and
        the snapshot is left as it was, apart from ``failures``."""
        with self._lock:
            self._tickets += 1
            ticket = self._tickets
        try:
            value = self._load(conn)
        except Exception:
            with self._lock:
                self.failures += 1
            raise
        now = self._clock()
        with self._lock:
            self._install(value, ticket, now)
            self._loaded.notify_all()
        return value

    def _install(self, value: T, ticket: int, now: float) -> None:
        # Called with _lock held. A load that started before the installed one is older
        # than it, whenever it ends: keep the newer value (and its interval).
        if ticket > self._value_ticket:
            self._value = value
            self._value_ticket = ticket
            self.loads += 1
            self._due = now + self._interval


@dataclass(frozen=True, slots=True)
class DegreeTable:
    """Degrees from ``neighbor_edges``: rows touching each node, and their ranking."""

    degree: Mapping[str, int] = field(default_factory=dict)
    _ascending: Sequence[int] = ()  # every degree, sorted ascending, for ranking

    @classmethod
    def from_edges(cls, edges: Iterable[tuple[str, str]]) -> DegreeTable:
        counts: Counter[str] = Counter()
        for a, b in edges:
            a, b = (a or "").lower(), (b or "").lower()
            if a:
                counts[a] += 1
            if b and b != a:  # a self-edge is one row touching the node once
                counts[b] += 1
        return cls(dict(counts), tuple(sorted(counts.values())))

    @property
    def nodes_with_edges(self) -> int:
        return len(self.degree)

    def importance(self, pubkey: str) -> tuple[int, int]:
        """``(neighbor_degree, degree_rank)``; rank is 1 + the nodes with a strictly
        higher degree, 0 for a node with no edge."""
        deg = self.degree.get(pubkey, 0)
        if deg == 0:
            return 0, 0
        higher = len(self._ascending) - bisect_right(self._ascending, deg)
        return deg, 1 + higher


def load_degrees(conn: sqlite3.Connection) -> DegreeTable:
    rows = conn.execute("SELECT node_a, node_b FROM neighbor_edges")
    return DegreeTable.from_edges(rows)


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


_NODE_COLUMNS = "public_key, name, role, lat, lon, first_seen"


@dataclass(frozen=True, slots=True)
class NodeIndex:
    """Everything a report needs to know about the other nodes.

    ``prefixes`` maps each upper-case 2/4/6-hex prefix of a path-capable node to that node,
    or to None when two or more path-capable nodes share it (an ambiguous hop).
    """

    nodes: Mapping[str, NodeInfo]
    prefixes: Mapping[str, str | None]
    observers: Mapping[str, str]  # lower-case observer id -> name

    @classmethod
    def build(cls, nodes: Iterable[NodeInfo], observers: Iterable[tuple[str, str]]) -> NodeIndex:
        by_key: dict[str, NodeInfo] = {}
        prefixes: dict[str, str | None] = {}
        for node in nodes:
            by_key[node.pubkey] = node
            if not is_path_capable(node.role):
                continue
            upper = node.pubkey.upper()
            for size in _TOKEN_SIZES:
                p = upper[:size]
                prefixes[p] = node.pubkey if p not in prefixes else None
        return cls(by_key, prefixes, dict(observers))

    def resolve(self, hop: str) -> str | None:
        """The one path-capable node with this hop hash, or None (unknown or ambiguous)."""
        return self.prefixes.get(hop)

    def reliable_tokens(self, pubkey: str) -> list[str]:
        """The target's prefixes that only it has among path-capable nodes, sorted."""
        upper = pubkey.upper()
        return sorted(upper[:s] for s in _TOKEN_SIZES if self.prefixes.get(upper[:s]) == pubkey)

    def describe(self, pubkey: str) -> tuple[str, str, float | None, float | None]:
        """``(name, role, lat, lon)`` as reports show them. An observer that is not a node
        has role ``"observer"`` and no GPS; a pubkey known to neither is nameless."""
        node = self.nodes.get(pubkey)
        if node is not None:
            return node.name, node.role, node.lat, node.lon
        name = self.observers.get(pubkey)
        if name is not None:
            return name, "observer", None, None
        return "", "", None, None


def load_node_index(conn: sqlite3.Connection) -> NodeIndex:
    nodes = [NodeInfo.from_row(r) for r in conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes")]
    observers = [
        (str(oid).lower(), str(name) if name is not None else "")
        for oid, name in conn.execute("SELECT id, name FROM observers")
        if oid
    ]
    return NodeIndex.build(nodes, observers)


def fetch_node(conn: sqlite3.Connection, pubkey: str) -> NodeInfo | None:
    row = conn.execute(
        f"SELECT {_NODE_COLUMNS} FROM nodes WHERE public_key = ?", (pubkey,)
    ).fetchone()
    return NodeInfo.from_row(row) if row is not None else None


def check_schema(conn: sqlite3.Connection) -> None:
    """Raise ``sqlite3.Error`` unless every table and column the webapp reads exists."""
    conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes LIMIT 0").fetchall()
    conn.execute("SELECT id, name FROM observers LIMIT 0").fetchall()
    conn.execute("SELECT node_a, node_b, count FROM neighbor_edges LIMIT 0").fetchall()
    sql, params = scan_query(["00"], 0)
    conn.execute(f"SELECT 1 FROM ({sql}) LIMIT 0", params).fetchall()


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


class _Tally:
    """Counts gathered by the scan for one target."""

    __slots__ = ("we_hear", "they_hear", "direct", "relay_rows", "rows")

    def __init__(self) -> None:
        self.we_hear: Counter[str] = Counter()  # X -> packets of X the target relayed
        self.they_hear: Counter[str] = Counter()  # X -> packets of the target X received
        self.direct: dict[str, list[float]] = {}  # observer -> [count, snr_sum, snr_n]
        self.relay_rows = 0
        self.rows = 0


def _parse_path(path_json: object) -> list[str] | None:
    if not path_json or not isinstance(path_json, (str, bytes)):
        return None
    try:
        path = json.loads(path_json)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to decode
        return None
    if not isinstance(path, list) or not path:
        return None
    if not all(isinstance(h, str) for h in path):
        return None
    return [h.upper() for h in path]


def _scan(
    conn: sqlite3.Connection,
    target: str,
    tokens: Sequence[str],
    since: int,
    index: NodeIndex,
) -> _Tally:
    sql, params = scan_query(tokens, since)
    token_set = frozenset(tokens)
    resolve = index.resolve
    tally = _Tally()
    we_hear, they_hear, direct = tally.we_hear, tally.they_hear, tally.direct
    for observer, origin, payload_type, path_json, snr in conn.execute(sql, params):
        tally.rows += 1
        path = _parse_path(path_json)
        if path is None:
            continue
        last = len(path) - 1
        hit = False
        for i, hop in enumerate(path):
            if hop not in token_set:
                continue
            hit = True
            # predecessor: "we hear X"
            if i > 0:
                x = resolve(path[i - 1])
            elif payload_type == ADVERT:
                x = origin or None  # an advert's first relay heard its originator
            else:
                x = None
            if x is not None and x != target:
                we_hear[x] += 1
            # successor: "X hears us"
            if i < last:
                y = resolve(path[i + 1])
                if y is not None and y != target:
                    they_hear[y] += 1
            elif observer and observer != target:
                they_hear[observer] += 1
                entry = direct.get(observer)
                if entry is None:
                    entry = direct[observer] = [0, 0.0, 0]
                entry[0] += 1
                if isinstance(snr, float | int) and math.isfinite(snr):  # not NULL, not inf
                    entry[1] += snr
                    entry[2] += 1
        if hit:
            tally.relay_rows += 1
    if tally.rows >= int(SCAN_ROW_CAP):
        log.warning("reach scan for %s hit the row cap (%d rows); report truncated",
                    target, tally.rows)
    return tally


# -- the report ------------------------------------------------------------------------------


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
    visibility: _Hider,
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
    tally = _scan(conn, target.pubkey, tokens, since, index) if tokens else _Tally()

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
        "window": {"days": days, "since": _iso_utc(since)},
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


# -- the node list ---------------------------------------------------------------------------


def list_nodes(
    conn: sqlite3.Connection,
    *,
    q: str = "",
    limit: int = 50,
    offset: int = 0,
    visibility: _Hider,
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
    for row in conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes"):
        node = NodeInfo.from_row(row)
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
