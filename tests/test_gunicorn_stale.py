"""Stale answers under a real gunicorn ``-k gthread`` (one worker) on 127.0.0.1.

design:

    The server is ``tests/test_gunicorn.py``'s slow app (builds wait on a gate the test opens;
    ``REACHLIMIT_WAIT`` 30 s) with a 1 s TTL and a 60 s stale window. The only wait on time
    is for that TTL to end (an entry cannot be made stale inside another process any other
    way), counted from the moment its answer arrived: the server stored the entry before it
    sent the answer, on the same monotonic clock (Linux's, shared by every process), so
    whatever a loaded machine delays, the entry is stale once TTL has passed since then;
    every claim is an ordering read back from the server: a refresh is "still held"
    because the server's ``/debug/builds`` says a build waits on the closed gate.

    - keep-alive: nginx's background update holds up the next request on the connection
      that started it; here a refresh runs on a refresher thread, so the same connection's
      next request is answered while that refresh is still held.
    - a crawler (its own loopback source address) holds both slots and fills the queue; a
      popular report past its TTL is still answered 200 (stale) to another client, and its
      refresh, a client of its own in the fair queue, takes a place from the crawler and is
      built as soon as the gate opens.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest

from tests.support import HOST
from tests.support.clients import CLIENT_TIMEOUT, http_request
from tests.support.waiting import wait_until
from tests.test_gunicorn import THREADS, Gunicorn, held_gate

pytestmark = [pytest.mark.gunicorn, pytest.mark.timeout(120)]

TTL = 1.0
READER = "127.0.0.3"  # the crawl comes from 127.0.0.1: another client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    from tests.support.gunicorn_server import serving

    srv = Gunicorn(tmp_path_factory.mktemp("stale"), THREADS, "stale", ())
    srv.env.update({"REACHLIMIT_CACHE_TTL": str(TTL), "REACHLIMIT_STALE": "60"})
    with serving(srv):
        yield srv


def past_ttl(answered: float) -> None:
    """Wait until an entry whose answer had arrived at ``answered`` (monotonic, read after
    the answer) is stale: the server stored it before sending that answer."""
    wait_until("the TTL to end", lambda: time.monotonic() > answered + TTL, interval=0.01)


def held_builds(server: Gunicorn, n: int) -> None:
    wait_until(f"{n} build(s) held at the gate", lambda: server.builds()["in_flight"] == n)


def test_a_keep_alive_client_is_not_held_up_by_the_refresh_it_started(server: Gunicorn) -> None:
    path = server.path("keepalive")
    conn = http.client.HTTPConnection(HOST, server.port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request("GET", path)
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        answered = time.monotonic()  # the entry was stored before its answer was sent
        assert first.getheader("Cache-Status") == "reachlimit; fwd=uri-miss; stored"
        sock = conn.sock
        past_ttl(answered)
        with held_gate(server):
            conn.request("GET", path)
            stale = conn.getresponse()
            assert stale.status == 200 and b'"build":1' in stale.read().replace(b" ", b"")
            assert stale.getheader("Cache-Status", "").startswith("reachlimit; hit; ttl=-")
            held_builds(server, 1)  # the refresh it started waits at the gate
            conn.request("GET", path)  # the same connection, while that refresh is held
            again = conn.getresponse()
            assert again.status == 200 and again.read()
            assert again.getheader("Cache-Status", "").startswith("reachlimit; hit; ttl=-")
            assert conn.sock is sock  # one connection all along: kept alive
            assert server.builds()["in_flight"] == 1 and not server.builds()["gate_open"]
        # Gate open: the refresh ends and the report is fresh again.
        def fresh() -> bool:
            reply = http_request(server.port, "GET", path)
            return bool(reply.status == 200 and reply.json()["build"] == 2
                        and "ttl=-" not in reply.headers["cache-status"])

        wait_until("the refreshed report", fresh)
    finally:
        conn.close()


def test_popular_reports_stay_200_and_refreshed_while_a_crawler_fills_the_queue(
    server: Gunicorn,
) -> None:
    popular = [server.path(f"popular{i}") for i in range(3)]
    for path in popular:
        assert http_request(server.port, "GET", path, source=READER).status == 200
    answered = time.monotonic()  # every entry was stored before its answer was sent
    before = server.builds()["total"]
    past_ttl(answered)
    with held_gate(server) as held:
        crawl = held.herd([server.path(f"crawl{i}") for i in range(10)])
        wait_until(
            "the crawler holding 2 slots and 8 places",
            lambda: (lambda h: h["active"] == 2 and h["queued"] == 8)(server.health()),
        )
        for _ in range(3):
            for path in popular:
                reply = http_request(server.port, "GET", path, source=READER)
                assert reply.status == 200, reply
                assert reply.headers["cache-status"].startswith("reachlimit; hit; ttl=-")
        # The refreshes asked the limiter as a client of their own: fair admission gave them
        # places taken from the crawler, which holds the most.
        wait_until("the refreshes queued", lambda: server.health()["displaced"] >= 1)
    crawl.join()
    refused = [r for r in crawl.results() if r.status == 429]
    assert refused, "a crawler's place must have gone to a refresh"

    def refreshed() -> bool:
        replies = [http_request(server.port, "GET", p, source=READER) for p in popular]
        return all(r.status == 200 and "ttl=-" not in r.headers["cache-status"] for r in replies)

    wait_until("every popular report refreshed", refreshed)
    assert server.builds()["total"] - before >= 10 + 1  # the crawl's builds and refreshes
