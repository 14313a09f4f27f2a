"""Flask extension: run one expensive endpoint through a :class:`~reachlimit.ColdPath`.

design:

    rl.cold(key, build)                      (runs in the request's handler thread)
      app.extensions["reachlimit"] -> this app's ColdPath and settings
      cancel = a watch on the client's socket (gunicorn / Werkzeug), or None
      ColdPath.get(key, build, cancel)
        value ........................ returned to the view
        Busy ......................... HTTPException: 429 (or 503) JSON, Retry-After: 2
        Cancelled .................... 499, logged; nobody is left to read it
        anything build raised ........ propagates unchanged to the app's own handlers

The refusal is raised as a bare ``HTTPException`` carrying its finished response (code None),
which Flask returns as it is without consulting any error handler: an app with its own
``errorhandler(429)`` or ``errorhandler(Exception)`` still sends the JSON body and the header.

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
import select
import socket
import sys
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, fields
from types import FrameType
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from . import Busy, Cancelled, ColdLimiter, ColdPath, ColdPathStats, TTLCache

if TYPE_CHECKING:
    from .prometheus import ReachMetrics

__all__ = ["ReachLimit", "ColdRefused", "ClientGone", "Settings"]

log = logging.getLogger("reachlimit")

#: nginx's code for "client closed the request": nobody is left to read the answer.
STATUS_CLIENT_GONE = 499

#: Threads a worker needs beyond ``active + queue``: room for warm hits and fast refusals
#: while every build slot and queue place is taken.
SPARE_THREADS = 4


@dataclass(frozen=True)
class Settings:
    """One app's configuration, read once by ``init_app``."""

    active: int = 2
    queue: int = 8
    wait: float = 3.0
    retry_after: int = 2
    cache_ttl: float = 300.0
    cache_size: int = 256
    status: int = 429
    cancel_on_disconnect: bool = True
    #: Prometheus metrics (``reachlimit.prometheus``, needs prometheus_client).
    metrics: bool = False

    @property
    def threads_needed(self) -> int:
        return self.active + self.queue + SPARE_THREADS


_CONFIG_PREFIX = "REACHLIMIT_"
_OPTION_NAMES = frozenset(f.name for f in fields(Settings))


def _as_int(key: str, value: Any, minimum: int, allowed: str | None = None) -> int:
    """A whole number >= minimum; numeric strings (from the environment) are accepted."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value, re.ASCII):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be {allowed or f'a whole number >= {minimum}'}, "
                         f"got {value!r}")
    return value


def _as_positive_float(key: str, value: Any) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{key} must be a number of seconds > 0, got {value!r}")
    return number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _read_settings(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Constructor arguments win over ``REACHLIMIT_*`` config keys, which win over defaults."""
    defaults = Settings()

    def pick(name: str) -> tuple[str, Any]:
        key = _CONFIG_PREFIX + name.upper()
        if name in overrides:
            return f"{name} (ReachLimit argument)", overrides[name]
        return key, config.get(key, getattr(defaults, name))

    status_key, raw_status = pick("status")
    status = _as_int(status_key, raw_status, 0, allowed="429 or 503")
    if status not in (429, 503):
        raise ValueError(f"{status_key} must be 429 or 503, got {raw_status!r}")
    return Settings(
        active=_as_int(*pick("active"), 1),
        queue=_as_int(*pick("queue"), 0),
        wait=_as_positive_float(*pick("wait")),
        retry_after=_as_int(*pick("retry_after"), 1),
        cache_ttl=_as_positive_float(*pick("cache_ttl")),
        cache_size=_as_int(*pick("cache_size"), 1),
        status=status,
        cancel_on_disconnect=_as_bool(*pick("cancel_on_disconnect")),
        metrics=_as_bool(*pick("metrics")),
    )


class ColdRefused(HTTPException):
    """A refusal turned into its finished JSON response; ``busy`` is the library's reason.

    ``code`` stays None so Flask sends ``response`` as it is, past every error handler."""

    def __init__(self, response: Response, busy: Busy) -> None:
        super().__init__(response=response)
        self.busy = busy


class ClientGone(HTTPException):
    """The client left while its request waited; answered (and logged) as 499."""

    def __init__(self) -> None:
        super().__init__(
            response=Response(b"", status=f"{STATUS_CLIENT_GONE} Client Closed Request")
        )


class _State:
    """What one app holds in ``app.extensions["reachlimit"]``."""

    __slots__ = ("settings", "path", "metrics")

    def __init__(
        self, settings: Settings, path: ColdPath, metrics: ReachMetrics | None = None
    ) -> None:
        self.settings = settings
        self.path = path
        self.metrics = metrics


_POLLRDHUP: int | None = getattr(select, "POLLRDHUP", None)
_warned_no_rdhup = threading.Event()


