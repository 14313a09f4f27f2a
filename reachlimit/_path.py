"""ColdPath: the five layers of admission for one expensive endpoint.

design:

    get(key, build, cancel, client) / fetch(...): fetch_warm(key, build), then fetch_cold(...)
      1. warm:     cache.get(key) hit ...................... return it; the limiter is untouched
      2. flight:   SingleFlight.do(key) .................... followers wait for the leader and
                                                             share its value, error or refusal
      3. recheck:  the leader looks at the cache again ..... another leader may just have filled it
      4. limiter:  ColdLimiter.acquire(cancel, client) ..... Busy / Cancelled raised from here;
                                                             only a leader takes a queue place
      5. build:    build() with no lock held; the slot is released, then a real value is cached
                   (never None, never NOT_FOUND, never an error or a refusal)

A flight that reads the shared cache itself (``Flight.reads_cache``: on Redis, the cold lead,
whose one round trip reads the entry, claims the flight and acquires) splits layer 1: the
cache's in-process level is asked here (``lookup_near``), the shared one inside the flight,
which answers an entry it found as :class:`Found`; that is answered and counted exactly as
layer 1 answers an entry (a hit, or a stale answer and its refresh), and a request is counted
a miss only once the flight says it is one.

A leader that is cancelled (its client left while it queued) does not fail its followers: it
returns a private marker through the flight, its followers see it and go round again, and the
first of them to get back into the flight becomes the new leader.

Stale-while-revalidate (a cache with a stale window, ``TTLCache(stale=...)``): layer 1 also
answers an entry past its TTL, within its stale window, and hands a refresh of it to the
path's :class:`~reachlimit.Refresher` (never run in the asking thread); a fresh entry near the
end of its TTL is refreshed early with a probability that rises as the end nears, scaled by
how long the entry took to build (XFetch, Vattani et al., VLDB 2015, beta 1). A refresh goes
through the singleflight and the limiter like a cold request, as a client of its own
(:data:`REFRESH_CLIENT`), and rechecks first: an entry fresher than the one that asked for it
means somebody else refreshed it. A refresh whose build finds nothing (``NOT_FOUND`` or
None) removes the entry from the cache, every level of it (``forget``), so the next request
is a cold miss that builds afresh. A refresh that is refused or fails leaves the stale entry
as it is (stale-if-error); it is logged once per key until the key is built again. Either
way, and after finding nothing, the key is not refreshed again for a backoff
(:attr:`ColdPath.refresh_backoff`, on the path's ``clock``; the keys are remembered in a
bounded :class:`~reachlimit._refresh.RefreshBackoff`): its stale hits meanwhile are answered
and hand nothing to the refresher. A key built again ends its backoff.

``_lock`` guards only the counters and the refresher; no cache, build or limiter call is made
under it. The warm answers (hits and stale answers) are counted without it, each by the
``next()`` of an ``itertools.count``: one step the interpreter never interrupts, so no count
is lost between threads, and the warm hit takes no lock at all. In the child of a fork the
lock is replaced (``reachlimit._fork``), as the refresher's own lock is.
The cache, the flight and the limiter are duck-typed (the ``Cache``, ``Flight`` and ``Limiter``
protocols) so shared, Redis-backed ones can replace them.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, fields
from time import perf_counter
from typing import Any, NamedTuple, Protocol

from ._cache import Entry, TTLCache, forget_in, lookup_in, put_into
from ._cancel import CancelToken
from ._errors import Busy, Cancelled
from ._flight import SingleFlight
from ._fork import reset_after_fork
from ._limiter import Grant, LimiterStats
from ._refresh import RefreshBackoff, Refresher

__all__ = [
    "ColdPath", "ColdPathStats", "NOT_FOUND", "LEADER_CANCELLED", "Cache", "Flight", "Limiter",
    "PathCounts", "Answer", "RevalidatingCache", "REFRESH_CLIENT", "Found",
]

log = logging.getLogger("reachlimit")


class _NotFound:
    """The type of :data:`NOT_FOUND`."""

    _instance: _NotFound | None = None

    def __new__(cls) -> _NotFound:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "reachlimit.NOT_FOUND"

    def __reduce__(self) -> str:
        return "NOT_FOUND"

    def __bool__(self) -> bool:
        return False


#: What a build returns for "there is nothing under this key": passed through, never cached.
NOT_FOUND: Any = _NotFound()


class Found(NamedTuple):
    """What a flight that reads the shared cache itself (``Flight.reads_cache``) answers from
    ``do_cold`` for an entry it found there: the warm read's answer, not a build's."""

    entry: Entry


class Cache(Protocol):
    """What ColdPath needs of a warm cache. ``get`` returns ``None`` for a miss."""

    def get(self, key: Any) -> Any: ...

    def set(self, key: Any, value: Any) -> None: ...


class RevalidatingCache(Cache, Protocol):
    """A cache with a stale window (``TTLCache``, ``reachlimit.redis.RedisCache``): what
    ColdPath needs to serve stale answers and refresh early. ``stale`` is the window in
    seconds (0: off); ``lookup`` answers an :class:`~reachlimit.Entry` fresh or stale, or
    None; ``put`` is ``set`` with the value's build time. A cache may also have
    ``lookup_fields(key)``, ``lookup``'s answer as a plain tuple (``TTLCache`` has), which
    ColdPath then asks instead: cheaper to make than the Entry."""

    @property
    def stale(self) -> float: ...

    def lookup(self, key: Any) -> Entry | None: ...

    def put(self, key: Any, value: Any, build_time: float) -> None: ...


class Flight(Protocol):
    """What ColdPath needs of a singleflight: :class:`~reachlimit.SingleFlight`, or a shared
    one such as ``reachlimit.redis.RedisSingleFlight``.

    ``do(key, fn, cancel)`` runs ``fn`` once for all concurrent callers of ``key`` and returns
    ``(value, shared)``: ``shared`` is False for the caller that ran ``fn``. Followers get the
    leader's value or a refusal or error; a follower whose ``cancel`` is set raises
    ``Cancelled``. ``fn`` may return :data:`LEADER_CANCELLED`: it must reach the followers as
    a value (a shared flight passes it across processes), so that they go round again.

    A flight may also have ``do_cold(key, lead, cancel, client)``, which ColdPath then calls
    instead of ``do``, with the same contract: ``lead`` is ColdPath's leader step (recheck
    the cache, acquire from the limiter for ``client``, build), so a shared flight may do the
    recheck and the acquire in its own round trip and hand their answers to the path's cache
    and limiter (``reachlimit.redis``'s cold lead).

    And ``reads_cache(cache)``: True when its ``do_cold`` now also reads ``cache``'s shared
    level itself, in the round trip that leads (the cold lead, while Redis answers). ColdPath
    then asks only the cache's in-process level first (``cache.lookup_near(key)``, which such
    a cache has), and ``do_cold`` may answer an entry it read as a :class:`Found` value,
    which ColdPath answers as the hit (or stale answer) it is."""

    def do(
        self, key: Any, fn: Callable[[], Any], cancel: CancelToken | None = None
    ) -> tuple[Any, bool]: ...


class Limiter(Protocol):
    """What ColdPath needs of a cold limiter: the four figures it was built with, ``acquire``
    and ``stats``. ``client`` names whoever asks, for fair admission (a hashable; None is one
    anonymous client)."""

    @property
    def capacity_active(self) -> int: ...

    @property
    def capacity_queue(self) -> int: ...

    @property
    def wait(self) -> float: ...

    @property
    def retry_after(self) -> int: ...

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant: ...

    def stats(self) -> LimiterStats: ...


@dataclass(frozen=True, slots=True)
class ColdPathStats(LimiterStats):
    """The limiter's figures plus the path's own: warm ``hits``, ``misses``, ``builds`` run,
    followers ``coalesced`` onto another request's build (counted whatever that build's
    outcome: a value, an error or a refusal; not when the follower's own client left), and
    answers served ``stale`` while their entry was refreshed (not counted in ``hits``).

    ``backend`` (``"local"``: this process's limiter; ``"redis"``: the figures of every
    process on the shared limiter), ``degraded`` (True while a shared limiter's Redis is
    unavailable and its fallback answers) and ``lease_lost`` are copied from the limiter's
    figures when it has them."""

    hits: int = 0
    misses: int = 0
    builds: int = 0
    coalesced: int = 0
    stale: int = 0
    backend: str = "local"
    degraded: bool = False
    lease_lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_LIMITER_FIGURES = tuple(f.name for f in fields(LimiterStats))
#: The path's own counters that ColdPathStats shows (PathCounts has the refreshes' too).
_PATH_COUNTS = ("hits", "misses", "builds", "coalesced", "stale")


class _LeaderCancelled:
    """The type of :data:`LEADER_CANCELLED`."""

    def __repr__(self) -> str:
        return "reachlimit.LEADER_CANCELLED"


#: What a leader whose own client left returns through the flight: its followers go round and
#: one of them leads. A shared flight must hand it to its followers as it is (a hook for the
#: flights of ``reachlimit.redis``; nothing an app returns or sees).
LEADER_CANCELLED: Any = _LeaderCancelled()


class PathCounts(NamedTuple):
    """A snapshot of a :class:`ColdPath`'s own counters (:meth:`ColdPath.counts`), each exact:
    the answers (``hits``, ``misses``, ``stale``), the ``builds`` run (refreshes included),
    the followers ``coalesced``, and the refreshes ended ``refreshed`` (a value stored or
    found, or the entry removed because the build found nothing), ``refresh_refused`` (the
    limiter said no) and ``refresh_failed`` (the build raised)."""

    hits: int
    misses: int
    builds: int
    coalesced: int
    stale: int = 0
    refreshed: int = 0
    refresh_refused: int = 0
    refresh_failed: int = 0


class Answer(NamedTuple):
    """What :meth:`ColdPath.fetch` answers: the ``value`` and where it came from.

    ``status``: ``"hit"`` (a fresh entry), ``"stale"`` (an entry past its TTL, served while
    it is refreshed), ``"stored"`` (built by this call and stored; also a build whose value
    is not stored, None or ``NOT_FOUND``), ``"collapsed"`` (another caller's build, shared).
    ``fresh_for``: the seconds of freshness the entry had left (negative when stale), or
    None when not known (a cache without ``lookup``, or a value built or shared)."""

    value: Any
    status: str
    fresh_for: float | None = None


#: tuple.__new__: an Answer made on the warm path without NamedTuple's Python-level __new__.
_new = tuple.__new__

#: The client a refresh asks the limiter as (fair admission): one of its own, so refreshes
#: take their turn beside the clients that fill the queue.
REFRESH_CLIENT = "reachlimit:refresh"

#: Early refresh is drawn only when the freshness left is under this many build times: the
#: chance there is exp(-EARLY_SPAN) (about 5e-5), and a hit further from the end costs no draw.
EARLY_SPAN = 10.0


class ColdPath:
    """Warm-cache bypass, singleflight, cache recheck, cold limiter, build and publish; with a
    cache that has a stale window, stale answers and refreshes (module design).

    ``refresher``: the threads that run refreshes (default: one of the limiter's ``active``
    threads, made on the first refresh); ``random``: the early-refresh draw's source (a
    callable answering a float in [0, 1), for tests); ``clock``: the monotonic clock of the
    refreshes' backoff (for tests: the cache's; also the attribute ``clock``). :meth:`close`
    stops the refresher."""

    #: The longest backoff of a refresh that ended without a value (refused, failed, found
    #: nothing), in seconds: a cache with a TTL of an hour still has its key tried again
    #: every minute while its stale answers last.
    REFRESH_BACKOFF_CAP = 60.0

    def __init__(
        self,
        limiter: Limiter,
        cache: Cache | None = None,
        flight: Flight | None = None,
        *,
        refresher: Refresher | None = None,
        random: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = limiter
        self.cache = cache if cache is not None else TTLCache()
        self.flight: Flight = flight if flight is not None else SingleFlight()
        # Bound once: a warm hit asks it (None for a flight that never reads the cache).
        self._reads_cache: Callable[[Any], bool] | None = getattr(
            self.flight, "reads_cache", None
        )
        self._random = random
        self._refresher = refresher  # guarded by _lock
        #: The monotonic clock of the refreshes' backoff (a test gives its cache's).
        self.clock = clock
        #: ``build_wrapper(key, build) -> build``: what the path runs in place of each build
        #: it runs (a leader's, a refresh's), made once its slot is held; None: the build
        #: as it is. The Flask extension's applies its value rule there, and gives a
        #: refresh an app context, so that a warm hit makes no wrapper at all.
        self.build_wrapper: Callable[[Hashable, Callable[[], Any]], Callable[[], Any]] | None = (
            None
        )
        self._lock = threading.Lock()
        # The warm answers, counted without the lock (the module's note; read by _counted).
        self._hits = itertools.count()
        self._stale = itertools.count()
        self._misses = 0  # guarded by _lock
        self._builds = 0  # guarded by _lock
        self._coalesced = 0  # guarded by _lock
        # guarded by _lock: refreshes ended with a value, refused, failed
        self._refreshes = [0, 0, 0]
        # Refreshes ended without a value: backed off, logged once per key and episode.
        self._backoff = RefreshBackoff()
        # racy: logged once per path. Only tested for truth: a mutant to None is equivalent
        # (not marked: a pragma would hide the line's other mutants, which tests kill).
        self._cannot_forget_logged = False
        reset_after_fork(self, ColdPath._forked)

    def _forked(self) -> None:
        """In the child of a fork (``reachlimit._fork``): a new lock, the counters kept."""
        self._lock = threading.Lock()

    @property
    def cache(self) -> Cache:
        """The warm cache; a cache set here is asked from the next request on."""
        return self._cache

    @cache.setter
    def cache(self, cache: Cache) -> None:
        self._cache = cache
        # Bound once: what a warm hit asks of it. A TTLCache's lookup_fields (lookup's
        # answer as a plain tuple), another's lookup (an Entry), or None (a plain
        # get/set cache).
        self._lookup: Callable[[Any], tuple[Any, float, float] | None] | None = getattr(
            cache, "lookup_fields", None
        ) or getattr(cache, "lookup", None)

    @property
    def stale_window(self) -> float:
        """The cache's stale window in seconds (0: no stale answers, no early refresh)."""
        return float(getattr(self.cache, "stale", 0.0) or 0.0)

    def get(
        self, key: Hashable, build: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> Any:
        """Return the value for ``key``: from the cache, from a concurrent caller's build,
        or from ``build()`` run under the limiter (:meth:`fetch`'s value).

        ``client`` names whoever asks (see :meth:`ColdLimiter.acquire`); it matters only
        when this call leads, since followers take no queue place.

        Raises ``Busy`` (refused; followers of a refused leader get the same ``Busy``),
        ``Cancelled`` (``cancel`` was set), or whatever ``build`` raised.
        """
        return self.fetch(key, build, cancel, client).value

    def fetch(
        self, key: Hashable, build: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> Answer:
        """:meth:`get`, answering where the value came from too (:class:`Answer`: what the
        Flask extension's ``Cache-Status`` header says). With a stale window, a stale entry
        is answered at once and a refresh of it is handed to the refresher; ``build`` is
        then also what the refresh runs, later, on a refresher thread.

        The same as :meth:`fetch_warm`, then, on a miss, :meth:`fetch_cold`."""
        answer = self.fetch_warm(key, build)
        return answer if answer is not None else self.fetch_cold(key, build, cancel, client)

    def fetch_warm(self, key: Hashable, build: Callable[[], Any]) -> Answer | None:
        """Layer 1 alone: the :class:`Answer` of ``key``'s entry, fresh or (with a stale
        window) stale, counted as a hit or a stale answer, a refresh of it handed to the
        refresher as :meth:`fetch` would; None when the cache has nothing to answer, which
        is not counted (:meth:`fetch_cold` counts the miss). For a caller with work of its
        own to do on a miss only (the Flask extension's client and socket watch)."""
        fields = self.fetch_warm_fields(key, build)
        return None if fields is None else _new(Answer, fields)

    def fetch_warm_fields(
        self, key: Hashable, build: Callable[[], Any]
    ) -> tuple[Any, str, float | None] | None:
        """:meth:`fetch_warm`'s answer as a plain tuple, the fields of its Answer (``value,
        status, fresh_for``): what the Flask extension asks on every request, where making
        the Answer would cost a warm hit about a tenth of what the path costs it. A subclass
        that does more on a warm answer overrides this (``fetch_warm`` calls it)."""
        lookup = self._lookup
        if lookup is None:  # a plain get/set cache: a hit, its freshness not known
            value = self._cache.get(key)
            if value is None:
                return None
            next(self._hits)
            return value, "hit", None
        if self._reads_cache is not None and self._near():
            entry = self._cache.lookup_near(key)  # type: ignore[attr-defined]
        else:
            entry = lookup(key)
        if entry is None:
            return None
        value, fresh_for, build_time = entry
        if fresh_for > 0.0 and fresh_for > build_time * EARLY_SPAN:
            # A fresh entry too far from its TTL's end for an early refresh: _warm's
            # answer, written out here (most warm answers are this one).
            next(self._hits)
            return value, "hit", fresh_for
        return self._warm(key, build, entry)

    def _warm(
        self, key: Hashable, build: Callable[[], Any], entry: tuple[Any, float, float],
        count: bool = True,
    ) -> tuple[Any, str, float]:
        """Layer 1's answer of ``entry`` (its fields): a fresh hit (refreshed early, maybe)
        or a stale answer (refreshed), counted unless ``count`` is false (counted a miss
        already). The Answer's fields, as :meth:`fetch_warm_fields`."""
        value, fresh_for, build_time = entry
        if fresh_for > 0:
            if count:
                next(self._hits)
            if (
                fresh_for < build_time * EARLY_SPAN
                and self.stale_window > 0
                # XFetch: refresh when -build_time * ln(u) >= the freshness left
                and -build_time * math.log(1.0 - self._random()) >= fresh_for
            ):
                self._refresh(key, build, fresh_for)
            return value, "hit", fresh_for
        if count:
            next(self._stale)
        self._refresh(key, build, fresh_for)
        return value, "stale", fresh_for

    def _near(self) -> bool:
        """Whether the flight now reads the shared cache itself (``Flight.reads_cache``: the
        cold lead on Redis), so that layer 1 asks only the cache's in-process level."""
        reads = self._reads_cache
        return reads is not None and bool(reads(self.cache))

    def fetch_cold(
        self, key: Hashable, build: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> Answer:
        """Layers 2 to 5, for a key :meth:`fetch_warm` did not answer: counted as a miss,
        then followed or led (the cache looked at again by the leader), as :meth:`fetch`.
        When the flight reads the shared cache itself (:meth:`_near`), the request is
        counted once it is known to be a miss, not before (it may answer a :class:`Found`
        entry)."""
        near = self._near()
        if not near:
            lock = self._lock  # (explicit, as _warm's)
            lock.acquire()
            try:
                self._misses += 1
            finally:
                lock.release()
        while True:
            # Only tested for truth: mutants to None are equivalent (not marked: a pragma
            # would hide the lines' other mutants, which tests kill).
            led = False
            found = False

            def lead() -> Any:
                nonlocal led, found
                led = True
                value = self.cache.get(key)  # layer 3: another leader may just have filled it
                if value is not None:
                    found = True
                    return value
                return self._lead(key, build, cancel, client)

            do_cold = getattr(self.flight, "do_cold", None)
            try:
                if do_cold is not None:
                    value, shared = do_cold(key, lead, cancel, client)
                else:
                    value, shared = self.flight.do(key, lead, cancel)
            except Cancelled:
                if near:
                    with self._lock:
                        self._misses += 1
                raise  # our own client left while following: nothing was shared with us
            except BaseException:
                with self._lock:
                    if near:
                        self._misses += 1
                    if not led:  # a follower sharing its leader's error or refusal
                        self._coalesced += 1
                raise
            if type(value) is Found:  # the flight's read of the shared cache: layer 1's
                return _new(Answer, self._warm(key, build, value.entry, count=near))
            if near:
                near = False
                with self._lock:
                    self._misses += 1
            if value is not LEADER_CANCELLED:
                if shared:
                    with self._lock:
                        self._coalesced += 1
                    return Answer(value, "collapsed")
                return Answer(value, "hit" if found else "stored")
            if not shared or (cancel is not None and cancel.is_set()):
                raise Cancelled()
            # Our leader's client left; go round and let one of us lead.

    def counts(self) -> PathCounts:
        """This path's own counters, read together under its lock (the warm answers, counted
        without it, as they are at that moment; no call to the limiter): what a shared
        backend adds up over processes, or a metrics exporter publishes."""
        with self._lock:
            return PathCounts(
                _counted(self._hits), self._misses, self._builds, self._coalesced,
                _counted(self._stale), *self._refreshes,
            )

    def stats(self) -> ColdPathStats:
        limiter_stats = self.limiter.stats()
        # Only the figures every limiter has: a shared limiter's snapshot carries more.
        figures = {name: getattr(limiter_stats, name) for name in _LIMITER_FIGURES}
        counts = self.counts()
        return ColdPathStats(
            **figures,
            **{name: getattr(counts, name) for name in _PATH_COUNTS},
            backend=getattr(limiter_stats, "backend", "local"),
            degraded=getattr(limiter_stats, "degraded", False),
            lease_lost=getattr(limiter_stats, "lease_lost", 0),
        )

    def close(self, timeout: float = 5.0) -> None:  # pragma: no mutate (the bound's seconds)
        """Stop the refresher's threads (a refresh running finishes first); refreshes asked
        for afterwards are not run. Safe to call more than once."""
        with self._lock:
            refresher = self._refresher
            if refresher is None:  # none made: make sure none is made later
                # Closed at once, it never runs a job: a mutant of its number of threads is
                # equivalent (not marked: a pragma would hide the line's other mutants).
                refresher = self._refresher = Refresher(1)
        refresher.close(timeout)

    @property
    def refresher(self) -> Refresher:
        """The refresher's threads (made on first use)."""
        with self._lock:
            if self._refresher is None:
                self._refresher = Refresher(self.limiter.capacity_active)
            return self._refresher

    def _lead(
        self,
        key: Hashable,
        build: Callable[[], Any],
        cancel: CancelToken | None,
        client: Hashable,
    ) -> Any:
        """Layers 4 and 5, run by the leader only (inside the flight, no lock held)."""
        try:
            grant = self.limiter.acquire(cancel, client)
        except Cancelled:
            return LEADER_CANCELLED
        with grant:
            with self._lock:
                self._builds += 1
            if self.build_wrapper is not None:
                build = self.build_wrapper(key, build)
            started = perf_counter()
            value = build()
            took = perf_counter() - started
        if value is not None and value is not NOT_FOUND:
            put_into(self.cache, key, value, took)
            self._backoff.ended(key)
        return value

    # -- refreshes --------------------------------------------------------------------

    @property
    def refresh_backoff(self) -> float:
        """How long, in seconds, a key whose refresh ended without a value (refused, failed,
        found nothing) is not refreshed again: the cache's ``ttl`` (as often as the entry
        would be built without a stale window), at most :attr:`REFRESH_BACKOFF_CAP`; the cap
        for a cache that does not say its TTL."""
        ttl = getattr(self.cache, "ttl", None)
        cap = self.REFRESH_BACKOFF_CAP
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            return cap
        return min(float(ttl), cap)

    def _refresh(self, key: Hashable, build: Callable[[], Any], fresh_for: float) -> None:
        """Hand a refresh of ``key`` (seen with ``fresh_for`` left) to the refresher, unless
        the key is within a backoff."""
        if self._backoff and not self._backoff.allows(key, self.clock()):
            return
        self.refresher.submit(key, lambda: self._run_refresh(key, build, fresh_for))

    def _run_refresh(self, key: Hashable, build: Callable[[], Any], seen: float) -> None:
        """A refresh, on a refresher thread: through the flight, recheck, limiter, build."""

        def lead() -> Any:
            entry = lookup_in(self.cache, key)
            if entry is not None and entry.fresh_for > seen:
                return entry.value  # fresher than what asked: refreshed meanwhile
            return self._lead(key, build, None, REFRESH_CLIENT)

        try:
            value, _ = self.flight.do(key, lead)
        except Busy as busy:
            self._refresh_ended(key, _REFUSED, f"refused ({busy.reason})")
        except Exception as exc:
            self._refresh_ended(key, _FAILED, f"failed: {type(exc).__name__}: {exc}")
        else:
            if value is None or value is NOT_FOUND:
                # Whether this refresh built it or shared a build that did (in this process
                # or another): the thing is gone, so is its entry, in every level.
                self._refresh_found_nothing(key)
            elif value is not LEADER_CANCELLED:
                self._refresh_ended(key, _DONE, None)
            # else: it followed a request whose client left, so nothing was built and
            # nothing is counted; the next stale hit asks again.

    def _refresh_found_nothing(self, key: Hashable) -> None:
        """A refresh's build found nothing: drop ``key``'s entry so that the next request
        builds afresh (a cold miss); back off, in case some of it could not be dropped."""
        try:
            forget_in(self.cache, key)
        except Exception as exc:
            if not (isinstance(exc, TypeError) and getattr(self.cache, "forget", None) is None):
                self._refresh_ended(
                    key, _FAILED,
                    f"found nothing, and its entry could not be removed: "
                    f"{type(exc).__name__}: {exc}",
                )
                return
            if not self._cannot_forget_logged:
                self._cannot_forget_logged = True
                # no mutate: the words of a log line; that it is logged, once, is tested.
                log.warning(
                    "reachlimit: the refresh of %r found nothing, but %s; "  # pragma: no mutate
                    "its stale entry is served until its stale window ends "  # pragma: no mutate
                    "(logged once for this cache)",  # pragma: no mutate
                    key, exc,
                )
        self._refresh_ended(key, _GONE, None)

    def _refresh_ended(self, key: Hashable, outcome: int, why: str | None) -> None:
        """Count a refresh's ``outcome``; one that stored no value (``why``: its failure, or
        None when it found nothing) holds the key back for :attr:`refresh_backoff`."""
        with self._lock:
            self._refreshes[0 if outcome == _GONE else outcome] += 1
        if outcome == _DONE:
            self._backoff.ended(key)
        else:
            self._backoff.hold(key, self.clock() + self.refresh_backoff, why)


def _counted(counter: itertools.count[int]) -> int:
    """How many times ``next`` was called on ``counter`` (an ``itertools.count()``), read
    without counting: its repr is ``count(<the next number>)``."""
    return int(repr(counter)[6:-1])


#: ``_refresh_ended``'s outcomes: the indexes of ``ColdPath._refreshes``, and _GONE (a build
#: that found nothing: counted as refreshed, and held back).
_DONE, _REFUSED, _FAILED, _GONE = 0, 1, 2, 3
