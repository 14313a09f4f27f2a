"""reachlimit.redis._cluster.ClusterClient, the client ``connect`` makes for a
``redis+cluster://`` URL, against the installed redis-py (CI runs this file at the lowest and
the highest redis-py supported), with no cluster running: nothing is opened before the first
command, a method looked up before it makes the ``RedisCluster`` when called, redis-py's
constants are its own, and a script's SHA is known up front. Where a ``RedisCluster`` must be
made, a stand-in replaces redis-py's class in the module (counting how often it is made);
``tests/test_redis_cluster.py`` proves the rest on a real three-primary cluster.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script

import reachlimit.redis._cluster as cluster_module
from reachlimit.redis import connect
from reachlimit.redis._cluster import ClusterClient
from reachlimit.redis._common import check_client, is_cluster
from tests.support.processes import free_port
from tests.support.threads import ThreadRunner, start_call

pytestmark = pytest.mark.timeout(30)

SCRIPT = "return redis.call('GET', KEYS[1]) -- d\u00e9j\u00e0"


def down_url() -> str:
    port = free_port()  # nothing listens there
    return f"redis+cluster://127.0.0.1:{port}"


class StandIn:
    """What ``ClusterClient`` makes instead of redis-py's ``RedisCluster``: the options it
    was given, and each method call answered with its name and arguments. ``gate``, when
    set, holds the construction until it is opened; ``failures`` constructions fail first."""

    PRIMARIES = "primaries"
    made: list[StandIn] = []
    gate: threading.Event | None = None
    entered = threading.Event()
    failures = 0

    def __init__(self, **options: Any) -> None:
        StandIn.entered.set()
        if StandIn.gate is not None:
            assert StandIn.gate.wait(10), "the test never opened the gate"
        if StandIn.failures:
            StandIn.failures -= 1
            raise ConnectionError("no node answered")
        self.options = options
        self.closed = False
        StandIn.made.append(self)

    def ping(self, target_nodes: Any = None) -> tuple[str, Any]:
        return ("ping", target_nodes)

    def get_connection_kwargs(self) -> dict[str, Any]:
        return {"from": "the cluster"}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> type[StandIn]:
    monkeypatch.setattr(StandIn, "made", [])
    monkeypatch.setattr(StandIn, "gate", None)
    monkeypatch.setattr(StandIn, "entered", threading.Event())
    monkeypatch.setattr(StandIn, "failures", 0)
    monkeypatch.setattr(cluster_module, "RedisCluster", StandIn)
    return StandIn


def test_nothing_is_opened_until_a_method_is_called() -> None:
    client = connect(down_url())
    assert isinstance(client, ClusterClient) and is_cluster(client)
    execute = client.execute_command  # what an object made at start-up keeps
    assert callable(execute) and callable(client.ping) and callable(client.pipeline)
    assert client.PRIMARIES == RedisCluster.PRIMARIES  # a constant is redis-py's own
    script = client.register_script(SCRIPT)
    check_client(client)  # the options are read without a connection
    assert not client.started
    with pytest.raises(AttributeError):
        client.no_such_method  # noqa: B018
    with pytest.raises(AttributeError):
        client._private_of_redis_py  # noqa: B018
    assert not client.started and "not started" in repr(client)
    client.close()  # closing a client never started opens nothing either
    assert not client.started
    assert isinstance(script, Script)


def test_a_scripts_sha_is_known_before_the_first_command() -> None:
    """The text encoded as the cluster's connections will encode it (UTF-8 here)."""
    client = connect(down_url())
    script = client.register_script(SCRIPT)
    assert script.sha == hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()
    latin = ClusterClient(startup_nodes=[ClusterNode("127.0.0.1", free_port())],
                          encoding="latin-1")
    assert latin.register_script(SCRIPT).sha == hashlib.sha1(
        SCRIPT.encode("latin-1")).hexdigest()
    assert not client.started and not latin.started


def test_the_first_call_makes_the_cluster_client_once_with_the_options(
    stand_in: type[StandIn],
) -> None:
    client = ClusterClient(startup_nodes=["n1"], socket_timeout=0.5)
    execute_later = client.ping  # looked up before: still reaches the cluster's client
    assert client.get_connection_kwargs() == {"startup_nodes": ["n1"], "socket_timeout": 0.5}
    assert execute_later(target_nodes="primaries") == ("ping", "primaries")
    assert client.started and len(stand_in.made) == 1
    assert stand_in.made[0].options == {"startup_nodes": ["n1"], "socket_timeout": 0.5}
    assert client.cluster() is stand_in.made[0]
    assert client.ping() == ("ping", None) and len(stand_in.made) == 1
    assert client.get_connection_kwargs() == {"from": "the cluster"}
    client.close()
    assert stand_in.made[0].closed


def test_a_first_call_that_finds_no_node_raises_and_the_next_one_tries_again(
    stand_in: type[StandIn],
) -> None:
    stand_in.failures = 1
    client = ClusterClient(startup_nodes=["n1"])
    with pytest.raises(ConnectionError):
        client.ping()
    assert not client.started
    assert client.ping() == ("ping", None) and client.started


def test_two_threads_first_calls_make_one_cluster_client(
    stand_in: type[StandIn], threads: ThreadRunner
) -> None:
    """The second thread's first call waits for the first one's construction, whatever
    the order they reach it in, and both are answered by the one client made."""
    stand_in.gate = threading.Event()
    client = ClusterClient(startup_nodes=["n1"])
    first = start_call(threads, client.ping, name="first")
    assert stand_in.entered.wait(10)  # the first call is making the client now
    second = start_call(threads, client.ping, name="second")
    assert not first.done.is_set()
    stand_in.gate.set()
    first.wait_done()
    second.wait_done()
    assert first.value == second.value == ("ping", None)
    assert len(stand_in.made) == 1
