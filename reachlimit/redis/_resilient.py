"""Redis as a shared backend that may fail: a degraded mode, never an outage.

design:

    Every wrapper here shares one ``RedisHealth`` (``_health``) for its Redis, so Redis
    failing degrades the limiter, the cache and the flight at once.

    ResilientLimiter the cold limiter's surface (``acquire(cancel, client) -> grant``,
                     ``stats()``) over a RedisColdLimiter, with an in-process ColdLimiter as
                     fallback:
        up                    the shared limiter decides (its Busy and Cancelled pass through)
        down, "local"         the in-process limiter decides, with this process's share
                              of the budget: ceil(active / N) builds and ceil(queue / N)
                              queue places (queue 0 stays 0), N the live processes of
                              the budget as Redis last counted them (below)
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
                              ``degraded=True``) when down, whose ``capacity_active`` and
                              ``capacity_queue`` are then the share it admits.
        Redis back            an acquire goes where the health says when it starts: every
                              acquire that starts once the health is up again (its probe
                              thread marks it up without waiting for traffic) goes to Redis,
                              none to the fallback (unless Redis fails again). What the
                              fallback admitted before goes on there: its builds run to
                              their end, and a waiter queued in it keeps its place and its
                              wait (it is admitted there). Redis is told about those
                              builds as it comes back (the outage's end, below).

    The share (``fallback="local"``). N is how many processes use the budget with a
    fallback of their own: each announces itself to Redis in the background (``members``,
    ``_members``: one daemon thread, every second, off the request's path; started by the
    first ``acquire`` or ``stats``, again in a forked child), and the announce's reply is
    N, kept in the process (at least 1; 1 if Redis never answered one). A process that dies
    drops out one announce period later (at once when its gunicorn master frees its places,
    ``release_owner``); one that closes leaves at once. The in-process limiter is given the
    share of its own figures (those it was built with) by ``ColdLimiter.resize`` when the
    fallback first answers with an N it has not been sized for - while Redis is away nothing
    can announce, so that is the N Redis last counted when the outage began - and for
    ``stats()`` while down. Shrinking evicts nothing (``resize``): a fallback build still
    running from an outage before goes on. So the processes together admit about the
    budget during an outage: the sum of their shares, ceil(active / N) each (with 4
    processes and active 2: 4 builds at once, where each admitting the whole budget made
    8), plus any process whose announce Redis never answered, which counts itself alone
    (the whole budget).

    The outage's edges. Its start: every shared grant also occupies a slot of the local
    limiter (``ColdLimiter.occupy``: over the capacity, never waiting, not counted as
    acquired), given back with the grant, so a process's fallback admits its share less the
    shared builds still running in it (a freed one hands its slot to a fallback waiter).
    The worst case is one process holding all ``active`` shared slots when Redis goes:
    active + (N - 1) x ceil(active / N) at once until those end (5 for 4 processes and
    active 2). Its end: every fallback grant is kept (``_FallbackGrant``, in ``_running``)
    until released, and ``hold_fallback_builds`` tells Redis about those it does not count
    yet, in one script (``RedisColdLimiter.hold_fallback_builds``, the operation of that name
    of ``lua/limiter.lua``) that makes each a holder of the budget with a lease, over the
    capacity if need be, so that Redis gives no slot to anyone beside them until enough have
    ended; the grant's release frees that holder too (a Redis error there is swallowed: its
    lease ends it). ``hold_fallback_builds`` runs in the
    health's probe thread before it marks Redis up (``RedisHealth.before_up``: a failure
    fails the probe), before the first shared acquire after an outage (a health without a
    probe thread), and for a fallback grant handed out while Redis is up (a waiter queued
    in the fallback when Redis came back). Each process learns on its own that Redis is
    back (its probe, brought forward by its members' next announce, every second:
    ``RedisHealth.probe_soon``), so the first one back (``recover``, in that same script)
    also reserves in Redis the share of every other live process, which may still admit it
    on its fallback, for ``RESERVE`` seconds: Redis admits nobody beside those shares until
    each process is back too (its own recovery ends its reservation, and so does an
    announce of a process that never left Redis; ``lua/limiter.lua``'s Reservations). A
    process that learns it later than that may still run its share beside Redis's budget
    until it does; a holder lost meanwhile (Redis restarted empty again) is not told again.
    With ``fallback="refuse"`` nothing is announced or told: such a process admits
    nothing while Redis is away.

    ResilientCache   ``get``/``set`` of the Cache protocol (and ``lookup``/``put`` of a cache
                     with a stale window): Redis when up, the in-process cache when down. A
                     failing ``get`` or ``lookup`` is a miss, never an error; a probe skips
                     the shared cache's first level, which says nothing about Redis.
                     ``clear`` and ``forget(key)`` are an admin's explicit calls, never a
                     request's: the fallback cache first, then Redis, tried even while it
                     is believed down; Redis failing there is ``reachlimit.Unavailable``
                     (URL masked), never swallowed (every worker would go on serving the
                     old entries for a whole TTL, and the caller could not tell). Either
                     outcome is reported to the health.
    ResilientFlight  ``do(key, fn, cancel) -> (value, shared)``: the shared flight when up,
                     the in-process SingleFlight when down (as the health says when ``do``
                     starts: a local flight led when Redis comes back ends on the fallback,
                     and a new call of its key goes to Redis). ``fn`` runs at most once per
                     call: if the shared flight fails after ``fn`` has run, its outcome is
                     returned (or raised) as it is, never computed again. An error ``fn`` raised
                     itself - a ``redis.RedisError`` or ``OSError`` of the build's own - is
                     the build's outcome, never taken for Redis failing: not by the leader,
                     and not by its followers in the same process, which receive the very
                     exception object (it carries a mark saying so).

    A Redis restarted empty needs nothing special: the scripts are loaded again when Redis
    answers NOSCRIPT, and RedisColdLimiter's keys are rebuilt by its next script (a waiter
    that lost its place sees ``Busy("timeout")``, a holder's release frees nothing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, cast

from .._cache import forget_in, lookup_in, put_into
from .._cancel import CancelToken
from .._errors import Busy, Cancelled, LeaderFailed, ReachLimitError, Unavailable
from .._fork import reset_after_fork
from .._limiter import ColdLimiter, Grant, LimiterFigures, LimiterStats
from .._path import Cache, Flight
from ._health import FAILURES, RedisHealth
from ._limiter import RedisColdLimiter, RedisLimiterStats
from ._members import Members

__all__ = ["FALLBACKS", "ResilientCache", "ResilientFlight", "ResilientLimiter"]

log = logging.getLogger("reachlimit")

#: The fallback modes of :class:`ResilientLimiter`.
FALLBACKS = ("local", "refuse")

T = TypeVar("T")


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

    __slots__ = ("_inner", "_health", "_fallback_slot")

    def __init__(self, inner: Grant, health: RedisHealth, fallback_slot: Grant | None) -> None:
        self._inner = inner  # the slot is the inner grant's
        self._health = health
        # The fallback's slot it occupies (ColdLimiter.occupy), if any.
        self._fallback_slot = fallback_slot

    @property
    def held(self) -> bool:
        return self._inner.held

    @property
    def lease_lost(self) -> bool:
        return bool(getattr(self._inner, "lease_lost", False))

    def _give_back(self, strict: bool) -> None:
        try:
            try:
                _release_inner(self._inner, strict)
            finally:
                slot, self._fallback_slot = self._fallback_slot, None
                if slot is not None:
                    slot.release()  # the fallback's slot, given back whatever Redis said
        except FAILURES as exc:
            _release_failed(self._health, exc)


def _release_inner(inner: Grant, strict: bool) -> None:
    """Release the grant a wrapper holds as the wrapper itself is released: ``strict`` (a
    second release raises) or as a ``with`` block ends (a second one does nothing)."""
    if strict:
        inner.release()
    else:
        inner.__exit__(None, None, None)


def _release_failed(health: RedisHealth, exc: BaseException) -> None:
    """A slot in Redis could not be released: Redis is down (logged; its lease frees it)."""
    health.failed(exc)
    log.warning(
        "reachlimit: could not release a build slot in Redis at %s (%s); its lease will free it",
        health.where, health.describe(exc),
    )


class _FallbackGrant(Grant):
    """A grant of the fallback limiter, which Redis is told about if it comes back while the
    build runs (``ResilientLimiter.hold_fallback_builds``): its release gives back the
    fallback's slot, then the holder Redis made for it, if any (a Redis error there is
    logged and swallowed: that holder's lease frees it)."""

    __slots__ = ("_inner", "_owner", "in_redis")

    def __init__(self, inner: Grant, owner: ResilientLimiter) -> None:
        self._inner = inner
        self._owner = owner
        #: The grant Redis holds for this build (``_BEING_HELD`` while it is being made),
        #: or None; guarded by the owner's ``_running_lock``.
        self.in_redis: Grant | None = None

    @property
    def held(self) -> bool:
        return self._inner.held

    def _give_back(self, strict: bool) -> None:
        try:
            _release_inner(self._inner, strict)
        finally:
            self._owner._ended(self)


