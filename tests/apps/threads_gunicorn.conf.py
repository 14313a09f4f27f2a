"""A gunicorn config with only the hooks that check a worker's threads
(``reachlimit.gunicorn``: ``when_ready`` for a preloaded app, ``post_worker_init`` for one
each worker loads), for ``tests/test_gunicorn.py``; every setting comes from the command line.
An app's own config has the other hooks too (the README's)."""

from reachlimit.gunicorn import post_worker_init, when_ready  # noqa: F401
