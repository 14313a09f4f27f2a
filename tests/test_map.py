"""The reach map in a real browser: headless Chromium against the real service on a demo database.

The app runs on a real threaded Werkzeug server on 127.0.0.1 (``LiveServer`` of
``tests/test_browser.py``) over a generated demo database - the session's small one from
``tests/conftest.py`` (150 nodes), and for the crowded map a denser one (800 nodes, 80,000
observations). Nothing here types in which nodes a map should show: every test picks its report
from what the API serves and then compares the drawing with ``/api/nodes/<pubkey>/reach`` for
that report. The rule for "has a position" is the server's own ``webapp.meshcore.has_gps``.

What the map promises, and what each test checks:

* one element with ``data-pubkey`` for the node and for each neighbour (link or direct
  observer) with a position, and nothing else - a pubkey that is both a link and a direct
  observer is one marker;
* two-way and one-way links drawn differently, a two-way line the thicker the higher its
  bottleneck, and only the node labelled on the map (no label soup with dozens of links);
* pointing at or focusing a marker names it; a click, Enter or Space opens that node's report;
* hidden and blacklisted nodes never appear;
* a report without a positioned neighbour says so instead of drawing an empty box;
* points on one spot are spread so each can be pointed at, and a lone point still gets a map
  of a sensible size.

Two tests change a real report in the network to get the case they check, which a demo
database holds or not depending on its seed: neighbours moved onto the node's own spot, and
neighbours without a position.

Screenshots (desktop, phone, a crowded map, an empty one) go to ``test-artifacts/reach-map*.png``.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    ARTIFACTS,
    PAGE_TIMEOUT_MS,
    LiveServer,
    query_of,
    wait_for_report,
)
from webapp.meshcore import has_gps

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

#: The window every map here is drawn for: the widest, so the small demo database has the
#: most links to draw.
DAYS = 30
PATH_CAPABLE = ("repeater", "room_server", "room")
Report = dict[str, Any]


# -- the served app -------------------------------------------------------------------------


@pytest.fixture
def served_config() -> dict[str, Any]:
    """Settings on top of the demo app's (a test class overrides this fixture)."""
    return {}


@pytest.fixture
def live_server(
    reach_app_factory: Callable[..., Any], served_config: dict[str, Any]
) -> Iterator[LiveServer]:
    """The webapp on the demo database on a real server (this replaces the small hand-built
    database of ``tests/test_browser.py`` for the ``page`` fixture used here)."""
    server = LiveServer(reach_app_factory(**served_config))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def dense_demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A denser demo database, where the busiest repeaters have dozens of links."""
    from tests.conftest import REACH_DEMO_NOW
    from webapp.demodb import write_demo_db

    path = tmp_path_factory.mktemp("reach-map") / "dense.sqlite"
    write_demo_db(path, nodes=800, observations=80_000, seed=7, now=REACH_DEMO_NOW)
    return path


# -- what the API says the map should hold --------------------------------------------------


def placed(item: dict[str, Any]) -> bool:
    return has_gps(item.get("lat"), item.get("lon"))


def expected_keys(report: Report) -> set[str]:
    """The pubkeys the map draws for ``report``: the node, its positioned links and its
    positioned direct observers - or nothing when no neighbour has a position."""
    neighbours = {
        item["pubkey"]
        for item in [*report["links"], *report["direct_observers"]]
        if placed(item)
    }
    return {report["node"]["pubkey"], *neighbours} if neighbours else set()


def fetch_report(server: LiveServer, pubkey: str) -> Report:
    status, report = server.get_json(f"/api/nodes/{pubkey}/reach?days={DAYS}")
    assert status == 200, (pubkey, report)
    return report


def visible_nodes(server: LiveServer) -> list[dict[str, Any]]:
    status, body = server.get_json("/api/nodes?limit=500")
    assert status == 200 and body["total"] == len(body["nodes"]), "more nodes than one page"
    return list(body["nodes"])


def relay_reports(server: LiveServer) -> list[Report]:
    """The reports of every visible path-capable node (the others have no links)."""
    return [
        fetch_report(server, node["pubkey"])
        for node in visible_nodes(server)
        if node["role"] in PATH_CAPABLE
    ]


def positioned_links(report: Report) -> list[dict[str, Any]]:
    return [link for link in report["links"] if placed(link)]


def link_and_observer(report: Report) -> set[str]:
    """Positioned pubkeys that are both a link and a direct observer of ``report``."""
    observers = {o["pubkey"] for o in report["direct_observers"] if placed(o)}
    return {link["pubkey"] for link in positioned_links(report)} & observers


def richest(reports: list[Report], node_placed: bool) -> Report:
    """The report with the most to draw among those whose node has (or lacks) a position;
    one with a link that is also a direct observer, and with a two-way link, first."""
    candidates = [r for r in reports if placed(r["node"]) == node_placed]
    assert candidates, f"the demo database has no relay with node_placed={node_placed}"
    return max(
        candidates,
        key=lambda r: (
            bool(link_and_observer(r)),
            any(link["bidir"] for link in positioned_links(r)),
            len(positioned_links(r)),
            r["node"]["pubkey"],
        ),
    )


# -- what the page drew ---------------------------------------------------------------------


def drawn_keys(tab: Any) -> list[str]:
    """``data-pubkey`` of every element inside the map's figure, in document order."""
    return list(tab.eval_on_selector_all(
        "figure.reach-map [data-pubkey]", "els => els.map(el => el.dataset.pubkey)"
    ))


