"""Connection URLs made safe to show: the password is never printed.

design: :func:`mask_url` is the only way a Redis URL reaches a log line, a ``repr``, a health
answer or an exception message. It splits the URL with the standard library, replaces the
password of the user-info part (``redis://user:secret@host`` -> ``redis://user:***@host``) and
any ``password=`` query argument (redis-py accepts one) with ``***``, and keeps everything
else so that an operator can still tell which server is meant. Something that does not even
split as a URL is shown as a fixed placeholder rather than echoed back.

:func:`redis_url_problem` is the one check of a Redis URL's shape that every taker of a URL
(the extension's ``REACHLIMIT_REDIS_URL``, ``reachlimit.redis.connect``) makes before using
it. redis-py reads the path of ``redis://host/<db>`` as the database number but silently
ignores one that is not a number (``redis://host/abc`` is database 0), so a typo would point
a service at another database's keys; here it is refused instead.

:func:`cluster_problem` checks a Cluster URL (``redis+cluster://[user:password@]host:port
[,host:port...]``, the same ``limits`` form without a service: the nodes first asked for the
cluster's map).

:func:`sentinel_parts` reads a Sentinel URL (``redis+sentinel://[user:password@]host:port
[,host:port...]/<service>[/<db>]``, the ``limits`` library's form): the standard library's
split alone takes ``a:1,b:2`` for one host with the port ``1,b:2``. The password may also
be the sentinels' own (``sentinel_password=``), and is masked like the others.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = [
    "mask_url", "MASK", "CLUSTER_PORT", "CLUSTER_SCHEME", "REDIS_SCHEMES", "SCHEMES_TEXT",
    "SENTINEL_SCHEME", "SentinelURL", "cluster_problem", "redis_url_problem",
    "sentinel_parts", "split_hosts", "url_secrets", "scrub",
]

#: What a password is replaced with.
MASK = "***"

#: Query arguments that hold a secret (``ssl_password``: the passphrase of ``ssl_keyfile``).
_SECRET_QUERY_KEYS = frozenset({"password", "sentinel_password", "ssl_password"})

#: A Redis's primary as the sentinels name it.
SENTINEL_SCHEME = "redis+sentinel://"
#: The port of a sentinel written without one.
SENTINEL_PORT = 26379

#: A Redis Cluster, reached through any of the nodes named.
CLUSTER_SCHEME = "redis+cluster://"
#: The port of a cluster node written without one.
CLUSTER_PORT = 6379

#: The URL schemes of a Redis: plain TCP, TLS, a Unix socket, a Sentinel's primary, a
#: Cluster.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME, CLUSTER_SCHEME)
#: The schemes as a sentence takes them.
SCHEMES_TEXT = (
    "redis://, rediss:// or unix:// (one server), redis+sentinel:// (Sentinel), "
    "redis+cluster:// (Cluster)"
)


def _raw_password(url: str) -> tuple[int, int] | None:
    """Where the user-info's password stands in ``url`` (start, end), read from the raw
    text rather than from ``urlsplit``: a password written with an unencoded ``/``, ``?`` or
    ``#`` (base64 passwords have ``/``) ends the netloc early for ``urlsplit``, which would
    then show the rest of the password as the path. Everything from the first ``:`` after
    ``scheme://`` to the last ``@`` counts: too much may be masked, never too little."""
    start = url.find("://")
    if start < 0:
        return None
    start += 3
    # An '@' before start would be in the scheme: the colon search below, from start to
    # it, then finds nothing, so the '@' is searched for from 0. find and rfind answer -1
    # or an index: "== -1" says just that (a "< 0" would read the same as "<= 0", "< 1").
    at = url.rfind("@")
    if at == -1:
        return None
    colon = url.find(":", start, at)
    return None if colon == -1 else (colon + 1, at)


