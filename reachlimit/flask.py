"""Flask extension: run one expensive endpoint through a :class:`~reachlimit.ColdPath`.

design:

    rl.cold(key, build)                      (runs in the request's handler thread)
      app.extensions["reachlimit"] -> this app's ColdPath and settings
      cancel = a watch on the client's socket (gunicorn / Werkzeug), or None
      ColdPath.get(key, build, cancel)
        value ........................ returned to the view
        Busy ......................... HTTPException: 429 (or 503) JSON, Retry-After: 2
        Busy("unavailable") .......... 503 JSON, Retry-After (Redis down, fallback "refuse")
        Cancelled .................... 499, logged; nobody is left to read it
        anything build raised ........ propagates unchanged to the app's own handlers

The refusal is raised as an ``HTTPException`` subclass carrying its finished response, and
``init_app`` registers the handler that returns that response for exactly that class. Flask
looks for a handler under the exception's code first and, within a code, by the exception's own
class before its bases, so ours is found before the app's ``errorhandler(429)`` (registered for
``TooManyRequests``) or ``errorhandler(Exception)``: the JSON body and the header are sent
whatever the app registered. Returning a finished ``Response`` from a handler is also the
cheapest way out of a view: a bare exception would be run as a WSGI app and its answer copied.
The refusal body and headers are rendered once per app and reused.

With ``REACHLIMIT_REDIS_URL`` the cold limiter is ``reachlimit.redis``'s ResilientLimiter: the
shared RedisColdLimiter while Redis answers, an in-process ColdLimiter (or a 503 refusal) while
it does not; redis-py is imported only then. The warm cache and the singleflight are shared
too (``RedisCache`` and ``RedisSingleFlight``, each behind the same fallback:
``_shared_cache_and_flight``), and ``SharedPathCounters`` adds up every process's hits, misses,
builds and coalesced for ``rl.stats()`` and the health view; its thread starts with the
process's first request (``cold``), so never in a preloading master.

The extension never stores the app: every figure lives in ``app.extensions["reachlimit"]``,
so one ``ReachLimit`` can serve several apps, each with its own limiter and cache.

Client-gone detection registers the request's socket with ``select.poll`` for ``POLLRDHUP``
(the peer shut its side), ``POLLHUP`` and ``POLLERR``, and polls it with a zero timeout in the
limiter's 50 ms wait slices: no busy loop and never a read of the socket. Its limits: a client
that half-closes (shuts down writing but still reads) looks gone; a proxy in front of gunicorn
must pass client aborts on (nginx: ``proxy_ignore_client_abort off``, the default); TLS
terminated in gunicorn and HTTP/2 front ends do not show a client's close the same way.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, fields
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from flask import Flask, Request, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.local import LocalProxy

from . import Busy, Cancelled, ColdLimiter, ColdPath, ColdPathStats, SingleFlight, TTLCache
from ._cancel import watch_client
from ._path import Cache, Flight
from ._urls import mask_url

if TYPE_CHECKING:
    from .prometheus import ReachMetrics
    from .redis import RedisHealth, SharedPathCounters

__all__ = [
    "ReachLimit", "ColdRefused", "ClientGone", "Settings", "CONFIG_KEYS", "release_worker"
]

log = logging.getLogger("reachlimit")

# Flask types its context proxies as the objects they stand for; these names say what they
# are, so the hot path can ask each for its object once (see ReachLimit._state).
_app_proxy = cast("LocalProxy[Flask]", current_app)
_request_proxy = cast("LocalProxy[Request]", request)

#: nginx's code for "client closed the request": nobody is left to read the answer.
STATUS_CLIENT_GONE = 499

#: Threads a worker needs beyond ``active + queue``: room for warm hits and fast refusals
#: while every build slot and queue place is taken.
SPARE_THREADS = 4

#: The name of the shared limiter under ``REACHLIMIT_REDIS_PREFIX``: every process with the
#: same Redis URL and prefix shares one budget.
REDIS_LIMITER_NAME = "cold"

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


# -- settings: each option's name, default and check are written once, here ---------------

Check = Callable[[str, Any], Any]


def _whole(minimum: int, allowed: str | None = None) -> Check:
    """A whole number >= minimum; numeric strings (from the environment) are accepted."""
    def check(key: str, value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value, re.ASCII):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{key} must be {allowed or f'a whole number >= {minimum}'}, "
                             f"got {value!r}")
        return int(value)
    return check


def _one_of(*choices: int) -> Check:
    allowed = " or ".join(map(str, choices))
    whole = _whole(0, allowed)

    def check(key: str, value: Any) -> int:
        number: int = whole(key, value)
        if number not in choices:
            raise ValueError(f"{key} must be {allowed}, got {value!r}")
        return number
    return check


def _seconds(key: str, value: Any) -> float:
    """A finite number of seconds > 0."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{key} must be a number of seconds > 0, got {value!r}")
    return number


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _choice(*choices: str) -> Check:
    allowed = " or ".join(repr(c) for c in choices)

    def check(key: str, value: Any) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise ValueError(f"{key} must be {allowed}, got {value!r}")
        return str(text)
    return check


