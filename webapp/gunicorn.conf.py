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
  (default 2) adds capacity for warm hits without adding cold builds. ``child_exit`` frees the
  slots and queue places of a worker that died (SIGKILL, OOM, timeout) at once; without it they
  would come back only when their lease (REACHLIMIT_LEASE, 10 s) ends. Redis failing is a
  degraded mode (REACHLIMIT_REDIS_FALLBACK): per-worker limits or 503 refusals, never an error.

Keep the builds that can run at once at or below the cores the database scans can use. Raise
the threads if you raise REACHLIMIT_ACTIVE or REACHLIMIT_QUEUE.

Metrics: GET /metrics must count the whole server whichever worker answers, so every worker
writes its figures to files in one directory (prometheus_client's multiprocess mode) and a
scrape reads them all. This file manages that directory: PROMETHEUS_MULTIPROC_DIR when the
operator sets it (its stale *.db files are deleted at start: they belong to processes of an
earlier run), else a fresh temporary directory, removed when the server exits. It is set
here, at config load - before the preloaded app imports prometheus_client, which reads the
variable once, at import. ``child_exit`` marks each worker that exits, killed or not, as dead,
so its gauges (builds running, leaders waiting) drop out of the sums while its counters stay.

Environment: REACH_BIND (default 127.0.0.1:8000), REACH_WORKERS (1, or 2 with a Redis URL),
REACH_THREADS (16), REACHLIMIT_REDIS_URL (and the other REACHLIMIT_* the app reads),
PROMETHEUS_MULTIPROC_DIR (see above), plus the app's own REACH_DB, REACH_BLACKLIST, REACH_PROXIES,
REACH_HIDDEN_PREFIXES, REACHLIMIT_*. GUNICORN_CMD_ARGS and command-line flags still override
everything here. REACH_WORKERS and REACH_THREADS must be whole numbers >= 1; anything else stops
start-up with one line naming the variable.
"""

import glob
import os
import secrets
import shutil
import tempfile
from typing import Any


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
#: The shared limiter's Redis (see the design above); empty: per-worker limiters.
_REDIS_URL = os.environ.get("REACHLIMIT_REDIS_URL", "").strip()
workers = _count("REACH_WORKERS", "2" if _REDIS_URL else "1")
worker_class = "gthread"
threads = _count("REACH_THREADS", "16")

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


# -- the boot id: one random value for this master and its workers -----------------------------
#
# A shared slot or queue place on Redis is owned by "<hostname>:<boot id>:<pid>": child_exit
# frees the places of a dead worker of THIS master only, even where another host (a container
# given the same hostname) runs workers with the same PIDs. Set once per master (a SIGHUP
# reload keeps it: its workers' places are still theirs), inherited by every worker.
_BOOT_MASTER = "REACH_BOOT_MASTER"
if os.environ.get(_BOOT_MASTER) != str(os.getpid()):
    os.environ["REACHLIMIT_BOOT_ID"] = secrets.token_hex(4)
    os.environ[_BOOT_MASTER] = str(os.getpid())


def when_ready(server: Any) -> None:
    """In the master, once it listens: warn when per-worker limits multiply."""
    count = server.cfg.workers
    if not _REDIS_URL and count > 1:
        server.log.warning(
            "reach: %d workers without REACHLIMIT_REDIS_URL: every worker has its own cold "
            "limiter, so up to %d x REACHLIMIT_ACTIVE builds run at once and %d x "
            "REACHLIMIT_QUEUE leaders wait; set REACHLIMIT_REDIS_URL to share one budget",
            count, count, count,
        )


def _release_shared_places(server: Any, pid: int) -> None:
    """Free the shared build slots and queue places of dead worker ``pid`` on Redis at once
    (not when their leases end). Never raises: a failure is logged, and the leases still
    free the places later."""
    try:
        from reachlimit.flask import release_worker

        released = release_worker(os.environ, pid)
    except Exception as exc:
        from reachlimit._urls import mask_url, scrub, url_secrets

        server.log.warning(
            "reach: could not free the shared places of worker %d on %s (%s); their leases "
            "will", pid, mask_url(_REDIS_URL),
            scrub(f"{type(exc).__name__}: {exc}", url_secrets(_REDIS_URL)),
        )
        return
    if released and any(released):
        server.log.info(
            "reach: freed %d build slot(s) and %d queue place(s) of worker %d", *released, pid
        )


def child_exit(server: Any, worker: Any) -> None:
    """In the master, for every worker that exited (SIGKILL included): free its shared
    places on Redis, then drop its gauges."""
    if _REDIS_URL:
        _release_shared_places(server, worker.pid)
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
