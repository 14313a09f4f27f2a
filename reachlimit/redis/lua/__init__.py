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

    :data:`PRELUDE` is every sent-settings script's start; :func:`hot_script` makes the two
    hot scripts (acquire and release) for one limiter's settings. The flight's scripts are
    ``flight_prelude`` plus their own; the cache's set is one file.

    The texts are module constants so that a test can build a mutant from the real text
    (``tests/test_redis_mutants.py``): :data:`FRAGMENTS` holds every file by name.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = [
    "CACHE_CLEAR",
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

FLIGHT_JOIN = FRAGMENTS["flight_prelude"] + FRAGMENTS["flight_join"]
FLIGHT_CHECK = FRAGMENTS["flight_prelude"] + FRAGMENTS["flight_check"]
FLIGHT_PUBLISH = FRAGMENTS["flight_prelude"] + FRAGMENTS["flight_publish"]
FLIGHT_RENEW = FRAGMENTS["flight_prelude"] + FRAGMENTS["flight_renew"]

CACHE_SET = FRAGMENTS["cache_set"]
CACHE_CLEAR = FRAGMENTS["cache_clear"]
SETTINGS = FRAGMENTS["settings"]

#: A hot script derives the doorbell prefix from KEYS[1] (``T:holders`` -> ``T:w:``).
_HOT_BELL = "local bell = string.sub(holders, 1, -8) .. 'w:'\n"


def _hot_script(first: str, own: str, settings: dict[str, int], refusal_first: bool) -> str:
    """A hot script for these ``settings`` (ACTIVE, QUEUE, LEASE_MS, PRESENCE_MS, WAIT_MS):
    its common cases (``first``), then the general steps and its own part (``own``)."""
    text = FRAGMENTS["limiter_built_in_settings"]
    for name, value in settings.items():
        text = text.replace(f"@{name}@", str(int(value)))
    assert "@" not in text, "a setting of the hot scripts was not given"
    head = FRAGMENTS["limiter_refusal_first"] if refusal_first else ""
    return _KEYS + text + _CLOCK + head + _COUNT + first + _HOT_BELL + _STEPS + own


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
