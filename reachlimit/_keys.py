"""The one rule for the keys the Flask extension is handed, written once, with and without
Redis: a ``cold()`` or ``forget()`` key, a cached view's ``key=`` result and the value of the
``client`` callable are ``str``, ``bytes``, ``int`` or tuples of those.

design:

    shareable(key)              whether ``key`` is one: exactly what ``reachlimit.redis``
                                encodes (its entries' digests, its client ids), so an app
                                moved to Redis never starts failing on a key that worked in
                                process. ``bool`` is an ``int``: ``True`` is the key ``1``
                                (and ``False`` is ``0``), as in a dict and on Redis.
                                A float, a UUID, None, a list or a frozenset is not.
    check_key(key, where)       ``key``, or ``TypeError`` naming ``where`` (``cold()``, ...)
    checked_key(key, where)     the same for what a callable returned (a view's ``key=``)
    checked_client(name, func)  the client callable's value (None too: the one anonymous
                                client), or ``TypeError`` naming the callable

Every check is made at the call, before anything is held or counted. A warm hit pays for it:
the callers test ``type(key) is str`` first (one comparison for the common key) and call in
here only for other keys. Standard library only.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = ["shareable", "check_key", "checked_key", "checked_client", "KEY_TYPES"]

#: What a key may be made of, in the words of every message below.
KEY_TYPES = "str, bytes, int or a tuple of those (the same with and without Redis)"


def shareable(key: object) -> bool:
    """Whether ``key`` is a str, bytes, int (bool included) or a tuple of those."""
    # Exact types first, without a generator or a call per item: a tuple key of a warm hit
    # costs about a third of what isinstance and all() would. Subclasses (an IntEnum, a
    # str subclass, bool) come after, as Redis's key encoding takes them.
    # The exact types are a shortcut: any key they miss gets the same answer further down.
    kind = type(key)  # pragma: no mutate (a shortcut's: see above)
    if kind is str or kind is int or kind is bytes:  # pragma: no mutate (a shortcut's)
        return True
    if kind is tuple:
        for item in key:  # type: ignore[attr-defined]
            of = type(item)  # pragma: no mutate (a shortcut's, as above)
            if of is not str and of is not int and of is not bytes and not shareable(item):
                return False
        return True
    if isinstance(key, (str, bytes, int)):
        return True
    return isinstance(key, tuple) and all(shareable(item) for item in key)


def _what(key: object) -> str:
    """What is wrong with ``key``, for a message: its type, or the type of the first item
    of a tuple (however deep) that breaks the rule."""
    if isinstance(key, tuple):
        for item in key:
            if not shareable(item):
                return f"a tuple holding {_what(item)}"
    try:
        hash(key)
    except TypeError:
        return f"an unhashable {type(key).__name__}"
    return f"a {type(key).__name__}"


def check_key(key: Hashable, where: str) -> Hashable:
    """``key``, or ``TypeError`` naming ``where`` (``"cold()"``, say) when it breaks the rule."""
    if type(key) is str or shareable(key):  # the str test: a shortcut of shareable's
        return key
    raise TypeError(f"{where} was given {_what(key)} as the cache key: a key must be {KEY_TYPES}")


def checked_key(key: Hashable, where: str) -> Hashable:
    """``key``, or ``TypeError`` naming ``where`` (a view's ``key=`` callable, say) when
    the value it returned breaks the rule."""
    if type(key) is str or shareable(key):  # the str test: a shortcut of shareable's
        return key
    raise TypeError(f"{where} returned {_what(key)} as the cache key: a key must be {KEY_TYPES}")


def checked_client(name: Any, func: Any) -> Hashable:
    """The value ``name`` of the app's client callable ``func``, or ``TypeError`` naming the
    callable when it is not None and breaks the rule."""
    if name is None or type(name) is str or shareable(name):  # str: a shortcut, as above
        return name  # type: ignore[no-any-return]
    raise TypeError(
        f"ReachLimit client: {getattr(func, '__qualname__', func)!r} returned {_what(name)}; "
        f"it must return {KEY_TYPES}: the user's id as a str, say (None is the one "
        "anonymous client)"  # pragma: no mutate (a message's words)
    )
