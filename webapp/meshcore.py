"""MeshCore facts the reports rest on: pubkeys, which roles relay, hop hashes, payload types,
positions and the distance between them.

Nothing here touches the database or HTTP; the report, the node list, the visibility rules and
the demo database generator all take these rules from this one place (``webapp/README.md``,
"The data model", explains them).
"""

from __future__ import annotations

import math

__all__ = [
    "ADVERT",
    "EARTH_RADIUS_KM",
    "HOP_HASH_SIZES",
    "has_gps",
    "haversine_km",
    "is_path_capable",
    "normalize_pubkey",
]

#: ``transmissions.payload_type`` of an advertisement: the one packet type whose first hop is
#: credited to its originator, whose pubkey the packet carries.
ADVERT = 4

#: Hex characters of a 1-, 2- and 3-byte hop hash: the prefix sizes of a pubkey that can stand
#: for a relay in a path.
HOP_HASH_SIZES = (2, 4, 6)

#: Mean Earth radius used by the haversine distance, as in the original server.
EARTH_RADIUS_KM = 6371.0

_HEX = frozenset("0123456789abcdef")


def normalize_pubkey(raw: object) -> str | None:
    """The 64-hex-char pubkey in lower case, or None when ``raw`` is not one.

    Only ASCII hex digits count: full-width or other Unicode digits, whitespace and
    separators are rejected rather than cleaned up."""
    if not isinstance(raw, str) or len(raw) != 64 or not raw.isascii():
        return None
    key = raw.lower()
    return key if _HEX.issuperset(key) else None


def is_path_capable(role: str | None) -> bool:
    """Whether a node of this role relays packets, so its hash can appear in paths."""
    r = (role or "").lower()
    return "repeater" in r or "room_server" in r or r == "room"


def has_gps(lat: object, lon: object) -> bool:
    """Both coordinates present and not both 0 (the firmware's "no fix")."""
    if not isinstance(lat, (int, float)) or not isinstance(lon, (int, float)):
        return False
    if isinstance(lat, bool) or isinstance(lon, bool):
        return False
    if not (math.isfinite(lat) and math.isfinite(lon)):
        return False
    return not (lat == 0 and lon == 0)


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in km on a sphere of radius :data:`EARTH_RADIUS_KM`."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dphi = p2 - p1
    dlam = math.radians(lon2 - lon1)
    a = math.sin(dphi / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dlam / 2) ** 2
    # Rounding can push ``a`` a hair outside [0, 1] (out-of-range latitudes, antipodes).
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(max(0.0, min(1.0, a))))
