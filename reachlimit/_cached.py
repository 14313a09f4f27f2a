"""``@rl.cached`` / ``@rl.cached(key=..., mimetype=...)`` and the same on a budget: a view
whose whole answer is the cold build, replayed from the cache with ``Cache-Status``.

design:

    wrapper(**view_args)                       (the request's handler thread)
      key   = (endpoint, key(**view_args))     key given: str, bytes, int or a tuple of those
            | (endpoint, request.path, the query's raw name=value pairs, sorted by name)
              (the endpoint: unique in the app, where two views of one factory share a
              qualified name; the view's name where a request has none)
                                               so ?a=1&b=2 and ?b=2&a=1 are one key
      build = the view called with view_args (in the request; on a refresher thread in a
              test_request_context of the same path and query, REACHLIMIT_STALE > 0), its
              return value made a response by Flask's rules:
                a bare body     str -> text/plain (or mimetype=), bytes -> octets (or
                                mimetype=), NOT_FOUND -> 404, a Response as it is, anything
                                else JSON through the value rule (TypeError naming the view)
                a tuple         (body, status), (body, headers), (body, status, headers):
                                the body as above, then app.make_response
                a streamed one  a generator or iterator body, Response(stream), send_file:
                                TypeError naming the view (inside the build: nothing cached)
              status 200 and no Set-Cookie -> its replay (below): cached, shared
              anything else                -> None: never cached, never shared
              built in the request, the response is also left in the request's box, and
              that request answers it exactly as the view made it
      value = the budget's cold(key, build)    refusals (429/503), clients gone (499) and
                                               the view's own errors exactly as with cold()
      answer: the box when this request built; else the replay decoded; else go round

    replay = b"RLR\\x01" + len(head) (4 bytes, big-endian) + head + body
      head = ASCII JSON [status, [[name, value], ...]]: the status line and every header the
             response has but hop-by-hop ones (RFC 9110 7.6.1: Connection, the names it
             lists, Keep-Alive, Proxy-*, TE, Trailer(s), Transfer-Encoding, Upgrade),
             Content-Length (the response measures its body again) and Set-Cookie; of a
             Cache-Status only the members another cache wrote (ours is added per answer)
      One bytes value: the value rule holds it, the "auto" codec and the shared flight's
      outcome carry it across Redis unchanged. A hit decodes it; the head repeats from hit
      to hit, so its parse is kept (``_HEADS``, bounded) and a warm hit is the cache's bytes,
      two slices and one Response. A value that is not a replay exactly as written here (an
      older version's, another writer's, a hostile one) decodes to nothing: the key is
      forgotten and the request goes round, so it is rebuilt cleanly; json.loads is the
      only parser, and every name, value and the status are checked before they are used.

    Going round: a follower handed None (its leader's answer was not cacheable) or a value it
    cannot replay calls cold() again, and so follows the next build or leads it. That is at
    most ``SHARED_ROUNDS`` more calls; a request still without an answer then builds its own
    under a key no other request has (through the limiter, never cached). So a request makes
    at most SHARED_ROUNDS + 2 cold() calls, each ending when one build ends: it cannot go
    round forever behind a stream of uncacheable answers or of values it cannot read.

A warm hit never runs the build, so the request makes it and nothing more: one list (the box)
and one ``functools.partial`` of ``_run_view`` (no closure cells); cold() is told the build
applies the value rule itself and adds no wrapper of its own. The request's path, query
string and root URL are read only when a refresh runs it (werkzeug works the root URL out
afresh for each request). The partial holds the request object for that: a refresh runs soon
after the request that handed it out, and the request's environ is not changed after it
ends. A refresh never writes the box: only the request's own build (``in_request()``) does.

``view.forget(query=None, /, **view_args)`` drops the entries a request with those view
arguments (and that query, for a default key) would use, under every endpoint the view is
registered at (Flask-Caching's ``delete_memoized``). Standard library only: the Flask layer
(``reachlimit.flask``) hands in its app, request and response objects as ``Any``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping
from functools import partial
from typing import Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from ._keys import checked_key
from ._path import NOT_FOUND
from ._values import normalised

__all__ = ["cached_view", "view_name", "bare_or_called", "CachedView", "FlaskFace", "MAGIC"]

log = logging.getLogger("reachlimit")

#: The mimetype of a str answer without ``mimetype=`` (the response class adds the charset).
TEXT = "text/plain"
#: The mimetype of a bytes answer without ``mimetype=``.
OCTETS = "application/octet-stream"

#: What every replay starts with: "RLR" and the format's version (1).
MAGIC = b"RLR\x01"
_START = len(MAGIC) + 4  # the magic, then the head's length in 4 bytes
#: The longest head a replay holds (the status line and headers as JSON): a response with
#: more headers than that is answered and not cached (servers refuse far less, ~8-64 KiB).
MAX_HEAD = 65536
#: Heads kept parsed (``_HEADS``): a few per view; past this many the memo starts afresh.
HEADS_KEPT = 512

#: Hop-by-hop headers (RFC 9110 7.6.1; "trailers" is the name RFC 2616 13.5.1 used).
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
#: Never in a replay: hop-by-hop headers, the length (measured again), cookies.
NOT_REPLAYED = HOP_BY_HOP | {"content-length", "set-cookie"}
#: Cache-Status members of this library are named so (RFC 9211).
OURS = "reachlimit"

#: How many more times a request calls cold() for the shared key after an answer it cannot
#: use (None, or a value it cannot replay) before it builds under a key of its own. Each
#: shared round makes a herd on an uncacheable answer wait one more build (its followers
#: follow one leader at a time); one is enough to rebuild a value that does not decode.
SHARED_ROUNDS = 1

# Names whose spelling is no behaviour (so not mutated): header names are found in any case,
# codec names are read in any case, the own key is unique by its uuid, and a URL built for a
# path is bound to some host only because werkzeug's adapter needs one (its path is read).
_CONNECTION = "Connection"  # pragma: no mutate (getlist finds the name in any case)
_SET_COOKIE = "Set-Cookie"  # pragma: no mutate (headers are found by name in any case)
_LATIN_1 = "latin-1"  # pragma: no mutate (a codec's name: any case)
_UTF_8 = "utf-8"  # pragma: no mutate (a codec's name: any case)
_OWN = "reachlimit:own"  # pragma: no mutate (the own key is unique by its uuid, whatever the words)
_HOST = "localhost"  # pragma: no mutate (only the path of what the adapter builds is read)

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 5.6.2)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # never in a header value or status
_STATUS_200 = re.compile(r"200(?: [^\x00-\x1f\x7f]*)?")

#: The head of a replay -> (the status for the response class, the headers), parsed once.
#: No lock, on purpose: two threads may parse one head at once, and either copy is right;
#: a clear racing a store loses one parse.
_HEADS: dict[bytes, tuple[Any, tuple[tuple[str, str], ...]]] = {}

#: The value found in the cache was not a replay: said once per process, then at DEBUG.
_told = False


class FlaskFace(NamedTuple):
    """What the Flask layer hands the decorator: the budget's ``cold(key, build)`` (for a
    build that applies the value rule itself) and ``forget(key) -> bool``; ``current()`` the
    current app and request, ``current_app()`` the app alone; ``in_request()`` whether a
    request is active."""

    cold: Callable[[Hashable, Callable[[], Any]], Any]
    forget: Callable[[Hashable], bool]
    current: Callable[[], tuple[Any, Any]]
    current_app: Callable[[], Any]
    in_request: Callable[[], bool]


class CachedView(Protocol):
    """A view wrapped by ``@rl.cached``: called by Flask with its view arguments; its
    ``forget`` drops the entries of one set of view arguments (see :func:`cached_view`)."""

    __name__: str

    def __call__(self, **view_args: Any) -> Any: ...

    def forget(
        self, query: str | bytes | Mapping[str, Any] | None = None, /, **view_args: Any
    ) -> bool: ...


class _Spec(NamedTuple):
    """One decorated view, made once at decoration."""

    view: Callable[..., Any]
    where: str  # "view <module>.<qualname>", for messages
    mimetype: str | None
    in_request: Callable[[], bool]


def view_name(view: Callable[..., Any]) -> str:
    # Every object has a __module__ (its class's, at least): the '?' is never read.
    module = getattr(view, "__module__", "?")  # pragma: no mutate (the '?' is never read)
    return f"{module}.{getattr(view, '__qualname__', repr(view))}"


def bare_or_called(
    decorate: Callable[[Callable[..., Any]], CachedView], view: Any
) -> Any:
    """``decorate`` (``@rl.cached(...)``), or ``view`` decorated (the bare ``@rl.cached``):
    the only positional argument is the view; the key is always given by keyword."""
    if view is None:
        return decorate
    if not callable(view):
        # pragma: no mutate start (a message's words)
        raise TypeError(
            "cached() takes the view as its only positional argument (the bare @rl.cached) "
            f"and the key by keyword, @rl.cached(key=lambda item: item); got {view!r}"
        )
        # pragma: no mutate end
    return decorate(view)


def _name_of(pair: str) -> str:
    """The name of a query's ``name=value`` pair, as sent."""
    return pair.partition("=")[0]


