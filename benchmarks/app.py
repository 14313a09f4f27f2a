"""The benchmark app: one Flask app for every load run, its admission policy a setting, its
builds counted in the worker or, with a Redis, in that Redis for every process together.

design:

    GET  /report?key=K   the expensive endpoint: a warm key (``warm-0`` ... ``warm-15``, put
                         in the policy's cache when the app is made) is answered from the
                         cache; any other key runs the build through the policy. The answer
                         says which address the app saw (``X-Bench-Peer``), how long the
                         request waited in the handler before its build started or it was
                         refused (``X-Bench-Waited-Ms``) and why it was refused
                         (``X-Bench-Refusal``: the limiter's reason). No key, an empty one or
                         one over 200 characters: 400.
    GET  /stats[?key=K]  {"pid", "token", "policy", "client", "deadline", "estimate",
                         "redis_path", "reach", "builds"}: ``reach`` is the extension's
                         figures (null under the other policies), ``builds`` the build
                         counter's (``key_builds``: the builds of ``K``)
    POST /stats/reset    a new scenario: the most builds at once back to those running now

The policies (``BENCH_POLICY``), each bounded by the one budget ``REACHLIMIT_ACTIVE``,
``REACHLIMIT_QUEUE`` and ``REACHLIMIT_WAIT`` (the extension's defaults when unset: 2, 8, 3 s):

    reachlimit     the Flask extension, configured from every ``REACHLIMIT_*`` variable (with
                   ``REACHLIMIT_REDIS_URL``: one budget for every process on that Redis)
    none           a cache and no limiter: every cold miss builds at once (under gunicorn
                   ``--threads 2``: the "pool2" of the load runs)
    timed-sem      cache check, then ``BoundedSemaphore(active).acquire(timeout=wait)``; a
                   timeout is a 429 with Retry-After
    refuse2        cache check, then ``BoundedSemaphore(active).acquire(blocking=False)``; busy
                   is a 429 at once
    flask-limiter  Flask-Limiter on the endpoint at ``BENCH_RATE`` (default ``active / build``
                   per second), then the ``none`` policy. In memory it is Flask-Limiter as a
                   Flask user adds it (keyed by client address; warm hits count); on a Redis
                   (``BENCH_REDIS_URL``) it is how a user approximates one budget for every
                   worker: one key for the service, a fixed window, warm keys exempt

:func:`policy` is the same policies without Flask, for ``threaded_burst.py`` (there
``reachlimit`` is the library's ``ColdPath`` on a ``ColdLimiter``).

Every build, whatever the policy, sleeps ``BENCH_BUILD_MS`` (200) between the two counts of
:class:`Builds` and returns when it was built (``built_at``, the wall clock). Settings are read in
:func:`create_app`, never at import. A benchmark-only app: ``/stats/reset`` has no place in a
real service.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from reachlimit import Busy, ColdLimiter, ColdPath, TTLCache

POLICIES = ("reachlimit", "none", "timed-sem", "refuse2", "flask-limiter")
WARM_KEYS = tuple(f"warm-{i}" for i in range(16))
MAX_KEY_CHARS = 200
#: What a refusal of the policies other than reachlimit tells the client.
RETRY_AFTER_S = 2
#: The build counter's keys in Redis, apart from every limiter's (one hash tag: one node).
REDIS_KEYS = {name: f"{{bench}}:builds:{name}"
              for name in ("in_flight", "max_in_flight", "started", "finished", "per_key")}

# KEYS: in_flight, max_in_flight, started, per_key; ARGV: the key. The maximum is raised in the
# same script as the increment, so no other process slips between the two.
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('INCR', KEYS[3])
redis.call('HINCRBY', KEYS[4], ARGV[1], 1)
return n
"""
# KEYS: in_flight, finished.
_LEAVE = """
redis.call('DECR', KEYS[1])
return redis.call('INCR', KEYS[2])
"""
# KEYS: in_flight, max_in_flight.
_RESET = """
return redis.call('SET', KEYS[2], redis.call('GET', KEYS[1]) or '0')
"""


