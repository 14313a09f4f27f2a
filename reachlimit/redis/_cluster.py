"""Redis Cluster: the client ``connect`` makes for a ``redis+cluster://`` URL.

design:

    URL: ``redis+cluster://[user:password@]host:port[,host:port...][/0][?option=value...]``
    (the ``limits`` library's form): the nodes the client first asks for the cluster's map
    (any of them will do; redis-py then knows every node), the one user and password of every
    node, and redis-py's own connection options in the query, read as ``redis.Redis.from_url``
    reads them. A cluster has one database: a path or ``db=`` other than 0 is refused.

    The client (:class:`ClusterClient`) makes a ``redis.cluster.RedisCluster`` with the
    bounds of every client of this package: connect and read timeouts of ``timeout`` seconds
    and no retry (``Retry(NoBackoff(), 0)``, and on redis-py 5 ``cluster_error_retry_attempts``
    0: redis-py's cluster client would otherwise retry a failed command on a fresh map of the
    cluster, three times by default). Redirects are
    not retries: a ``MOVED`` (a slot now served elsewhere) or ``ASK`` (a slot migrating) is
    followed by redis-py at once, at most 16 times per command, and a ``TRYAGAIN`` (a
    multi-key command while a slot's keys are split between two nodes) is sent again after a
    50 ms pause from the ninth attempt on. A call that fails on a node (refused, timed out)
    is not retried, but redis-py first reads the cluster's map again from the other nodes
    (so that it finds a replica promoted meanwhile): with every node hung rather than down,
    such a call can last one timeout per node before it fails.

    Two differences from redis-py's own cluster client, each for a promise of this package:

      lazy       no connection is opened until the first command (redis-py's reads the map
                 at construction), so an app starts while its cluster is down, and a
                 preloading master forks no cluster connection; a first command that finds
                 no node raises redis-py's error (``RedisClusterException``), and the next
                 one tries again. So the client holds the ``RedisCluster`` it makes then,
                 through redis-py's public constructor, and calls its methods on it (a
                 method looked up earlier makes it when called); what a script needs
                 before (the text's encoding) and the nodes' options are its own.
      scripts    a script Redis does not know (a node restarted, or new since a migration)
                 is sent once with ``EVAL``, to the node of its keys, which also caches it
                 there (redis-py's ``Script`` would ``SCRIPT LOAD`` it on every primary, so
                 one dead primary would stop scripts on the others).

    What the objects of this package do differently on a cluster (any ``RedisCluster``,
    this one or a caller's):

      limiter    every key a script touches carries the limiter's tag (the doorbells and a
                 client's queue are built inside the scripts from it): one slot, whose node
                 redis-py sends each EVALSHA to (its first key decides); a node that does
                 not know the script gets one ``EVAL`` of it; the waker nudges that node
                 with an ``EXISTS`` of a key of the tag (a ``PING`` would go to any node)
      cold lead  its keys span three tags (limiter, flight, cache): not used;
                 ``RedisSingleFlight.use_cold_lead`` does nothing and
                 ``RedisColdLimiter.lead`` refuses, so a cold request's steps go one by
                 one: its cache miss, the flight's join, the recheck, the acquire (four
                 round trips before its build instead of one; a refusal is also
                 published to the flight: five)
      cache      entries spread over slots (``_cache``'s design note): a set is up to
                 three round trips, ``clear`` drains the index and deletes per node
      flight     each key's keys share a tag of their own; claims are renewed one script
                 each (a cluster pipeline takes no scripts)
      the rest   the settings record, the counters' hash and the budgets' registry are
                 one key each (one slot): unchanged

    ``RedisHealth`` and the fallback take ``RedisClusterException`` (which redis-py does not
    derive from ``RedisError``) for an outage like any Redis error (``_common.REDIS_ERRORS``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.cluster
import redis.connection
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.connection import ConnectionPool
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .._urls import CLUSTER_PORT, CLUSTER_SCHEME, cluster_problem, split_hosts

# redis-py leaves these untyped.
_parse_url: Callable[[str], dict[str, Any]] = redis.connection.parse_url
_node: Callable[[str, int], Any] = redis.cluster.ClusterNode

__all__ = ["CLUSTER_SCHEME", "ClusterClient", "cluster_client", "cluster_nodes"]

#: What else turns the cluster client's retries off: redis-py 5's retries a failed command
#: ``cluster_error_retry_attempts`` times (3 by default) whatever its ``retry``; 6 and newer
#: retry as ``retry`` says (and warn that the older setting is deprecated).
NO_CLUSTER_RETRY: dict[str, int] = (
    {"cluster_error_retry_attempts": 0} if redis.VERSION < (6,) else {}
)


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The startup nodes of a ``redis+cluster://`` URL and the connection options its
    user-info and query give (as redis-py reads them). ``ValueError``, as the end of a
    sentence that never quotes the URL, for anything else (``reachlimit._urls``' check)."""
    if not url.startswith(CLUSTER_SCHEME):
        raise ValueError(f"a Redis Cluster URL starts with {CLUSTER_SCHEME}")
    problem = cluster_problem(url)
    if problem is not None:
        raise ValueError(problem)
    parts = urlsplit(url)
    userinfo, at, netloc = parts.netloc.rpartition("@")
    nodes = split_hosts(netloc, CLUSTER_PORT, "node")
    # The user-info and the query, as redis-py reads them for one node.
    single = f"redis://{userinfo}{at}{netloc.split(',')[0]}"
    options = _parse_url(single + (f"?{parts.query}" if parts.query else ""))
    for key in ("host", "port", "db"):
        options.pop(key, None)
    return nodes, options


