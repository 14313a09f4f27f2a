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

    AppBudgets.build(name, options) -> BudgetState
      settings     budget_settings: the options, then REACHLIMIT_BUDGETS, then the app's
      in process   ColdLimiter + TTLCache (+ stale) -> ColdPath, or the metered path
      on Redis     reachlimit._flask_redis.shared_path: its own keys, slots and settings
                   record ({<prefix>:<name>}; the default keeps {<prefix>:cold})
      disabled     (REACHLIMIT_ENABLED false, or the budget's enabled=False) the in-process
                   path whatever the Redis URL, never used: the extension runs each build
                   directly, so the budget's figures stay at zero. No Redis object is made
                   for it (an app whose every budget is disabled never imports redis-py)
      the path's build_wrapper (run around every build it runs, a refresh's too): the value
      rule (reachlimit._values), the "auto" Retry-After's timing, and with a stale window
      the app context a refresh needs off the request's thread

    BudgetState.stats() / forget(key) / clear_cache()
                                          the budget's figures (on Redis the service's) and
                                          its warm cache: on Redis ResilientCache raises
                                          reachlimit.Unavailable when Redis cannot be reached
                                          (never silent)

Each budget has its own limiter, cache, singleflight, fair queue, refresher, figures and
refusal texts; nothing is shared between two budgets but the app's Redis connection and
metric families. Standard library only (the extension, ``reachlimit.flask``, adds Flask and
the per-request work).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from . import Busy, ColdLimiter, ColdPath, ColdPathStats, TTLCache
from ._answers import refused_status, render_refusal
from ._budget_names import DEFAULT_BUDGET, budget_settings
from ._cache import forget_in
from ._flask_redis import RedisLinks, shared_path
from ._flask_settings import RETRY_AFTER_AUTO, ClientFunc, Settings, client_of
from ._keys import check_key
from ._retry_after import AutoRetryAfter
from ._values import run_ruled

if TYPE_CHECKING:
    from .prometheus import MetricsGroup, ReachMetrics
    from .redis import RedisHealth, SharedPathCounters

__all__ = ["BudgetState", "AppBudgets", "Refusal", "Wrapper", "metrics_group"]

log = logging.getLogger("reachlimit")

#: What a build is run in: the refresh's app context, given by the Flask layer.
Wrapper = Callable[[Callable[[], Any]], Callable[[], Any]]


class Refusal(NamedTuple):
    """A budget's answer to one kind of refusal: its HTTP ``status``, JSON ``body`` and
    ``headers``, its ``retry_after`` (the header's text) and its ``cache_status``."""

    status: int
    body: bytes
    headers: list[tuple[str, str]]
    retry_after: str
    cache_status: str


