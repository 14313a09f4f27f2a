"""Owners: freeing the places of a process that died.

design:

    Every token starts with its owner, ``"<hostname>:<pid>:"``, so that the parent of a process
    that died (the gunicorn master) can free its slots and queue places at once instead of
    waiting for their leases and presence periods to end: :func:`release_owner`, one script.
"""

from __future__ import annotations

import redis

from . import lua
from ._common import owner_prefix
from ._limiter import RedisColdLimiter

__all__ = ["owner_prefix", "release_owner"]


def release_owner(
    client: redis.Redis,
    owner: str,
    *,
    name: str = "reachlimit",
    prefix: str = "reachlimit",
    active: int = 2,
    lease: float = 10.0,
) -> tuple[int, int]:
    """Free, in one script, every slot held and every queue place taken by tokens that
    start with ``owner`` (``owner_prefix(pid)`` of a process that died), then promote the
    oldest waiters into the freed slots. ``name``, ``prefix``, ``active`` and ``lease`` must
    be those of the limiters that use the name. Returns (slots freed, places removed).
    Errors of Redis propagate."""
    if not isinstance(owner, str) or not owner.endswith(":") or owner.count(":") < 2:
        raise ValueError(f"owner must look like '<host>:<pid>:', got {owner!r}")
    limiter = RedisColdLimiter(client, name, active, lease=lease, prefix=prefix)
    script = client.register_script(lua.RELEASE_OWNER)
    freed, dropped = script(keys=limiter._keys, args=[*limiter._common, owner])
    return int(freed), int(dropped)
