"""A warm cache and a singleflight shared by every process that uses the same Redis and name.

design:

    Caller's keys: a key is a ``str``, ``bytes``, ``int`` or a tuple of those (nested tuples
    too); anything else is a ``TypeError``. It is written in a canonical, type-tagged and
    length-prefixed encoding (``"1"`` and ``1`` and ``("1",)`` differ; a ``str`` is UTF-8 with
    lone surrogates passed through) and hashed with SHA-256: the 64 hex digits name it in
    Redis. So any key, of any length and with any characters (braces included), becomes a
    short key of a fixed shape that cannot reach into another key's hash tag.

    Values: JSON (codec ``"json"``), raw bytes (codec ``"bytes"``) or either (codec ``"auto"``:
    bytes stay bytes, anything else is JSON; the Flask extension's choice), never pickle. A stored
    value starts with one tag byte (``j`` or ``b``); a value Redis hands back that does not
    decode under this cache's codec (corrupt, hostile, or written by another codec) is a miss,
    logged once per object; decoding runs no code of any kind, and a JSON nested too deep or
    a number too long is a miss too. JSON turns tuples into lists, as JSON does.

    RedisCache keys (one hash tag for the cache, ``C = {<prefix>:<name>:cache}``, so the set
    script touches one Cluster slot):

      C:e:<digest>   STR   one entry: the encoded value, with a TTL (``PX``)
      C:index        ZSET  digest -> expiry (ms, Redis time) of every entry; scores strictly
                           increase (a set in the same millisecond as the last one adds
                           1/100 ms), so the index is in the order of the sets

    ``get``: the first level (an in-process ``TTLCache`` with ``local_ttl``) first; a hit
    there makes no Redis call. Otherwise one ``GET``; a hit is copied into the first level, a
    miss is not (so a value set by another process is seen at the next ``get``). Staleness:
    a value changed in another process may be served from here for at most ``local_ttl``.
    ``set``: one script (one round trip): drop the index entries that have expired, ``SET
    ... PX ttl`` the entry, index it, and while the index holds more than ``size`` entries
    delete the one that expires first. All entries of a name share one TTL (every process
    must use the same ``ttl`` and ``size`` for a name), so the first to expire is the oldest
    set: eviction drops the oldest entry, one at a time, never the whole cache. The index
    itself expires ``ttl`` after the last set.

    RedisSingleFlight keys (one hash tag per caller's key, ``F = {<prefix>:<name>:<digest>}``):

      F:n           STR   the flight counter of this key: flight numbers come from INCR
      F:lead        STR   the claim: "<flight>:<token>" with PX ``lease``, set by a script
                          only where there is none, renewed while the leader's ``fn`` runs;
                          a corrupt claim is dropped, as if it had ended
      F:out:<n>     STR   the outcome of flight n, PX ``outcome_ttl`` (a few seconds)
      F:w:<n>       STR   how many followers (one per process and key) wait on flight n
      F:bell:<n>    LIST  flight n's doorbell: the publish pushes one element per follower

    Scripts (each EVALSHA, one round trip):
      join      a claim exists -> follow its flight (its outcome already there -> take it;
                else count ourselves in ``w``); no claim -> INCR the counter, claim, lead
      check     run by a follower after its doorbell rang and every ``POLL_EVERY`` seconds:
                the outcome of our flight -> take it; another flight claimed -> follow that
                one (or take its outcome); no claim, the latest flight has an outcome (it
                superseded ours) -> take it; no claim and no outcome (the leader died: its
                lease ended) -> claim *the same flight number* and lead it
      publish   SET the outcome NX (the first outcome of a flight wins), drop the claim if it
                is still ours, and push the doorbell once per counted follower
      renew     push the claim's lease end if the claim is still ours

    Why a taken-over flight keeps its number: its followers read the outcome of the flight
    they joined, so a flight finished by a follower that took over is found by the others,
    never built again. A new flight number is only made when there is no claim at all.

    Who wakes whom: a follower blocks in ``BLPOP`` on its flight's doorbell, in slices of at
    most ``CANCEL_POLL_INTERVAL`` when it has a cancel token (so a client that leaves is let
    go within about 50 ms) and ``POLL_EVERY`` otherwise, and never longer than half the
    socket timeout; the leader's publish rings it. Between rings a follower runs ``check``
    every ``POLL_EVERY`` seconds, which is also how it notices a dead leader.

    In the process: the flight first goes through an in-process ``SingleFlight``, so a herd
    of threads of one process makes one Redis join and one Redis wait; its local leader
    shares the outcome with the others. A local leader whose own client leaves while it
    follows in Redis raises ``Cancelled``; the threads that followed it locally get ColdPath's
    leader-cancelled marker and go round. A daemon thread per object renews the claims held
    here every ``lease / 3`` seconds, in one pipelined round trip.

    Outcomes across processes: a value (the codec), ``NOT_FOUND``, ``None``, ``Busy`` (its
    reason and retry-after), ``Cancelled``, ColdPath's leader-cancelled marker (followers go
    round), or any other exception, which followers raise as ``LeaderFailed`` (type name and
    message). A value the codec cannot encode reaches remote followers as ``LeaderFailed``;
    the leader and its local followers still get the value itself.

    Failure cases: a leader's process dies -> its claim is not renewed, ends after ``lease``,
    and the next ``check`` of a follower takes the flight over (or a newcomer's ``join``
    starts the next flight, which the followers of the lost one then follow): the key is built
    once more, never twice more. A Redis restarted empty loses the counter: a follower's
    ``check`` starts again past the number it knew. A leader paused past its lease may publish late:
    the first outcome of a flight wins, a later one is dropped. A follower slower than
    ``outcome_ttl`` misses the outcome and leads a flight of its own (ColdPath's recheck then
    finds the cached value). Redis errors (``redis.exceptions.RedisError``) propagate from
    ``get``, ``set``, the join and the wait; a leader whose publish fails still returns its
    own outcome (logged), and its followers take over once the unrenewed claim ends.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from hashlib import sha256
from typing import Any

import redis

from ._cache import TTLCache
from ._cancel import POLL_INTERVAL, CancelToken
from ._errors import Busy, Cancelled, LeaderFailed
from ._flight import SingleFlight
from ._path import _LEADER_CANCELLED, NOT_FOUND

__all__ = ["RedisCache", "RedisSingleFlight"]

log = logging.getLogger("reachlimit")

#: The longest message of a leader's exception that followers get.
MESSAGE_LIMIT = 1000


# -- keys -------------------------------------------------------------------------------------


def _encode_key(key: Any, out: list[bytes]) -> None:
    """Append the canonical encoding of ``key`` to ``out``; TypeError for a key type that has
    none. Every item is a tag and its length, so no two different keys share an encoding."""
    if isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(data))
        out.append(data)
    elif isinstance(key, bytes):
        out.append(b"b%d:" % len(key))
        out.append(key)
    elif isinstance(key, int):  # bool included: True is the key 1, as in a dict
        # Two's complement bytes, not digits: no int is too long to encode.
        data = int(key).to_bytes(key.bit_length() // 8 + 1, "big", signed=True)
        out.append(b"i%d:" % len(data))
        out.append(data)
    elif isinstance(key, tuple):
        out.append(b"t%d:" % len(key))
        for item in key:
            _encode_key(item, out)
    else:
        raise TypeError(
            f"a shared key must be str, bytes, int or a tuple of those, not {type(key).__name__}"
        )


def key_digest(key: Any) -> str:
    """The SHA-256 (64 hex digits) of the canonical encoding of ``key``."""
    parts: list[bytes] = []
    _encode_key(key, parts)
    return sha256(b"".join(parts)).hexdigest()


def _check_names(name: str, prefix: str) -> None:
    for label, value in (("name", name), ("prefix", prefix)):
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            raise ValueError(f"{label} must be a non-empty string without braces")


def _check_client(client: Any) -> None:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if kwargs.get("decode_responses"):
        raise ValueError("the client must not decode responses (decode_responses=False)")


def _positive(label: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{label} > 0")
    return float(value)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _socket_timeout(client: Any) -> float | None:
    """The socket timeout the client's connections read with, if it can be found."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None


