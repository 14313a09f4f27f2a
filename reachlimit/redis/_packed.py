"""One script's calls, their constant part encoded once: sent pre-packed on a connection of
the client's own pool (a plain ``redis.Redis``), else through ``execute_command``.

design:

    Why: the limiter's hot operations are single round trips that compete with the cheapest
    redis-py calls (an acquire refused for a full queue against a ``PING``, an acquire and
    its release against a ``redis.lock.Lock`` pair), and redis-py's ``execute_command``
    costs most of such a call in Python: its retry wrapper, its packing of every argument
    (about 0.35 us each; most of what a limiter call sends is the same on every call: the
    SHA, the key count and key, the operation, the common argument), its response callbacks
    and its metrics. Here the constant part (``head``) is packed into the wire's form once, a
    call adds its own few arguments, and the command goes out with the connection's own
    ``send_packed_command`` and ``read_response``: ``RedisColdLimiter._run`` has the
    figures.

    What stays redis-py's, so that every promise of the client holds: its pool
    (``get_connection``, ``release``: the fork check that gives a forked child connections
    of its own, Sentinel's pool and its lookup of the primary, the check that a pooled
    connection is open and holds no stray reply), its connection (TCP, TLS or a Unix socket;
    connect; the ``health_check_interval`` PING before a send when due; and on a timeout or
    any other error while sending or reading, a disconnect, so that no half-read reply is
    left on a pooled connection), and its retry: the connection's ``Retry``, with
    redis-py's own rule for which errors it retries (on redis-py 5 only those named in
    ``retry_on_error``; from 6 on every error the ``Retry`` supports), the connection
    disconnected after each failure. A reply that is an error (``NOSCRIPT``, a script's
    error) is read whole, so its connection goes back to the pool as it is. What is not
    redis-py's here: these calls are not in the per-command metrics and debug log that
    recent redis-py releases record in ``execute_command`` (its pool's are, as before).

    Which clients: a plain ``redis.Redis`` (or the one ``connect`` makes for a Sentinel URL,
    which only adds to ``close``) without a single connection of its own
    (``single_connection_client``) or a client-side cache, whose pool is a redis-py
    ``ConnectionPool`` (or a subclass: blocking, Sentinel's). Any other client - a Redis
    Cluster (whose ``execute_command`` routes the call to the node of its keys), a subclass
    of the caller's, which may change how commands are sent - gets the same calls through its
    ``execute_command``.

    A script Redis does not know (restarted, flushed): loaded and the call sent again, once,
    as redis-py's ``Script`` does; on a Cluster one ``EVAL`` of its text instead, which also
    caches it on the node of its keys (``_cluster``'s design note).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from redis.connection import ConnectionPool
from redis.exceptions import NoScriptError

from ._common import Client, is_cluster

__all__ = ["Head", "PackedScript", "head"]

#: redis-py 5 retries a failed call only for the errors named in ``retry_on_error`` (its
#: ``_disconnect_raise``); 6 and newer for every error the connection's ``Retry`` supports.
_RETRIES_NAMED_ONLY = redis.VERSION[0] < 6 if isinstance(redis.VERSION[0], int) else False


class Head(NamedTuple):
    """What a call sends after the script's SHA and before its own arguments, as bytes
    (``items``: for ``execute_command``) and packed as the wire has them (``wire``)."""

    items: tuple[bytes, ...]
    wire: bytes


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(data), data)


def head(*items: bytes) -> Head:
    """The constant part of a script's calls, packed once."""
    return Head(items, b"".join(_bulk(item) for item in items))


def direct_pool(client: Any) -> ConnectionPool | None:
    """The pool of ``client`` if its calls can be sent pre-packed (module design: which
    clients), else None."""
    cls = type(client)
    if cls is not redis.Redis and not (
        issubclass(cls, redis.Redis) and cls.__module__.startswith("reachlimit.")
    ):
        return None
    pool = getattr(client, "connection_pool", None)
    if getattr(client, "connection", None) is not None or not isinstance(pool, ConnectionPool):
        return None
    if getattr(pool, "cache", None) is not None:
        return None
    return pool