class Refused(Exception):
    """A policy's refusal, with its reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Builds:
    """The simulated build and its counts: in flight now and the most at once, started,
    finished, per key, and when the last one ended. In this process (each field guarded by
    ``_lock``), or with ``client`` in that Redis for every process together. ``burn`` spins
    the CPU for the build's length instead of sleeping (holding the GIL)."""

    def __init__(self, build_s: float, client: Any = None, burn: bool = False) -> None:
        self.build_s = build_s
        self.burn = burn
        self._lock = threading.Lock()
        self._local = {"in_flight": 0, "max_in_flight": 0, "started": 0, "finished": 0}
        self._per_key: Counter[str] = Counter()  # guarded by _lock
        self.last_end = 0.0  # guarded by _lock; the wall clock
        self._client = client
        if client is not None:
            self._enter, self._leave, self._reset = (
                client.register_script(s) for s in (_ENTER, _LEAVE, _RESET))

    def __call__(self, key: str) -> dict[str, Any]:
        self._count_in(key)
        try:
            if self.burn:
                end = time.perf_counter() + self.build_s
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(self.build_s)
            return {"key": key, "built_at": time.time(), "built_by": os.getpid()}
        finally:
            self._count_out()

    def _count_in(self, key: str) -> None:
        if self._client is not None:
            k = REDIS_KEYS
            self._enter(keys=[k["in_flight"], k["max_in_flight"], k["started"], k["per_key"]],
                        args=[key])  # fmt: skip
            return
        with self._lock:
            c = self._local
            c["in_flight"] += 1
            c["started"] += 1
            c["max_in_flight"] = max(c["max_in_flight"], c["in_flight"])
            self._per_key[key] += 1

    def _count_out(self) -> None:
        if self._client is not None:
            self._leave(keys=[REDIS_KEYS["in_flight"], REDIS_KEYS["finished"]])
            return
        with self._lock:
            self._local["in_flight"] -= 1
            self._local["finished"] += 1
            self.last_end = time.time()

    @property
    def in_flight(self) -> int:
        """Builds running now (read without the lock: a probe's glance)."""
        return self._local["in_flight"]

    def most_for_one_key(self) -> int:
        with self._lock:
            return max(self._per_key.values(), default=0)

    def reset(self) -> None:
        if self._client is not None:
            self._reset(keys=[REDIS_KEYS["in_flight"], REDIS_KEYS["max_in_flight"]])
            return
        with self._lock:
            self._local["max_in_flight"] = self._local["in_flight"]

    def figures(self, key: str | None = None) -> dict[str, Any]:
        if self._client is not None:
            k, c = REDIS_KEYS, self._client
            counts = {name: int(c.get(k[name]) or 0)
                      for name in ("in_flight", "max_in_flight", "started", "finished")}
            return {**counts, "key_builds": int(c.hget(k["per_key"], key) or 0) if key else None}
        with self._lock:
            return {**self._local, "key_builds": self._per_key[key] if key else None}


Cold = Callable[[str, Callable[[], Any]], Any]


def policy(name: str, cache: TTLCache[Any], active: int, queue: int,
           wait: float) -> tuple[Cold, Callable[[], dict[str, Any]] | None]:  # fmt: skip
    """``cold(key, build)`` of a policy without Flask (the cached value, or ``build()``'s,
    cached, or :class:`Refused`), and its limiter's figures (None but for reachlimit)."""
    if name == "reachlimit":
        path: ColdPath[Any] = ColdPath(ColdLimiter(active=active, queue=queue, wait=wait), cache)

        def through_the_limiter(key: str, build: Callable[[], Any]) -> Any:
            try:
                return path.get(key, build)
            except Busy as busy:
                raise Refused(busy.reason) from None

        return through_the_limiter, lambda: path.stats().as_dict()

    sem = threading.BoundedSemaphore(active)

    def cold(key: str, build: Callable[[], Any]) -> Any:
        value = cache.get(key)
        if value is not None:
            return value
        if name in ("timed-sem", "refuse2"):
            got = sem.acquire(timeout=wait) if name == "timed-sem" else sem.acquire(blocking=False)
            if not got:
                raise Refused("timeout" if name == "timed-sem" else "queue_full")
        try:
            value = build()
            cache.set(key, value)
            return value
        finally:
            if name in ("timed-sem", "refuse2"):
                sem.release()

    if name not in ("none", "flask-limiter", "timed-sem", "refuse2"):
        raise ValueError(f"BENCH_POLICY must be one of {', '.join(POLICIES)}, got {name!r}")
    return cold, None


