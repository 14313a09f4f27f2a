"""The key rule (``reachlimit._keys``) on what is a tuple without being exactly one (a named
tuple: Redis's key encoding takes it as the tuple it is), and the client rule's message for
a client callable that is an object rather than a function (it has no qualified name)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from reachlimit._keys import check_key, checked_client, shareable

pytestmark = pytest.mark.timeout(30)


class Point(NamedTuple):
    x: Any
    y: Any


def test_a_named_tuple_follows_the_rule_of_the_items_it_holds() -> None:
    assert shareable(Point(1, "a")) and shareable(Point(b"b", (2, Point(3, "c"))))
    assert check_key(Point(1, "a"), "cold()") == (1, "a")
    assert not shareable(Point(1, 2.5)) and not shareable(Point(1, Point(None, "n")))
    with pytest.raises(TypeError, match=r"cold\(\) was given a tuple holding a float"):
        check_key(Point(1, 2.5), "cold()")


class ClientOf:
    """A client callable that is an object: no ``__qualname__``, its repr names it."""

    def __repr__(self) -> str:
        return "<client of the app>"

    def __call__(self, request: Any) -> Any:
        return 1.5


def test_a_client_callable_object_is_named_by_its_repr() -> None:
    func = ClientOf()
    with pytest.raises(TypeError, match=r"ReachLimit client: <client of the app> returned "
                                        r"a float"):
        checked_client(func(None), func)
    assert checked_client(("user", 7), func) == ("user", 7)