def _redis_url(key: str, value: Any) -> str | None:
    """None or empty: no Redis (in-process limits); else a redis://, rediss:// or unix://
    URL. The error shows the URL with its password masked."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.strip().startswith(_REDIS_SCHEMES):
        raise ValueError(
            f"{key} must be a redis://, rediss:// or unix:// URL (or empty for in-process "
            f"limits), got {mask_url(value)!r}"
        )
    return value.strip()


def _redis_prefix(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "{" in value or "}" in value:
        raise ValueError(f"{key} must be a non-empty string without braces, got {value!r}")
    return value.strip()


def _option(default: Any, check: Check, *, show: bool = True) -> Any:
    return field(default=default, metadata={"check": check}, repr=show)


@dataclass(frozen=True)
class Settings:
    """One app's configuration, read once by ``init_app``.

    Each field is an option: its name in upper case after ``REACHLIMIT_`` is the config key,
    its name as it is the ``ReachLimit(...)`` argument, and its metadata holds its check."""

    active: int = _option(2, _whole(1))
    queue: int = _option(8, _whole(0))
    wait: float = _option(3.0, _seconds)
    retry_after: int = _option(2, _whole(1))
    cache_ttl: float = _option(300.0, _seconds)
    cache_size: int = _option(256, _whole(1))
    status: int = _option(429, _one_of(429, 503))
    cancel_on_disconnect: bool = _option(True, _flag)
    #: Prometheus metrics (``reachlimit.prometheus``, needs prometheus_client).
    metrics: bool = _option(False, _flag)
    #: A Redis URL: one budget shared by every process on it (``reachlimit.redis``, needs
    #: redis-py). None or empty: in-process limits. Never shown in a repr (its password).
    redis_url: str | None = _option(None, _redis_url, show=False)
    #: The prefix of the shared limiter's keys (processes that share a budget share it).
    redis_prefix: str = _option("reachlimit", _redis_prefix)
    #: Seconds a shared build slot outlives a process that died without giving it back.
    lease: float = _option(10.0, _seconds)
    #: While Redis is unavailable: "local" (each process's own limits) or "refuse" (503).
    redis_fallback: str = _option("local", _choice("local", "refuse"))

    @property
    def threads_needed(self) -> int:
        return self.active + self.queue + SPARE_THREADS

    @property
    def redis_where(self) -> str | None:
        """The Redis URL with its password masked (None without Redis): for logs and errors."""
        return mask_url(self.redis_url) if self.redis_url else None


_CONFIG_PREFIX = "REACHLIMIT_"
_OPTION_NAMES = frozenset(f.name for f in fields(Settings))

#: Every config key the extension reads, e.g. for an app that takes them from the environment.
CONFIG_KEYS = tuple(_CONFIG_PREFIX + f.name.upper() for f in fields(Settings))


def _read_settings(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Constructor arguments win over ``REACHLIMIT_*`` config keys, which win over defaults."""
    values: dict[str, Any] = {}
    for option in fields(Settings):
        name = option.name
        if name in overrides:
            key, raw = f"{name} (ReachLimit argument)", overrides[name]
        else:
            key = _CONFIG_PREFIX + name.upper()
            raw = config.get(key, option.default)
        values[name] = option.metadata["check"](key, raw)
    return Settings(**values)


