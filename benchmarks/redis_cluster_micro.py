#!/usr/bin/env python3
"""RedisColdLimiter's two hot paths on a Redis Cluster, each against redis-py's cluster
client talking to the same node.

    python benchmarks/redis_cluster_micro.py            # full run, about 20 s
    python benchmarks/redis_cluster_micro.py --quick    # a few seconds, rough figures
    python benchmarks/redis_cluster_micro.py --json     # the same figures as JSON on stdout

It starts its own three-primary cluster (Debian's ``redis-server`` in cluster mode, joined
with ``redis-cli --cluster create``: ``tests/support/redis_cluster.py``) on free loopback
ports in a temporary directory, and stops each node by PID at the end. The client is
``reachlimit.redis.connect("redis+cluster://...")`` (a ``redis.cluster.RedisCluster``).

What is measured, one client, as ratios against a baseline timed in the same run, in
alternating rounds (``benchmarks/redis_micro.py``'s ``paired``: the median of the per-round
ratios, with their spread and the best-of-rounds figures):

(a) fast path: ``g = lim.acquire(); g.release()`` with a free slot (two scripts, two round
    trips), against two ``GET`` of a key of the limiter's hash tag (two round trips to the
    same node, through the same cluster client);
(b) queue_full refusal (one script, one round trip) against one ``GET`` of that key;
(c) the same refusal against a ``PING`` sent to that node (``target_nodes``): the cheapest
    round trip there is.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from _common import machine
from redis_micro import Refusals, fast_path_of, paired, print_rows

from reachlimit.redis import connect
from tests.support.redis_cluster import RedisCluster


def run(cluster: RedisCluster, n: int, rounds: int) -> dict[str, Any]:
    cluster.flush()
    client = connect(cluster.url())
    results: dict[str, Any] = {}
    fast_path, lim = fast_path_of(client)
    same_slot = lim.keys[0].rsplit(":", 1)[0] + ":bench"  # the limiter's tag: its node
    client.set(same_slot, b"x")

    def two_gets() -> None:
        client.get(same_slot)
        client.get(same_slot)

    results["fast_path"] = paired(fast_path, two_gets, n, rounds)
    lim.close()

    refusal = Refusals(client)
    refusals_node = client.get_node_from_key(refusal.limiter.keys[0])
    slot_key = refusal.limiter.keys[0].rsplit(":", 1)[0] + ":bench"
    client.set(slot_key, b"x")
    results["refusal_vs_get"] = paired(refusal, lambda: client.get(slot_key), n, rounds)

    def ping() -> None:
        client.execute_command("PING", target_nodes=refusals_node)

    results["refusal_vs_ping"] = paired(refusal, ping, n, rounds)
    results["refusal_vs_ping"]["check"] = refusal.check()
    client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    n, rounds = (100, 5) if args.quick else (200, 61)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = RedisCluster(Path(tmp))
        try:
            cluster.start()
            results = run(cluster, n, rounds)
        finally:
            cluster.stop()
    report = {"machine": machine(), "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("machine:", json.dumps(report["machine"]))
    print_rows(results, (
        ("fast_path", "acquire+release vs 2 GET (same node, RedisCluster)"),
        ("refusal_vs_get", "queue_full refusal vs GET (same node, RedisCluster)"),
        ("refusal_vs_ping", "queue_full refusal vs PING (same node, RedisCluster)"),
    ))
    print("refusal check:", results["refusal_vs_ping"]["check"])


if __name__ == "__main__":
    main()
