"""The Lua scripts of ``reachlimit.redis``, read from the ``.lua`` files beside this module
(``importlib.resources``, once, at import), and put together here.

design:

    Every file names its KEYS and ARGV at the top. The limiter's scripts are built from
    fragments, in this order:

        mode                    ``lean`` and ``record`` (:func:`_mode`): whether the script
                                takes the shortcuts of the rule in ``limiter_steps``, and
                                whether it writes the settings back when Redis lacks them
        limiter_keys            KEYS[1..9] as local names (KEYS[9]: the budget's settings)
        [limiter_record]        a process's start: its settings written into the hash
        limiter_settings        the budget's settings, read from the hash (HMGET); this
                                process's own (ARGV[1..3]) for any it lacks, written back
        limiter_clock           ``now``, from Redis's ``TIME``
        [limiter_refusal_first] the refused-again shortcut of the acquire sent after a refusal
        limiter_count           ``held`` and ``queued``
        [common cases]          a hot script's shortcuts (``limiter_acquire_first``, ...)
        limiter_steps           reap, promote, the fair queue; runs reap() and promote()
        [limiter_deadline]      no wasted waits: the walk that refuses late waiters (acquire
                                and release; the release's ``limiter_took``, which times a
                                promoted grant, comes before its common case)
        the script's own        ``limiter_acquire``, ``limiter_poll``, ...

    Settings are data: no script carries a budget's settings in its text, so every budget
    runs the same scripts (one SHA per job) and a change of settings (the newest process to
    start writes them) takes effect at the next call of every process. Every limiter script
    starts with the same three arguments, ``ARGV[1..3]``: the process's presence period (not
    a budget setting), its lease, and its active, queue and wait in one string (an argument
    costs more to pack than that costs to parse, and only a script that finds its settings
    missing parses it). They count only where the hash lacks them (``limiter_settings`` says
    how). A script's own arguments follow from ARGV[4].

    Cost: a call to Redis inside a script costs a few microseconds (the settings' HMGET is
    one), and a script's argument a little more to pack and parse than it seems, so the hot
    scripts (acquire and release) are lean: a call sends the SHA, the keys and the common
    arguments encoded once (``RedisColdLimiter``), then the token; they answer their common
    cases before building the general steps, making the calls those steps would have made
    and no more. The rule that makes this cheap: every script ends with nobody waiting while
    a slot is free, so fewer entries in ``holders`` than ``active`` at the start of a script
    means an empty queue. Per call, besides ``TIME`` and the HMGET: a fast acquire with no
    slot held is ZSCORE (given up?), ZCARD, ZADD and HINCRBY; a release with a slot still
    free ZCARD, ZCOUNT and ZREM; a refusal ZSCORE, ZCARD, two ZCOUNT, ZCARD and HINCRBY (two
    ZCOUNT, ZCARD and HINCRBY in the variant sent after a refusal, which checks for the
    refusal first). The poll, renew and stats scripts count everything each time, so a
    waiter's own poll repairs a state that ever broke the rule.

    The flight's scripts are ``flight_prelude`` plus their own; the cache's set is
    ``cache_settings`` (the cache's settings hash, read as the limiter's is), its head
    (``cache_set``: the entry's SET), ``cache_index`` (index it, evict the oldest over
    ``size``) and its tail (delete the evicted entries); on a Redis Cluster, where entries
    spread over slots, the SET and the deletes are commands of their own and the script is
    ``cache_settings``, ``cache_index_spread`` and ``cache_index`` (``CACHE_INDEX``), the
    clear's ``cache_drain``. ``SETTINGS`` records a cache's settings at its start.

    ``MEMBERS`` (``members``), the live processes of a budget (``_members``), is one file
    that stands alone: it shares no fragment with the limiter's scripts and touches only
    the key it is given.

    The cold lead (``COLD_LEAD``) is a hot acquire made into a function, between
    ``flight_prelude`` with ``cold_lead_head`` (claim or follow, recheck the cache) and
    ``cold_lead_tail`` (claim only for a leader that builds or waits): the flight's keys and
    arguments follow the limiter's, so the prelude is told where they start (``K``, ``A``).
    Its keys span three hash tags (the limiter's, the flight key's, the cache's): it runs on
    a single Redis, not on a Cluster.

    The texts are module constants so that a test can build a mutant from the real text
    (``tests/test_redis_mutants.py``): :data:`FRAGMENTS` holds every file by name.
"""

from __future__ import annotations

from importlib.resources import files

