"""What every object of ``reachlimit.redis`` shares: names and their checks, the encoding of a
caller's key, a socket's timeout, a warning logged once.

design:

    Caller's keys: a key is a ``str``, ``bytes``, ``int`` or a tuple of those (nested tuples
    too); anything else is a ``TypeError``. It is written in a canonical, type-tagged and
    length-prefixed encoding (``"1"`` and ``1`` and ``("1",)`` differ; a ``str`` is UTF-8 with
    lone surrogates passed through) and hashed with SHA-256: the 64 hex digits name it in
    Redis. So any key, of any length and with any characters (braces included), becomes a
    short key of a fixed shape that cannot reach into another key's hash tag.

    A client's name (fair admission, ``client_id``) is encoded the same way and hashed to 16
    hex digits: the limiter's per-client keys stay short whatever the name.

    Settings are data: a shared object's settings live in a hash of its own in Redis, which
    every process writes when it starts using the object (its first call), the newest start
    winning (``record_settings``; the limiter's own script does the same and fills its
    queue); a change is one INFO line naming each setting (old -> new), who changed it and
    who had set it before (``settings_changed``). Never an error: the scripts read the
    settings from Redis.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import secrets
import socket
import threading
from collections.abc import Hashable, Iterator
from hashlib import sha256
from typing import Any, TypeAlias

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from . import lua
from ._cluster import ClusterClient

__all__ = [
    "Named",
    "BOOT_ID", "BOOT_ID_VARIABLE", "Client", "LogOnce", "REDIS_ERRORS", "check_client",
    "LIMITER_KEY_SUFFIXES", "check_names", "client_id", "is_cluster", "key_digest", "limiter_keys",
    "members_key", "ms", "new_token", "owner_id", "owner_prefix",
    "positive", "record_settings", "settings_changed", "socket_timeout", "warn_eviction",
]

log = logging.getLogger("reachlimit")

#: What a call to Redis raises when Redis fails: redis-py's errors, and its cluster client's
#: own (``RedisClusterException``: no node of the cluster reachable, slots not covered),
#: which it does not derive from ``RedisError``.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)

#: What every object of this package takes: one Redis, or a Redis Cluster (redis-py's client,
#: or the one ``connect`` makes for a ``redis+cluster://`` URL).
Client: TypeAlias = "Redis | RedisCluster | ClusterClient"

_HOSTNAME = socket.gethostname()

#: The environment variable a process manager sets to one random value for all the processes
#: it starts (``webapp/gunicorn.conf.py`` does, in the gunicorn master): their boot id.
BOOT_ID_VARIABLE = "REACHLIMIT_BOOT_ID"

#: This process's boot id: its manager's (inherited), or a random one of its own. Read once,
#: at import: a gunicorn master sets the variable when it loads its config, before it imports
#: the app or forks a worker.
BOOT_ID = os.environ.get(BOOT_ID_VARIABLE, "").strip() or secrets.token_hex(4)


def owner_prefix(pid: int | None = None) -> str:
    """The prefix of every token made by process ``pid`` (this one when None) of this boot:
    ``"<hostname>:<boot id>:<pid>:"``, so that the parent of a process that died can free its
    places (``release_owner``), and two hosts that share a hostname (containers given the same
    ``hostname:``) never free each other's: their boot ids differ."""
    return f"{_HOSTNAME}:{BOOT_ID}:{os.getpid() if pid is None else pid}:"


#: ``new_token``'s state: the pid it was drawn in, the owner prefix and a random part, and a
#: counter. Replaced whole (never changed in place), so a thread reads one consistent state.
_tokens: tuple[int, str, Iterator[int]] = (0, "", itertools.count())


def new_token() -> str:
    """A token no other attempt ever had: this process's owner prefix, 12 hex digits drawn at
    random once per process, then a counter (12 hex digits: every token of a process has one
    length). Drawn again in a process that is new (a forked child, its pid another), so a
    process given a dead one's pid never repeats its tokens. Thread-safe: two threads that
    draw at once each use their own draw. A quarter of the cost of 12 random bytes a token,
    on every acquire."""
    global _tokens
    pid = os.getpid()
    state = _tokens
    if state[0] != pid:
        state = _tokens = (pid, owner_prefix(pid) + secrets.token_hex(6), itertools.count())
    return state[1] + format(next(state[2]), "012x")


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


def client_id(client: Hashable) -> str:
    """The id under which Redis knows ``client`` (str, bytes, int or a tuple of those): the
    same in every process and on every host, short and of bounded size whatever the name
    (16 hex digits of a BLAKE2b hash of the key encoding above). ``TypeError`` otherwise."""
    parts: list[bytes] = []
    try:
        _encode_key(client, parts)
    except TypeError:
        raise TypeError(
            f"client must be str, bytes, int or a tuple of those, got {type(client).__name__}"
        ) from None
    return hashlib.blake2b(b"".join(parts), digest_size=8).hexdigest()


def registry_key(prefix: str) -> str:
    """The set of the names of every limiter that ever ran under ``prefix`` (one key, its
    own slot): what frees a dead process's places in every budget reads."""
    return f"{prefix}:budgets"


#: The fixed keys of a limiter, after its hash tag (``lua/limiter.lua`` is given the first and
#: builds the others from the tag; the ninth is the budget's settings hash).
LIMITER_KEY_SUFFIXES = (
    "holders", "queue", "alive", "deadline", "stats", "seq", "clientof", "clients", "settings",
    "gone", "since", "took",
)


def limiter_keys(prefix: str, name: str) -> list[str]:
    """The fixed keys of the limiter ``name`` under ``prefix`` (``LIMITER_KEY_SUFFIXES``): one
    hash tag, ``{<prefix>:<name>}``, so every script touches one Cluster slot."""
    tag = "{" + prefix + ":" + name + "}"
    return [f"{tag}:{suffix}" for suffix in LIMITER_KEY_SUFFIXES]