class _BeingHeld(Grant):
    """The mark of a fallback grant whose holder in Redis is being made (never released)."""

    __slots__ = ()

    def _give_back(self, strict: bool) -> None:  # pragma: no cover - never handed out
        raise AssertionError("a mark, not a grant")


_BEING_HELD = _BeingHeld()


class ResilientLimiter(LimiterFigures):
    """A shared (Redis) cold limiter that falls back when Redis fails (module design).

    ``fallback="local"``: the in-process ``local`` limiter takes over, admitting this
    process's share of its figures: ceil(active / N) builds and ceil(queue / N) places, N
    the live processes of the budget as Redis last counted them (``members``, announced in
    the background); ``"refuse"``: every cold request is refused with
    ``Busy("unavailable")`` until Redis is back.

    ``members`` is this process's membership of the budget (a
    :class:`~reachlimit.redis._members.Members`, ``remote.members()``; None with
    ``fallback="refuse"``). :meth:`close` stops it, and leaves the budget when Redis is
    believed up."""

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
        # Its four figures are the shared limiter's (the fallback's own are the same).
        self._set_figures(
            remote.capacity_active, remote.capacity_queue, remote.wait, remote.retry_after
        )
        members: Members | None = None
        if fallback == "local":
            members = remote.members()
            members.on_answer = health.probe_soon  # Redis back noticed within a period
            members.uses_redis = self._uses_redis  # its reservation dropped once it does
        self.members = members
        # The figures the share is taken of (read-only), and the N the local limiter is
        # sized for now (written under _share_lock with the resize, read racily first).
        self._budget = (local.capacity_active, local.capacity_queue)
        self._shared_by = 1
        self._share_lock = threading.Lock()
        # The fallback's grants not released yet, and whether any of them may be unknown to
        # Redis (read racily first): what hold_fallback_builds() tells Redis as it comes back.
        self._running: set[_FallbackGrant] = set()  # guarded by _running_lock
        self._unheld = False  # guarded by _running_lock (racy reads)
        self._running_lock = threading.Lock()
        if fallback == "local":
            health.before_up(self.recover)
        reset_after_fork(self, ResilientLimiter._forked)

    @property
    def processes(self) -> int:
        """Racy read: N, the live processes of the budget as Redis last counted them (at
        least 1; 1 with ``fallback="refuse"``, or before Redis ever answered an announce)."""
        return 1 if self.members is None else self.members.count

    def share(self, processes: int | None = None) -> tuple[int, int]:
        """(builds, queue places) the fallback admits with ``processes`` live processes
        (default: :attr:`processes`): ceil(active / N) and ceil(queue / N) of the local
        limiter's own figures."""
        n = self.processes if processes is None else max(1, processes)
        active, queue = self._budget
        return -(-active // n), -(-queue // n)

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        """Take a build slot: the shared limiter's while Redis works, else the fallback's
        (both share their queue fairly among clients: ``client`` names whoever asks).
        Raises ``Busy`` or ``Cancelled`` as a ColdLimiter does, never a Redis error."""
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        members = self.members
        if members is not None:
            members.start()  # (a no-op once it announces)
        health = self.health
        if not health.available():
            return self._fall_back(cancel, None, client)
        started = time.monotonic()
        since = health.failures
        try:
            if self._unheld:  # racy read: Redis is back and does not count them yet
                self.hold_fallback_builds()
            grant = self.remote.acquire(cancel, client)
        except ReachLimitError:
            health.succeeded(since)  # Redis answered: a refusal or a cancellation is an answer
            raise
        except FAILURES as exc:
            health.failed(exc, since)
            return self._fall_back(cancel, started + self.remote.wait, client)
        health.succeeded(since)
        # The fallback counts this build as running here (module design: the outage's
        # start), so what it admits if Redis goes now is the share less what runs here.
        slot = self.local.occupy() if self.fallback == "local" else None
        return _SharedGrant(grant, health, slot)

    def _fall_back(
        self, cancel: CancelToken | None, deadline: float | None, client: Hashable
    ) -> Grant:
        """The fallback's answer; with ``deadline``, only for the rest of the wait."""
        if self.fallback == "refuse":
            raise Busy(Busy.UNAVAILABLE, self.remote.retry_after)
        local = self._sized()
        if deadline is None:
            return self._track(local.acquire(cancel, client))
        if time.monotonic() >= deadline:
            raise Busy(Busy.TIMEOUT, self.remote.retry_after)
        try:
            # The local limiter counts a wait ended by this deadline as cancelled.
            return self._track(local.acquire(_Deadline(cancel, deadline), client))
        except Cancelled:
            if cancel is not None and cancel.is_set():
                raise
            raise Busy(Busy.TIMEOUT, self.remote.retry_after) from None

    def _track(self, inner: Grant) -> Grant:
        """A grant of the fallback, kept among the builds Redis is told about when it comes
        back (module design: the outage's end); told at once if Redis is back already (a
        waiter queued in the fallback when it came back)."""
        grant = _FallbackGrant(inner, self)
        with self._running_lock:
            self._running.add(grant)
            self._unheld = True
        health = self.health
        if health.up:
            since = health.failures
            try:
                self.hold_fallback_builds()
            except FAILURES as exc:
                health.failed(exc, since)  # told when Redis is back again
            except Exception:  # the build goes on, never without its grant (told later)
                log.exception("reachlimit: could not tell Redis about a fallback build")
            else:
                health.succeeded(since)
        return grant

    #: How long the first process back from an outage reserves the other processes' shares
    #: in Redis (``recover``): about how long they take to learn that Redis is back (each
    #: probes every 0.25 s through an outage's first seconds, and at once after an announce
    #: that worked, which comes every second), so that Redis admits nobody beside the builds
    #: their fallbacks may still admit until then; a process back sooner, or one that never
    #: left Redis (its next announce), ends its reservation at once.
    RESERVE = 1.5

    def _uses_redis(self) -> bool:
        """Racy read: whether this process goes to Redis now (its health is up)."""
        return self.health.up

    def recover(self) -> int:
        """This process is back from an outage (the health's probe thread, before it marks
        Redis up): :meth:`hold_fallback_builds`, and in the same script the reservation of
        this process's share ends, or, if it is the first process back, every other live
        process's share is reserved for :attr:`RESERVE` seconds, since those may still admit
        it on their fallbacks until they learn that Redis is back (module design: the
        outage's end).
        How many builds it told; errors of Redis propagate (the probe fails)."""
        members = self.members
        if members is None:
            return self.hold_fallback_builds()
        return self.hold_fallback_builds(recovery=(members.id, self.processes, self.RESERVE))

    def hold_fallback_builds(self, recovery: tuple[str, int, float] | None = None) -> int:
        """Tell Redis about the fallback's builds still running here that it does not count
        (module design: the outage's end), in one script that makes each a holder of the
        budget, over its capacity if need be: Redis gives no slot to anyone beside them
        until enough have ended. Run by the health's probe thread before it marks Redis up
        (:meth:`recover`, which passes ``recovery``), by the first shared acquire after an
        outage, and for a fallback grant handed out while Redis is up. How many it told;
        errors of Redis propagate (those builds are told next time)."""
        with self._running_lock:
            todo = [grant for grant in self._running if grant.in_redis is None]
            for grant in todo:
                grant.in_redis = _BEING_HELD
            self._unheld = False
        if not todo and recovery is None:
            return 0
        try:
            made = self.remote.hold_fallback_builds(len(todo), recovery=recovery)
        except BaseException:
            with self._running_lock:
                for grant in todo:
                    if grant.in_redis is _BEING_HELD:
                        grant.in_redis = None
                        self._unheld = True
            raise
        ended = []
        with self._running_lock:
            for grant, shared in zip(todo, made, strict=True):
                if grant in self._running:
                    grant.in_redis = shared
                else:  # its build ended meanwhile
                    ended.append(shared)
        for shared in ended:
            self._release_in_redis(shared)
        return len(todo)

    def _ended(self, grant: _FallbackGrant) -> None:
        """A fallback grant was released: forget it, and free its holder in Redis if it had
        one (a hold_fallback_builds under way, if any, frees it as it ends)."""
        with self._running_lock:
            self._running.discard(grant)
            shared, grant.in_redis = grant.in_redis, None
        if shared is not None and shared is not _BEING_HELD:
            self._release_in_redis(shared)

    def _release_in_redis(self, shared: Grant) -> None:
        """Release a holder Redis made for a fallback build, never raising a Redis error."""
        try:
            shared.release()
        except FAILURES as exc:
            _release_failed(self.health, exc)

    def _forked(self) -> None:
        """In a forked child: the parent's fallback builds are the parent's to tell."""
        self._running = set()
        self._unheld = False
        self._running_lock = threading.Lock()
        self._share_lock = threading.Lock()

    def _sized(self) -> ColdLimiter:
        """The local limiter, sized first for this process's share if N changed since it
        was last sized (module design): a racy look, then a check under _share_lock."""
        local = self.local
        members = self.members
        if members is not None and members.count != self._shared_by:
            with self._share_lock:
                n = members.count
                if n != self._shared_by:
                    active, queue = self.share(n)
                    local.resize(active=active, queue=queue)
                    self._shared_by = n
        return local

    def stats(self) -> LimiterStats:
        """Redis's global figures when it answers, else the fallback's, marked degraded
        (its capacities the share it admits)."""
        members = self.members
        if members is not None:
            members.start()
        health = self.health
        if health.available():
            since = health.failures
            try:
                figures = self.remote.stats()
            except FAILURES as exc:
                health.failed(exc, since)
            else:
                health.succeeded(since)
                return figures
        if self.fallback == "local":
            return degraded_stats(self._sized().stats())
        return degraded_stats(self.local.stats())

    def close(self) -> None:
        """Stop the shared limiter's threads and the announcing one; leave the budget's
        live processes at once if Redis is believed up (else this process drops out of
        them one period later: no close waits for a Redis that is away)."""
        if self.members is not None:
            self.members.close(leave=self.health.up)
        self.remote.close()

    def __repr__(self) -> str:
        return (
            f"<ResilientLimiter {self.remote!r} via {self.health.where} "
            f"fallback={self.fallback} {'up' if self.health.up else 'down'}>"
        )


def degraded_stats(local: LimiterStats) -> RedisLimiterStats:
    """The in-process limiter's figures, marked as the fallback's."""
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
        deadline=local.deadline,
        backend="local",
        degraded=True,
        lease_lost=0,
    )


