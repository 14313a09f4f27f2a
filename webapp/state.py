"""What one webapp instance holds in ``app.extensions["reach"]``.

design: handler threads share this object. Each thread opens its own read-only SQLite
connection on first use (``threading.local``) and keeps it for its life: gthread workers
reuse their threads, so a connection is opened once per thread, and sqlite3 connections stay
with the thread that made them. The visibility rules and the two snapshots are thread-safe
on their own. ``_lock`` guards only the lazy preparation of the default demo database and
the generation whose cache has been emptied.

The node-index snapshot has two readers: cold builds (``index.get``, which reloads it when
due, and ``index.refresh`` when a build finds it older than its target's row) and the report
endpoint's visibility check before the warm cache (``index.peek``, no database work).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import demodb
from .db import check_database, open_readonly
from .snapshot import DegreeTable, NodeIndex, PeriodicSnapshot, load_degrees, load_node_index
from .visibility import Visibility

__all__ = ["ReachState"]

log = logging.getLogger("webapp")


class ReachState:
    """Database access, visibility and snapshots for one app."""

    def __init__(
        self,
        *,
        db_path: Path,
        create_demo: bool,
        visibility: Visibility,
        snapshot_interval: float = 60.0,
        demo_stale_after: float | None = 86_400.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.db_path = db_path
        #: True when db_path is the embedded demo database, written when missing or stale.
        self.create_demo = create_demo
        self.demo_stale_after = demo_stale_after
        self.visibility = visibility
        #: Unix time "now" for report windows (injectable for tests).
        self.wall_clock = wall_clock
        self.degrees: PeriodicSnapshot[DegreeTable] = PeriodicSnapshot(
            load_degrees, interval=snapshot_interval, clock=clock, name="degree table"
        )
        self.index: PeriodicSnapshot[NodeIndex] = PeriodicSnapshot(
            load_node_index, interval=snapshot_interval, clock=clock, name="node index"
        )
        self._local = threading.local()
        self._lock = threading.Lock()
        self._prepared = not create_demo  # guarded by _lock
        self._cleared_generation = visibility.generation  # guarded by _lock

    # -- the database ---------------------------------------------------------------------

    def prepare(self) -> None:
        """Make sure the database exists: writes the demo database when it is the one
        configured and it is missing or stale. Idempotent and thread-safe; other processes
        are kept out by a lock file (see :func:`webapp.demodb.ensure_demo_db`)."""
        with self._lock:
            if self._prepared:
                return
            summary = demodb.ensure_demo_db(
                self.db_path, stale_after=self.demo_stale_after, log=log.info
            )
            if summary is not None:
                log.info("demo database ready: %s", summary.as_dict())
            check_database(self.db_path)
            self._prepared = True

    def connection(self) -> sqlite3.Connection:
        """This thread's read-only connection, opened on first use."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if not self._prepared:
                self.prepare()
            conn = open_readonly(self.db_path)
            self._local.conn = conn
        return conn

    def close_connection(self) -> None:
        """Close this thread's connection (the next use opens a new one)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    # -- the warm cache and the visibility generation --------------------------------------

    def claim_cache_clear(self) -> int:
        """Once per visibility generation change, the generation now in force (always >= 1;
        0 otherwise): the caller then empties the warm cache. Reports under older
        generations are already unreachable (the generation is part of the key); emptying
        frees their memory at once."""
        generation = self.visibility.generation  # generations only grow
        if generation <= self._cleared_generation:  # racy read; confirmed under the lock
            return 0
        with self._lock:
            if generation <= self._cleared_generation:
                return 0
            self._cleared_generation = generation
            return generation

    def give_back_cache_clear(self, generation: int) -> None:
        """The clear claimed for ``generation`` (what :meth:`claim_cache_clear` answered)
        could not be done (the shared cache's Redis
        is unreachable): the next request claims it again. Nothing is lost meanwhile: the
        generation is part of every report's key, so the old entries are never answered."""
        with self._lock:
            if self._cleared_generation == generation:
                self._cleared_generation = generation - 1
