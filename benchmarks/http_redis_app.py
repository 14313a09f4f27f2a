"""The server side of ``benchmarks/http_redis.py``: one Flask app, one of three ways to hold a
cold-build budget across several gunicorn servers and workers on one Redis.

design:

    GET  /report?key=K   the expensive endpoint: a warm key (``warm-0`` ... ``warm-15``, put in
                         every worker's cache when the app is made) is answered from the cache;
                         any other key runs the simulated build through the chosen variant.
                         No key, an empty one or one over 200 characters: 400 JSON.
    GET  /stats          {"variant", "redis_path", "pid", "token", "limiter"}: ``limiter`` is
                         the Redis limiter's global figures (all processes together) under
                         ``redis``, null under the other variants

The variant comes from ``BENCH_VARIANT``:

    process        the reachlimit Flask extension as it ships: an in-process ColdLimiter
                   (active, queue, wait) in *every* worker, so the service as a whole runs up
                   to servers x workers x active builds at once
    redis          reachlimit's warm cache and singleflight in each worker, in front of one
                   RedisColdLimiter (active, queue, wait) shared by every worker of every server
    flask-limiter  Flask-Limiter on the endpoint with its Redis storage
                   (``storage_uri=redis://...``), a rate of ``active / build time`` per second
                   (``BENCH_RATE``) under one key for the whole service, warm keys exempt; then
                   a dict cache and an unlimited build. Flask-Limiter has no concurrency limit:
                   this is how a Flask user approximates "at most ``active`` builds at once".

How ``redis`` is wired (``redis_path`` in ``/stats``): through the Flask extension when
``reachlimit.flask.Settings`` has a ``redis_url`` option (``REACHLIMIT_REDIS_URL``), otherwise
with the library directly: ``ColdPath(RedisColdLimiter(...))`` and a ``Busy`` turned into the
same 429 with Retry-After as the extension's. ``BENCH_REDIS_VIA=library`` forces the second.
Only :func:`redis_cold` knows the difference.

Every build, whatever the variant, is counted in Redis around its sleep (``BUILD_KEYS``, apart
from every limiter's keys): builds in flight across all processes and their maximum (one Lua
script on the way in), builds started and finished, and the Redis time (ms) each one finished.

Settings are read in ``create_app`` from the environment (``BENCH_*``), never at import time.
A benchmark-only app: it trusts its client and has no place in a real service.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import redis
from flask import Flask, Response, jsonify, request
from http_app import stats_response

VARIANTS = ("process", "redis", "flask-limiter")
WARM_KEYS = tuple(f"warm-{i}" for i in range(16))
#: The limiter's name in Redis (its keys are ``{reachlimit:<name>}:...``).
LIMITER_NAME = "bench-cold"
#: The build counters, apart from every limiter's keys: in flight now, the most at once,
#: builds started, builds finished, and the Redis time (ms) each build finished.
BUILD_KEYS = {
    "in_flight": "bench:builds:in_flight",
    "max_in_flight": "bench:builds:max_in_flight",
    "started": "bench:builds:started",
    "finished": "bench:builds:finished",
    "finished_at": "bench:builds:finished_at",
}
MAX_KEY_CHARS = 200

# KEYS: in_flight, max_in_flight, started. The maximum is raised in the same script as the
# increment, so no other process can slip between the two.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('INCR', KEYS[3])
return n
"""
# KEYS: in_flight, finished, finished_at.
_LEAVE = """
redis.call('DECR', KEYS[1])
redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return 1
"""


def redis_client(url: str) -> redis.Redis:
    """A client with short timeouts, as ``RedisColdLimiter``'s docstring asks."""
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


class CountedBuild:
    """The simulated cold build: sleeps ``build_s`` between the two counting scripts."""

    def __init__(self, client: redis.Redis, build_s: float) -> None:
        self.build_s = build_s
        self._enter = client.register_script(_ENTER)
        self._leave = client.register_script(_LEAVE)

    def __call__(self, key: str) -> dict[str, Any]:
        k = BUILD_KEYS
        self._enter(keys=[k["in_flight"], k["max_in_flight"], k["started"]])
        try:
            time.sleep(self.build_s)
        finally:
            self._leave(keys=[k["in_flight"], k["finished"], k["finished_at"]])
        return {"key": key, "built_by": os.getpid()}


def refusal(reason: str, retry_after: int) -> Response:
    """A 429 with Retry-After, as the reachlimit extension answers."""
    response = jsonify(error=f"busy ({reason}); please retry shortly", retryAfter=retry_after)
    response.status_code = 429
    response.headers["Retry-After"] = str(retry_after)
    response.headers["Cache-Control"] = "no-store"
    return response


def extension_has_redis() -> bool:
    from reachlimit.flask import Settings

    return "redis_url" in {f.name for f in fields(Settings)}


Cold = Callable[[str, Callable[[], Any]], Any]