class ResilientCache:
    """A shared warm cache with an in-process fallback (module design). ``get`` never
    raises a Redis error: a failed read is a miss (answered by the fallback)."""

    def __init__(self, remote: Cache, local: Cache, health: RedisHealth) -> None:
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
                health.failed(exc, since)
            else:
                health.succeeded(since)
                return value
        return self.local.get(key)

    @property
    def stale(self) -> float:
        """The shared cache's stale window (the fallback's is the same)."""
        return float(getattr(self.remote, "stale", 0.0))

    @property
    def ttl(self) -> float | None:
        """The shared cache's TTL (the fallback's is the same), or None when it has none:
        what ColdPath backs a failing refresh off by."""
        ttl = getattr(self.remote, "ttl", None)
        return None if ttl is None else float(ttl)

    def lookup(self, key: Any) -> Any:
        """``get`` for an entry, fresh or stale (``Entry`` or None): the shared cache's while
        Redis answers, else the fallback's."""
        health = self.health
        if health.available():
            since = health.failures
            # A probe must reach Redis, as in get (``fetch_entry`` skips the first level).
            fetch = getattr(self.remote, "fetch_entry", None) if not health.up else None
            try:
                entry = fetch(key) if callable(fetch) else lookup_in(self.remote, key)
            except FAILURES as exc:
                health.failed(exc, since)
            else:
                health.succeeded(since)
                return entry
        return lookup_in(self.local, key)

    def lookup_near(self, key: Any) -> Any:
        """The shared cache's first level only (no round trip): what ColdPath asks while the
        flight reads the shared entry itself (:meth:`ResilientFlight.reads_cache`)."""
        return cast(Any, self.remote).lookup_near(key)

    def set(self, key: Any, value: Any) -> None:
        self.put(key, value, 0.0)

    def put(self, key: Any, value: Any, build_time: float) -> None:
        health = self.health
        if health.available():
            since = health.failures
            try:
                put_into(self.remote, key, value, build_time)
            except FAILURES as exc:
                health.failed(exc, since)
            else:
                health.succeeded(since)
                return
        put_into(self.local, key, value, build_time)

    def clear(self) -> None:
        """Empty the fallback cache, then the shared one (when each can be emptied): Redis
        is tried even while the health says it is down. ``reachlimit.Unavailable`` when it
        cannot be reached (the fallback is empty all the same)."""
        clear = getattr(self.local, "clear", None)
        if callable(clear):
            clear()
        clear = getattr(self.remote, "clear", None)
        if callable(clear):
            self._explicit(clear)

    def forget(self, key: Any) -> bool:
        """Drop ``key`` from the fallback cache, then from the shared one (its entry in Redis
        and its first level), Redis tried even while the health says it is down; True when
        either held it. ``reachlimit.Unavailable`` when Redis cannot be reached (the key is
        gone from the fallback all the same); TypeError for a key the shared cache cannot
        encode."""
        dropped = forget_in(self.local, key)
        return bool(self._explicit(lambda: forget_in(self.remote, key))) or dropped

    def _explicit(self, call: Callable[[], T]) -> T:
        """``call()``, an explicit operation on Redis, its outcome reported to the health;
        Redis failing is ``Unavailable`` (the health's masked ``where`` and scrubbed text)."""
        health = self.health
        since = health.failures
        try:
            result = call()
        except FAILURES as exc:
            health.failed(exc, since)
            raise Unavailable(health.where, health.describe(exc)) from None
        health.succeeded(since)
        return result


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

    def __init__(self, remote: Flight, local: Flight, health: RedisHealth) -> None:
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
        return self._do(key, fn, cancel, lambda tracked: self.remote.do(key, tracked, cancel))

    def do_cold(
        self, key: Hashable, lead: Callable[[], T], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> tuple[T, bool]:
        """``do`` for ColdPath's leader step: the shared flight's ``do_cold`` when it has one
        (the cold lead: a cold request's one round trip)."""
        do_cold = getattr(self.remote, "do_cold", None)
        if do_cold is None:
            return self.do(key, lead, cancel)
        return self._do(key, lead, cancel, lambda tracked: do_cold(key, tracked, cancel, client))

    def reads_cache(self, cache: Any) -> bool:
        """Whether :meth:`do_cold` reads the shared entry of ``cache`` (a ResilientCache)
        itself now: the shared flight reads its shared cache (the cold lead) and Redis is up,
        so ``do_cold`` goes there. Should Redis fail in between, ``do_cold`` falls back to
        the in-process flight, whose leader step rechecks the fallback cache."""
        reads = getattr(self.remote, "reads_cache", None)
        return (
            reads is not None and isinstance(cache, ResilientCache) and self.health.up
            and bool(reads(cache.remote))
        )

    def _do(
        self,
        key: Hashable,
        fn: Callable[[], T],
        cancel: CancelToken | None,
        remote_do: Callable[[Callable[[], T]], tuple[T, bool]],
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
            result = remote_do(tracked)
        except FAILURES as exc:
            if _raised_by_a_build(exc) or (len(outcome) == 2 and outcome[1] is exc):
                # fn's own error - here, or a local leader's that its followers share: the
                # build ran under a claim taken in Redis, so Redis answered.
                health.succeeded(since)
                raise
            health.failed(exc, since)
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