# -- values -----------------------------------------------------------------------------------


#: "json": JSON values; "bytes": bytes only; "auto": bytes as bytes, anything else as JSON
#: (what the Flask extension uses: one app may cache a rendered body, another a dict).
CODECS = ("json", "bytes", "auto")


class _Codec:
    """Encodes values to tagged bytes and back; never pickle."""

    def __init__(self, codec: str) -> None:
        if codec not in CODECS:
            raise ValueError('codec must be "json", "bytes" or "auto"')
        self.name = codec

    def encode(self, value: Any) -> bytes:
        """Tagged bytes; TypeError for a value this codec cannot store."""
        if self.name == "bytes" or (
            self.name == "auto" and isinstance(value, (bytes, bytearray, memoryview))
        ):
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f'codec "bytes" stores bytes, not {type(value).__name__}')
            return b"b" + bytes(value)
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            kind = type(value).__name__
            raise TypeError(f'codec "json" cannot store this {kind}: {exc}') from None
        return b"j" + text.encode("utf-8", "surrogatepass")

    def decode(self, data: Any) -> Any:
        """The value; ValueError for anything this codec did not write."""
        if not isinstance(data, bytes):
            raise ValueError(f"not bytes: {type(data).__name__}")
        if self.name == "bytes" or (self.name == "auto" and data[:1] == b"b"):
            if data[:1] != b"b":
                raise ValueError("no bytes tag")
            return data[1:]
        if data[:1] != b"j":
            raise ValueError("no JSON tag")
        try:
            return json.loads(data[1:].decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeError too
            raise ValueError(f"bad JSON: {type(exc).__name__}") from None


class _LogOnce:
    """Logs the first undecodable value of an object as a warning, the rest at debug level."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def __call__(self, what: str, where: str, reason: str) -> None:
        if self._done.is_set():
            log.debug("reachlimit: undecodable %s in %s (%s)", what, where, reason)
            return
        self._done.set()
        log.warning("reachlimit: undecodable %s in %s (%s): treated as a miss; further ones "
                    "are logged at debug level", what, where, reason)


# -- the cache --------------------------------------------------------------------------------

# KEYS[1] the index, KEYS[2] the entry; ARGV[1] the entry key prefix, ARGV[2] the digest,
# ARGV[3] the encoded value, ARGV[4] ttl (ms), ARGV[5] size.
_CACHE_SET = """
local index, entry = KEYS[1], KEYS[2]
local prefix, digest = ARGV[1], ARGV[2]
local ttl, size = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now)  -- their entries expired by themselves
redis.call('SET', entry, ARGV[3], 'PX', ttl)
-- Scores strictly increase, so that sets within one millisecond keep their order too.
local score = now + ttl
local newest = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
if #newest > 0 and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 0.01 end
redis.call('ZADD', index, score, digest)
local over = redis.call('ZCARD', index) - size
if over > 0 then
  local oldest = redis.call('ZRANGE', index, 0, over - 1)
  for _, old in ipairs(oldest) do
    redis.call('DEL', prefix .. old)
    redis.call('ZREM', index, old)
  end
