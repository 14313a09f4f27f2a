"""The shared backend over TLS (``rediss://``), against a redis-server with TLS on and a
password, with a CA and a server certificate the test makes (``tests/support/redis_tls.py``).

design:

    Under real gunicorn (2 workers, the shipped config) on ``rediss://:<password>@127.0.0.1:
    <port>/0?ssl_ca_certs=<ca>&ssl_cert_reqs=required``, redis-py's own parameters: a burst
    of 40 distinct cold keys whose builds the test holds admits exactly 2 building and at
    most 8 waiting in Redis (read over TLS by the test's own limiter, awaited until all 40
    are accounted for there: a waiter dropped on a loaded machine for missing its presence
    period is a 429 "waited too long", counted once it polls) and answers every admitted
    request 200 and every other 429, each counted in Redis. Then the TLS Redis is stopped
    and the next request is answered from the fallback, so that the outage's warning is
    written. The password is in none of: the health answer (``redis.url`` masked),
    gunicorn's logs (the outage warning included).

    In-process, a client that trusts another CA cannot verify the server: every request is
    answered from the fallback (200, ``degraded``), the health view says why, masked, and
    neither the log records nor an answer shows the password; never a 500.

    ``benchmarks/redis_micro.py --tls`` (TLS against plain TCP) is run once, for its report's
    shape only.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from reachlimit.flask import ReachLimit
from reachlimit.redis import RedisColdLimiter, RedisLimiterStats, connect
from tests.apps.slow_app import add_cold_routes
from tests.support.bench_scripts import run_json
from tests.support.clients import Herd, check_refusal
from tests.support.gunicorn_server import serving
from tests.support.redis_sentinel import (  # noqa: F401 - the gate fixture
    Gate,
    build_log_server,
    gate_fixture,
)
from tests.support.redis_server import require_binary
from tests.support.redis_tls import (  # noqa: F401 - the tls_redis fixture
    SECRET,
    TLSRedis,
    tls_redis_fixture,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

PREFIX = "tls"


@pytest.mark.gunicorn
def test_a_burst_over_tls_admits_exactly_the_budget_and_the_password_never_shows(
    tmp_path: Path, gate: Gate, tls_redis: TLSRedis
) -> None:
    url = tls_redis.url()
    server = build_log_server(tmp_path, "tls", gate, url, {
        "REACHLIMIT_REDIS_PREFIX": PREFIX, "REACHLIMIT_WAIT": "30"})
    client = connect(url)
    watch = RedisColdLimiter(client, "cold", 2, 8, 30.0, prefix=PREFIX)
    try:
        with serving(server):
            health = server.get_json("/health")
            assert health["redis"]["up"] is True and health["reach"]["backend"] == "redis"
            assert health["redis"]["url"].startswith("rediss://:***@127.0.0.1:")
            assert "ssl_ca_certs=" in health["redis"]["url"]

            herd = Herd(server.port, [f"/report/hold-{n}" for n in range(40)])
            refused = herd.wait_done(30)
            for reply in refused:
                check_refusal(reply)
            # Read over TLS too, and awaited: every request that is not building is queued
            # or was refused, each refusal counted in Redis before its answer was sent. On a
            # loaded machine a waiter that misses its presence period is dropped (a 429
            # "waited too long", counted rejected_timeout) and a newcomer may take its place,
            # so the refusals are queue_full and timeout together; the figures agree once a
            # dropped waiter has polled and learnt it.
            stats = wait_until_accounted(watch, 40)
            assert (stats.active, stats.peak_active, stats.peak_queued) == (2, 2, 8)
            assert stats.rejected_full >= 30 - 8  # most of the burst found the queue full
            during = server.get("/health")
            gate.open()
            statuses = Counter(r.status for r in herd.results())
            after_burst = watch.stats()
            assert set(statuses) == {200, 429} and sum(statuses.values()) == 40
            assert statuses[200] == after_burst.acquired <= 10  # only admitted ones built
            assert statuses[429] == after_burst.rejected_full + after_burst.rejected_timeout

            tls_redis.stop()  # an outage: its warning shows the URL, masked

            def on_the_fallback() -> bool:
                reply = server.get("/report/after-the-outage")
                assert reply.status == 200, reply
                return "is unavailable" in server.stderr()

            wait_until("the outage logged", on_the_fallback)
            after = server.get("/health")
            assert after.status == 200 and after.json()["reach"]["degraded"] is True
    finally:
        watch.close()
        client.close()
    logs = server.stderr() + server.stdout()
    assert "rediss://:***@127.0.0.1:" in logs
    for text in (logs, during.body.decode(), after.body.decode()):
        assert SECRET not in text


def wait_until_accounted(watch: RedisColdLimiter, burst: int) -> RedisLimiterStats:
    """The shared limiter's figures once every request of the burst is accounted for in
    Redis: building, queued, or refused (queue full, or dropped from the queue)."""
    seen: list[RedisLimiterStats] = []

    def accounted() -> bool:
        s = watch.stats()
        seen.append(s)
        return s.active + s.queued + s.rejected_full + s.rejected_timeout == burst

    wait_until(f"the {burst} requests of the burst accounted for in Redis", accounted)
    return seen[-1]


def make_app(url: str) -> tuple[Flask, ReachLimit]:
    app = Flask(__name__)
    app.config.update(REACHLIMIT_REDIS_URL=url, REACHLIMIT_REDIS_PREFIX=PREFIX)
    rl = ReachLimit(app)

    def build(key: str) -> dict[str, Any]:
        return {"key": key}

    add_cold_routes(app, rl, build)
    return app, rl


def test_a_server_the_client_cannot_verify_is_a_clean_fallback_answer(
    tls_redis: TLSRedis, caplog: pytest.LogCaptureFixture
) -> None:
    app, rl = make_app(tls_redis.url(ca=tls_redis.certs.wrong_ca))
    caplog.set_level(logging.DEBUG)
    try:
        with app.test_client() as http:
            for n in range(3):
                reply = http.get(f"/report/k{n}")
                assert reply.status_code == 200, reply.data
                assert reply.get_json() == {"key": f"k{n}"}
            health = http.get("/health")
            assert health.status_code == 200
            body = health.get_json()
    finally:
        rl.close(app)
    assert body["reach"]["backend"] == "local" and body["reach"]["degraded"] is True
    assert body["redis"]["up"] is False
    assert "certificate verify failed" in body["redis"]["last_error"], body["redis"]
    assert body["redis"]["url"].startswith("rediss://:***@")
    assert "is unavailable" in caplog.text
    assert SECRET not in caplog.text and SECRET not in health.get_data(as_text=True)


def test_the_right_ca_but_a_wrong_password_is_a_clean_fallback_answer_too(
    tls_redis: TLSRedis, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-" + SECRET
    app, rl = make_app(tls_redis.url(password=wrong))
    caplog.set_level(logging.DEBUG)
    try:
        with app.test_client() as http:
            assert http.get("/report/k").status_code == 200
            body = http.get("/health").get_json()
    finally:
        rl.close(app)
    assert body["reach"]["degraded"] is True and body["redis"]["up"] is False
    assert wrong not in caplog.text and wrong not in str(body)


def test_the_tls_micro_benchmark_runs() -> None:
    """benchmarks/redis_micro.py --tls, as a process with its own two servers (one with TLS,
    its certificate made by openssl): it finishes and reports each path over TLS against
    plain TCP (never its speed)."""
    require_binary("redis-server", "redis-server")
    require_binary("openssl", "openssl")
    report = run_json("redis_micro.py", "--tls")
    for key in ("tls_fast_path", "tls_refusal", "tls_ping"):
        row = report["results"][key]
        assert row["limiter_us"] > 0 and row["baseline_us"] > 0 and row["ratio"] > 0
    checks = report["results"]["tls_refusal"]["check"]
    assert checks["plain"]["ok"] and checks["tls"]["ok"], checks
