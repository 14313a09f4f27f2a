"""A warm cache shared by every process that uses the same Redis and name.

design:

    Values: JSON (codec ``"json"``), raw bytes (codec ``"bytes"``) or either (codec ``"auto"``:
    bytes stay bytes, anything else is JSON; the Flask extension's choice), never pickle. A stored
    value starts with one tag byte (``j`` or ``b``); a value Redis hands back that does not
    decode under this cache's codec (corrupt, hostile, or written by another codec) is a miss,
    logged once per object; decoding runs no code of any kind, and a JSON nested too deep or
    a number too long is a miss too. JSON turns tuples into lists, as JSON does.

    RedisCache keys (one hash tag for the cache, ``C = {<prefix>:<name>:cache}``, so the set
    script touches one slot):

      C:e:<digest>   STR   one entry: the encoded value, with a TTL (``PX``)
      C:index        ZSET  digest -> expiry (ms, Redis time) of every entry; scores strictly
                           increase (a set in the same millisecond as the last one adds
                           1/100 ms), so the index is in the order of the sets

    On a Redis Cluster the entries spread over slots (and so over nodes): an entry is
    ``<prefix>:<name>:cache:e:<digest>``, no hash tag, hashed by itself; the index (and the
    settings) keep the tag, one slot. A set is then up to three round trips instead of one:
    the script's ``index`` (``lua/cache.lua``: index it, evict past ``size``, answer the
    settings in Redis and the evicted digests) on the index's node, the entry's ``SET ... PX``
    on its own with those settings, and, only when something was evicted, one pipeline of
    ``DEL`` (one batch per node). The entry is indexed before it is SET (so that its TTL is
    the one in Redis), and so outlives its index entry: a process that dies between the two
    leaves an index entry without an entry, which counts towards ``size`` until it expires or
    is evicted.
    ``clear`` empties the index in one script (its ``drain``, answering every digest it
    held) and deletes those entries, one batch per node; an entry whose set raced the
    clear (SET before it, indexed after) survives it, as a set just after the clear would.
    ``forget(key)`` is the entry's ``DEL`` and its index entry's ``ZREM``: one round trip
    (a ``MULTI`` on one Redis; on a Cluster one batch per node, not atomic: an index entry
    left without its entry counts towards ``size`` until it expires or is evicted, as one
    whose entry Redis evicted does). A get is one GET (or GET and PTTL, same key) on the
    entry's node, as on one Redis.

    ``get``: the first level (an in-process ``TTLCache`` with ``local_ttl``) first; a hit
    there makes no Redis call. Otherwise one ``GET``; a hit is copied into the first level, a
    miss is not (so a value set by another process is seen at the next ``get``). Staleness:
    a value changed in another process may be served from here for at most ``local_ttl``.
    ``set``: one script (one round trip): drop the index entries that have expired, ``SET
    ... PX ttl`` the entry, index it, and while the index holds more than ``size`` entries
    delete the one that expires first. All entries of a name share one TTL, so the first to
    expire is the oldest set: eviction drops the oldest entry, one at a time, never the whole
    cache (all at once the extra ones when ``size`` was just made smaller). The index itself
    expires ``ttl`` after the last set.

    Settings are data in Redis: ``ttl``, ``stale`` and ``size`` are the cache's settings hash
    (``C:settings``), written by every process when it starts using the cache (its first
    call), the newest start winning, with one INFO line naming a change; a set reads them
    there (``lua/cache.lua``, which also re-creates a hash Redis lost), so the
    TTL of an entry in Redis and the size of the index are the cache's, whatever this
    process was given, and a difference is never an error. What stays this process's own:
    its first level (``local_ttl``, ``local_size``), whether it serves stale answers at all
    (its ``stale`` > 0), and its in-process fallback (``ResilientCache``).

    A stale window (``stale`` > 0 in Redis, REACHLIMIT_STALE): an entry lives ``ttl + stale``
    in Redis (its ``PX``, its index score and the index's own expiry), and is fresh while its
    ``PTTL`` is above ``stale``: one clock for every process, Redis's. Entry layout with a
    window (the set script writes the header, with the window it set the entry for):

      t<build ms>,<stale ms>;<tag><payload>
                        the build time in whole ms, the entry's stale window, then the
                        codec's bytes (``t`` is a tag no codec writes). ``t<build ms>;``
                        (an older version's) has this process's window; an entry without
                        a header has none (and decodes with build time 0)

    So a reader knows when an entry turns stale from the entry itself, whatever its own
    ``stale``; one without a window of its own that finds an entry with a window (a deploy
    that turned the window on, not yet everywhere) asks its ``PTTL`` too and takes an entry
    past its freshness for a miss.

    ``lookup`` (and ``fetch_entry``, which skips the first level: ResilientCache's probe)
    asks Redis ``GET`` and ``PTTL`` in one round trip (a pipeline, no transaction): fresh for
    ``(PTTL - stale) / 1000`` s, stale at ``PTTL <= stale``, gone when Redis has dropped it.
    The first level holds fresh entries only, each with its own fresh-until on ``clock``
    (measured from a reading taken before the request was sent, so never later than Redis's,
    and at most ``local_ttl`` ahead): it never answers an entry past its freshness, let alone
    past its stale window. A stale answer always comes from Redis, so a refresh's recheck
    sees what another process stored. Without a stale window nothing changes: one plain
    ``GET``, values as they are, in the first level as they are.

    The cold lead (``_lead``: through the extension, on one Redis) reads an entry in its own
    script, GET and PTTL, once the first level has missed (``lookup_near``, ``lead_key``):
    :meth:`RedisCache.found` answers what it read as ``fetch_entry`` would, and holds it in
    the first level the same way; its freshness is known from that PTTL with or without a
    stale window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from .. import _values
from .._cache import Entry, TTLCache, check_stale
from . import lua
from ._common import Client, LogOnce, Named, is_cluster, key_digest, ms, positive, record_settings
from ._lead import NextCallAnswer

__all__ = ["CODECS", "Codec", "RedisCache"]


#: "json": JSON values; "bytes": bytes only; "auto": bytes as bytes, anything else as JSON
#: (what the Flask extension uses: one app may cache a rendered body, another a dict).
CODECS = ("json", "bytes", "auto")


class Codec:
    """Encodes values to tagged bytes and back; never pickle."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError('codec must be "json", "bytes" or "auto"')
        self.name = codec

    def encode(self, value: Any) -> bytes:
        """Tagged bytes; TypeError for a value this codec cannot store. The tags and the JSON
        are the extension's value rule (``reachlimit._values``): one encoding for both."""
        if self.name == "bytes" and not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f'codec "bytes" stores bytes, not {type(value).__name__}')
        if self.name == "json" and isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f'codec "json" cannot store this {type(value).__name__}')
        try:
            return _values.encode(value)
        except TypeError as exc:
            raise TypeError(f'codec "{self.name}" cannot store this value: {exc}') from None

    def decode(self, data: Any) -> Any:
        """The value; ValueError for anything this codec did not write."""
        if not isinstance(data, bytes):
            raise ValueError(f"not bytes: {type(data).__name__}")
        expected = {"bytes": _values.BYTES_TAG, "json": _values.JSON_TAG}.get(self.name)
        if expected is not None and data[:1] != expected:
            raise ValueError(f"no {self.name} tag")
        return _values.decode(data)