def _pairs(query: str) -> tuple[str, ...]:
    """The query's ``name=value`` pairs as sent, sorted by name only (stable: pairs of one
    name keep their order, which request.args.getlist answers), empty ones left out. No
    parse of request.args, which costs more than the rest of a refusal's key. Two spellings
    of one value (%20 and +) are two entries: a build, never a wrong answer."""
    if not query:
        return ()
    return tuple(sorted((p for p in query.split("&") if p), key=_name_of))


# -- the build: the view's return value, made a response by Flask's rules ------------------


def _streamed(where: str) -> TypeError:
    # pragma: no mutate start (a message's words)
    return TypeError(
        f"{where} returned a streamed response (a generator or iterator body, a "
        "Response(stream) or send_file): @cached keeps whole answers only; stream from a "
        "view of its own, or cache the parts with rl.cold()"
    )
    # pragma: no mutate end


def _body_response(app: Any, body: Any, spec: _Spec, key: Hashable) -> Any:
    """A body (a view's bare return value, or the first item of its tuple) as a response,
    the way this decorator always made one."""
    if isinstance(body, str):
        return app.response_class(body, mimetype=spec.mimetype or TEXT)
    if isinstance(body, (bytes, bytearray, memoryview)):
        return app.response_class(bytes(body), mimetype=spec.mimetype or OCTETS)
    if body is None or body is NOT_FOUND:
        raise TypeError(
            f"{spec.where} returned {body!r} as a body: a view returns a response, a value, "
            "or a tuple of those (and NOT_FOUND alone, for a 404)"  # pragma: no mutate (words)
        )
    if isinstance(body, Iterator):
        raise _streamed(spec.where)
    if callable(body):  # a Response (of any class) or a WSGI app: Flask's own rules
        return app.make_response(body)
    return app.json.response(normalised(body, key, spec.where))


