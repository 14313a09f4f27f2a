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

Limits are per process: W workers run up to W x active cold builds at once (2 x 2 = 4 by
default) and queue up to W x queue leaders. Keep W x active at or below the cores the database
scans can use. Raise the threads if you raise REACHLIMIT_ACTIVE or REACHLIMIT_QUEUE.

Metrics: GET /metrics must count the whole server whichever worker answers, so every worker
writes its figures to files in one directory (prometheus_client's multiprocess mode) and a
scrape reads them all. This file manages that directory: PROMETHEUS_MULTIPROC_DIR when the
operator sets it (its stale *.db files are deleted at start: they belong to processes of an
earlier run), else a fresh temporary directory, removed when the server exits. It is set
here, at config load - before the preloaded app imports prometheus_client, which reads the
variable once, at import. ``child_exit`` marks each worker that exits, killed or not, as dead,
so its gauges (builds running, leaders waiting) drop out of the sums while its counters stay.

Environment: REACH_BIND (default 127.0.0.1:8000), REACH_WORKERS (2), REACH_THREADS (16),
PROMETHEUS_MULTIPROC_DIR (see above), plus the app's own REACH_DB, REACH_BLACKLIST,
REACH_HIDDEN_PREFIXES, REACHLIMIT_*. GUNICORN_CMD_ARGS and command-line flags still override
everything here.
"""

import glob
import os
import shutil
import tempfile
from typing import Any

bind = os.environ.get("REACH_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("REACH_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("REACH_THREADS", "16"))

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


# -- metrics: one directory of per-process files (see the design above) -----------------------

_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
#: Set to the master's PID once it has prepared the directory: gunicorn reads this file again
#: on SIGHUP, and a reload must not delete the files of workers that are still running.
_METRICS_READY = "REACH_METRICS_MASTER"
#: Set when the directory is a temporary one of ours, removed on exit.
_METRICS_OWNED = "REACH_METRICS_TEMPORARY"


def _prepare_metrics_dir() -> None:
    if os.environ.get(_METRICS_READY) == str(os.getpid()):
        return
    given = os.environ.get(_METRICS_DIR, "").strip()
    if given:
        os.makedirs(given, exist_ok=True)
        for stale in glob.glob(os.path.join(given, "*.db")):
            os.remove(stale)
    else:
        os.environ[_METRICS_DIR] = tempfile.mkdtemp(prefix="reach-metrics-")
        os.environ[_METRICS_OWNED] = os.environ[_METRICS_DIR]
    os.environ[_METRICS_READY] = str(os.getpid())


_prepare_metrics_dir()


def child_exit(server: Any, worker: Any) -> None:
    """In the master, for every worker that exited (SIGKILL included): drop its gauges."""
    try:
        from prometheus_client import multiprocess
    except ImportError:  # metrics are off and prometheus_client is not installed
        return
    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def on_exit(server: Any) -> None:
    """In the master, last: remove the temporary metrics directory if it is ours."""
    owned = os.environ.get(_METRICS_OWNED)
    if owned and owned == os.environ.get(_METRICS_DIR):
        shutil.rmtree(owned, ignore_errors=True)
