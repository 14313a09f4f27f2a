"""The demo service's visibility change empties the warm cache on the next request; when the
shared cache cannot be reached (``clear_cache()`` raises ``reachlimit.Unavailable``) that
request is still answered, and the clear is claimed again by the next request instead of being
lost. (Nothing stale is answered meanwhile: the visibility generation is part of every
report's key.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import webapp.api
from reachlimit import Unavailable
from webapp import reach_state

pytestmark = pytest.mark.timeout(60)


def test_an_unreachable_shared_cache_does_not_fail_the_request_and_the_clear_is_retried(
    reach_app_factory: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = reach_app_factory()
    client = app.test_client()
    assert client.get("/api/nodes").status_code == 200
    calls: list[str] = []

    def clear_cache() -> None:
        calls.append("clear")
        if len(calls) == 1:
            raise Unavailable("redis://***@127.0.0.1:1/0", "ConnectionError: refused")

    monkeypatch.setattr(webapp.api.reach_limit, "clear_cache", clear_cache)
    reach_state(app).visibility.set_blacklist(["ab" * 32])
    with caplog.at_level(logging.INFO, logger="webapp"):
        first = client.get("/api/nodes")
        second = client.get("/api/nodes")
        third = client.get("/api/nodes")
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 200)
    assert calls == ["clear", "clear"]  # given back once, claimed again once, then done
    text = caplog.text
    assert "could not be emptied" in text and "***" in text and "warm cache emptied" in text