class SocketWatch:
    """A cancel token that is set once the client behind ``sock`` has closed its side.

    ``is_set()`` polls with a zero timeout and never reads; the poll object is made on the
    first call, so a warm hit that never waits pays nothing for it."""

    __slots__ = ("_fd", "_poll", "_gone")

    _GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL | (_POLLRDHUP or 0)

    def __init__(self, sock: socket.socket) -> None:
        self._fd = sock.fileno()
        self._poll: select.poll | None = None
        self._gone = False

    def is_set(self) -> bool:
        if self._gone:
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self._fd, self._GONE)
        for _fd, events in self._poll.poll(0):
            if events & self._GONE:
                self._gone = True
        return self._gone


def _client_watch(environ: Mapping[str, Any]) -> SocketWatch | None:
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None or not hasattr(sock, "fileno"):
        return None
    if _POLLRDHUP is None:
        if not _warned_no_rdhup.is_set():
            _warned_no_rdhup.set()
            log.warning("select.POLLRDHUP is not available here: clients that leave while "
                        "queued keep their place until their wait ends")
        return None
    return SocketWatch(sock)


def _metered_state(settings: Settings, cache: TTLCache[Any]) -> _State:
    """This app's state with a metered cold path (REACHLIMIT_METRICS)."""
    try:
        from .prometheus import ReachMetrics
    except ImportError as exc:
        raise ValueError(
            "REACHLIMIT_METRICS needs prometheus_client: pip install 'reachlimit[prometheus]' "
            f"({exc})"
        ) from None
    metrics = ReachMetrics(
        settings.active, settings.queue, settings.wait, settings.retry_after, cache=cache
    )
    return _State(settings, metrics.path, metrics)


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
    ``status``, ``cancel_on_disconnect``, ``metrics``) and win over the app's config.
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
        limiter = ColdLimiter(
            settings.active, settings.queue, settings.wait, settings.retry_after
        )
        cache: TTLCache[Any] = TTLCache(settings.cache_size, settings.cache_ttl)
        app.extensions["reachlimit"] = _State(settings, ColdPath(limiter, cache))
        if settings.metrics:  # the same path, metered (the unused plain one is dropped)
            app.extensions["reachlimit"] = _metered_state(settings, cache)
        threads = _gunicorn_threads()
        if threads is not None and threads < settings.threads_needed:
            log.warning(
                "gunicorn runs %d thread(s) per worker, fewer than active + queue + %d = %d: "
                "the queue can never fill and warm requests starve behind cold ones; "
                "start gunicorn with --threads %d or more",
                threads, SPARE_THREADS, settings.threads_needed, settings.threads_needed,
            )

    # -- per request ------------------------------------------------------------------

    def cold(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Run the five layers for ``key`` in the current request and return the value.

        A refusal raises :class:`ColdRefused` (the finished 429/503 response); a client that
        left while waiting raises :class:`ClientGone` (499); ``build``'s own exceptions pass
        through unchanged and are never cached."""
        state = self._state()
        cancel = _client_watch(request.environ) if state.settings.cancel_on_disconnect else None
        try:
            return state.path.get(key, build, cancel)
        except Busy as busy:
            raise ColdRefused(self._refusal(busy, state.settings), busy) from None
        except Cancelled:
            log.info("client left while waiting for %r; answered 499", key)
            raise ClientGone() from None

    @staticmethod
    def _refusal(busy: Busy, settings: Settings) -> Response:
        retry_after = max(1, int(busy.retry_after))
        if busy.reason == Busy.QUEUE_FULL:
            sentence = "Too many reports are being built right now; please retry shortly."
        else:
            sentence = "Waited too long for a free build slot; please retry shortly."
        body = json.dumps({"error": sentence, "retryAfter": retry_after})
        response = Response(body, status=settings.status, mimetype="application/json")
        response.headers["Retry-After"] = str(retry_after)
        response.headers["Cache-Control"] = "no-store"
        return response

    # -- figures and housekeeping -------------------------------------------------------

    @property
    def path(self) -> ColdPath:
        """The current app's :class:`~reachlimit.ColdPath`."""
        return self._state().path

    def settings(self) -> Settings:
        return self._state().settings

    def stats(self) -> ColdPathStats:
        """The current app's figures: the limiter's plus hits, misses, builds, coalesced."""
        return self._state().path.stats()

    def clear_cache(self) -> None:
        """Empty the current app's warm cache (when the cache object can be emptied)."""
        clear = getattr(self._state().path.cache, "clear", None)
        if callable(clear):
            clear()

    def health_view(self) -> Response:
        """A view function: ``{"status": "ok", "reach": {<figures>}}``."""
        response = jsonify(status="ok", reach=self.stats().as_dict())
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
        try:
            state = current_app.extensions["reachlimit"]
        except KeyError:
            raise RuntimeError(
                "ReachLimit is not initialised on this app: call init_app(app) first"
            ) from None
        assert isinstance(state, _State)
        return state
