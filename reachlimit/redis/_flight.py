"""A singleflight shared by every process that uses the same Redis and name.

design:

    RedisSingleFlight keys (one hash tag per caller's key, ``F = {<prefix>:<name>:<digest>}``):

      F:n           STR   the flight counter of this key: flight numbers come from INCR
      F:lead        STR   the claim: "<flight>:<token>" with PX ``lease``, set by a script
                          only where there is none, renewed while the leader's ``fn`` runs;
                          a corrupt claim is dropped, as if it had ended
      F:out:<n>     STR   the outcome of flight n, PX ``outcome_ttl`` (a few seconds)
      F:w:<n>       STR   how many followers (one per process and key) wait on flight n
      F:bell:<n>    LIST  flight n's doorbell: the publish pushes one element per follower

    Operations of one script, ``lua/flight.lua`` (each one EVALSHA, one round trip):
      join      a claim exists -> follow its flight (its outcome already there -> take it;
                else count ourselves in ``w``); no claim -> INCR the counter, claim, lead
      check     run by a follower after its doorbell rang and every ``POLL_EVERY`` seconds:
                the outcome of our flight -> take it; another flight claimed -> follow that
                one (or take its outcome); no claim, the latest flight has an outcome (it
                superseded ours) -> take it; no claim and no outcome (the leader died: its
                lease ended) -> claim *the same flight number* and lead it
      publish   SET the outcome NX (the first outcome of a flight wins), drop the claim if it
                is still ours, and push the doorbell once per counted follower
      renew     push the claim's lease end if the claim is still ours
      drop      drop a claim made by a dead process (its parent's ``release_claims``), or by
                a token of ours whose reply was lost (below)

    Why a taken-over flight keeps its number: its followers read the outcome of the flight
    they joined, so a flight finished by a follower that took over is found by the others,
    never built again. A new flight number is only made when there is no claim at all.

    Who wakes whom: a follower blocks in ``BLPOP`` on its flight's doorbell, in slices of at
    most ``CANCEL_POLL_INTERVAL`` when it has a cancel token (so a client that leaves is let
    go within about 50 ms) and ``POLL_EVERY`` otherwise, and never longer than half the
    socket timeout; the leader's publish rings it. Between rings a follower runs ``check``
    every ``POLL_EVERY`` seconds, which is also how it notices a dead leader.

    In the process: the flight first goes through an in-process ``SingleFlight``, so a herd
    of threads of one process makes one Redis join and one Redis wait; its local leader
    shares the outcome with the others. A local leader whose own client leaves while it
    follows in Redis raises ``Cancelled``; the threads that followed it locally get ColdPath's
    leader-cancelled marker and go round. The cold lead (``do_cold``, once
    ``use_cold_lead``) has an
    in-process flight of its own: its round trip may answer the entry the cache holds, stale
    included, which a refresh (``do``) must never be handed, and a stale answer must never
    wait behind a refresh's build; the two meet in Redis instead, as two processes would. A
    daemon thread per object renews the claims held here every ``lease / 3`` seconds, in
    one pipelined round trip.

    Outcomes across processes: a value (the codec), ``NOT_FOUND``, ``None``, ``Busy`` (its
    reason and retry-after), ``Cancelled``, ColdPath's leader-cancelled marker (followers go
    round), or any other exception, which followers raise as ``LeaderFailed`` (type name and
    message). A value the codec cannot encode reaches remote followers as ``LeaderFailed``;
    the leader and its local followers still get the value itself.

    Failure cases: a leader's process dies -> its claim is not renewed, ends after ``lease``
    (at once when its parent drops it: every token starts with its owner, and gunicorn's
    ``child_exit`` runs ``release_claims``), and the next ``check`` of a follower takes the
    flight over (or a newcomer's ``join``
    starts the next flight, which the followers of the lost one then follow): the key is built
    once more, never twice more. A Redis restarted empty loses the counter: a follower's
    ``check`` starts again past the number it knew. A leader paused past its lease may publish late:
    the first outcome of a flight wins, a later one is dropped. A follower slower than
    ``outcome_ttl`` misses the outcome and leads a flight of its own (ColdPath's recheck then
    finds the cached value). Redis errors (``redis.exceptions.RedisError``) propagate from
    ``get``, ``set``, the join and the wait; a leader whose publish fails still returns its
    own outcome (logged), and hands it to the republisher (``_republish``), which publishes
    it as soon as Redis answers again (tried every ``POLL_EVERY`` seconds for up to
    ``lease``): so a build that ended while Redis was paused or failing over reaches its
    followers elsewhere within a quarter of a second of Redis coming back, instead of them
    waiting out the claim's lease and building the key again. Only when Redis stays away
    for the whole lease do they take over, once the unrenewed claim ends. A script that may
    claim the flight (the join, the cold lead, a follower's check) whose reply is lost (a
    timeout: it ran, or will run once a paused Redis resumes, and its caller has gone on
    with the fallback) may leave a claim of ours that nobody renews or publishes: the
    republisher drops it (``drop``, by our token) as soon as it finds
    it, tried every ``POLL_EVERY`` seconds for up to ``lease``, so that the followers who
    joined it take the flight over at their next check.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from .._cancel import POLL_INTERVAL, CancelToken
from .._errors import Busy, Cancelled, LeaderFailed
from .._flight import SingleFlight
from .._path import LEADER_CANCELLED, NOT_FOUND, Found
from . import lua
from ._cache import Codec
from ._common import (
    REDIS_ERRORS,
    Client,
    LogOnce,
    Named,
    is_cluster,
    key_digest,
    ms,
    new_token,
    positive,
    socket_timeout,
)
from ._lead import CLAIMED, DONE, FOLLOW, HIT, LEAD
from ._renewer import LeaseRenewer
from ._republish import Republisher

if TYPE_CHECKING:
    from ._cache import RedisCache
    from ._limiter import RedisColdLimiter

__all__ = ["MESSAGE_LIMIT", "RedisSingleFlight"]

log = logging.getLogger("reachlimit")

#: The longest message of a leader's exception that followers get.
MESSAGE_LIMIT = 1000



class _Claim:
    """A flight this process leads (or may: ``flight`` 0): its two keys, their base (the
    prefix of its other keys), our token, and what the renewer needs to renew it."""

    __slots__ = ("keys", "base", "token", "flight")

    def __init__(self, keys: list[str], base: str, token: str, flight: int = 0) -> None:
        self.keys = keys
        self.base = base
        self.token = token
        self.flight = flight


class _Outcome:
    """A decoded flight outcome that is not a plain value."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class RedisSingleFlight(Named):
    """:class:`~reachlimit.SingleFlight`'s contract across every process on the same Redis
    and ``name``: one leader per key at a time in all of them, followers anywhere get its
    outcome. See the module's design note.

    ``do(key, fn, cancel)`` returns ``(value, shared)``. Keys as for :class:`RedisCache`.
    ``lease`` is how long a leader's claim outlives its process (renewed every ``lease / 3``
    seconds while ``fn`` runs); ``outcome_ttl`` how long a finished flight's outcome stays
    for slow followers. Every process must use the same values for a name.

    ``client`` is a ``redis.Redis`` (or a ``redis.cluster.RedisCluster``: a key's flight
    keys share a hash tag of their own) that does not decode responses, with a socket timeout
    (a follower blocks for at most half of it at a time). Call :meth:`close` at the end to
    stop the renewer thread (a daemon thread either way).
    """

    #: How often a follower checks on its flight between doorbell rings (a dead leader is
    #: noticed at the first check after its lease ended).
    POLL_EVERY = 0.25
    #: The longest a follower blocks when a cancel token must be watched.
    CANCEL_POLL_INTERVAL = POLL_INTERVAL

    def __init__(
        self, client: Client, name: str = "reachlimit",
        *,
        prefix: str = "reachlimit",
        lease: float = 10.0,
        outcome_ttl: float = 5.0,
        codec: str = "json",
    ) -> None:
        self._bind(client, name, prefix)
        self._lease = positive("lease", lease)
        self._outcome_ttl = positive("outcome_ttl", outcome_ttl)
        self._codec = Codec(codec)
        self._prefix = prefix
        self._lease_ms = ms(self._lease)
        self._outcome_ms = ms(self._outcome_ttl)
        # The counter outlives every claim and outcome that carries its numbers.
        self._keep_ms = 2 * (self._lease_ms + self._outcome_ms)
        # Every operation on a key's flights (lua/flight.lua: its first argument names which).
        self._script = client.register_script(lua.FLIGHT)
        read_timeout = socket_timeout(client)
        self._block_cap = read_timeout / 2 if read_timeout else math.inf
        self._local: SingleFlight[tuple[Any, bool, bool]] = SingleFlight()
        # The cold lead's own (``do_cold``): its leader's round trip may answer the
        # entry the cache holds, stale included, which a refresh (``do``) must never be
        # handed, and a stale answer must never wait for a refresh's build in ``_local``.
        self._local_cold: SingleFlight[tuple[Any, bool, bool]] = SingleFlight()
        self._undecodable = LogOnce()
        # The claims of the flights led here, renewed every lease / 3 seconds.
        self._claims: LeaseRenewer[_Claim] = LeaseRenewer(
            "reachlimit-flight-renewer", self._lease / 3, self._renew, what="flight claim(s)",
            on_error=self._report,
        )
        # The outcomes whose publish failed, published again once Redis answers; and the
        # claims a script whose reply was lost may have left (outcome None), dropped then.
        self._republisher: Republisher[tuple[_Claim, bytes | None]] = Republisher(
            "reachlimit-flight-republisher", self._publish_once,
            interval=self.POLL_EVERY, keep=self._lease,
            describe=lambda late: ("published a flight outcome" if late[1] is not None
                                   else "dropped a flight claim a lost reply left"),
        )
        #: Called with the error when publishing an outcome or renewing claims fails (both
        #: are logged and otherwise swallowed): how ResilientFlight learns of Redis failing.
        self.on_redis_error: Callable[[BaseException], None] | None = None
        self._cold_lead: tuple[RedisCache, RedisColdLimiter] | None = None

    def use_cold_lead(self, cache: RedisCache, limiter: RedisColdLimiter) -> bool:
        """Lead cold paths in one round trip (:meth:`do_cold`; ``reachlimit.redis._lead``):
        ``cache`` and ``limiter`` must be the very ones the path's reads and acquire end
        in, on the same Redis as this flight. Returns whether it does: not on a Cluster
        (three hash tags), where the steps go one by one."""
        if is_cluster(self._client):
            return False
        self._cold_lead = (cache, limiter)
        return True

    @property
    def uses_cold_lead(self) -> bool:
        """Whether :meth:`use_cold_lead` took its cache and limiter (not on a Cluster)."""
        return self._cold_lead is not None

    @property
    def lease(self) -> float:
        """How long a leader's claim outlives its process (s): renewed every third of it
        while the leader builds."""
        return self._lease

    def reads_cache(self, cache: Any) -> bool:
        """Whether :meth:`do_cold` reads ``cache``'s entry in Redis itself (the cold lead
        uses it), so that ColdPath asks only its first level before (``Flight``)."""
        lead = self._cold_lead
        return lead is not None and cache is lead[0]

    def base_of(self, key: Any) -> str:
        """The prefix of the Redis keys of ``key``'s flights (``...:lead``, ``...:n``, ...)."""
        return "{" + f"{self._prefix}:{self._name}:{key_digest(key)}" + "}:"

    def do(
        self, key: Hashable, fn: Callable[[], Any], cancel: CancelToken | None = None
    ) -> tuple[Any, bool]:
        """Run ``fn`` once for all concurrent callers of ``key`` in every process.

        Returns ``(value, shared)``: ``shared`` is False for the caller that ran ``fn``. A
        follower gets the leader's value, ``NOT_FOUND`` or ``None``; raises the leader's
        ``Busy`` (same reason and retry-after), ``Cancelled`` when its own ``cancel`` was set
        while it waited, or ``LeaderFailed`` when the leader raised anything else (in this
        process: the very exception). Errors of Redis propagate.
        """
        return self._do(self._local, key, lambda: self._shared_do(key, fn, cancel), cancel)

    def do_cold(
        self, key: Hashable, lead: Callable[[], Any], cancel: CancelToken | None = None,
        client: Hashable = None,
    ) -> tuple[Any, bool]:
        """:meth:`do` for a cold path's leader step ``lead`` (ColdPath's: recheck the cache,
        acquire for ``client``, build): with the cold lead (:meth:`use_cold_lead`), the
        cache's read in Redis, the flight's claim and the acquire are one round trip (an
        entry found is answered as ``reachlimit._path.Found``), and a refused leader claims
        nothing and publishes nothing. Without it, just :meth:`do`."""
        if self._cold_lead is None:
            return self.do(key, lead, cancel)
        return self._do(
            self._local_cold, key, lambda: self._shared_lead(key, lead, cancel, client), cancel
        )

    def _do(
        self, local: SingleFlight[tuple[Any, bool, bool]], key: Hashable,
        shared: Callable[[], tuple[Any, bool, bool]], cancel: CancelToken | None,
    ) -> tuple[Any, bool]:
        """The ``local`` flight over ``shared`` (this process's part of the shared flight)."""
        if self._claims.closed:  # racy read: close() is meant for the end of the process
            raise RuntimeError("flight closed")
        key_digest(key)  # a key with no encoding fails here, before any flight
        (value, shared_, gave_up), local_shared = local.do(key, shared, cancel)
        if gave_up:
            if not local_shared:
                raise Cancelled()  # our own client left while we followed in Redis
            return LEADER_CANCELLED, True  # our local leader's left: go round
        if isinstance(value, _Outcome):
            raise value.error
        return value, shared_ or local_shared

    def close(self, timeout: float = 5.0) -> None:
        """Stop the renewer and republisher threads, for good: claims still held are no
        longer renewed, outcomes not yet published are given up, and ``do`` raises
        ``RuntimeError`` from now on."""
        self._claims.close(timeout)
        self._republisher.close(timeout)

    def __repr__(self) -> str:
        return (f"<RedisSingleFlight {{{self._prefix}:{self._name}}} lease={self._lease} "
                f"outcome_ttl={self._outcome_ttl}>")

    # -- one process's part of a flight ---------------------------------------------------

    def _shared_do(
        self, key: Hashable, fn: Callable[[], Any], cancel: CancelToken | None
    ) -> tuple[Any, bool, bool]:
        """Run by the local leader: (value or _Outcome, shared, gave up waiting)."""
        ours = self._attempt(key)
        return self._joined(self._claiming(ours, lambda: self._call("join", ours)), ours, fn,
                            cancel)

    def _call(self, op: str, ours: _Claim, *more: Any, client: Any = None) -> Any:
        """One operation of the flight's script on the keys of ``ours``, as its token (and
        with the lease and counter life every operation takes); ``more``: its own arguments.
        ``client``: a pipeline to queue it on."""
        return self._script(
            keys=ours.keys, args=[op, ours.token, self._lease_ms, self._keep_ms, *more],
            client=client,
        )

    def _claiming(self, ours: _Claim, call: Callable[[], Any]) -> Any:
        """``call()``: a script that may claim the flight for our token (the join, the cold
        lead, a follower's check). If its reply is lost (a Redis error: it may have run, or
        may still run, say on a Redis that was paused), the claim it may have left is
        dropped once Redis answers (the republisher: tried for up to the lease), so that the
        followers who joined it take the flight over at their next check instead of
        waiting for its lease to end."""
        try:
            return call()
        except REDIS_ERRORS:
            self._republisher.add((_Claim(ours.keys, ours.base, ours.token), None))
            raise

    def _shared_lead(
        self, key: Hashable, lead: Callable[[], Any], cancel: CancelToken | None,
        client: Hashable,
    ) -> tuple[Any, bool, bool]:
        """``_shared_do`` through the cold lead (:meth:`do_cold`): the cache read, the
        flight's claim and the acquire in one round trip."""
        assert self._cold_lead is not None
        cache, limiter = self._cold_lead
        ours = self._attempt(key)
        entry, sent = cache.lead_key(key)
        args: list[str | int] = [ours.token, self._lease_ms, self._keep_ms]
        reply = self._claiming(ours, lambda: limiter.lead(entry, ours.keys, args, client))
        if reply.status == HIT:
            found = cache.found(key, entry, reply.data, reply.pttl, sent)
            if found is not None:
                return Found(found), False, False
            # An entry that does not decode (or, to a cache without a stale window, one past
            # its freshness): the general path (which will build it again).
            return self._shared_do(key, lead, cancel)
        if reply.status == CLAIMED:  # somebody leads it: join (follow, or take its outcome)
            return self._shared_do(key, lead, cancel)
        assert reply.admitted is not None
        with cache.known_miss(key), limiter.known_admission(reply):
            if reply.status != LEAD:  # refused: nobody follows, nothing to publish
                return lead(), False, False
            ours.flight = reply.flight
            return self._lead(ours, lead), False, False

    def _attempt(self, key: Hashable) -> _Claim:
        """A new attempt at ``key``'s flight: its keys, their base and a fresh token of ours
        (the flight is not claimed yet)."""
        base = self.base_of(key)
        # Owned, as the limiter's tokens are: the parent of a process that died drops its
        # claims at once (``release_claims``), so their followers take over without waiting
        # for the lease.
        return _Claim([base + "lead", base + "n"], base, new_token())

    def _joined(
        self, reply: Any, ours: _Claim, fn: Callable[[], Any], cancel: CancelToken | None,
    ) -> tuple[Any, bool, bool]:
        """After the join's ``reply``: lead, take the outcome, or follow until one of those."""
        while True:
            status, flight = int(reply[0]), int(reply[1])
            if status == LEAD:
                ours.flight = flight
                return self._lead(ours, fn), False, False
            if status == DONE:
                return self._decode_outcome(reply[2], ours.base), True, False
            try:
                reply = self._follow(ours, flight, cancel)
            except Cancelled:
                return None, True, True

    def _follow(self, ours: _Claim, flight: int, cancel: CancelToken | None) -> Any:
        """Wait on ``flight`` until its outcome comes, another flight is to be followed, or we
        are to lead; return the check's reply. Raises Cancelled."""
        bell = f"{ours.base}bell:{flight}"
        slice_cap = self.CANCEL_POLL_INTERVAL if cancel is not None else self.POLL_EVERY
        slice_cap = min(slice_cap, self._block_cap)
        next_check = time.monotonic() + self.POLL_EVERY
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            now = time.monotonic()
            block = max(0.001, min(slice_cap, next_check - now))
            rang = self._client.blpop([bell], timeout=block)
            if rang is None and time.monotonic() < next_check:
                continue
            reply = self._claiming(ours, lambda: self._call("check", ours, flight))
            if int(reply[0]) != FOLLOW or int(reply[1]) != flight:
                return reply
            next_check = time.monotonic() + self.POLL_EVERY

    def _lead(self, claim: _Claim, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` under a renewed claim, publish its outcome, return it (or raise)."""
        self._claims.hold(claim.token, claim)
        try:
            value = fn()
        except BaseException as exc:
            self._claims.drop(claim.token)
            self._publish(claim, self._encode_error(exc))
            raise
        self._claims.drop(claim.token)
        self._publish(claim, self._encode_value(value))
        return value

    # -- outcomes ---------------------------------------------------------------------------

    def _encode_value(self, value: Any) -> bytes:
        if value is LEADER_CANCELLED:
            return b"c"
        if value is NOT_FOUND:
            return b"n"
        if value is None:
            return b"0"
        try:
            return b"v" + self._codec.encode(value)
        except TypeError as exc:
            return self._encode_error(exc)

    @staticmethod
    def _encode_error(exc: BaseException) -> bytes:
        if isinstance(exc, Busy):
            return b"b" + json.dumps([str(exc.reason), int(exc.retry_after)]).encode()
        if isinstance(exc, Cancelled):
            return b"x"
        if isinstance(exc, LeaderFailed):  # passed on as it came
            type_name, message = exc.type_name, exc.message
        else:
            type_name = type(exc).__qualname__
            try:
                message = str(exc)
            except Exception:
                message = "(unprintable)"
        return b"e" + json.dumps([type_name, message[:MESSAGE_LIMIT]]).encode()

    def _decode_outcome(self, data: Any, base: str) -> Any:
        """A value, or an _Outcome holding the exception to raise."""
        try:
            kind, body = bytes(data[:1]), bytes(data[1:])
            if kind == b"v":
                return self._codec.decode(body)
            if kind in (b"n", b"0", b"c", b"x") and body:
                raise ValueError("unexpected body")
            if kind == b"n":
                return NOT_FOUND
            if kind == b"0":
                return None
            if kind == b"c":
                return LEADER_CANCELLED
            if kind == b"x":
                return _Outcome(Cancelled())
            if kind in (b"b", b"e"):
                first, second = json.loads(body.decode("utf-8"))
                if kind == b"b":
                    if not isinstance(first, str) or type(second) is not int:
                        raise ValueError("bad refusal")
                    return _Outcome(Busy(first, second))
                if not isinstance(first, str) or not isinstance(second, str):
                    raise ValueError("bad error")
                return _Outcome(LeaderFailed(first[:MESSAGE_LIMIT], second[:MESSAGE_LIMIT]))
            raise ValueError("unknown kind")
        except (ValueError, TypeError, RecursionError) as exc:
            self._undecodable("flight outcome", base, f"{type(exc).__name__}: {exc}")
            return _Outcome(LeaderFailed("ValueError", "the leader's outcome did not decode"))

    def _publish(self, claim: _Claim, outcome: bytes) -> None:
        """Publish the outcome of our flight. A Redis error here is logged, not raised: the
        leader's own outcome stands, and the republisher publishes it once Redis answers."""
        try:
            self._publish_once((claim, outcome))
        except REDIS_ERRORS as exc:
            log.warning("reachlimit: could not publish a flight outcome (it will be once "
                        "Redis answers): %s", exc)
            self._republisher.add((claim, outcome))
            self._report(exc)

    def _publish_once(self, late: tuple[_Claim, bytes | None]) -> bool:
        """One try of the publish (Redis errors propagate); with no outcome, of
        dropping the claim a lost reply may have left (``_claiming``): False while there is
        none of ours (the script that was lost may yet run: tried again)."""
        claim, outcome = late
        if outcome is None:
            return bool(self._script(keys=claim.keys[:1], args=["drop", claim.token]))
        self._call("publish", claim, claim.flight, outcome, self._outcome_ms)
        return True

    def _report(self, exc: BaseException) -> None:
        report = self.on_redis_error
        if report is not None:
            report(exc)

    # -- claims and their leases ------------------------------------------------------------

    def _renew(self, claims: list[_Claim]) -> list[str]:
        """The renewer's call (in its thread): renew every claim in one pipelined round trip
        (on a Cluster one script a claim: its pipelines take no scripts, and each claim has
        a slot of its own); the tokens of the claims found gone (never revived)."""
        if is_cluster(self._client):
            return [c.token for c in claims if not int(self._call("renew", c, c.flight))]
        pipe = self._client.pipeline(transaction=False)
        for c in claims:
            self._call("renew", c, c.flight, client=pipe)
        replies = pipe.execute()
        return [c.token for c, kept in zip(claims, replies, strict=True) if not int(kept)]
