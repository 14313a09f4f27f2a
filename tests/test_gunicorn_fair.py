"""Fair admission under a real gunicorn ``-k gthread`` (one worker) on 127.0.0.1.

design:

    The servers are ``tests/test_gunicorn.py``'s (the slow app, whose builds wait on a gate
    the test opens; ``REACHLIMIT_WAIT`` 30 s, so no queued request leaves by timing out while
    a test runs), started and stopped by PID the same way. Clients are told apart two ways:

    addresses   each client's sockets are bound to a loopback address of its own
                (``source_address=("127.0.0.3", 0)``): the server sees it as the peer,
                ``REMOTE_ADDR``, the extension's default client.
    proxy       every connection comes from 127.0.0.1, as from a proxy on the same host,
                with an ``X-Forwarded-For`` header; the app trusts one proxy, as the reach
                service does with ``REACH_PROXIES=1`` (:func:`proxied_app`: the slow app
                wrapped by ``webapp.trust_proxies``), so the rightmost entry is the client.

    The reach service itself (``webapp/gunicorn.conf.py``, ``webapp.wsgi:app``) is started
    only to see a bad ``REACH_PROXIES`` stop its master with one line.

    Arrival order is made certain by waiting, before each next request, until the server's
    figures count the one before. Each claim is an ordering read back from the server - the
    polite request is waiting in the queue (not refused) while both builds are still held -
    never a duration.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from flask import Flask

from tests.support import HOST
from tests.support.clients import CLIENT_TIMEOUT, Reply, check_refusal
from tests.support.fair_app import DISPLACED, QUEUE_FULL
from tests.support.gunicorn_server import reach_service, serving
from tests.support.threads import Outcome, ThreadRunner, start_call
from tests.support.waiting import DEADLINE, wait_until
from tests.test_gunicorn import THREADS, Gunicorn, held_gate

pytestmark = [pytest.mark.gunicorn, pytest.mark.timeout(120)]

#: gunicorn's spec of the slow app behind trusted proxies (REACH_PROXIES in its environment).
PROXIED_APP = "tests.test_gunicorn_fair:proxied_app()"

CRAWLER_SOURCE, POLITE_SOURCE = "127.0.0.2", "127.0.0.3"
CRAWLER_ADDR, POLITE_ADDR = "198.51.100.7", "203.0.113.9"


def proxied_app() -> Flask:
    """The slow app, trusting ``REACH_PROXIES`` proxies exactly as the reach service does."""
    from tests.apps.slow_app import create_app
    from webapp import proxy_count, trust_proxies

    app = create_app()
    trust_proxies(app, proxy_count(os.environ.get("REACH_PROXIES", "0")))
    return app


def get_from(
    port: int, path: str, source: str | None = None, headers: Mapping[str, str] | None = None
) -> Reply:
    """One GET on its own connection, from the loopback address ``source`` (default: the
    system's choice, 127.0.0.1), closed afterwards."""
    conn = http.client.HTTPConnection(
        HOST, port, timeout=CLIENT_TIMEOUT,
        source_address=(source, 0) if source is not None else None,
    )
    try:
        conn.request("GET", path, headers=dict(headers or {}))
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


# -- the servers ------------------------------------------------------------------------------


def start(tmp_path_factory: pytest.TempPathFactory, name: str, proxies: int
          ) -> Iterator[Gunicorn]:
    server = Gunicorn(tmp_path_factory.mktemp(name), THREADS, name, ())
    if proxies:
        server.app = PROXIED_APP
        server.env["REACH_PROXIES"] = str(proxies)
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def by_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    yield from start(tmp_path_factory, "fair-addresses", proxies=0)


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    yield from start(tmp_path_factory, "fair-proxy", proxies=1)


# -- the scenario -----------------------------------------------------------------------------

#: send(server, path, n): the n-th request of one client (0, 1, ...), as that client sends it.
Send = Callable[[Gunicorn, str, int], Reply]


def crawler_cannot_keep_the_polite_one_out(
    server: Gunicorn, threads: ThreadRunner, crawler: Send, polite: Send
) -> None:
    """The crawler takes both slots and all eight queue places; one more of its requests is
    refused at once; the polite client's request takes the crawler's newest place (that one
    gets 429 + Retry-After, "displaced") and is served once the builds go on."""
    with held_gate(server):
        before = server.health()
        waiting: list[Outcome] = []
        for n in range(10):
            path = server.path(f"crawl{n}")
            waiting.append(
                start_call(threads, lambda p=path, n=n: crawler(server, p, n), name=path)
            )
            wait_until(
                f"crawler request {n} counted",
                lambda n=n: (lambda h: h["active"] + h["queued"] == n + 1)(server.health()),
            )
        assert server.builds()["in_flight"] == 2

        refused = crawler(server, server.path("crawl-more"), 10)
        check_refusal(refused)
        assert refused.json()["error"] == QUEUE_FULL
        after_full = server.health()
        assert after_full["rejected_full"] - before["rejected_full"] == 1
        assert after_full["displaced"] == before["displaced"]

        polite_path = server.path("polite")
        welcome = start_call(threads, lambda: polite(server, polite_path, 0), name="polite")
        wait_until(
            "the crawler's newest place taken over",
            lambda: server.health()["displaced"] - before["displaced"] == 1,
        )
        newest = waiting.pop()
        newest.wait_done(DEADLINE)
        assert newest.error is None, newest.error
        check_refusal(newest.value)
        assert newest.value.json()["error"] == DISPLACED
        # The polite request waits in the queue while both builds are still held.
        during, figures = server.health(), server.builds()
        assert (during["active"], during["queued"]) == (2, 8)
        assert figures["in_flight"] == 2 and not figures["gate_open"]
        assert not welcome.done.is_set()

        server.release()
        welcome.wait_done(DEADLINE)
        assert welcome.error is None, welcome.error
        assert welcome.value.status == 200
        assert welcome.value.json()["key"] == polite_path.rsplit("/", 1)[1]
        for outcome in waiting:
            outcome.wait_done(DEADLINE)
            assert outcome.error is None, outcome.error
            assert outcome.value.status == 200

    after = server.health()
    assert after["displaced"] - before["displaced"] == 1
    assert after["rejected_full"] - before["rejected_full"] == 1
    assert after["rejected_timeout"] == before["rejected_timeout"]
    assert after["acquired"] - before["acquired"] == 10  # nine crawler builds and the polite one


def test_clients_are_told_apart_by_their_source_address(
    by_address: Gunicorn, threads: ThreadRunner
) -> None:
    def crawler(server: Gunicorn, path: str, n: int) -> Reply:
        # Without trusted proxies a forwarded-for header is ignored: each request claims
        # another address, and all of them are still the one crawler.
        return get_from(server.port, path, CRAWLER_SOURCE, {"X-Forwarded-For": f"10.0.0.{n}"})

    def polite(server: Gunicorn, path: str, n: int) -> Reply:
        return get_from(server.port, path, POLITE_SOURCE)

    crawler_cannot_keep_the_polite_one_out(by_address, threads, crawler, polite)


def test_one_address_alone_is_plain_fifo(by_address: Gunicorn, threads: ThreadRunner) -> None:
    """Two clients on one source address are one client: the second is refused, never
    displacing the first."""
    server = by_address
    with held_gate(server) as held:
        before = server.health()
        herd = held.herd([server.path(f"one{i}") for i in range(10)])
        wait_until("2 active and 8 queued",
                   lambda: (lambda h: (h["active"], h["queued"]) == (2, 8))(server.health()))
        refused = get_from(server.port, server.path("same"), HOST)
        check_refusal(refused)
        assert refused.json()["error"] == QUEUE_FULL
        assert server.health()["displaced"] == before["displaced"]
        server.release()
        assert [r.status for r in herd.results()] == [200] * 10


def test_behind_one_trusted_proxy_the_rightmost_hop_is_the_client(
    behind_proxy: Gunicorn, threads: ThreadRunner
) -> None:
    def crawler(server: Gunicorn, path: str, n: int) -> Reply:
        # A fresh spoofed leftmost entry on every request: still the one crawler.
        forwarded = f"192.0.2.{n + 1}, {CRAWLER_ADDR}"
        return get_from(server.port, path, None, {"X-Forwarded-For": forwarded})

    def polite(server: Gunicorn, path: str, n: int) -> Reply:
        # Claims to be the crawler on the left; the proxy's entry (rightmost) says otherwise.
        forwarded = f"{CRAWLER_ADDR}, {POLITE_ADDR}"
        return get_from(server.port, path, None, {"X-Forwarded-For": forwarded})

    crawler_cannot_keep_the_polite_one_out(behind_proxy, threads, crawler, polite)


def test_behind_the_proxy_the_peer_address_no_longer_counts(
    behind_proxy: Gunicorn, threads: ThreadRunner
) -> None:
    """Requests from two source addresses that the proxy forwarded for one client are one
    client: the rightmost forwarded-for entry decides, not the connection."""
    server = behind_proxy
    forwarded = {"X-Forwarded-For": CRAWLER_ADDR}
    with held_gate(server):
        waiting: list[Outcome] = []
        for n in range(10):
            path = server.path(f"peer{n}")
            waiting.append(start_call(
                threads, lambda p=path: get_from(server.port, p, CRAWLER_SOURCE, forwarded),
                name=path,
            ))
        wait_until("2 active and 8 queued",
                   lambda: (lambda h: (h["active"], h["queued"]) == (2, 8))(server.health()))
        before = server.health()
        refused = get_from(server.port, server.path("peer-other"), POLITE_SOURCE, forwarded)
        check_refusal(refused)
        assert refused.json()["error"] == QUEUE_FULL
        assert server.health()["displaced"] == before["displaced"]
        server.release()
        for outcome in waiting:
            outcome.wait_done(DEADLINE)
            assert outcome.error is None, outcome.error
            assert outcome.value.status == 200


# -- the reach service: REACH_PROXIES ---------------------------------------------------------


@pytest.mark.parametrize("value", ["two", "-1"])
def test_a_bad_reach_proxies_stops_the_reach_service_with_one_line(
    tmp_path: Path, reach_demo_db: Path, value: str
) -> None:
    server = reach_service(tmp_path, reach_demo_db, "bad-proxies", env={"REACH_PROXIES": value})
    with pytest.raises(RuntimeError, match="did not come up"):
        server.start()
    assert server.processes_gone()
    stderr = server.stderr()
    line = f"webapp: REACH_PROXIES must be a whole number >= 0, got {value!r}"
    assert [text for text in stderr.splitlines() if "REACH_PROXIES" in text] == [line], stderr
    assert "Traceback" not in stderr, stderr
