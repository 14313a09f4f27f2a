"""gunicorn server hooks for an app that uses reachlimit: what its gunicorn config imports.

A config file (``gunicorn -c gunicorn.conf.py app:app``) that gets every worker-related
detail right::

    from reachlimit.gunicorn import child_exit, on_exit, post_worker_init, prepare, when_ready

    prepare()  # at load, before the app (or prometheus_client) is imported

    bind = "127.0.0.1:8000"
    workers = 2             # with REACHLIMIT_REDIS_URL: one shared budget for all of them
    worker_class = "gthread"
    threads = 16            # >= REACHLIMIT_ACTIVE + REACHLIMIT_QUEUE + 4
    preload_app = True

The hooks compose: a config with a hook of its own calls ours from it::

    from reachlimit import gunicorn as reachlimit_hooks

    def child_exit(server, worker):
        reachlimit_hooks.child_exit(server, worker)
        ...  # the app's own clean-up

design::

    prepare()    the master, while gunicorn reads the config file. Once per master: gunicorn
                 reads the file again on SIGHUP (same PID) and must then keep what the running
                 workers use, so a second call by the same PID does nothing.
                 - metrics (prometheus_client's multiprocess mode, which every worker's
                   reachlimit metrics use so that a scrape of any worker counts the whole
                   server): PROMETHEUS_MULTIPROC_DIR when the operator sets it, created if
                   missing and emptied of its *.db files (they belong to the processes of an
                   earlier run); else a fresh temporary directory, ``on_exit`` removes it. It
                   is set here, before the preloaded app imports prometheus_client, which
                   reads the variable once, at import: when prometheus_client came first
                   (imported without it), it is left unset, with a warning. A master
                   started by another one (gunicorn's USR2 upgrade) inherits its parent's
                   temporary directory and makes its own instead: the two masters exit at
                   different times.
                 - the boot id, REACHLIMIT_BOOT_ID: one random value for this master and the
                   workers it forks. Shared build slots and queue places on Redis are owned
                   by "<hostname>:<boot id>:<pid>", so ``child_exit`` frees the places of a
                   dead worker of THIS master only, even where another host (a container
                   given the same hostname) runs workers with the same PIDs.
    when_ready   the master, once it listens: warns when several workers run without
                 REACHLIMIT_REDIS_URL (each has its own limiters: W workers run up to W x
                 active builds of every budget), and when ``prepare`` was not called. With
                 ``preload_app`` the app was loaded here: the threads check below, once.
    post_worker_init
                 each worker, once it has loaded the app (not preloaded): warns when the
                 worker's ``threads`` setting is fewer than the app's budgets need
                 (``reachlimit.flask.check_threads``: active + queue of every budget, + 4).
                 gunicorn gives no public way for the app to read that setting itself, so
                 the hook hands it over; without the hooks nothing is checked.
    child_exit   the master, for every worker that exited (SIGKILL and OOM included): frees
                 the worker's shared build slots and queue places on Redis, in every
                 budget, at once, and drops its singleflight claims, so their followers
                 take the builds over (``reachlimit.flask.release_worker``; without it they
                 come back when their leases end), then marks the worker dead for
                 prometheus_client so its gauges (builds running, leaders waiting) leave the
                 sums while its counters stay.
                 Never raises: a failure is logged (the URL masked, secrets scrubbed).
    on_exit      the master, last: removes the temporary metrics directory if it made it.

The hooks read the REACHLIMIT_* settings from the master's environment, as the extension's
``release_worker`` does: an app whose Redis URL is not in the environment frees nothing here
and its places come back when their leases end.

Environment this module sets (besides PROMETHEUS_MULTIPROC_DIR and REACHLIMIT_BOOT_ID), named
with a leading underscore so that they are never taken for REACHLIMIT_* settings:
``_REACHLIMIT_GUNICORN_MASTER`` (the PID of the master that ran ``prepare``) and
``_REACHLIMIT_METRICS_TEMPORARY`` (the temporary directory it made, if any).

Only the standard library is imported here; prometheus_client and reachlimit.flask (Flask,
redis-py) are imported inside the hooks that need them.
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
import shutil
import sys
import tempfile
from typing import Any

from ._urls import mask_url, scrub, url_secrets

__all__ = [
    "prepare", "when_ready", "post_worker_init", "child_exit", "on_exit",
    "METRICS_DIR_VARIABLE", "BOOT_ID_VARIABLE", "MASTER_VARIABLE", "TEMPORARY_VARIABLE",
    "VARIABLES", "TEMPORARY_PREFIX",
]

log = logging.getLogger("reachlimit")

#: prometheus_client's multiprocess directory: given by the operator or made by prepare().
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
#: The boot id every process of one master shares (``reachlimit.redis`` reads it at import).
BOOT_ID_VARIABLE = "REACHLIMIT_BOOT_ID"
#: The PID of the master that ran prepare(): a config read again by it changes nothing.
MASTER_VARIABLE = "_REACHLIMIT_GUNICORN_MASTER"
#: The temporary metrics directory prepare() made, for on_exit to remove.
TEMPORARY_VARIABLE = "_REACHLIMIT_METRICS_TEMPORARY"
#: Every environment variable prepare() may set.
VARIABLES = (METRICS_DIR_VARIABLE, BOOT_ID_VARIABLE, MASTER_VARIABLE, TEMPORARY_VARIABLE)

#: The setting that makes workers share one budget (see when_ready and child_exit).
_REDIS_URL_VARIABLE = "REACHLIMIT_REDIS_URL"
#: The start of a temporary metrics directory's name.
TEMPORARY_PREFIX = "reachlimit-metrics-"


def prepare() -> None:
    """In the gunicorn master, at config load: the metrics directory and the boot id (see
    the module's design). Idempotent per master PID; call it from the config file only."""
    pid = str(os.getpid())
    if os.environ.get(MASTER_VARIABLE) == pid:
        return  # the config read again (SIGHUP): the running workers keep what they use
    _prepare_metrics_dir()
    os.environ[BOOT_ID_VARIABLE] = secrets.token_hex(4)
    os.environ[MASTER_VARIABLE] = pid


def _prepare_metrics_dir() -> None:
    given = os.environ.get(METRICS_DIR_VARIABLE, "").strip()
    inherited = os.environ.pop(TEMPORARY_VARIABLE, None)
    if given and given != inherited:
        os.makedirs(given, exist_ok=True)
        for stale in glob.glob(os.path.join(given, "*.db")):
            os.remove(stale)
        return
    if "prometheus_client" in sys.modules and METRICS_DIR_VARIABLE not in os.environ:
        # Imported without the variable, so in its one-process mode for good, in this master
        # and every worker it forks: the variable stays unset, so that reachlimit.prometheus
        # (which reads it) counts in that mode too.
        # no mutate: the words of a log line (no behaviour); the variable it names is tested.
        log.warning(
            "reachlimit: prometheus_client was imported before "  # pragma: no mutate
            "reachlimit.gunicorn.prepare() could set %s, so each "  # pragma: no mutate
            "process counts its metrics on its own; call prepare() first in "  # pragma: no mutate
            "the gunicorn config file",  # pragma: no mutate
            METRICS_DIR_VARIABLE,
        )
        return
    # Not given, or the temporary directory of the master that started this one (USR2): a
    # fresh one of our own.
    made = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)
    os.environ[METRICS_DIR_VARIABLE] = made
    os.environ[TEMPORARY_VARIABLE] = made


