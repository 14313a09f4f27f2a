"""gunicorn settings for the reach service: ``gunicorn -c webapp/gunicorn.conf.py webapp.wsgi:app``.

design: one expensive endpoint, so every worker is sized around its cold limiter.

    threads per worker >= active + queue + spare
                          2        8       6     = 16 (the default)

- ``active`` (REACHLIMIT_ACTIVE, 2) handler threads run cold builds;
- ``queue`` (REACHLIMIT_QUEUE, 8) more hold a queued leader for up to REACHLIMIT_WAIT s;
- the spare threads answer everything that never waits - warm cache hits, /api/nodes,
  /api/health, the page, and the immediate 429s once the queue is full - so the service stays
  responsive while the limiter is saturated. With fewer threads the queue could never fill
  and warm requests would wait behind cold ones (reachlimit warns at start-up).

Workers and the budget:

- without REACHLIMIT_REDIS_URL each worker has its own limiter, so limits multiply: W workers
  run up to W x active cold builds at once and queue W x queue leaders. One worker is run
  (the limits are then the service's); REACH_WORKERS=W runs more, with a warning at start.
- with REACHLIMIT_REDIS_URL every worker (and every host on the same Redis and
  REACHLIMIT_REDIS_PREFIX) shares ONE budget of active builds and queue places, so REACH_WORKERS
  (default 2) adds capacity for warm hits without adding cold builds. Redis failing is a
  degraded mode (REACHLIMIT_REDIS_FALLBACK): per-worker limits or 503 refusals, never an error.

Keep the builds that can run at once at or below the cores the database scans can use. Raise
the threads if you raise REACHLIMIT_ACTIVE or REACHLIMIT_QUEUE.

The server hooks are reachlimit's (``reachlimit.gunicorn``, whose docstring says what each
does): ``prepare()`` at load sets up the metrics directory (PROMETHEUS_MULTIPROC_DIR when the
operator sets it, else a temporary one removed at exit) and the boot id the workers share;
``when_ready`` warns when workers multiply the limits; ``child_exit`` frees a dead worker's
shared slots and queue places on Redis at once (not when their leases, REACHLIMIT_LEASE, end)
and drops its gauges from the metrics; ``on_exit`` removes the temporary directory.

Logs: gunicorn's error log and the app's loggers (``webapp``, ``reachlimit``) write one line
format to stderr, ``2026-12-03 06:30:00,123 INFO [pid 1234] webapp: ...``; the access log
(stdout) is gunicorn's format with ``[pid 1234]`` (the worker that answered) at the end.
REACH_LOG_LEVEL (info) is the level of all three.

Environment: REACH_BIND (default 127.0.0.1:8000), REACH_WORKERS (1, or 2 with a Redis URL),
REACH_THREADS (16), REACH_LOG_LEVEL (info), REACHLIMIT_REDIS_URL (and the other REACHLIMIT_*
the app reads), PROMETHEUS_MULTIPROC_DIR (see above), plus the app's own REACH_DB,
REACH_BLACKLIST, REACH_PROXIES, REACH_HIDDEN_PREFIXES. GUNICORN_CMD_ARGS and command-line
flags still override everything here. REACH_WORKERS and REACH_THREADS must be whole numbers
>= 1; anything else stops start-up with one line naming the variable.
"""

import logging
import os
from typing import Any

from gunicorn.glogging import Logger  # type: ignore[import-untyped]

from reachlimit.gunicorn import child_exit, on_exit, post_worker_init, prepare, when_ready  # noqa: F401


def _count(name: str, default: str) -> int:
    """A whole number >= 1 from the environment; anything else stops start-up with one line."""
    raw = os.environ.get(name, default)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"webapp/gunicorn.conf.py: {name} must be a whole number >= 1, "
                         f"got {raw!r}")
    return value


bind = os.environ.get("REACH_BIND", "127.0.0.1:8000")
#: With a Redis URL every worker shares one budget (see the design above).
_SHARED = bool(os.environ.get("REACHLIMIT_REDIS_URL", "").strip())
workers = _count("REACH_WORKERS", "2" if _SHARED else "1")
worker_class = "gthread"
threads = _count("REACH_THREADS", "16")

# The metrics directory and the boot id: at load, before the preloaded app imports
# prometheus_client (which reads the directory's variable once, at import), and after the
# checks above (a bad count stops start-up before a temporary directory is made). Read
# again on SIGHUP, it changes nothing.
prepare()

# Load the app once, in the master, before forking: the demo database is written once, and
# a configuration error (a missing REACH_DB, say) stops the server with one line instead of
# every worker failing in a loop. Nothing the app builds at load time is a thread or an open
# connection, so the fork is safe; each worker still gets its own limiter and cache.
preload_app = True

# A cold build takes well under a second; a request waits at most REACHLIMIT_WAIT (3 s) for a
# slot. 30 s only catches a worker that is truly stuck.
timeout = 30
graceful_timeout = 10
keepalive = 5

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("REACH_LOG_LEVEL", "info")


class ReachLogs(Logger):  # type: ignore[misc]
    """gunicorn's logger, with the time, the level and the PID on every line, and the app's
    loggers writing through the error log's handlers (to stderr, a file or syslog: wherever
    the error log goes), at the server's log level."""

    error_fmt = "%(asctime)s %(levelname)s [pid %(process)d] %(name)s: %(message)s"
    datefmt = None  # logging's own: 2026-12-03 06:30:00,123
    access_fmt = "%(message)s [pid %(process)d]"
    #: The app's loggers (their children, webapp.api say, go through them).
    app_loggers = ("webapp", "reachlimit")

    def setup(self, cfg: Any) -> None:
        """Run at start and again on SIGHUP (gunicorn then replaces its handlers)."""
        super().setup(cfg)
        shared = list(self.error_log.handlers)
        for name in self.app_loggers:
            logger = logging.getLogger(name)
            for handler in getattr(self, "_lent", ()):
                logger.removeHandler(handler)  # the previous setup's
            for handler in shared:
                logger.addHandler(handler)
            logger.setLevel(self.loglevel)
            logger.propagate = False  # to the root logger: nothing, or twice
        self._lent = shared


logger_class = ReachLogs