class BudgetState:
    """One budget of one app: its settings, cold path and figures."""

    __slots__ = (
        "name", "settings", "enabled", "cancel_on_disconnect", "path", "metrics", "redis",
        "counters", "closers", "client_of", "retry_auto", "budgets", "_refusals", "warm_first",
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
        #: settings.enabled and cancel_on_disconnect, read on every cold(): False runs each
        #: build directly; True watches the client's socket while the request waits.
        self.enabled = settings.enabled
        self.cancel_on_disconnect = settings.cancel_on_disconnect
        self.path = path
        self.metrics = metrics
        self.redis = redis  # the shared limiter's Redis, when there is one
        self.counters = counters  # the path's counters added up in Redis, when there is one
        #: What ReachLimit.close() calls: the stops of the background threads, in order.
        self.closers: list[Callable[[], None]] = []
        #: None: the client is the request's remote_addr (the default, read inline); else
        #: what gives it from the request ("none": always None).
        self.client_of: ClientFunc | None = client_of(settings.client)
        #: Nothing to do before the warm read (no Redis counters to start, no client
        #: callable to run, the budget on): a warm hit is the cache's answer alone.
        self.warm_first = counters is None and self.client_of is None and self.enabled
        #: REACHLIMIT_RETRY_AFTER="auto": the build times and the formula; else None.
        self.retry_auto = (
            AutoRetryAfter(settings.active, settings.queue)
            if settings.retry_after == RETRY_AFTER_AUTO
            else None
        )
        #: The app's budgets, this one included (set when the app's set is made).
        # (no mutate: AppBudgets.add sets it before the state can be found, so its start is
        # never read)
        self.budgets: AppBudgets | None = None  # pragma: no mutate
        # (reason, retry_after) -> the refusal's answer, rendered once. No lock, on purpose:
        # two threads may render the same refusal at once, and either copy is right.
        self._refusals: dict[tuple[str, int], Refusal] = {}

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

    def refusal(self, busy: Busy) -> Refusal:
        """The answer to ``busy``, rendered on the first refusal of each kind and reused."""
        kind = busy.args  # (reason, retry_after): the kind, with no tuple made
        rendered = self._refusals.get(kind)
        if rendered is None:  # (a miss only renders the same answer again)
            body, headers = render_refusal(busy, self.name, self.settings.refusal_message)
            # "unavailable" (Redis down, fallback "refuse") is the service's failure, not
            # the client's: 503 whatever REACHLIMIT_STATUS says.
            status = 503 if busy.reason == Busy.UNAVAILABLE else self.settings.status
            retry_after = str(max(1, int(busy.retry_after)))
            rendered = self._refusals[kind] = Refusal(
                status, body, headers, retry_after, refused_status(status)
            )
        return rendered

    def stats(self) -> ColdPathStats:
        """The budget's figures; on Redis the whole service's (the path's counters as added
        up in Redis), or this process's while Redis is unavailable."""
        stats = self.path.stats()
        counters = self.counters
        if counters is None or stats.degraded:
            return stats
        try:
            return counters.apply(stats)
        except Exception as exc:  # Redis failed between the two reads: this process's figures
            # pragma below: a DEBUG line's words and argument are no behaviour
            log.debug(
                "reachlimit: the service's counters could not be read (%s)",  # pragma: no mutate
                type(exc),  # pragma: no mutate
            )
            return stats

    def forget(self, key: Hashable) -> bool:
        """Drop ``key`` (a ``cold()`` key: ``TypeError`` for another) from every level of
        the budget's warm cache; True if it was there."""
        if type(key) is not str:  # (a str passes the check: skipping it only saves time)
            check_key(key, "forget()")
        return forget_in(self.path.cache, key)

    def clear_cache(self) -> None:
        """Empty the budget's warm cache, when it can be emptied: in process at once; on
        Redis every entry of the service and this process's first level (another process's
        first level within its ``local_ttl``), and ``reachlimit.Unavailable`` when Redis
        cannot be reached (the fallback cache is emptied all the same)."""
        clear = getattr(self.path.cache, "clear", None)
        if callable(clear):
            clear()


class AppBudgets:
    """Every budget of one app (see the module's design note). ``in_app_context`` is what a
    refresh of a budget with a stale window runs its build in (the Flask layer's)."""

    def __init__(
        self,
        owner: Any,
        base: Settings,
        configured: Mapping[str, Mapping[str, Any]],
        group: MetricsGroup | None,
        in_app_context: Wrapper | None = None,
    ) -> None:
        self.owner = owner
        self.base = base
        self.configured = configured
        self.group = group
        self.links = RedisLinks()
        self.states: dict[str, BudgetState] = {}
        self._in_app_context = in_app_context
        #: Taken to add a budget declared after init_app (on its first use in this app).
        self.lock = threading.Lock()

    def build(self, name: str, options: Mapping[str, Any]) -> BudgetState:
        """Budget ``name`` with its declared ``options`` (see the module's design note),
        built and added. No connection is opened."""
        # (The default has no options of its own to add: budget_settings would give base.)
        settings = self.base if name == DEFAULT_BUDGET else budget_settings(
            self.base, name, self.configured.get(name, {}), options
        )
        state = _new_state(name, settings, self)
        # Set before the state is added, where other request threads can find it.
        state.path.build_wrapper = partial(
            _wrapped_build, state.retry_auto,
            self._in_app_context if settings.stale > 0 else None,
        )
        state.budgets = self
        self.states[name] = state
        return state

    def ensure(self, name: str, options: Mapping[str, Any]) -> BudgetState:
        """Budget ``name``, built (once, under the lock) if it is not there yet: a budget
        declared after the app's init_app, on its first use in the app."""
        with self.lock:
            # Its caller found no state just before: building again here instead would
            # only differ for a second thread that lost that race.
            state = self.states.get(name)
            return state if state is not None else self.build(name, options)

    def close(self) -> None:
        """Every budget's background work, then the app's Redis connections."""
        for state in list(self.states.values()):
            closers, state.closers = state.closers, []
            for close in closers:
                close()
        self.links.close()


def _wrapped_build(
    retry_auto: AutoRetryAfter | None, in_app_context: Wrapper | None,
    key: Hashable, build: Callable[[], Any],
) -> Callable[[], Any]:
    """A budget's ``build`` as its path runs it: its value through the value rule, timed for
    the "auto" Retry-After, in an app context off the request's thread (a refresh)."""
    run: Callable[[], Any] = partial(run_ruled, build, key, "")
    if retry_auto is not None:
        run = retry_auto.timed(run)
    return run if in_app_context is None else in_app_context(run)


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


def _new_state(name: str, settings: Settings, budgets: AppBudgets) -> BudgetState:
    """Budget ``name``'s state with its limiter, cache and path (module design)."""
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
    return state