__all__ = [
    "ACQUIRE",
    "ADOPT",
    "ACQUIRE_AFTER_REFUSAL",
    "CACHE_CLEAR",
    "CACHE_DRAIN",
    "CACHE_INDEX",
    "CACHE_SET",
    "COLD_LEAD",
    "COLD_LEAD_AFTER_REFUSAL",
    "FLIGHT_CHECK",
    "FLIGHT_DROP_OWNER",
    "FLIGHT_JOIN",
    "FLIGHT_PUBLISH",
    "FLIGHT_RENEW",
    "FRAGMENTS",
    "GIVE_UP",
    "MEMBERS",
    "POLL",
    "RECORD",
    "RELEASE",
    "RELEASE_OWNER",
    "RENEW",
    "SETTINGS",
    "STATS",
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
_SETTINGS = FRAGMENTS["limiter_settings"]
_CLOCK = FRAGMENTS["limiter_clock"]
_COUNT = FRAGMENTS["limiter_count"]
_STEPS = FRAGMENTS["limiter_steps"]


def _mode(lean: bool, record: bool = True) -> str:
    """The first line of a limiter script: ``lean`` (takes the shortcuts of the rule in
    ``limiter_steps``) and ``record`` (writes settings Redis lacks back into the hash)."""
    return f"local lean, record = {str(lean).lower()}, {str(record).lower()}\n"


def _general(own: str, record: bool = True) -> str:
    """A limiter script that counts everything each time, ending with ``own``."""
    return _mode(False, record) + _KEYS + _SETTINGS + _CLOCK + _COUNT + _STEPS + own


POLL = _general(FRAGMENTS["limiter_poll"])
RENEW = _general(FRAGMENTS["limiter_renew"])
#: The builds an in-process fallback admitted while Redis was away, made holders as it comes
#: back (``ResilientLimiter``): over the capacity if need be.
ADOPT = _general(FRAGMENTS["limiter_adopt"])
STATS = _general(FRAGMENTS["limiter_stats"])
GIVE_UP = _general(FRAGMENTS["limiter_give_up"])
#: Run by the parent of a process that died, which is no process of the budget: it uses the
#: settings in Redis (its own arguments only where there are none) and records nothing.
RELEASE_OWNER = _general(FRAGMENTS["limiter_release_owner"], record=False)
#: A process's start on a budget: its settings written, then a reap and fill under them.
RECORD = (
    _mode(False) + _KEYS + FRAGMENTS["limiter_record"] + _SETTINGS + _CLOCK + _COUNT + _STEPS
    + "return before\n"
)


def _hot_body(first: str, own: str, refusal_first: bool) -> str:
    """A hot script after its keys, settings and clock: its common cases (``first``), then
    the general steps and its own part (``own``)."""
    head = FRAGMENTS["limiter_refusal_first"] if refusal_first else ""
    return head + _COUNT + first + _STEPS + own


def _hot(first: str, own: str, refusal_first: bool = False) -> str:
    return _mode(True) + _KEYS + _SETTINGS + _CLOCK + _hot_body(first, own, refusal_first)


#: No wasted waits (``limiter_deadline``): the walk that refuses late waiters, built after the
#: general steps of the two scripts that run it (acquire, release); the timing of a promoted
#: grant's release (``limiter_took``) before the release's common case, which records it too.
_DEADLINE = FRAGMENTS["limiter_deadline"]
_ACQUIRE_PARTS = (FRAGMENTS["limiter_acquire_first"], _DEADLINE + FRAGMENTS["limiter_acquire"])

#: The acquire of every limiter.
ACQUIRE = _hot(*_ACQUIRE_PARTS)
#: The acquire sent while a limiter's last acquire was refused: the refusal checked first.
ACQUIRE_AFTER_REFUSAL = _hot(*_ACQUIRE_PARTS, refusal_first=True)
#: The release of every limiter.
RELEASE = _hot(
    FRAGMENTS["limiter_took"] + FRAGMENTS["limiter_release_first"],
    _DEADLINE + FRAGMENTS["limiter_release"],
)


def _flight_at(keys: int, args: int) -> str:
    """Where ``flight_prelude`` finds the flight's first key and argument, less one."""
    return f"local K, A = {keys}, {args}\n"


_FLIGHT = _flight_at(0, 0) + FRAGMENTS["flight_prelude"]
FLIGHT_JOIN = _FLIGHT + FRAGMENTS["flight_join"]
FLIGHT_CHECK = _FLIGHT + FRAGMENTS["flight_check"]
FLIGHT_PUBLISH = _FLIGHT + FRAGMENTS["flight_publish"]
FLIGHT_RENEW = _FLIGHT + FRAGMENTS["flight_renew"]
#: A dead process's claim on one flight, dropped by its parent (``release_claims``).
#: Self-contained.
FLIGHT_DROP_OWNER = FRAGMENTS["flight_drop_owner"]


def _cold_lead(refusal_first: bool) -> str:
    """The cold lead: the flight's claim, the cache's recheck and the acquire in one script
    (module design). The flight's keys follow the limiter's nine, its arguments the
    acquire's five."""
    acquire = _hot_body(*_ACQUIRE_PARTS, refusal_first)
    return (
        _mode(True) + _KEYS + _SETTINGS + _CLOCK
        + _flight_at(9, 5) + FRAGMENTS["flight_prelude"] + FRAGMENTS["cold_lead_head"]
        + "local function acquire()\n" + acquire + "\nend\n"
        + FRAGMENTS["cold_lead_tail"]
    )


#: The cold lead of every limiter, and the one sent after a refusal (as the acquire's two).
COLD_LEAD = _cold_lead(False)
COLD_LEAD_AFTER_REFUSAL = _cold_lead(True)

_CACHE_SETTINGS = FRAGMENTS["cache_settings"]
CACHE_SET = (
    _CACHE_SETTINGS + FRAGMENTS["cache_set"] + FRAGMENTS["cache_index"]
    + FRAGMENTS["cache_set_tail"]
)
CACHE_CLEAR = FRAGMENTS["cache_clear"]
#: A Redis Cluster's cache (entries spread over slots): the set's index step, the clear's.
CACHE_INDEX = (
    _CACHE_SETTINGS + FRAGMENTS["cache_index_spread"] + FRAGMENTS["cache_index"]
    + FRAGMENTS["cache_index_tail"]
)
CACHE_DRAIN = FRAGMENTS["cache_drain"]
SETTINGS = FRAGMENTS["settings"]
#: A budget's live processes: an announce, or a leave (``_members``). Self-contained.
MEMBERS = FRAGMENTS["members"]