def _response_of(app: Any, value: Any, spec: _Spec, key: Hashable) -> Any:
    """The view's return value as a finished, whole response (or NOT_FOUND, returned alone)."""
    if value is NOT_FOUND:
        return NOT_FOUND
    if isinstance(value, tuple):
        if len(value) not in (2, 3):
            raise TypeError(
                f"{spec.where} returned a tuple of {len(value)} items: Flask takes (body, "
                "status), (body, headers) or (body, status, headers)"  # pragma: no mutate (words)
            )
        response = app.make_response((_body_response(app, value[0], spec, key), *value[1:]))
    else:
        response = _body_response(app, value, spec, key)
    if response.is_streamed:
        raise _streamed(spec.where)
    return response


def _without_ours(value: str) -> str:
    """A Cache-Status value without this library's members (RFC 9211: a list)."""
    kept = [
        member.strip() for member in value.split(",")
        if member.strip() and member.strip().partition(";")[0].strip() != OURS
    ]
    return ", ".join(kept)


def _replay_of(response: Any) -> bytes | None:
    """``response`` (status 200, no cookie) as one bytes value (the module's design note),
    or None when its head is longer than MAX_HEAD."""
    headers = response.headers
    # The names a Connection header lists are hop-by-hop too (RFC 9110 7.6.1).
    listed = {
        # getlist finds the name in any case.
        token.strip().lower() for value in headers.getlist(_CONNECTION)
        for token in value.split(",")
    }
    kept: list[list[str]] = []
    for name, value in headers.items():
        lowered = name.lower()
        if lowered in NOT_REPLAYED or lowered in listed:
            continue
        if lowered == "cache-status":
            value = _without_ours(value)
            if not value:
                continue
        kept.append([name, value])
    # A head with spaces reads back the same, but MAX_HEAD measures this compact one (the
    # key separator is never written: the head has lists only, no ":").
    text = json.dumps([response.status, kept], separators=(",", ":"))
    head = text.encode("ascii")  # pragma: no mutate (a codec's name: any case)
    if len(head) > MAX_HEAD:
        return None
    # "big" is also what to_bytes and from_bytes take when given no byte order.
    return b"".join((MAGIC, len(head).to_bytes(4, "big"), head, response.get_data()))


