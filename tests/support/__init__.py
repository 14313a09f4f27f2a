"""What the tests and the benchmarks use to start, watch and stop what they test.

One module a job (see README.md beside this file): waiting for a state, a fake clock,
threads and their outcomes, processes and ports, HTTP clients, a gunicorn harness, an
in-process Werkzeug server, and limiter probes. Nothing here sleeps to make a test pass.
"""

from __future__ import annotations

from pathlib import Path

#: The repository root: gunicorn runs there, so ``tests.apps`` and ``webapp`` import.
ROOT = Path(__file__).resolve().parents[2]
#: Every server a test or a benchmark starts listens on loopback only.
HOST = "127.0.0.1"
