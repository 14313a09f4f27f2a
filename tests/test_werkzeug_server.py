"""The client-gone path under Werkzeug's threaded server (``environ["werkzeug.socket"]``).

design:

    The server runs in this process: ``werkzeug.serving.make_server(..., threaded=True)`` on
    127.0.0.1 port 0, ``serve_forever`` in a thread; shut down and joined (with a timeout) at
    teardown. The test holds every build slot itself, by acquiring the app's limiter directly,
    so requests can only queue; raw socket clients send a whole GET, sit in the queue, and
    close. While the test holds the slots and the wait is 30 s, the only way out of the queue
    is a cancellation: the checks are on what happened, and the delay from a close to its
    place coming back is printed, never asserted.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import BaseWSGIServer, make_server

from reachlimit import ColdLimiter, Grant

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the test app lives in tests/apps, beside this file
    sys.path.insert(0, str(ROOT))

from tests.apps.slow_app import create_app  # noqa: E402

HOST = "127.0.0.1"
DEADLINE = 20.0


def wait_until(
    what: str, probe: Callable[[], Any], timeout: float = DEADLINE, interval: float = 0.002
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(interval)


def raw_client(port: int, path: str) -> socket.socket:
    """A bare socket that has sent a whole GET for ``path`` and reads nothing."""
    sock = socket.create_connection((HOST, port), timeout=DEADLINE)
    request = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode("ascii"))
    return sock


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=DEADLINE)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@contextlib.contextmanager
def serving(app: Flask) -> Iterator[BaseWSGIServer]:
    server = make_server(HOST, 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="werkzeug-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
        assert not thread.is_alive()


def limiter_of(app: Flask) -> ColdLimiter:
    limiter = app.extensions["reachlimit"].path.limiter
    assert isinstance(limiter, ColdLimiter)
    return limiter


@contextlib.contextmanager
def all_slots_held(app: Flask) -> Iterator[list[Grant]]:
    limiter = limiter_of(app)
    grants = [limiter.acquire() for _ in range(limiter.capacity_active)]
    try:
        yield grants
    finally:
        for grant in grants:
            grant.__exit__(None, None, None)


def key() -> str:
    return uuid.uuid4().hex[:12]


def test_clients_that_leave_the_queue_free_their_places(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    app = create_app(REACHLIMIT_WAIT=30)
    limiter = limiter_of(app)
    with serving(app) as server, all_slots_held(app):
        port = server.socket.getsockname()[1]
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
            delays = []
            for n, sock in enumerate(sockets, start=1):
                closed_at = time.monotonic()
                sock.close()

                def place_back(n: int = n) -> bool:
                    s = limiter.stats()
                    return s.cancelled - before.cancelled == n and s.queued == before.queued - n

                wait_until(f"place {n} back", place_back, timeout=5.0)
                delays.append(time.monotonic() - closed_at)
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

        wait_until("a 499 log line for every client that left", logged_499, timeout=5.0)
        assert app.extensions["slow_app"].figures()["total"] == 0  # nobody built

    # The slots are back: the places the leavers gave up are really free again.
    with serving(app) as server:
        port = server.socket.getsockname()[1]
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
        port = server.socket.getsockname()[1]
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