class ColdRefused(HTTPException):
    """A refusal turned into its finished JSON response; ``busy`` is the library's reason.

    ``init_app`` registers :func:`_send_finished` for this class, so Flask sends ``response``
    as it is, before any handler of the app's own (see the module's design note). The class's
    ``code`` is what Flask files that handler under; an instance's is its response's."""

    code = 429

    def __init__(self, response: Response, busy: Busy) -> None:
        super().__init__(response=response)
        self.code = response.status_code
        self.busy = busy


class ClientGone(HTTPException):
    """The client left while its request waited; answered (and logged) as 499."""

    code = STATUS_CLIENT_GONE

    def __init__(self) -> None:
        super().__init__(
            response=Response(b"", status=f"{STATUS_CLIENT_GONE} Client Closed Request")
        )


def _send_finished(exc: ColdRefused | ClientGone) -> Response:
    """The error handler of our own exceptions: their finished response, as it is."""
    response = exc.response
    assert isinstance(response, Response)
    return response


_REFUSAL_SENTENCES = {
    Busy.QUEUE_FULL: "Too many reports are being built right now; please retry shortly.",
    Busy.TIMEOUT: "Waited too long for a free build slot; please retry shortly.",
    Busy.UNAVAILABLE: "The shared build limiter is unavailable right now; please retry "
    "shortly.",
}


class _State:
    """What one app holds in ``app.extensions["reachlimit"]``."""

    __slots__ = ("settings", "path", "metrics", "redis", "counters", "closers", "_refusals")

    def __init__(
        self,
        settings: Settings,
        path: ColdPath,
        metrics: ReachMetrics | None = None,
        redis: RedisHealth | None = None,
        counters: SharedPathCounters | None = None,
    ) -> None:
        self.settings = settings
        self.path = path
        self.metrics = metrics
        self.redis = redis  # the shared limiter's Redis, when there is one
        self.counters = counters  # the path's counters added up in Redis, when there is one
        #: What ReachLimit.close() calls: the stops of the background threads, in order.
        self.closers: list[Callable[[], None]] = []
        # (reason, retry_after) -> the refusal's body and headers, rendered once. No lock, on
        # purpose: two threads may render the same refusal at once, and either copy is right.
        self._refusals: dict[tuple[str, int], tuple[bytes, list[tuple[str, str]]]] = {}

    def refusal(self, busy: Busy) -> Response:
        """A fresh response for ``busy`` (a response is mutable, so never shared), built
        from a body and headers rendered on the first refusal of each kind."""
        rendered = self._refusals.get((busy.reason, busy.retry_after))
        if rendered is None:
            rendered = self._refusals[(busy.reason, busy.retry_after)] = _render_refusal(busy)
        body, headers = rendered
        # "unavailable" (Redis down, fallback "refuse") is the service's failure, not the
        # client's: 503 whatever REACHLIMIT_STATUS says.
        status = 503 if busy.reason == Busy.UNAVAILABLE else self.settings.status
        # A one-item list rather than bytes: with Content-Length already among the headers,
        # the response need not measure and set it again.
        return Response([body], status, headers)


def _service_stats(state: _State) -> ColdPathStats:
    stats = state.path.stats()
    counters = state.counters
    if counters is None or stats.degraded:
        return stats
    try:
        return counters.apply(stats)
    except Exception as exc:  # Redis failed between the two reads: this process's figures
        log.debug("reachlimit: the service's counters could not be read (%s)", type(exc))
        return stats


def _render_refusal(busy: Busy) -> tuple[bytes, list[tuple[str, str]]]:
    retry_after = max(1, int(busy.retry_after))
    sentence = _REFUSAL_SENTENCES.get(busy.reason, _REFUSAL_SENTENCES[Busy.TIMEOUT])
    body = json.dumps({"error": sentence, "retryAfter": retry_after}).encode()
    return body, [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Retry-After", str(retry_after)),
        ("Cache-Control", "no-store"),
    ]


