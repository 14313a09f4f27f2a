"""Flask extension: run one expensive endpoint through a :class:`~reachlimit.ColdPath`.

design:

    rl.cold(key, build)                      (runs in the request's handler thread)
      app.extensions["reachlimit"] -> this app's ColdPath and settings
      client = request.remote_addr ("remote_addr"), None ("none") or client(request)
                                     (a callable's exception propagates; an unhashable
                                     value is a TypeError: before the path, so nothing held)
      cancel = a watch on the client's socket (gunicorn / Werkzeug), or None
      build timed (REACHLIMIT_RETRY_AFTER="auto" only)
      ColdPath.get(key, build, cancel, client)
        value ........................ returned to the view
        Busy ......................... HTTPException: 429 (or 503) JSON, Retry-After: 2
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

With ``REACHLIMIT_REDIS_URL`` the cold limiter is ``reachlimit.redis``'s ResilientLimiter: the
shared RedisColdLimiter while Redis answers, an in-process ColdLimiter (or a 503 refusal) while
it does not; redis-py is imported only then. The warm cache and the singleflight are shared
too (``RedisCache`` and ``RedisSingleFlight``, each behind the same fallback:
``_shared_cache_and_flight``), and ``SharedPathCounters`` adds up every process's hits, misses,
builds and coalesced for ``rl.stats()`` and the health view; its thread starts with the
process's first request (``cold``), so never in a preloading master.

Fair admission: ``client`` (REACHLIMIT_CLIENT) names whoever asks, and the limiter shares its
queue among those names (see ``reachlimit._limiter``). The default is the request's
``remote_addr``: the peer, or what werkzeug's ``ProxyFix`` made of ``X-Forwarded-For`` in an
app that trusts its proxies - never the leftmost ``X-Forwarded-For`` entry, which any client
can write. It is read from the request on every call, warm hits included (one attribute read).

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
import random
import re
import sys
import threading
import time
from collections import deque
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
    "ReachLimit", "ColdRefused", "ClientGone", "Settings", "CONFIG_KEYS", "release_worker",
    "AutoRetryAfter",
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


#: The key a check is given for a ``ReachLimit(...)`` argument: "<name> (ReachLimit argument)".
_ARGUMENT = " (ReachLimit argument)"

#: REACHLIMIT_RETRY_AFTER's one word: a Retry-After worked out per refusal (AutoRetryAfter).
RETRY_AFTER_AUTO = "auto"


def _retry_after(key: str, value: Any) -> int | str:
    """A whole number of seconds >= 1, or "auto"."""
    if isinstance(value, str) and value.strip().lower() == RETRY_AFTER_AUTO:
        return RETRY_AFTER_AUTO
    number: int = _whole(1, "a whole number >= 1 or 'auto'")(key, value)
    return number


#: REACHLIMIT_CLIENT's names: the request's remote_addr, or everybody one client.
CLIENT_REMOTE_ADDR = "remote_addr"
CLIENT_NONE = "none"


def _client(key: str, value: Any) -> str | Callable[[Request], Hashable]:
    """"remote_addr" or "none"; as the ReachLimit argument, also a callable
    ``(request) -> hashable``. Never a header by name: which header to trust is the app's
    decision, made in its callable or by ProxyFix."""
    if callable(value):
        if key.endswith(_ARGUMENT):
            return cast("Callable[[Request], Hashable]", value)
        raise ValueError(
            f"{key} must be 'remote_addr' or 'none' (a callable only as the ReachLimit "
            f"argument client=), got {value!r}"
        )
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in (CLIENT_REMOTE_ADDR, CLIENT_NONE):
        callable_too = " or a callable (request) -> hashable" if key.endswith(_ARGUMENT) else ""
        raise ValueError(f"{key} must be 'remote_addr' or 'none'{callable_too}, got {value!r}")
    return str(text)


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
    #: Whole seconds, or "auto": worked out per refusal from recent build times.
    retry_after: int | str = _option(2, _retry_after)
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
    #: Who asks, for fair admission: "remote_addr", "none" (one client: plain FIFO), or (as
    #: the ReachLimit argument only) a callable ``(request) -> hashable``.
    client: str | Callable[[Request], Hashable] = _option(CLIENT_REMOTE_ADDR, _client)

    @property
    def limiter_retry_after(self) -> int:
        """The whole seconds the limiter puts on its refusals: the setting, or with "auto"
        the default 2 (the extension works out each refusal's own figure instead)."""
        return self.retry_after if isinstance(self.retry_after, int) else 2

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
            key, raw = name + _ARGUMENT, overrides[name]
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
    Busy.DISPLACED: "This request's queue place went to another client's request (the "
    "queue is shared fairly); please retry shortly.",
    Busy.UNAVAILABLE: "The shared build limiter is unavailable right now; please retry "
    "shortly.",
}