def when_ready(server: Any) -> None:
    """In the master, once it listens: warn when per-worker limits multiply, and when
    :func:`prepare` was not called; with ``preload_app``, when the workers will have too
    few threads for the app loaded here."""
    count = server.cfg.workers
    if count > 1 and not _redis_url():
        # no mutate: the words of a log line (no behaviour); the figures and the variable
        # it names are tested.
        server.log.warning(
            "reachlimit: %d workers without %s: every worker has its own cold limiters, so "
            "limits multiply: up to %d x REACHLIMIT_ACTIVE builds of each "  # pragma: no mutate
            "budget run at once and %d x REACHLIMIT_QUEUE leaders wait; set "  # pragma: no mutate
            "%s to share one budget",  # pragma: no mutate
            count, _REDIS_URL_VARIABLE, count, count, _REDIS_URL_VARIABLE,
        )
    if os.environ.get(MASTER_VARIABLE) != str(os.getpid()):
        # no mutate: the words of a log line (no behaviour); that it is logged is tested.
        server.log.warning(
            "reachlimit: reachlimit.gunicorn.prepare() was not called in the "  # pragma: no mutate
            "gunicorn config file: no metrics directory of this server's own "  # pragma: no mutate
            "(stale files are not cleared) and no boot id shared by its "  # pragma: no mutate
            "workers",  # pragma: no mutate
        )
    if server.cfg.preload_app:
        _check_threads(server.cfg.threads)