end
redis.call('PEXPIRE', index, ttl)
return over > 0 and over or 0
"""


class RedisCache:
    """A warm cache shared by every process on the same Redis and ``name``, with a short
    in-process first level in front. See the module's design note.

    ``get(key)`` returns the value or ``None`` (a miss); ``set(key, value)`` stores it for
    ``ttl`` seconds. At most ``size`` entries are kept in Redis (the oldest goes first), at
    most ``local_size`` in the first level, each for at most ``local_ttl`` seconds. A value
    set here is seen by every other process at once, except one that holds an older value in
    its first level: that one sees the new value within ``local_ttl``.

    ``client`` is a ``redis.Redis`` that does not decode responses. Errors of Redis
    (``redis.exceptions.RedisError``) propagate from ``get`` and ``set``; a stored value that
    does not decode is a miss, never an exception. A value the codec cannot store makes
    ``set`` raise ``TypeError`` (under ColdPath: the build that made it fails).
    """

    def __init__(
        self,
        client: redis.Redis,
        name: str = "reachlimit",
        *,
        prefix: str = "reachlimit",
        ttl: float = 300.0,
        size: int = 256,
        local_ttl: float = 1.0,
        local_size: int = 256,
        codec: str = "json",
    ) -> None:
        _check_names(name, prefix)
        _check_client(client)
        for label, value in (("size", size), ("local_size", local_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} >= 1")
        self._ttl = _positive("ttl", ttl)
        local_ttl = _positive("local_ttl", local_ttl)
        self._codec = _Codec(codec)
        self._client = client
        self._name = name
        self._size = size
        tag = "{" + prefix + ":" + name + ":cache}"
        self._index = f"{tag}:index"
        self._entry_prefix = f"{tag}:e:"
        self._ttl_ms = _ms(self._ttl)
        self._local: TTLCache[Any] = TTLCache(local_size, local_ttl)
        self._set_script = client.register_script(_CACHE_SET)
        self._undecodable = _LogOnce()

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def size(self) -> int:
        return self._size

    @property
    def local(self) -> TTLCache[Any]:
        """The in-process first level."""
        return self._local

    def key_of(self, key: Any) -> str:
        """The Redis key of the entry of ``key`` (TypeError for a key type with no encoding)."""
        return self._entry_prefix + key_digest(key)

    def get(self, key: Hashable) -> Any:
        try:
            value = self._local.get(key)
        except TypeError:  # unhashable: say which keys are allowed
            key_digest(key)
            raise
        if value is not None:
            return value
        return self.fetch(key)

    def set(self, key: Hashable, value: Any) -> None:
        """Store ``value`` (None stores nothing: it means "no value"). TypeError for a key
        or a value this cache cannot store; nothing is stored then."""
        digest = key_digest(key)
        if value is None:
            return
        data = self._codec.encode(value)
        self._set_script(
            keys=[self._index, self._entry_prefix + digest],
            args=[self._entry_prefix, digest, data, self._ttl_ms, self._size],
        )
        self._local.set(key, value)

    def fetch(self, key: Hashable) -> Any:
        """The value of ``key`` in Redis, skipping the first level: always one GET. A hit is
        copied into the first level. (ResilientCache probes a Redis that was down with it.)"""
        entry = self._entry_prefix + key_digest(key)
        data = self._client.get(entry)
        if data is None:
            return None
        try:
            value = self._codec.decode(data)
        except ValueError as exc:
            self._undecodable("value", entry, str(exc))
            return None
        if value is not None:
            self._local.set(key, value)
        return value

    def __repr__(self) -> str:
        return (f"<RedisCache {self._index.rsplit(':', 1)[0]} ttl={self._ttl} size={self._size} "
                f"local_ttl={self._local.ttl} codec={self._codec.name}>")


# -- the flight -------------------------------------------------------------------------------

_LEAD, _FOLLOW, _DONE = 0, 1, 2  # replies of join and check: {status, flight[, outcome]}

# Common: KEYS[1] F:lead, KEYS[2] F:n; ARGV[1] the key base "F:", ARGV[2] our token,
# ARGV[3] lease (ms), ARGV[4] how long the counter outlives the last write (ms).
_FLIGHT_PRELUDE = """
local lead, counter = KEYS[1], KEYS[2]
local base, token = ARGV[1], ARGV[2]
local lease, keep = tonumber(ARGV[3]), tonumber(ARGV[4])

