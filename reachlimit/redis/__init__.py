"""reachlimit on Redis: one cold-build budget, one warm cache and one singleflight shared by
every process (gunicorn workers, hosts) that uses the same Redis and names, with the
in-process objects of the core as the fallback while Redis is unavailable.

Needs redis-py (``pip install 'reachlimit[redis]'``); the core never imports this package.

design: one module per job, each opening with its own design note; the map of them (what
each holds, who imports whom, what the core offers this package) is in ``docs/design.md``,
"The package reachlimit.redis".
"""

from .._urls import mask_url
from ._cache import CODECS, RedisCache
from ._common import client_id, key_digest, owner_prefix, registry_key
from ._counters import SharedPathCounters
from ._flight import RedisSingleFlight
from ._health import FAILURES, RedisHealth, connect
from ._limiter import RedisColdLimiter, RedisGrant, RedisLimiterStats
from ._owners import release_claims, release_owner
from ._resilient import FALLBACKS, ResilientCache, ResilientFlight, ResilientLimiter

__all__ = [
    "CODECS",
    "FAILURES",
    "FALLBACKS",
    "RedisCache",
    "RedisColdLimiter",
    "RedisGrant",
    "RedisHealth",
    "RedisLimiterStats",
    "RedisSingleFlight",
    "ResilientCache",
    "ResilientFlight",
    "ResilientLimiter",
    "SharedPathCounters",
    "client_id",
    "connect",
    "key_digest",
    "mask_url",
    "owner_prefix",
    "registry_key",
    "release_claims",
    "release_owner",
]