def map_shot(tab: Any, name: str) -> Path:
    """A screenshot of the map's figure alone."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    tab.locator("figure.reach-map").screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def open_map(tab: Any, server: LiveServer, pubkey: str) -> None:
    tab.goto(f"{server.url}/?node={pubkey}&days={DAYS}")
    wait_for_report(tab, pubkey, DAYS)
    tab.wait_for_selector(f'figure.reach-map [data-pubkey="{pubkey}"], figure.reach-map '
                          ".map-empty:not([hidden])")


def line_of(tab: Any, pubkey: str) -> dict[str, Any]:
    """A neighbour's line: its classes, width, arrow and the points of its path."""
    line = tab.locator(f'figure.reach-map path.map-line[data-for="{pubkey}"]')
    assert line.count() == 1, f"{pubkey} has {line.count()} lines"
    found = dict(line.evaluate(
        """el => ({classes: [...el.classList], width: Number(el.getAttribute('stroke-width')),
                   arrow: el.getAttribute('marker-mid'), d: el.getAttribute('d')})"""
    ))
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", found.pop("d"))]
    found["points"] = list(zip(numbers[::2], numbers[1::2], strict=True))
    return found


def centre_of(tab: Any, selector: str) -> tuple[float, float]:
    """Where the map drew a marker, in the SVG's own units (its data-x and data-y)."""
    x, y = tab.locator(selector).evaluate("el => [Number(el.dataset.x), Number(el.dataset.y)]")
    return float(x), float(y)


