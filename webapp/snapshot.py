"""What every report shares between requests: the degree table and the node index, and the
holder that keeps each one for a minute.

design: two inputs change slowly and are read by every report, so the webapp keeps them in
:class:`PeriodicSnapshot` holders, rebuilt at most once a minute outside every request lock:

- :class:`DegreeTable` - the ``neighbor_edges`` degree and rank of every node;
- :class:`NodeIndex` - every node's name, role and GPS, the prefix map of path-capable nodes
  used to resolve hop hashes, and the observers' names.

Cold builds refresh them: the first build that finds one due reloads it on its own connection
(inside its build slot, under no lock); concurrent builds keep using the old one meanwhile. A
build whose target's row disagrees with the node index forces a reload at once (see
:func:`webapp.report.build_report`). ``webapp/README.md`` ("Snapshots") says what this costs a
reader: a new or renamed node shows in *other* nodes' reports up to a minute late.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from . import db
from .db import NodeInfo
from .meshcore import HOP_HASH_SIZES, is_path_capable

__all__ = [
    "DegreeTable",
    "NodeIndex",
    "PeriodicSnapshot",
    "load_degrees",
    "load_node_index",
]

log = logging.getLogger(__name__)

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
    return DegreeTable.from_edges(db.read_edges(conn))


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
            for size in HOP_HASH_SIZES:
                p = upper[:size]
                prefixes[p] = node.pubkey if p not in prefixes else None
        return cls(by_key, prefixes, dict(observers))

    def resolve(self, hop: str) -> str | None:
        """The one path-capable node with this hop hash, or None (unknown or ambiguous)."""
        return self.prefixes.get(hop)

    def reliable_tokens(self, pubkey: str) -> list[str]:
        """The target's prefixes that only it has among path-capable nodes, sorted."""
        upper = pubkey.upper()
        return sorted(upper[:s] for s in HOP_HASH_SIZES if self.prefixes.get(upper[:s]) == pubkey)

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
    return NodeIndex.build(list(db.read_nodes(conn)), db.read_observers(conn))