local function flight_of(claim)
  return tonumber(string.match(claim, '^(%d+):'))
end

-- The claim, or nil; a claim that is not ours to read (corrupt) is dropped, as if it ended.
local function read_claim()
  local claim = redis.call('GET', lead)
  if claim and not flight_of(claim) then
    redis.call('DEL', lead)
    return nil
  end
  return claim
end

local function outcome(n)
  return redis.call('GET', base .. 'out:' .. n)
end

local function follow(n)
  redis.call('INCR', base .. 'w:' .. n)
  redis.call('PEXPIRE', base .. 'w:' .. n, keep)
  return {1, n}
end

local function claim(n)
  redis.call('SET', lead, n .. ':' .. token, 'PX', lease)
  redis.call('PEXPIRE', counter, keep)
  return {0, n}
end
"""

_JOIN = _FLIGHT_PRELUDE + """
local current = read_claim()
if current then
  local n = flight_of(current)
  local out = outcome(n)
  if out then return {2, n, out} end
  return follow(n)
end
return claim(redis.call('INCR', counter))
"""

# ARGV[5] the flight we follow.
_CHECK = _FLIGHT_PRELUDE + """
local mine = tonumber(ARGV[5])
local out = outcome(mine)
if out then return {2, mine, out} end
local current = read_claim()
if current then
  local n = flight_of(current)
  if n == mine then return {1, mine} end
  out = outcome(n)
  if out then return {2, n, out} end
  return follow(n)
