"""The reach page in a real browser: headless Chromium driven by Playwright.

The app is served by a real threaded Werkzeug server on 127.0.0.1 (port 0) inside the test
process, over a small hand-built database. The browser is Debian's ``chromium`` package
(``/usr/bin/chromium``, or ``$REACHTEST_CHROMIUM``); nothing is downloaded at run time and
``playwright install`` is never needed.

Busy is forced deterministically: the app runs with one build slot and no queue
(``REACHLIMIT_ACTIVE=1``, ``REACHLIMIT_QUEUE=0``) and the test holds that slot itself through
the limiter in ``app.extensions["reachlimit"]``, so every cold report is refused with 429 at
once; releasing the grant lets the page's next retry through.

Without Chromium or the ``playwright`` package these tests are skipped, except under CI
(``$CI`` set), where a missing browser is a failure.

Screenshots of the report and of the busy state go to ``test-artifacts/`` at the repo root.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    ALPHA,
    BRAVO,
    CHARLIE,
    DELTA,
    ECHO,
    GIVE_UP_TIMEOUT_MS,
    OBS_SOUTH,
    PAGE_TIMEOUT_MS,
    RETRY_AFTER_S,
    HeldSlot,
    LiveServer,
    assert_report_matches,
    build_test_db,
    query_of,
    screenshot,
    status_text,
    wait_for_report,
    wait_for_status,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


@pytest.fixture
def test_db(tmp_path: Path) -> Path:
    return build_test_db(tmp_path / "reach.sqlite")


# -- tests ----------------------------------------------------------------------------------


def test_search_pick_and_read_report(page: Any, live_server: LiveServer) -> None:
    """Keyboard only: type part of a name, arrow to the match, Enter; the report's figures
    and rows are the API's; the URL names node and window; another window and a reload work."""
    page.goto(live_server.url + "/")
    search = page.get_by_label("Node", exact=True)
    assert page.get_by_label("Window", exact=True).evaluate("el => el.tagName") == "SELECT"
    search.focus()
    page.keyboard.type("alp")
    page.wait_for_selector('#node-results:not([hidden]) [role="option"]')
    options = page.locator('#node-results [role="option"]')
    assert options.count() == 1
    assert "Alpha Ridge" in options.first.inner_text()
    assert search.get_attribute("aria-expanded") == "true"
    page.keyboard.press("ArrowDown")
    assert options.first.get_attribute("aria-selected") == "true"
    assert search.get_attribute("aria-activedescendant") == options.first.get_attribute("id")
    page.keyboard.press("Enter")

    wait_for_report(page, ALPHA, 7)
    assert query_of(page) == {"node": ALPHA, "days": "7"}
    status, report = live_server.get_json(f"/api/nodes/{ALPHA}/reach?days=7")
    assert status == 200
    assert report["links"] and report["direct_observers"], "the test database is too thin"
    assert_report_matches(page, report)
    assert page.locator("#report-title").inner_text().startswith("Alpha Ridge")
    assert "7-day report for Alpha Ridge" in status_text(page)
    screenshot(page, "reach-report")

    # Another window: the URL follows, and the 14-day report includes the older rows.
    page.get_by_label("Window", exact=True).select_option("14")
    wait_for_report(page, ALPHA, 14)
    assert query_of(page) == {"node": ALPHA, "days": "14"}
    status, report14 = live_server.get_json(f"/api/nodes/{ALPHA}/reach?days=14")
    assert status == 200
    assert report14["importance"]["relay_observations"] > report["importance"][
        "relay_observations"
    ]
    assert_report_matches(page, report14)

    # The URL is a link to the report: a reload shows the same one.
    page.reload()
    wait_for_report(page, ALPHA, 14)
    assert page.get_by_label("Window", exact=True).input_value() == "14"
    assert page.get_by_label("Node", exact=True).input_value() == "Alpha Ridge"
    assert_report_matches(page, report14)

    # Back goes to the 7-day report.
    page.go_back()
    wait_for_report(page, ALPHA, 7)
    assert page.get_by_label("Window", exact=True).input_value() == "7"