def redis_cold(
    app: Flask, url: str, active: int, queue: int, wait: float, via: str
) -> tuple[Cold, Callable[[], dict[str, Any]], str]:
    """The ``redis`` variant's cold path: (``cold(key, build)`` returning a value or a
    response, the limiter's global figures, how it was wired)."""
    if via == "extension":
        # The one line the extension replaces all of the below with.
        from reachlimit.flask import ReachLimit

        app.config["REACHLIMIT_REDIS_URL"] = url
        rl = ReachLimit(app, active=active, queue=queue, wait=wait)
        with app.app_context():
            for k in WARM_KEYS:
                rl.path.cache.set(k, {"key": k, "built_by": 0})
            limiter = rl.path.limiter
        return rl.cold, lambda: limiter.stats().as_dict(), "extension"

    from reachlimit import Busy, Cancelled, ColdPath, TTLCache, watch_client
    from reachlimit.redis import RedisColdLimiter

    limiter = RedisColdLimiter(
        redis_client(url), name=LIMITER_NAME, active=active, queue=queue, wait=wait
    )
    path = ColdPath(limiter, TTLCache())
    for k in WARM_KEYS:
        path.cache.set(k, {"key": k, "built_by": 0})

    def cold(key: str, build: Callable[[], Any]) -> Any:
        try:
            return path.get(key, build, watch_client(request.environ))
        except Busy as busy:
            return refusal(busy.reason, busy.retry_after)
        except Cancelled:
            return Response(b"", status="499 Client Closed Request")

    return cold, lambda: limiter.stats().as_dict(), "library"


def create_app() -> Flask:
    """The app factory (gunicorn: ``'http_redis_app:create_app()'`` run from ``benchmarks/``)."""
    variant = os.environ.get("BENCH_VARIANT", "redis")
    if variant not in VARIANTS:
        raise ValueError(f"BENCH_VARIANT must be one of {', '.join(VARIANTS)}, got {variant!r}")
    url = os.environ["BENCH_REDIS_URL"]
    build_s = float(os.environ.get("BENCH_BUILD_MS", "100")) / 1000
    active = int(os.environ.get("BENCH_ACTIVE", "2"))
    queue = int(os.environ.get("BENCH_QUEUE", "8"))
    wait = float(os.environ.get("BENCH_WAIT", "3"))
    rate = os.environ.get("BENCH_RATE", f"{max(1, round(active / build_s))} per second")
    via = os.environ.get("BENCH_REDIS_VIA", "auto")
    if via not in ("auto", "library", "extension"):
        raise ValueError(f"BENCH_REDIS_VIA must be auto, library or extension, got {via!r}")
    if via == "auto":
        via = "extension" if extension_has_redis() else "library"
    token = os.environ.get("BENCH_TOKEN")

    app = Flask(__name__)
    build = CountedBuild(redis_client(url), build_s)
    limiter_figures: Callable[[], dict[str, Any]] | None = None
    redis_path: str | None = None
    view: Callable[[str], Any]

    def guard(f: Callable[[], Any]) -> Any:  # flask-limiter's replaces it
        return f

    if variant == "process":
        from reachlimit.flask import ReachLimit

        rl = ReachLimit(app, active=active, queue=queue, wait=wait)
        with app.app_context():
            for k in WARM_KEYS:
                rl.path.cache.set(k, {"key": k, "built_by": 0})

        def view(key: str) -> Any:
            return jsonify(rl.cold(key, lambda: build(key)))

    elif variant == "redis":
        cold, limiter_figures, redis_path = redis_cold(app, url, active, queue, wait, via)

        def view(key: str) -> Any:
            value = cold(key, lambda: build(key))
            return value if isinstance(value, Response) else jsonify(value)

    else:  # flask-limiter
        from flask_limiter import Limiter

        cache: dict[str, Any] = {k: {"key": k, "built_by": 0} for k in WARM_KEYS}
        # One GIL-atomic dict get or set at a time: enough for a cache with no eviction.

        def view(key: str) -> Any:
            value = cache.get(key)
            if value is None:
                value = cache[key] = build(key)
            return jsonify(value)

        # One budget for the whole service (a constant key, not the client's address), kept
        # in Redis so every worker of every server shares it; Retry-After on the 429.
        limiter = Limiter(
            lambda: "cold-builds",
            app=app,
            storage_uri=url,
            strategy="fixed-window",
            headers_enabled=True,
        )
        guard = limiter.limit(  # noqa: F811 (the limit replaces the no-op)
rate, exempt_when=lambda: request.args.get("key") in cache)

    def report() -> Any:
        key = request.args.get("key", "")
        if not key or len(key) > MAX_KEY_CHARS:
            response = jsonify(error=f"give ?key= of 1 to {MAX_KEY_CHARS} characters")
            response.status_code = 400
            return response
        return view(key)

    app.add_url_rule("/report", "report", guard(report))

    @app.get("/stats")
    def stats() -> Any:
        return stats_response(
            variant=variant,
            redis_path=redis_path,
            pid=os.getpid(),
            token=token,
            limiter=limiter_figures() if limiter_figures is not None else None,
        )

    return app
