"""ColdPath: the five layers of admission for one expensive endpoint.

design:

    get(key, build, cancel, client)
      1. warm:     cache.get(key) hit ...................... return it; the limiter is untouched
      2. flight:   SingleFlight.do(key) .................... followers wait for the leader and
                                                             share its value, error or refusal
      3. recheck:  the leader looks at the cache again ..... another leader may just have filled it
      4. limiter:  ColdLimiter.acquire(cancel, client) ..... Busy / Cancelled raised from here;
                                                             only a leader takes a queue place
      5. build:    build() with no lock held; the slot is released, then a real value is cached
                   (never None, never NOT_FOUND, never an error or a refusal)

A leader that is cancelled (its client left while it queued) does not fail its followers: it
returns a private marker through the flight, its followers see it and go round again, and the
first of them to get back into the flight becomes the new leader.

``_lock`` guards only the four counters; no cache, build or limiter call is made under it.
The cache, the flight and the limiter are duck-typed (the ``Cache``, ``Flight`` and ``Limiter``
protocols) so shared, Redis-backed ones can replace them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple, Protocol

from ._cache import TTLCache
from ._cancel import CancelToken
from ._errors import Cancelled
from ._flight import SingleFlight
from ._grant import HasFigures
from ._limiter import Grant, LimiterStats

__all__ = [
    "ColdPath", "ColdPathStats", "NOT_FOUND", "LEADER_CANCELLED", "Cache", "Flight", "Limiter",
    "PathCounts",
]


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


class Cache(Protocol):
    """What ColdPath needs of a warm cache. ``get`` returns ``None`` for a miss."""

    def get(self, key: Any) -> Any: ...

    def set(self, key: Any, value: Any) -> None: ...


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
    and limiter (``reachlimit.redis``'s cold lead)."""

    def do(
        self, key: Any, fn: Callable[[], Any], cancel: CancelToken | None = None
    ) -> tuple[Any, bool]: ...


class Limiter(HasFigures, Protocol):
    """What ColdPath needs of a cold limiter: its four figures (``HasFigures``), ``acquire``
    and ``stats``. ``client`` names whoever asks, for fair admission (a hashable; None is one
    anonymous client)."""

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant: ...

    def stats(self) -> LimiterStats: ...


@dataclass(frozen=True, slots=True)
class ColdPathStats(LimiterStats):
    """The limiter's figures plus the path's own: warm ``hits``, ``misses``, ``builds`` run,
    and followers ``coalesced`` onto another request's build (counted whatever that build's
    outcome: a value, an error or a refusal; not when the follower's own client left).

    ``backend`` (``"local"``: this process's limiter; ``"redis"``: the figures of every
    process on the shared limiter), ``degraded`` (True while a shared limiter's Redis is
    unavailable and its fallback answers) and ``lease_lost`` are copied from the limiter's
    figures when it has them."""

    hits: int = 0
    misses: int = 0
    builds: int = 0
    coalesced: int = 0
    backend: str = "local"
    degraded: bool = False
    lease_lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_LIMITER_FIGURES = tuple(f.name for f in fields(LimiterStats))


class _LeaderCancelled:
    """The type of :data:`LEADER_CANCELLED`."""

    def __repr__(self) -> str:
        return "reachlimit.LEADER_CANCELLED"


#: What a leader whose own client left returns through the flight: its followers go round and
#: one of them leads. A shared flight must hand it to its followers as it is (a hook for the
#: flights of ``reachlimit.redis``; nothing an app returns or sees).
LEADER_CANCELLED: Any = _LeaderCancelled()


class PathCounts(NamedTuple):
    """A consistent snapshot of a :class:`ColdPath`'s own counters (:meth:`ColdPath.counts`)."""

    hits: int
    misses: int
    builds: int
    coalesced: int


class ColdPath:
    """Warm-cache bypass, singleflight, cache recheck, cold limiter, build and publish."""

    def __init__(
        self,
        limiter: Limiter,
        cache: Cache | None = None,
        flight: Flight | None = None,
    ) -> None:
        self.limiter = limiter
        self.cache: Cache = cache if cache is not None else TTLCache()
        self.flight: Flight = flight if flight is not None else SingleFlight()
        self._lock = threading.Lock()
        self._hits = 0  # guarded by _lock
        self._misses = 0  # guarded by _lock
        self._builds = 0  # guarded by _lock
        self._coalesced = 0  # guarded by _lock

    def get(
        self, key: Hashable, build: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> Any:
        """Return the value for ``key``: from the cache, from a concurrent caller's build,
        or from ``build()`` run under the limiter.

        ``client`` names whoever asks (see :meth:`ColdLimiter.acquire`); it matters only
        when this call leads, since followers take no queue place.

        Raises ``Busy`` (refused; followers of a refused leader get the same ``Busy``),
        ``Cancelled`` (``cancel`` was set), or whatever ``build`` raised.
        """
        value = self.cache.get(key)
        if value is not None:
            with self._lock:
                self._hits += 1
            return value
        with self._lock:
            self._misses += 1
        while True:
            led = False

            def lead() -> Any:
                nonlocal led
                led = True
                return self._lead(key, build, cancel, client)

            do_cold = getattr(self.flight, "do_cold", None)
            try:
                if do_cold is not None:
                    value, shared = do_cold(key, lead, cancel, client)
                else:
                    value, shared = self.flight.do(key, lead, cancel)
            except Cancelled:
                raise  # our own client left while following: nothing was shared with us
            except BaseException:
                if not led:  # a follower sharing its leader's error or refusal
                    with self._lock:
                        self._coalesced += 1
                raise
            if value is not LEADER_CANCELLED:
                if shared:
                    with self._lock:
                        self._coalesced += 1
                return value
            if not shared or (cancel is not None and cancel.is_set()):
                raise Cancelled()
            # Our leader's client left; go round and let one of us lead.

    def counts(self) -> PathCounts:
        """This path's own counters, read together under its lock (no call to the limiter):
        what a shared backend adds up over processes, or a metrics exporter publishes."""
        with self._lock:
            return PathCounts(self._hits, self._misses, self._builds, self._coalesced)

    def stats(self) -> ColdPathStats:
        limiter_stats = self.limiter.stats()
        # Only the figures every limiter has: a shared limiter's snapshot carries more.
        figures = {name: getattr(limiter_stats, name) for name in _LIMITER_FIGURES}
        with self._lock:
            return ColdPathStats(
                **figures,
                hits=self._hits,
                misses=self._misses,
                builds=self._builds,
                coalesced=self._coalesced,
                backend=getattr(limiter_stats, "backend", "local"),
                degraded=getattr(limiter_stats, "degraded", False),
                lease_lost=getattr(limiter_stats, "lease_lost", 0),
            )

    def _lead(
        self,
        key: Hashable,
        build: Callable[[], Any],
        cancel: CancelToken | None,
        client: Hashable,
    ) -> Any:
        """Layers 3 to 5, run by the leader only (inside the flight, no lock held)."""
        value = self.cache.get(key)
        if value is not None:
            return value
        try:
            grant = self.limiter.acquire(cancel, client)
        except Cancelled:
            return LEADER_CANCELLED
        with grant:
            with self._lock:
                self._builds += 1
            value = build()
        if value is not None and value is not NOT_FOUND:
            self.cache.set(key, value)
        return value