def near(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return math.dist(a, b) < 0.1  # the path's coordinates are written to one decimal


def assert_map_matches(tab: Any, report: Report) -> None:
    """The figure draws exactly the node and the positioned neighbours of ``report``, one
    element each, with the right kind of line and a link to each neighbour's report."""
    keys = drawn_keys(tab)
    assert len(keys) == len(set(keys)), f"a pubkey drawn twice: {sorted(keys)}"
    assert set(keys) == expected_keys(report)
    node = report["node"]
    figure = tab.locator("figure.reach-map")
    caption = figure.locator("figcaption").inner_text()
    assert (node["name"] or node["pubkey"][:8]) in caption
    if not keys:  # nothing with a position: words, not an empty box
        assert figure.locator(".map-empty").inner_text().startswith("Nothing to map")
        assert figure.locator("svg.map").count() == 0
        return
    self_mark = figure.locator(f'svg .map-self[data-pubkey="{node["pubkey"]}"]')
    assert self_mark.count() == 1
    assert ("unplaced" in (self_mark.get_attribute("class") or "")) == (not placed(node))

    links = {link["pubkey"]: link for link in report["links"]}
    node_at = centre_of(tab, "svg.map .map-self")
    for pubkey in set(keys) - {node["pubkey"]}:
        mark = figure.locator(f'svg a[data-pubkey="{pubkey}"]')
        assert mark.get_attribute("href") == f"?node={pubkey}&days={DAYS}"
        line = line_of(tab, pubkey)
        link = links.get(pubkey)
        if link is None:
            assert "observer" in line["classes"]
        else:
            assert ("two-way" in line["classes"]) == link["bidir"]
            assert ("one-way" in line["classes"]) == (not link["bidir"])
        if link is not None and not link["bidir"]:
            # The line runs from the node that is heard to the node that hears it; its arrow,
            # half-way and turned along the line (orient="auto"), points at the hearer.
            other_at = centre_of(tab, f'svg.map a[data-pubkey="{pubkey}"]')
            heard, hearer = (other_at, node_at) if link["we_hear"] else (node_at, other_at)
            assert near(line["points"][0], heard) and near(line["points"][-1], hearer), line

    # The links left off the map are counted in words.
    note = figure.locator(".map-note").inner_text()
    unplaced = sum(1 for link in report["links"] if not placed(link))
    if unplaced:
        assert f"{unplaced} of {len(report['links'])} link" in note, note
    if not placed(node):
        assert "no position of its own" in note, note


# -- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("node_placed", [True, False], ids=["node-placed", "node-unplaced"])
def test_map_draws_the_node_and_its_positioned_neighbours(
    page: Any, live_server: LiveServer, node_placed: bool
) -> None:
    """One element per pubkey: the node (with or without a position of its own) and every
    link and direct observer with a position; a link that is also an observer is one."""
    report = richest(relay_reports(live_server), node_placed)
    assert len(positioned_links(report)) >= 3, "the demo database is too thin for this test"
    open_map(page, live_server, report["node"]["pubkey"])
    assert_map_matches(page, report)

    figure = page.get_by_role("figure", name=re.compile("^Map of"))
    assert figure.count() == 1  # its accessible name is the caption
    for both in link_and_observer(report):  # drawn once, as an observer on the link's line
        mark = figure.locator(f'svg [data-pubkey="{both}"]')
        assert "observer" in (mark.get_attribute("class") or "")
        assert mark.locator("rect.map-dot").count() == 1
    # Only the node is labelled; the rest is named on demand. (The other text: the scale.)
    labels = figure.locator("svg.map text").all_text_contents()
    assert len(labels) == 2 and labels[1] == report["node"]["name"], labels
    assert re.fullmatch(r"[\d,]+ k?m", labels[0]), labels  # the scale bar, drawn first
    if node_placed:
        # The map is fitted to its figure: a narrower window redraws it, with the same set.
        width = int(figure.locator("svg.map").get_attribute("width") or 0)
        page.set_viewport_size({"width": 820, "height": 900})
        page.wait_for_function(
            "w => Number(document.querySelector('svg.map').getAttribute('width')) < w",
            arg=width,
        )
        assert_map_matches(page, report)
        strongest = positioned_links(report)[0]
        figure.scroll_into_view_if_needed()
        figure.locator(f'svg a[data-pubkey="{strongest["pubkey"]}"]').hover()
        page.wait_for_selector(".map-tip:not([hidden])")
        map_shot(page, "reach-map")


def test_pointing_names_a_node_and_activating_opens_its_report(
    page: Any, live_server: LiveServer
) -> None:
    """Hover names a marker; a click, Enter and Space each open that node's report, which
    then has a map of its own; the URL follows, as for the links in the table."""
    report = richest(relay_reports(live_server), node_placed=True)
    start = report["node"]["pubkey"]
    targets = positioned_links(report)[:3]
    assert len(targets) == 3, "the demo database is too thin for this test"
    open_map(page, live_server, start)
    figure = page.locator("figure.reach-map")

    # Pointing names it: the tooltip, and the marker's title and accessible name.
    first = targets[0]
    mark = figure.locator(f'svg a[data-pubkey="{first["pubkey"]}"]')
    figure.scroll_into_view_if_needed()
    mark.hover()
    tip = figure.locator(".map-tip")
    tip.wait_for(state="visible")
    assert first["name"] and first["name"] in tip.inner_text()
    assert f"bottleneck {first['bottleneck']}" in tip.inner_text()
    assert first["name"] in mark.locator("title").text_content()
    assert page.get_by_role("link", name=re.compile(re.escape(first["name"]))).count() >= 1

    # A click opens it.
    mark.click()
    wait_for_report(page, first["pubkey"], DAYS)
    assert query_of(page) == {"node": first["pubkey"], "days": str(DAYS)}
    assert_map_matches(page, fetch_report(live_server, first["pubkey"]))

    # Keyboard: Tab from the window menu reaches a marker; Enter opens a focused one.
    page.go_back()
    wait_for_report(page, start, DAYS)
    page.get_by_label("Window", exact=True).focus()
    page.keyboard.press("Tab")
    focused = page.evaluate("() => document.activeElement.closest('svg.map [data-pubkey]')"
                            " ? document.activeElement.dataset.pubkey : null")
    assert focused in expected_keys(report) - {start}, focused
    tip.wait_for(state="visible")  # focus names it too
    second = targets[1]
    figure.locator(f'svg a[data-pubkey="{second["pubkey"]}"]').focus()
    page.keyboard.press("Enter")
    wait_for_report(page, second["pubkey"], DAYS)

    # Space opens a focused one as well.
    page.go_back()
    wait_for_report(page, start, DAYS)
    third = targets[2]
    figure.locator(f'svg a[data-pubkey="{third["pubkey"]}"]').focus()
    page.keyboard.press("Space")
    wait_for_report(page, third["pubkey"], DAYS)
    assert query_of(page) == {"node": third["pubkey"], "days": str(DAYS)}


def test_the_node_is_named_when_pointed_at_and_is_no_tab_stop(
    page: Any, live_server: LiveServer
) -> None:
    """The node's own marker names it when pointed at, like the others, and is a named
    graphic for assistive technology; it is no tab stop, since its report is the one on the
    page: tabbing through the map visits every neighbour's marker and never the node's."""
    report = richest(relay_reports(live_server), node_placed=True)
    node = report["node"]
    open_map(page, live_server, node["pubkey"])
    figure = page.locator("figure.reach-map")
    mark = figure.locator(f'svg .map-self[data-pubkey="{node["pubkey"]}"]')
    figure.scroll_into_view_if_needed()
    mark.locator(".map-self-dot").hover()
    tip = figure.locator(".map-tip")
    tip.wait_for(state="visible")
    assert node["name"] in tip.inner_text() and "the node of this report" in tip.inner_text()
    assert figure.get_by_role("img", name=re.compile(re.escape(node["name"]))).count() == 1
    assert mark.get_attribute("tabindex") is None

    neighbours = expected_keys(report) - {node["pubkey"]}
    figure.locator("svg.map a[data-pubkey]").first.focus()
    visited: list[str] = []
    for _ in range(len(neighbours) + 1):  # one Tab more than there are neighbours
        focused = page.evaluate("() => document.activeElement.closest('svg.map')"
                                " ? document.activeElement.dataset.pubkey : null")
        if focused is None:
            break
        visited.append(focused)
        page.keyboard.press("Tab")
    assert focused is None, "the focus never left the map"
    assert sorted(visited) == sorted(neighbours)


@pytest.mark.parametrize("hearer", ["node", "neighbour"])
def test_a_one_way_arrow_points_at_the_node_that_hears(
    page: Any, live_server: LiveServer, hearer: str
) -> None:
    """A one-way link the node hears (we_hear) and one that hears the node (they_hear): each
    line runs towards, and its arrow points at, the one that hears (``assert_map_matches``
    checks every one-way line of a map this way)."""
    def hears(link: dict[str, Any]) -> bool:
        return not link["bidir"] and bool(link["we_hear" if hearer == "node" else "they_hear"])

    reports = [r for r in relay_reports(live_server) if any(map(hears, positioned_links(r)))]
    assert reports, f"the demo database has no positioned one-way link heard by the {hearer}"
    report = reports[0]
    open_map(page, live_server, report["node"]["pubkey"])
    assert_map_matches(page, report)
    arrow = page.locator("figure.reach-map svg.map marker#reach-map-arrow")
    assert arrow.get_attribute("orient") == "auto"


def marker_centres(tab: Any) -> dict[str, tuple[float, float]]:
    """Where each drawn pubkey's marker is on the screen (the centre of its bounding box)."""
    boxes = tab.eval_on_selector_all(
        "svg.map [data-pubkey]",
        """els => els.map(el => {
               const dot = el.querySelector('.map-dot, .map-self-dot').getBoundingClientRect();
               return [el.dataset.pubkey, dot.x + dot.width / 2, dot.y + dot.height / 2];
           })""",
    )
    return {key: (x, y) for key, x, y in boxes}


@pytest.mark.parametrize("neighbours", [1, 6])
def test_points_on_one_spot_are_spread_and_a_lone_point_fits(
    page: Any, live_server: LiveServer, neighbours: int
) -> None:
    """A real report whose positioned neighbours are moved (in the network, on the way to the
    page) onto the node's own spot: every marker still has a place of its own, inside the
    map, and the map keeps a sensible size instead of zooming into nothing."""
    report = richest(relay_reports(live_server), node_placed=True)
    node = report["node"]
    moved = positioned_links(report)[:neighbours]
    assert len(moved) == neighbours, "the demo database is too thin for this test"
    keep = {link["pubkey"] for link in moved}
    crafted = {
        **report,
        "links": [{**link, "lat": node["lat"], "lon": node["lon"]} for link in moved],
        "direct_observers": [o for o in report["direct_observers"] if o["pubkey"] in keep],
    }
    page.route(
        re.compile(rf".*/api/nodes/{node['pubkey']}/reach.*"),
        lambda route: route.fulfill(status=200, content_type="application/json",
                                    body=json.dumps(crafted)),
    )
    open_map(page, live_server, node["pubkey"])
    assert set(drawn_keys(page)) == expected_keys(crafted) == {node["pubkey"], *keep}
    svg = page.locator("svg.map").bounding_box()
    assert svg is not None and svg["height"] >= 200, svg
    centres = marker_centres(page)
    for key, (x, y) in centres.items():
        assert svg["x"] < x < svg["x"] + svg["width"] and svg["y"] < y < svg["y"] + svg["height"]
        for other, (ox, oy) in centres.items():
            if other != key:
                assert math.hypot(x - ox, y - oy) >= 10, (key, other)
    # The node keeps its place; the others ring it.
    nx, ny = centres[node["pubkey"]]
    assert abs(nx - (svg["x"] + svg["width"] / 2)) < 2


def _has_positioned_neighbours(report: Report) -> bool:
    return bool(expected_keys(report))


@pytest.mark.parametrize("kind", ["neighbours-unplaced", "no-neighbours"])
def test_report_without_positioned_neighbour_says_so(
    page: Any, live_server: LiveServer, kind: str
) -> None:
    """No neighbour with a position: words instead of an empty box, nothing with a pubkey."""
    if kind == "neighbours-unplaced":
        # A real report whose neighbours lose their positions on the way to the page (half
        # without one, half at the firmware's "no fix" 0, 0): whether the demo database holds
        # such a report of its own depends on its seed.
        real = richest(relay_reports(live_server), node_placed=True)
        report = {
            **real,
            **{part: [{**item, "lat": None if i % 2 else 0.0, "lon": None if i % 2 else 0.0}
                      for i, item in enumerate(real[part])]
               for part in ("links", "direct_observers")},
        }
        assert report["links"] and not _has_positioned_neighbours(report)
        page.route(
            re.compile(rf".*/api/nodes/{real['node']['pubkey']}/reach.*"),
            lambda route: route.fulfill(status=200, content_type="application/json",
                                        body=json.dumps(report)),
        )
    else:
        companions = [n for n in visible_nodes(live_server) if n["role"] == "companion"]
        report = fetch_report(live_server, companions[0]["pubkey"])
        assert not report["links"] and not report["direct_observers"]
    open_map(page, live_server, report["node"]["pubkey"])
    figure = page.locator("figure.reach-map")
    empty = figure.locator(".map-empty")
    assert empty.is_visible()
    assert empty.inner_text().startswith("Nothing to map")
    if kind == "neighbours-unplaced":
        assert f"{len(report['links'])} link" in empty.inner_text()
    assert figure.locator("svg.map").count() == 0
    assert figure.locator(".map-frame").is_hidden()
    assert figure.locator(".map-legend").is_hidden()
    assert drawn_keys(page) == [] and expected_keys(report) == set()
    if kind == "neighbours-unplaced":
        map_shot(page, "reach-map-empty")


def test_map_on_a_phone(browser: Any, live_server: LiveServer) -> None:
    """Phone-sized: the map fits the screen, its markers are finger-sized, it holds the same
    set as on a desktop, and the page never reaches outside the app."""
    report = richest(relay_reports(live_server), node_placed=True)
    context = browser.new_context(
        viewport={"width": 375, "height": 740}, device_scale_factor=2, is_mobile=True,
        has_touch=True,
    )
    urls: list[str] = []
    try:
        tab = context.new_page()
        tab.set_default_timeout(PAGE_TIMEOUT_MS)
        tab.on("request", lambda request: urls.append(request.url))
        open_map(tab, live_server, report["node"]["pubkey"])
        assert_map_matches(tab, report)
        overflow = tab.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page is {overflow}px wider than the screen"
        svg = tab.locator("figure.reach-map svg.map").bounding_box()
        assert svg is not None and svg["width"] <= 375 and svg["height"] >= 200, svg
        for box in tab.eval_on_selector_all(
            "svg.map a[data-pubkey]",
            "els => els.map(el => { const b = el.getBoundingClientRect();"
            " return [b.width, b.height] })",
        ):
            assert min(box) >= 24, f"a marker smaller than a fingertip: {box}"
        map_shot(tab, "reach-map-phone")
    finally:
        context.close()
    assert [u for u in urls if not u.startswith(live_server.url + "/")] == []


class TestCrowdedMap:
    """A repeater with dozens of links, on the denser demo database."""

    @pytest.fixture
    def served_config(self, dense_demo_db: Path) -> dict[str, Any]:
        return {"REACH_DB": str(dense_demo_db)}

    def test_dozens_of_links_stay_readable(
        self, page: Any, live_server: LiveServer, dense_demo_db: Path
    ) -> None:
        """Only the node is labelled; the line of a two-way link is the thicker the higher
        its bottleneck; one-way lines are dashed with an arrow; every marker is drawn."""
        # The relay with the most positioned links (more nodes than /api/nodes pages at once,
        # so the relays are read from the file).
        con = sqlite3.connect(dense_demo_db)
        try:
            relays = [key for (key,) in con.execute(
                "SELECT public_key FROM nodes WHERE role IN (?, ?, ?) ORDER BY public_key",
                PATH_CAPABLE,
            )]
        finally:
            con.close()
        report = max((fetch_report(live_server, key) for key in relays),
                     key=lambda r: (len(positioned_links(r)), r["node"]["pubkey"]))
        busiest = report["node"]["pubkey"]
        assert len(positioned_links(report)) >= 24, "not a crowded report"
        open_map(page, live_server, busiest)
        assert_map_matches(page, report)
        assert page.locator("figure.reach-map svg.map text").count() == 2  # node + scale

        two_way = sorted(
            (link for link in positioned_links(report) if link["bidir"]),
            key=lambda link: link["bottleneck"],
        )
        assert len({link["bottleneck"] for link in two_way}) >= 2, "no spread of bottlenecks"
        widths = [line_of(page, link["pubkey"])["width"] for link in two_way]
        assert widths == sorted(widths), list(zip(
            [link["bottleneck"] for link in two_way], widths, strict=True))
        assert widths[-1] > widths[0]
        for link in positioned_links(report):
            if not link["bidir"]:
                line = line_of(page, link["pubkey"])
                assert line["arrow"] == "url(#reach-map-arrow)"
                assert line["width"] <= widths[0]
        map_shot(page, "reach-map-dense")


class TestHiddenNodes:
    """A blacklisted pubkey and a hidden name prefix, both chosen from the busiest report's
    positioned links, vanish from that report's map (the server leaves them out)."""

    @pytest.fixture
    def chosen(self, reach_app_factory: Callable[..., Any]) -> dict[str, Any]:
        """The target, the pubkey to blacklist and the link to hide by its name, read from the
        unfiltered demo app."""
        server = LiveServer(reach_app_factory())
        try:
            report = richest(relay_reports(server), node_placed=True)
        finally:
            server.close()
        target = report["node"]
        links = positioned_links(report)
        blacklisted = links[0]
        named = [link for link in links[1:]
                 if link["name"] and not target["name"].lower().startswith(link["name"].lower())]
        assert named, "no second positioned link with a name"
        return {"report": report, "blacklisted": blacklisted, "hidden": named[0]}

    @pytest.fixture
    def served_config(self, chosen: dict[str, Any]) -> dict[str, Any]:
        return {
            "REACH_BLACKLIST": chosen["blacklisted"]["pubkey"],
            "REACH_HIDDEN_PREFIXES": chosen["hidden"]["name"],
        }

    def test_hidden_and_blacklisted_never_on_the_map(
        self, page: Any, live_server: LiveServer, chosen: dict[str, Any]
    ) -> None:
        target = chosen["report"]["node"]["pubkey"]
        gone = {chosen["blacklisted"]["pubkey"], chosen["hidden"]["pubkey"]}
        assert gone <= expected_keys(chosen["report"])  # on the map before they were hidden
        report = fetch_report(live_server, target)
        open_map(page, live_server, target)
        assert_map_matches(page, report)
        assert not gone & set(drawn_keys(page))
        for pubkey in gone:
            assert page.locator(f'[data-pubkey="{pubkey}"]').count() == 0
        # Nor are they named anywhere on the map: every marker's name is a visible node's.
        titles = page.locator("figure.reach-map svg.map title").all_text_contents()
        named = {title.split("; ")[0].split(" (")[0] for title in titles}
        assert chosen["hidden"]["name"] not in named
        assert chosen["blacklisted"]["name"] not in named
        assert len(titles) == len(expected_keys(report))
