"""A gunicorn config for tests/apps/budgets_app.py written the way the README tells an app to
write one: reachlimit's own hooks (``reachlimit.gunicorn``), nothing hand-made. ``prepare()``
gives the master and its workers one boot id (and a metrics directory of their own);
``child_exit`` frees a dead worker's shared places in every budget at once."""

import os

from reachlimit.gunicorn import child_exit, on_exit, post_worker_init, prepare, when_ready  # noqa: F401

prepare()  # at load, before the app (or prometheus_client) is imported

bind = os.environ["BUDGETS_BIND"]
workers = int(os.environ.get("BUDGETS_WORKERS", "1"))
threads = 16
worker_class = "gthread"