class _Held(NamedTuple):
    """What the first level holds of an entry when there is a stale window."""

    value: Any
    fresh_until: float  # monotonic
    build_time: float


def _with_header(data: bytes, build_ms: int, stale_ms: int) -> bytes:
    """The stored bytes of an entry with a stale window, as ``lua/cache.lua``'s set writes
    them (a Cluster's set writes the entry itself): the header first."""
    return b"t%d,%d;" % (build_ms, stale_ms) + data


def _split_header(data: bytes) -> tuple[bytes, float, int | None]:
    """``(codec bytes, build time in s, stale window in ms)`` of stored bytes (module
    design): no header, build time 0 and no window; an older version's header, which names
    no window, None for it."""
    if data[:1] == b"t":
        head, sep, rest = data.partition(b";")
        if sep:
            build, comma, stale = head[1:].partition(b",")
            if build.isdigit() and (stale.isdigit() if comma else True):
                return rest, int(build) / 1000, int(stale) if comma else None
    return data, 0.0, 0


class RedisCache(Named):
    """A warm cache shared by every process on the same Redis and ``name``, with a short
    in-process first level in front. See the module's design note.

    ``get(key)`` returns the value or ``None`` (a miss); ``set(key, value)`` stores it for
    ``ttl`` seconds. At most ``size`` entries are kept in Redis (the oldest goes first), at
    most ``local_size`` in the first level, each for at most ``local_ttl`` seconds. A value
    set here is seen by every other process at once, except one that holds an older value in
    its first level: that one sees the new value within ``local_ttl``.

    ``ttl``, ``stale`` and ``size`` are written into the cache's settings hash in Redis at
    this object's first call (its start), the newest start winning (one INFO line names a
    change); what Redis holds decides an entry's TTL and the index's size for every process,
    and a difference is never an error (module design).

    ``client`` is a ``redis.Redis`` (or a ``redis.cluster.RedisCluster``: entries then
    spread over slots, see the module's note) that does not decode responses. Errors of Redis
    (``redis.exceptions.RedisError``) propagate from ``get`` and ``set``; a stored value that
    does not decode is a miss, never an exception. A value the codec cannot store makes
    ``set`` raise ``TypeError`` (under ColdPath: the build that made it fails).
    """

    def __init__(
        self, client: Client, name: str = "reachlimit",
        *,
        prefix: str = "reachlimit",
        ttl: float = 300.0,
        size: int = 256,
        local_ttl: float = 1.0,
        local_size: int = 256,
        codec: str = "json",
        stale: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bind(client, name, prefix)
        self.stale = check_stale(stale)
        self._stale_ms = ms(self.stale) if self.stale > 0 else 0
        self._clock = clock  # the first level's, and the fresh-until of what it holds
        for label, value in (("size", size), ("local_size", local_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} >= 1")
        self._ttl = positive("ttl", ttl)
        local_ttl = positive("local_ttl", local_ttl)
        self._codec = Codec(codec)
        self._size = size
        tag = "{" + prefix + ":" + name + ":cache}"
        self._index = f"{tag}:index"
        # On a Cluster an entry's key has no hash tag: hashed by itself, entries spread.
        self._spread = is_cluster(client)
        self._entry_prefix = f"{prefix}:{name}:cache:e:" if self._spread else f"{tag}:e:"
        self._ttl_ms = ms(self._ttl)
        self._local: TTLCache[Any] = TTLCache(local_size, local_ttl, clock=clock)
        # Every operation of lua/cache.lua: set and clear on one Redis; index and drain,
        # their halves that stay on the index's node, on a Cluster.
        self._script = client.register_script(lua.CACHE)
        self._settings_key = f"{tag}:settings"
        self._started = False  # racy: set once this process's settings were written to Redis
        # The arguments of a set after its operation (ARGV[2..4] of lua/cache.lua): this
        # process's settings, which count only where Redis has none.
        self._own = list(self.settings().values())
        self._undecodable = LogOnce()
        # A miss the cold lead saw, for the recheck that follows in the same thread.
        self._known_miss: NextCallAnswer[tuple[Hashable]] = NextCallAnswer()

    @property
    def ttl(self) -> float:
        """How long a value set by this object lives in Redis (s), unless the cache's
        settings in Redis, written by the newest process to start, say otherwise."""
        return self._ttl

    @property
    def size(self) -> int:
        """How many entries this object keeps in Redis at most (the same proviso)."""
        return self._size

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock of the first level."""
        return self._clock

    @property
    def local(self) -> TTLCache[Any]:
        """The in-process first level."""
        return self._local

    def key_of(self, key: Any) -> str:
        """The Redis key of the entry of ``key`` (TypeError for a key type with no encoding)."""
        return self._entry_prefix + key_digest(key)

    def get(self, key: Hashable) -> Any:
        """The fresh value of ``key``, or None (a miss, or an entry past its TTL)."""
        try:
            value = self._local.get(key)
        except TypeError:  # unhashable: say which keys are allowed
            key_digest(key)
            raise
        if value is not None:
            if not self._stale_ms:
                return value
            if value.fresh_until > self._clock():
                return value.value
        known = self._known_miss.take()
        if known is not None and known[0] == key:
            return None  # the cold lead's script found no entry a moment ago
        return self.fetch(key)

    def lookup(self, key: Hashable) -> Entry | None:
        """The entry of ``key``, fresh or within its stale window, or None (``Entry``:
        ``fresh_for`` from Redis's ``PTTL``; one round trip unless the first level holds it
        fresh). Without a stale window: the fresh entry, its freshness not known
        (``fresh_for`` infinite: one plain GET, as ``get``)."""
        held = self.lookup_near(key)
        return held if held is not None else self.fetch_entry(key)

    def lookup_fields(self, key: Hashable) -> tuple[Any, float, float] | None:
        """:meth:`lookup`'s answer as a plain tuple, the fields of its Entry, as
        ``TTLCache.lookup_fields``: what ColdPath's warm read asks (a hit of the first level,
        most warm hits, makes no Entry)."""
        held = self._near_fields(key)
        return held if held is not None else self.fetch_entry(key)

    def lookup_near(self, key: Hashable) -> Entry | None:
        """:meth:`lookup` of the first level only (no round trip): what ColdPath asks when
        the flight reads Redis's entry itself (the cold lead: ``reachlimit.redis._lead``)."""
        held = self._near_fields(key)
        return None if held is None else Entry._make(held)

    def _near_fields(self, key: Hashable) -> tuple[Any, float, float] | None:
        """:meth:`lookup_near`'s answer as a plain tuple."""
        try:
            held = self._local.get(key)
        except TypeError:
            key_digest(key)
            raise
        if held is not None:
            if not self._stale_ms:
                return held, math.inf, 0.0
            left = held.fresh_until - self._clock()
            if left > 0:
                return held.value, left, held.build_time
        return None

    def lead_key(self, key: Hashable) -> tuple[str, float]:
        """For a script that reads the entry of ``key`` (the cold lead): its Redis key, and
        this cache's clock read now, before it is sent (:meth:`found` takes it). The first
        call of this object records its settings in Redis first, as :meth:`fetch` does."""
        if not self._started:
            self._start()
        return self.key_of(key), self._clock()

    def found(
        self, key: Hashable, entry: str, data: Any, pttl: int, sent: float
    ) -> Entry | None:
        """The entry of ``key`` that a script read (its Redis key ``entry``, ``data``, and
        Redis's ``pttl`` of it, read at ``sent`` on this cache's clock: :meth:`lead_key`), as
        :meth:`fetch_entry` answers it: a fresh one is copied into the first level; None for
        one that does not decode (logged once) or, without a stale window here, one past its
        freshness. Its freshness is known here: ``fresh_for`` from the PTTL (infinite
        without an expiry), with or without a stale window."""
        if self._stale_ms:
            return self._entry(key, entry, data, pttl, sent)
        value = self._from_redis(key, entry, data, pttl)
        if value is None:
            return None
        return Entry(value, math.inf if pttl == -1 else pttl / 1000, 0.0)

    def known_miss(self, key: Hashable) -> AbstractContextManager[None]:
        """For the length of a ``with`` block, the next :meth:`get` of ``key`` in this thread
        that its first level cannot answer is a miss without a GET: the cold lead has just
        looked (``reachlimit.redis._lead``)."""
        return self._known_miss.give((key,))

    def set(self, key: Hashable, value: Any) -> None:
        """Store ``value`` (None stores nothing: it means "no value"). TypeError for a key
        or a value this cache cannot store; nothing is stored then."""
        self.put(key, value, 0.0)

    def put(self, key: Hashable, value: Any, build_time: float) -> None:
        """:meth:`set`, with how long the value took to build (kept with the entry when
        there is a stale window: it scales the early-refresh chance)."""
        digest = key_digest(key)
        if value is None:
            return
        data = self._codec.encode(value)
        if not self._started:
            self._start()
        build_ms = max(0, round(build_time * 1000))
        sent = self._clock()  # before the script: its entry is fresh until after sent + ttl
        if self._spread:
            ttl_ms = self._set_spread(digest, data, build_ms)
        else:
            _, ttl_ms, _ = self._script(
                keys=[self._settings_key, self._index, self._entry_prefix + digest],
                args=["set", *self._own, digest, data, build_ms],
            )
        # Fresh for the cache's TTL, as Redis holds it (the first level bounds it anyway).
        self._hold(key, value, sent + int(ttl_ms) / 1000, build_time)

    def _set_spread(self, digest: str, data: bytes, build_ms: int) -> int:
        """A set on a Cluster (module design): the index script on the index's node, the
        entry's SET on its own with the settings the script answered, then the evicted
        entries deleted on theirs. Returns the cache's TTL (ms) as Redis holds it."""
        reply = self._script(
            keys=[self._settings_key, self._index], args=["index", *self._own, digest]
        )
        ttl_ms, stale_ms, evicted = int(reply[0]), int(reply[1]), reply[2:]
        if stale_ms > 0:
            data = _with_header(data, build_ms, stale_ms)
        self._client.set(self._entry_prefix + digest, data, px=ttl_ms + stale_ms)
        self._delete(evicted)
        return ttl_ms

    def _delete(self, digests: list[Any]) -> None:
        """Delete the entries of ``digests`` on a Cluster: one pipeline, which redis-py
        sends as one batch per node (1000 at a time)."""
        for start in range(0, len(digests), 1000):
            pipe = self._client.pipeline(transaction=False)
            for digest in digests[start:start + 1000]:
                text = digest.decode() if isinstance(digest, bytes) else str(digest)
                pipe.delete(self._entry_prefix + text)
            pipe.execute()

    def clear(self) -> None:
        """Empty the cache for every process: every entry in Redis (one script) and this
        process's first level at once; another process's first level keeps what it holds
        for at most ``local_ttl``."""
        self._local.clear()
        if self._spread:  # a Cluster: the index emptied in one script, the entries on theirs
            self._delete(self._script(keys=[self._settings_key, self._index], args=["drain"]))
        else:
            self._script(keys=[self._settings_key, self._index], args=["clear"])
        self._local.clear()  # a get that raced the script may have copied an entry back

    def forget(self, key: Hashable) -> bool:
        """Drop the entry of ``key`` for every process: in Redis (the entry and its place
        in the index, one round trip) and this process's first level at once; another
        process's first level keeps it for at most ``local_ttl``. True when it was there
        (in Redis, fresh or stale, or in the first level). TypeError for a key with no
        encoding (nothing is sent); redis-py's errors propagate. A set racing the forget
        (a build that ends meanwhile) stores its value, as a set just after it would."""
        digest = key_digest(key)
        held = self._local.forget(key)
        pipe = self._client.pipeline(transaction=not self._spread)
        pipe.delete(self._entry_prefix + digest)
        pipe.zrem(self._index, digest)
        deleted, _ = pipe.execute()
        # A get that raced the delete may have copied the entry back into the first level.
        held = self._local.forget(key) or held
        return held or bool(deleted)

    def settings(self) -> dict[str, int]:
        """This object's own settings, as it records them in Redis at its first call (the
        cache's are what the newest process to start recorded there)."""
        return {"ttl_ms": self._ttl_ms, "stale_ms": self._stale_ms, "size": self._size}

    def fetch(self, key: Hashable) -> Any:
        """The fresh value of ``key`` in Redis, skipping the first level: one GET (with a
        stale window, GET and PTTL in one round trip). A hit is copied into the first level.
        (ResilientCache probes a Redis that was down with it.) The first call of this object
        records its settings in Redis (its start: never an error for settings that differ
        from those recorded)."""
        if not self._stale_ms:
            if not self._started:
                self._start()
            entry = self._entry_prefix + key_digest(key)
            return self._from_redis(key, entry, self._client.get(entry))
        found = self.fetch_entry(key)
        return found.value if found is not None and found.fresh_for > 0 else None

    def fetch_entry(self, key: Hashable) -> Entry | None:
        """:meth:`lookup` skipping the first level: always one round trip (GET and PTTL, a
        pipeline; without a stale window :meth:`fetch`'s GET, ``fresh_for`` infinite). A
        fresh entry is copied into the first level. (ResilientCache probes with it.)"""
        if not self._stale_ms:
            value = self.fetch(key)
            return None if value is None else Entry(value, math.inf, 0.0)
        if not self._started:
            self._start()
        entry = self._entry_prefix + key_digest(key)
        pipe = self._client.pipeline(transaction=False)
        pipe.get(entry)
        pipe.pttl(entry)
        sent = self._clock()  # before the PTTL is read: fresh until at least sent + fresh_for
        data, pttl = pipe.execute()
        return self._entry(key, entry, data, pttl, sent)

    def _from_redis(self, key: Hashable, entry: str, data: Any, pttl: int | None = None) -> Any:
        """A value Redis sent (a plain GET: its PTTL not known, ``pttl`` None; or the cold
        lead's read, with it). Without a stale window it is copied into the first level;
        with one it is not: its freshness is not known, and the first level never holds what
        may be stale. Without a window of this process's own, an entry set with one (module
        design) is asked its PTTL (unless it came with it): past its freshness, a miss."""
        decoded = self._decode(entry, data)
        if decoded is None:
            return None
        value, _, window = decoded
        if not self._stale_ms:
            if window:
                left_ms = int(self._client.pttl(entry)) if pttl is None else pttl
                if left_ms != -1 and left_ms <= window:  # stale, or gone (-2) meanwhile
                    return None
            self._local.set(key, value)
        return value

    def _entry(
        self, key: Hashable, entry: str, data: Any, pttl: Any, sent: float
    ) -> Entry | None:
        """The ``Entry`` of what GET and PTTL answered (a stale window only)."""
        decoded = self._decode(entry, data)
        if decoded is None:
            return None
        value, build_time, window = decoded
        # PTTL -1 (no expiry: written by hand) counts as fresh for a whole TTL; -2: just gone.
        left_ms = self._ttl_ms + window if pttl == -1 else int(pttl)
        if left_ms < 0:
            return None
        fresh_for = (left_ms - window) / 1000  # the entry's own window (module design)
        if fresh_for > 0:
            self._hold(key, value, sent + fresh_for, build_time)
        return Entry(value, fresh_for, build_time)

    def _decode(self, entry: str, data: Any) -> tuple[Any, float, int] | None:
        """``(value, build time, stale window in ms)`` of stored bytes (an older version's
        header: this process's window), or None (none, or undecodable: logged)."""
        if data is None:
            return None
        build_time, window = 0.0, 0
        if isinstance(data, bytes):
            data, build_time, stale = _split_header(data)
            window = self._stale_ms if stale is None else stale
        try:
            value = self._codec.decode(data)
        except ValueError as exc:
            self._undecodable("value", entry, str(exc))
            return None
        return None if value is None else (value, build_time, window)

    def _hold(self, key: Hashable, value: Any, fresh_until: float, build_time: float) -> None:
        """Copy a fresh value into the first level (with a stale window: with its own
        ``fresh_until`` on ``clock``, so the first level never answers it once stale)."""
        if not self._stale_ms:
            self._local.set(key, value)
        else:
            self._local.set(key, _Held(value, fresh_until, build_time))

    def _start(self) -> None:
        """The first call of this object, its start on the cache: write its settings into
        the cache's settings hash, whatever was recorded (the newest start wins; one INFO
        line names a change). One round trip, once."""
        where = self._index.rsplit(":", 1)[0]
        record_settings(self._client, self._settings_key, self.settings(), f"cache {where}")
        self._started = True

    def __repr__(self) -> str:
        return (f"<RedisCache {self._index.rsplit(':', 1)[0]} ttl={self._ttl} size={self._size} "
                f"local_ttl={self._local.ttl} codec={self._codec.name}>")
