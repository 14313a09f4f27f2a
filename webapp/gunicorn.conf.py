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

Environment: REACH_BIND (default 127.0.0.1:8000), REACH_WORKERS (2), REACH_THREADS (16),
plus the app's own REACH_DB, REACH_BLACKLIST, REACH_HIDDEN_PREFIXES, REACHLIMIT_*.
GUNICORN_CMD_ARGS and command-line flags still override everything here.
"""

import os

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
