"""Connections to Redis and whether Redis is usable: ``connect`` and ``RedisHealth``.

design:

    ``connect(url)`` makes the client every object of this package expects: short socket
    timeouts, no retries (a retry would stretch a call past its bound), a health check of idle
    connections.

    ``redis+sentinel://`` (``_sentinel_client``): a ``redis.sentinel.Sentinel`` over the URL's
    sentinels, with the same bounds, and its ``master_for(service)``: a client that asks the
    sentinels for the primary whenever it opens a connection, so it follows the primary across
    a failover (a connection to a primary demoted meanwhile fails with a connection error:
    the health below marks Redis down and the fallback answers until the new primary does).
    The URL's user and password are the primary's AND the sentinels' (the ``limits``
    library's convention); ``sentinel_password=`` (and ``sentinel_username=``) in the query
    give the sentinels their own, an empty ``sentinel_password=`` none. Other query arguments
    are redis-py's own, read as ``redis.Redis.from_url`` reads them, for the primary.
    ``rediss://`` keeps redis-py's TLS parameters (``ssl_ca_certs``, ``ssl_cert_reqs``,
    ``ssl_certfile``, ``ssl_keyfile``...) as redis-py reads them.

    ``redis+cluster://`` (``_cluster``): a ``ClusterClient``, which makes a
    ``redis.cluster.RedisCluster`` over the URL's nodes, with the same bounds and no retry
    (redirects are followed, not retried), at its first command, not here.

    RedisHealth is one per Redis (URL), shared by every wrapper of ``_resilient``. Up: every
    call goes to Redis. A call that fails with a connection problem (any ``redis.RedisError``
    or ``OSError``: refused, reset, timed out, a server still loading) marks it down at once
    and logs ONE warning for the whole outage. While down, calls go straight to the fallback
    without touching Redis. The first call that succeeds marks it up again and logs once
    that Redis is back. A success counts only if no failure was recorded since its call
    began, so a slow call that started before an outage cannot end it; and a failure counts
    only if the call began after Redis was last marked up, so a call sent into the outage
    that times out just as Redis answers again cannot start a new one.

    Who finds out that Redis is back (the probes, after a backoff: 0.25 s through an
    outage's first 5 s, in which a probe that waited out its timeout, on a Redis that
    hangs, is followed at once; then doubled after each try, at most 5 s):

      probe thread    a health made with ``client=`` (a PING on that client, ``_ping``) or
                      ``probe=``: one daemon thread per health (``reachlimit-redis-probe``),
                      started by the failure that marks Redis down (never in a process
                      that has not used Redis), probes on the backoff and marks Redis up
                      when a probe succeeds, once the ``before_up`` hooks have told Redis
                      what they must (the fallback's builds still running; one failing
                      with a Redis error fails the probe); it ends then, or at ``close``,
                      and a process forked since starts its own at its next call. While down
                      ``available()`` is False for every caller, so no request pays a
                      probe's timeout, and a process that serves nothing still learns that
                      Redis is back: from then on every call goes to Redis.
      request probes  a health given neither (``RedisHealth(url)``: it has nothing to probe
                      with), or closed: exactly one call is let through as a probe each
                      time the backoff has passed. A probe that never reports (its call
                      ended in an error that says nothing about Redis, or never touched
                      Redis) does not block the next one: once the backoff has passed
                      again, another call is let through.

    Each process learns on its own backoff that Redis is back, and a process that has not
    learned yet admits its fallback's share beside what Redis admits for the others; so
    anything else that sees Redis answer off a request's path (the budget's members
    announce every second: ``_members``) calls ``probe_soon``, which brings the next probe
    forward to now. No process learns more than about a second after another.

    A PING can succeed where calls fail (a Redis out of memory, a cluster down): until a call
    works after a probe said up, a failure is the same outage going on (no new outage
    counted, the backoff doubled, one warning saying so) rather than a new one, so such a
    Redis is tried at most once a backoff, as with request probes.

    One lock, ``lock`` (``_daemon.Daemon``'s, replaced in a forked child), guards the state;
    the condition on it is what the probe thread pauses on (for a pause measured on the
    health's ``clock``), notified by ``close``. The probe itself, and every log line, run
    outside the lock. After a fork the child keeps the parent's view (down, the backoff)
    but has no thread: its next call starts one.

    Every URL shown (logs, reprs, health figures, exception messages) goes through
    :func:`reachlimit._urls.mask_url`, and exception texts are scrubbed of the URL's secrets.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from .._urls import (
    CLUSTER_SCHEME,
    REDIS_SCHEMES,
    SCHEMES_TEXT,
    SENTINEL_SCHEME,
    mask_url,
    redis_url_problem,
    scrub,
    sentinel_parts,
    url_secrets,
)
from ._cluster import cluster_client
from ._common import REDIS_ERRORS, Client, is_cluster
from ._daemon import Daemon

__all__ = ["FAILURES", "RedisHealth", "connect"]

log = logging.getLogger("reachlimit")

#: What a call that waited out its socket timeout raises (Redis hangs rather than refuses).
_TIMEOUTS = (redis.exceptions.TimeoutError, TimeoutError)

#: What a call to Redis can fail with when Redis is unreachable, slow or broken (a
#: cluster's client also raises ``RedisClusterException``, which is not a ``RedisError``).
FAILURES: tuple[type[BaseException], ...] = (*REDIS_ERRORS, OSError)


def _cluster_client(url: str, timeout: float, health_check_interval: int) -> Client:
    """``connect`` for a ``redis+cluster://`` URL (``_cluster.cluster_client``), its
    problems a ``ValueError`` showing the URL masked."""
    try:
        return cluster_client(url, timeout=timeout, health_check_interval=health_check_interval)
    except (ValueError, RedisClusterException) as exc:
        raise ValueError(
            f"bad Redis URL {mask_url(url)!r}: {scrub(str(exc), url_secrets(url))}"
        ) from None


def connect(url: str, *, timeout: float = 0.5, health_check_interval: int = 15) -> Client:
    """A ``redis.Redis`` for ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``, or
    ``redis+sentinel://host:port[,host:port...]/<service>[/<db>]`` for the primary a Sentinel
    names), or a ``ClusterClient`` for ``redis+cluster://[user:password@]host:
    port[,host:port...]`` (``_cluster``: a ``redis.cluster.RedisCluster`` made, and the map of
    the cluster read, at its first command),
    whose every call is bounded: connect and read time out after ``timeout`` seconds,
    a failed call is not retried, and a connection idle for ``health_check_interval``
    seconds is checked with a PING before use. No connection is opened here.

    Raises ``ValueError`` (showing the URL with its password masked) for any other scheme,
    a database (``redis://host/<db>``, ``db=``) or port that is not a whole number, or a URL
    redis-py cannot read."""
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        raise ValueError(f"a Redis URL must start with {SCHEMES_TEXT}, got {mask_url(url)!r}")
    problem = redis_url_problem(url)
    if problem is not None:  # redis-py would take redis://host/abc for database 0
        raise ValueError(f"bad Redis URL {mask_url(url)!r}: {problem}")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if url.startswith(CLUSTER_SCHEME):
        return _cluster_client(url, timeout, health_check_interval)
    bounded: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_error": [],
    }
    try:
        if url.startswith(SENTINEL_SCHEME):
            client = _sentinel_client(url, bounded, health_check_interval)
        else:
            client = redis.Redis.from_url(
                url, health_check_interval=health_check_interval, **bounded
            )
    except ValueError as exc:
        raise ValueError(
            f"bad Redis URL {mask_url(url)!r}: {scrub(str(exc), url_secrets(url))}"
        ) from None
    return client


#: Query arguments of a Sentinel URL that are the sentinels' credentials, not the primary's.
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")


class _SentinelPrimary(redis.Redis):
    """The client of the primary a Sentinel names, whose ``close`` also closes its
    connections to the sentinels."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


def _sentinel_client(
    url: str, bounded: dict[str, Any], health_check_interval: int
) -> redis.Redis:
    """``master_for`` of a Sentinel over the sentinels of ``url`` (module design)."""
    from redis.connection import parse_url
    from redis.sentinel import Sentinel

    where = sentinel_parts(url)
    auth = {"username": where.username, "password": where.password}
    pairs = parse_qsl(where.query, keep_blank_values=True)
    own = {key[9:]: value or None for key, value in pairs if key in _SENTINEL_AUTH}
    if "password" in own and own["password"] is None:
        own.setdefault("username", None)  # sentinels without a password: no AUTH at all
    rest = urlencode([(key, value) for key, value in pairs if key not in _SENTINEL_AUTH])
    # redis-py's own reading of the other query arguments (types included), as from_url's.
    options = parse_url(f"redis://localhost/?{rest}")  # type: ignore[no-untyped-call, unused-ignore]
    options.pop("host", None)
    sentinels = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        where.hosts,
        sentinel_kwargs={**bounded, **auth, **own},
        **{"health_check_interval": health_check_interval, **bounded, **auth,
           "db": where.db or 0, **options},
    )
    primary_client = sentinels.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        where.service, redis_class=_SentinelPrimary
    )
    return cast(redis.Redis, primary_client)


