"""Flask extension: run one expensive endpoint through a :class:`~reachlimit.ColdPath`.

design:

    rl.cold(key, build)                      (runs in the request's handler thread)
      app.extensions["reachlimit"] -> this app's ColdPath and settings
      client = request.remote_addr ("remote_addr"), None ("none") or client(request)
                                     (a callable's exception propagates; an unhashable
                                     value is a TypeError: before the path, so nothing held)
      cancel = a watch on the client's socket (gunicorn / Werkzeug), or None
      build timed (REACHLIMIT_RETRY_AFTER="auto" only)
      build run in the app's context (REACHLIMIT_STALE > 0: a refresh runs it elsewhere)
      ColdPath.fetch(key, build, cancel, client)
        value ........................ returned to the view; where it came from is kept
                                       in the request's environ, and an after_request hook
                                       writes it as the answer's Cache-Status (RFC 9211)
        Busy ......................... HTTPException: 429 (or 503) JSON, Retry-After: 2,
                                       Cache-Status: ...; fwd-status=429 (or 503)
                                       ("auto": from recent build times, see AutoRetryAfter)
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

With ``REACHLIMIT_REDIS_URL`` the cold limiter, the warm cache and the singleflight are shared
by every process on that Redis, each behind an in-process fallback (or a 503 refusal): see
``reachlimit._flask_redis``, which also holds ``release_worker``. The settings (``Settings``,
``CONFIG_KEYS``, each option's check) are in ``reachlimit._flask_settings``, the "auto"
Retry-After in ``reachlimit._retry_after``; both standard library only, re-exported here.
This module is the only one that imports Flask.

Fair admission: ``client`` (REACHLIMIT_CLIENT) names whoever asks, and the limiter shares its
queue among those names (see ``reachlimit._limiter``). The default is the request's
``remote_addr``: the peer, or what werkzeug's ``ProxyFix`` made of ``X-Forwarded-For`` in an
app that trusts its proxies - never the leftmost ``X-Forwarded-For`` entry, which any client
can write. It is read from the request on every call, warm hits included (one attribute read).

The extension never stores the app: every figure lives in ``app.extensions["reachlimit"]``,
so one ``ReachLimit`` can serve several apps, each with its own limiter and cache (the path's
``refresh_wrapper`` keeps its app, for the refreshes that run a build outside any request).

Stale answers (REACHLIMIT_STALE > 0): the warm cache keeps entries that long past their TTL
and the path answers them at once while a refresher thread rebuilds them (see
``reachlimit._path``). A refresh runs the view's ``build`` outside the request, in an app
context of its own: a build that needs the request (``request.args``, say) fails there, which
is logged once and leaves the stale entry; read what the build needs before calling ``cold``
(the key holds it anyway).

``Cache-Status`` (RFC 9211), on every answer of a view that called ``cold()``: its values
are written by ``reachlimit._answers``, which also renders the refusal's body and headers.

Client-gone detection is ``reachlimit._cancel``'s ``watch_client`` (its design note says how and
where it cannot see a client leave); the limiter asks it between its 50 ms wait slices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

from flask import Flask, Request, Response, current_app, has_app_context, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.local import LocalProxy

from . import Busy, Cancelled, ColdLimiter, ColdPath, ColdPathStats, TTLCache
from ._answers import REFUSAL_SENTENCES as _REFUSAL_SENTENCES  # noqa: F401  (tests read them)
from ._answers import cache_status, refused_status, render_refusal
from ._cancel import watch_client

# The settings, the "auto" Retry-After and the Redis wiring live in modules of their own
# (standard library only); their names are re-exported here, where they always were.
from ._flask_redis import REDIS_LIMITER_NAME as REDIS_LIMITER_NAME
from ._flask_redis import release_worker, shared_path
from ._flask_settings import (
    _OPTION_NAMES,
    CONFIG_KEYS,
    Settings,
    _client_of,
    _read_settings,
    gunicorn_threads,
)
from ._flask_settings import CLIENT_NONE as CLIENT_NONE
from ._flask_settings import CLIENT_REMOTE_ADDR as CLIENT_REMOTE_ADDR
from ._flask_settings import RETRY_AFTER_AUTO as RETRY_AFTER_AUTO
from ._flask_settings import SPARE_THREADS as SPARE_THREADS
from ._retry_after import AutoRetryAfter

if TYPE_CHECKING:
    from .prometheus import ReachMetrics
    from .redis import RedisHealth, SharedPathCounters

__all__ = [
    "ReachLimit", "ColdRefused", "ClientGone", "Settings", "CONFIG_KEYS", "release_worker",
    "AutoRetryAfter",
]

log = logging.getLogger("reachlimit")

#: Where cold() leaves the answer's Cache-Status for the after_request hook.
_STATUS_KEY = "reachlimit.cache_status"

# Flask types its context proxies as the objects they stand for; these names say what they
# are, so the hot path can ask each for its object once (see ReachLimit._state).
_app_proxy = cast("LocalProxy[Flask]", current_app)
_request_proxy = cast("LocalProxy[Request]", request)

#: nginx's code for "client closed the request": nobody is left to read the answer.
STATUS_CLIENT_GONE = 499


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


class _State:
    """What one app holds in ``app.extensions["reachlimit"]``."""

    __slots__ = (
        "settings", "path", "metrics", "redis", "counters", "closers", "client_of",
        "retry_auto", "_refusals",
    )

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
        #: None: the client is the request's remote_addr (the default, read inline); else
        #: what gives it from the request ("none": always None).
        self.client_of: Callable[[Request], Hashable] | None = _client_of(settings.client)
        #: REACHLIMIT_RETRY_AFTER="auto": the build times and the formula; else None.
        self.retry_auto = (
            AutoRetryAfter(settings.active, settings.queue)
            if settings.retry_after == RETRY_AFTER_AUTO
            else None
        )
        # (reason, retry_after) -> the refusal's body and headers, rendered once. No lock, on
        # purpose: two threads may render the same refusal at once, and either copy is right.
        self._refusals: dict[tuple[str, int], tuple[bytes, list[tuple[str, str]]]] = {}

    def auto_busy(self, busy: Busy) -> Busy:
        """``busy`` with its Retry-After worked out now (``retry_auto`` is set)."""
        auto = self.retry_auto
        assert auto is not None
        if busy.reason == Busy.TIMEOUT:
            try:
                queued = int(self.path.limiter.stats().queued)
            except Exception:  # the figures cannot be read (Redis, say): assume a full queue
                queued = auto.queue
        else:  # queue_full and displaced: the queue was full; unavailable: unknown
            queued = auto.queue
        return Busy(busy.reason, auto.seconds(queued))

    def refusal(self, busy: Busy) -> Response:
        """A fresh response for ``busy`` (a response is mutable, so never shared), built
        from a body and headers rendered on the first refusal of each kind."""
        rendered = self._refusals.get((busy.reason, busy.retry_after))
        if rendered is None:
            rendered = self._refusals[(busy.reason, busy.retry_after)] = render_refusal(busy)
        body, headers = rendered
        # "unavailable" (Redis down, fallback "refuse") is the service's failure, not the
        # client's: 503 whatever REACHLIMIT_STATUS says.
        status = 503 if busy.reason == Busy.UNAVAILABLE else self.settings.status
        # A one-item list rather than bytes: with Content-Length already among the headers,
        # the response need not measure and set it again.
        response = Response([body], status, headers)
        response.headers["Cache-Status"] = refused_status(status)
        return response


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


def _write_cache_status(response: Response) -> Response:
    """after_request: the Cache-Status that cold() left in this request's environ."""
    status = _request_proxy._get_current_object().environ.get(_STATUS_KEY)
    if status is not None:
        # Added, not set: Cache-Status is a list (RFC 9211), and a header the view set
        # already (an upstream cache's entry, say) stays before ours.
        response.headers.add("Cache-Status", status)
    return response