def members_key(prefix: str, name: str) -> str:
    """The live processes of the budget ``name`` under ``prefix`` (``_members``): a key of
    the limiter's hash tag, so it lives in the limiter's Cluster slot."""
    return "{" + prefix + ":" + name + "}:members"


def check_names(name: str, prefix: str) -> None:
    """``name`` and ``prefix`` of an object's keys: non-empty, without braces (a brace would
    change the hash tag)."""
    for label, value in (("name", name), ("prefix", prefix)):
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            raise ValueError(f"{label} must be a non-empty string without braces")


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (a ``redis.cluster.RedisCluster``, or the
    :class:`~reachlimit.redis._cluster.ClusterClient` that makes one at its first command):
    its keys then live on the nodes of their slots, and a script may touch one slot only."""
    return isinstance(client, (RedisCluster, ClusterClient))


def _connection_kwargs(client: Any) -> dict[str, Any]:
    """The options ``client`` opens its connections with (a cluster's: its nodes')."""
    if is_cluster(client):  # no connection pool of its own: one per node
        return dict(client.get_connection_kwargs() or {})
    pool = getattr(client, "connection_pool", None)
    return dict(getattr(pool, "connection_kwargs", None) or {})


def check_client(client: Any) -> None:
    """A client that decodes responses would hand the codecs ``str`` for bytes."""
    if _connection_kwargs(client).get("decode_responses"):
        raise ValueError("the client must not decode responses (decode_responses=False)")


def positive(label: str, value: Any) -> float:
    """A finite number of seconds > 0 (``ValueError("<label> > 0")`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{label} > 0")
    return float(value)


def ms(seconds: float) -> int:
    """Whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))


def socket_timeout(client: Any) -> float | None:
    """The socket timeout the client's connections read with, if it can be found."""
    value = _connection_kwargs(client).get("socket_timeout")
    return float(value) if value else None


class LogOnce:
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


def record_settings(client: Any, key: str, mine: dict[str, int], what: str) -> None:
    """Record ``mine`` as this process's settings of the shared object whose settings hash is
    ``key`` (``what`` names it in the log): every field is written, whatever was recorded,
    so the newest process to start wins (``lua.SETTINGS``, one round trip), and a change is
    logged (:func:`settings_changed`). A difference is never an error: processes configured
    differently all keep working, under the settings recorded last."""
    reply = client.register_script(lua.SETTINGS)(
        keys=[key], args=[owner_id(), *(item for pair in mine.items() for item in pair)]
    )
    settings_changed(what, mine, reply)


def owner_id() -> str:
    """Who this process is, in a settings hash (its ``by`` field) and in the log: its
    owner prefix without the last colon (``"<hostname>:<boot id>:<pid>"``)."""
    return owner_prefix()[:-1]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def settings_changed(what: str, mine: dict[str, int], before: list[Any]) -> None:
    """Log one INFO line when this process's settings ``mine`` replaced others: each
    setting that changed (old -> new), who changed them (this process: its owner id and
    hostname) and who had recorded the old ones. ``before`` is what a settings script
    replied: who wrote them, then each value of ``mine``'s names in order (None where none
    was recorded). Nothing is logged for settings recorded the first time or unchanged."""
    by, *values = before
    changes = [
        f"{name} {_text(old)} -> {new}"
        for (name, new), old in zip(mine.items(), values, strict=True)
        if old is not None and _text(old) != str(new)
    ]
    if changes:
        log.info(
            "reachlimit: settings of %s changed by %s (host %s): %s (recorded before by %s)",
            what, owner_id(), _HOSTNAME, ", ".join(changes),
            "an unknown process" if by is None else _text(by),
        )


_eviction_checked = threading.Event()  # one look (and at most one warning) per process


def warn_eviction(client: Any) -> None:
    """Once per process: warn if Redis may evict any key (``maxmemory-policy allkeys-*``),
    which can drop a limiter's state (its scripts survive it: a missing key is never an
    error, but a grant or a place may be lost with it). A Redis that does not allow CONFIG
    (many managed ones) is not asked again. On a Cluster, one node is asked (redis-py's
    default node): the nodes of one cluster are configured alike."""
    if _eviction_checked.is_set():
        return
    _eviction_checked.set()
    try:
        reply = client.config_get("maxmemory-policy")
    except Exception as exc:  # not allowed here, or Redis failing: nothing to say
        log.debug("reachlimit: could not read maxmemory-policy: %s", exc)
        return
    policy = reply.get("maxmemory-policy") or reply.get(b"maxmemory-policy") or b""
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    if policy.startswith("allkeys-"):
        log.warning(
            "reachlimit: Redis evicts any key (maxmemory-policy %s): a limiter's slots and "
            "queue places can be lost with its keys; use noeviction or a volatile-* policy "
            "for the Redis that holds the budgets", policy,
        )


class Named:
    """The ``name`` every shared object of this package is made with (its Redis keys' name),
    and its client: kept by :meth:`_bind`."""

    _name: str
    _client: Any  # a Client; Any, as redis-py's own command methods are untyped

    @property
    def name(self) -> str:
        """The name of this object's keys in Redis."""
        return self._name

    def _bind(self, client: Any, name: str, prefix: str, *, stores_bytes: bool = True) -> None:
        """Check ``name`` and ``prefix`` (and, for an object that stores encoded values, that
        ``client`` hands back bytes), then keep ``client`` and ``name``."""
        check_names(name, prefix)
        if stores_bytes:
            check_client(client)
        self._client = client
        self._name = name

