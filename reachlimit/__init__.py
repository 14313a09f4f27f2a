"""reachlimit: admission control for one expensive endpoint of a threaded WSGI service.

Warm-cache bypass, same-key singleflight, a cache recheck, then a cold limiter with a bounded
FIFO queue and a bounded wait. The core imports only the standard library; the Flask extension
lives in :mod:`reachlimit.flask`.
"""

from ._cache import TTLCache
from ._cancel import CancelToken, SocketWatch, watch_client
from ._errors import Busy, Cancelled, LeaderFailed, ReachLimitError
from ._flight import SingleFlight
from ._limiter import ColdLimiter, Grant, LimiterStats
from ._path import NOT_FOUND, Cache, ColdPath, ColdPathStats, Flight, Limiter

__version__ = "0.1.0"

__all__ = [
    "NOT_FOUND",
    "Busy",
    "Cache",
    "CancelToken",
    "Cancelled",
    "ColdLimiter",
    "ColdPath",
    "ColdPathStats",
    "Flight",
    "Grant",
    "LeaderFailed",
    "Limiter",
    "LimiterStats",
    "ReachLimitError",
    "SingleFlight",
    "SocketWatch",
    "TTLCache",
    "watch_client",
]
