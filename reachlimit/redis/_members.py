"""The live processes of a budget, as Redis knows them: how many in-process fallbacks share
it while Redis is away.

design:

    Each process that uses a budget with an in-process fallback (``ResilientLimiter`` with
    ``fallback="local"``) is one member of it: a ``Members`` object, one daemon thread
    (``_daemon.Daemon``) that announces the member to Redis every ``every`` seconds, off
    every request's path. An announce is one script (``lua/members.lua``, self-contained):
    in the budget's ``T:members`` ZSET (the limiter's hash tag: its Cluster slot) the
    member's period is pushed to Redis's now + ``period``, every member whose period ended
    is dropped, and the reply is how many are live - N, kept here as :attr:`count` (at
    least 1: this member; 1 until Redis first answered). A process that dies stops
    announcing and drops out one period after its last announce; one that closes leaves at
    once (:meth:`close`), and the parent of a worker that died removes all of the worker's
    members (``release_owner``: the same script, leaving by the owner's prefix).

    A Redis that restarted empty (or lost the key) knows none of the members: each is new
    to it at its next announce, within a period, so the first replies count too few. A
    member that Redis no longer knew (the reply says so) takes its count as at least the
    one it knew before, for one period: otherwise a fallback sized by that count would
    admit more than its share (one process counting itself alone admits the whole budget),
    and the first process back from the outage would reserve too few shares for the others
    (``lua/limiter.lua``'s Reservations). The soak saw both: 5 builds at once for a bound
    of 4 after a restart.

    A member's id is its owner prefix (``"<host>:<boot id>:<pid>:"``, ``owner_prefix``)
    and a random part: two fallbacks in one process (two apps on one budget) are two
    members, as each admits its own share; a member of a process that died is known by its
    owner prefix. After a fork the child is a new member (a new id from its own pid; the
    parent goes on announcing its own), with no thread until its next :meth:`start`, and
    keeps the last N the parent knew (the same budget).

    An announce that works calls :attr:`on_answer` (the health's ``probe_soon``: Redis is
    answering, so a health that believes it down probes now, not at its backoff's end).
    A failed announce (Redis down, slow) changes nothing: :attr:`count` stays the last
    known, so while Redis is away a process goes on with the N Redis last told it. It is
    logged at debug level only (the health logs the outage) and tried again ``every``
    seconds later; the thread never reports to the health (requests and the probe do).

    ``lock`` (``Daemon``'s, replaced in a forked child) guards ``_id``, the closed flag and
    the thread; :attr:`count` is written by whoever announces (the thread, or a caller of
    :meth:`announce`) and read racily. No Redis call is made under the lock.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

from . import lua
from ._common import REDIS_ERRORS, Client, ms, owner_prefix, positive
from ._daemon import Daemon

__all__ = ["Members"]

log = logging.getLogger("reachlimit")


class Members(Daemon):
    """This process as one live member of a budget, announced to Redis in the background,
    and how many live members Redis counted last (module design).

    ``key`` is the budget's members key (``_common.members_key``). ``owner`` is the start of
    the member's id: this process's owner prefix by default (taken afresh in a forked
    child); a test may pass another process's (``"<host>:<boot id>:<pid>:"``)."""

    #: How often a member announces itself (seconds).
    EVERY = 1.0
    #: How long an announce keeps a member live: three announces, so a process delayed by
    #: a loaded machine for a second or two is not taken for gone.
    PERIOD = 3.0
    #: The name of the announcing thread.
    THREAD_NAME = "reachlimit-members"

    def __init__(
        self,
        client: Client,
        key: str,
        *,
        owner: str | None = None,
        every: float | None = None,
        period: float | None = None,
        holders: str | None = None,
    ) -> None:
        super().__init__(self.THREAD_NAME)
        if owner is not None and (not isinstance(owner, str) or not owner.endswith(":")):
            raise ValueError(f"owner must look like '<host>:<boot id>:<pid>:', got {owner!r}")
        self._every = positive("every", self.EVERY if every is None else every)
        self._period = positive("period", self.PERIOD if period is None else period)
        self._client = client
        self._key = key
        # The limiter's slots (its ``holders`` key), where an announce drops a reservation
        # of this member's share once it uses Redis again (``uses_redis``); None: never.
        self._holders = holders
        self._owner = owner
        self._script = client.register_script(lua.MEMBERS)
        self._id = self._new_id()  # guarded by lock
        self._count = 1  # racy read: the live members Redis counted last (at least 1)
        # Written by whoever announces: whether this member announced before, and until when
        # (monotonic) a count that Redis's loss of the members (it restarted empty) made too
        # small is taken as at least the one known before it (``announce``).
        self._announced = False
        self._held_until, self._held = 0.0, 1
        #: Called (in the thread) after each announce that worked: a ``ResilientLimiter``
        #: sets its health's ``probe_soon``, so that Redis back is noticed within a period.
        self.on_answer: Callable[[], object] | None = None
        #: Whether this process uses Redis now (on no fallback): a ``ResilientLimiter`` sets
        #: its health's ``is_up``. An announce made while it says so drops a reservation of
        #: this member's share that another member's recovery made (``lua/limiter.lua``'s
        #: Reservations): this member admits nothing on a fallback.
        self.uses_redis: Callable[[], bool] | None = None

    @property
    def count(self) -> int:
        """Racy read: N, the live members of the budget as Redis counted them at this
        member's last announce that worked (this one included); 1 before any did."""
        return self._count

    @property
    def id(self) -> str:
        """Racy read: this member's id in Redis."""
        return self._id

    @property
    def key(self) -> str:
        """The budget's members key in Redis, ``T:members`` (``lua/members.lua``)."""
        return self._key

    def start(self) -> None:
        """Announce in the background from now on (the thread starts unless it runs, or
        this object is closed). Cheap once started: one attribute read."""
        if self._thread is None:  # racy read: started already, in the common case
            with self.lock:
                self._start_locked()

    def announce(self) -> int:
        """Announce this member once, now (what the thread does every ``every`` seconds):
        its period pushed on, the ended ones dropped; returns N, also kept as
        :attr:`count`. Errors of Redis propagate (:attr:`count` unchanged)."""
        with self.lock:
            member = self._id
        uses_redis = self.uses_redis
        if self._holders is not None and uses_redis is not None and uses_redis():
            reply = self._script(keys=[self._key, self._holders],
                                 args=[member, ms(self._period), "1"])
        else:
            reply = self._script(keys=[self._key], args=[member, ms(self._period)])
        live = max(1, int(reply[0]))
        if int(reply[1]) and self._announced:
            # Redis did not know this member any more: it restarted empty (or lost the key),
            # and the others announce again within a period. Until then its count is too
            # small, and a fallback sized by it would admit more than its share.
            self._held_until, self._held = time.monotonic() + self._period, self._count
        if time.monotonic() < self._held_until:
            live = max(live, self._held)
        self._announced = True
        if live != self._count:
            log.debug("reachlimit: %s: %d live process(es) share the budget", self._key, live)
        self._count = live
        return live

    def leave(self) -> None:
        """Remove this member from Redis now (its period would end it anyway). Errors of
        Redis propagate."""
        with self.lock:
            member = self._id
        self._script(keys=[self._key], args=[member, "0"])

    def close(self, timeout: float = 5.0, leave: bool = True) -> None:
        """Stop announcing, for good; then, with ``leave``, remove this member from Redis
        at once (a failure is logged at debug level: the member drops out one period
        later). Safe to call more than once."""
        super().close(timeout)
        if not leave:
            return
        try:
            self.leave()
        except REDIS_ERRORS as exc:
            log.debug("reachlimit: could not leave %s (%s); it drops out in %g s",
                      self._key, exc, self._period)

    def __repr__(self) -> str:
        return f"<Members {self._key} {self._id} count={self._count}>"

    def _new_id(self) -> str:
        return (owner_prefix() if self._owner is None else self._owner) + secrets.token_hex(6)

    def _after_fork(self) -> None:
        self._id = self._new_id()  # the child is a member of its own (module design)

    def _run(self) -> None:
        """The thread: announce, then wait ``every`` seconds, until :meth:`close`."""
        while True:
            with self.lock:
                if self._closed:
                    return
            try:
                self.announce()
                answered = self.on_answer
                if answered is not None:
                    answered()
            except REDIS_ERRORS as exc:
                log.debug("reachlimit: could not announce %s (%s); N stays %d",
                          self._key, exc, self._count)
            except Exception:  # never let the thread die: N would stop following Redis
                log.exception("reachlimit: announcing %s failed", self._key)
            with self.lock:
                if self._closed:
                    return
                self._cond.wait(self._every)
