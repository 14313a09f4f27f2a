"""The Lua scripts of ``reachlimit.redis``, read from the ``.lua`` files beside this module
(``importlib.resources``, once, at import), and put together here.

design:

    Every file names its KEYS and ARGV at the top. The limiter's scripts are built from
    fragments, in this order:

        limiter_keys            KEYS[1..8] as local names
        settings                sent (``limiter_sent_settings``: ARGV[1..4]) or built into the
                                text of a hot script (``limiter_built_in_settings``, whose
                                ``@NAME@`` markers :func:`hot_script` replaces)
        limiter_clock           ``now``, from Redis's ``TIME``
        [limiter_refusal_first] the refused-again shortcut of the acquire sent after a refusal
        limiter_count           ``held`` and ``queued``
        [common cases]          a hot script's shortcuts (``limiter_acquire_first``, ...)
        limiter_steps           reap, promote, the fair queue; runs reap() and promote()
        the script's own        ``limiter_acquire``, ``limiter_poll``, ...

    Cost: a call to Redis inside a script costs a few microseconds, and a script's argument
    a little more to pack and parse than it seems, so the hot scripts (acquire and release)
    are lean. They are made per limiter with its settings written into the text (a call
    sends the SHA, the keys and the token); they answer their common cases before building
    the general steps, making the calls those steps would have made and no more. The rule
    that makes this cheap: every script ends with nobody waiting while a slot is free, so
    fewer entries in ``holders`` than ``active`` at the start of a script means an empty
    queue. Per call, besides ``TIME``: a fast acquire with no slot held is ZCARD, ZADD and
    HINCRBY; a release with a slot still free ZCARD, ZCOUNT and ZREM; a refusal ZCARD, two
    ZCOUNT and HINCRBY (two ZCOUNT and HINCRBY in the variant sent after a refusal, which
    checks for the refusal first). The poll, renew and stats scripts count everything each
    time, so a waiter's own poll repairs a state that ever broke the rule.

    :data:`PRELUDE` is every sent-settings script's start; :func:`hot_script` makes the two
    hot scripts (acquire and release) for one limiter's settings. The flight's scripts are
    ``flight_prelude`` plus their own; the cache's set is its head (``cache_set``: the
    entry's SET), ``cache_index`` (index it, evict the oldest over ``size``) and its tail
    (delete the evicted entries); on a Redis Cluster, where entries spread over slots, the
    SET and the deletes are commands of their own and the script is ``cache_index_spread``
    and ``cache_index`` (``CACHE_INDEX``), the clear's ``cache_drain``.

    The cold lead (:func:`cold_lead`) is a hot acquire of one limiter made into a function,
    between ``flight_prelude`` with ``cold_lead_head`` (claim or follow, recheck the cache)
    and ``cold_lead_tail`` (claim only for a leader that builds or waits): the flight's keys
    and arguments follow the limiter's, so the prelude is told where they start (``K``,
    ``A``). Its keys span three hash tags (the limiter's, the flight key's, the cache's): it
    runs on a single Redis, not on a Cluster.

    The texts are module constants so that a test can build a mutant from the real text
    (``tests/test_redis_mutants.py``): :data:`FRAGMENTS` holds every file by name.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = [
    "CACHE_CLEAR",
    "CACHE_DRAIN",
    "CACHE_INDEX",
    "CACHE_SET",
    "FLIGHT_CHECK",
    "FLIGHT_JOIN",
    "FLIGHT_PUBLISH",
    "FLIGHT_RENEW",
    "FRAGMENTS",
    "GIVE_UP",
    "POLL",
    "PRELUDE",
    "RELEASE_OWNER",
    "RENEW",
    "SETTINGS",
    "STATS",
    "cold_lead",
    "hot_acquire",
    "hot_release",
]


def _read_all() -> dict[str, str]:
    here = files(__name__)
    return {
        entry.name.removesuffix(".lua"): entry.read_text(encoding="utf-8")
        for entry in here.iterdir()
        if entry.name.endswith(".lua")
    }


#: Every ``.lua`` file of this package, by name without the suffix.
FRAGMENTS: dict[str, str] = _read_all()

_KEYS = FRAGMENTS["limiter_keys"]
_CLOCK = FRAGMENTS["limiter_clock"]
_COUNT = FRAGMENTS["limiter_count"]
_STEPS = FRAGMENTS["limiter_steps"]

#: The start of every limiter script whose settings are sent (ARGV[1..4]).
PRELUDE = _KEYS + FRAGMENTS["limiter_sent_settings"] + _CLOCK + _COUNT + _STEPS

POLL = PRELUDE + FRAGMENTS["limiter_poll"]
RENEW = PRELUDE + FRAGMENTS["limiter_renew"]
STATS = PRELUDE + FRAGMENTS["limiter_stats"]
RELEASE_OWNER = PRELUDE + FRAGMENTS["limiter_release_owner"]
GIVE_UP = PRELUDE + FRAGMENTS["limiter_give_up"]


def _flight_at(keys: int, args: int) -> str:
    """Where ``flight_prelude`` finds the flight's first key and argument, less one."""
    return f"local K, A = {keys}, {args}\n"


