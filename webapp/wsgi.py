"""The WSGI entry point: ``gunicorn -c webapp/gunicorn.conf.py webapp.wsgi:app``.

Builds the app from the environment and prepares its database before the first request:
with the embedded demo database that means writing it when missing or stale. Under
``preload_app`` (webapp/gunicorn.conf.py) this runs once, in the gunicorn master, and a bad
configuration stops the master with one line instead of crash-looping workers.
"""

from __future__ import annotations

from webapp import create_app, reach_state
from webapp.db import DatabaseError

app = create_app()
try:
    reach_state(app).prepare()
except DatabaseError as exc:
    raise SystemExit(f"webapp: database: {exc}") from None
