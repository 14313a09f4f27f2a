"""What a cold request through the Flask extension costs Redis, counted at the server.

The cold path on Redis makes one round trip before its build starts or its refusal is sent,
once the cache's in-process first level has missed: the cold lead (one EVALSHA: the cache's
read, the flight's claim and the acquire in one script; ``reachlimit/redis/_lead.py``), which
also answers an entry another process stored, as the hit it is. Counted with ``MONITOR`` on
the test's own redis-server (the commands scripts make inside left out), with nothing else
talking to it:
the app's counters thread is stopped first (it flushes about once a second), no grant is held
long enough to be renewed (the lease is two minutes), and the scripts and the budget's
settings check are loaded and made by a warm-up request (once per process).

Besides the counts: a refused leader leaves no trace of its flight (nobody could follow it,
so there is nothing to publish), a leader queued by the cold lead still waits and builds, and
an admission the lead made that the leader step never takes (the value turned up in the first
level) is given back at once. The lead's recheck, its claim and its refusal are proved against
mutants of the script in ``test_redis_lead_mutants.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import redis
from flask import Flask

from tests.apps.slow_app import BuildGate
from tests.support.redis_clients import Commands
from tests.support.redis_lead import (
    app_fixture,  # noqa: F401 (the app fixture)
    flight_keys,
    ghosts_fill,
    quiet,
    watcher_fixture,  # noqa: F401 (the watcher fixture)
)
from tests.support.redis_limiters import GIVE_UP
from tests.support.redis_server import (
    redis_server_fixture,  # noqa: F401 (the redis_server fixture)
)
from tests.support.waiting import DEADLINE, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def test_a_refused_cold_request_makes_one_round_trip_and_leaves_no_flight(
    app: Flask, watcher: redis.Redis
) -> None:
    lim, _ = ghosts_fill(app, watcher)
    http = app.test_client()
    # Warm-up: the settings check, the eviction warning, the script, and the lead sent after
    # a refusal (the second refusal's).
    for warm in ("warm-1", "warm-2"):
        assert http.get(f"/report/{warm}").status_code == 429
    quiet(app)
    commands = Commands(watcher)

    answer = http.get("/report/refused")

    sent = commands.until_now()
    assert answer.status_code == 429
    assert sent == Counter({"EVALSHA": 1})
    assert lim.stats().rejected_full == 3  # refused for a full queue, each of the three
    assert flight_keys(watcher, app) == [], "a refused leader claimed or published a flight"
    assert app.extensions["slow_app"].figures()["total"] == 0


def test_an_admitted_cold_request_makes_one_round_trip_before_its_build(
    app: Flask, watcher: redis.Redis
) -> None:
    http = app.test_client()
    assert http.get("/report/warm").status_code == 200  # loads the scripts, checks settings
    quiet(app)
    gate: BuildGate = app.extensions["slow_app"]
    gate.gate.clear()
    commands = Commands(watcher)
    answers: list[Any] = []
    request = threading.Thread(target=lambda: answers.append(http.get("/report/cold")))
    request.start()
    try:
        wait_until("the build started", lambda: gate.figures()["in_flight"] == 1)
        sent = commands.until_now()
    finally:
        gate.gate.set()
        request.join(DEADLINE)
    assert not request.is_alive()
    assert sent == Counter({"EVALSHA": 1})
    assert answers[0].status_code == 200
    assert answers[0].get_json()["key"] == "cold"
    assert flight_keys(watcher, app), "a leader that built left no flight (outcome, counter)"


def test_an_entry_the_cold_lead_finds_is_answered_as_a_hit_in_one_round_trip(
    app: Flask, watcher: redis.Redis
) -> None:
    """Another process stored the value a moment ago: the lead's read finds it, and the
    answer is the hit it is (Cache-Status with the seconds of freshness Redis holds, counted
    a hit), not a value this request built."""
    http = app.test_client()
    assert http.get("/report/warm").status_code == 200
    shared = app.extensions["reachlimit"].path.cache.remote
    shared.set("elsewhere", {"key": "elsewhere", "build": 99, "pid": 0})  # another process's
    shared.local.clear()  # this process's first level never saw it
    hits = app.extensions["reachlimit"].path.counts().hits
    quiet(app)
    commands = Commands(watcher)

    answer = http.get("/report/elsewhere")

    sent = commands.until_now()
    assert sent == Counter({"EVALSHA": 1})
    assert answer.get_json() == {"key": "elsewhere", "build": 99, "pid": 0}
    status = answer.headers["Cache-Status"]
    assert status.startswith("reachlimit; hit; ttl="), status
    assert 0 < int(status.rsplit("=", 1)[1]) <= shared.ttl
    assert app.extensions["reachlimit"].path.counts().hits == hits + 1
    assert app.extensions["slow_app"].figures()["total"] == 1  # the warm-up's build only
    flight = app.extensions["reachlimit"].path.flight.remote
    assert watcher.keys(flight.base_of("elsewhere") + "*") == [], "a hit claimed a flight"


def test_a_leader_queued_by_the_cold_lead_waits_and_builds(
    app: Flask, watcher: redis.Redis
) -> None:
    lim, ghosts = ghosts_fill(app, watcher)
    ghosts.poll("waiter", GIVE_UP)  # the ghost waiter gives up its place: one is free
    http = app.test_client()
    answers: list[Any] = []
    request = threading.Thread(target=lambda: answers.append(http.get("/report/queued")))
    request.start()
    try:
        wait_until("the leader queued", lambda: lim.stats().queued == 1)
        assert ghosts.release("holder") == 1  # promotes the app's leader
        request.join(DEADLINE)
    finally:
        request.join(DEADLINE)
    assert not request.is_alive()
    assert answers[0].status_code == 200
    assert app.extensions["slow_app"].figures()["total"] == 1


def test_an_admission_the_leader_step_does_not_take_is_given_back(
    app: Flask, watcher: redis.Redis
) -> None:
    http = app.test_client()
    assert http.get("/report/warm").status_code == 200
    path = app.extensions["reachlimit"].path
    shared = path.cache.remote

    class FoundOnRecheck:
        """The first cache read misses; the leader step's recheck finds the value in the
        first level (a thread of this process built it meanwhile), so it never acquires."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.reads = 0

        def get(self, key: Any) -> Any:
            self.reads += 1
            if self.reads == 1:
                return None
            shared.local.set(key, {"key": key, "build": 0, "pid": 0})
            return self.inner.get(key)

        def set(self, key: Any, value: Any) -> None:
            self.inner.set(key, value)

    path.cache = FoundOnRecheck(path.cache)
    answer = http.get("/report/late")
    assert answer.get_json() == {"key": "late", "build": 0, "pid": 0}
    stats = path.limiter.stats()
    assert (stats.active, stats.queued) == (0, 0), "the lead's slot was not given back"
    assert app.extensions["slow_app"].figures()["total"] == 1  # the warm-up's build only