def test_search_by_pubkey_prefix_and_empty_report(page: Any, live_server: LiveServer) -> None:
    """A pubkey prefix finds a node; a companion's report has no links and says so."""
    page.goto(live_server.url + "/")
    page.get_by_label("Node", exact=True).fill(DELTA[:6])
    page.wait_for_selector(f'#node-results:not([hidden]) [data-pubkey="{DELTA}"]')
    page.locator(f'#node-results [data-pubkey="{DELTA}"]').click()
    wait_for_report(page, DELTA, 7)
    assert page.locator("#links-empty").is_visible()
    assert page.locator("#observers-empty").is_visible()
    assert page.locator("#fig-links").inner_text() == "0"


def test_busy_shows_countdown_then_report(
    page: Any, live_server: LiveServer, slot: HeldSlot
) -> None:
    """Forced busy: the page counts down, retries, and shows the report once the slot frees."""
    slot.hold()
    page.goto(f"{live_server.url}/?node={ALPHA}&days=7")
    wait_for_status(page, r"busy — retrying in \d+ s \(retry 1 of 5\)")
    assert page.locator("#status-box").get_attribute("data-state") == "busy"
    assert page.locator("#status").get_attribute("aria-live") == "polite"
    assert page.locator("#report").is_hidden()
    screenshot(page, "reach-busy")
    # The page really retries on its own: the second refusal moves it to retry 2.
    wait_for_status(page, r"busy — retrying in \d+ s \(retry 2 of 5\)")
    refused = live_server.reach_requests(ALPHA)
    assert len(refused) >= 2 and all(status == 429 for _q, status in refused)

    slot.release()
    wait_for_report(page, ALPHA, 7)
    assert live_server.reach_requests(ALPHA)[-1][1] == 200
    status, report = live_server.get_json(f"/api/nodes/{ALPHA}/reach?days=7")
    assert status == 200
    assert_report_matches(page, report)


def test_busy_gives_up_after_five_retries_and_retry_button_works(
    page: Any, live_server: LiveServer, slot: HeldSlot
) -> None:
    slot.hold()
    page.goto(f"{live_server.url}/?node={BRAVO}&days=7")
    retry = page.get_by_role("button", name="Retry now")
    wait_for_status(page, r"still busy after 5 retries", timeout=GIVE_UP_TIMEOUT_MS)
    assert retry.is_visible()
    # One first try and five retries, every one refused, and no more.
    assert [status for _q, status in live_server.reach_requests(BRAVO)] == [429] * 6
    screenshot(page, "reach-busy-gave-up")

    slot.release()
    retry.click()
    wait_for_report(page, BRAVO, 7)
    assert retry.is_hidden()
    assert [status for _q, status in live_server.reach_requests(BRAVO)] == [429] * 6 + [200]


def test_switching_node_cancels_pending_retry(
    page: Any, live_server: LiveServer, slot: HeldSlot
) -> None:
    """While Alpha's report waits for a retry, the user picks Charlie: only Charlie's report is
    shown and Alpha is never asked for again, even once the server could answer it."""
    # Charlie's report is warm, so it is served while the slot is held.
    assert live_server.get_json(f"/api/nodes/{CHARLIE}/reach?days=7")[0] == 200
    slot.hold()
    page.goto(f"{live_server.url}/?node={ALPHA}&days=7")
    wait_for_status(page, r"busy — retrying in \d+ s \(retry 1 of 5\)")
    asked_for_alpha = len(live_server.reach_requests(ALPHA))
    assert asked_for_alpha == 1

    page.get_by_label("Node", exact=True).fill("charlie")
    page.wait_for_selector('#node-results:not([hidden]) [role="option"]')
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    wait_for_report(page, CHARLIE, 7)
    assert query_of(page) == {"node": CHARLIE, "days": "7"}
    slot.release()  # had Alpha's retry survived, it would now succeed and take over the page

    # Wait past Alpha's Retry-After (2 s) and then some: a negative check needs a bound.
    page.wait_for_timeout((RETRY_AFTER_S + 1.5) * 1000)
    assert len(live_server.reach_requests(ALPHA)) == asked_for_alpha
    assert page.locator("#report").get_attribute("data-node") == CHARLIE
    assert page.locator("#status-box").get_attribute("data-state") == "ok"
    assert "Charlie Room" in status_text(page)


