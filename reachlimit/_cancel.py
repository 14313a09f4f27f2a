"""Cancellation: how a waiting request learns that nobody is left to answer.

design: a wait that should end early takes a *cancel token*, anything with ``is_set()``
(a ``threading.Event``, or a :class:`SocketWatch` on the client's connection). A token has
no way to wake a waiter, so waits that watch one run in slices of at most
:data:`POLL_INTERVAL` and ask the token between slices; waits without a token are one timed
wait. Nothing here needs Flask: a plain WSGI app under gunicorn or the Werkzeug server gets a
token for its request from :func:`watch_client`.

``SocketWatch`` registers the request's socket with ``select.poll`` for ``POLLRDHUP`` (the
peer shut its side), ``POLLHUP`` and ``POLLERR`` and polls it with a zero timeout: no busy loop,
no thread, never a read of the socket. Its limits: a client that half-closes (shuts down
writing but still reads) looks gone; a proxy in front must pass client aborts on (nginx does by
default); TLS terminated in the app server and HTTP/2 front ends may not show a client's close.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["CancelToken", "POLL_INTERVAL", "SocketWatch", "watch_client"]

log = logging.getLogger("reachlimit")

#: The longest a wait goes without asking its cancel token. A client that leaves gives its
#: queue place back within one slice; 50 ms keeps that well inside 100 ms.
POLL_INTERVAL = 0.05


class CancelToken(Protocol):
    """Anything with ``is_set()``: a ``threading.Event``, or a :class:`SocketWatch`."""

    def is_set(self) -> bool: ...


_POLLRDHUP: int | None = getattr(select, "POLLRDHUP", None)
_warned_no_rdhup = threading.Event()


class SocketWatch:
    """A cancel token that is set once the client behind ``sock`` has closed its side.

    ``is_set()`` polls with a zero timeout and never reads; the poll object is made on the
    first call, so a request that never waits pays nothing for it. Runs in the request's own
    thread; not meant to be shared between threads."""

    __slots__ = ("_fd", "_poll", "_gone")

    _GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL | (_POLLRDHUP or 0)

    def __init__(self, sock: socket.socket) -> None:
        self._fd = sock.fileno()
        self._poll: select.poll | None = None
        self._gone = False

    def is_set(self) -> bool:
        if self._gone:
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self._fd, self._GONE)
        for _fd, events in self._poll.poll(0):
            # no mutate: poll reports only the events registered (_GONE) and POLLHUP, POLLERR
            # and POLLNVAL, which are in _GONE: the test is true of every event it returns.
            if events & self._GONE:  # pragma: no mutate
                self._gone = True
        return self._gone


def watch_client(environ: Mapping[str, Any]) -> SocketWatch | None:
    """A :class:`SocketWatch` on the client of the WSGI request ``environ``.

    None when the server does not expose the socket (only gunicorn's ``gunicorn.socket`` and
    the Werkzeug server's ``werkzeug.socket`` are known) or when ``POLLRDHUP`` does not exist
    here (not Linux; a warning is logged once): the bounded wait then applies alone."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None or not hasattr(sock, "fileno"):
        return None
    if _POLLRDHUP is None:
        if not _warned_no_rdhup.is_set():
            _warned_no_rdhup.set()
            # pragma: no mutate start (a log's words)
            log.warning("select.POLLRDHUP is not available here: clients that leave while "
                        "queued keep their place until their wait ends")
            # pragma: no mutate end
        return None
    return SocketWatch(sock)
