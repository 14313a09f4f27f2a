"""reachlimit on Redis: one cold-build budget, one warm cache and one singleflight shared by
every process (gunicorn workers, hosts) that uses the same Redis and names, with the
in-process objects of the core as the fallback while Redis is unavailable.

Needs redis-py (``pip install 'reachlimit[redis]'``); the core never imports this package.

design: one module per job, each opening with its own design note; who imports whom (no
cycle: each imports only those above it and the core)::

    _common      names and their checks, key encoding and client ids, owner ids, socket
                 timeout, a warning logged once, the settings a process records at start
    lua/         the Lua scripts, one self-contained ``.lua`` file each, read as they are
    _renewer     LeaseRenewer: the one lease-renewing thread of a limiter or a flight
    _waker       Waker: ends a waiter's blocking read on time
    _stats       RedisLimiterStats and the reading of the stats operation's reply
    _lead        the cold lead's reply and its hand-over to the recheck and the acquire
    _members     Members: the live processes of a budget, announced by a daemon thread
                                                                       (_common, lua, _daemon)
    _limiter     RedisColdLimiter: admission, its waiters' loop, its   (_common, lua, _renewer,
                 grants (RedisGrant) and their leases, the lost-reply   _waker, _stats, _lead,
                 give-up, the settings record                           _members)
    _owners      release_owner, release_claims: a dead process's places  (_limiter, lua)
                 and singleflight claims, freed by its parent
    _cache       RedisCache and its codecs                            (_common, lua, _lead)
    _flight      RedisSingleFlight, and the cold lead it leads with   (_common, lua, _renewer,
                                                                        _cache's codec, _lead)
    _counters    SharedPathCounters: the path's counters summed in Redis
    _health      connect() and RedisHealth: the breaker every fallback shares
    _resilient   ResilientLimiter, ResilientCache, ResilientFlight    (_health, _limiter,
                                                                        _members)

The core gives this package what it needs through public hooks only: ``ColdPath.counts()``,
``LEADER_CANCELLED`` (``reachlimit._path``), the ``Grant`` base class, ``LimiterFigures``, and
a flight's optional ``do_cold``, which ColdPath calls instead of ``do``, and
``reads_cache`` with ``Found``, by which the flight's round trip reads the shared cache too
(the cold lead).
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