def _ping(client: Any) -> Callable[[], object]:
    """The probe of ``client``: a ``PING`` on its own connections and timeouts (a Sentinel's
    ``master_for`` client asks the sentinels for the primary as it connects); on a Redis
    Cluster a ``PING`` to every primary of its map, since a key of any slot may be asked
    for (a node that fails makes redis-py read the map again, so the next probe finds a
    replica promoted meanwhile)."""
    if is_cluster(client):
        return lambda: client.ping(target_nodes=RedisCluster.PRIMARIES)
    return lambda: client.ping()


class RedisHealth(Daemon):
    """Whether one Redis is usable, shared by the wrappers that call it (module design).

    ``client`` (the client those wrappers use, as :func:`connect` made it) or ``probe`` (a
    callable that raises when Redis does not answer) gives the health its probe thread;
    without either, requests are the probes."""

    #: The first pause after Redis failed, and the longest one.
    FIRST_RETRY = 0.25
    MAX_RETRY = 5.0
    #: The name of the probe thread.
    THREAD_NAME = "reachlimit-redis-probe"

    def __init__(
        self,
        url: str = "",
        *,
        client: Client | None = None,
        probe: Callable[[], object] | None = None,
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
        if client is not None and probe is not None:
            raise ValueError("give RedisHealth a client or a probe, not both")
        if client is not None and not callable(getattr(client, "ping", None)):
            raise TypeError(f"client must be a redis.Redis or a RedisCluster, got {client!r}")
        if probe is not None and not callable(probe):
            raise TypeError(f"probe must be a callable, got {probe!r}")
        self._probe = _ping(client) if client is not None else probe
        self._clock = clock
        # The lock and the condition the probe thread pauses on (notified by close).
        super().__init__(self.THREAD_NAME)
        self._down = False  # guarded by lock (read racily on the fast path)
        self._up_after = 0  # guarded by lock: the failures recorded when last marked up
        self._retry_at = 0.0  # guarded by lock: when the next probe may go
        self._backoff = self._first  # guarded by lock: the pause after the next failed try
        self._probing = False  # guarded by lock: a request probe was let through, not ended
        self._trial = False  # guarded by lock: up on a probe's word, no call worked since
        self._down_since = 0.0  # guarded by lock
        self._outages = 0  # guarded by lock
        self._failures = 0  # guarded by lock: failures of calls and probes so far (succeeded)
        self._last_error = ""  # guarded by lock
        self._before_up: list[Callable[[], object]] = []  # guarded by lock (before_up)

    @property
    def up(self) -> bool:
        """Racy read: whether Redis is believed usable."""
        return not self._down

    @property
    def failures(self) -> int:
        """How many failures were recorded so far: read it before a call to Redis and pass
        it to :meth:`succeeded` after the call worked."""
        return self._failures

    def before_up(self, hook: Callable[[], object]) -> None:
        """Have the probe thread call ``hook`` when a probe has succeeded, before it marks
        Redis up: what this process must tell Redis before anything else of it goes there
        (``ResilientLimiter.hold_fallback_builds``: the fallback's builds still running). A
        hook that fails with a Redis error fails the probe (the next one after the backoff);
        any other error is logged and does not keep Redis down."""
        with self.lock:
            self._before_up.append(hook)

    def probe_soon(self) -> None:
        """Something other than a probe saw Redis answer (a members' announce, off every
        request's path): while down, the next probe goes now rather than at the backoff's
        end (the probe thread is woken; without one, the next call is the probe). It is a
        probe like any other (a PING, then the ``before_up`` hooks). Cheap when up."""
        if not self._down:  # racy read: nothing to do in the common case
            return
        with self.lock:
            if self._down:
                self._retry_at = min(self._retry_at, self._clock())
                self._cond.notify_all()

    def _tell_redis(self) -> None:
        """The ``before_up`` hooks, in the probe thread (outside the lock)."""
        with self.lock:
            hooks = list(self._before_up)
        for hook in hooks:
            try:
                hook()
            except FAILURES:
                raise
            except Exception:
                log.exception("reachlimit: a hook run as Redis at %s came back raised",
                              self.where)

    def available(self) -> bool:
        """Whether a call may go to Redis now: always when up. When down, with a probe
        thread: never (the thread finds out when Redis is back; the call costs no timeout).
        Without one: True for exactly one caller each time the backoff has passed (the
        request probe), False for everyone else; a request probe that has not reported by
        then is given up on and the next caller probes."""
        if not self._down:  # racy read: the common case costs no lock
            return True
        if self._probe is not None and not self._closed:
            with self.lock:
                if not self._down:
                    return True
                if self._watch_locked():  # (started again here in a process forked since)
                    return False
        now = self._clock()
        with self.lock:
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
        if not self._down and not self._trial:  # racy read: nothing to do in the common case
            return
        self._mark_up(since, by_probe=False)

    def _mark_up(self, since: int | None, by_probe: bool) -> None:
        """Mark Redis up, after a call (``by_probe`` False) or a probe of the thread worked:
        then until a call works a failure is the same outage going on (``failed``)."""
        with self.lock:
            if since is not None and since != self._failures:
                return
            if not self._down:
                if not by_probe:
                    self._trial = False  # a call worked: the probe's word was good
                return
            if not by_probe and self._before_up and self._probe is not None:
                # A call worked while Redis was marked down (it read the failures just after
                # another call failed): Redis is back, but this process must tell it first
                # what the hooks tell (a ResilientLimiter's fallback builds, its recovery's
                # reservations), or Redis admits its whole budget beside the fallbacks of the
                # processes still down. Only the probe thread marks it up, after the hooks;
                # its probe goes now. (The soak saw 5 builds at once for 4 allowed.)
                self._retry_at = min(self._retry_at, self._clock())
                self._cond.notify_all()
                return
            self._down = False
            self._up_after = self._failures  # a call that read fewer began before this
            self._probing = False
            self._trial = by_probe
            if not by_probe:
                self._backoff = self._first
            lasted = self._clock() - self._down_since
        log.warning(
            "reachlimit: Redis at %s answers again after %.1f s down; shared limits are back",
            self.where, lasted,
        )

    def failed(self, exc: BaseException, since: int | None = None) -> None:
        """A call to Redis failed with ``exc``: mark it down (the first failure of an
        outage is logged) and start the probe thread (when the health has one), or push
        the next request probe back by the backoff. With ``since`` (the :attr:`failures`
        read before the call), a call that began before Redis was last marked up says
        nothing about Redis now (a straggler of the outage: sent to a paused Redis, it timed
        out just as Redis resumed): recorded, and Redis stays up."""
        text = self.describe(exc)
        with self.lock:
            now = self._clock()
            self._last_error = text
            self._failures += 1
            if not self._down and since is not None and since < self._up_after:
                return
            if self._down:
                self._failed_again_locked(now)
                return
            relapse = self._trial  # no call worked since a probe said up: the same outage
            self._down, self._probing, self._trial = True, False, False
            if relapse:
                self._backoff = min(self._backoff * 2, self._max)
            else:
                self._down_since = now
                self._outages += 1
                self._backoff = self._first
            # A call that waited out its timeout (a Redis that hangs) is followed by the
            # probe thread's PING at once, as a probe that did (``_probe_failed``); a request
            # probe (no thread) would pay that timeout itself: it waits the backoff.
            hung = not relapse and self._probe is not None and isinstance(exc, _TIMEOUTS)
            pause = 0.0 if hung else self._backoff
            self._retry_at = now + pause
            self._watch_locked()
        if relapse:
            log.warning(
                "reachlimit: Redis at %s failed again (%s) before any call worked since it "
                "answered a probe; using the fallback (next try in %.2f s)",
                self.where, text, pause,
            )
        else:
            log.warning(
                "reachlimit: Redis at %s is unavailable (%s); using the fallback until it is "
                "reachable (next try in %.2f s, at most every %g s)",
                self.where, text, pause, self._max,
            )

    def _failed_again_locked(self, now: float) -> None:
        """``failed`` while down, under ``lock``: a request probe's failure makes the next
        pause twice as long; a call that started before the outage was noticed is no news,
        and neither is any failure while the probe thread keeps the schedule."""
        if self._watch_locked():
            return
        if self._probing:
            self._backoff = min(self._backoff * 2, self._max)
        elif now < self._retry_at:
            return
        self._probing = False
        self._retry_at = now + self._backoff

    def _watch_locked(self) -> bool:
        """Whether the probe thread watches Redis (the health has a probe and is not
        closed); it is started if it does not run: at an outage's first failure, or at the
        first call of a process forked since (threads do not survive a fork). Under
        ``lock``."""
        if self._probe is None or self._closed:
            return False
        self._start_locked()
        return True

    def _run(self) -> None:
        """The probe thread: while Redis is down, one probe each time the backoff has
        passed (outside the lock), until a probe or a call marks it up, or :meth:`close`."""
        me = threading.current_thread()
        probe = self._probe
        assert probe is not None
        while True:
            now = self._clock()
            with self.lock:
                if self._closed or not self._down:
                    if self._thread is me:
                        # Forgotten under the lock: an outage that begins while this thread
                        # is still ending starts a new one (``_start_locked``).
                        self._thread = None
                    return
                if now < self._retry_at:
                    self._cond.wait(self._retry_at - now)
                    continue
                since = self._failures
                # The same pause again if its success does not count (a failure meanwhile).
                self._retry_at = now + self._backoff
            try:
                probe()
            except Exception as exc:  # whatever it raised, Redis did not answer the probe
                self._probe_failed(exc, now)
                continue
            try:
                self._tell_redis()
            except FAILURES as exc:
                self._probe_failed(exc, now)
            else:
                self._mark_up(since, by_probe=True)

    def _probe_failed(self, exc: BaseException, began: float) -> None:
        """The probe thread's probe (begun at ``began``) failed. Through the outage's first
        ``max_retry`` seconds, one that took longer than the pause before it (it waited out
        its timeout: Redis hangs, paused or overloaded) is followed at once, so that a probe
        is always waiting on a Redis that hangs, and one that failed at once (refused: Redis
        is not there) after the same pause (a restart is noticed within a pause); after
        that, each after a pause twice as long as the last, up to ``max_retry`` (a long
        outage is not probed without a rest). So every process learns that a short outage
        has ended at about the same moment, not one backoff apart."""
        text = self.describe(exc)
        now = self._clock()
        with self.lock:
            if self._down:
                self._last_error = text
                self._failures += 1
                if now - self._down_since >= self._max:  # a long outage: probe less often
                    self._backoff = min(self._backoff * 2, self._max)
                elif now - began >= self._backoff:  # it hung that long: the next goes now
                    self._retry_at = now
                    return
                self._retry_at = now + self._backoff
                log.debug("reachlimit: Redis at %s still unavailable (%s)", self.where, text)
                return
        self.failed(exc)  # a call marked it up meanwhile: this failure is news

    def close(self, timeout: float = 5.0) -> None:
        """Stop the probe thread for good (joined for up to ``timeout`` seconds). Safe to
        call more than once; a closed health goes on with request probes."""
        super().close(timeout)

    def describe(self, exc: BaseException) -> str:
        """``exc`` as one line, with any secret of the URL replaced by ``***``."""
        return scrub(f"{type(exc).__name__}: {exc}", self._secrets)

    def figures(self) -> dict[str, Any]:
        """For a health answer: the masked URL, up or not, outages so far, the last error."""
        with self.lock:
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