def post_worker_init(worker: Any) -> None:
    """In each worker, once it has loaded the app: warn when the worker has too few threads
    for it (a preloaded app was checked once, by :func:`when_ready`)."""
    if not worker.cfg.preload_app:
        _check_threads(worker.cfg.threads)


def _check_threads(threads: int) -> None:
    """``reachlimit.flask.check_threads`` for the apps this process set up, if any: not
    imported, no app here uses the extension (and Flask is not imported for nothing)."""
    extension = sys.modules.get("reachlimit.flask")
    if extension is not None:
        extension.check_threads(threads)


def child_exit(server: Any, worker: Any) -> None:
    """In the master, for every worker that exited, killed or not: free its shared places
    on Redis, then mark it dead for prometheus_client. Never raises."""
    pid = worker.pid
    if _redis_url():
        _release_shared_places(server, pid)
    _mark_dead(server, pid)


def on_exit(server: Any) -> None:
    """In the master, last: remove the temporary metrics directory if :func:`prepare` made
    it (a directory the operator gave is left alone)."""
    owned = os.environ.get(TEMPORARY_VARIABLE)
    if owned and owned == os.environ.get(METRICS_DIR_VARIABLE):
        shutil.rmtree(owned, ignore_errors=True)


def _redis_url() -> str:
    return os.environ.get(_REDIS_URL_VARIABLE, "").strip()


def _release_shared_places(server: Any, pid: int) -> None:
    """Free dead worker ``pid``'s shared build slots and queue places at once (not when their
    leases end) and log what was freed. A failure is logged and the leases free the places
    later."""
    url = _redis_url()
    try:
        from .flask import release_worker

        released = release_worker(os.environ, pid)
    except Exception as exc:
        server.log.warning(
            # no mutate: the words of a log line (no behaviour); what it names is tested.
            "reachlimit: could not free the shared places of worker %d on %s (%s); their "
            "leases will",  # pragma: no mutate
            pid, mask_url(url),
            scrub(f"{type(exc).__name__}: {exc}", url_secrets(url)),
        )
        return
    if released is not None and any(released):
        server.log.info(
            "reachlimit: freed %d build slot(s) and %d queue place(s) of worker %d",
            *released, pid,
        )


def _mark_dead(server: Any, pid: int) -> None:
    """Drop dead worker ``pid``'s live gauges from the metrics directory (its counters and
    histograms stay in the sums)."""
    if not os.environ.get(METRICS_DIR_VARIABLE):
        return
    try:
        from prometheus_client import multiprocess
    except ImportError:  # metrics are off and prometheus_client is not installed
        return
    try:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the directory removed under us, say: never fail the master
        server.log.warning(
            "reachlimit: could not mark worker %d dead in the metrics directory (%s: %s)",
            pid, type(exc).__name__, exc,
        )
