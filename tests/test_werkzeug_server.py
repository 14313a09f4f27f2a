"""The client-gone path under Werkzeug's threaded server (``environ["werkzeug.socket"]``).

design:

    The server runs in this process: ``werkzeug.serving.make_server(..., threaded=True)`` on
    127.0.0.1 port 0, ``serve_forever`` in a thread; shut down and joined (with a timeout) at
    teardown (``tests.support.werkzeug_server.werkzeug_serving``). The test holds every build
    slot itself, by acquiring the app's limiter directly, so requests can only queue; raw
    socket clients send a whole GET, sit in the queue, and close. While the test holds the
    slots and the wait is 30 s, the only way out of the queue is a cancellation: the checks are
    on what happened, and the delay from a close to its place coming back is printed, never
    asserted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import uuid

import pytest
from flask import Flask

from reachlimit import ColdLimiter, Grant
from tests.apps.slow_app import create_app
from tests.support import clients
from tests.support.clients import Reply, close_one_by_one
from tests.support.limiter import slots_held
from tests.support.waiting import DEADLINE, wait_until
from tests.support.werkzeug_server import WerkzeugServer, werkzeug_serving


def raw_client(port: int, path: str) -> socket.socket:
    return clients.raw_client(port, path, timeout=DEADLINE)


def get(port: int, path: str) -> Reply:
    return clients.http_request(port, "GET", path, timeout=DEADLINE)


def serving(app: Flask) -> contextlib.AbstractContextManager[WerkzeugServer]:
    return werkzeug_serving(app, join_timeout=10)


def limiter_of(app: Flask) -> ColdLimiter:
    limiter = app.extensions["reachlimit"].path.limiter
    assert isinstance(limiter, ColdLimiter)
    return limiter


def all_slots_held(app: Flask) -> contextlib.AbstractContextManager[list[Grant]]:
    return slots_held(limiter_of(app))


def key() -> str:
    return uuid.uuid4().hex[:12]


def test_clients_that_leave_the_queue_free_their_places(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    app = create_app(REACHLIMIT_WAIT=30)
    limiter = limiter_of(app)
    with serving(app) as server, all_slots_held(app):
        port = server.port
        paths = [f"/report/gone-{key()}" for _ in range(limiter.capacity_queue)]
        sockets = []
        try:
            for n, path in enumerate(paths, start=1):
                sockets.append(raw_client(port, path))

                def queued(n: int = n) -> bool:
                    return limiter.stats().queued == n

                wait_until(f"{n} queued", queued)

            # The queue is full: one more leader is refused at once.
            status, headers, body = get(port, f"/report/late-{key()}")
            assert status == 429
            assert headers["retry-after"] == "2"
            assert json.loads(body)["retryAfter"] == 2

            before = limiter.stats()

            def place_back(n: int) -> bool:
                s = limiter.stats()
                return s.cancelled - before.cancelled == n and s.queued == before.queued - n

            delays = close_one_by_one(sockets, place_back)
        finally:
            for sock in sockets:
                sock.close()
        print(
            "werkzeug: client close -> queue place back: "
            + ", ".join(f"{d * 1000:.1f} ms" for d in delays)
        )

        after = limiter.stats()
        assert after.queued == 0
        assert after.cancelled - before.cancelled == len(paths)
        assert after.rejected_timeout == before.rejected_timeout
        assert after.active == limiter.capacity_active  # still ours

        def logged_499() -> bool:
            lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
            return all(any(p in line and '" 499 ' in line for line in lines) for p in paths)

        wait_until("a 499 log line for every client that left", logged_499)
        assert app.extensions["slow_app"].figures()["total"] == 0  # nobody built

    # The slots are back: the places the leavers gave up are really free again.
    with serving(app) as server:
        port = server.port
        status, _, body = get(port, "/report/after")
        assert status == 200
        assert json.loads(body)["key"] == "after"
    final = limiter.stats()
    assert (final.active, final.queued) == (0, 0)


def test_without_cancel_on_disconnect_a_leaver_waits_out_its_time() -> None:
    """REACHLIMIT_CANCEL_ON_DISCONNECT=false: the socket is not watched, so a client that
    left keeps its place until the (short) wait ends, and is counted as a timeout."""
    app = create_app(REACHLIMIT_WAIT="0.3", REACHLIMIT_CANCEL_ON_DISCONNECT="false")
    limiter = limiter_of(app)
    with serving(app) as server, all_slots_held(app):
        port = server.port
        before = limiter.stats()
        sockets = []
        try:
            for _ in range(3):
                sockets.append(raw_client(port, f"/report/gone-{key()}"))
        finally:
            for sock in sockets:
                sock.close()
        wait_until(
            "three timeouts",
            lambda: limiter.stats().rejected_timeout - before.rejected_timeout == 3,
        )
        after = limiter.stats()
        assert after.cancelled == before.cancelled
        assert after.queued == 0
