"""The shipped webapp's stale window (REACHLIMIT_STALE=300 by default): a report past its TTL
is answered at once from its stale copy, with its Cache-Status, and rebuilt by one refresh.

The app's warm cache is swapped for one on an injected clock with the app's own TTL and
stale window, so the report goes stale by moving the clock, not by sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from reachlimit import TTLCache
from tests.support.reach_app import health
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_report_past_its_ttl_is_served_stale_at_once_then_refreshed(
    reach_app_factory: Callable[..., Any], busy_repeater: str
) -> None:
    app = reach_app_factory(REACHLIMIT_CACHE_TTL="2")
    state = app.extensions["reachlimit"]
    assert state.settings.stale == 300.0  # what the service ships
    now = [100.0]
    state.path.cache = TTLCache(64, 2.0, stale=state.settings.stale, clock=lambda: now[0])
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    with app.test_client() as client:
        first = client.get(url)
        assert first.status_code == 200
        assert first.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
        now[0] += 2.5  # half a second past the TTL
        stale = client.get(url)
        assert stale.status_code == 200 and stale.get_data() == first.get_data()
        assert stale.headers["Cache-Status"] == "reachlimit; hit; ttl=-1"
        wait_until("the refresh to end", lambda: state.path.counts().refreshed == 1)
        fresh = client.get(url)
        assert fresh.status_code == 200 and fresh.get_data() == first.get_data()
        assert fresh.headers["Cache-Status"] == "reachlimit; hit; ttl=2"
        figures = health(client)
        assert (figures["stale"], figures["builds"]) == (1, 2)  # the refresh built it again
        page = client.get("/")
        assert page.status_code == 200 and b"<html" in page.get_data().lower()
    app.extensions["reachlimit"].path.close()


def test_stale_answers_can_be_turned_off(
    reach_app_factory: Callable[..., Any], busy_repeater: str
) -> None:
    app = reach_app_factory(REACHLIMIT_CACHE_TTL="2", REACHLIMIT_STALE="0")
    state = app.extensions["reachlimit"]
    now = [100.0]
    state.path.cache = TTLCache(64, 2.0, stale=0.0, clock=lambda: now[0])
    url = f"/api/nodes/{busy_repeater}/reach?days=30"
    with app.test_client() as client:
        client.get(url)
        now[0] += 2.5
        again = client.get(url)
        assert again.headers["Cache-Status"] == "reachlimit; fwd=uri-miss; stored"
        assert health(client)["builds"] == 2