def _checkout_arguments(pool: ConnectionPool) -> tuple[str, ...]:
    """What ``pool.get_connection`` is given: a command name where it needs one (redis-py
    before 5.3), nothing where it is optional (newer ones warn that it is deprecated)."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return ("EVALSHA",)
    return ()


class PackedScript:
    """``text``, one Lua script, called on ``client``: ``script(head, *args)`` is one
    ``EVALSHA`` of it with ``head`` (:func:`head`) then ``args`` (``str``, ``bytes`` or
    ``int``), answering the script's reply (module design). ``sha`` and ``script`` are
    those of redis-py's ``Script``."""

    def __init__(self, client: Client, text: str) -> None:
        registered = client.register_script(text)
        self.script: str = text
        self.sha: str = registered.sha
        self._client = client
        self._cluster = is_cluster(client)
        self._execute: Callable[..., Any] = client.execute_command
        sha = self.sha.encode()
        self._sha = sha
        self._pool = direct_pool(client)
        if self._pool is not None:
            kwargs = self._pool.connection_kwargs
            self._encoding = kwargs.get("encoding", "utf-8")
            self._errors = kwargs.get("encoding_errors", "strict")
            self._checkout = _checkout_arguments(self._pool)
            self._evalsha = _bulk(b"EVALSHA") + _bulk(sha)

    @property
    def direct(self) -> bool:
        """Whether calls are sent pre-packed on the pool's connections."""
        return self._pool is not None

    def __call__(self, head: Head, *args: str | bytes | int) -> Any:
        pool = self._pool
        if pool is None:
            return self._general(head, args)
        parts = [b"*%d\r\n" % (2 + len(head.items) + len(args)), self._evalsha, head.wire]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode(self._encoding, self._errors)
            parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
        packed = [b"".join(parts)]
        try:
            return self._send(pool, packed)
        except NoScriptError:
            self._client.script_load(self.script)
            return self._send(pool, packed)

    def _general(self, head: Head, args: tuple[str | bytes | int, ...]) -> Any:
        try:
            return self._execute("EVALSHA", self._sha, *head.items, *args)
        except NoScriptError:
            if self._cluster:  # SCRIPT LOAD would go to every primary, not to this one
                return self._execute("EVAL", self.script, *head.items, *args)
            self._client.script_load(self.script)
            return self._execute("EVALSHA", self._sha, *head.items, *args)

    def _send(self, pool: ConnectionPool, packed: list[bytes]) -> Any:
        """One round trip of ``packed`` on a connection of ``pool``, with the connection's
        retry (module design). The first try is made here; one that fails is handed to the
        connection's ``Retry`` as the failure of its own first try, so that it retries (or
        not), counts and backs off exactly as it does for ``execute_command``, and a call
        that succeeds at once pays nothing for it."""
        conn: Any = pool.get_connection(*self._checkout)
        try:
            try:
                conn.send_packed_command(packed)
                return conn.read_response()
            except Exception as error:
                return _retried(conn, packed, error)
        finally:
            pool.release(conn)


def _retried(conn: Any, packed: list[bytes], error: Exception) -> Any:
    """``conn.retry`` run over ``packed`` as if its first try had just raised ``error``."""
    first: list[Exception] = [error]

    def attempt() -> Any:
        if first:
            raise first.pop()
        conn.send_packed_command(packed)
        return conn.read_response()

    return conn.retry.call_with_retry(attempt, lambda failure: _failed(conn, failure))


def _failed(conn: Any, error: Exception) -> None:
    """A failed try (one the ``Retry`` may retry): disconnected, as redis-py does; raised
    at once where redis-py would not retry it."""
    conn.disconnect()
    if _RETRIES_NAMED_ONLY and not isinstance(error, tuple(conn.retry_on_error or ())):
        raise error
