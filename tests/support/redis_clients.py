"""Clients of the test Redis that count what they send.

The fixtures are registered for the whole suite by ``tests/conftest.py``
(``pytest_plugins``): a test module asks for them by name.

``make_client(**options)`` makes a client of the module's ``redis_server`` with short socket
timeouts (0.5 s, as the library advises), closed at teardown; ``client`` is one of those on an
emptied Redis. ``cls=`` makes another class instead (a subclass of :class:`CountingRedis`, or
a plain ``redis.Redis``); ``plain_client`` is a plain ``redis.Redis`` on the emptied Redis.

Which path a limiter's calls take depends on its client (``reachlimit/redis/_packed.py``): on
a plain ``redis.Redis`` (``plain_client``, what ``connect`` makes, the ``make_limiter``
fixture's default) they go out pre-packed on a connection of the client's pool, never
through ``execute_command``; on a :class:`CountingRedis` (a subclass) through its
``execute_command``, which is how the classes below count and fake what a limiter sends. A
count of a plain client's round trips is taken at the server: :class:`Commands`
(``MONITOR``).

Fakes of a process's troubles, seen from Redis, each a client the library object is given:
:class:`ScriptTrap` (the calls of one operation of a script go to ``trapped``, which a
subclass makes fail as Redis would), :class:`LostReply` (that call's reply is lost: run, or
kept for the test to send later) and :class:`PausedRenewals` (the object's lease renewals
never reach Redis while ``paused`` is set, as if its process were paused).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import pytest
import redis
from redis.client import Pipeline

from tests.support import HOST
from tests.support.redis_server import RedisServer

#: What a test client that must retry passes as ``retry_on_error`` beside its ``retry``:
#: redis-py 5 retries only the errors named there (6 and newer: every error its ``Retry``
#: supports, these included), so such a client retries on every supported redis-py.
RETRIED_ERRORS = [redis.ConnectionError, redis.TimeoutError]


class CountingRedis(redis.Redis):
    """A client that counts the commands it sends (by name), to prove a round-trip count.

    Only commands sent through this client's ``execute_command`` are counted (every redis-py
    command and every ``Script`` call is; a pipeline is not)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter[str] = Counter()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent[str(args[0]).upper()] += 1
        return super().execute_command(*args, **options)

    def total(self) -> int:
        return sum(self.sent.values())


def script_operation(args: tuple[Any, ...]) -> str | None:
    """The operation an ``EVALSHA``/``EVAL`` command runs (its first argument after the keys:
    every script of the library takes it first), or None for any other command."""
    if str(args[0]).upper() not in ("EVALSHA", "EVAL"):
        return None
    # EVALSHA <sha> <number of keys> <keys...> <operation> <arguments...>
    op = args[3 + int(args[2])]
    return op.decode() if isinstance(op, bytes) else str(op)


