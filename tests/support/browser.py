"""The harness of the browser tests (``tests/test_browser.py``): the test database
(``build_test_db``, five nodes and two observers), the reach app on a live Werkzeug server
whose cold builds a test can hold (``LiveServer``, ``HeldSlot``), headless Chromium driven by
Playwright (the module-scoped ``browser`` fixture; ``page``, a tab whose console errors fail
the test and whose screenshot is kept in ``test-artifacts/``), and what a test reads off the
page (``status_text``, ``wait_for_report``, ``figures``, ``table_rows``,
``assert_report_matches``, ...)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.werkzeug_server import WerkzeugServer

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("REACHTEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: Playwright's wait for any one thing the page should do (an element, a text, a navigation).
PAGE_TIMEOUT_MS = 15_000
#: The page retries a refused (429) report at most this many times, each after
#: Retry-After = 2 s: the whole busy sequence takes about 10 s.
MAX_RETRIES = 5
RETRY_AFTER_S = 2
GIVE_UP_TIMEOUT_MS = (MAX_RETRIES * RETRY_AFTER_S + 10) * 1000


# -- the test database ----------------------------------------------------------------------


def _key(prefix: str) -> str:
    """A lower-case 64-hex pubkey starting with ``prefix`` (distinct 2-char prefixes make
    every node's tokens reliable)."""
    return (prefix * 32)[:64]


ALPHA = _key("a1")  # repeater, the busiest node
BRAVO = _key("b2")  # repeater
CHARLIE = _key("c3")  # room server
DELTA = _key("d4")  # companion: no reliable token, empty report
ECHO = _key("e5")  # repeater
OBS_NORTH = "F1" * 32  # observers are stored upper-case and are not nodes here
OBS_SOUTH = "F2" * 32

NODES = [
    # pubkey, name, role, lat, lon
    (ALPHA, "Alpha Ridge", "repeater", 51.50, -0.12),
    (BRAVO, "Bravo Hill", "repeater", 51.60, -0.25),
    (CHARLIE, "Charlie Room", "room_server", 51.55, -0.05),
    (DELTA, "Delta Phone", "companion", 0.0, 0.0),
    (ECHO, "Echo Tower", "repeater", None, None),
]
ADVERT = 4
TEXT = 2


def build_test_db(path: Path, now: float | None = None) -> Path:
    """Write a small database in the CoreScope schema the service reads.

    Alpha hears Bravo often and Bravo hears Alpha (a strong two-way link), Alpha and Charlie
    hear each other a little, Echo is only heard by Alpha (one-way), two observers hear Alpha
    directly, and some observations are ten days old so the 7- and 14-day windows differ.
    """
    now = time.time() if now is None else now
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE nodes(public_key TEXT PRIMARY KEY, name TEXT, role TEXT, lat REAL,
                           lon REAL, last_seen TEXT, first_seen TEXT);
        CREATE TABLE observers(id TEXT PRIMARY KEY, name TEXT);
        CREATE TABLE transmissions(id INTEGER PRIMARY KEY, from_pubkey TEXT,
                                   payload_type INTEGER);
        CREATE TABLE observations(id INTEGER PRIMARY KEY, transmission_id INTEGER,
                                  observer_idx INTEGER, snr REAL, path_json TEXT,
                                  timestamp INTEGER);
        CREATE TABLE neighbor_edges(node_a TEXT, node_b TEXT, count INTEGER);
        CREATE INDEX idx_observations_timestamp ON observations(timestamp);
        """
    )
    con.executemany(
        "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, '2026-06-01T00:00:00Z', "
        "'2026-01-01T00:00:00Z')",
        NODES,
    )
    con.executemany(
        "INSERT INTO observers(rowid, id, name) VALUES (?, ?, ?)",
        [(1, OBS_NORTH, "Obs North"), (2, OBS_SOUTH, "Obs South")],
    )
    rows: list[tuple[str, int, int, float | None, list[str], float]] = []
    hour = 3600.0
    day = 86400.0
    for i in range(30):  # Bravo -> Alpha -> North: Alpha hears Bravo, North hears Alpha
        rows.append((BRAVO, ADVERT, 1, 8.0 + (i % 3), ["B2", "A1"], now - hour * (i + 1)))
    for i in range(12):  # Alpha -> Bravo -> South: Bravo hears Alpha
        rows.append((ALPHA, TEXT, 2, -3.5, ["A1", "B2"], now - hour * (i + 2)))
    for i in range(3):  # Charlie -> Alpha -> Charlie's side: a weak two-way link
        rows.append((CHARLIE, TEXT, 1, 2.0, ["C3", "A1", "C3"], now - hour * (i + 5)))
    for i in range(4):  # Echo -> Alpha (first hop, advert): Alpha hears Echo, Echo never hears it
        rows.append((ECHO, ADVERT, 2, None, ["E5", "A1", "B2"], now - hour * (i + 7)))
    for i in range(6):  # ten days old: only in the 14- and 30-day windows
        rows.append((BRAVO, ADVERT, 2, 1.0, ["B2", "A1"], now - day * 10 - hour * i))
    for tid, (origin, kind, observer, snr, hops, ts) in enumerate(rows, start=1):
        con.execute("INSERT INTO transmissions VALUES (?, ?, ?)", (tid, origin, kind))
        con.execute(
            "INSERT INTO observations VALUES (?, ?, ?, ?, ?, ?)",
            (tid, tid, observer, snr, json.dumps(hops), int(ts)),
        )
    con.executemany(
        "INSERT INTO neighbor_edges VALUES (?, ?, ?)",
        [
            (ALPHA, BRAVO, 30), (ALPHA, CHARLIE, 3), (ALPHA, ECHO, 4),
            (BRAVO, CHARLIE, 2), (BRAVO, ECHO, 1),
        ],
    )
    con.commit()
    con.close()
    return path


# -- the app and its server -----------------------------------------------------------------


def make_app(db_path: Path, **config: Any) -> Any:
    """The real webapp over ``db_path``, with ``config`` on top."""
    from webapp import create_app

    return create_app({"REACH_DB": str(db_path), "TESTING": True, **config})


class LiveServer(WerkzeugServer):
    """A real threaded Werkzeug server on 127.0.0.1 serving ``app`` from a thread.

    Every report request that reaches the app is recorded (path, query, status) so a test can
    check what the page asked for, and when."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._reach: list[tuple[str, str, int]] = []  # guarded by _lock
        inner = app.wsgi_app

        def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            path = environ.get("PATH_INFO", "")
            if not path.endswith("/reach"):
                return inner(environ, start_response)

            def start(status: str, headers: Any, *exc_info: Any) -> Any:
                with self._lock:
                    self._reach.append((path, environ.get("QUERY_STRING", ""),
                                        int(status.split()[0])))
                return start_response(status, headers, *exc_info)

            return inner(environ, start)

        app.wsgi_app = recording
        super().__init__(app, poll_interval=0.05, name="live-server")

    @property
    def limiter(self) -> Any:
        """The app's cold limiter (a ``reachlimit.ColdLimiter``)."""
        return self.app.extensions["reachlimit"].path.limiter

    def reach_requests(self, pubkey: str | None = None) -> list[tuple[str, int]]:
        """``(query, status)`` of every report request so far, optionally for one node."""
        with self._lock:
            seen = list(self._reach)
        return [
            (query, status) for path, query, status in seen
            if pubkey is None or path == f"/api/nodes/{pubkey}/reach"
        ]

    def get_json(self, path: str) -> tuple[int, dict[str, Any]]:
        """GET ``path`` from the test (not the browser); returns (status, body)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.load(err)

    def close(self, timeout: float = 5) -> None:
        super().close(timeout)


@pytest.fixture(name="live_server")
def live_server_fixture(test_db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """The webapp on a real server, one build slot and no queue, so a held slot means 429.
    The test run's own REACH_* / REACHLIMIT_* environment is ignored."""
    for key in list(os.environ):
        if key.startswith(("REACH_", "REACHLIMIT_")):
            monkeypatch.delenv(key)
    app = make_app(test_db, REACHLIMIT_ACTIVE=1, REACHLIMIT_QUEUE=0)
    server = LiveServer(app)
    try:
        yield server
    finally:
        server.close()


class HeldSlot:
    """The app's only build slot, taken by the test: every cold report is refused at once."""

    def __init__(self, limiter: Any) -> None:
        self._limiter = limiter
        self._grant: Any = None

    def hold(self) -> None:
        assert self._grant is None
        self._grant = self._limiter.acquire()

    def release(self) -> None:
        if self._grant is not None:
            grant, self._grant = self._grant, None
            grant.release()


@pytest.fixture(name="slot")
def slot_fixture(live_server: LiveServer) -> Iterator[HeldSlot]:
    held = HeldSlot(live_server.limiter)
    try:
        yield held
    finally:
        held.release()


# -- the browser ----------------------------------------------------------------------------


def _browser_missing() -> str | None:
    problems = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the 'playwright' Python package (pip install playwright)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        problems.append(f"a Chromium at {CHROMIUM} (apt-get install chromium)")
    if not problems:
        return None
    return "real-browser tests need " + " and ".join(problems)


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI is set, so this is a failure, not a skip", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=30_000
        )
        try:
            yield chromium
        finally:
            chromium.close()