def create_app() -> Any:
    """The app factory (gunicorn ``app:create_app()`` from ``benchmarks/``)."""
    from flask import Flask, Response, jsonify, request

    from reachlimit.flask import CONFIG_KEYS, ColdRefused, ReachLimit, Settings

    name = os.environ.get("BENCH_POLICY", "reachlimit")
    build_s = float(os.environ.get("BENCH_BUILD_MS", "200")) / 1000
    counter_url = os.environ.get("BENCH_REDIS_URL")
    token = os.environ.get("BENCH_TOKEN")
    app = Flask(__name__)
    app.config.update({k: os.environ[k] for k in CONFIG_KEYS if k in os.environ})
    defaults = Settings()
    active = int(os.environ.get("REACHLIMIT_ACTIVE", defaults.active))
    queue = int(os.environ.get("REACHLIMIT_QUEUE", defaults.queue))
    wait = float(os.environ.get("REACHLIMIT_WAIT", defaults.wait))
    rate = os.environ.get("BENCH_RATE") or f"{max(1, round(active / build_s))} per second"
    client = None
    if counter_url:
        import redis

        client = redis.Redis.from_url(counter_url, socket_timeout=0.5, socket_connect_timeout=0.5)
    builds = Builds(build_s, client)
    warm = {"built_at": 0.0, "built_by": 0}
    rl: Any = None
    if name == "reachlimit":
        rl = ReachLimit(app)
        with app.app_context():
            for k in WARM_KEYS:
                rl.path.cache.set(k, {"key": k, **warm})
        cold = rl.cold
    else:
        cache: TTLCache[Any] = TTLCache(maxsize=100_000, ttl=3600.0)
        for k in WARM_KEYS:
            cache.set(k, {"key": k, **warm})
        cold, _ = policy(name, cache, active, queue, wait)

    def refusal(reason: str) -> Response:
        response = jsonify(error=f"busy ({reason}); please retry shortly", retryAfter=RETRY_AFTER_S)
        response.status_code = 429
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response

    def report() -> Any:
        key = request.args.get("key", "")
        if not key or len(key) > MAX_KEY_CHARS:
            return jsonify(error=f"give ?key= of 1 to {MAX_KEY_CHARS} characters"), 400
        arrived = time.perf_counter()
        started: list[float] = []

        def build() -> Any:
            started.append(time.perf_counter())
            return builds(key)

        reason = None
        try:
            response = jsonify(cold(key, build))
        except ColdRefused as refused:  # the extension's finished 429, and its reason
            response, reason = refused.response, refused.busy.reason
        except Refused as refused:
            response, reason = refusal(refused.reason), refused.reason
        waited = (started[0] if started else arrived if reason is None else time.perf_counter())
        response.headers["X-Bench-Waited-Ms"] = f"{(waited - arrived) * 1000:.3f}"
        response.headers["X-Bench-Peer"] = request.remote_addr or ""
        if reason is not None:
            response.headers["X-Bench-Refusal"] = reason
        return response

    if name == "flask-limiter":
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address

        if counter_url:
            limiter = Limiter(lambda: "cold-builds", app=app, storage_uri=counter_url,
                              strategy="fixed-window", headers_enabled=True)  # fmt: skip
            report = limiter.limit(rate, exempt_when=lambda: request.args.get("key") in WARM_KEYS)(
                report)
        else:
            report = Limiter(get_remote_address, app=app, storage_uri="memory://").limit(rate)(
                report)
    app.add_url_rule("/report", "report", report)

    @app.get("/stats")
    def stats() -> Any:
        settings = estimate = None
        if rl is not None:
            with app.app_context():
                settings = rl.settings()
                estimate = getattr(rl.path.limiter, "build_estimate", None)
        response = jsonify(
            pid=os.getpid(), token=token, policy=name,
            client=str(settings.client) if settings else None,
            deadline=settings.deadline if settings else None, estimate=estimate,
            redis_path="extension" if settings and settings.redis_url else None,
            reach=rl.stats().as_dict() if rl is not None else None,
            builds=builds.figures(request.args.get("key")),
        )  # fmt: skip
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.post("/stats/reset")
    def stats_reset() -> Any:
        builds.reset()
        return jsonify(builds.figures())

    return app