def test_switching_window_cancels_pending_retry(
    page: Any, live_server: LiveServer, slot: HeldSlot
) -> None:
    assert live_server.get_json(f"/api/nodes/{BRAVO}/reach?days=30")[0] == 200
    slot.hold()
    page.goto(f"{live_server.url}/?node={BRAVO}&days=1")
    wait_for_status(page, r"retry 1 of 5")
    page.get_by_label("Window", exact=True).select_option("30")
    wait_for_report(page, BRAVO, 30)
    slot.release()
    page.wait_for_timeout((RETRY_AFTER_S + 1.5) * 1000)
    queries = [query for query, _status in live_server.reach_requests(BRAVO)]
    assert queries.count("days=1") == 1, queries
    assert page.locator("#report").get_attribute("data-days") == "30"
    assert query_of(page) == {"node": BRAVO, "days": "30"}


def test_stale_response_never_overwrites_newer_choice(
    page: Any, live_server: LiveServer
) -> None:
    """Alpha's answer is held back in the network until Bravo's report is on screen; when it
    finally arrives it changes nothing."""
    held: list[Any] = []

    def hold_alpha(route: Any) -> None:
        held.append(route)

    page.route(re.compile(rf".*/api/nodes/{ALPHA}/reach.*"), hold_alpha)
    page.goto(f"{live_server.url}/?node={ALPHA}&days=7")
    wait_for_status(page, "Loading")
    deadline = time.monotonic() + PAGE_TIMEOUT_MS / 1000
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert held, "the page never asked for Alpha's report"

    page.get_by_label("Node", exact=True).fill("bravo")
    page.wait_for_selector('#node-results:not([hidden]) [role="option"]')
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    wait_for_report(page, BRAVO, 7)

    try:
        held[0].continue_()
    except Exception:
        pass  # the page already aborted that request: exactly what it should do
    page.wait_for_timeout(500)
    assert page.locator("#report").get_attribute("data-node") == BRAVO
    assert "Bravo Hill" in status_text(page)


def test_link_in_the_table_opens_that_nodes_report(page: Any, live_server: LiveServer) -> None:
    page.goto(f"{live_server.url}/?node={ALPHA}&days=14")
    wait_for_report(page, ALPHA, 14)
    page.locator(f'#links a[data-pubkey="{BRAVO}"]').click()
    wait_for_report(page, BRAVO, 14)
    assert query_of(page) == {"node": BRAVO, "days": "14"}
    status, report = live_server.get_json(f"/api/nodes/{BRAVO}/reach?days=14")
    assert status == 200
    assert_report_matches(page, report)
    assert page.locator(f'#links a[data-pubkey="{OBS_SOUTH.lower()}"]').count() == 0


def test_retry_after_header_is_honoured(page: Any, live_server: LiveServer) -> None:
    """The countdown starts from the response's Retry-After, and from 2 s without one.
    (The real server always says 2 s, so the two refusals are made up in the network.)"""
    refusals = [
        {"Retry-After": "4"},
        {},  # no header at all: the page falls back to 2 s
    ]

    def refuse_then_pass(route: Any) -> None:
        if refusals:
            route.fulfill(
                status=429, headers=refusals.pop(0), content_type="application/json",
                body=json.dumps({"error": "busy", "retryAfter": 2}),
            )
        else:
            route.continue_()

    page.route(re.compile(rf".*/api/nodes/{ALPHA}/reach.*"), refuse_then_pass)
    page.goto(f"{live_server.url}/?node={ALPHA}&days=7")
    wait_for_status(page, r"retrying in 4 s \(retry 1 of 5\)")
    wait_for_status(page, r"retrying in 3 s \(retry 1 of 5\)")  # it counts down
    wait_for_status(page, r"retrying in 2 s \(retry 2 of 5\)")
    wait_for_report(page, ALPHA, 7)
    assert refusals == []
    assert [status for _q, status in live_server.reach_requests(ALPHA)] == [200]


