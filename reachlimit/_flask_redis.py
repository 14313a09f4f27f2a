"""The Flask extension on Redis (``REACHLIMIT_REDIS_URL``): its shared cold path, and
``release_worker`` for a dead worker's parent.

design:

    each budget of an app with settings.redis_url        (reachlimit._budgets.AppBudgets)
      shared_path(settings, meter, budget, links) -> SharedPath
        keys     {<prefix>:<redis_name(budget)>}: the budget's own; the default keeps "cold"
        links    RedisLinks: the app's one client and one health per URL, for every budget
                 (the health probes Redis on that client while it is down)
        limiter  ResilientLimiter(RedisColdLimiter, ColdLimiter, health, redis_fallback):
                 with "local", the process announces itself as one of the budget's live
                 processes and its fallback admits its share (ceil(active / N), ...)
        cache    ResilientCache(RedisCache, TTLCache, health)       _shared_cache_and_flight
        flight   ResilientFlight(RedisSingleFlight, SingleFlight, health)
        path     ColdPath(limiter, cache, flight), or metrics_class(...).path (metered)
        counters SharedPathCounters: every process's hits, misses, builds and coalesced
        closers  what ReachLimit.close() calls, in order

The cold limiter is ``reachlimit.redis``'s ResilientLimiter: the shared RedisColdLimiter
while Redis answers, an in-process ColdLimiter admitting this process's share of the budget
(or a 503 refusal) while it does not; redis-py
is imported only here, and only then. The warm cache and the singleflight are shared too,
each behind the same fallback and the same health, so Redis failing degrades all three at
once. ``SharedPathCounters`` adds up every process's figures for ``rl.stats()`` and the
health view; its thread starts with the process's first request (``cold``), so never in a
preloading master. No connection is opened while the app is set up.

``release_worker`` frees a dead worker's places in every budget: the default, those the
config's REACHLIMIT_BUDGETS lists, and every limiter name listed in Redis under the prefix
(``reachlimit.redis.registry_key``; budgets declared only in code included), and takes the
worker out of each budget's live processes.

No Flask here (``reachlimit._budgets`` turns a ``SharedPath`` into a budget's state;
``reachlimit.flask`` re-exports ``release_worker``): the standard library, the core and
(lazily) ``reachlimit.redis``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from . import ColdLimiter, ColdPath, SingleFlight, TTLCache
from ._budget_names import DEFAULT_BUDGET, read_budgets
from ._flask_settings import Settings, read_settings
from ._path import Cache, Flight

if TYPE_CHECKING:
    from .prometheus import ReachMetrics
    from .redis import RedisColdLimiter, RedisHealth, SharedPathCounters

__all__ = [
    "REDIS_LIMITER_NAME", "RedisLinks", "SharedPath", "redis_name", "shared_path",
    "release_worker",
]

log = logging.getLogger("reachlimit")

#: The name of the shared limiter under ``REACHLIMIT_REDIS_PREFIX``: every process with the
#: same Redis URL and prefix shares one budget.
REDIS_LIMITER_NAME = "cold"


class SharedPath(NamedTuple):
    """What a budget of an app on Redis is made of (see the module's design note)."""

    path: ColdPath
    metrics: ReachMetrics | None
    health: RedisHealth
    counters: SharedPathCounters
    #: The stops of the background threads (and of an own client), in the order to call them.
    closers: list[Callable[[], None]]


def redis_name(budget: str) -> str:
    """The name of ``budget``'s keys under the prefix (hash tag ``{<prefix>:<name>}``): the
    default budget keeps :data:`REDIS_LIMITER_NAME`, the name it had before there were
    budgets (so a rolling deploy shares one budget with the version before); a named budget
    is its own name (which is why no budget may be called "cold")."""
    return REDIS_LIMITER_NAME if budget == DEFAULT_BUDGET else budget


def _redis_module() -> Any:
    try:
        from . import redis as module
    except ImportError as exc:
        raise ValueError(
            f"REACHLIMIT_REDIS_URL needs redis-py: pip install 'reachlimit[redis]' ({exc})"
        ) from None
    return module


class RedisLinks:
    """One app's connections: one client and one health (the breaker every fallback shares)
    per Redis URL, whatever the number of budgets on it. The health probes Redis on that
    client while it is down (its thread starts with the first failure, so never in a
    process that has not used Redis). No connection is opened here."""

    def __init__(self) -> None:
        self._links: dict[str, tuple[Any, RedisHealth]] = {}

    def get(self, url: str) -> tuple[Any, RedisHealth]:
        link = self._links.get(url)
        if link is None:
            module = _redis_module()
            client = module.connect(url)
            link = self._links[url] = (client, module.RedisHealth(url, client=client))
        return link

    def close(self) -> None:
        """Stop each health's probe thread, then close its client (which the probe uses)."""
        links, self._links = self._links, {}
        for client, health in links.values():
            health.close()
            client.close()


def shared_path(
    settings: Settings,
    meter: Callable[..., ReachMetrics] | None,
    budget: str = DEFAULT_BUDGET,
    links: RedisLinks | None = None,
) -> SharedPath:
    """Budget ``budget``'s cold path on the shared limiter of ``settings.redis_url``: a
    RedisColdLimiter behind a ResilientLimiter that falls back to an in-process limiter of the
    same figures (or refuses) while Redis is unavailable; metered with ``meter`` (a
    ``ReachMetrics`` factory) when given. The client and the health are ``links``'s (shared
    with the app's other budgets; closed by ``links.close()``), else its own (closed last by
    the closers). ValueError when redis-py is missing. No connection is opened here."""
    module = _redis_module()
    url = settings.redis_url
    assert url is not None
    own = links is None
    client, health = (links or RedisLinks()).get(url)
    name = redis_name(budget)
    remote = module.RedisColdLimiter(
        client,
        name,
        settings.active,
        settings.queue,
        settings.wait,
        settings.limiter_retry_after,
        lease=settings.lease,
        prefix=settings.redis_prefix,
        deadline=settings.deadline,
    )
    local = ColdLimiter(
        settings.active, settings.queue, settings.wait, settings.limiter_retry_after,
        deadline=settings.deadline,
    )
    limiter = module.ResilientLimiter(remote, local, health, settings.redis_fallback)
    cache, flight = _shared_cache_and_flight(settings, client, health, remote, name)
    metrics = None
    if meter is not None:
        # Its gauges are read from the shared limiter when scraped, never summed per worker.
        metrics = meter(limiter=limiter, cache=cache, flight=flight, wait=settings.wait)
        path: ColdPath = metrics.path
    else:
        path = ColdPath(limiter, cache, flight)
    counters = module.SharedPathCounters(client, path, name, prefix=settings.redis_prefix)
    # cast() only speaks to the type checker: it returns flight whatever its first argument.
    close_flight = cast(Any, flight).close  # pragma: no mutate (cast's first argument: equivalent)
    # Counters first: their last flush needs the client, which closes last.
    closers = [counters.close, limiter.close, close_flight]
    if own:
        closers += [health.close, client.close]
    return SharedPath(path, metrics, health, counters, closers)


def _shared_cache_and_flight(
    settings: Settings, client: Any, health: RedisHealth, limiter: RedisColdLimiter, name: str
) -> tuple[Cache, Flight]:
    """The warm cache and the singleflight of an app on Redis, each over its in-process
    fallback and the limiter's ``health``, so that Redis failing degrades all three at once.
    ``client`` is the limiter's ``redis.Redis`` (made by ``reachlimit.redis.connect``).

    The cache keeps ``cache_ttl`` and ``cache_size`` for the whole service, with a 1 s
    in-process first level; values are stored with the "auto" codec (bytes as bytes,
    anything else as JSON - never pickle), so a view must return bytes or JSON-able values.
    The flight's lease is the limiter's: a leader whose process dies is taken over after it.
    The flight leads with the shared cache and ``limiter`` (the cold lead), so a request
    the first level cannot answer makes one round trip before its build or its refusal: one
    script that reads the cache entry (answered as a hit when there is one) and otherwise
    claims the flight and acquires. On a Redis Cluster ``use_cold_lead`` does nothing (the
    three keys live in three slots): the steps go one by one."""
    from .redis import RedisCache, RedisSingleFlight, ResilientCache, ResilientFlight

    prefix = settings.redis_prefix
    local_cache: TTLCache[Any] = TTLCache(
        settings.cache_size, settings.cache_ttl, stale=settings.stale
    )
    shared_cache = RedisCache(
        client, name, prefix=prefix, ttl=settings.cache_ttl, size=settings.cache_size,
        codec="auto", stale=settings.stale,
    )
    shared_flight = RedisSingleFlight(
        client, name, prefix=prefix, lease=settings.lease, codec="auto"
    )
    shared_flight.use_cold_lead(shared_cache, limiter)
    return (
        ResilientCache(shared_cache, local_cache, health),
        ResilientFlight(shared_flight, SingleFlight(), health),
    )


def release_worker(config: Mapping[str, Any], pid: int) -> tuple[int, int] | None:
    """For the parent of a worker process that died (gunicorn's ``child_exit``): free every
    shared build slot and queue place the worker on this host held, in every budget, at once
    instead of when their leases end. ``config`` holds the ``REACHLIMIT_*`` keys
    (``os.environ``, say). The budgets are the default one, those ``config`` lists in
    REACHLIMIT_BUDGETS and every one whose limiter ever ran under the prefix (each lists its
    name in Redis, ``reachlimit.redis.registry_key``, at its first call): so budgets declared
    in code only are freed too. Each budget's ``active`` and lease are read from the
    settings its processes recorded in Redis. The worker's singleflight claims are dropped
    too (``reachlimit.redis.release_claims``: their followers take the builds over at once
    rather than when the claims' leases end). Returns (slots freed, places removed) summed
    over the budgets, or None without a Redis URL. Raises ValueError for bad settings and
    redis-py's errors when Redis cannot be reached."""
    settings = read_settings(config, {})
    if not settings.redis_url:
        return None
    from .redis import connect, owner_prefix, registry_key, release_claims, release_owner

    names = {REDIS_LIMITER_NAME, *(redis_name(b) for b in read_budgets(config))}
    client = connect(settings.redis_url)
    try:
        listed = client.smembers(registry_key(settings.redis_prefix))
        names.update(n.decode() if isinstance(n, bytes) else str(n) for n in listed)
        freed = dropped = 0
        for name in sorted(names):
            slots, places = release_owner(
                client,
                owner_prefix(pid),
                name=name,
                prefix=settings.redis_prefix,
                active=settings.active,
                lease=settings.lease,
            )
            freed, dropped = freed + slots, dropped + places
        claims = release_claims(client, owner_prefix(pid), prefix=settings.redis_prefix)
        if claims:
            log.info("reachlimit: dropped %d singleflight claim(s) of worker %d: their "
                     "followers take them over", claims, pid)
        return freed, dropped
    finally:
        client.close()
