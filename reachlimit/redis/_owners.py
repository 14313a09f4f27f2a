"""Owners: freeing the places of a process that died.

design:

    Every token starts with its owner, ``"<hostname>:<boot id>:<pid>:"``, so that the parent
    of a process that died (the gunicorn master) can free its slots and queue places at once
    instead of waiting for their leases and presence periods to end: :func:`release_owner`,
    one script; a second one (``lua/members.lua``) takes the process out of the budget's
    live processes (``_members``) at once rather than one announce period later, so the
    fallbacks that remain count one process fewer. The boot id tells apart hosts that share
    a hostname.

    The parent is no process of the budget: the script reads the budget's settings from
    Redis, as every limiter script does (``lua/limiter_settings.lua``), and records none of
    its own; the key names are built here from the prefix and the name, as the limiter
    builds them (``limiter_keys``).
"""

from __future__ import annotations

from . import lua
from ._common import Client, check_names, limiter_keys, members_key, owner_prefix, positive
from ._limiter import RedisColdLimiter, script_settings

__all__ = ["owner_prefix", "release_owner"]


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
    processes (a second, small script). The budget's settings (how many slots it has) are
    read from Redis, where its processes recorded them; ``active`` and ``lease`` are used
    only when none are recorded (Redis lost them), and never written there. Returns (slots
    freed, places removed). Errors of Redis propagate."""
    if not isinstance(owner, str) or not owner.endswith(":") or owner.count(":") < 3:
        raise ValueError(f"owner must look like '<host>:<boot id>:<pid>:', got {owner!r}")
    check_names(name, prefix)
    if isinstance(active, bool) or not isinstance(active, int) or active < 1:
        raise ValueError("active >= 1")
    # The arguments every limiter script starts with: the presence period a promoted waiter
    # has to claim its slot, then the figures used where Redis has none (queue and wait are
    # not used here).
    mine = script_settings(RedisColdLimiter.PRESENCE, active, 0, 0.001, positive("lease", lease))
    script = client.register_script(lua.RELEASE_OWNER)
    freed, dropped = script(keys=limiter_keys(prefix, name), args=[*mine, owner])
    client.register_script(lua.MEMBERS)(keys=[members_key(prefix, name)], args=[owner, "0"])
    return int(freed), int(dropped)
