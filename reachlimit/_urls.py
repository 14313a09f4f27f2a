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
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["mask_url", "MASK", "REDIS_SCHEMES", "redis_url_problem", "url_secrets", "scrub"]

#: What a password is replaced with.
MASK = "***"

_SECRET_QUERY_KEYS = frozenset({"password"})

#: The URL schemes of a Redis: plain TCP, TLS, a Unix socket.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def mask_url(url: object) -> str:
    """``url`` with its password (user-info or ``password=`` query argument) replaced by
    ``***``. Never raises; a value that is not a string URL becomes ``<unparseable url>``."""
    if not isinstance(url, str):
        return "<unparseable url>"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{user}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() in _SECRET_QUERY_KEYS for key, _ in pairs):
            query = urlencode(
                [(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs],
                safe="*",
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The secrets :func:`mask_url` hides in ``url`` (raw and as written), so that text
    which might quote them (an exception message from a client library) can be scrubbed."""
    found: list[str] = []
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
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
    query argument of any. The text never quotes the URL: callers show :func:`mask_url`."""
    if not url.startswith(REDIS_SCHEMES):
        return "it must start with redis://, rediss:// or unix://"
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
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "db" and not _whole(value):
            return f"the database (db=) must be a whole number, got {value!r}"
    return None


def _whole(text: str) -> bool:
    """``text`` is a whole number in ASCII digits (``str.isdigit`` takes "²" too)."""
    return text.isascii() and text.isdigit()