class ScriptTrap(CountingRedis):
    """A client whose calls of one operation of a script (``trap``: its name, the script's
    first argument, once set) go to ``trapped``, which a subclass makes fail as Redis
    would; every EVALSHA is counted by its operation too (``"EVALSHA <operation>"``)."""

    trap = ""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        op = script_operation(args)
        if op is not None and args[0] == "EVALSHA":
            self.sent[f"EVALSHA {op}"] += 1
        if self.trap and op == self.trap:
            return self.trapped(args, options)
        return super().execute_command(*args, **options)

    def trapped(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        return super().execute_command(*args, **options)


class LostReply(ScriptTrap):
    """The next call of the operation ``trap`` loses its reply: it runs in Redis, then the
    caller gets a timeout (``deferred`` False); or it is kept in ``late`` and raises without
    running, for the test to send later, as a paused Redis runs what was sent to it once it
    resumes (``deferred`` True)."""

    deferred = False
    late: tuple[Any, ...] = ()

    def trapped(self, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        self.trap = ""
        if self.deferred:
            self.late = args
        else:
            super().trapped(args, options)
        raise redis.exceptions.TimeoutError("reply lost")


class PausedRenewals(CountingRedis):
    """A client whose lease renewals (the ``renew`` operation of a limiter's script, one
    call; of a flight's, a pipeline of them) never reach Redis while :attr:`paused` is set,
    as if the process were paused: the object renewing hears nothing lost, and the leases
    end in Redis when their time is up. Cleared, renewals go through again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused = threading.Event()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.paused.is_set() and script_operation(args) == "renew":
            return []  # a limiter's renewal: no token reported lost
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = _PausablePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.paused = self.paused
        return pipe


class _PausablePipeline(Pipeline):
    """A pipeline of :class:`PausedRenewals`: one made only of renewals is dropped, every
    claim answered kept (1), while ``paused`` is set."""

    paused: threading.Event

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = [entry[0] for entry in self.command_stack]
        if self.paused.is_set() and stack and all(
            script_operation(args) == "renew" for args in stack
        ):
            self.reset()
            return [1] * len(stack)
        return super().execute(raise_on_error)


class Closes(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closes)


def closed_at_teardown(build: Callable[..., C]) -> Iterator[Callable[..., C]]:
    """The body of a factory fixture: yields ``build``, remembering what it made, and closes
    every object made once the test is over."""
    made: list[C] = []

    def make(*args: Any, **kwargs: Any) -> C:
        obj = build(*args, **kwargs)
        made.append(obj)
        return obj

    yield make
    for obj in made:
        obj.close()


@pytest.fixture(name="make_client")
def make_client_fixture(redis_server: RedisServer) -> Iterator[Callable[..., Any]]:
    def build(cls: type[redis.Redis] = CountingRedis, **kwargs: Any) -> redis.Redis:
        options: dict[str, Any] = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
        options.update(kwargs)
        return cls(host=HOST, port=redis_server.port, **options)

    yield from closed_at_teardown(build)


@pytest.fixture(name="client")
def client_fixture(make_client: Callable[..., CountingRedis]) -> CountingRedis:
    c = make_client()
    c.flushall()
    return c


@pytest.fixture(name="plain_client")
def plain_client_fixture(
    client: CountingRedis, make_client: Callable[..., redis.Redis]
) -> redis.Redis:
    """A plain ``redis.Redis`` of the Redis ``client`` emptied: a limiter's calls on it go
    out pre-packed (module docstring)."""
    plain: redis.Redis = make_client(redis.Redis)
    return plain


class Commands:
    """What clients send to ``watcher``'s Redis from now on (``MONITOR``), script-inner calls
    left out: one entry per round trip, by command name. Counted at the server, so it sees
    every path a client's calls take."""

    def __init__(self, watcher: redis.Redis) -> None:
        self._watcher = watcher
        watcher.ping()  # the marker's connection is open before MONITOR takes another
        kwargs = watcher.connection_pool.connection_kwargs
        self._monitor = redis.Redis(connection_pool=redis.ConnectionPool(
            host=kwargs.get("host", HOST), port=kwargs["port"], socket_timeout=5,
        )).monitor()
        self._monitor.__enter__()  # MONITOR is in force once this returns (its OK was read)

    def until_now(self, client_name: str | None = None) -> Counter[str]:
        """The commands sent so far, read up to a marker the watcher sends now; with
        ``client_name``, only those of the connections of that name (``CLIENT SETNAME``:
        redis-py's ``client_name=``) open now."""
        sent = self.sources_until_now()
        if client_name is not None:
            named = {c["addr"] for c in self._watcher.client_list() if c["name"] == client_name}
            assert named, f"no connection named {client_name!r}"
            sent = [(addr, command) for addr, command in sent if addr in named]
        return Counter(command for _, command in sent)

    def sources_until_now(self) -> list[tuple[str, str]]:
        """As :meth:`until_now`: each command's name with the address of the connection that
        sent it (``host:port``, as ``CLIENT LIST`` has it), in order."""
        marker = uuid.uuid4().hex
        self._watcher.echo(marker)
        sent: list[tuple[str, str]] = []
        try:
            while True:
                entry = self._monitor.next_command()
                command = str(entry["command"])
                if command == f"ECHO {marker}":
                    return sent
                if entry["client_type"] != "lua":
                    sent.append((f"{entry['client_address']}:{entry['client_port']}",
                                 command.split(" ", 1)[0].upper()))
        finally:
            self._monitor.__exit__()
            self._monitor.connection_pool.disconnect()


def restart_if_stopped(server: RedisServer) -> None:
    """Start ``server`` again on its port if a test stopped it (or it died)."""
    if server.process is None or server.process.poll() is not None:
        server.start(port=server.port, attempts=1)


@pytest.fixture(name="live_redis")
def live_redis_fixture(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The module's ``redis_server``, running and emptied, for a test that may stop or kill
    it: it is started again (on the same port) after the test too."""
    restart_if_stopped(redis_server)
    c = redis.Redis(host=HOST, port=redis_server.port, socket_timeout=2)
    c.flushall()
    c.close()
    yield redis_server
    restart_if_stopped(redis_server)
