"""Owners: freeing the places of a process that died.

design:

    Every token starts with its owner, ``"<hostname>:<boot id>:<pid>:"``, so that the parent
    of a process that died (the gunicorn master) can free its slots and queue places at once
    instead of waiting for their leases and presence periods to end: :func:`release_owner`,
    one script. The boot id tells apart hosts that share a hostname.
"""

from __future__ import annotations

from . import lua
from ._common import Client, owner_prefix
from ._limiter import RedisColdLimiter

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
    waiters in turn into the freed slots. ``active`` and ``lease`` are read from the
    settings the budget's processes recorded in Redis (the arguments are used only when none
    are recorded). Returns (slots freed, places removed).
    Errors of Redis propagate."""
    if not isinstance(owner, str) or not owner.endswith(":") or owner.count(":") < 3:
        raise ValueError(f"owner must look like '<host>:<boot id>:<pid>:', got {owner!r}")
    probe = RedisColdLimiter(client, name, active, lease=lease, prefix=prefix)
    # The budget's own figures, as its processes recorded them (this caller's are a guess).
    recorded = client.hgetall(probe._settings_key)
    figures = {k.decode() if isinstance(k, bytes) else k: v for k, v in recorded.items()}
    try:
        active = int(figures.get("active", active))
        lease = int(figures["lease_ms"]) / 1000 if "lease_ms" in figures else lease
    except ValueError:
        pass  # written by something else: keep the caller's
    limiter = RedisColdLimiter(client, name, active, lease=lease, prefix=prefix)
    script = client.register_script(lua.RELEASE_OWNER)
    freed, dropped = script(keys=limiter._keys, args=[*limiter._common, owner])
    return int(freed), int(dropped)
