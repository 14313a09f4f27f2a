"""What a hit of ``@rl.cached`` decodes from its replay (the status line, every header, the
body), and the edges of the replay's format: the longest head it holds, a declared head longer
than the value, header values and Connection lists without spaces, other caches' Cache-Status
members, an empty body, and the one warning a process gives for a value that is not a replay.

A process keeps each replay head it has parsed (a hit then costs no parse); every test here
starts with none kept, so that each of them decodes what it reads, whatever ran before it in
the process.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from flask import Flask, Response, request

import reachlimit._cached as cached_module
from reachlimit._cached import MAGIC, MAX_HEAD
from reachlimit.flask import ReachLimit
from tests.support.flask_ext import one_view_app
from tests.test_cached_return_forms import FORMS, _head, _replay, forms_app

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def no_head_parsed_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cached_module, "_HEADS", {})


def replayed_parts(reply: Any) -> tuple[str, list[tuple[str, str]], bytes]:
    """A reply's status line, its headers but Cache-Status (ours differs per answer) in the
    order of their names (a replay measures Content-Length again, and adds it last), body."""
    headers = [(k, v) for k, v in reply.headers.items() if k.lower() != "cache-status"]
    return reply.status, sorted(headers, key=lambda kv: kv[0].lower()), reply.get_data()


def first_and_hit(app: Flask, url: str = "/v") -> tuple[Any, Any]:
    first = app.test_client().get(url)
    hit = app.test_client().get(url)
    assert hit.headers.getlist("Cache-Status")[-1].startswith("reachlimit; hit"), hit.headers
    return first, hit


@pytest.mark.parametrize("name", list(FORMS))
def test_a_hit_decodes_the_status_line_headers_and_body_the_view_gave(name: str) -> None:
    app, _, runs = forms_app()
    first, hit = first_and_hit(app, f"/{name}")
    assert replayed_parts(hit) == replayed_parts(first)
    assert runs == [name]


def test_an_empty_body_is_replayed() -> None:
    app, _, runs = one_view_app(lambda: ("", 200, {"X-Mine": "empty"}))
    _, hit = first_and_hit(app)
    assert (hit.get_data(), hit.headers["X-Mine"], hit.headers["Content-Length"]) == (
        b"", "empty", "0"
    )
    assert runs == [1]


def test_header_values_and_connection_lists_without_spaces() -> None:
    app, _, _ = one_view_app(lambda: Response("b", headers=[
        ("Connection", "close,X-Private"), ("X-Private", "p"),
        ("X-List", "a,b"), ("Vary", "Accept,Cookie"),
    ]))
    first, hit = first_and_hit(app)
    assert first.headers["X-Private"] == "p"
    assert "X-Private" not in hit.headers and "Connection" not in hit.headers
    assert (hit.headers["X-List"], hit.headers["Vary"]) == ("a,b", "Accept,Cookie")


def test_other_caches_cache_status_members_are_replayed_and_ours_only_dropped() -> None:
    app, _, _ = one_view_app(lambda: Response("b", headers=[
        ("Cache-Status", "reachlimit; hit"), ("X-After", "1"),
        ("Cache-Status", "edge; hit, reachlimit; fwd=uri-miss; stored, origin; fwd=miss"),
    ]))
    _, hit = first_and_hit(app)
    statuses = hit.headers.getlist("Cache-Status")
    assert statuses[0] == "edge; hit, origin; fwd=miss"
    assert len(statuses) == 2 and statuses[1].startswith("reachlimit; hit")
    assert hit.headers["X-After"] == "1"


def test_the_longest_head_a_replay_holds_is_max_head_bytes() -> None:
    app, rl, runs = one_view_app(
        lambda: Response("x", headers={"X-Pad": "p" * int(request.args["n"])}), "/pad"
    )
    with app.test_request_context():
        cache = rl.path.cache

    def head_length(n: int) -> int | None:
        value = cache.get(("pad", "/pad", (f"n={n}",)))
        return None if value is None else int.from_bytes(value[len(MAGIC):len(MAGIC) + 4], "big")

    client = app.test_client()
    client.get("/pad?n=10")
    measured = head_length(10)
    assert measured is not None
    # MAX_HEAD measures the head as written: compact JSON, no space between items.
    stored = cache.get(("pad", "/pad", ("n=10",)))
    head = stored[len(MAGIC) + 4:len(MAGIC) + 4 + measured]
    assert head == json.dumps(json.loads(head), separators=(",", ":")).encode("ascii")
    longest = MAX_HEAD - (measured - 10)  # the pad that makes a head of MAX_HEAD bytes
    for n, cached in ((longest, True), (longest + 1, False)):
        before = len(runs)
        for _ in range(2):
            reply = client.get(f"/pad?n={n}")
            assert reply.status_code == 200 and len(reply.headers["X-Pad"]) == n
        assert head_length(n) == (MAX_HEAD if cached else None)
        assert len(runs) == before + (1 if cached else 2)
        assert reply.headers["Cache-Status"].startswith(
            "reachlimit; hit" if cached else "reachlimit; fwd=uri-miss"
        )


@pytest.mark.parametrize(
    "value",
    [
        # The head it declares runs past the value's end: cut short, never read as it is.
        MAGIC + (len(_head("200 OK", [])) + 5).to_bytes(4, "big") + _head("200 OK", []),
        _replay(_head("200 OK", [[1, "x"]])),  # a header name that is not a str
        _replay(_head("200 OK", [["X-A", 1]])),  # a header value that is not a str
    ],
    ids=["cut-short", "number-name", "number-value"],
)
def test_a_value_that_is_not_quite_a_replay_is_rebuilt(value: bytes) -> None:
    app, rl, runs = one_view_app(lambda: ("built", 200, {"X-Mine": "1"}))
    with app.test_request_context():
        rl.path.cache.set(("v", "/v", ()), value)
    reply = app.test_client().get("/v")
    assert (reply.status_code, reply.get_data(), reply.headers["X-Mine"]) == (200, b"built", "1")
    assert runs == [1]


def test_a_value_that_is_not_a_replay_is_a_warning_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cached_module, "_told", False)  # as in a new process
    app = Flask("told")
    rl = ReachLimit(app)

    @app.get("/t/<n>")
    @rl.cached()
    def t(n: str) -> Any:
        return n

    with app.test_request_context():
        cache = rl.path.cache
    with caplog.at_level(logging.DEBUG, logger="reachlimit"):
        for n in ("1", "2", "3"):
            cache.set(("t", f"/t/{n}", ()), b"not a replay")
            assert app.test_client().get(f"/t/{n}").get_data() == n.encode()
    told = [r for r in caplog.records if "not a replay" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert all("(a bytes)" in r.getMessage() for r in told)  # the value's type is named
