"""``@rl.cached(key=None)`` and ``@budget.cached(key=None)``: a view whose return value is
the cold build, answered with the value's own Content-Type and ``Cache-Status``.

design:

    wrapper(**view_args)                       (the request's handler thread)
      key   = (endpoint, key(**view_args))     key given: str, bytes, int or a tuple of those
            | (endpoint, request.path, the query's raw name=value pairs, sorted by name)
              (the endpoint: unique in the app, where two views of one factory share a
              qualified name; the view's name where a request has none)
                                               so ?a=1&b=2 and ?b=2&a=1 are one key
      build = the view called with view_args: in the request when it is the request's own
              build; in a test_request_context of the same path and query string when a
              refresh runs it on a refresher thread (REACHLIMIT_STALE > 0), so a view that
              reads request.path, request.args or its view_args works there too (headers,
              cookies, the body and the client's address are NOT there: such a view must use
              cold() and read what it needs first); its value through the value rule
      value = the budget's cold(key, build)    refusals (429/503), clients gone (499) and
                                               the view's own errors exactly as with cold()

A warm hit never runs the build, so the request makes it and nothing more: one
``functools.partial`` of ``_run_view`` (no closure cells) with the value rule inside it (cold()
is told the build applies it and adds no wrapper of its own); the request's path, query string
and root URL are read only when a refresh runs it (werkzeug works the root URL out afresh for
each request: a few microseconds, most of what the decorator cost a hit before). The partial
holds the request object for that: a refresh runs soon after the request that handed it out,
and the request's environ is not changed after it ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

from ._budgets import checked_key
from ._path import NOT_FOUND
from ._values import normalised

__all__ = ["cached_view", "view_name"]

#: The mimetype of a str answer without ``mimetype=`` (the response class adds the charset).
TEXT = "text/plain"
#: The mimetype of a bytes answer without ``mimetype=``.
OCTETS = "application/octet-stream"

#: cold(key, build): the budget's cold() for a build that applies the value rule itself.
Cold = Callable[[Hashable, Callable[[], Any]], Any]


def view_name(view: Callable[..., Any]) -> str:
    return f"{getattr(view, '__module__', '?')}.{getattr(view, '__qualname__', repr(view))}"


def _name_of(pair: str) -> str:
    """The name of a query's ``name=value`` pair, as sent."""
    return pair.partition("=")[0]


def _run_view(
    app: Any, view: Callable[..., Any], args: dict[str, Any], asking: Any,
    in_request: Callable[[], bool], key: Hashable, where: str,
) -> Any:
    """The view as a build, its value through the value rule: called in the request, or in a
    request context of the same path and query string when run outside any request (a
    refresh). Nothing is read of the request until then (see the module's design note)."""
    if in_request():
        value = view(**args)
    else:
        # The query string exactly as the server gave it (WSGI's latin-1 text, put back into
        # the environ as it was: passed as query_string= werkzeug would encode it again, and
        # raw UTF-8 bytes in it would reach the view as mojibake).
        with app.test_request_context(
            asking.path, base_url=asking.root_url,
            environ_overrides={"QUERY_STRING": asking.environ.get("QUERY_STRING", "")},
        ):
            value = view(**args)
    return normalised(value, key, where)


def _answer(app: Any, value: Any, mimetype: str | None) -> Any:
    if value is NOT_FOUND:
        app.aborter(404)
    if isinstance(value, bytes):
        return app.response_class(value, mimetype=mimetype or OCTETS)
    if isinstance(value, str):
        return app.response_class(value, mimetype=mimetype or TEXT)
    return app.json.response(value)


def cached_view(
    cold: Cold,
    view: Callable[..., Any],
    key: Callable[..., Hashable] | None,
    mimetype: str | None,
    current: Callable[[], tuple[Any, Any]],
    in_request: Callable[[], bool],
) -> Callable[..., Any]:
    """``view`` wrapped (``functools.wraps``) as the module's design note says. ``current``
    gives the current app and request objects; ``in_request`` whether a request is active."""
    if key is not None and not callable(key):
        raise TypeError(f"cached(key=...) must be a callable taking the view's arguments, "
                        f"got {key!r}")
    name = view_name(view)
    where = f"view {name}"

    @functools.wraps(view)
    def wrapper(**args: Any) -> Any:
        app, asking = current()
        if key is None:
            # The query's name=value pairs as sent, sorted by name only (stable: pairs of
            # one name keep their order, which request.args.getlist answers): no parse of
            # request.args, which costs more than the rest of a refusal's key. Two
            # spellings of one value (%20 and +) are two entries: a build, never a wrong
            # answer.
            query = asking.environ.get("QUERY_STRING", "")
            pairs = tuple(sorted((p for p in query.split("&") if p), key=_name_of)) if query \
                else ()
            cache_key: Hashable = (asking.endpoint or name, asking.path, pairs)
        else:
            # The endpoint, unique in the app, before the view's name: views made by one
            # factory (or MethodView.as_view) share a qualified name.
            cache_key = (
                asking.endpoint or name, checked_key(key(**args), f"the key of {where}")
            )
        build = partial(_run_view, app, view, args, asking, in_request, cache_key, where)
        return _answer(app, cold(cache_key, build), mimetype)

    return wrapper