class AutoRetryAfter:
    """``REACHLIMIT_RETRY_AFTER="auto"``: each refusal's Retry-After from recent build times.

    ``base = ceil(mean build time x (queued + 1) / active)``, clamped to [1, 30]: about how
    long until the leaders ahead (``queued``) and one more have had a slot. 2 until a build
    has been timed. Each refusal then adds ``randint(0, max(1, base // 4))`` so clients
    refused together do not come back together; a sum above 30 takes the spread off instead
    (``base - spread``), so every figure is a whole number of seconds in [1, 30].

    Build times are this process's (per app), the last ``SAMPLES`` builds that ran, whatever
    they returned or raised. ``clock`` (monotonic seconds) and ``randint`` (``random.randint``'s
    signature) are attributes a test may replace: ``app.extensions["reachlimit"].retry_auto``.
    Thread-safe: the samples are guarded by a lock taken once per build and per refusal."""

    SAMPLES = 16
    LOWEST = 1
    HIGHEST = 30
    #: The base before any build has been timed: the fixed default.
    UNMEASURED = 2

    def __init__(
        self,
        active: int,
        queue: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        randint: Callable[[int, int], int] = random.randint,
    ) -> None:
        self.active = active
        self.queue = queue
        self.clock = clock
        self.randint = randint
        self._lock = threading.Lock()
        self._durations: deque[float] = deque(maxlen=self.SAMPLES)  # guarded by _lock

    def timed(self, build: Callable[[], Any]) -> Callable[[], Any]:
        """``build``, recording how long each run of it takes."""
        clock, record = self.clock, self.record

        def timed_build() -> Any:
            started = clock()
            try:
                return build()
            finally:
                record(clock() - started)

        return timed_build

    def record(self, seconds: float) -> None:
        with self._lock:
            self._durations.append(max(0.0, seconds))

    def mean(self) -> float | None:
        """The mean of the recent build times, None before the first."""
        with self._lock:
            if not self._durations:
                return None
            return sum(self._durations) / len(self._durations)

    def base(self, queued: int) -> int:
        mean = self.mean()
        if mean is None:
            return self.UNMEASURED
        wait = math.ceil(mean * (queued + 1) / self.active)
        return min(self.HIGHEST, max(self.LOWEST, wait))

    def seconds(self, queued: int) -> int:
        """One refusal's Retry-After with ``queued`` leaders waiting."""
        base = self.base(queued)
        spread = self.randint(0, max(1, base // 4))
        figure = base + spread
        if figure > self.HIGHEST:
            figure = base - spread
        return max(self.LOWEST, min(self.HIGHEST, figure))


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
            rendered = self._refusals[(busy.reason, busy.retry_after)] = _render_refusal(busy)
        body, headers = rendered
        # "unavailable" (Redis down, fallback "refuse") is the service's failure, not the
        # client's: 503 whatever REACHLIMIT_STATUS says.
        status = 503 if busy.reason == Busy.UNAVAILABLE else self.settings.status
        # A one-item list rather than bytes: with Content-Length already among the headers,
        # the response need not measure and set it again.
        return Response([body], status, headers)


def _client_of(
    setting: str | Callable[[Request], Hashable],
) -> Callable[[Request], Hashable] | None:
    """What ``_State.client_of`` holds for the ``client`` setting (see there)."""
    if setting == CLIENT_REMOTE_ADDR:
        return None
    if setting == CLIENT_NONE:
        return _nobody
    assert callable(setting)
    return _checked(setting)


def _nobody(request: Request) -> None:
    """REACHLIMIT_CLIENT="none": every request is the one anonymous client."""
    return None


def _checked(client: Callable[[Request], Hashable]) -> Callable[[Request], Hashable]:
    """The app's client callable, its value checked to be hashable. Its own exceptions
    propagate unchanged: both are the app's bug, raised before anything is held."""

    def client_of(request: Request) -> Hashable:
        name = client(request)
        try:
            hash(name)
        except TypeError:
            raise TypeError(
                f"ReachLimit client: {getattr(client, '__qualname__', client)!r} returned "
                f"an unhashable {type(name).__name__}; it must return a hashable name "
                "(a str, say)"
            ) from None
        return name

    return client_of


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
        settings.active, settings.queue, settings.wait, settings.limiter_retry_after,
        cache=cache,
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
        settings.limiter_retry_after,
        lease=settings.lease,
        prefix=settings.redis_prefix,
    )
    local = ColdLimiter(
        settings.active, settings.queue, settings.wait, settings.limiter_retry_after
    )
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
            app.extensions["reachlimit"] = _shared_state(settings)
        else:
            limiter = ColdLimiter(
                settings.active, settings.queue, settings.wait, settings.limiter_retry_after
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
            return state.path.get(key, build, cancel, client)
        except Busy as busy:
            if state.retry_auto is not None:
                busy = state.auto_busy(busy)
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
