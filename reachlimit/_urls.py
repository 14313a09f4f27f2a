"""Connection URLs made safe to show: the password is never printed.

design: :func:`mask_url` is the only way a Redis URL reaches a log line, a ``repr``, a health
answer or an exception message. It splits the URL with the standard library, replaces the
password of the user-info part (``redis://user:secret@host`` -> ``redis://user:***@host``) and
any ``password=`` query argument (redis-py accepts one) with ``***``, and keeps everything
else so that an operator can still tell which server is meant. Something that does not even
split as a URL is shown as a fixed placeholder rather than echoed back.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["mask_url", "MASK", "url_secrets", "scrub"]

#: What a password is replaced with.
MASK = "***"

_SECRET_QUERY_KEYS = frozenset({"password"})


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