def _metrics_class() -> type[ReachMetrics]:
    try:
        from .prometheus import ReachMetrics
    except ImportError as exc:
        raise ValueError(
            "REACHLIMIT_METRICS needs prometheus_client: pip install 'reachlimit[prometheus]' "
            f"({exc})"
        ) from None
    return ReachMetrics


def _metered_state(settings: Settings, cache: TTLCache[Any]) -> _State:
    """This app's state with a metered cold path (REACHLIMIT_METRICS)."""
    metrics = _metrics_class()(
        settings.active, settings.queue, settings.wait, settings.retry_after, cache=cache
    )
    return _State(settings, metrics.path, metrics)


def _shared_state(settings: Settings) -> _State:
    """This app's state on the shared limiter of ``settings.redis_url`` (REACHLIMIT_REDIS_URL):
    a RedisColdLimiter behind a ResilientLimiter that falls back to an in-process limiter of
    the same figures (or refuses) while Redis is unavailable. No connection is opened here."""
    metrics_class = _metrics_class() if settings.metrics else None
    try:
        from .redis import (
            RedisColdLimiter,
            RedisHealth,
            ResilientLimiter,
            SharedPathCounters,
            connect,
        )
    except ImportError as exc:
        raise ValueError(
            f"REACHLIMIT_REDIS_URL needs redis-py: pip install 'reachlimit[redis]' ({exc})"
        ) from None
    url = settings.redis_url
    assert url is not None
    client = connect(url)
    health = RedisHealth(url)
    remote = RedisColdLimiter(
        client,
        REDIS_LIMITER_NAME,
        settings.active,
        settings.queue,
        settings.wait,
        settings.retry_after,
        lease=settings.lease,
        prefix=settings.redis_prefix,
    )
    local = ColdLimiter(settings.active, settings.queue, settings.wait, settings.retry_after)
    limiter = ResilientLimiter(remote, local, health, settings.redis_fallback)
    cache, flight = _shared_cache_and_flight(settings, client, health)
    metrics = None
    if metrics_class is not None:
        # Its gauges are read from the shared limiter when scraped, never summed per worker.
        metrics = metrics_class(limiter=limiter, cache=cache, flight=flight)
        path: ColdPath = metrics.path
    else:
        path = ColdPath(limiter, cache, flight)
    counters = SharedPathCounters(client, path, REDIS_LIMITER_NAME, prefix=settings.redis_prefix)
    state = _State(settings, path, metrics, redis=health, counters=counters)
    # Counters first: their last flush needs the client, which closes last.
    state.closers = [counters.close, limiter.close, cast(Any, flight).close, client.close]
    return state


def _shared_cache_and_flight(
    settings: Settings, client: Any, health: RedisHealth
) -> tuple[Cache, Flight]:
    """The warm cache and the singleflight of an app on Redis, each over its in-process
    fallback and the limiter's ``health``, so that Redis failing degrades all three at once.
    ``client`` is the limiter's ``redis.Redis`` (made by ``reachlimit.redis.connect``).

    The cache keeps ``cache_ttl`` and ``cache_size`` for the whole service, with a 1 s
    in-process first level; values are stored with the "auto" codec (bytes as bytes,
    anything else as JSON - never pickle), so a view must return bytes or JSON-able values.
    The flight's lease is the limiter's: a leader whose process dies is taken over after it."""
    from .redis import RedisCache, RedisSingleFlight, ResilientCache, ResilientFlight

    name, prefix = REDIS_LIMITER_NAME, settings.redis_prefix
    local_cache: TTLCache[Any] = TTLCache(settings.cache_size, settings.cache_ttl)
    shared_cache = RedisCache(
        client, name, prefix=prefix, ttl=settings.cache_ttl, size=settings.cache_size,
        codec="auto",
    )
    shared_flight = RedisSingleFlight(
        client, name, prefix=prefix, lease=settings.lease, codec="auto"
    )
    return (
        ResilientCache(shared_cache, local_cache, health),
        ResilientFlight(shared_flight, SingleFlight(), health),
    )


