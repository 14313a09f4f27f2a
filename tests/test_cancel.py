"""The client-gone cancel token (``reachlimit._cancel``), on real sockets without a server.

A connected ``socket.socketpair`` stands for the server's end and the client's end of one
request's connection: what the client does to its end is what the watch must see."""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Iterator

import pytest

from reachlimit import SocketWatch, _cancel, watch_client

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    server_end, client_end = socket.socketpair()
    yield server_end, client_end
    server_end.close()
    client_end.close()


def test_the_poll_interval_keeps_a_departure_within_one_short_slice() -> None:
    assert 0 < _cancel.POLL_INTERVAL <= 0.05


def test_a_watch_is_clear_while_the_client_stays_and_set_once_it_closes(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    server_end, client_end = connection
    watch = SocketWatch(server_end)
    assert watch.is_set() is False
    assert watch.is_set() is False  # asking again changes nothing
    client_end.close()
    assert watch.is_set() is True
    assert watch.is_set() is True  # once set, set for good


def test_a_watch_never_reads_what_the_client_sent(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    server_end, client_end = connection
    client_end.sendall(b"GET / HTTP/1.1\r\n\r\n")
    watch = SocketWatch(server_end)
    assert watch.is_set() is False  # readable data is not a departure
    assert server_end.recv(64) == b"GET / HTTP/1.1\r\n\r\n"  # still there for the server


def test_asking_a_watch_never_waits_on_the_socket(
    connection: tuple[socket.socket, socket.socket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``is_set()`` runs between a waiter's slices: each poll has a zero timeout, so asking
    while the client stays costs no time of its own (the slice is the only wait)."""
    server_end, client_end = connection
    timeouts: list[object] = []
    real_poll = select.poll

    class RecordingPoll:
        def __init__(self) -> None:
            self._poll = real_poll()

        def register(self, fd: int, mask: int) -> None:
            self._poll.register(fd, mask)

        def poll(self, timeout: object = None) -> list[tuple[int, int]]:
            timeouts.append(timeout)
            return self._poll.poll(0)

    monkeypatch.setattr(select, "poll", RecordingPoll)
    watch = SocketWatch(server_end)
    assert watch.is_set() is False
    client_end.close()
    assert watch.is_set() is True
    assert timeouts == [0, 0]


def test_a_client_that_shuts_its_side_counts_as_gone(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    """The documented limit: a half-close (the client stops writing) looks like leaving."""
    server_end, client_end = connection
    watch = SocketWatch(server_end)
    client_end.shutdown(socket.SHUT_WR)
    assert watch.is_set() is True


def test_watch_client_finds_the_gunicorn_or_werkzeug_socket(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    server_end, client_end = connection
    for key in ("gunicorn.socket", "werkzeug.socket"):
        watch = watch_client({key: server_end})
        assert isinstance(watch, SocketWatch) and watch.is_set() is False
    assert watch_client({}) is None  # the test client, other servers: no socket, no watch
    assert watch_client({"gunicorn.socket": object()}) is None  # not a socket
    client_end.close()
    watch = watch_client({"werkzeug.socket": server_end})
    assert watch is not None and watch.is_set() is True


def test_without_pollrdhup_there_is_no_watch_and_one_warning(
    connection: tuple[socket.socket, socket.socket],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server_end, _client_end = connection
    monkeypatch.setattr(_cancel, "_POLLRDHUP", None)
    monkeypatch.setattr(_cancel, "_warned_no_rdhup", type(_cancel._warned_no_rdhup)())
    with caplog.at_level(logging.WARNING, logger="reachlimit"):
        assert watch_client({"gunicorn.socket": server_end}) is None
        assert watch_client({"gunicorn.socket": server_end}) is None
    warnings = [r for r in caplog.records if "POLLRDHUP" in r.getMessage()]
    assert len(warnings) == 1
