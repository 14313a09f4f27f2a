"""The cold lead's checks catch a broken cold lead.

Each check passes with the real script (the ``lead`` operation of
``reachlimit/redis/lua/limiter.lua``) and fails, for the reason it names, with a mutant: the
real text with one piece replaced, the piece asserted to be there exactly once (so a change
of the real script fails here loudly instead of quietly testing the unchanged code). A mutant
is installed on the app's ``RedisColdLimiter`` in place of its script; each ``Mutant`` names
the check that catches it, and the tests are named by that check.

Mutants:

* its answer claims the flight for a refused leader too (``REFUSED_LEADER_CLAIMS``: followers
  in other processes would follow a flight whose outcome nobody publishes, until its lease
  ends);
* it does not read the cache (``NO_RECHECK``: an entry another process has just stored is
  built again);
* its answer never claims (``NEVER_CLAIMS``: a same-key request of another process leads a
  second build).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from flask import Flask

from reachlimit.redis import RedisColdLimiter
from tests.support.redis_lead import (
    app_fixture,  # noqa: F401 (the app fixture)
    close_app,
    flight_keys,
    ghosts_fill,
    make_app,
    watcher_fixture,  # noqa: F401 (the watcher fixture)
)
from tests.support.redis_mutants import Mutant, assert_caught, check_id, in_file, install, mutants
from tests.support.redis_server import (
    RedisServer,
    redis_server_fixture,  # noqa: F401 (the redis_server fixture)
)
from tests.support.waiting import DEADLINE, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def shared_limiter(app: Flask) -> RedisColdLimiter:
    remote = app.extensions["reachlimit"].path.limiter.remote
    assert isinstance(remote, RedisColdLimiter)
    return remote


def check_refusal_leaves_no_flight(app: Flask, watcher: redis.Redis, server: RedisServer) -> None:
    ghosts_fill(app, watcher)
    assert app.test_client().get("/report/refused").status_code == 429
    assert flight_keys(watcher, app) == [], "a refused leader claimed a flight"


def check_lead_rechecks_the_cache(app: Flask, watcher: redis.Redis, server: RedisServer) -> None:
    path = app.extensions["reachlimit"].path
    shared = path.cache.remote
    shared.set("k", {"key": "k", "build": 99, "pid": 0})  # another process's build
    shared.local.clear()
    reads: list[Any] = []
    inner = path.cache

    class Blind:
        """The first read misses, as if it came just before the other process's build."""

        def get(self, key: Any) -> Any:
            reads.append(key)
            return None if len(reads) == 1 else inner.get(key)

        def set(self, key: Any, value: Any) -> None:
            inner.set(key, value)

    path.cache = Blind()
    answer = app.test_client().get("/report/k").get_json()
    assert app.extensions["slow_app"].figures()["total"] == 0, "built though it was cached"
    assert answer["build"] == 99


def check_one_build_across_apps(app: Flask, watcher: redis.Redis, server: RedisServer) -> None:
    other = make_app(server, app.extensions["reachlimit"].settings.redis_prefix)
    try:
        gate = app.extensions["slow_app"]
        gate.gate.clear()
        answers: dict[str, Any] = {}

        def ask(name: str, which: Flask) -> None:
            answers[name] = which.test_client().get("/report/herd")

        first = threading.Thread(target=ask, args=("first", app))
        first.start()
        wait_until("the first app builds", lambda: gate.figures()["in_flight"] == 1)
        second = threading.Thread(target=ask, args=("second", other))
        second.start()
        limiter = shared_limiter(app)
        base = other.extensions["reachlimit"].path.flight.remote.base_of("herd")
        # The second request follows the flight (counted in F:w:<n>) or, without a claim to
        # follow, waits in the queue for the one slot.
        wait_until("the second request is in Redis", lambda: watcher.keys(base + "w:*")
                   or limiter.stats().queued == 1)
        gate.gate.set()
        first.join(DEADLINE)
        second.join(DEADLINE)
        assert not first.is_alive() and not second.is_alive()
        assert answers["first"].get_json() == answers["second"].get_json()
        assert other.extensions["slow_app"].figures()["total"] == 0, "built twice"
    finally:
        close_app(other)


_CLAIM_ONLY_ADMITTED = "    if status == 1 or status == 2 then"
_READ = "  if entry then return {3, entry, redis.call('PTTL', KEYS[2])} end"

REFUSED_LEADER_CLAIMS = Mutant(in_file("limiter", (_CLAIM_ONLY_ADMITTED, "    if true then")),
                               check_refusal_leaves_no_flight, "claimed a flight")
NO_RECHECK = Mutant(in_file("limiter", (_READ, "  entry = nil")),
                    check_lead_rechecks_the_cache, "built though it was cached")
NEVER_CLAIMS = Mutant(in_file("limiter", (_CLAIM_ONLY_ADMITTED, "    if false then")),
                      check_one_build_across_apps, "built twice")

#: Each mutant by the name of the check that catches it (the tests' ids).
BY_CHECK = {check_id(m.check): m for m in mutants(globals()).values()}


@pytest.mark.parametrize("name", sorted(BY_CHECK))
def test_check_passes_with_the_real_script(
    name: str, app: Flask, watcher: redis.Redis, redis_server: RedisServer
) -> None:
    BY_CHECK[name].check(app, watcher, redis_server)


@pytest.mark.parametrize("name", sorted(BY_CHECK))
def test_check_fails_with_its_mutant(
    name: str, app: Flask, watcher: redis.Redis, redis_server: RedisServer
) -> None:
    row = BY_CHECK[name]
    install(shared_limiter(app), row.changes)
    assert_caught(row.reason, row.check, app, watcher, redis_server)