def _run_view(
    spec: _Spec, app: Any, args: dict[str, Any], asking: Any, key: Hashable,
    box: list[Any], share: bool,
) -> Any:
    """The view as a build: in the request, or in a request context of the same path and
    query string when run outside any request (a refresh). Nothing is read of the request
    until then (see the module's design note). Answers the replay of a response that may be
    cached and shared (``share``: False for a request's own key), None for one that may not,
    NOT_FOUND as it is."""
    if spec.in_request():
        response = _response_of(app, spec.view(**args), spec, key)
        if response is NOT_FOUND:
            return NOT_FOUND
        box.append(response)  # this request answers what its own view made, as it is
    else:
        # The query string exactly as the server gave it (WSGI's latin-1 text, put back into
        # the environ as it was: passed as query_string= werkzeug would encode it again, and
        # raw UTF-8 bytes in it would reach the view as mojibake).
        with app.test_request_context(
            asking.path, base_url=asking.root_url,
            environ_overrides={"QUERY_STRING": asking.environ.get("QUERY_STRING", "")},
        ):
            # The key is only named in a TypeError's message, which a refresh only logs.
            response = _response_of(app, spec.view(**args), spec, key)
        if response is NOT_FOUND:
            return NOT_FOUND
    # Headers are found by name in any case.
    if not share or response.status_code != 200 or _SET_COOKIE in response.headers:
        return None  # never cached (the path caches no None) and never shared
    return _replay_of(response)


# -- a hit: the replay decoded -------------------------------------------------------------


def _parse_head(head: bytes) -> tuple[Any, tuple[tuple[str, str], ...]] | None:
    """A replay's head checked and parsed, or None when it is not one this module wrote."""
    try:
        status, pairs = json.loads(head)
    except (ValueError, TypeError, RecursionError):  # not JSON, or not two items
        return None
    if type(status) is not str or not _STATUS_200.fullmatch(status) or type(pairs) is not list:
        return None
    headers: list[tuple[str, str]] = []
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            return None
        name, value = pair
        if type(name) is not str or type(value) is not str or not _TOKEN.fullmatch(name):
            return None
        lowered = name.lower()
        if lowered in NOT_REPLAYED or _CONTROL.search(value) or (
            lowered == "cache-status" and _without_ours(value) != value
        ):
            return None
        headers.append((name, value))
    # 200 and "200 OK" make the same status line: the int only spares the response a parse.
    if status == "200 OK":  # pragma: no mutate (either makes the same status line)
        status = 200
    return status, tuple(headers)


