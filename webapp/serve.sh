#!/usr/bin/env bash
# One command on a fresh machine: bash webapp/serve.sh
#
# Creates .venv at the repository root when missing, installs the project with the webapp
# extras (again only when pyproject.toml changed), writes the demo database when REACH_DB is
# not set and webapp/data/demo.sqlite is missing, then runs gunicorn in the foreground on
# http://127.0.0.1:8000 (REACH_BIND to change; see webapp/gunicorn.conf.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.reach-webapp-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[webapp]'
    touch "$stamp"
fi

if [ -z "${REACH_DB:-}" ] && [ ! -f webapp/data/demo.sqlite ]; then
    .venv/bin/flask --app webapp demo-db --out webapp/data/demo.sqlite
fi

exec .venv/bin/gunicorn -c webapp/gunicorn.conf.py webapp.wsgi:app
