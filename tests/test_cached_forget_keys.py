"""``view.forget`` finds the entry a request made, from every form of query it takes (bytes
and text with or without their "?", a MultiDict with a name given more than once), under each
endpoint the view is registered at that can build the arguments; and what it refuses names
the view and what is wrong.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, request
from werkzeug.datastructures import MultiDict

from reachlimit.flask import ReachLimit
from tests.test_cached_return_forms import forget_app

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "query",
    [b"?a=1&a=2&b=x", "?a=1&a=2&b=x", MultiDict([("a", "1"), ("b", "x"), ("a", "2")])],
    ids=["bytes", "str", "multidict"],
)
def test_forget_takes_the_query_as_a_request_sent_it(query: Any) -> None:
    app, _, runs, views = forget_app()
    client = app.test_client()
    client.get("/day/mon?a=1&a=2&b=x")
    with app.app_context():
        assert views["day"].forget(query, day="mon") is True
    assert client.get("/day/mon?a=1&a=2&b=x").headers["Cache-Status"].endswith("stored")
    assert len(runs) == 2


def test_a_repeated_name_keeps_its_order_even_with_an_equals_sign_in_a_value() -> None:
    app, _, runs, _ = forget_app()
    client = app.test_client()
    client.get("/day/mon?x=b=1&x=a")
    other = client.get("/day/mon?x=a&x=b=1")  # getlist("x") differs: another entry
    assert other.headers["Cache-Status"].endswith("stored")
    assert len(runs) == 2


def test_an_endpoint_that_cannot_build_the_arguments_leaves_the_others_to_forget() -> None:
    app = Flask("endpoints")
    rl = ReachLimit(app)

    def page(n: int = 0) -> Any:
        return {"n": n, "at": request.endpoint}

    view = rl.cached(page)
    app.add_url_rule("/by/<int:n>", endpoint="by", view_func=view)  # needs n
    app.add_url_rule("/all", endpoint="all", view_func=view)  # takes no n
    client = app.test_client()
    client.get("/all")
    with app.app_context():
        assert view.forget() is True  # "by" cannot be built without n; "all" can
        assert view.forget() is False


def test_what_forget_refuses_names_the_view_and_what_is_wrong() -> None:
    app, _, _, views = forget_app()
    with app.app_context():
        with pytest.raises(TypeError, match=r"view tests\.test_cached_return_forms\..*day: "
                           r"a, b is not an argument of the URL rule of 'day'"):
            views["day"].forget(day="mon", b=2, a=1)
        with pytest.raises(TypeError, match="query must be a str, bytes or a mapping, got int"):
            views["day"].forget(3, day="mon")
        with pytest.raises(TypeError, match=r"the key of view tests\.test_cached_decorator\."
                           r".*by_id returned a float as the cache key"):
            views["by_id"].forget(item=_Lower(1.5))


class _Lower:
    """An argument whose ``lower()`` is ``value``: a key callable returning a float."""

    def __init__(self, value: float) -> None:
        self.value = value

    def lower(self) -> float:
        return self.value