def _replayed(app: Any, data: bytes) -> Any:
    """The response a replay holds, or None when ``data`` is not a replay."""
    if not data.startswith(MAGIC):
        return None
    length = int.from_bytes(data[len(MAGIC):_START], "big")  # see _replay_of: "big"
    end = _START + length
    if length > MAX_HEAD or end > len(data):
        return None
    head = data[_START:end]
    # The memo only saves a parse: a mutant of it parses again and answers the same.
    parsed = _HEADS.get(head)  # pragma: no mutate (the memo)
    if parsed is None:
        parsed = _parse_head(head)
        if parsed is None:
            return None
        if len(_HEADS) >= HEADS_KEPT:  # pragma: no mutate (the memo)
            _HEADS.clear()  # pragma: no mutate (the memo)
        _HEADS[head] = parsed  # pragma: no mutate (the memo)
    status, headers = parsed
    return app.response_class(data[end:], status, headers)


def _unreadable(forget: Callable[[Hashable], bool], key: Hashable, value: Any) -> None:
    """A value under ``key`` that is not a replay: forget it, so that the next round
    rebuilds it (a failure to forget is logged; the round after builds under a key of its
    own)."""
    global _told
    level = logging.DEBUG if _told else logging.WARNING
    _told = True
    # pragma: no mutate start (a log's words)
    log.log(level, "reachlimit: the cached answer of %r is not a replay this version wrote "
            "(a %s); rebuilding it", key, type(value).__name__)
    # pragma: no mutate end
    try:
        forget(key)
    except Exception as exc:
        # pragma: no mutate start (a log's words)
        log.debug("reachlimit: %r could not be forgotten (%s: %s)", key, type(exc).__name__, exc)
        # pragma: no mutate end


# -- the decorator ---------------------------------------------------------------------------


def cached_view(
    face: FlaskFace,
    view: Callable[..., Any],
    key: Callable[..., Hashable] | None,
    mimetype: str | None,
) -> CachedView:
    """``view`` wrapped (``functools.wraps``) as the module's design note says, with its
    ``forget``."""
    if key is not None and not callable(key):
        raise TypeError(f"cached(key=...) must be a callable taking the view's arguments, "
                        f"got {key!r}")
    name = view_name(view)
    where = f"view {name}"
    key_where = f"the key of {where}"
    spec = _Spec(view, where, mimetype, face.in_request)
    cold = face.cold

    def attempt(
        app: Any, asking: Any, args: dict[str, Any], cache_key: Hashable
    ) -> tuple[Any, Any]:
        """One cold() call for the shared key: (the response to answer, or None; the value).
        The response is this request's own build's, or the replay of the value."""
        box: list[Any] = []
        value = cold(cache_key, partial(_run_view, spec, app, args, asking, cache_key, box,
                                        True))
        if box:
            return box[0], value
        if type(value) is bytes:
            return _replayed(app, value), value
        return None, value

    def go_round(
        app: Any, asking: Any, args: dict[str, Any], cache_key: Hashable, value: Any
    ) -> Any:
        """An answer this request cannot use (see the module's design note): at most
        SHARED_ROUNDS more calls of cold() for the key, then a build of the request's own."""
        for _ in range(SHARED_ROUNDS):
            if value is NOT_FOUND:
                app.aborter(404)
            if value is not None:
                _unreadable(face.forget, cache_key, value)  # the value: only its type, logged
            # asking is only read by a refresh, which a key just forgotten never hands out.
            response, value = attempt(app, asking, args, cache_key)
            if response is not None:
                return response
        if value is NOT_FOUND:
            app.aborter(404)
        # A key no other request has: this request leads, through the limiter; its build
        # answers None, so nothing is stored under it.
        own = (_OWN, uuid.uuid4().hex)  # unique by its uuid, whatever the words
        box: list[Any] = []
        # Built in this request, never refreshed: asking and the key (only named in messages)
        # go unread, and share is tested for truth.
        cold(own, partial(_run_view, spec, app, args, asking, own, box, False))
        # pragma: no mutate start (never reached: the message's words)
        if not box:
            raise RuntimeError(f"{where}: its own build answered nothing")  # pragma: no cover
        # pragma: no mutate end
        return box[0]

    @functools.wraps(view)
    def wrapper(**args: Any) -> Any:
        app, asking = face.current()
        if key is None:
            pairs = _pairs(asking.environ.get("QUERY_STRING", ""))
            cache_key: Hashable = (asking.endpoint or name, asking.path, pairs)
        else:
            # The endpoint, unique in the app, before the view's name: views made by one
            # factory (or MethodView.as_view) share a qualified name.
            cache_key = (asking.endpoint or name, checked_key(key(**args), key_where))
        response, value = attempt(app, asking, args, cache_key)
        if response is not None:
            return response
        return go_round(app, asking, args, cache_key, value)

    def forget(
        query: str | bytes | Mapping[str, Any] | None = None, /, **view_args: Any
    ) -> bool:
        """Drop the entries a request for ``view_args`` (and, for a default key, ``query``)
        uses, under every endpoint of the current app this view is registered at; True if
        one was there. Needs an app context (a request is not needed). See
        :meth:`reachlimit.flask.ReachLimit.cached`."""
        app = face.current_app()
        endpoints = [e for e, f in app.view_functions.items() if f is wrapper]
        if not endpoints:
            raise RuntimeError(
                f"{where} is not registered in this app (add it with app.route or "
                "add_url_rule first): it has no entries to forget"  # pragma: no mutate (words)
            )
        if key is not None:
            if query is not None:
                raise TypeError(
                    f"{where} has a key=: its entries are not by query; call "
                    "forget(**view_args) without one"  # pragma: no mutate (a message's words)
                )
            own = checked_key(key(**view_args), key_where)
            keys: list[Hashable] = [(endpoint, own) for endpoint in endpoints]
        else:
            keys = _default_keys(app, endpoints, query, view_args, where)
        found = False
        for cache_key in keys:
            found = face.forget(cache_key) or found
        return found

    setattr(wrapper, "forget", forget)  # noqa: B010 - a function's attribute, typed by CachedView
    return wrapper  # type: ignore[return-value]


