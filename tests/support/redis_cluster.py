"""A real three-primary Redis Cluster for the tests of ``reachlimit.redis`` on a cluster.

design: :class:`RedisCluster` runs three :class:`ClusterServer` processes (each a
``tests.support.redis_server.RedisServer`` started with ``--cluster-enabled yes`` and its
own ``nodes.conf``, its cluster bus on a port of its own so that only two free ports are
needed, never ``port + 10000``), each in its own temporary directory, joins them with
``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`` and waits, with one
bounded deadline, until every node's ``CLUSTER INFO`` says ``cluster_state:ok``. ``stop``
stops each process by PID. ``restart(i)`` stops node ``i`` and starts it again on its ports
in its directory: it comes back empty (no persistence) but with its ``nodes.conf``, so it
rejoins owning the same slots, which is what a cluster node restarted without persistence
is. ``migrate_slot`` moves one slot and its keys between two nodes the way ``redis-cli
--cluster reshard`` does (``SETSLOT IMPORTING`` / ``MIGRATING``, ``MIGRATE ... KEYS``,
``SETSLOT NODE`` on both), in steps a test can interleave with its own calls.

The module-scoped fixture ``redis_cluster`` (one cluster per test module: forming one takes
about a second) empties every node before handing it over (``flush``).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support import HOST
from tests.support.processes import free_port
from tests.support.redis_server import DEADLINE, RedisServer, require_redis_server
from tests.support.waiting import wait_until

#: The primaries of the test cluster.
SIZE = 3


class ClusterServer(RedisServer):
    """A ``redis-server`` in cluster mode (its bus on ``bus_port``): see the module note."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.bus_port = 0

    def _spawn(self) -> None:
        if not self.bus_port:
            self.bus_port = free_port()
        self._starts += 1
        log = self.directory / f"redis-{self._starts}.log"
        command = [
            self.binary, "--port", str(self.port), "--bind", HOST,
            "--save", "", "--appendonly", "no", "--dir", str(self.directory),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(self.bus_port),
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def client(self) -> redis.Redis:
        """A plain client of this one node (for CLUSTER commands and white-box reads)."""
        return redis.Redis(HOST, self.port, socket_timeout=DEADLINE)


class RedisCluster:
    """Three primaries joined into one cluster; see the module's design note."""

    def __init__(self, directory: Path, size: int = SIZE) -> None:
        require_redis_server()
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.skip("redis-cli is not installed (Debian: apt-get install redis-tools)")
        self.cli = cli
        self.nodes = [ClusterServer(directory / f"node{i}") for i in range(size)]
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        subprocess.run(
            [self.cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=DEADLINE, stdin=subprocess.DEVNULL,
        )
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def restart(self, index: int) -> None:
        """Stop node ``index`` and start it again, empty, on its ports (see the note)."""
        node = self.nodes[index]
        port = node.port
        node.stop()
        node.start(port=port, attempts=1)
        self.wait_ok()

    def restart_all(self) -> None:
        """Every node stopped, then every one started again, empty, on its ports."""
        ports = [node.port for node in self.nodes]
        self.stop()
        for node, port in zip(self.nodes, ports, strict=True):
            node.start(port=port, attempts=1)
        self.wait_ok()

    def _node_ok(self, node: ClusterServer) -> bool:
        try:
            with node.client() as client:
                info = client.execute_command("CLUSTER INFO")
        except redis.RedisError:
            return False
        if isinstance(info, dict):  # redis-py parses CLUSTER INFO into a dict
            state = info.get("cluster_state", info.get(b"cluster_state"))
            return state in ("ok", b"ok")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    def wait_ok(self) -> None:
        """Wait (bounded) until every node's CLUSTER INFO says cluster_state:ok."""
        for node in self.nodes:
            wait_until(
                f"cluster_state:ok on {HOST}:{node.port}", lambda n=node: self._node_ok(n),
                timeout=DEADLINE, interval=0.05,
            )

    def flush(self) -> None:
        """Every node emptied (keys and scripts)."""
        for node in self.nodes:
            with node.client() as client:
                client.flushall()
                client.script_flush()

    # -- addresses ----------------------------------------------------------------------

    def url(self, userinfo: str = "") -> str:
        """``redis+cluster://[userinfo@]host:port,host:port,host:port``."""
        hosts = ",".join(f"{HOST}:{node.port}" for node in self.nodes)
        return f"redis+cluster://{userinfo + '@' if userinfo else ''}{hosts}"

    def node_id(self, node: ClusterServer) -> str:
        with node.client() as client:
            value = client.execute_command("CLUSTER MYID")
        return value.decode() if isinstance(value, bytes) else str(value)

    def owner(self, key: str) -> ClusterServer:
        """The node that serves ``key``'s slot now (asked of the nodes themselves)."""
        slot = self.slot(key)
        with self.nodes[0].client() as client:
            shards = client.execute_command("CLUSTER SLOTS")
        for start, end, primary, *_ in shards:
            if int(start) <= slot <= int(end):
                port = int(primary[1])
                return next(node for node in self.nodes if node.port == port)
        raise AssertionError(f"slot {slot} is served by no node")

    def slot(self, key: str) -> int:
        with self.nodes[0].client() as client:
            return int(client.execute_command("CLUSTER KEYSLOT", key))

    # -- moving a slot --------------------------------------------------------------------

    def begin_migration(self, slot: int, source: ClusterServer, target: ClusterServer) -> None:
        """``SETSLOT IMPORTING`` on the target, then ``MIGRATING`` on the source."""
        with target.client() as client:
            client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", self.node_id(source))
        with source.client() as client:
            client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", self.node_id(target))

    def move_keys(self, slot: int, source: ClusterServer, target: ClusterServer) -> int:
        """``MIGRATE`` every key of ``slot`` from source to target (in one command per
        batch); how many keys were moved."""
        moved = 0
        with source.client() as client:
            while True:
                keys = client.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
                if not keys:
                    return moved
                client.execute_command(
                    "MIGRATE", HOST, target.port, "", 0, int(DEADLINE * 1000), "KEYS", *keys
                )
                moved += len(keys)

    def end_migration(self, slot: int, source: ClusterServer, target: ClusterServer) -> None:
        """``SETSLOT NODE <target>`` on the target, the source, and the other nodes."""
        owner = self.node_id(target)
        for node in [target, source, *(n for n in self.nodes if n not in (source, target))]:
            with node.client() as client:
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", owner)


@pytest.fixture(name="redis_cluster", scope="module")
def redis_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-primary :class:`RedisCluster` for the test module, stopped (each node by PID)
    after its last test."""
    cluster = RedisCluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
