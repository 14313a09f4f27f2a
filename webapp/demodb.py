"""The service's demo database: written when missing, rewritten when stale.

The demo database is made in three parts, each a module of its own:

- ``webapp/demomesh.py``, the generator: the synthetic mesh (nodes, observers, transmissions,
  paths), every random decision drawn from the stream of the part that makes it;
- ``webapp/demowriter.py``, the writer: the mesh into SQLite in the CoreScope schema
  (:func:`write_demo_db`, :func:`read_meta`), drawing nothing of its own;
- this module, the lifecycle: :func:`ensure_demo_db`, which the service calls before it
  serves its embedded default ``webapp/data/demo.sqlite``.

The writer's :func:`write_demo_db`, :func:`read_meta` and :func:`demo_now` are re-exported
here, so ``webapp.demodb`` is the one entry point for code that writes, reads or refreshes a
demo database (the tests, ``benchmarks/reach_cold.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from .demowriter import (
    DEFAULT_NODES,
    DEFAULT_OBSERVATIONS,
    DEFAULT_SEED,
    DemoSummary,
    demo_now,
    read_meta,
    write_demo_db,
)

#: ``demo_now``, ``read_meta`` and ``write_demo_db`` are the writer's, re-exported.
__all__ = ["demo_now", "ensure_demo_db", "read_meta", "write_demo_db"]

_DAY_S = 86_400


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