def _query_text(query: str | bytes | Mapping[str, Any] | None) -> str:
    """``query`` as the WSGI environ's QUERY_STRING would hold it: bytes as sent, a str as
    sent (non-ASCII characters taken as their UTF-8 bytes, sent raw), a mapping (a MultiDict
    too) encoded as ``urlencode`` (and werkzeug's test client) encodes it."""
    if query is None:
        return ""
    if isinstance(query, bytes):
        return query.decode(_LATIN_1).removeprefix("?")
    if isinstance(query, str):
        return query.removeprefix("?").encode(_UTF_8).decode(_LATIN_1)
    if isinstance(query, Mapping):
        many: Any = query  # a MultiDict's items(multi=True): every value of a name
        items = many.items(multi=True) if hasattr(query, "getlist") else query.items()
        return urlencode(list(items), doseq=True)
    raise TypeError(
        f"forget()'s query must be a str, bytes or a mapping, got {type(query).__name__}"
    )


def _default_keys(
    app: Any, endpoints: list[str], query: Any, view_args: dict[str, Any], where: str
) -> list[Hashable]:
    """The default keys of ``view_args`` and ``query`` under each endpoint: the path that
    the endpoint's URL rule builds from them (as request.path has it: unquoted, without
    the app's root), and the query's pairs, sorted by name."""
    pairs = _pairs(_query_text(query))
    adapter = app.url_map.bind(_HOST)  # only the path of what it builds is read
    keys: list[Hashable] = []
    # set by every failure, before it is raised (so never read as None, nor as anything else)
    failure: Exception | None = None  # pragma: no mutate (set before every read)
    for endpoint in endpoints:
        try:
            url = adapter.build(endpoint, view_args)
        except LookupError as exc:  # werkzeug's BuildError: no rule of it takes these
            failure = exc
            continue
        parts = urlsplit(url)
        if parts.query:
            unknown = sorted({name for name, _ in parse_qsl(parts.query)})
            raise TypeError(
                f"{where}: {', '.join(unknown)} is not an argument of the URL rule of "
                f"{endpoint!r}; a query goes first, as forget('a=1&b=2', ...) or "
                "forget({'a': '1'}, ...)"  # pragma: no mutate (a message's words)
            )
        # unquote's errors="replace" (its default): a built URL holds no bad escape anyway.
        keys.append((endpoint, unquote(parts.path), pairs))
    if not keys:
        assert failure is not None
        raise failure
    return keys
