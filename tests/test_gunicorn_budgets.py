"""Budgets and the ``@cached`` decorator under real gunicorn (``tests/apps/budgets_app.py``,
its own config ``tests/apps/budgets_gunicorn.conf.py`` whose hooks are
``reachlimit.gunicorn``'s: its child_exit frees a dead worker's places in every budget),
on 127.0.0.1, stopped by PID:

    one worker, in process: a saturated budget leaves the default alone; a herd on a
        decorated view builds once; its next answer is the cached first (Cache-Status hit),
        ``?a=1&b=2`` and ``?b=2&a=1`` one key; health and metrics show every budget
    two workers on Redis: a SIGKILLed worker holding places in two budgets gives them back
        at once (child_exit), long before their 60 s lease

Builds wait on a gate file the test creates; what runs is read from the app's files and from
/health, waited for with bounded deadlines.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.apps.budgets_app import builds_logged, running
from tests.support import ROOT
from tests.support.clients import Herd, check_refusal, http_request
from tests.support.gunicorn_server import GunicornServer, serving
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.gunicorn, pytest.mark.timeout(180)]

APP = "tests.apps.budgets_app:create_app()"
CONFIG = ROOT / "tests" / "apps" / "budgets_gunicorn.conf.py"


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    """The gate directory (the test's own tmp_path); opened on the way out, whatever
    happened, so that no build is left waiting."""
    yield tmp_path
    (tmp_path / "open").touch()


def server_for(tmp_path: Path, gate: Path, workers: int, **env: str) -> GunicornServer:
    return GunicornServer(
        APP, tmp_path, f"budgets-{workers}", config=CONFIG,
        env={"GATE_DIR": str(gate), "REACHLIMIT_WAIT": "30", **env},
        workers=workers, workers_env="BUDGETS_WORKERS", bind_env="BUDGETS_BIND",
        threads=None, worker_class=None, access_log=False, ready_path="/health",
        token_env="SLOW_APP_TOKEN", identity_path="/debug/health", die_with_parent=True,
    )


def health(server: GunicornServer) -> dict[str, Any]:
    budgets: dict[str, Any] = server.get_json("/health")["budgets"]
    return budgets


def test_budgets_and_the_decorator_under_one_gunicorn_worker(
    tmp_path: Path, gate: Path
) -> None:
    server = server_for(tmp_path, gate, 1, REACHLIMIT_METRICS="true")
    held: list[threading.Thread] = []
    with serving(server):
        # "reports" (1 slot, no queue) full: refused at once, while the default builds.
        holder = threading.Thread(
            target=lambda: http_request(server.port, "GET", "/r/big", timeout=60), daemon=True
        )
        holder.start()
        held.append(holder)
        wait_until("the report building", lambda: "r-big" in running(gate))
        refused = server.get("/r/other")
        check_refusal(refused)
        assert "'reports'" in refused.json()["error"]
        herd = Herd(server.port, ["/c/x?a=1&b=2"] * 6 + ["/d/one"])
        wait_until("the default and the decorated view building",
                   lambda: {"d-one", "c-x"} <= set(running(gate)))
        (gate / "open").touch()
        replies = herd.results()
        assert [r.status for r in replies] == [200] * 7
        assert builds_logged(gate).count("c-x") == 1  # the herd built once
        # One stored it; the rest shared its build, or (arriving after it) hit its entry.
        statuses = [r.headers["cache-status"] for r in replies[:6]]
        assert statuses.count("reachlimit; fwd=uri-miss; stored") == 1, statuses
        assert all(s.endswith(("stored", "collapsed")) or s.startswith("reachlimit; hit")
                   for s in statuses), statuses
        again = server.get("/c/x?b=2&a=1")  # the same key, in the other order
        assert again.headers["cache-status"].startswith("reachlimit; hit; ttl=")
        assert again.json() == replies[0].json()
        assert builds_logged(gate).count("c-x") == 1
        holder.join(60)
        figures = health(server)
        assert set(figures) == {"default", "reports"}
        assert (figures["reports"]["capacity_active"], figures["reports"]["rejected_full"]) == (
            1, 1
        )
        assert figures["default"]["builds"] == 2 and figures["reports"]["builds"] == 1
        scrape = server.get("/metrics").body.decode()
        budgets = {s.labels.get("budget") for f in text_string_to_metric_families(scrape)
                   for s in f.samples}
        assert budgets == {"default", "reports"}


def test_a_sigkilled_workers_places_come_back_at_once_in_every_budget(
    tmp_path: Path, gate: Path, live_redis: RedisServer
) -> None:
    server = server_for(
        tmp_path, gate, 2, REACHLIMIT_REDIS_URL=live_redis.url(),
        REACHLIMIT_REDIS_PREFIX=f"gb-{os.getpid()}", REACHLIMIT_LEASE="60",
    )
    threads: list[threading.Thread] = []

    def ask(path: str) -> None:
        try:
            http_request(server.port, "GET", path, timeout=60)
        except OSError:
            pass  # the worker that had the connection was killed

    try:
        with serving(server):
            for path in ("/d/victim", "/r/victim"):
                threads.append(threading.Thread(target=ask, args=(path,), daemon=True))
                threads[-1].start()
            pids = wait_until("both builds running",
                              lambda: (lambda r: r if {"d-victim", "r-victim"} <= set(r)
                                       else None)(running(gate)))
            figures = health(server)
            assert (figures["default"]["active"], figures["reports"]["active"]) == (1, 1)
            for pid in {pids["d-victim"], pids["r-victim"]}:
                os.kill(pid, signal.SIGKILL)

            def freed() -> bool:
                f = health(server)
                return f["default"]["active"] == 0 and f["reports"]["active"] == 0

            # Well inside the 60 s lease: only child_exit can have given the places back.
            wait_until("both budgets' places back", freed, timeout=30)
            # child_exit logs what it freed after freeing it: the line may follow the figures.
            wait_until("child_exit's line", lambda: "build slot(s)" in server.stderr())
            for name in ("d-victim", "r-victim"):
                (gate / f"running-{name}").unlink(missing_ok=True)  # the dead builds' markers
            (gate / "open").touch()
            assert server.get("/r/after").status == 200  # the budget is whole again
    finally:
        (gate / "open").touch()
        for t in threads:
            t.join(70)