def release_worker(config: Mapping[str, Any], pid: int) -> tuple[int, int] | None:
    """For the parent of a worker process that died (gunicorn's ``child_exit``): free every
    shared build slot and queue place the worker on this host held, at once, instead of
    when their leases end. ``config`` holds the ``REACHLIMIT_*`` keys (``os.environ``, say).
    Returns (slots freed, places removed), or None without a Redis URL. Raises ValueError
    for bad settings and redis-py's errors when Redis cannot be reached."""
    settings = _read_settings(config, {})
    if not settings.redis_url:
        return None
    from .redis import connect, owner_prefix, release_owner

    client = connect(settings.redis_url)
    try:
        return release_owner(
            client,
            owner_prefix(pid),
            name=REDIS_LIMITER_NAME,
            prefix=settings.redis_prefix,
            active=settings.active,
            lease=settings.lease,
        )
    finally:
        client.close()


def _gunicorn_threads() -> int | None:
    """The ``threads`` setting of the gunicorn worker (or preloading master) that is loading
    the app right now, found on the call stack; None when not loaded by gunicorn."""
    workers = sys.modules.get("gunicorn.workers.base")
    apps = sys.modules.get("gunicorn.app.base")
    kinds = tuple(
        cls
        for cls in (getattr(workers, "Worker", None), getattr(apps, "BaseApplication", None))
        if isinstance(cls, type)
    )
    if not kinds:
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, kinds):
            threads = getattr(getattr(owner, "cfg", None), "threads", None)
            return threads if isinstance(threads, int) else None
        frame = frame.f_back
    return None