end
local latest = tonumber(redis.call('GET', counter))
if not latest then  -- Redis lost the counter (emptied): start over past our number
  redis.call('SET', counter, mine + 1)
  return claim(mine + 1)
end
if latest ~= mine then
  out = outcome(latest)
  if out then return {2, latest, out} end
end
return claim(latest)  -- its leader is gone: take the flight over, same number
"""

# ARGV[5] the flight, ARGV[6] the outcome, ARGV[7] outcome ttl (ms).
_PUBLISH = _FLIGHT_PRELUDE + """
local n = ARGV[5]
local first = redis.call('SET', base .. 'out:' .. n, ARGV[6], 'PX', tonumber(ARGV[7]), 'NX')
if redis.call('GET', lead) == n .. ':' .. token then redis.call('DEL', lead) end
redis.call('PEXPIRE', counter, keep)
if not first then return 0 end
local waiting = tonumber(redis.call('GET', base .. 'w:' .. n)) or 0
redis.call('DEL', base .. 'w:' .. n)
local bell = base .. 'bell:' .. n
for _ = 1, waiting do redis.call('RPUSH', bell, 1) end
if waiting > 0 then redis.call('PEXPIRE', bell, tonumber(ARGV[7])) end
return 1
"""

# ARGV[5] the flight. Replies 1 if the claim was still ours (and is renewed).
_RENEW = _FLIGHT_PRELUDE + """
if redis.call('GET', lead) == ARGV[5] .. ':' .. token then
  redis.call('PEXPIRE', lead, lease)
  redis.call('PEXPIRE', counter, keep)
  return 1
