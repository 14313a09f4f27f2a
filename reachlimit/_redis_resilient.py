"""Redis as a shared backend that may fail: a degraded mode, never an outage.

design:

    RedisHealth      one per Redis (URL), shared by every wrapper below. Up: every call goes
                     to Redis. A call that fails with a connection problem (any
                     ``redis.RedisError`` or ``OSError``: refused, reset, timed out, a server
                     still loading) marks it down at once and logs ONE warning for the whole
                     outage. While down, calls go straight to the fallback without touching
                     Redis; after a backoff (0.25 s, doubled after each failed try, at most
                     5 s) exactly one call is let through as a probe. The first call that
                     succeeds marks it up again and logs once that Redis is back. A probe
                     that never reports (its call ended in an error that says nothing about
                     Redis, or never touched Redis) does not block the next one: once the
                     backoff has passed again, another call is let through. A success counts
                     only if no failure was recorded since its call began, so a slow call
                     that started before an outage cannot end it.

    ResilientLimiter the cold limiter's surface (``acquire(cancel) -> grant``, ``stats()``)
                     over a RedisColdLimiter, with an in-process ColdLimiter as fallback:
        up                    the shared limiter decides (its Busy and Cancelled pass through)
        down, "local"         the in-process limiter decides: per-process limits
        down, "refuse"        ``Busy("unavailable", retry_after)`` at once
        fails while queued    the waiter goes on with the fallback for the REST of its wait,
                              measured from when it asked (its shared queue place is given up
                              by the limiter, or Redis drops it one presence period later);
                              no wait left -> ``Busy("timeout")``; "refuse" -> "unavailable".
                              So a waiter answers within wait + one socket timeout (+ one more
                              when Redis hangs rather than refuses: the shared limiter's own
                              attempt to leave the queue has to time out too) and never
                              raises a Redis error.
        fails at release      the error is logged and swallowed: the slot's lease ends it in
                              Redis, and the build's answer is still served.
        stats()               Redis's global figures (``backend="redis"``, ``degraded=False``)
                              when up; the in-process limiter's (``backend="local"``,
                              ``degraded=True``) when down.

    ResilientCache   ``get``/``set`` of the Cache protocol: Redis when up, the in-process
                     cache when down. A failing ``get`` is a miss, never an error.
    ResilientFlight  ``do(key, fn, cancel) -> (value, shared)``: the shared flight when up,
                     the in-process SingleFlight when down. ``fn`` runs at most once per call:
                     if the shared flight fails after ``fn`` has run, its outcome is returned
                     (or raised) as it is, never computed again. An error ``fn`` raised
                     itself - a ``redis.RedisError`` or ``OSError`` of the build's own - is
                     the build's outcome, never taken for Redis failing: not by the leader,
                     and not by its followers in the same process, which receive the very
                     exception object (it carries a mark saying so).

    A Redis restarted empty needs nothing special: redis-py's scripts are reloaded when Redis
    answers NOSCRIPT, and RedisColdLimiter's keys are rebuilt by its next script (a waiter
    that lost its place sees ``Busy("timeout")``, a holder's release frees nothing).

    Every URL shown (logs, reprs, health figures, exception messages) goes through
    :func:`reachlimit._urls.mask_url`, and exception texts are scrubbed of the URL's secrets.

    ``connect(url)`` makes the client these wrappers expect: short socket timeouts, no
    retries (a retry would stretch a call past its bound), a health check of idle connections.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._cancel import CancelToken
from ._errors import Busy, Cancelled, LeaderFailed, ReachLimitError
from ._limiter import ColdLimiter, Grant, LimiterStats
from ._urls import mask_url, scrub, url_secrets

if TYPE_CHECKING:
    from .redis import RedisColdLimiter, RedisLimiterStats

__all__ = [
    "FALLBACKS",
    "RedisHealth",
    "ResilientCache",
    "ResilientFlight",
    "ResilientLimiter",
    "connect",
]

log = logging.getLogger("reachlimit")

#: What a call to Redis can fail with when Redis is unreachable, slow or broken.
FAILURES: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

#: The fallback modes of :class:`ResilientLimiter`.
FALLBACKS = ("local", "refuse")

_SCHEMES = ("redis://", "rediss://", "unix://")

T = TypeVar("T")


def connect(url: str, *, timeout: float = 0.5, health_check_interval: int = 15) -> redis.Redis:
    """A ``redis.Redis`` for ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``) whose
    every call is bounded: connect and read time out after ``timeout`` seconds, a failed
    call is not retried, and a connection idle for ``health_check_interval`` seconds is
    checked with a PING before use. No connection is opened here.

    Raises ``ValueError`` (showing the URL with its password masked) for any other scheme or
    a URL redis-py cannot read."""
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise ValueError(
            f"a Redis URL must start with redis://, rediss:// or unix://, got {mask_url(url)!r}"
        )
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    try:
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_error=[],
            health_check_interval=health_check_interval,
        )
    except ValueError as exc:
        raise ValueError(
            f"bad Redis URL {mask_url(url)!r}: {scrub(str(exc), url_secrets(url))}"
        ) from None
    return client


class RedisHealth:
    """Whether one Redis is usable, shared by the wrappers that call it (module design)."""

    #: The first pause after Redis failed, and the longest one.
    FIRST_RETRY = 0.25
    MAX_RETRY = 5.0

    def __init__(
        self,
        url: str = "",
        *,
        first_retry: float | None = None,
        max_retry: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = mask_url(url) if url else "redis"
        self._secrets = url_secrets(url) if url else []
        self._first = self.FIRST_RETRY if first_retry is None else float(first_retry)
        self._max = self.MAX_RETRY if max_retry is None else float(max_retry)
        if not 0 < self._first <= self._max:
            raise ValueError("0 < first_retry <= max_retry")
        self._clock = clock
        self._lock = threading.Lock()
        self._down = False  # guarded by _lock (read racily on the fast path)
        self._retry_at = 0.0  # guarded by _lock
        self._backoff = self._first  # guarded by _lock: the pause after the next failed try
        self._probing = False  # guarded by _lock: a probe was let through and has not ended
        self._down_since = 0.0  # guarded by _lock
        self._outages = 0  # guarded by _lock
        self._failures = 0  # guarded by _lock: failed() calls so far (see succeeded)
        self._last_error = ""  # guarded by _lock

    @property
    def up(self) -> bool:
        """Racy read: whether Redis is believed usable."""
        return not self._down

    @property
    def failures(self) -> int:
        """How many failures were recorded so far: read it before a call to Redis and pass
        it to :meth:`succeeded` after the call worked."""
        return self._failures

    def available(self) -> bool:
        """Whether a call may go to Redis now: always when up; when down, True for exactly
        one caller each time the backoff has passed (the probe), False for everyone else.
        A probe that has not reported by then is given up on: the next caller probes."""
        if not self._down:  # racy read: the common case costs no lock
            return True
        now = self._clock()
        with self._lock:
            if not self._down:
                return True
            if now < self._retry_at:
                return False
            self._probing = True
            self._retry_at = now + self._backoff  # in case the probe never reports back
            return True

    def succeeded(self, since: int | None = None) -> None:
        """A call to Redis worked: mark it up (logged once per outage). With ``since`` (the
        :attr:`failures` read before the call), only if no failure was recorded since then:
        a call that began before an outage was noticed says nothing about Redis now."""
        if not self._down:  # racy read: nothing to do in the common case
            return
        with self._lock:
            if not self._down or (since is not None and since != self._failures):
                return
            self._down = False
            self._probing = False
            self._backoff = self._first
            lasted = self._clock() - self._down_since
        log.warning(
            "reachlimit: Redis at %s answers again after %.1f s down; shared limits are back",
            self.where, lasted,
        )

    def failed(self, exc: BaseException) -> None:
        """A call to Redis failed with ``exc``: mark it down (the first failure of an
        outage is logged), and push the next try back by the backoff."""
        text = self.describe(exc)
        with self._lock:
            now = self._clock()
            self._last_error = text
            self._failures += 1
            first = not self._down
            if first:
                self._down = True
                self._down_since = now
                self._outages += 1
                self._backoff = self._first
            elif self._probing:  # the probe failed: wait longer next time
                self._backoff = min(self._backoff * 2, self._max)
            elif now < self._retry_at:
                return  # a call that started before the outage was noticed: nothing new
            self._probing = False
            self._retry_at = now + self._backoff
        if first:
            log.warning(
                "reachlimit: Redis at %s is unavailable (%s); using the fallback until it is "
                "reachable (next try in %.2f s, at most every %.0f s)",
                self.where, text, self._first, self._max,
            )

    def describe(self, exc: BaseException) -> str:
        """``exc`` as one line, with any secret of the URL replaced by ``***``."""
        return scrub(f"{type(exc).__name__}: {exc}", self._secrets)

    def figures(self) -> dict[str, Any]:
        """For a health answer: the masked URL, up or not, outages so far, the last error."""
        with self._lock:
            down_for = self._clock() - self._down_since if self._down else 0.0
            return {
                "url": self.where,
                "up": not self._down,
                "down_for": round(down_for, 3),
                "outages": self._outages,
                "last_error": self._last_error,
            }

    def __repr__(self) -> str:
        return f"<RedisHealth {self.where} {'up' if not self._down else 'down'}>"


class _Deadline:
    """A cancel token that is also set once ``deadline`` (monotonic) has passed: how the
    fallback limiter is told to wait only for the rest of a wait."""

    __slots__ = ("_cancel", "_deadline")

    def __init__(self, cancel: CancelToken | None, deadline: float) -> None:
        self._cancel = cancel
        self._deadline = deadline

    def is_set(self) -> bool:
        if self._cancel is not None and self._cancel.is_set():
            return True
        return time.monotonic() >= self._deadline


class _SharedGrant(Grant):
    """A grant of the shared limiter whose release never raises a Redis error: a release
    that cannot reach Redis is logged and swallowed (the slot's lease frees it)."""

    __slots__ = ("_inner", "_health")

    def __init__(self, inner: Grant, health: RedisHealth) -> None:
        # Grant.__init__ is not called: the slot is the inner grant's.
        self._inner = inner
        self._health = health

    @property
    def held(self) -> bool:
        return self._inner.held

    @property
    def lease_lost(self) -> bool:
        return bool(getattr(self._inner, "lease_lost", False))

    def _give_back(self, strict: bool) -> None:
        try:
            self._inner._give_back(strict)
        except FAILURES as exc:
            self._health.failed(exc)
            log.warning(
                "reachlimit: could not release a build slot in Redis at %s (%s); "
                "its lease will free it",
                self._health.where, self._health.describe(exc),
            )


class ResilientLimiter:
    """A shared (Redis) cold limiter that falls back when Redis fails (module design).

    ``fallback="local"``: the in-process ``local`` limiter takes over (each process then has
    its own ``active``/``queue``); ``"refuse"``: every cold request is refused with
    ``Busy("unavailable")`` until Redis is back."""

    def __init__(
        self,
        remote: RedisColdLimiter,
        local: ColdLimiter,
        health: RedisHealth,
        fallback: str = "local",
    ) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be 'local' or 'refuse', got {fallback!r}")
        self.remote = remote
        self.local = local
        self.health = health
        self.fallback = fallback

    @property
    def capacity_active(self) -> int:
        return self.remote.capacity_active

    @property
    def capacity_queue(self) -> int:
        return self.remote.capacity_queue

    @property
    def wait(self) -> float:
        return self.remote.wait

    @property
    def retry_after(self) -> int:
        return self.remote.retry_after

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        """Take a build slot: the shared limiter's while Redis works, else the fallback's
        (both share their queue fairly among clients: ``client`` names whoever asks).
        Raises ``Busy`` or ``Cancelled`` as a ColdLimiter does, never a Redis error."""
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        health = self.health
        if not health.available():
            return self._fall_back(cancel, None, client)
        started = time.monotonic()
        since = health.failures
        try:
            grant = self.remote.acquire(cancel, client)
        except ReachLimitError:
            health.succeeded(since)  # Redis answered: a refusal or a cancellation is an answer
            raise
        except FAILURES as exc:
            health.failed(exc)
            return self._fall_back(cancel, started + self.remote.wait, client)
        health.succeeded(since)
        return _SharedGrant(grant, health)

    def _fall_back(
        self, cancel: CancelToken | None, deadline: float | None, client: Hashable
    ) -> Grant:
        """The fallback's answer; with ``deadline``, only for the rest of the wait."""
        if self.fallback == "refuse":
            raise Busy(Busy.UNAVAILABLE, self.remote.retry_after)
        if deadline is None:
            return self.local.acquire(cancel, client)
        if time.monotonic() >= deadline:
            raise Busy(Busy.TIMEOUT, self.remote.retry_after)
        try:
            # The local limiter counts a wait ended by this deadline as cancelled.
            return self.local.acquire(_Deadline(cancel, deadline), client)
        except Cancelled:
            if cancel is not None and cancel.is_set():
                raise
            raise Busy(Busy.TIMEOUT, self.remote.retry_after) from None

    def stats(self) -> LimiterStats:
        """Redis's global figures when it answers, else the fallback's, marked degraded."""
        health = self.health
        if health.available():
            since = health.failures
            try:
                figures = self.remote.stats()
            except FAILURES as exc:
                health.failed(exc)
            else:
                health.succeeded(since)
                return figures
        return degraded_stats(self.local.stats())

    def close(self) -> None:
        self.remote.close()

    def __repr__(self) -> str:
        return (
            f"<ResilientLimiter {self.remote!r} via {self.health.where} "
            f"fallback={self.fallback} {'up' if self.health.up else 'down'}>"
        )


def degraded_stats(local: LimiterStats) -> RedisLimiterStats:
    """The in-process limiter's figures, marked as the fallback's."""
    from .redis import RedisLimiterStats

    return RedisLimiterStats(
        active=local.active,
        queued=local.queued,
        peak_active=local.peak_active,
        peak_queued=local.peak_queued,
        acquired=local.acquired,
        rejected_full=local.rejected_full,
        rejected_timeout=local.rejected_timeout,
        cancelled=local.cancelled,
        capacity_active=local.capacity_active,
        capacity_queue=local.capacity_queue,
        wait=local.wait,
        displaced=local.displaced,
        backend="local",
        degraded=True,
        lease_lost=0,
    )


class CacheLike(Protocol):
    def get(self, key: Any) -> Any: ...

    def set(self, key: Any, value: Any) -> None: ...


class FlightLike(Protocol[T]):
    def do(
        self, key: Hashable, fn: Callable[[], T], cancel: CancelToken | None = None
    ) -> tuple[T, bool]: ...


class ResilientCache:
    """A shared warm cache with an in-process fallback (module design). ``get`` never
    raises a Redis error: a failed read is a miss (answered by the fallback)."""

    def __init__(self, remote: CacheLike, local: CacheLike, health: RedisHealth) -> None:
        self.remote = remote
        self.local = local
        self.health = health

    def get(self, key: Any) -> Any:
        health = self.health
        if health.available():
            since = health.failures
            # A probe must reach Redis: an answer from the shared cache's in-process first
            # level would say nothing about Redis (``fetch`` skips that level).
            fetch = getattr(self.remote, "fetch", None) if not health.up else None
            try:
                value = fetch(key) if callable(fetch) else self.remote.get(key)
            except FAILURES as exc:
                health.failed(exc)
            else:
                health.succeeded(since)
                return value
        return self.local.get(key)

    def set(self, key: Any, value: Any) -> None:
        health = self.health
        if health.available():
            since = health.failures
            try:
                self.remote.set(key, value)
            except FAILURES as exc:
                health.failed(exc)
            else:
                health.succeeded(since)
                return
        self.local.set(key, value)

    def clear(self) -> None:
        """Empty the fallback cache, and the shared one when it can be emptied."""
        for cache in (self.local, self.remote):
            clear = getattr(cache, "clear", None)
            if callable(clear):
                try:
                    clear()
                except FAILURES as exc:
                    self.health.failed(exc)


#: The attribute that marks an exception as raised by a build run under ResilientFlight.
_BUILD_MARK = "_reachlimit_raised_by_build"


def _mark_as_the_builds(exc: BaseException) -> None:
    """Mark ``exc`` as a build's own, so that whoever receives it - the leader, or a follower
    in the same process, which gets the very object - never takes it for Redis failing."""
    try:
        setattr(exc, _BUILD_MARK, True)
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass


def _raised_by_a_build(exc: BaseException) -> bool:
    return getattr(exc, _BUILD_MARK, False) is True


class ResilientFlight(Generic[T]):
    """A shared singleflight with an in-process fallback (module design)."""

    def __init__(
        self, remote: FlightLike[T], local: FlightLike[T], health: RedisHealth
    ) -> None:
        self.remote = remote
        self.local = local
        self.health = health
        if hasattr(remote, "on_redis_error"):
            # Errors the shared flight logs and swallows (publishing an outcome, renewing
            # claims) still mark Redis down.
            remote.on_redis_error = health.failed

    def do(
        self, key: Hashable, fn: Callable[[], T], cancel: CancelToken | None = None
    ) -> tuple[T, bool]:
        health = self.health
        if not health.available():
            return self.local.do(key, fn, cancel)
        ran = False
        outcome: list[Any] = []  # [value] or [None, exception]: what fn did, if it ran

        def tracked() -> T:
            nonlocal ran
            ran = True
            try:
                value = fn()
            except BaseException as exc:
                outcome[:] = [None, exc]
                _mark_as_the_builds(exc)
                raise
            outcome[:] = [value]
            return value

        since = health.failures
        try:
            result = self.remote.do(key, tracked, cancel)
        except FAILURES as exc:
            if _raised_by_a_build(exc) or (len(outcome) == 2 and outcome[1] is exc):
                # fn's own error - here, or a local leader's that its followers share: the
                # build ran under a claim taken in Redis, so Redis answered.
                health.succeeded(since)
                raise
            health.failed(exc)
            if ran:  # fn ran here; only the shared flight's bookkeeping failed
                if len(outcome) == 2:
                    raise outcome[1] from None
                return outcome[0], False
            return self.local.do(key, fn, cancel)
        except (Busy, LeaderFailed):
            health.succeeded(since)  # a leader's outcome, which came through Redis
            raise
        except BaseException:
            if ran:  # fn's own error: it ran under a claim taken in Redis
                health.succeeded(since)
            raise
        health.succeeded(since)
        return result

    def close(self) -> None:
        """Stop the shared flight's background thread (its ``close``), if it has one."""
        close = getattr(self.remote, "close", None)
        if callable(close):
            close()

    def in_flight(self) -> int:
        in_flight = getattr(self.local, "in_flight", None)
        return int(in_flight()) if callable(in_flight) else 0