_FLIGHT = _flight_at(0, 0) + FRAGMENTS["flight_prelude"]
FLIGHT_JOIN = _FLIGHT + FRAGMENTS["flight_join"]
FLIGHT_CHECK = _FLIGHT + FRAGMENTS["flight_check"]
FLIGHT_PUBLISH = _FLIGHT + FRAGMENTS["flight_publish"]
FLIGHT_RENEW = _FLIGHT + FRAGMENTS["flight_renew"]

CACHE_SET = FRAGMENTS["cache_set"] + FRAGMENTS["cache_index"] + FRAGMENTS["cache_set_tail"]
CACHE_CLEAR = FRAGMENTS["cache_clear"]
#: A Redis Cluster's cache (entries spread over slots): the set's index step, the clear's.
CACHE_INDEX = FRAGMENTS["cache_index_spread"] + FRAGMENTS["cache_index"] + "return evicted\n"
CACHE_DRAIN = FRAGMENTS["cache_drain"]
SETTINGS = FRAGMENTS["settings"]

#: A hot script derives the doorbell prefix from KEYS[1] (``T:holders`` -> ``T:w:``).
_HOT_BELL = "local bell = string.sub(holders, 1, -8) .. 'w:'\n"


def _built_in(settings: dict[str, int]) -> str:
    """The settings fragment with these ``settings`` (ACTIVE, QUEUE, LEASE_MS, PRESENCE_MS,
    WAIT_MS) written in."""
    text = FRAGMENTS["limiter_built_in_settings"]
    for name, value in settings.items():
        text = text.replace(f"@{name}@", str(int(value)))
    assert "@" not in text, "a setting of the hot scripts was not given"
    return text


def _hot_body(first: str, own: str, refusal_first: bool) -> str:
    """A hot script after its keys, settings and clock: its common cases (``first``), then
    the general steps and its own part (``own``)."""
    head = FRAGMENTS["limiter_refusal_first"] if refusal_first else ""
    return head + _COUNT + first + _HOT_BELL + _STEPS + own


def _hot_script(first: str, own: str, settings: dict[str, int], refusal_first: bool) -> str:
    return _KEYS + _built_in(settings) + _CLOCK + _hot_body(first, own, refusal_first)


def hot_acquire(settings: dict[str, int], refusal_first: bool = False) -> str:
    """The acquire script of one limiter; ``refusal_first``: the one sent while its last
    acquire was refused, which checks for the refusal before anything else."""
    return _hot_script(
        FRAGMENTS["limiter_acquire_first"], FRAGMENTS["limiter_acquire"], settings, refusal_first
    )


def hot_release(settings: dict[str, int]) -> str:
    """The release script of one limiter."""
    return _hot_script(
        FRAGMENTS["limiter_release_first"], FRAGMENTS["limiter_release"], settings, False
    )


def cold_lead(settings: dict[str, int], refusal_first: bool = False) -> str:
    """The cold lead of one limiter (its ``settings`` as for :func:`hot_acquire`): the
    flight's claim, the cache's recheck and the acquire in one script (module design)."""
    acquire = _hot_body(
        FRAGMENTS["limiter_acquire_first"], FRAGMENTS["limiter_acquire"], refusal_first
    )
    return (
        _KEYS + _built_in(settings) + _CLOCK
        + _flight_at(8, 2) + FRAGMENTS["flight_prelude"] + FRAGMENTS["cold_lead_head"]
        + "local function acquire()\n" + acquire + "\nend\n"
        + FRAGMENTS["cold_lead_tail"]
    )