end
return 0
"""


class _Claim:
    """A flight this process leads: what the renewer needs to renew it."""

    __slots__ = ("keys", "base", "token", "flight", "lost")

    def __init__(self, keys: list[str], base: str, token: str, flight: int) -> None:
        self.keys = keys
        self.base = base
        self.token = token
        self.flight = flight
        self.lost = False  # set by the renewer when the claim was found gone


class _Outcome:
    """A decoded flight outcome that is not a plain value."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class RedisSingleFlight:
    """:class:`~reachlimit.SingleFlight`'s contract across every process on the same Redis
    and ``name``: one leader per key at a time in all of them, followers anywhere get its
    outcome. See the module's design note.

    ``do(key, fn, cancel)`` returns ``(value, shared)``. Keys as for :class:`RedisCache`.
    ``lease`` is how long a leader's claim outlives its process (renewed every ``lease / 3``
    seconds while ``fn`` runs); ``outcome_ttl`` how long a finished flight's outcome stays
    for slow followers. Every process must use the same values for a name.

    ``client`` is a ``redis.Redis`` that does not decode responses, with a socket timeout
    (a follower blocks for at most half of it at a time). Call :meth:`close` at the end to
    stop the renewer thread (a daemon thread either way).
    """

    #: How often a follower checks on its flight between doorbell rings (a dead leader is
    #: noticed at the first check after its lease ended).
    POLL_EVERY = 0.25
    #: The longest a follower blocks when a cancel token must be watched.
    CANCEL_POLL_INTERVAL = POLL_INTERVAL

    def __init__(
        self,
        client: redis.Redis,
        name: str = "reachlimit",
        *,
        prefix: str = "reachlimit",
        lease: float = 10.0,
        outcome_ttl: float = 5.0,
        codec: str = "json",
    ) -> None:
        _check_names(name, prefix)
        _check_client(client)
        self._lease = _positive("lease", lease)
        self._outcome_ttl = _positive("outcome_ttl", outcome_ttl)
        self._codec = _Codec(codec)
        self._client = client
        self._name = name
        self._prefix = prefix
        self._lease_ms = _ms(self._lease)
        self._outcome_ms = _ms(self._outcome_ttl)
        # The counter outlives every claim and outcome that carries its numbers.
        self._keep_ms = 2 * (self._lease_ms + self._outcome_ms)
        self._join_script = client.register_script(_JOIN)
        self._check_script = client.register_script(_CHECK)
        self._publish_script = client.register_script(_PUBLISH)
        self._renew_script = client.register_script(_RENEW)
        socket_timeout = _socket_timeout(client)
        self._block_cap = socket_timeout / 2 if socket_timeout else math.inf
        self._local: SingleFlight[tuple[Any, bool, bool]] = SingleFlight()
        self._undecodable = _LogOnce()
        self._lock = threading.Lock()
        self._renew_wake = threading.Condition(self._lock)
        self._held: dict[str, _Claim] = {}  # guarded by _lock: claims to renew, by token
        self._closed = False  # guarded by _lock
        self._renewer: threading.Thread | None = None  # guarded by _lock
        #: Test hook: while set, the renewer skips its renewals (as if the process were paused).
        self._renewal_paused = threading.Event()
        #: Called with the error when publishing an outcome or renewing claims fails (both
        #: are logged and otherwise swallowed): how ResilientFlight learns of Redis failing.
        self.on_redis_error: Callable[[BaseException], None] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def lease(self) -> float:
        return self._lease

    def base_of(self, key: Any) -> str:
        """The prefix of the Redis keys of ``key``'s flights (``...:lead``, ``...:n``, ...)."""
        return "{" + f"{self._prefix}:{self._name}:{key_digest(key)}" + "}:"

    def do(
        self, key: Hashable, fn: Callable[[], Any], cancel: CancelToken | None = None
    ) -> tuple[Any, bool]:
        """Run ``fn`` once for all concurrent callers of ``key`` in every process.

        Returns ``(value, shared)``: ``shared`` is False for the caller that ran ``fn``. A
        follower gets the leader's value, ``NOT_FOUND`` or ``None``; raises the leader's
        ``Busy`` (same reason and retry-after), ``Cancelled`` when its own ``cancel`` was set
        while it waited, or ``LeaderFailed`` when the leader raised anything else (in this
        process: the very exception). Errors of Redis propagate.
        """
        if self._closed:  # racy read: close() is meant for the end of the process
            raise RuntimeError("flight closed")
        key_digest(key)  # a key with no encoding fails here, before any flight
        (value, shared, gave_up), local_shared = self._local.do(
            key, lambda: self._shared_do(key, fn, cancel), cancel
        )
        if gave_up:
            if not local_shared:
                raise Cancelled()  # our own client left while we followed in Redis
            return _LEADER_CANCELLED, True  # our local leader's left: go round
        if isinstance(value, _Outcome):
            raise value.error
        return value, shared or local_shared

    def close(self, timeout: float = 5.0) -> None:
        """Stop the renewer thread, for good: claims still held are no longer renewed, and
        ``do`` raises ``RuntimeError`` from now on."""
        with self._lock:
            self._closed = True
            self._renew_wake.notify_all()
            renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout)

    def __repr__(self) -> str:
        return (f"<RedisSingleFlight {{{self._prefix}:{self._name}}} lease={self._lease} "
                f"outcome_ttl={self._outcome_ttl}>")

    # -- one process's part of a flight ---------------------------------------------------

    def _shared_do(
        self, key: Hashable, fn: Callable[[], Any], cancel: CancelToken | None
    ) -> tuple[Any, bool, bool]:
        """Run by the local leader: (value or _Outcome, shared, gave up waiting)."""
        base = self.base_of(key)
        keys = [base + "lead", base + "n"]
        token = secrets.token_hex(12)
        common: list[str | int] = [base, token, self._lease_ms, self._keep_ms]
        reply = self._join_script(keys=keys, args=common)
        while True:
            status, flight = int(reply[0]), int(reply[1])
            if status == _LEAD:
                return self._lead(_Claim(keys, base, token, flight), fn), False, False
            if status == _DONE:
                return self._decode_outcome(reply[2], base), True, False
            try:
                reply = self._follow(keys, common, flight, cancel)
            except Cancelled:
                return None, True, True

    def _follow(
        self, keys: list[str], common: list[str | int], flight: int, cancel: CancelToken | None
    ) -> Any:
        """Wait on ``flight`` until its outcome comes, another flight is to be followed, or we
        are to lead; return the check script's reply. Raises Cancelled."""
        bell = f"{common[0]}bell:{flight}"
        slice_cap = self.CANCEL_POLL_INTERVAL if cancel is not None else self.POLL_EVERY
        slice_cap = min(slice_cap, self._block_cap)
        next_check = time.monotonic() + self.POLL_EVERY
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            now = time.monotonic()
            block = max(0.001, min(slice_cap, next_check - now))
            rang = self._client.blpop([bell], timeout=block)
            if rang is None and time.monotonic() < next_check:
                continue
            reply = self._check_script(keys=keys, args=[*common, flight])
            if int(reply[0]) != _FOLLOW or int(reply[1]) != flight:
                return reply
            next_check = time.monotonic() + self.POLL_EVERY

    def _lead(self, claim: _Claim, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` under a renewed claim, publish its outcome, return it (or raise)."""
        self._hold(claim)
        try:
            value = fn()
        except BaseException as exc:
            self._release(claim)
            self._publish(claim, self._encode_error(exc))
            raise
        self._release(claim)
        self._publish(claim, self._encode_value(value))
        return value

    # -- outcomes ---------------------------------------------------------------------------

    def _encode_value(self, value: Any) -> bytes:
        if value is _LEADER_CANCELLED:
            return b"c"
        if value is NOT_FOUND:
            return b"n"
        if value is None:
            return b"0"
        try:
            return b"v" + self._codec.encode(value)
        except TypeError as exc:
            return self._encode_error(exc)

    @staticmethod
    def _encode_error(exc: BaseException) -> bytes:
        if isinstance(exc, Busy):
            return b"b" + json.dumps([str(exc.reason), int(exc.retry_after)]).encode()
        if isinstance(exc, Cancelled):
            return b"x"
        if isinstance(exc, LeaderFailed):  # passed on as it came
            type_name, message = exc.type_name, exc.message
        else:
            type_name = type(exc).__qualname__
            try:
                message = str(exc)
            except Exception:
                message = "(unprintable)"
        return b"e" + json.dumps([type_name, message[:MESSAGE_LIMIT]]).encode()

    def _decode_outcome(self, data: Any, base: str) -> Any:
        """A value, or an _Outcome holding the exception to raise."""
        try:
            kind, body = bytes(data[:1]), bytes(data[1:])
            if kind == b"v":
                return self._codec.decode(body)
            if kind in (b"n", b"0", b"c", b"x") and body:
                raise ValueError("unexpected body")
            if kind == b"n":
                return NOT_FOUND
            if kind == b"0":
                return None
            if kind == b"c":
                return _LEADER_CANCELLED
            if kind == b"x":
                return _Outcome(Cancelled())
            if kind in (b"b", b"e"):
                first, second = json.loads(body.decode("utf-8"))
                if kind == b"b":
                    if not isinstance(first, str) or type(second) is not int:
                        raise ValueError("bad refusal")
                    return _Outcome(Busy(first, second))
                if not isinstance(first, str) or not isinstance(second, str):
                    raise ValueError("bad error")
                return _Outcome(LeaderFailed(first[:MESSAGE_LIMIT], second[:MESSAGE_LIMIT]))
            raise ValueError("unknown kind")
        except (ValueError, TypeError, RecursionError) as exc:
            self._undecodable("flight outcome", base, f"{type(exc).__name__}: {exc}")
            return _Outcome(LeaderFailed("ValueError", "the leader's outcome did not decode"))

    def _publish(self, claim: _Claim, outcome: bytes) -> None:
        """Publish the outcome of our flight. A Redis error here is logged, not raised: the
        leader's own outcome stands, and its followers take over once the claim ends."""
        try:
            self._publish_script(
                keys=claim.keys,
                args=[claim.base, claim.token, self._lease_ms, self._keep_ms,
                      claim.flight, outcome, self._outcome_ms],
            )
        except redis.RedisError as exc:
            log.warning("reachlimit: could not publish a flight outcome: %s", exc)
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        report = self.on_redis_error
        if report is not None:
            report(exc)

    # -- claims and their leases ------------------------------------------------------------

    def _hold(self, claim: _Claim) -> None:
        with self._lock:
            if not self._held:
                self._renew_wake.notify()  # the renewer sleeps while nothing is held
            self._held[claim.token] = claim
            if not self._closed and (self._renewer is None or not self._renewer.is_alive()):
                # None yet, or the process forked since: threads do not survive a fork.
                self._renewer = threading.Thread(
                    target=self._renew_forever, name="reachlimit-flight-renewer", daemon=True
                )
                self._renewer.start()

    def _release(self, claim: _Claim) -> None:
        with self._lock:
            self._held.pop(claim.token, None)

    def _renew_forever(self) -> None:
        """The renewer thread: every ``lease / 3`` seconds, renew every claim held here in one
        pipelined round trip; a claim found gone is marked lost (and never revived)."""
        interval = self._lease / 3
        while True:
            with self._lock:
                while not self._closed and not self._held:
                    self._renew_wake.wait()
                if self._closed:
                    return
                self._renew_wake.wait(interval)
                if self._closed:
                    return
                claims = list(self._held.values())
            if not claims or self._renewal_paused.is_set():
                continue
            try:
                pipe = self._client.pipeline(transaction=False)
                for c in claims:
                    self._renew_script(
                        keys=c.keys,
                        args=[c.base, c.token, self._lease_ms, self._keep_ms, c.flight],
                        client=pipe,
                    )
                replies = pipe.execute()
            except redis.RedisError as exc:
                log.warning("reachlimit: could not renew %d flight claim(s): %s",
                            len(claims), exc)
                self._report(exc)
                continue
            for c, kept in zip(claims, replies, strict=True):
                if not int(kept):
                    c.lost = True
