"""The scan: a cold build's one pass over the observations that name the target, and what each
row says about who the target hears and who hears it.

design: the database returns only rows whose path names one of the target's reliable tokens
(:func:`webapp.db.scan_rows`); everything else happens here, per row, in Python. For every
position ``i`` where ``path[i]`` is a token:

    predecessor  path[i-1] resolved, or an ADVERT's originator at i = 0 .. "we hear X"
    successor    path[i+1] resolved, or the observer at the last hop .... "X hears us"
    last hop     the observer is also a direct observer (count, SNR sum)

``webapp/README.md`` ("How a report is computed") gives the rules with their reasons.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections import Counter
from collections.abc import Sequence

from . import db
from .meshcore import ADVERT
from .snapshot import NodeIndex

__all__ = ["Tally", "scan"]

log = logging.getLogger(__name__)


class Tally:
    """Counts gathered by the scan for one target."""

    __slots__ = ("we_hear", "they_hear", "direct", "relay_rows", "rows")

    def __init__(self) -> None:
        self.we_hear: Counter[str] = Counter()  # X -> packets of X the target relayed
        self.they_hear: Counter[str] = Counter()  # X -> packets of the target X received
        self.direct: dict[str, list[float]] = {}  # observer -> [count, snr_sum, snr_n]
        self.relay_rows = 0
        self.rows = 0


def _parse_path(path_json: object) -> list[str] | None:
    """The hops upper-cased, or None for a path that is empty or not a JSON array of strings
    (also one nested too deeply for the JSON decoder)."""
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


def scan(
    conn: sqlite3.Connection,
    target: str,
    tokens: Sequence[str],
    since: int,
    index: NodeIndex,
) -> Tally:
    """Tally the rows since ``since`` (unix seconds) whose path names one of ``tokens``, the
    target's reliable tokens; hops are resolved with ``index``. Raises ``sqlite3.Error``."""
    token_set = frozenset(tokens)
    resolve = index.resolve
    tally = Tally()
    we_hear, they_hear, direct = tally.we_hear, tally.they_hear, tally.direct
    for observer, origin, payload_type, path_json, snr in db.scan_rows(conn, tokens, since):
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
    if tally.rows >= int(db.SCAN_ROW_CAP):
        log.warning("reach scan for %s hit the row cap (%d rows); report truncated",
                    target, tally.rows)
    return tally
