"""The health answer on Redis never contradicts itself: the first one after Redis died says
``degraded`` together with ``redis.up: false`` and the outage counted, and the first one
after it is back says both again."""

from __future__ import annotations

import pytest
from flask import Flask

from tests.support.redis_clients import restart_if_stopped
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def test_the_first_health_answer_after_redis_died_agrees_with_itself(
    redis_app: Flask, live_redis: RedisServer
) -> None:
    client = redis_app.test_client()
    assert client.get("/report/a").status_code == 200
    health = client.get("/health").get_json()
    assert (health["reach"]["degraded"], health["redis"]["up"]) == (False, True)
    live_redis.stop()
    health = client.get("/health").get_json()  # the first call since Redis died
    assert health["reach"]["degraded"] is True
    assert health["redis"]["up"] is False, health["redis"]
    assert health["redis"]["outages"] == 1
    restart_if_stopped(live_redis)
    # The health's probe thread finds Redis back after its backoff; until then the figures
    # are the fallback's, and the health says so too.
    def back() -> bool:
        health = client.get("/health").get_json()
        assert health["reach"]["degraded"] is (not health["redis"]["up"]), health
        return health["reach"]["backend"] == "redis"

    wait_until("back on Redis", back, interval=0.01)