class PageWatch:
    """What the page did: uncaught script errors and every URL it requested."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.urls: list[str] = []


@pytest.fixture(name="page")
def page_fixture(browser: Any, live_server: LiveServer) -> Iterator[Any]:
    """A fresh browser context on the live server, desktop-sized; fails the test on an
    uncaught script error or on any request that leaves the app's own origin."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-GB")
    tab = context.new_page()
    tab.set_default_timeout(PAGE_TIMEOUT_MS)
    watch = PageWatch()
    tab.on("pageerror", lambda exc: watch.errors.append(str(exc)))
    tab.on("request", lambda request: watch.urls.append(request.url))
    tab.watch = watch
    try:
        yield tab
    finally:
        context.close()
    assert watch.errors == [], f"uncaught script errors: {watch.errors}"
    foreign = [u for u in watch.urls if not u.startswith(live_server.url + "/")]
    assert foreign == [], f"the page reached outside the app: {foreign}"


def screenshot(tab: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


# -- helpers --------------------------------------------------------------------------------


def status_text(tab: Any) -> str:
    return str(tab.locator("#status").inner_text())


def wait_for_report(tab: Any, pubkey: str, days: int, timeout: int = PAGE_TIMEOUT_MS) -> None:
    tab.wait_for_selector(
        f'#report:not([hidden])[data-node="{pubkey}"][data-days="{days}"]:not(.stale)',
        timeout=timeout,
    )


def wait_for_status(tab: Any, pattern: str, timeout: int = PAGE_TIMEOUT_MS) -> None:
    """Wait until the status line matches the regular expression ``pattern``."""
    tab.wait_for_function(
        "pattern => new RegExp(pattern).test(document.getElementById('status').textContent)",
        arg=pattern, timeout=timeout,
    )


def figures(tab: Any) -> dict[str, str]:
    return {
        name: tab.locator(f"#fig-{name}").inner_text()
        for name in ("neighbours", "rank", "links", "bidir", "relay", "observers")
    }


def as_int(text: str) -> int:
    return int(text.replace(",", ""))


def table_rows(tab: Any, selector: str) -> list[dict[str, Any]]:
    """Body rows of a report table (tier headings left out) as dicts of their cells."""
    return list(tab.eval_on_selector_all(
        f"{selector} tbody tr[data-pubkey]",
        """rows => rows.map(row => ({
               pubkey: row.dataset.pubkey,
               tier: row.dataset.tier || null,
               cells: [...row.cells].map(cell => cell.innerText.trim()),
           }))""",
    ))


def assert_report_matches(tab: Any, report: dict[str, Any]) -> None:
    """The page shows exactly the figures and rows of the API's ``report``."""
    imp = report["importance"]
    shown = figures(tab)
    assert as_int(shown["neighbours"]) == imp["neighbor_degree"]
    if imp["degree_rank"]:
        assert shown["rank"] == f"{imp['degree_rank']} of {imp['nodes_with_edges']}"
    else:
        assert shown["rank"] == "—"
    assert as_int(shown["links"]) == len(report["links"])
    assert as_int(shown["bidir"]) == imp["bidirectional_links"]
    assert as_int(shown["relay"]) == imp["relay_observations"]
    assert as_int(shown["observers"]) == imp["direct_observers"]
    assert tab.locator("#node-pubkey").inner_text() == report["node"]["pubkey"]

    links = table_rows(tab, "#links")
    # Rows keep the server's order (two-way first, then bottleneck); tiers never go back.
    assert [row["pubkey"] for row in links] == [link["pubkey"] for link in report["links"]]
    tiers = [int(row["tier"]) for row in links]
    assert tiers == sorted(tiers)
    for row, link in zip(links, report["links"], strict=True):
        _tier, name, role, we_hear, they_hear, bottleneck, bidir, _km = row["cells"]
        assert name.startswith(link["name"] or "(unnamed)")
        assert role == (link["role"] or "—")
        assert [as_int(we_hear), as_int(they_hear), as_int(bottleneck)] == [
            link["we_hear"], link["they_hear"], link["bottleneck"]
        ]
        assert bidir == ("yes" if link["bidir"] else "no")
        assert (int(row["tier"]) == 4) == (not link["bidir"])

    observers = table_rows(tab, "#observers")
    assert [row["pubkey"] for row in observers] == [
        o["pubkey"] for o in report["direct_observers"]
    ]
    for row, observer in zip(observers, report["direct_observers"], strict=True):
        _name, count, snr, _km = row["cells"]
        assert as_int(count) == observer["count"]
        if observer["avg_snr"] is None:
            assert snr == "—"
        else:  # one decimal, rounded by the browser (JavaScript rounds half up)
            assert snr.endswith(" dB")
            assert abs(float(snr[:-3]) - observer["avg_snr"]) <= 0.05 + 1e-9


def query_of(tab: Any) -> dict[str, str]:
    return dict(tab.evaluate("() => Object.fromEntries(new URLSearchParams(location.search))"))