class ReachLimit:
    """``ReachLimit(app=None, **overrides)``: the Flask face of :class:`~reachlimit.ColdPath`.

    Overrides are the config keys in lower case without the ``REACHLIMIT_`` prefix
    (``active``, ``queue``, ``wait``, ``retry_after``, ``cache_ttl``, ``cache_size``,
    ``status``, ``cancel_on_disconnect``, ``metrics``, ``redis_url``, ``redis_prefix``,
    ``lease``, ``redis_fallback``) and win over the app's config.

    With ``redis_url`` (REACHLIMIT_REDIS_URL) the cold limiter is shared by every process on
    that Redis and prefix; Redis failing is a degraded mode (``redis_fallback``: each
    process's own limits, or 503 refusals), never an error of the app.
    """

    def __init__(self, app: Flask | None = None, **overrides: Any) -> None:
        unknown = sorted(set(overrides) - _OPTION_NAMES)
        if unknown:
            raise TypeError(
                f"unknown ReachLimit option(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_OPTION_NAMES))}"
            )
        self._overrides = dict(overrides)
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the config (raising ``ValueError`` naming a bad key), build this app's
        limiter and cache, and warn when gunicorn gives the worker too few threads."""
        settings = _read_settings(app.config, self._overrides)
        if settings.redis_url:
            app.extensions["reachlimit"] = _shared_state(settings)
        else:
            limiter = ColdLimiter(
                settings.active, settings.queue, settings.wait, settings.retry_after
            )
            cache: TTLCache[Any] = TTLCache(settings.cache_size, settings.cache_ttl)
            app.extensions["reachlimit"] = _State(settings, ColdPath(limiter, cache))
            if settings.metrics:  # the same path, metered (the unused plain one is dropped)
                app.extensions["reachlimit"] = _metered_state(settings, cache)
        for answered in (ColdRefused, ClientGone):
            app.register_error_handler(answered, _send_finished)
        threads = _gunicorn_threads()
        if threads is not None and threads < settings.threads_needed:
            log.warning(
                "gunicorn runs %d thread(s) per worker, fewer than active + queue + %d = %d: "
                "the queue can never fill and warm requests starve behind cold ones; "
                "start gunicorn with --threads %d or more",
                threads, SPARE_THREADS, settings.threads_needed, settings.threads_needed,
            )

    def close(self, app: Flask | None = None) -> None:
        """Stop ``app``'s (default: the current app's) background work for good: on Redis,
        flush the shared counters once more, stop the limiter's renewer and waker threads,
        the singleflight's renewer and the counters' flusher, and close the connections.
        Nothing to do without Redis. Meant for the end of a process or of a test; the app's
        cold path must not be used afterwards. Safe to call more than once."""
        state = (app or _app_proxy._get_current_object()).extensions.get("reachlimit")
        if not isinstance(state, _State):
            raise RuntimeError("ReachLimit is not initialised on this app: call init_app(app)")
        closers, state.closers = state.closers, []
        for close in closers:
            close()

    # -- per request ------------------------------------------------------------------

    def cold(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Run the five layers for ``key`` in the current request and return the value.

        A refusal raises :class:`ColdRefused` (the finished 429/503 response); a client that
        left while waiting raises :class:`ClientGone` (499); ``build``'s own exceptions pass
        through unchanged and are never cached."""
        state = self._state()
        if state.counters is not None:
            state.counters.ensure_running()  # the first request of this (forked) process
        cancel = (
            watch_client(_request_proxy._get_current_object().environ)
            if state.settings.cancel_on_disconnect
            else None
        )
        try:
            return state.path.get(key, build, cancel)
        except Busy as busy:
            raise ColdRefused(state.refusal(busy), busy) from None
        except Cancelled:
            log.info("client left while waiting for %r; answered 499", key)
            raise ClientGone() from None

    # -- figures and housekeeping -------------------------------------------------------

    @property
    def path(self) -> ColdPath:
        """The current app's :class:`~reachlimit.ColdPath`."""
        return self._state().path

    def settings(self) -> Settings:
        return self._state().settings

    def stats(self) -> ColdPathStats:
        """The current app's figures: the limiter's plus hits, misses, builds, coalesced.
        On Redis, the whole service's: the limiter's from Redis, the path's counters as
        added up in Redis by every process (each at most about a second behind; this
        process's own are flushed first). While Redis is unavailable, this process's."""
        return _service_stats(self._state())

    def clear_cache(self) -> None:
        """Empty the current app's warm cache (when the cache object can be emptied)."""
        clear = getattr(self._state().path.cache, "clear", None)
        if callable(clear):
            clear()

    def health_view(self) -> Response:
        """A view function: ``{"status": "ok", "reach": {<figures>}}``; on Redis, also
        ``"redis": {"url" (password masked), "up", "down_for", "outages", "last_error"}``.
        The limiter's figures are then those of every process (``backend: "redis"``), or
        this process's fallback's while Redis is unavailable (``degraded: true``)."""
        state = self._state()
        extra = {} if state.redis is None else {"redis": state.redis.figures()}
        response = jsonify(status="ok", reach=_service_stats(state).as_dict(), **extra)
        response.headers["Cache-Control"] = "no-store"
        return response

    def metrics_view(self) -> Response:
        """A view function: the Prometheus text format (``GET /metrics``). With several
        gunicorn workers in prometheus_client's multiprocess mode, the figures of the whole
        server, whichever worker answers. 404 when metrics are off; 503 (logged) when the
        figures cannot be read - never a traceback."""
        metrics = self._state().metrics
        if metrics is None:
            response = jsonify(error="metrics are off: set REACHLIMIT_METRICS=true")
            response.status_code = 404
            return response
        try:
            body = metrics.exposition()
        except Exception:
            log.exception("reachlimit metrics could not be read")
            return Response("metrics unavailable\n", status=503, mimetype="text/plain")
        response = Response(body, content_type=metrics.content_type)
        response.headers["Cache-Control"] = "no-store"
        return response

    @staticmethod
    def _state() -> _State:
        # _get_current_object(): one look-up of the proxied app, where an attribute read
        # through the proxy costs about six times as much (this runs on every warm hit).
        try:
            state = _app_proxy._get_current_object().extensions["reachlimit"]
        except KeyError:
            raise RuntimeError(
                "ReachLimit is not initialised on this app: call init_app(app) first"
            ) from None
        assert isinstance(state, _State)
        return state
