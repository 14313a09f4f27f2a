"""A gunicorn config for tests/apps/budgets_app.py: a dead worker's shared places are freed
in every budget at once by its child_exit, through ``reachlimit.flask.release_worker``."""

import logging
import os
import secrets

bind = os.environ["BUDGETS_BIND"]
workers = int(os.environ.get("BUDGETS_WORKERS", "1"))
threads = 16
worker_class = "gthread"

# One boot id for the master and every worker it forks: the owner ids of the workers' tokens
# are "<host>:<boot id>:<pid>:", which release_worker in the master must be able to name.
os.environ["REACHLIMIT_BOOT_ID"] = secrets.token_hex(4)


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    from reachlimit.flask import release_worker

    try:
        freed = release_worker(os.environ, worker.pid)
    except Exception as exc:  # noqa: BLE001  (a hook must never raise)
        logging.getLogger("gunicorn.error").warning("release_worker failed: %r", exc)
        return
    if freed is not None:
        server.log.info("worker %s: freed %d build slot(s), %d place(s)", worker.pid, *freed)
