"""The reach service's log lines under real gunicorn (``webapp/gunicorn.conf.py``) carry a
time, a level and a PID: ``2026-12-03 06:30:00,123 INFO [pid 1234] <logger>: <message>``.

Proved on gunicorn's own lines (the master's "Listening at", each worker's "Booting worker"
written by that worker), on reachlimit's warning at load (in the master: the app is
preloaded), on lines the ``webapp`` and ``reachlimit`` loggers write in a worker while it
answers, and on the access log, whose lines end with the answering worker's PID. The level
follows REACH_LOG_LEVEL, and a SIGHUP reload does not write a line twice. A line is written
before the answer that logged it is sent, so the log is read once the answer is in."""

from __future__ import annotations

import datetime
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.gunicorn_server import (
    WEBAPP_CONFIG,
    GunicornServer,
    reach_service,
    serving,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gunicorn, pytest.mark.timeout(120)]

#: One line of the error log: time, level, PID, logger, message.
LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r" \[pid (?P<pid>\d+)\] (?P<logger>[\w.]+): (?P<message>.*)$"
)
#: The end of an access log line: the PID of the worker that answered.
ACCESS_PID = re.compile(r" \[pid (\d+)\]$")


def parsed(text: str) -> list[dict[str, Any]]:
    """The error log lines that have the format (a message of several lines counts by its
    first), each as a dict with its time parsed and its PID a number."""
    found = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            row: dict[str, Any] = match.groupdict()
            row["time"] = datetime.datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S,%f")
            row["pid"] = int(row["pid"])
            found.append(row)
    return found


def the_line(rows: list[dict[str, Any]], logger: str, start: str) -> dict[str, Any]:
    matching = [r for r in rows if r["logger"] == logger and r["message"].startswith(start)]
    assert len(matching) == 1, (logger, start, rows)
    return matching[0]


def test_gunicorns_and_reachlimits_lines_carry_time_level_and_pid(
    tmp_path: Path, reach_demo_db: Path
) -> None:
    # 4 threads: reachlimit warns at load that the worker has too few (from the master).
    server = reach_service(tmp_path, reach_demo_db, "logs", env={"REACH_THREADS": "4"})
    began = datetime.datetime.now() - datetime.timedelta(seconds=2)
    with serving(server):
        [worker] = server.worker_pids()
        assert server.get("/api/health").status == 200
        wait_until("the access log line", lambda: "/api/health" in server.stdout())
    ended = datetime.datetime.now() + datetime.timedelta(seconds=2)
    rows = parsed(server.stderr())
    master = server.pid

    listening = the_line(rows, "gunicorn.error", "Listening at: ")
    assert (listening["level"], listening["pid"]) == ("INFO", master)
    booting = the_line(rows, "gunicorn.error", f"Booting worker with pid: {worker}")
    assert (booting["level"], booting["pid"]) == ("INFO", worker)  # written by the worker
    threads = the_line(rows, "reachlimit", "gunicorn runs 4 thread(s) per worker")
    assert (threads["level"], threads["pid"]) == ("WARNING", master)  # the app is preloaded
    for row in (listening, booting, threads):
        assert began <= row["time"] <= ended, row

    access = [line for line in server.stdout().splitlines() if line.strip()]
    assert access and all('"GET /api/health HTTP/1.1" 200 ' in line for line in access), access
    for line in access:  # the readiness probes' and ours
        match = ACCESS_PID.search(line)
        assert match is not None and int(match.group(1)) == worker, line


def probe_server(tmp_path: Path, name: str, level: str) -> GunicornServer:
    """The webapp's gunicorn config serving the probe app, whose ``/say/<word>`` logs on
    children of the ``webapp`` (INFO) and ``reachlimit`` (WARNING) loggers."""
    return GunicornServer(
        "tests.apps.hooks_app:create_app()", tmp_path, name,
        config=WEBAPP_CONFIG, env={"REACH_LOG_LEVEL": level},
        workers_env="REACH_WORKERS", bind_env="REACH_BIND", threads=None, worker_class=None,
        access_log=False, graceful_timeout=None,
        token_env="HOOKS_APP_TOKEN", identity_path="/who",
    )


def said(rows: list[dict[str, Any]], word: str) -> list[tuple[str, str, int]]:
    return [(r["logger"], r["level"], r["pid"]) for r in rows if r["message"] == f"said {word}"]


def test_the_apps_loggers_write_the_workers_pid_once_even_after_a_reload(
    tmp_path: Path,
) -> None:
    server = probe_server(tmp_path, "probe", "info")
    with serving(server):
        first = server.get_json("/say/hello")["pid"]
        assert sorted(said(parsed(server.stderr()), "hello")) == [
            ("reachlimit.probe", "WARNING", first), ("webapp.probe", "INFO", first)
        ]
        os.kill(server.pid, signal.SIGHUP)  # the config and the logging set up again

        def new_worker() -> bool:
            pids = server.worker_pids()
            return bool(pids) and first not in pids

        wait_until("the worker replaced", new_worker)
        wait_until("the new worker answering",
                   lambda: server.get_json("/who")["pid"] != first)
        second = server.get_json("/say/again")["pid"]
        # Written before the answer was sent: a duplicate would be in the log by now.
        assert sorted(said(parsed(server.stderr()), "again")) == [
            ("reachlimit.probe", "WARNING", second), ("webapp.probe", "INFO", second)
        ]


def test_reach_log_level_sets_the_apps_loggers_level_too(tmp_path: Path) -> None:
    server = probe_server(tmp_path, "quiet", "warning")
    with serving(server):
        pid = server.get_json("/say/quietly")["pid"]
        assert said(parsed(server.stderr()), "quietly") == [("reachlimit.probe", "WARNING", pid)]
