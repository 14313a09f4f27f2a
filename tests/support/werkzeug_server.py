"""A WSGI app on Werkzeug's threaded server, in this process, on loopback port 0.

``serve_forever`` runs in a daemon thread from the start; :meth:`WerkzeugServer.close` shuts
it down and joins the thread with a timeout, and a thread still alive fails the test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tests.support import HOST
from tests.support.waiting import DEADLINE

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer


class WerkzeugServer:
    """``app`` on Werkzeug's threaded server in this process, on HOST port 0, served by a
    daemon thread from the start. :meth:`close` shuts it down and joins the thread."""

    def __init__(
        self, app: Any, *, poll_interval: float = 0.5, name: str = "werkzeug-server"
    ) -> None:
        from werkzeug.serving import make_server

        self.server: BaseWSGIServer = make_server(HOST, 0, app, threaded=True)
        self.port: int = self.server.server_port
        self.url = f"http://{HOST}:{self.port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": poll_interval},
            name=name,
            daemon=True,
        )
        self.thread.start()

    def close(self, timeout: float = DEADLINE) -> None:
        """Shut the server down and join its thread within ``timeout`` s (alive: a failure)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the server thread {self.thread.name!r} did not stop"


@contextlib.contextmanager
def werkzeug_serving(
    app: Any, *, poll_interval: float = 0.5, join_timeout: float = DEADLINE
) -> Iterator[WerkzeugServer]:
    """A :class:`WerkzeugServer` for the block; closed (and its thread joined) on the way out."""
    server = WerkzeugServer(app, poll_interval=poll_interval)
    try:
        yield server
    finally:
        server.close(join_timeout)
