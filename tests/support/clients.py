"""HTTP clients for the tests that talk to real servers: one request, a raw socket that
never reads, a herd of requests released together, a steady load of cold requests, and the
check of a refusal."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from tests.support import HOST
from tests.support.waiting import DEADLINE, wait_until

#: Socket timeout of every client: longer than any wait a passing test can see.
CLIENT_TIMEOUT = 40.0


class Reply(NamedTuple):
    """One answer; a tuple too, so ``status, headers, body = reply`` and ``reply[0]`` work."""

    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    port: int,
    method: str,
    path: str,
    timeout: float = CLIENT_TIMEOUT,
    headers: Mapping[str, str] | None = None,
    source: str | None = None,
) -> Reply:
    """One request on its own connection, closed afterwards; ``source`` is the loopback
    address to send it from (127.0.0.2, say: a client of its own to the server)."""
    conn = http.client.HTTPConnection(
        HOST, port, timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        conn.request(method, path, headers=dict(headers or {}))
        resp = conn.getresponse()
        body = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


def raw_client(port: int, path: str, timeout: float = CLIENT_TIMEOUT) -> socket.socket:
    """A bare socket that has sent a whole GET for ``path`` and reads nothing."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    request = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n"
    sock.sendall(request.encode("ascii"))
    return sock


def close_one_by_one(
    sockets: Sequence[socket.socket], placed_back: Callable[[int], bool]
) -> list[float]:
    """Close queued clients' ``sockets`` one by one; after the n-th, wait until
    ``placed_back(n)`` (n queue places came back). Returns the delay from each close to its
    place coming back, in seconds: the tests print these, never assert on them."""
    delays = []
    for n, sock in enumerate(sockets, start=1):
        closed_at = time.monotonic()
        sock.close()
        wait_until(f"place {n} back", lambda n=n: placed_back(n), interval=0.002)
        delays.append(time.monotonic() - closed_at)
    return delays


def check_refusal(reply: Reply) -> None:
    """The refusal every layer promises: 429, ``Retry-After: 2``, not cacheable, and the JSON
    body ``{"error": <message>, "retryAfter": 2}``."""
    assert reply.status == 429, reply
    assert reply.headers["retry-after"] == "2"
    assert reply.headers["content-type"].split(";")[0].strip() == "application/json"
    assert "no-store" in reply.headers.get("cache-control", "")
    body = reply.json()
    assert set(body) == {"error", "retryAfter"}
    assert isinstance(body["error"], str) and body["error"]
    assert body["retryAfter"] == 2


class Herd:
    """Clients released together by a Barrier, each on its own connection, one per path.

    ``order`` lists the indexes of the replies in the order they came back; ``source`` is the
    loopback address every client sends from (see :func:`http_request`)."""

    def __init__(self, port: int, paths: list[str], source: str | None = None) -> None:
        self.paths = paths
        self.replies: list[Reply | BaseException | None] = [None] * len(paths)
        self.order: list[int] = []  # guarded by _cond
        self._cond = threading.Condition()
        self._done = 0  # guarded by _cond
        self._barrier = threading.Barrier(len(paths))
        self._threads = [
            threading.Thread(target=self._run, args=(port, i, p, source), daemon=True)
            for i, p in enumerate(paths)
        ]
        for t in self._threads:
            t.start()

    def _run(self, port: int, i: int, path: str, source: str | None) -> None:
        reply: Reply | BaseException
        try:
            self._barrier.wait(timeout=DEADLINE)
            reply = http_request(port, "GET", path, source=source)
        except BaseException as exc:  # recorded, and failed on in results()
            reply = exc
        with self._cond:
            self.replies[i] = reply
            self.order.append(i)
            self._done += 1
            self._cond.notify_all()

    def wait_done(self, n: int) -> list[Reply]:
        """Wait until ``n`` replies are in; return the ones in so far."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._done >= n, DEADLINE), (
                f"only {self._done} of {n} replies after {DEADLINE} s"
            )
            finished = [r for r in self.replies if r is not None]
        for r in finished:
            assert isinstance(r, Reply), r
        return finished  # type: ignore[return-value]

    def join(self) -> None:
        deadline = time.monotonic() + CLIENT_TIMEOUT + 5
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), "a client thread did not finish"

    def results(self) -> list[Reply]:
        self.join()
        for r in self.replies:
            assert isinstance(r, Reply), r
        return self.replies  # type: ignore[return-value]


class Load:
    """Client threads, each sending distinct cold keys (``/report/load-<thread>-<n>``) one
    after another until stopped, to the servers of ``ports`` in turn (a test may append a
    port meanwhile), keeping every outcome (a Reply, or the exception) with how long it took.
    """

    def __init__(self, ports: list[int], threads: int) -> None:
        self.ports = ports
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.outcomes: list[tuple[Reply | BaseException, float]] = []  # guarded by _lock
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            port = self.ports[(i + n) % len(self.ports)]
            began = time.monotonic()
            outcome: Reply | BaseException
            try:
                outcome = http_request(port, "GET", f"/report/load-{i}-{n}")
            except BaseException as exc:  # kept, and failed on by the test
                outcome = exc
            with self._lock:
                self.outcomes.append((outcome, time.monotonic() - began))

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)

    def finish(self) -> list[tuple[Reply | BaseException, float]]:
        """Stop the clients and wait for them (each ends with its request in flight)."""
        self.stop.set()
        for t in self._threads:
            t.join(60)
            assert not t.is_alive(), "a client thread did not finish"
        return self.outcomes