def _in_app_context(app: Flask, build: Callable[[], Any]) -> Callable[[], Any]:
    """``build``, run in an app context of ``app`` when none is active (a refresh's thread)."""

    def run() -> Any:
        if has_app_context():
            return build()
        with app.app_context():
            return build()

    return run


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
        settings.active, settings.queue, settings.wait, settings.limiter_retry_after,
        cache=cache,
    )
    return _State(settings, metrics.path, metrics)


def _shared_state(settings: Settings) -> _State:
    """This app's state on the shared limiter of ``settings.redis_url`` (REACHLIMIT_REDIS_URL;
    see ``reachlimit._flask_redis``). No connection is opened here."""
    shared = shared_path(settings, _metrics_class() if settings.metrics else None)
    state = _State(
        settings, shared.path, shared.metrics, redis=shared.health, counters=shared.counters
    )
    state.closers = shared.closers
    return state


class ReachLimit:
    """``ReachLimit(app=None, **overrides)``: the Flask face of :class:`~reachlimit.ColdPath`.

    Overrides are the config keys in lower case without the ``REACHLIMIT_`` prefix
    (``active``, ``queue``, ``wait``, ``retry_after``, ``cache_ttl``, ``cache_size``,
    ``status``, ``cancel_on_disconnect``, ``metrics``, ``redis_url``, ``redis_prefix``,
    ``lease``, ``redis_fallback``, ``client``) and win over the app's config.

    ``client`` (REACHLIMIT_CLIENT) says who asks, for fair admission: ``"remote_addr"``
    (default; the peer, or ProxyFix's rightmost trusted hop), ``"none"`` (one client: plain
    FIFO), or - as this argument only - a callable ``(request) -> hashable`` such as the
    authenticated user. It is called once per ``cold()``, warm hits included, so keep it
    cheap; None from it is the one anonymous client. If it raises, the exception propagates
    from ``cold()`` unchanged; if its value cannot be hashed, ``cold()`` raises
    ``TypeError``. Either way before anything is held: no slot, no queue place, no flight.

    ``retry_after="auto"`` works out each refusal's Retry-After from recent build times
    (:class:`AutoRetryAfter`; its clock and random source are attributes of
    ``app.extensions["reachlimit"].retry_auto``, for tests).

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
            state = _shared_state(settings)
        else:
            limiter = ColdLimiter(
                settings.active, settings.queue, settings.wait, settings.limiter_retry_after
            )
            cache: TTLCache[Any] = TTLCache(
                settings.cache_size, settings.cache_ttl, stale=settings.stale
            )
            state = _State(settings, ColdPath(limiter, cache))
            if settings.metrics:  # the same path, metered (the unused plain one is dropped)
                state = _metered_state(settings, cache)
        # The refresher's threads stop first: a refresh running may still need the rest.
        state.closers.insert(0, state.path.close)
        if settings.stale > 0:
            # A refresh runs the build on a refresher thread: in an app context of its own.
            state.path.refresh_wrapper = lambda build: _in_app_context(app, build)
        app.extensions["reachlimit"] = state
        for answered in (ColdRefused, ClientGone):
            app.register_error_handler(answered, _send_finished)
        app.after_request(_write_cache_status)
        threads = gunicorn_threads()
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
        through unchanged and are never cached.

        The request's client (the ``client`` option) is worked out first, on every call: a
        client callable's own exception propagates unchanged, and a value it returns that
        cannot be hashed raises ``TypeError`` naming the callable - both before the cache,
        the singleflight or the limiter is touched, so nothing is held or counted, and
        both reach the app's error handlers (a 500) like a failed build."""
        state = self._state()
        if state.counters is not None:
            state.counters.ensure_running()  # the first request of this (forked) process
        asking = _request_proxy._get_current_object()
        client_of = state.client_of
        # remote_addr is a plain attribute werkzeug set from environ["REMOTE_ADDR"] (after
        # ProxyFix, if the app has it): the cheapest read of it there is. First, so that a
        # client callable that fails leaves nothing behind (not even a socket watch).
        client = asking.remote_addr if client_of is None else client_of(asking)
        cancel = watch_client(asking.environ) if state.settings.cancel_on_disconnect else None
        if state.retry_auto is not None:
            build = state.retry_auto.timed(build)
        try:
            answer = state.path.fetch(key, build, cancel, client)
        except Busy as busy:
            if state.retry_auto is not None:
                busy = state.auto_busy(busy)
            raise ColdRefused(state.refusal(busy), busy) from None
        except Cancelled:
            log.info("client left while waiting for %r; answered 499", key)
            raise ClientGone() from None
        asking.environ[_STATUS_KEY] = cache_status(answer)
        return answer.value

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
        # The figures first: reading them is what notices Redis failing, so the health of
        # Redis read after them agrees with them (never "degraded" beside "up").
        figures = _service_stats(state).as_dict()
        extra = {} if state.redis is None else {"redis": state.redis.figures()}
        response = jsonify(status="ok", reach=figures, **extra)
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
