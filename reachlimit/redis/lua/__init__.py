"""The Lua scripts of ``reachlimit.redis``: the ``.lua`` files beside this module, read once
at import (``importlib.resources``), each one whole, as it is.

design:

    One file, one script: each names its KEYS and ARGV at the top, passes every key it
    touches in KEYS or builds it from a KEYS entry in the way it states there (a waiter's
    doorbell, a flight's outcome: keys of the same hash tag), shares no code with another
    file, and runs on its own (``redis-cli --eval <file> <keys> , <args>``). A file that
    serves several operations takes the operation's name as its first argument and
    answers its hot cases before it defines a function (Lua builds a function each time
    its definition runs, on every call of the script). No text is put together or filled in
    here, and no script carries a budget's settings: each reads them from Redis, so every
    object runs the same scripts (one SHA each) whatever its settings.

        limiter.lua   every operation of RedisColdLimiter, and the cold lead
                      (``_lead``): the cache read, the flight's claim and the acquire of a
                      cold request in one round trip, on a single Redis
        flight.lua    every operation of RedisSingleFlight on one key's flights
        cache.lua     RedisCache's set and clear (one Redis), index and drain (a Cluster)
        settings.lua  a shared object's settings recorded at its start (RedisCache's)
        members.lua   the live processes of a budget (``_members``)

    ``README.md`` describes the limiter's keys and operations; the other modules' design
    notes their own. :data:`FILES` holds every file by name, so that a test can build a
    mutant from the real text (``tests/support/redis_mutants.py``).
"""

from __future__ import annotations

from importlib.resources import files

__all__ = ["CACHE", "FILES", "FLIGHT", "LIMITER", "MEMBERS", "SETTINGS"]


def _read_all() -> dict[str, str]:
    here = files(__name__)
    return {
        entry.name.removesuffix(".lua"): entry.read_text(encoding="utf-8")
        for entry in here.iterdir()
        if entry.name.endswith(".lua")
    }


#: Every ``.lua`` file of this package, by name without the suffix.
FILES: dict[str, str] = _read_all()

#: A budget's limiter (``RedisColdLimiter``) and the cold lead.
LIMITER = FILES["limiter"]
#: One key's flights (``RedisSingleFlight``).
FLIGHT = FILES["flight"]
#: A shared warm cache's sets and clear (``RedisCache``).
CACHE = FILES["cache"]
#: A shared object's settings, recorded at its start (``record_settings``).
SETTINGS = FILES["settings"]
#: A budget's live processes: an announce, or a leave (``_members``).
MEMBERS = FILES["members"]
