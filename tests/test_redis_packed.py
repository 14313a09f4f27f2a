"""The limiter's calls sent pre-packed on a connection of a plain client's pool
(``reachlimit/redis/_packed.py``), against a real redis-server: which clients take that path,
and that what redis-py's own path promises holds on it too. A script Redis lost is loaded
again (also on a pool of one connection), a socket timeout drops its connection (no reply left
half-read for the next call) and the token is given up, the client's retry retries exactly
when ``execute_command`` would, and a due health check sends its ``PING`` first. What a
client sends is counted at the server (``Commands``: ``MONITOR``). A forked child's calls are
in ``tests/test_fork.py``; TLS and Sentinel clients (which take this path) in their modules.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from reachlimit.redis import RedisColdLimiter, connect, lua
from reachlimit.redis._packed import PackedScript
from tests.support import HOST
from tests.support.redis_clients import RETRIED_ERRORS, Commands, CountingRedis
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def test_a_plain_client_sends_pre_packed_and_any_other_through_execute_command(
    client: CountingRedis, plain_client: redis.Redis, redis_server: RedisServer
) -> None:
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool(
        host=HOST, port=redis_server.port, max_connections=2))
    single = redis.Redis(host=HOST, port=redis_server.port, single_connection_client=True)
    sentinel = connect("redis+sentinel://127.0.0.1:1/svc")  # no connection made
    try:
        direct = {
            "plain": plain_client, "blocking pool": blocking, "connect's Sentinel": sentinel,
        }
        general = {"a subclass": client, "one connection of its own": single}
        assert {name: PackedScript(c, lua.LIMITER).direct for name, c in direct.items()} == {
            name: True for name in direct}
        assert {name: PackedScript(c, lua.LIMITER).direct for name, c in general.items()} == {
            name: False for name in general}
    finally:
        for c in (blocking, single, sentinel):
            c.close()
    # Either way, one budget: a limiter on each, and the subclass saw only its own script.
    pre_packed = RedisColdLimiter(plain_client, "paths", active=2)
    counted = RedisColdLimiter(client, "paths", active=2)
    try:
        pre_packed.stats()
        counted.stats()
        client.sent.clear()
        with pre_packed.acquire(), counted.acquire():
            assert counted.stats().active == 2
        assert client.sent["EVALSHA"] == 3  # its acquire, its stats, its release
        assert counted.stats().acquired == 2
    finally:
        pre_packed.close()
        counted.close()


@pytest.mark.parametrize("pool", ["default", "blocking, one connection"])
def test_a_script_redis_lost_is_loaded_again_and_the_call_sent_once_more(
    client: CountingRedis, redis_server: RedisServer, pool: str
) -> None:
    """``SCRIPT FLUSH`` (as a restart or a failover to a fresh replica would): the call is
    answered NOSCRIPT, the script is loaded and the call sent again. On a pool of one
    connection the load takes that connection after the call gave it back (no deadlock)."""
    options: dict[str, Any] = {"host": HOST, "port": redis_server.port, "socket_timeout": 0.5}
    plain = (redis.Redis(**options) if pool == "default" else redis.Redis(
        connection_pool=redis.BlockingConnectionPool(max_connections=1, timeout=5, **options)))
    lim = RedisColdLimiter(plain, "noscript", active=1)
    try:
        lim.stats()
        client.script_flush()
        commands = Commands(client)
        grant = lim.acquire()
        assert commands.until_now() == Counter({"EVALSHA": 2, "SCRIPT": 1})
        grant.release()
        assert lim.stats().acquired == 1
    finally:
        lim.close()
        plain.close()


def test_a_socket_timeout_drops_the_connection_and_the_token_is_given_up(
    live_redis: RedisServer, make_client: Callable[..., redis.Redis]
) -> None:
    """Redis paused (SIGSTOP) while an acquire is on its way: the read times out. The script
    then runs once Redis resumes (the slot is taken for a token nobody holds), and the
    limiter's next call gives the token up first. That next call reads its own reply: the
    connection that timed out was dropped, not given back with the acquire's reply unread."""
    plain = make_client(redis.Redis)
    watcher = make_client(redis.Redis, socket_timeout=5)
    lim = RedisColdLimiter(plain, "timeout", active=1, queue=1)
    try:
        lim.stats()
        watcher.ping()
        os.kill(live_redis.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redis.TimeoutError):
                lim.acquire()
        finally:
            os.kill(live_redis.pid, signal.SIGCONT)
        wait_until("the late acquire ran", lambda: watcher.zcard(lim.keys[0]) == 1)
        s = lim.stats()
        assert (s.active, s.queued, s.acquired) == (0, 0, 1), s
        assert watcher.zcard(lim.keys[0]) == 0
        assert watcher.zcard(lim.keys[9]) == 1  # remembered as given up (``gone``)
    finally:
        lim.close()


class _FailingConnection(redis.Connection):
    """A connection whose next ``failures`` sends fail (its class's shared count) as a
    connection that cannot reach Redis does: disconnected, ``ConnectionError``."""

    failures = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        cls = type(self)
        if cls.failures > 0:
            cls.failures -= 1
            self.disconnect()
            raise redis.ConnectionError("unreachable (test)")
        super().send_packed_command(command, check_health)


RETRIES = {
    "none (connect's)": {"retry": Retry(NoBackoff(), 0), "retry_on_error": []},
    "one, errors named": {"retry": Retry(NoBackoff(), 1), "retry_on_error": RETRIED_ERRORS},
    # redis-py 5 retries only the errors named in retry_on_error, 6 and newer any the Retry
    # supports: the limiter's calls must do what the client's own commands do.
    "one, errors not named": {"retry": Retry(NoBackoff(), 1)},
}


@pytest.mark.parametrize("retries", list(RETRIES))
def test_a_failed_call_is_retried_exactly_when_the_clients_own_commands_are(
    client: CountingRedis, redis_server: RedisServer, retries: str
) -> None:
    connection = type("Failing", (_FailingConnection,), {})
    plain = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=connection, host=HOST, port=redis_server.port, socket_timeout=0.5,
        **RETRIES[retries],
    ))
    lim = RedisColdLimiter(plain, "retried", active=1)

    def outcome(call: Callable[[], object]) -> str:
        connection.failures = 1
        try:
            call()
        except redis.ConnectionError:
            return "failed"
        finally:
            connection.failures = 0
        return "retried"

    try:
        lim.stats()
        own = outcome(plain.ping)  # through execute_command
        limiter = outcome(lambda: lim.acquire().release())  # pre-packed
        assert limiter == own, (limiter, own)
        if retries != "one, errors not named":
            assert own == ("failed" if retries.startswith("none") else "retried")
        s = lim.stats()
        assert (s.active, s.acquired) == (0, 1 if own == "retried" else 0), s
    finally:
        lim.close()
        plain.close()


def test_a_due_health_check_sends_its_ping_before_the_call(
    client: CountingRedis, make_client: Callable[..., redis.Redis]
) -> None:
    """With ``health_check_interval`` (``connect`` sets 15 s) a connection idle for longer is
    checked with a PING before its next command: on this path too (50 ms here)."""
    checked = make_client(redis.Redis, health_check_interval=0.05, client_name="checked")
    lim = RedisColdLimiter(checked, "checked", active=1)
    try:
        lim.stats()
        idle_since = time.monotonic()
        commands = Commands(client)
        wait_until("the connection idle for longer than the interval",
                   lambda: time.monotonic() > idle_since + 0.06)
        grant = lim.acquire()
        assert commands.until_now(client_name="checked") == Counter({"PING": 1, "EVALSHA": 1})
        grant.release()
    finally:
        lim.close()