def test_server_error_shows_its_message_and_a_retry_button(
    page: Any, live_server: LiveServer
) -> None:
    """A 500 is not retried on its own; its message is shown and "Retry now" asks again."""
    failures = [1]

    def fail_once(route: Any) -> None:
        if failures:
            failures.pop()
            route.fulfill(status=500, content_type="application/json",
                          body=json.dumps({"error": "reach computation failed"}))
        else:
            route.continue_()

    page.route(re.compile(rf".*/api/nodes/{ECHO}/reach.*"), fail_once)
    page.goto(f"{live_server.url}/?node={ECHO}&days=7")
    wait_for_status(page, r"^reach computation failed\.$")
    assert page.locator("#status-box").get_attribute("data-state") == "error"
    retry = page.get_by_role("button", name="Retry now")
    assert retry.is_visible()
    retry.click()
    wait_for_report(page, ECHO, 7)
    assert retry.is_hidden()


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ("not-a-pubkey", "invalid pubkey: expected 64 hex chars"),
        ("9" * 64, "Not found"),
    ],
)
def test_error_message_comes_from_the_body(
    page: Any, live_server: LiveServer, node: str, message: str
) -> None:
    page.goto(f"{live_server.url}/?node={node}&days=7")
    wait_for_status(page, re.escape(message))
    assert page.locator("#status-box").get_attribute("data-state") == "error"
    assert page.locator("#report").is_hidden()
    # No retries for an answer that will not change.
    page.wait_for_timeout(300)
    assert len(live_server.reach_requests()) == 1


#: What a reverse proxy sends when the service behind it is down: its own HTML page.
PROXY_502 = (b"<html><head><title>502 Bad Gateway</title></head><body><center>"
             b"<h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>")


def test_a_proxys_html_502_reads_as_a_server_error(
    page: Any, live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy in front of the service answers the API with a 502 and an HTML page, over real
    HTTP: the search and the report both say the server answered 502 (the report with its
    "Retry now"), never that the server could not be reached; once the proxy passes requests
    on again, "Retry now" shows the report."""
    app = live_server.app
    service = app.wsgi_app

    def proxy_down(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if not environ.get("PATH_INFO", "").startswith("/api/"):
            return list(service(environ, start_response))
        start_response("502 Bad Gateway", [("Content-Type", "text/html"),
                                           ("Content-Length", str(len(PROXY_502)))])
        return [PROXY_502]

    monkeypatch.setattr(app, "wsgi_app", proxy_down)
    page.goto(live_server.url + "/")
    page.get_by_label("Node", exact=True).fill("alp")
    info = page.locator("#search-info")
    info.filter(has_text="Search failed").wait_for()
    assert info.inner_text() == "Search failed: the server answered 502 Bad Gateway."
    assert page.locator("#node-results").is_hidden()

    page.goto(f"{live_server.url}/?node={ALPHA}&days=7")
    wait_for_status(page, r"^The server answered 502 Bad Gateway\.$")
    assert page.locator("#status-box").get_attribute("data-state") == "error"
    assert page.locator("#report").is_hidden()
    retry = page.get_by_role("button", name="Retry now")
    assert retry.is_visible()
    assert live_server.reach_requests() == []  # the proxy answered; the service saw nothing

    monkeypatch.setattr(app, "wsgi_app", service)  # the proxy passes requests on again
    retry.click()
    wait_for_report(page, ALPHA, 7)
    assert live_server.reach_requests(ALPHA) == [("days=7", 200)]


def test_retry_after_parsing(page: Any, live_server: LiveServer) -> None:
    """Retry-After: whole seconds honoured, capped at 30; missing or invalid means 2 s."""
    page.goto(live_server.url + "/")
    cases = {"2": 2, "7": 7, "120": 30, "0": 1, None: 2, "": 2, "soon": 2, "-3": 2, "1.5": 2}
    got = page.evaluate(
        "cases => cases.map(c => window.reachPage.retryDelaySeconds(c))", list(cases)
    )
    assert dict(zip(cases, got, strict=True)) == cases
    in_10_s = page.evaluate("() => new Date(Date.now() + 10500).toUTCString()")
    assert page.evaluate("h => window.reachPage.retryDelaySeconds(h)", in_10_s) in (10, 11)
    past = "Sun, 06 Nov 1994 08:49:37 GMT"
    assert page.evaluate("h => window.reachPage.retryDelaySeconds(h)", past) == 1


def test_phone_viewport_is_readable(browser: Any, live_server: LiveServer) -> None:
    """On a phone-sized screen the page does not scroll sideways; wide tables scroll in place."""
    context = browser.new_context(
        viewport={"width": 375, "height": 740}, device_scale_factor=2, is_mobile=True,
        has_touch=True,
    )
    try:
        tab = context.new_page()
        tab.set_default_timeout(PAGE_TIMEOUT_MS)
        tab.goto(f"{live_server.url}/?node={ALPHA}&days=7")
        wait_for_report(tab, ALPHA, 7)
        overflow = tab.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page is {overflow}px wider than the screen"
        screenshot(tab, "reach-report-phone")
    finally:
        context.close()