def mask_url(url: object) -> str:
    """``url`` with its password (user-info or ``password=`` query argument) replaced by
    ``***``. Never raises; a value that is not a string URL becomes ``<unparseable url>``."""
    if not isinstance(url, str):
        return "<unparseable url>"
    where = _raw_password(url)
    if where is not None:
        url = url[: where[0]] + MASK + url[where[1]:]
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() in _SECRET_QUERY_KEYS for key, _ in pairs):
            query = urlencode(
                [(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs],
                # keeps MASK as written; letters are never quoted anyway
                safe="*",  # pragma: no mutate (safe="XX*XX" is the same: see above)
            )
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The secrets :func:`mask_url` hides in ``url`` (raw and as written), so that text
    which might quote them (an exception message from a client library) can be scrubbed."""
    found: list[str] = []
    where = _raw_password(url)
    if where is not None:
        found.append(url[where[0]:where[1]])
        url = url[: where[0]] + MASK + url[where[1]:]
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    # Blank values are left out (no secret; the loop below would drop them anyway).
    for key, value in parse_qsl(parts.query):
        if key.lower() in _SECRET_QUERY_KEYS:
            found.append(value)
    out: list[str] = []
    for secret in found:
        if secret:
            out.append(secret)
            plain = unquote(secret)
            if plain != secret:
                out.append(plain)
    return out


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def redis_url_problem(url: str) -> str | None:
    """What is wrong with Redis URL ``url``, as the end of a sentence, or None when it is a
    ``redis://``, ``rediss://`` or ``unix://`` URL whose database is a whole number: the path
    of a TCP URL (``redis://host``, ``redis://host/``, ``redis://host/0``) and a ``db=``
    query argument of any; or a ``redis+sentinel://`` URL :func:`sentinel_parts` reads; or
    a ``redis+cluster://`` one :func:`cluster_problem` passes. The text never quotes the
    URL: callers show :func:`mask_url`."""
    if not url.startswith(REDIS_SCHEMES):
        return f"it must start with {SCHEMES_TEXT}"
    if url.startswith(CLUSTER_SCHEME):
        return cluster_problem(url)
    if url.startswith(SENTINEL_SCHEME):
        try:
            sentinel_parts(url)
        except ValueError as exc:
            return str(exc)
        return _db_query_problem(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it checks it (ValueError: not a number, out of range)
    except ValueError:
        return "its port must be a whole number from 0 to 65535"
    if parts.scheme != "unix":  # a Unix socket's path is the socket, not a database
        database = unquote(parts.path)[1:]
        if database and not _whole(database):
            return (
                "the database (the path after the host) must be a whole number, "
                f"got {database!r}"
            )
    return _db_query_problem(url)


def _db_query_problem(url: str) -> str | None:
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key == "db" and not _whole(value):
            return f"the database (db=) must be a whole number, got {value!r}"
    return None


def cluster_problem(url: str) -> str | None:
    """What is wrong with ``redis+cluster://[user:password@]host[:port][,host[:port]...]
    [/0]`` (a node's port defaults to 6379), or None: a cluster has one database, so no
    path but ``/0`` and no ``db=`` but 0."""
    try:  # only its errors count here (the default port is never read)
        split_hosts(
            urlsplit(url).netloc.rpartition("@")[2],
            CLUSTER_PORT,  # pragma: no mutate (never read here: None is the same)
            "node",
        )
    except ValueError as exc:
        return str(exc)
    if unquote(urlsplit(url).path) not in ("", "/", "/0"):
        return "a cluster has one database: no path but /0"
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key == "db" and value != "0":
            return f"a cluster has one database: db= must be 0, got {value!r}"
    return None


def split_hosts(netloc: str, default_port: int, what: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` pairs of ``host[:port][,host[:port]...]`` (the part of a URL
    after its user-info: a Sentinel's sentinels, a Cluster's nodes), ``default_port`` where
    none is written, IPv6 hosts in brackets. ValueError naming ``what`` (``"sentinel"``,
    ``"node"``), as the end of a sentence, for an empty host or a port that is not one."""
    hosts: list[tuple[str, int]] = []
    for place in netloc.split(","):
        try:
            host = urlsplit(f"//{place}")
            port = host.port
        except ValueError:
            raise ValueError(
                f"each {what}'s port must be a whole number from 0 to 65535"
            ) from None
        if not host.hostname:
            raise ValueError(f"it must name at least one {what}, host:port[,host:port...]")
        hosts.append((host.hostname, default_port if port is None else port))
    return hosts


class SentinelURL(NamedTuple):
    """What a ``redis+sentinel://`` URL names (see :func:`sentinel_parts`)."""

    #: The sentinels' addresses, in the URL's order.
    hosts: list[tuple[str, int]]
    #: The name the sentinels monitor the primary under (``sentinel monitor <service>``).
    service: str
    #: The database of the path (``/<service>/<db>``), None without one.
    db: int | None
    #: The user-info's user and password, None where absent (percent-decoded).
    username: str | None
    password: str | None
    #: The query string, as written.
    query: str


def sentinel_parts(url: str) -> SentinelURL:
    """The sentinels, service, database and credentials of ``redis+sentinel://[user:password
    @]host[:port][,host[:port]...]/<service>[/<db>]`` (a sentinel's port defaults to 26379;
    IPv6 hosts in brackets). ValueError, as the end of a sentence that never quotes the URL,
    for anything else."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ValueError(f"a Sentinel URL starts with {SENTINEL_SCHEME}")
    parts = urlsplit(url)
    userinfo, at, netloc = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    hosts = split_hosts(netloc, SENTINEL_PORT, "sentinel")
    path = unquote(parts.path)[1:].split("/")
    service = path[0]
    if not service:
        raise ValueError(
            "it must name the service the sentinels monitor: redis+sentinel://host:port/<service>"
        )
    database = path[1] if len(path) > 1 else ""
    if len(path) > 2 or (database and not _whole(database)):
        raise ValueError(
            "the database (after the service) must be a whole number, "
            f"got {'/'.join(path[1:])!r}"
        )
    return SentinelURL(
        hosts, service, int(database) if database else None, username, password, parts.query
    )


def _whole(text: str) -> bool:
    """``text`` is a whole number in ASCII digits (``str.isdigit`` takes "²" too)."""
    return text.isascii() and text.isdigit()
