"""Owners: freeing the places of a process that died.

design:

    Every token starts with its owner, ``"<hostname>:<boot id>:<pid>:"``, so that the parent of
    a process that died (the gunicorn master) can free its slots and queue places at once
    instead of waiting for their leases and presence periods to end: :func:`release_owner`, one
    script (the limiter's ``release_owner``); a second one (``lua/members.lua``) takes the
    process out of the budget's live processes (``_members``) at once rather than one announce
    period later, so the fallbacks that remain count one process fewer. The boot id tells apart
    hosts that share a hostname.

    The parent is no process of the budget and builds no limiter: it names the budget's keys
    from the prefix and the name as a limiter does (``limiter_keys``, ``members_key``), and the
    script reads the budget's settings from Redis, as every operation of ``lua/limiter.lua``
    does; the figures the parent passes count only where Redis has none, and are never
    written there.

    Flight claims (``_flight``) carry the owner too, but live under one key per flight: the
    parent finds them with ``SCAN`` (:func:`release_claims`: every ``{<prefix>:...}:lead``
    key, in batches, on every primary of a Cluster) and drops those of the dead owner with a
    script (the flight's ``drop``, ``lua/flight.lua``), so the followers of a flight whose
    leader was SIGKILLed take it over at their next check (a quarter of a second) rather than
    when its lease ends. A SCAN reads every key name of the Redis once: on a Redis of a
    million keys that is about a second of the master's time per dead worker (Redis itself
    answers other clients between batches).
"""

from __future__ import annotations

from typing import Any

from . import lua
from ._common import (
    Client,
    check_names,
    is_cluster,
    limiter_keys,
    members_key,
    positive,
)
from ._limiter import RedisColdLimiter, script_settings

__all__ = ["release_claims", "release_owner"]


def release_owner(
    client: Client,
    owner: str,
    *,
    name: str = "reachlimit",
    prefix: str = "reachlimit",
    active: int = 2,
    lease: float = 10.0,
) -> tuple[int, int]:
    """Free, in one script, every slot held and every queue place taken by tokens that
    start with ``owner`` (``owner_prefix(pid)`` of a process that died), then promote the
    waiters in turn into the freed slots; then remove the owner from the budget's live
    processes (a second, small script). How many slots the budget has is read from Redis
    (module design): ``active`` and ``lease`` count only if Redis lost the budget's settings.
    Returns (slots freed, places removed). Errors of Redis propagate."""
    if not isinstance(owner, str) or not owner.endswith(":") or owner.count(":") < 3:
        raise ValueError(f"owner must look like '<host>:<boot id>:<pid>:', got {owner!r}")
    check_names(name, prefix)
    if isinstance(active, bool) or not isinstance(active, int) or active < 1:
        raise ValueError("active >= 1")
    # The presence period a promoted waiter has to claim its slot, then the figures (queue
    # and wait are not used here).
    mine = script_settings(RedisColdLimiter.PRESENCE, active, 0, 0.001, positive("lease", lease))
    script = client.register_script(lua.LIMITER)
    holders = limiter_keys(prefix, name)[0]  # the script's one key: it builds the others
    freed, dropped = script(keys=[holders], args=["release_owner", *mine, owner])
    client.register_script(lua.MEMBERS)(keys=[members_key(prefix, name)], args=[owner, "0"])
    return int(freed), int(dropped)


#: How many key names one SCAN step asks for (``release_claims``).
SCAN_BATCH = 1000


def _glob_escaped(text: str) -> str:
    """``text`` matched literally in a Redis glob pattern (SCAN's MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def release_claims(client: Client, owner: str, *, prefix: str = "reachlimit") -> int:
    """Drop every flight claim under ``prefix`` held by tokens that start with ``owner``
    (``owner_prefix(pid)`` of a process that died), so that each flight's followers take it
    over at their next check instead of when the claim's lease ends (module design: one
    ``SCAN`` of the key names, a script per claim found). Returns how many were dropped.
    Errors of Redis propagate."""
    if not isinstance(owner, str) or not owner.endswith(":") or owner.count(":") < 3:
        raise ValueError(f"owner must look like '<host>:<boot id>:<pid>:', got {owner!r}")
    check_names("flight", prefix)
    drop = client.register_script(lua.FLIGHT)
    match = "{" + _glob_escaped(prefix) + ":*}:lead"
    # On a Cluster: every primary (``RedisCluster.PRIMARIES``), each slot's keys once.
    nodes: dict[str, Any] = {"target_nodes": "primaries"} if is_cluster(client) else {}
    dropped = 0
    for key in client.scan_iter(match=match, count=SCAN_BATCH, **nodes):
        dropped += int(drop(keys=[key], args=["drop", owner]))
    return dropped
