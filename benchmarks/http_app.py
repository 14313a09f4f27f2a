"""The server side of ``benchmarks/http_load.py``: one Flask app, one admission policy.

design:

    GET  /cold/<key>     the expensive endpoint: a warm hit (a cached key) is answered from the
                         cache; a cold key runs the simulated build through the chosen policy
    GET  /stats          {"in_flight", "max_in_flight", "builds", "key_builds", "policy",
                         "pid", "token", "reach"}: builds seen by this process (``key_builds``
                         counts the builds of ``?key=...``; ``reach`` is ReachLimit's figures,
                         or null under the other policies)
    POST /stats/reset    start a new scenario: ``max_in_flight`` back to what is in flight now

Warm and cold share the one route, as in the service this project protects (a reach report
is cached or it is not): ``WARM_KEYS`` are put in the policy's cache when the app is made, so
``/cold/warm-3`` is a warm hit. That matters for ``flask-limiter``, whose rate limit on the
route counts warm hits too.

The simulated build sleeps ``BENCH_BUILD_MS`` (default 200 ms: a database scan waiting on I/O)
and counts the builds in flight and their maximum under one lock. The policy comes from
``BENCH_POLICY``:

    none           a dict cache, no limiter: every cold miss builds at once
                   (``pool2`` in http_load.py is this app under gunicorn ``--threads 2``)
    timed-sem      cache check, then BoundedSemaphore(BENCH_ACTIVE).acquire(timeout=BENCH_WAIT);
                   a timeout is 429 with Retry-After: 2
    refuse2        cache check, then BoundedSemaphore(BENCH_ACTIVE).acquire(blocking=False);
                   busy is 429 at once
    flask-limiter  Flask-Limiter (in-memory storage, the default fixed window, keyed by client
                   address) with ``BENCH_RATE`` (default "10 per second") on /cold/<key>, then
                   the same dict cache and an unlimited build, as a Flask user would write it
    reachlimit     ReachLimit with its defaults (active 2, queue 8), wait BENCH_WAIT (default 3)

Every setting is read in ``create_app`` from the environment, never at import time. A
benchmark-only app: ``/stats/reset`` has no place in a real service.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, request

POLICIES = ("none", "timed-sem", "refuse2", "flask-limiter", "reachlimit")
WARM_KEYS = tuple(f"warm-{i}" for i in range(16))
#: What a refusal tells the client, as the reachlimit extension does.
RETRY_AFTER_S = 2


def stats_response(**figures: Any) -> Response:
    """A benchmark app's ``/stats`` answer: ``figures`` as JSON, never cached (every app of
    ``benchmarks/`` answers its figures this way)."""
    response = jsonify(**figures)
    response.headers["Cache-Control"] = "no-store"
    return response


class ColdWork:
    """The simulated cold build; runs in the request threads. Every field is guarded by
    ``_lock``."""

    def __init__(self, build_s: float) -> None:
        self.build_s = build_s
        self._lock = threading.Lock()
        self.in_flight = 0  # guarded by _lock
        self.max_in_flight = 0  # guarded by _lock
        self.builds = 0  # guarded by _lock
        self.per_key: Counter[str] = Counter()  # guarded by _lock

    def build(self, key: str) -> dict[str, Any]:
        with self._lock:
            self.in_flight += 1
            self.builds += 1
            self.per_key[key] += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            number = self.builds
        try:
            time.sleep(self.build_s)
            return {"key": key, "build": number}
        finally:
            with self._lock:
                self.in_flight -= 1

    def reset(self) -> None:
        with self._lock:
            self.max_in_flight = self.in_flight

    def figures(self, key: str | None) -> dict[str, Any]:
        with self._lock:
            return {
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "builds": self.builds,
                "key_builds": self.per_key[key] if key else None,
            }


def _refusal(reason: str) -> Response:
    response = jsonify(error=f"busy ({reason}); please retry shortly", retryAfter=RETRY_AFTER_S)
    response.status_code = 429
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def create_app() -> Flask:
    """The app factory (gunicorn: ``'http_app:create_app()'`` run from ``benchmarks/``)."""
    policy = os.environ.get("BENCH_POLICY", "none")
    if policy not in POLICIES:
        raise ValueError(f"BENCH_POLICY must be one of {', '.join(POLICIES)}, got {policy!r}")
    build_s = float(os.environ.get("BENCH_BUILD_MS", "200")) / 1000
    wait = float(os.environ.get("BENCH_WAIT", "3"))
    active = int(os.environ.get("BENCH_ACTIVE", "2"))
    rate = os.environ.get("BENCH_RATE", "10 per second")
    token = os.environ.get("BENCH_TOKEN")

    app = Flask(__name__)
    work = ColdWork(build_s)
    cache: dict[str, Any] = {k: {"key": k, "build": 0} for k in WARM_KEYS}
    # One GIL-atomic dict get or set at a time: enough for a cache with no eviction.

    def build_and_cache(key: str) -> dict[str, Any]:
        value = work.build(key)
        cache[key] = value
        return value

    cold: Callable[[str], Any]
    reach_stats: Callable[[], dict[str, Any]] | None = None

    if policy in ("none", "flask-limiter"):

        def cold(key: str) -> Any:
            value = cache.get(key)
            return jsonify(value if value is not None else build_and_cache(key))

    elif policy in ("timed-sem", "refuse2"):
        sem = threading.BoundedSemaphore(active)
        blocking = policy == "timed-sem"

        def cold(key: str) -> Any:
            value = cache.get(key)
            if value is not None:
                return jsonify(value)
            got = sem.acquire(timeout=wait) if blocking else sem.acquire(blocking=False)
            if not got:
                return _refusal("timeout" if blocking else "queue_full")
            try:
                return jsonify(build_and_cache(key))
            finally:
                sem.release()

    else:  # reachlimit
        from reachlimit.flask import ReachLimit

        rl = ReachLimit(app, wait=wait)
        with app.app_context():
            for k in WARM_KEYS:
                rl.path.cache.set(k, {"key": k, "build": 0})

        def cold(key: str) -> Any:
            return jsonify(rl.cold(key, lambda: work.build(key)))

        def reach_figures() -> dict[str, Any]:
            return rl.stats().as_dict()

        reach_stats = reach_figures

    def cold_view(key: str) -> Any:
        return cold(key)

    if policy == "flask-limiter":
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address

        limiter = Limiter(get_remote_address, app=app, storage_uri="memory://")
        cold_view = limiter.limit(rate)(cold_view)

    app.add_url_rule("/cold/<key>", "cold", cold_view)

    @app.get("/stats")
    def stats() -> Any:
        return stats_response(
            **work.figures(request.args.get("key")),
            policy=policy,
            pid=os.getpid(),
            token=token,
            reach=reach_stats() if reach_stats is not None else None,
        )

    @app.post("/stats/reset")
    def stats_reset() -> Any:
        work.reset()
        return jsonify(work.figures(None))

    return app
