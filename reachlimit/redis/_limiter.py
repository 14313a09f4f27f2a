"""A cold limiter shared by every process that uses the same Redis and name: its admission,
its waiters' loop, its grants and their leases.

Its Lua script is ``reachlimit/redis/lua/limiter.lua`` (every operation, the first argument
naming which); the waker thread is ``_waker``, the parent's release of a dead process's places
``_owners``, the figures ``_stats``.

design:

    Keys and scripts: the limiter's state lives in Redis under one hash tag, ``T =
    {<prefix>:<name>}``, and only its Lua scripts change it; the keys, the fair queue, the
    reaping and every script are described in ``lua/README.md``, beside the scripts.

    Settings are data in Redis (the class docstring says what a user sees of it): the
    budget's settings hash, ``T:settings``, written at this object's start (its first call:
    ``_start``, the ``record`` operation) and read by every operation (``lua/limiter.lua``
    says what happens when it is missing). What stays this process's own: the presence
    period, its lease where longer than the budget's, and what its in-process fallback
    (``ResilientLimiter``) decides - its share of the budget while Redis is away, divided by
    the live processes counted in Redis (``members()``, ``_members``; ``T:members``).

    Cost: the script is the same text for every limiter (one SHA) and is given one key, from
    whose tag it builds the budget's others; every call sends that key, the operation and
    the common argument packed once (``_heads``), on a plain ``redis.Redis`` straight on a
    connection of the client's pool (``_packed``; ``_run`` says why, with the figures), and
    the hot operations (acquire, release, the cold lead) answer their common cases before the
    script defines any function (``lua/README.md``).

    No wasted waits (``deadline``, a budget setting like the others): the rule of
    ``reachlimit._limiter``, decided in the scripts on Redis's clock, no round trip added. With
    it on, Redis times every grant a waiter was promoted to (its promotion in ``T:since``; the
    grant knows it is ``timed`` and its release says so), keeps the latest 16 times
    (``T:took``) and the budget's estimate from them, shared by every process; the acquire that
    queues a newcomer and every timed release walk the fair queue and refuse the late
    (``refuse_late`` in ``lua/limiter.lua``). A waiter refused late learns it from its doorbell
    ("l" and its Retry-After) or its next poll, as a displaced one does.

    Who wakes whom: a waiter blocks in ``BLPOP`` on its own doorbell for at most
    ``POLL_EVERY`` seconds (``CANCEL_POLL_INTERVAL`` with a cancel token); whichever script
    promotes it (a release, a reap found by anybody's script) pushes the doorbell. No one polls
    for a free slot: a waiter's regular poll only proves it is alive and checks its deadline.
    One daemon thread per limiter object (``Waker``, started with the first wait; its
    docstring says why) nudges Redis just after each slice's end, so that the ``BLPOP`` ends
    on time: a waiter notices a cancel within a slice and its deadline within a few
    milliseconds, as the local limiter does (``benchmarks/redis_handoff.py`` measures both).

    One pass of a waiter's loop (``_wait_for_slot``, in the requesting thread): the cancel
    token set -> a giving-up poll (displaced or refused late meanwhile is counted as such) and
    Cancelled; else block on the doorbell for the slice; "d" -> displaced; "l<s>" -> refused
    late, s its Retry-After; a ring, the next poll's time or the deadline -> the poll, whose
    outcome (granted, timeout, gone, displaced, late, or waiting with the milliseconds left)
    decides. The local clock only schedules the next poll; whether the wait is over is decided
    on Redis's clock. On any other exception the waiter leaves with an abandoning poll (or,
    Redis unreachable, its token is given up at the next round trip).

    Leases: a grant is a lease of ``lease`` seconds, renewed every ``lease / 3`` seconds by one
    daemon thread per limiter object, in one round trip for all its grants. A process that
    dies stops renewing; its slots come back when their leases end (the next script of any
    process reaps them) and its waiters leave the queue one presence period after their last
    poll. A holder that was paused past its lease has lost the slot (counted once, when it is
    reaped); its release is then a no-op in Redis.

    Lost replies: a call whose reply is lost (a socket timeout after the script ran, or
    before it ran: the caller cannot tell) leaves its token in ``_lost_tokens``; before this
    object's next round trip of any kind, the ``give_up`` operation frees what those tokens
    hold or wait for and records them in ``T:gone`` for ``GIVEN_UP_FOR`` seconds, where an
    acquire refuses a late call of them (one sent on the timed-out connection and read by
    Redis only after the give-up). So no slot or place stays nobody's for longer than this
    object's next call (without one: the lease, or the presence).

    Retries: a client that retries sends the same token again: the acquire script then
    answers what its first run decided (claiming a slot handed over in between), so a token
    never both holds and waits. That check is on the acquire script's general path only, to
    keep the fast grant and the refusal as cheap as they are: a retry that finds every slot
    held and every queue place taken is refused although its first run took a slot or a
    place, which then ends with its lease (counted ``lease_lost``) or its presence (about a
    second). A retried poll, release or refusal can still count its outcome twice (or flag
    its grant ``lease_lost``). ``reachlimit.redis.connect`` makes clients that never retry,
    so none of this happens through the extension.

    In the process: one ``threading.Lock``, the lease renewer's (``_lock``; replaced in a
    forked child), guards the grants held here, each grant's ``held`` flag, the tokens whose
    replies were lost and the members made here; how the renewer paces itself on it is
    ``_renewer``'s design note. No Redis call is made under the lock.

    Cluster: the keys a script builds (doorbells, ...) carry the tag of its KEYS: one slot.
    What else differs there: ``_cluster``'s design note.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Hashable
from contextlib import AbstractContextManager
from typing import Any

from .._cancel import POLL_INTERVAL, CancelToken
from .._errors import Busy, Cancelled
from .._limiter import Grant, LimiterFigures
from . import lua
from ._common import (
    REDIS_ERRORS,
    Client,
    Named,
    client_id,
    is_cluster,
    limiter_keys,
    members_key,
    ms,
    new_token,
    owner_id,
    positive,
    registry_key,
    settings_changed,
    socket_timeout,
    warn_eviction,
)
from ._lead import LeadReply, NextCallAnswer
from ._members import Members
from ._packed import Head, PackedScript, head
from ._renewer import LeaseRenewer
from ._stats import RedisLimiterStats, stats_from_reply
from ._waker import Waker

__all__ = ["RedisColdLimiter", "RedisGrant", "RedisLimiterStats"]

log = logging.getLogger("reachlimit")

#: The operations of ``lua/limiter.lua`` a limiter sends with its fixed keys (the cold lead,
#: ``lead``, adds three keys of the request's: ``_lead_head``).
OPERATIONS = (
    "acquire", "release", "poll", "renew", "stats", "give_up", "hold_fallback_builds", "record",
)

#: The id of the anonymous client (``client=None``): not a hash, so never one of theirs.
_ANONYMOUS = "-"

# What the script answers: small integers, cheap to send and the same whether the client
# decodes responses or not (``lua/limiter.lua`` says which operation answers which).
#: An acquire's status: refused (the queue full), granted, queued (with the budget's wait).
FULL, GRANTED, QUEUED = 0, 1, 2
#: A poll's outcome besides GRANTED: still waiting (with the ms left of its wait), timed out,
#: gone (dropped, or never known), displaced (by a leader of a client holding fewer places).
WAITING, TIMEOUT, GONE, DISPLACED = 2, 3, 5, 6
#: An acquire's or a poll's answer: refused, its place cannot start within its wait (no
#: wasted waits), with its Retry-After in s.
LATE = 7
#: What a waiter's doorbell holds when it was displaced, and how it begins when it was
#: refused late ("l<its Retry-After in s>"); bytes, or str with decode_responses.
DISPLACED_BELL = (b"d", "d")
LATE_BELL = (b"l", "l")
#: What a poll tells Redis about its waiter: it stays, it gives up (its client left: counted
#: cancelled), or it abandons (it leaves on an error: counted nowhere).
STAY, GIVE_UP, ABANDON = 0, 1, 2


def script_settings(
    presence: float, active: int, queue: int, wait: float, lease: float, deadline: bool = True
) -> list[str]:
    """The argument every operation of ``lua/limiter.lua`` takes after its name
    (``ARGV[2]``): a process's own figures in one string, its presence period and lease,
    then its other settings; times in whole ms, ``deadline`` 1 or 0 (one argument: each one
    costs more to pack than the script's one match costs to parse)."""
    return [f"{ms(presence)} {ms(lease)} {active} {queue} {ms(wait)} {int(deadline)}"]


def _admission(reply: Any) -> tuple[int, int]:
    """An acquire's reply as (status, wait in ms): queued is ``{2, ms}`` (the budget's
    wait, from Redis), anything else a bare status."""
    if isinstance(reply, list):
        return int(reply[0]), int(reply[1])
    return int(reply), 0


class RedisColdLimiter(Named, LimiterFigures):
    """:class:`~reachlimit.ColdLimiter`'s contract, kept by every process that uses the same
    Redis and ``name``: at most ``active`` grants held in all of them together, at most
    ``queue`` waiters, each at most ``wait`` seconds (Redis's clock), with a direct hand-off
    and the same fair admission: first-in first-out within a client (by a ticket from Redis),
    freed slots round-robin across the waiting clients, a full queue displacing the newest
    waiter of the client holding most places; strictly first-in first-out with one client.

    ``client`` is a ``redis.Redis`` or a ``redis.cluster.RedisCluster``, with short timeouts
    (``reachlimit.redis.connect`` makes one): a waiter blocks in ``BLPOP`` for at most half
    the socket timeout, so that the read never times out first. Redis 6 or newer (``BLPOP``
    with a fractional timeout).

    ``lease`` is how long a grant outlives its process: it is renewed in the background every
    ``lease / 3`` seconds while held.

    ``deadline`` (default True), :class:`~reachlimit.ColdLimiter`'s no wasted waits for the
    whole budget: a leader whose place cannot start within its wait by the budget's estimate
    of build time (from the grants waiters were promoted to, timed in Redis, in every
    process) is refused with ``Busy("deadline")`` at once, a waiter whose place falls behind
    its deadline is refused then. A budget setting: the newest process to start decides.

    Settings are data in Redis: ``active``, ``queue``, ``wait`` and ``lease`` are written into
    the budget's settings hash by every process when it starts using the budget - its first
    call of this object (``acquire``, ``stats``, ...; the Flask extension opens no connection
    before its first request) - the newest start winning, with one INFO line naming what
    changed (old -> new) and who changed it. Every script reads them from Redis: a deploy
    that changes a limit takes effect in every process at their next call, and a difference
    between processes is never an error. ``stats()`` shows the budget's settings as recorded
    in Redis, and a waiter's wait is the budget's. This object's own arguments stay its own
    for what they describe of this object (``capacity_active``, ``repr``), for a grant's lease
    where longer than the budget's (it is renewed every third of this object's lease), and for
    the in-process fallback a :class:`ResilientLimiter` runs while Redis is away. A Redis that
    lost the hash (restarted empty, evicted) is given this process's settings again by its
    next script.

    Errors of Redis itself (``redis.exceptions.RedisError``: connection refused, timeout)
    propagate out of ``acquire``, ``release`` and ``stats`` of this class; wrap it in
    :class:`ResilientLimiter` (as the Flask extension does) to fall back to an in-process
    limiter instead. A waiter that meets one leaves the queue (or Redis drops it within a
    presence period); a call whose reply was lost (the script may have run) has its token
    given up before this object's next round trip, so a slot or place it took is nobody's for
    no longer than that.

    Call :meth:`close` at the end to stop its two threads, the lease renewer and the waker
    that ends waiters' blocking reads on time (daemon threads either way).
    A preloaded master (gunicorn ``preload_app``) may make the limiter before it forks: both
    threads are started lazily, on first use (the renewer with the first grant, the waker
    with the first wait), never here, and a process forked since starts its own on its first
    use, as threads do not survive a fork (redis-py's pool opens new connections in the
    child). A grant held across a fork stays the parent's: the child does not renew it.

    The client's retries add to every wait: redis-py 6 and newer retry a failed command
    several times with a backoff by default; pass ``retry=Retry(NoBackoff(), 1)`` (say) to
    keep a Redis that is down from holding a request for long.
    """

    #: A waiter that has not polled for this long (its process died) leaves the queue; a
    #: promoted waiter must claim its slot within it. Four polls fit in it.
    PRESENCE = 1.0
    #: The longest a waiter without a cancel token blocks between two polls.
    POLL_EVERY = 0.25
    #: The longest a waiter blocks when a cancel token must be watched.
    CANCEL_POLL_INTERVAL = POLL_INTERVAL
    #: How long Redis remembers a token given up after its reply was lost, so that the call
    #: itself, if it reaches Redis only afterwards (sent on a timed-out connection to a Redis
    #: that was paused), is refused: far longer than such a call can sit in Redis's input.
    GIVEN_UP_FOR = 60.0

    def __init__(
        self, client: Client, name: str = "reachlimit",
        active: int = 2, queue: int = 8, wait: float = 3.0, retry_after: int = 2,
        *, lease: float = 10.0, prefix: str = "reachlimit", deadline: bool = True,
    ) -> None:
        self._set_figures(active, queue, wait, retry_after)
        self._lease = positive("lease", lease)
        if not isinstance(deadline, bool):
            raise ValueError("deadline is True or False")
        self._deadline = deadline
        self._bind(client, name, prefix, stores_bytes=False)
        self._keys = limiter_keys(prefix, name)  # the first is the script's one KEYS entry
        self._registry = registry_key(prefix)  # every name under the prefix (release_owner)
        self._members_key = members_key(prefix, name)  # the budget's live processes
        self._members: list[Members] = []  # those made by members(): close() stops them
        self._started = False  # racy: set once this process's settings were written to Redis
        self._bell = self._keys[0].rsplit(":", 1)[0] + ":w:"
        self._wait_ms = ms(self._wait)
        self._lease_ms = ms(self._lease)
        # The argument every operation takes after its name (ARGV[2]): the presence period,
        # the lease, then this process's settings, which count only where Redis has none.
        self._common = script_settings(
            self.PRESENCE, active, queue, self._wait, self._lease, deadline
        )
        # One script for every operation, the same for every limiter (it reads its budget's
        # settings from Redis), sent by ``_run``.
        self._script = PackedScript(client, lua.LIMITER)
        # What each operation sends after the SHA, packed once: the key count and its one key
        # (``T:holders``: the script builds the budget's other keys from its tag), the
        # operation and the common argument (``_run`` says why); the call's own follow.
        holders = self._keys[0].encode()
        encoded_common = tuple(str(arg).encode() for arg in self._common)
        self._heads = {
            op: head(b"1", holders, op.encode(), *encoded_common) for op in OPERATIONS
        }
        # The cold lead's: its three keys of the request's come after it, then the rest.
        self._lead_head = head(b"4", holders)
        self._encoded_common = encoded_common
        read_timeout = socket_timeout(client)
        # A blocking read must end before the socket's own timeout does.
        self._block_cap = read_timeout / 2 if read_timeout else math.inf
        # The grants held here, renewed in one round trip every lease / 3 seconds.
        self._leases: LeaseRenewer[RedisGrant] = LeaseRenewer(
            "reachlimit-lease-renewer", self._lease / 3, self._renew, what="lease(s)",
            on_lost=RedisGrant._mark_lost,
        )
        # Tokens of calls whose replies were lost: given up before the next round trip.
        self._lost_tokens: set[str] = set()
        self._cluster = is_cluster(client)  # a PING there would go to any node: nudge ours
        self._waker = Waker(client, self._keys[0] if self._cluster else None)
        # An admission the cold lead made (token, status, wait in ms), for the acquire that
        # follows in the same thread.
        self._known_admission: NextCallAnswer[tuple[str, int, int]] = NextCallAnswer(
            self._undo_admission
        )

    # -- public ---------------------------------------------------------------------------

    @property
    def lease(self) -> float:
        """How long a grant outlives its process (s): renewed every third of it while held."""
        return self._lease

    @property
    def keys(self) -> list[str]:
        """The fixed keys of this limiter (``_common.LIMITER_KEY_SUFFIXES``, in that order;
        the first, ``T:holders``, is the one its script is given, which builds the others from
        its hash tag; each client that waits also has a key of the same hash tag, and each
        waiter a doorbell while it is promoted: ``lua/README.md``)."""
        return list(self._keys)

    def members(self, **options: Any) -> Members:
        """A new member of this budget's live processes (``_members``), on this limiter's
        client: what a fallback that admits only its share counts (``ResilientLimiter``).
        ``options`` are :class:`~reachlimit.redis._members.Members`'s (``owner``,
        ``every``, ``period``). Nothing is sent to Redis until it announces; this limiter's
        :meth:`close` stops it (and leaves) if it was not closed before."""
        members = Members(self._client, self._members_key, holders=self._keys[0], **options)
        with self._lock:
            self._members.append(members)
        return members

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        """Take a build slot, waiting in the shared queue if needed; return the grant.

        ``client`` names whoever asks, the same way in every process (str, bytes, int, or a
        tuple of those; None is one anonymous client): queue places are shared fairly among
        clients, as :class:`~reachlimit.ColdLimiter` shares them. Anything else is a
        ``TypeError``, raised before any call to Redis.

        Raises ``Cancelled`` if ``cancel`` is set before (then without a call to Redis) or
        while waiting, ``Busy("queue_full")`` at once when every queue place is taken (one
        round trip), ``Busy("displaced")`` when a leader of a client holding fewer places took
        this waiter's place, ``Busy("deadline")`` (at once, or while waiting) when its place
        cannot start within its wait by the budget's estimate of build time (with the
        budget's ``deadline`` setting on), ``Busy("timeout")`` when the wait ends without a
        slot (or the waiter lost its place: Redis restarted empty, or it was dropped for not
        polling in time). Errors of Redis propagate as ``redis`` exceptions.
        """
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        known = self._known_admission.take()
        if known is not None:  # the cold lead acquired already (see ``lead``)
            token, status, wait_ms = known
        else:
            token, who = self._attempt(client)
            # The anonymous client's id is the script's default: one argument less to send.
            args = (token,) if who == _ANONYMOUS else (token, who)
            status, wait_ms = _admission(self._send(token, self._heads["acquire"], *args))
        if status == GRANTED:
            return self._granted(token)
        if status == FULL:
            raise Busy(Busy.QUEUE_FULL, self._retry_after)
        if status == LATE:  # queued and refused at once: its place could not start in time
            raise Busy(Busy.DEADLINE, max(self._retry_after, wait_ms))  # (here: seconds)
        # Queued for the budget's wait, as Redis answered (its deadline is Redis's too).
        return self._wait_for_slot(token, wait_ms / 1000, cancel)

    def lead(
        self, entry: str, flight_keys: list[str], flight_args: list[str | int], client: Hashable
    ) -> LeadReply:
        """The cold lead (``reachlimit.redis._lead``): one script that reads the cache
        ``entry`` (its Redis key), and, finding none and no flight claimed, acquires for
        ``client`` and claims the flight for a leader that builds or waits (its two keys, and
        its token, lease and counter's life in ms, as ``RedisSingleFlight`` sends them).
        What it acquired is this thread's to take with :meth:`known_admission`. Not on a
        Cluster (three hash tags: RuntimeError). Errors of Redis propagate (the token is then
        given up).
        """
        if self._cluster:
            raise RuntimeError("the cold lead spans three hash tags: not on a Redis Cluster")
        token, who = self._attempt(client)
        reply = self._send(
            token, self._lead_head, entry, *flight_keys, b"lead", *self._encoded_common, token,
            who, *flight_args,
        )
        return LeadReply.of(reply, token)

    def hold_fallback_builds(
        self, count: int, *, recovery: tuple[str, int, float] | None = None
    ) -> list[RedisGrant]:
        """``count`` builds this process's fallback admitted while Redis was away, still
        running as Redis comes back, made holders of the budget (the script's
        ``hold_fallback_builds``: over its capacity if need be), so that Redis gives no slot
        to anyone beside them until enough of them have ended: their grants, renewed as any
        other's, each to be released when its build ends. Not counted as acquired. One round
        trip; errors of Redis propagate (what the script may have done is given up at the
        next one).

        ``recovery``: this process is back from an outage, as member ``id`` of ``N`` live
        processes (``(id, N, reserve)``): its own reservation ends, or, the first member
        back, it reserves every other member's share for ``reserve`` seconds, while those
        may still admit it on their fallbacks (``lua/limiter.lua``'s Reservations). Sent
        also with no build to hold."""
        if count <= 0 and recovery is None:
            return []
        if self._leases.closed:  # racy read, as in _attempt
            raise RuntimeError("limiter closed")
        if not self._started:
            self._start()
        tokens = [new_token() for _ in range(count)]
        back = "-" if recovery is None else (
            f"{recovery[0]} {max(1, int(recovery[1]))} {ms(recovery[2])}"
        )
        try:
            self._evalsha(self._heads["hold_fallback_builds"], back, *tokens)
        except REDIS_ERRORS:
            for token in tokens:
                self._lose(token)
            raise
        return [self._granted(token) for token in tokens]

    def _attempt(self, client: Hashable) -> tuple[str, str]:
        """A new acquire's token and client id (TypeError for a client with no id), after
        the checks of a first call. RuntimeError once closed."""
        if self._leases.closed:  # racy read: close() is meant for the end of the process
            raise RuntimeError("limiter closed")
        who = _ANONYMOUS if client is None else client_id(client)
        if not self._started:
            self._start()
        return new_token(), who

    def _send(self, token: str, head: Head, *args: Any) -> Any:
        """An acquire of ``token`` (``_evalsha``); a lost reply loses the token (whatever the
        script did is given up next time)."""
        try:
            return self._evalsha(head, *args)
        except REDIS_ERRORS:
            self._lose(token)
            raise

    def known_admission(self, reply: LeadReply) -> AbstractContextManager[None]:
        """For the length of a ``with`` block, the next :meth:`acquire` in this thread
        answers the cold lead's admission (``reply``: its token, what it admitted and, queued,
        for how long) instead of asking Redis. One not taken by then is given up."""
        if reply.admitted is None:
            raise ValueError("the cold lead admitted nothing to hand over")
        return self._known_admission.give((reply.token, reply.admitted, reply.wait_ms))

    def _undo_admission(self, admission: tuple[str, int, int]) -> None:
        self._lose(admission[0])
        try:
            self._give_up_lost()
        except REDIS_ERRORS:
            pass  # kept for the next round trip

    def stats(self) -> RedisLimiterStats:
        """The figures of every process together, with the budget's settings as Redis holds
        them (one round trip, which also reaps)."""
        if not self._started:
            self._start()
        return stats_from_reply(self._evalsha(self._heads["stats"]), self._keys[0])

    def close(self, timeout: float = 5.0) -> None:
        """Stop the renewer and waker threads, for good: grants still held are no longer
        renewed (their release still works) and ``acquire`` raises ``RuntimeError`` from now
        on; the members made by :meth:`members` stop announcing and leave (those not closed
        yet)."""
        self._leases.close(timeout)
        self._waker.close(timeout)
        with self._lock:
            made, self._members = self._members, []
        for members in made:
            if not members.closed:
                members.close(timeout)

    @property
    def _lock(self) -> threading.Lock:
        """The renewer's lock (replaced in a forked child): it also guards each grant's held
        flag, ``_lost_tokens`` and ``_members``."""
        return self._leases.lock

    def __repr__(self) -> str:
        return (
            f"<RedisColdLimiter {self._keys[0].rsplit(':', 1)[0]} active={self._capacity} "
            f"queue={self._queue_capacity} wait={self._wait} lease={self._lease}>"
        )

    # -- the script -----------------------------------------------------------------------

    def _evalsha(self, head: Head, *args: str | bytes | int) -> Any:
        """One operation of the script (:meth:`_run`), after giving up the tokens whose
        replies were lost."""
        if self._lost_tokens:  # racy read: a token added meanwhile waits for the next call
            self._give_up_lost()
        return self._script(head, *args)

    def _run(self, head: Head, *args: str | bytes | int) -> Any:
        """One EVALSHA of the script: ``head`` is one of ``_heads`` (the key count, the key,
        the operation and the common argument, packed once), ``args`` the call's own. A
        Redis that does not know the script (restarted, flushed) gets it loaded and the call
        made again (on a Cluster: one EVAL of its text, sent to the node of its keys).

        Why not ``Script.__call__``, nor even ``execute_command``: redis-py packs every
        argument again on each call (about 0.35 us each in Python) and wraps each command in
        several us of its own (its retry wrapper, response callbacks, metrics), which a
        ``PING`` and a ``Lock`` pair pay as well. On a plain ``redis.Redis`` the call goes out
        pre-packed on a connection of the client's pool (``_packed``, whose design note says
        what stays redis-py's), and the script is given one key instead of twelve
        (``lua/README.md``, Cost). Measured with ``benchmarks/redis_micro.py``, six runs
        against six of the previous version (the same arguments encoded once, sent through
        ``execute_command``, twelve keys), alternating; 2-core Xeon VM, CPython 3.11, redis-py
        8.2, Redis 7.0 on loopback, load 0.9 to 1.6 from other work. Medians (and runs): a
        refusal for a full queue 1.39x a ``PING`` (1.38-1.41) against 2.10x (2.03-2.12); an
        acquire and its release 0.81x a redis-py ``Lock`` pair (0.80-0.82) against 1.20x
        (1.19-1.21). A refusal's ratio, split the same way (each part timed against the same
        ``PING``): the pool's checkout and the round trip itself about 0.71, the EVALSHA's
        packing and Redis's handling of it 0.15, the acquire's own Python (its token, the
        ``Busy`` raised and caught) 0.12, and the script's seven calls in Redis 0.43."""
        return self._script(head, *args)

    def settings(self) -> dict[str, int]:
        """This object's own settings, as it records them in Redis at its first call (the
        budget's, which the newest process to start wrote, are in :meth:`stats`)."""
        return {
            "active": self._capacity, "queue": self._queue_capacity,
            "wait_ms": self._wait_ms, "lease_ms": self._lease_ms,
            "deadline": int(self._deadline),
        }

    def _start(self) -> None:
        """The first call of this object, its start on the budget: record its settings (the
        ``record`` operation, which reaps and fills under them; one INFO line names a
        change), list its name under the prefix (``registry_key``: for ``release_owner``'s
        callers), and warn once per process if Redis may evict any key. Two or three round
        trips, once."""
        before = self._run(self._heads["record"], owner_id())
        settings_changed(f"budget {self._keys[0].rsplit(':', 1)[0]}", self.settings(), before)
        self._client.sadd(self._registry, self._name)
        warn_eviction(self._client)
        self._started = True

    def _lose(self, token: str) -> None:
        """The reply of a call of ``token`` was lost: give the token up before the next
        round trip (whatever that call did in Redis is undone then)."""
        with self._lock:
            self._lost_tokens.add(token)

    def _give_up_lost(self) -> None:
        """Give up, in one idempotent script, every token whose reply was lost. If Redis
        fails again, they are kept for the next round trip (and the error propagates)."""
        with self._lock:
            tokens, self._lost_tokens = list(self._lost_tokens), set()
        if not tokens:
            return
        try:
            freed, left = self._run(self._heads["give_up"], ms(self.GIVEN_UP_FOR), *tokens)
        except REDIS_ERRORS:
            with self._lock:
                self._lost_tokens.update(tokens)
            raise
        if freed or left:
            log.info("reachlimit: gave up %d slot(s) and %d queue place(s) whose replies "
                     "were lost", int(freed), int(left))

    def _poll(self, token: str, leaving: int) -> tuple[int, int]:
        """A poll: (outcome, milliseconds left of the wait)."""
        reply = self._evalsha(self._heads["poll"], token, str(leaving))
        return int(reply[0]), int(reply[1])

    # -- waiting --------------------------------------------------------------------------

    def _wait_for_slot(self, token: str, remaining: float, cancel: CancelToken | None) -> Grant:
        """Wait as a queued waiter until promoted, timed out, cancelled, displaced or refused
        late (module design: one pass of the loop). Runs in the requesting thread; the local
        clock only schedules the next poll."""
        bell = self._bell + token
        slice_cap = self.CANCEL_POLL_INTERVAL if cancel is not None else self.POLL_EVERY
        slice_cap = min(slice_cap, self._block_cap)
        retry = 0  # a late refusal's Retry-After (s), from Redis
        try:
            now = time.monotonic()
            next_poll = now + self.POLL_EVERY
            deadline = now + remaining
            while True:
                if cancel is not None and cancel.is_set():
                    # Cancelled, or already gone: either way; displaced or late is counted
                    # as such.
                    outcome, retry = self._poll(token, GIVE_UP)
                    if outcome in (DISPLACED, LATE):
                        break
                    raise Cancelled()
                now = time.monotonic()
                block = max(0.001, min(slice_cap, next_poll - now, deadline - now + 0.001))
                self._waker.wake_at(time.monotonic() + block)
                rang = self._client.blpop([bell], timeout=block)
                if rang is not None and rang[1] in DISPLACED_BELL:
                    outcome = DISPLACED  # the displacer took us out of the queue
                    break
                if rang is not None and rang[1][:1] in LATE_BELL:
                    outcome, retry = LATE, int(rang[1][1:] or 1)  # its refuser took us out
                    break
                now = time.monotonic()
                if rang is None and now < next_poll and now < deadline:
                    continue
                outcome, remaining_ms = self._poll(token, STAY)
                if outcome != WAITING:
                    retry = remaining_ms  # (for LATE: its Retry-After in s)
                    break
                now = time.monotonic()
                next_poll = now + self.POLL_EVERY
                deadline = now + remaining_ms / 1000
        except Cancelled:
            raise
        except BaseException:
            # A Redis error, or an exception thrown into this thread: leave the queue (or
            # pass on a slot handed over meanwhile). If Redis cannot be reached, it drops us
            # anyway one presence period after our last poll.
            try:
                self._poll(token, ABANDON)
            except REDIS_ERRORS:
                self._lose(token)  # Redis drops us anyway, a presence period later
            raise
        if outcome == GRANTED:
            return self._granted(token, timed=True)
        if outcome == DISPLACED:
            raise Busy(Busy.DISPLACED, self._retry_after)
        if outcome == LATE:
            raise Busy(Busy.DEADLINE, max(self._retry_after, retry))
        raise Busy(Busy.TIMEOUT, self._retry_after)  # TIMEOUT, or GONE: the place was lost

    # -- grants and their leases ------------------------------------------------------------

    def _granted(self, token: str, timed: bool = False) -> RedisGrant:
        grant = RedisGrant(self, token, timed)
        self._leases.hold(token, grant)
        return grant

    def _give_back(self, grant: RedisGrant, strict: bool) -> None:
        """Release ``grant``: exactly once, and in Redis only if the slot is still its own."""
        with self._lock:
            if not grant._mark_released(strict):
                return
            self._leases.drop_locked(grant.token)
        try:
            if grant.timed:  # Redis records how long a promoted waiter's grant was held
                kept = int(self._evalsha(self._heads["release"], grant.token, "t"))
            else:
                kept = int(self._evalsha(self._heads["release"], grant.token))
        except REDIS_ERRORS:
            self._lose(grant.token)  # freed at the next round trip, not after its lease
            raise
        if not kept:
            grant._lost = True

    def _renew(self, grants: list[RedisGrant]) -> list[str]:
        """The renewer's call (in its thread): push the leases of ``grants`` in one round
        trip; the tokens Redis no longer holds (lost leases, never revived)."""
        lost = self._evalsha(self._heads["renew"], *(g.token for g in grants))
        return [t.decode() if isinstance(t, bytes) else str(t) for t in lost]


class RedisGrant(Grant):
    """One build slot of a :class:`RedisColdLimiter`, held as a renewed lease.

    Same use as :class:`~reachlimit.Grant`: leaving the ``with`` block releases it;
    ``release()`` releases it early; a second ``release()`` raises ``RuntimeError``. The
    slot it frees is only ever its own: after a lost lease the release changes nothing.
    """

    __slots__ = ("_limiter", "token", "_lost", "timed")

    def __init__(self, limiter: RedisColdLimiter, token: str, timed: bool = False) -> None:
        self._limiter = limiter
        self.token = token
        self._held = True  # guarded by the limiter's lock
        self._lost = False  # set (once) by the renewer or the release; racy read
        #: A waiter was promoted to it: Redis times it, and its release says so.
        self.timed = timed

    @property
    def lease_lost(self) -> bool:
        """Racy read: whether this grant is known to have lost its lease."""
        return self._lost

    def _give_back(self, strict: bool) -> None:
        self._limiter._give_back(self, strict)

    def _mark_lost(self) -> None:
        """The renewer found this grant's lease gone (under the limiter's lock)."""
        self._lost = True