def cluster_client(url: str, *, timeout: float, health_check_interval: int) -> ClusterClient:
    """The :class:`ClusterClient` of ``url`` with ``timeout`` for connecting and reading
    (``ValueError`` for a URL :func:`cluster_nodes` refuses). No connection is opened here.
    ``health_check_interval`` is kept for the day redis-py passes it to a cluster's nodes
    (it does not today: a node's idle connection is not PINGed before use)."""
    nodes, options = cluster_nodes(url)
    # A timeout written in the URL's query wins, as redis-py's from_url lets it for one
    # server (given twice, the constructor would raise a TypeError at start-up).
    settings: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),
        **NO_CLUSTER_RETRY,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "health_check_interval": health_check_interval,
        **options,
    }
    return ClusterClient(startup_nodes=[_node(host, port) for host, port in nodes], **settings)


class _ClusterScript(Script):
    """A script sent with ``EVALSHA``, and once with ``EVAL`` (to the node of its keys)
    where that node does not know it."""

    def __call__(
        self,
        keys: Sequence[Any] | None = None,
        args: Iterable[Any] | None = None,
        client: Any = None,
    ) -> Any:
        sent = (*(keys or ()), *(args or ()))
        count = len(keys or ())
        client = self.registered_client if client is None else client
        try:
            return client.evalsha(self.sha, count, *sent)
        except NoScriptError:
            return client.eval(self.script, count, *sent)


class ClusterClient:
    """A ``redis.cluster.RedisCluster`` made at its first command, not here (module design).
    Takes ``RedisCluster``'s arguments; every public method of ``RedisCluster`` is called on
    the one :meth:`cluster` makes, and its constants are read from the class
    (``client.PRIMARIES``)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._cluster: RedisCluster | None = None
        self._lock = threading.Lock()  # one map read at a time: another thread waits for it
        # What a script needs before the first command: its text encoded as the cluster's
        # connections encode (redis-py's pool reads the same three options).
        self._encoder = ConnectionPool(
            encoding=options.get("encoding", "utf-8"),
            encoding_errors=options.get("encoding_errors", "strict"),
            decode_responses=options.get("decode_responses", False),
        ).get_encoder()

    def cluster(self) -> RedisCluster:
        """The ``RedisCluster``, made (the cluster's map read) at the first call; raises
        redis-py's errors when no node answers, and the next call tries again. Another
        thread's first call waits for this one's."""
        made = self._cluster
        if made is None:
            with self._lock:
                made = self._cluster
                if made is None:
                    made = self._cluster = RedisCluster(**self._options)
        return made

    def __getattr__(self, name: str) -> Any:
        # Only what this class does not define: RedisCluster's public names. A method looked
        # up before the first command (an object made at start-up keeps ``execute_command``,
        # say) makes the RedisCluster when it is called, not when it is looked up.
        if name.startswith("_"):
            raise AttributeError(name)
        found = getattr(RedisCluster, name)  # AttributeError for a name it does not have
        if self._cluster is not None or isinstance(found, property):
            return getattr(self.cluster(), name)
        if not callable(found):
            return found  # a constant of the class

        def call(*args: Any, **kwargs: Any) -> Any:
            return getattr(self.cluster(), name)(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    @property
    def started(self) -> bool:
        """Whether the cluster's map was read (a first command was sent)."""
        return self._cluster is not None

    def get_encoder(self) -> Any:
        """The encoder of the cluster's connections (known before the first command too)."""
        return self._encoder

    def get_connection_kwargs(self) -> dict[str, Any]:
        """The nodes' connection options (known before the first command too)."""
        if self._cluster is None:
            return dict(self._options)
        kwargs: dict[str, Any] = cast(Any, self._cluster).get_connection_kwargs()
        return kwargs

    def register_script(self, script: Any) -> Script:
        # (redis-py types a script's client as its own classes; a Script reads only the
        # encoder of this one before the first command.)
        return _ClusterScript(cast(Any, self), script)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    def __repr__(self) -> str:
        nodes = ",".join(f"{n.host}:{n.port}" for n in self._options.get("startup_nodes", ()))
        return f"<ClusterClient {nodes} {'started' if self.started else 'not started'}>"
