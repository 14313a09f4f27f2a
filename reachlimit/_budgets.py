"""What one app's budgets are made of: each budget's state, and the app's set of them.

design:

    app.extensions["reachlimit"] ........ the default budget's BudgetState (what it always was:
                                          .settings, .path, .metrics, .retry_auto, ...)
      .budgets .......................... AppBudgets, shared by every budget of the app:
        .owner                            the ReachLimit that initialised the app (never the
                                          app: the app holds the extension, not the reverse)
        .states {name: BudgetState}       "default" first, then every budget declared before
                                          init_app or in REACHLIMIT_BUDGETS; a budget declared
                                          later is added on its first use in that app (ensure)
        .group                            the app's MetricsGroup (REACHLIMIT_METRICS): one
                                          /metrics for every budget, labelled by budget
        .links                            the app's Redis clients, one per URL (RedisLinks)

    build_state(name, settings, budgets) -> BudgetState
      in process   ColdLimiter + TTLCache (+ stale) -> ColdPath, or the metered path
      on Redis     reachlimit._flask_redis.shared_path: its own keys, slots and settings
                   record ({<prefix>:<name>}; the default keeps {<prefix>:cold})
      disabled     (REACHLIMIT_ENABLED false, or the budget's enabled=False) the in-process
                   path whatever the Redis URL, never used: the extension runs each build
                   directly, so the budget's figures stay at zero. No Redis object is made
                   for it (an app whose every budget is disabled never imports redis-py)

    Budget.forget(key) / clear_cache()    the extension's _forget / the cache's clear: on
                                          Redis ResilientCache raises reachlimit.Unavailable
                                          when Redis cannot be reached (never silent)

Each budget has its own limiter, cache, singleflight, fair queue, refresher, figures and
refusal texts; nothing is shared between two budgets but the app's Redis connection and
metric families. Standard library only (the extension, ``reachlimit.flask``, adds Flask).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, overload

from . import Busy, ColdLimiter, ColdPath, ColdPathStats, TTLCache
from ._answers import render_refusal
from ._budget_names import DEFAULT_BUDGET
from ._cached import CachedView, bare_or_called
from ._flask_redis import RedisLinks, shared_path
from ._flask_settings import RETRY_AFTER_AUTO, ClientFunc, Settings, _client_of
from ._keys import check_key, checked_key
from ._retry_after import AutoRetryAfter

if TYPE_CHECKING:
    from .prometheus import MetricsGroup, ReachMetrics
    from .redis import RedisHealth, SharedPathCounters

__all__ = [
    "Budget", "BudgetState", "AppBudgets", "build_state", "service_stats", "check_key",
    "checked_key",
]

log = logging.getLogger("reachlimit")


class BudgetState:
    """One budget of one app: its settings, cold path and figures."""

    __slots__ = (
        "name", "settings", "enabled", "path", "metrics", "redis", "counters", "closers",
        "client_of", "retry_auto", "budgets", "_refusals",
    )

    def __init__(
        self,
        settings: Settings,
        path: ColdPath,
        metrics: ReachMetrics | None = None,
        redis: RedisHealth | None = None,
        counters: SharedPathCounters | None = None,
        name: str = DEFAULT_BUDGET,
    ) -> None:
        self.name = name
        self.settings = settings
        #: settings.enabled, read on every cold(): False runs each build directly.
        self.enabled = settings.enabled
        self.path = path
        self.metrics = metrics
        self.redis = redis  # the shared limiter's Redis, when there is one
        self.counters = counters  # the path's counters added up in Redis, when there is one
        #: What ReachLimit.close() calls: the stops of the background threads, in order.
        self.closers: list[Callable[[], None]] = []
        #: None: the client is the request's remote_addr (the default, read inline); else
        #: what gives it from the request ("none": always None).
        self.client_of: ClientFunc | None = _client_of(settings.client)
        #: REACHLIMIT_RETRY_AFTER="auto": the build times and the formula; else None.
        self.retry_auto = (
            AutoRetryAfter(settings.active, settings.queue)
            if settings.retry_after == RETRY_AFTER_AUTO
            else None
        )
        #: The app's budgets, this one included (set when the app's set is made).
        self.budgets: AppBudgets | None = None
        # (reason, retry_after) -> the refusal's body and headers, rendered once. No lock, on
        # purpose: two threads may render the same refusal at once, and either copy is right.
        self._refusals: dict[tuple[str, int], tuple[bytes, list[tuple[str, str]]]] = {}

    def auto_busy(self, busy: Busy) -> Busy:
        """``busy`` with its Retry-After worked out now (``retry_auto`` is set)."""
        auto = self.retry_auto
        assert auto is not None
        # A timeout or a deadline refusal may leave a queue that is not full: ask it.
        if busy.reason in (Busy.TIMEOUT, Busy.DEADLINE):
            try:
                queued = int(self.path.limiter.stats().queued)
            except Exception:  # the figures cannot be read (Redis, say): assume a full queue
                queued = auto.queue
        else:  # queue_full and displaced: the queue was full; unavailable: unknown
            queued = auto.queue
        return Busy(busy.reason, auto.seconds(queued))

    def refusal(self, busy: Busy) -> tuple[int, bytes, list[tuple[str, str]]]:
        """The status, body and headers of the answer to ``busy``: body and headers are
        rendered on the first refusal of each kind and reused."""
        # (A miss here only renders the same answer again.)
        rendered = self._refusals.get((busy.reason, busy.retry_after))
        if rendered is None:
            rendered = self._refusals[(busy.reason, busy.retry_after)] = render_refusal(
                busy, self.name, self.settings.refusal_message
            )
        # "unavailable" (Redis down, fallback "refuse") is the service's failure, not the
        # client's: 503 whatever REACHLIMIT_STATUS says.
        status = 503 if busy.reason == Busy.UNAVAILABLE else self.settings.status
        return status, *rendered


class AppBudgets:
    """Every budget of one app (see the module's design note)."""

    def __init__(
        self,
        owner: Any,
        base: Settings,
        configured: Mapping[str, Mapping[str, Any]],
        group: MetricsGroup | None,
    ) -> None:
        self.owner = owner
        self.base = base
        self.configured = configured
        self.group = group
        self.links = RedisLinks()
        self.states: dict[str, BudgetState] = {}
        #: Taken to add a budget declared after init_app (on its first use in this app).
        self.lock = threading.Lock()

    def ensure(self, name: str, build: Callable[[], BudgetState]) -> BudgetState:
        """Budget ``name``, made by ``build`` (once, under the lock) if it is not there yet:
        a budget declared after the app's init_app, on its first use in the app."""
        with self.lock:
            # Its caller found no state just before: building again here instead would
            # only differ for a second thread that lost that race.
            state = self.states.get(name)
            return state if state is not None else build()

    def add(self, state: BudgetState) -> None:
        state.budgets = self
        self.states[state.name] = state

    def close(self) -> None:
        """Every budget's background work, then the app's Redis connections."""
        for state in list(self.states.values()):
            closers, state.closers = state.closers, []
            for close in closers:
                close()
        self.links.close()


class Extension(Protocol):
    """What a :class:`Budget` asks of its ``ReachLimit``."""

    def _cold(
        self, state: BudgetState, key: Hashable, build: Callable[[], Any], where: str | None
    ) -> Any: ...

    def _cached(
        self, name: str, key: Callable[..., Hashable] | None, mimetype: str | None
    ) -> Callable[[Callable[..., Any]], CachedView]: ...

    def _budget_state(self, name: str) -> BudgetState: ...

    def _forget(self, state: BudgetState, key: Hashable) -> bool: ...


class Budget:
    """One budget of the apps a :class:`ReachLimit` serves: ``rl.budget(name, **options)``.

    Its ``cold``, ``cached``, ``forget``, ``stats``, ``clear_cache``, ``settings`` and
    ``path`` are the current app's, like the extension's own (which are the ``"default"``
    budget's). The object holds no app: it finds its state in
    ``app.extensions["reachlimit"]`` on every call. ``rl.budget(name, enabled=False)``
    turns this budget's machinery off (see ``ReachLimit``)."""

    def __init__(self, rl: Extension, name: str) -> None:
        self.rl = rl
        self.name = name

    def __repr__(self) -> str:
        return f"<reachlimit Budget {self.name!r}>"

    def cold(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """:meth:`ReachLimit.cold` in this budget."""
        return self.rl._cold(self._state(), key, build, "")

    @overload
    def cached(self, view: Callable[..., Any], /) -> CachedView: ...

    @overload
    def cached(
        self, view: None = None, /, *, key: Callable[..., Hashable] | None = None,
        mimetype: str | None = None,
    ) -> Callable[[Callable[..., Any]], CachedView]: ...

    def cached(
        self, view: Callable[..., Any] | None = None, /, *,
        key: Callable[..., Hashable] | None = None, mimetype: str | None = None,
    ) -> Any:
        """:meth:`ReachLimit.cached` in this budget: ``@budget.cached`` or
        ``@budget.cached(key=..., mimetype=...)``."""
        return bare_or_called(self.rl._cached(self.name, key, mimetype), view)

    def stats(self) -> ColdPathStats:
        return service_stats(self._state())

    def forget(self, key: Hashable) -> bool:
        """:meth:`ReachLimit.forget` in this budget."""
        return self.rl._forget(self._state(), key)

    def clear_cache(self) -> None:
        """:meth:`ReachLimit.clear_cache` in this budget."""
        clear_cache(self._state())

    def settings(self) -> Settings:
        return self._state().settings

    @property
    def path(self) -> ColdPath:
        return self._state().path

    def _state(self) -> BudgetState:
        return self.rl._budget_state(self.name)


def _metrics_class() -> type[ReachMetrics]:
    try:
        from .prometheus import ReachMetrics
    except ImportError as exc:
        raise ValueError(
            "REACHLIMIT_METRICS needs prometheus_client: "  # pragma: no mutate (words)
            "pip install 'reachlimit[prometheus]' "  # pragma: no mutate (words)
            f"({exc})"
        ) from None
    return ReachMetrics


def metrics_group(settings: Settings) -> MetricsGroup | None:
    """The app's metric families (REACHLIMIT_METRICS), or None with metrics off."""
    if not settings.metrics:
        return None
    _metrics_class()
    from .prometheus import MetricsGroup

    return MetricsGroup()


def build_state(
    name: str, settings: Settings, budgets: AppBudgets,
    refresh_wrapper: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
) -> BudgetState:
    """Budget ``name``'s state (see the module's design note), its path's
    ``refresh_wrapper`` set before the state is added where other threads can find it. No
    connection is opened."""
    group = budgets.group
    meter = (
        None if group is None else partial(_metrics_class(), budget=name, group=group)
    )
    if settings.redis_url and settings.enabled:
        shared = shared_path(settings, meter, name, budgets.links)
        state = BudgetState(
            settings, shared.path, shared.metrics, redis=shared.health,
            counters=shared.counters, name=name,
        )
        state.closers = shared.closers
    else:
        cache: TTLCache[Any] = TTLCache(
            settings.cache_size, settings.cache_ttl, stale=settings.stale
        )
        if meter is not None:
            metrics = meter(
                settings.active, settings.queue, settings.wait, settings.limiter_retry_after,
                cache=cache, deadline=settings.deadline,
            )
            state = BudgetState(settings, metrics.path, metrics, name=name)
        else:
            limiter = ColdLimiter(
                settings.active, settings.queue, settings.wait, settings.limiter_retry_after,
                deadline=settings.deadline,
            )
            state = BudgetState(settings, ColdPath(limiter, cache), name=name)
    # The refresher's threads stop first: a refresh running may still need the rest.
    state.closers.insert(0, state.path.close)
    state.path.refresh_wrapper = refresh_wrapper
    budgets.add(state)
    return state


def service_stats(state: BudgetState) -> ColdPathStats:
    """The budget's figures; on Redis the whole service's (the path's counters as added up
    in Redis), or this process's while Redis is unavailable."""
    stats = state.path.stats()
    counters = state.counters
    if counters is None or stats.degraded:
        return stats
    try:
        return counters.apply(stats)
    except Exception as exc:  # Redis failed between the two reads: this process's figures
        # pragma below: a DEBUG line's words and argument are no behaviour
        log.debug("reachlimit: the service's counters could not be read (%s)",  # pragma: no mutate
                  type(exc))  # pragma: no mutate
        return stats


def clear_cache(state: BudgetState) -> None:
    """Empty budget ``state``'s warm cache, when it can be emptied: in process at once; on
    Redis every entry of the service and this process's first level (another process's
    first level within its ``local_ttl``), and ``reachlimit.Unavailable`` when Redis cannot
    be reached (the fallback cache is emptied all the same)."""
    clear = getattr(state.path.cache, "clear", None)
    if callable(clear):
        clear()
