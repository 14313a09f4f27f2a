"""reachlimit: admission control for one expensive endpoint of a threaded WSGI service.

Warm-cache bypass, same-key singleflight, a cache recheck, then a cold limiter with a bounded
wait and a bounded queue shared fairly between clients: first-in first-out within a client,
round-robin across clients, and a full queue displaces the greediest client's newest waiter
(with one client, a strict first-in first-out queue). The core imports only the standard
library; the Flask extension lives in :mod:`reachlimit.flask`.
"""

from ._cache import Entry, TTLCache
from ._cancel import CancelToken, SocketWatch, watch_client
from ._errors import Busy, Cancelled, LeaderFailed, ReachLimitError, Unavailable
from ._flight import SingleFlight
from ._limiter import ColdLimiter, Grant, LimiterStats
from ._path import (
    NOT_FOUND,
    REFRESH_CLIENT,
    Answer,
    Cache,
    ColdPath,
    ColdPathStats,
    Flight,
    Limiter,
    RevalidatingCache,
)
from ._refresh import Refresher

__version__ = "0.2.0"

__all__ = [
    "NOT_FOUND",
    "REFRESH_CLIENT",
    "Answer",
    "Busy",
    "Cache",
    "CancelToken",
    "Cancelled",
    "ColdLimiter",
    "ColdPath",
    "ColdPathStats",
    "Entry",
    "Flight",
    "Grant",
    "LeaderFailed",
    "Limiter",
    "LimiterStats",
    "ReachLimitError",
    "Refresher",
    "RevalidatingCache",
    "SingleFlight",
    "SocketWatch",
    "TTLCache",
    "Unavailable",
    "watch_client",
]
