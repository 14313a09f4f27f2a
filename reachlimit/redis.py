"""A cold limiter shared by every process that uses the same Redis and name.

The shared warm cache and singleflight, ``RedisCache`` and ``RedisSingleFlight``, live in
``reachlimit/_redis_shared.py`` (with their own design note) and are imported from here.

design:

    Keys (one hash tag, ``T = {<prefix>:<name>}``, so every script touches one Cluster slot):

      T:holders    ZSET  grant token -> lease end (ms, Redis time)      the slots held
      T:queue      ZSET  waiter token -> ticket                          the waiters, FIFO
      T:alive      ZSET  waiter token -> presence end (ms, Redis time)   waiters still polling
      T:deadline   HASH  waiter token -> wait deadline (ms, Redis time)
      T:seq        STR   the ticket counter (INCR)
      T:stats      HASH  counters and peaks
      T:clientof   HASH  waiter token -> its client's id
      T:clients    ZSET  client id -> turn stamp: the waiting clients, in turn order
      T:c:<id>     ZSET  waiter token -> ticket: one client's waiters, FIFO
      T:w:<token>  LIST  a waiter's doorbell: pushed once, "1" when it is promoted, "d" when
                         it is displaced

    Fair admission (the rules of ``reachlimit._limiter``, the same here): a client's id is a
    short hash of the name the caller gave (``client_id``). A client gets a turn stamp (a
    number from ``seq``) when its first waiter joins; promotion takes the oldest waiter of the
    client with the lowest stamp, and that client, if it still waits, gets a new stamp (the
    back of the turn). That is round-robin across clients in the order their waits began and
    FIFO within each, exactly the in-process limiter's turn list; with one client it is the
    ticket order (and its stamp is left alone). A newcomer that finds the queue full displaces
    the newest waiter of the client holding most places (ties: whose newest waiter has the
    higher ticket) if that client holds two places more than its own: the victim leaves the
    queue in the same script, its doorbell gets "d" (it learns at once, blocked in BLPOP, or at
    its next poll), and the newcomer joins in its place; the displacement is counted there, so
    a victim whose process died loses nothing.

    A token is random (made by the client) and names one attempt for good, also across a
    Redis that restarts empty; the ticket that orders the queue comes from Redis (INCR).
    A token is in at most one of ``holders`` and ``queue``, and only a script moves it.

    Every script first reaps and refills, so no state depends on a process staying alive:
      reap   holders whose lease ended are removed (counted ``lease_lost``); waiters whose
             presence ended (they stopped polling: their process died) leave the queue
      fill   while fewer than ``active`` slots are held, the oldest waiter is promoted: it is
             moved into ``holders`` with a short claim lease (one presence period) and its
             doorbell is pushed; its next poll turns the claim into a full lease

    Scripts (each one EVALSHA, one round trip; time is ``TIME`` inside the script):
      acquire   a free slot -> hold it (fast path); the queue full -> count ``rejected_full``
                and answer at once (nothing else is written, unless reaping found a dead
                holder or waiter); else INCR a ticket and join the queue
      poll      run by a waiter after its doorbell rang, every ``POLL_EVERY`` seconds and
                when its cancel token is set: promoted -> keep the slot (or, when giving up,
                pass it on); deadline passed -> leave (timeout); giving up -> leave
                (cancelled); neither -> refresh presence. All in one script, so a promotion
                racing a timeout or a cancel ends in exactly one outcome and the slot is
                kept or passed on, never lost and never counted twice.
      release   remove the grant's token from ``holders`` (only its own: a token reaped for
                a lost lease is gone, so a late release frees nothing) and fill
      renew     push the lease end of the tokens still held; a reaped token is not revived
      stats     reap, fill, and read the figures

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

    Who wakes whom: a waiter blocks in ``BLPOP`` on its own doorbell for at most
    ``POLL_EVERY`` seconds (``CANCEL_POLL_INTERVAL`` with a cancel token); whichever script
    promotes it (a release, a reap found by anybody's script) pushes the doorbell. No one polls
    for a free slot: a waiter's regular poll only proves it is alive and checks its deadline.
    Redis ends a ``BLPOP`` that timed out only when its event loop next runs: on a server
    with no other traffic, at its cron tick, every ``1 / hz`` seconds (100 ms by default),
    which would make a 50 ms slice last up to 100 ms. So one daemon thread per limiter object
    (``_Waker``, started with the first wait) sends a ``PING`` just after each slice's end,
    which makes the loop run and the ``BLPOP`` end on time: a waiter notices a cancel within
    a slice and its deadline within a few milliseconds, as the local limiter does
    (``benchmarks/redis_handoff.py`` measures both).

    Leases: a grant is a lease of ``lease`` seconds, renewed every ``lease / 3`` seconds by one
    daemon thread per limiter object, in one round trip for all its grants. A process that
    dies stops renewing; its slots come back when their leases end (the next script of any
    process reaps them) and its waiters leave the queue one presence period after their last
    poll. A holder that was paused past its lease has lost the slot (counted once, when it is
    reaped); its release is then a no-op in Redis. The same covers a reply lost on the way
    back (a socket timeout after the script ran): the grant or the queue place it made is
    nobody's, and it ends with its lease or its presence. A client that retries sends the
    same token again: the acquire script then answers what its first run decided (claiming
    a slot handed over in between), so a token never both holds and waits. That check is on
    the acquire script's general path only, to keep the fast grant and the refusal as cheap
    as they are: a retry that finds every slot held and every queue place taken is refused
    although its first run took a slot or a place, which then ends with its lease (counted
    ``lease_lost``) or its presence (about a second). A retried poll, release or refusal can
    still count its outcome twice (or flag its grant ``lease_lost``). ``reachlimit.redis.
    connect`` makes clients that never retry, so none of this happens through the extension.

    In the process: one ``threading.Lock`` guards the grants held here (the renewer's list),
    each grant's ``held`` flag and the closed flag; the renewer waits on a Condition of that
    lock. It waits untimed only when it found nothing held (idle); a grant taken then, and
    ``close``, notify it. Once woken it waits a whole interval before it may go idle again,
    so an acquire has a thread to wake at most once per interval. No Redis call is made
    under the lock.

    Cluster: the fixed keys are passed as KEYS; a doorbell key is built inside the script
    from the same hash tag, so it lives in the same slot.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ._cancel import POLL_INTERVAL, CancelToken
from ._errors import Busy, Cancelled
from ._limiter import Grant, LimiterFigures, LimiterStats
from ._redis_counters import SharedPathCounters
from ._redis_shared import RedisCache, RedisSingleFlight

__all__ = [
    "RedisCache",
    "RedisColdLimiter",
    "RedisGrant",
    "RedisLimiterStats",
    "RedisSingleFlight",
    "SharedPathCounters",
]

log = logging.getLogger("reachlimit")

# Replies of the scripts (small integers: cheap to send, the same with decode_responses on/off).
_FULL, _GRANTED, _QUEUED = 0, 1, 2
_WAITING, _TIMEOUT, _CANCELLED, _GONE, _DISPLACED = 2, 3, 4, 5, 6  # poll replies
#: What a displaced waiter's doorbell holds (bytes, or str with decode_responses).
_DISPLACED_BELL = (b"d", "d")
# What a poll tells Redis about the waiter.
_STAY, _GIVE_UP, _ABANDON = 0, 1, 2  # abandon = leave on an error: counted nowhere

# The fixed keys, after the hash tag, in the order the scripts read KEYS.
_KEY_SUFFIXES = ("holders", "queue", "alive", "deadline", "stats", "seq", "clientof", "clients")

# Every script reads KEYS as above. Its settings come one of two ways:
# - sent: ARGV[1] the doorbell key prefix, ARGV[2] active, ARGV[3] the lease and ARGV[4] the
#   presence period (ms); the script's own arguments follow from ARGV[5] (``_PRELUDE``);
# - built in: the two hot scripts, acquire and release, are made per limiter with its
#   settings written into the text (``_hot_script``), so that each call sends only the token;
#   the doorbell prefix is then derived from KEYS[1] (``T:holders`` -> ``T:w:``).
_KEYS = """
local holders, queue, alive, deadlines, stats, seq =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local clientof, clients = KEYS[7], KEYS[8]
local of_client = string.sub(holders, 1, -8) .. 'c:'  -- .. id: one client's waiters
"""

_SENT_SETTINGS = """
local bell = ARGV[1]
local capacity = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local presence_ms = tonumber(ARGV[4])
local queue_cap = false  -- not sent: waiters are counted the general way
"""

_BUILT_IN_SETTINGS = """
local capacity, lease_ms, presence_ms = @ACTIVE@, @LEASE_MS@, @PRESENCE_MS@
local queue_cap, wait_ms = @QUEUE@, @WAIT_MS@
"""

_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_COUNT = """
local held = redis.call('ZCARD', holders)  -- never more than capacity
local queued = 0  -- never more than the queue capacity; alive holds exactly the queued tokens
"""

# The general steps, after _COUNT. They keep ``held`` and ``queued`` up to date
# (``promote()``), so that each is counted once; ``fill()`` counts afresh first, for a script
# that changed ``holders`` or ``queue`` itself (as every script did before the counts were
# kept).
#
# Every script ends with nobody waiting while a slot is free (it fills), and only scripts
# change ``holders``; so at the start of a script, fewer entries in ``holders`` than
# ``capacity`` (those whose lease ended included) means an empty queue. The hot scripts rely
# on that and do not look at the queue then. The other scripts count the queue every time, so
# a waiter's regular poll would repair a state that broke the rule (a key evicted, say).
# When every slot is held and the queue capacity is known (the hot scripts), the waiters are
# counted by their live presences: a queue full of live waiters is one read, and nothing in
# it is due for reaping (there are never more than ``queue_cap`` waiters).
_STEPS = """
local function recount()
  held = redis.call('ZCARD', holders)
  queued = redis.call('ZCARD', queue)
end

local function raise_peak(field, value)
  if value > (tonumber(redis.call('HGET', stats, field)) or 0) then
    redis.call('HSET', stats, field, value)
  end
end

local function forget_waiter(token)
  redis.call('ZREM', queue, token)
  redis.call('ZREM', alive, token)
  redis.call('HDEL', deadlines, token)
  local id = redis.call('HGET', clientof, token)
  if id then
    redis.call('HDEL', clientof, token)
    redis.call('ZREM', of_client .. id, token)
    if redis.call('ZCARD', of_client .. id) == 0 then redis.call('ZREM', clients, id) end
  end
end

local function reap()
  local nobody_waits = queue_cap and held < capacity  -- the rule above
  -- Counted first, removed only if there is something to remove: a refusal writes nothing.
  if held > 0 then
    local lost = redis.call('ZCOUNT', holders, '-inf', now)
    if lost > 0 then
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
      redis.call('HINCRBY', stats, 'lease_lost', lost)
      held = held - lost
    end
  end
  if nobody_waits then
    queued = 0
    return
  end
  if queue_cap and held >= capacity then
    local live = redis.call('ZCOUNT', alive, '(' .. now, '+inf')
    if live >= queue_cap then
      queued = live
      return
    end
  end
  queued = redis.call('ZCARD', queue)
  if queued > 0 then
    local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
    for _, token in ipairs(dead) do
      forget_waiter(token)
      redis.call('DEL', bell .. token)
    end
    if #dead > 0 then queued = redis.call('ZCARD', queue) end
  end
end

-- Queue ``token`` of client ``id`` with ``ticket``: a client new to the queue waits last.
local function join(token, id, ticket)
  redis.call('ZADD', of_client .. id, ticket, token)
  redis.call('HSET', clientof, token, id)
  if not redis.call('ZSCORE', clients, id) then
    redis.call('ZADD', clients, redis.call('INCR', seq), id)
  end
end

-- Take the waiter to promote out of the queue and return it (nil if none): the oldest of
-- the first client in turn, which goes to the back of the turn if it still waits. With one
-- client waiting, the oldest ticket.
local function next_in_turn()
  if redis.call('ZCARD', clients) > 1 then
    local id = redis.call('ZRANGE', clients, 0, 0)[1]
    local token = redis.call('ZRANGE', of_client .. id, 0, 0)[1]
    if token and redis.call('ZSCORE', queue, token) then
      forget_waiter(token)
      if redis.call('ZSCORE', clients, id) then
        redis.call('ZADD', clients, redis.call('INCR', seq), id)
      end
      return token
    end
  end
  local token = redis.call('ZRANGE', queue, 0, 0)[1]
  if token then forget_waiter(token) end
  return token
end

-- A newcomer whose client holds ``mine`` places found the queue full: displace the newest
-- waiter of the client holding most places if that is ``mine + 2`` or more.
local function displace(mine)
  local most, newest_ticket, victim = -1, -1, nil
  for _, id in ipairs(redis.call('ZRANGE', clients, 0, -1)) do
    local n = redis.call('ZCARD', of_client .. id)
    if n >= most and n > 0 then
      local last = redis.call('ZRANGE', of_client .. id, -1, -1, 'WITHSCORES')
      local ticket = tonumber(last[2])
      if n > most or ticket > newest_ticket then
        most, newest_ticket, victim = n, ticket, last[1]
      end
    end
  end
  if not victim or most < mine + 2 then return false end
  forget_waiter(victim)
  redis.call('RPUSH', bell .. victim, 'd')
  redis.call('PEXPIRE', bell .. victim, 2 * presence_ms)
  redis.call('HINCRBY', stats, 'displaced', 1)
  queued = queued - 1
  return true
end

local function promote()
  if held >= capacity or queued == 0 then return end
  -- As many waiters as there are free slots, each the next in turn.
  local promoted = 0
  while held < capacity and queued > 0 do
    local token = next_in_turn()  -- out of the queue already
    if not token then break end
    redis.call('ZADD', holders, now + presence_ms, token)
    redis.call('RPUSH', bell .. token, 1)
    redis.call('PEXPIRE', bell .. token, 2 * presence_ms)
    held = held + 1
    queued = queued - 1
    promoted = promoted + 1
  end
  if promoted > 0 then raise_peak('peak_active', held) end
end

local function fill()
  recount()
  promote()
end

reap()
promote()
"""

#: The start of every script whose settings are sent (ARGV[1..4]); its own arguments follow.
_PRELUDE = _KEYS + _SENT_SETTINGS + _CLOCK + _COUNT + _STEPS

# The hot scripts answer their common cases before the general steps (whose functions Lua
# would otherwise build on every call): each such case is one where those steps would find
# nothing to reap and nobody to promote, and it makes the same calls they would have made.

# Acquire, sent while this limiter's last acquire was refused, before _COUNT: the refusal
# first. Every slot held by a live lease and every place by a live waiter leaves nothing to
# reap or promote (there are never more than capacity holders, nor queue_cap waiters).
_REFUSAL_FIRST = """
if redis.call('ZCOUNT', holders, '(' .. now, '+inf') >= capacity
    and redis.call('ZCOUNT', alive, '(' .. now, '+inf') >= queue_cap
    and queue_cap < 2 * redis.call('ZCARD', of_client .. (ARGV[2] or '-')) + 2 then
  redis.call('HINCRBY', stats, 'rejected_full', 1)
  return 0
end
"""

# Acquire, ARGV[1] token, ARGV[2] client id. Replies 1 granted, 0 refused (queue full), 2
# queued (for the client's own ``wait``). First its two common cases: a slot free with no
# lease ended (then nobody waits: grant it), and every slot held with no lease ended and every
# place taken by a live waiter, with no place the client could take over (refuse: reads only,
# and the counter). A client holding c places can take one over only if 2c + 2 places or
# more are taken (the biggest client must hold c + 2); one read of its count says so.
_ACQUIRE_FIRST = """
local token = ARGV[1]
if held < capacity then
  if held == 0 or redis.call('ZCOUNT', holders, '-inf', now) == 0 then
    redis.call('ZADD', holders, now + lease_ms, token)
    redis.call('HINCRBY', stats, 'acquired', 1)
    -- A peak of one needs no write: any grant implies it (``stats`` reads it so).
    if held > 0 and held + 1 > (tonumber(redis.call('HGET', stats, 'peak_active')) or 0) then
      redis.call('HSET', stats, 'peak_active', held + 1)
    end
    return 1
  end
elseif redis.call('ZCOUNT', holders, '-inf', now) == 0
    and redis.call('ZCOUNT', alive, '(' .. now, '+inf') >= queue_cap
    and queue_cap < 2 * redis.call('ZCARD', of_client .. (ARGV[2] or '-')) + 2 then
  redis.call('HINCRBY', stats, 'rejected_full', 1)
  return 0
end
"""

_ACQUIRE = """
-- A token Redis knows already: the client is retrying this call after losing its reply.
-- Answer what the first run decided (a slot handed over meanwhile is claimed here), so that
-- the token never both holds and waits and nothing is counted twice. Only here, on the
-- general path: the common cases above cannot meet a known token, but for the one written
-- down in the design note (a retry that finds every place taken).
if redis.call('ZSCORE', holders, token) then
  if redis.call('DEL', bell .. token) == 1 then redis.call('HINCRBY', stats, 'acquired', 1) end
  redis.call('ZADD', holders, now + lease_ms, token)
  return 1
end
if redis.call('HEXISTS', deadlines, token) == 1 then return 2 end
if held < capacity then  -- after promote(), a free slot means nobody is waiting
  redis.call('ZADD', holders, now + lease_ms, token)
  redis.call('HINCRBY', stats, 'acquired', 1)
  raise_peak('peak_active', held + 1)
  return 1
end
local id = ARGV[2] or '-'  -- sent by every acquire; a bare token is the anonymous client
if queued >= queue_cap then
  local mine = redis.call('ZCARD', of_client .. id)
  if queued < 2 * mine + 2 or not displace(mine) then
    redis.call('HINCRBY', stats, 'rejected_full', 1)
    return 0
  end
end
local ticket = redis.call('INCR', seq)
redis.call('ZADD', queue, ticket, token)
redis.call('ZADD', alive, now + presence_ms, token)
redis.call('HSET', deadlines, token, now + wait_ms)
join(token, id, ticket)
raise_peak('peak_queued', queued + 1)
return 2
"""

# Release, ARGV[1] token. Replies 1 if the slot was still this grant's, else 0. First its
# common case: a slot still free besides (nobody waits) and no lease ended.
_RELEASE_FIRST = """
if held < capacity and redis.call('ZCOUNT', holders, '-inf', now) == 0 then
  return redis.call('ZREM', holders, ARGV[1])
end
"""

_RELEASE = """
local mine = redis.call('ZREM', holders, ARGV[1])
if mine == 1 then
  held = held - 1
  promote()
end
return mine
"""


def _hot_script(first: str, steps: str, active: int, queue: int, lease_ms: int,
                presence_ms: int, wait_ms: int, refusal_first: bool = False) -> str:
    """The text of a hot script for these settings: its common cases (``first``), then the
    general steps and its own (``steps``); ``refusal_first`` (acquire only) checks for the
    refusal before anything else."""
    settings = _BUILT_IN_SETTINGS
    for name, value in (("ACTIVE", active), ("QUEUE", queue), ("LEASE_MS", lease_ms),
                        ("PRESENCE_MS", presence_ms), ("WAIT_MS", wait_ms)):
        settings = settings.replace(f"@{name}@", str(int(value)))
    return (
        _KEYS + settings + _CLOCK + (_REFUSAL_FIRST if refusal_first else "") + _COUNT + first
        + "local bell = string.sub(holders, 1, -8) .. 'w:'\n" + _STEPS + steps
    )


# ARGV[5] token, ARGV[6] 0 stay / 1 give up (cancelled) / 2 abandon (error; not counted).
_POLL = _PRELUDE + """
local token = ARGV[5]
local leaving = tonumber(ARGV[6])
if redis.call('ZSCORE', holders, token) then
  redis.call('DEL', bell .. token)
  if leaving ~= 0 then  -- promoted at the instant we gave up: pass the slot on
    redis.call('ZREM', holders, token)
    held = held - 1
    if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
    promote()
    return {4, 0}
  end
  redis.call('ZADD', holders, now + lease_ms, token)
  redis.call('HINCRBY', stats, 'acquired', 1)
  return {1, 0}
end
if not redis.call('ZSCORE', queue, token) then  -- displaced, dropped or Redis emptied
  if redis.call('LPOP', bell .. token) == 'd' then  -- counted by its displacer
    redis.call('DEL', bell .. token)
    return {6, 0}
  end
  redis.call('DEL', bell .. token)
  if leaving == 0 then redis.call('HINCRBY', stats, 'rejected_timeout', 1) end
  if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
  return {5, 0}
end
if leaving ~= 0 then
  forget_waiter(token)
  redis.call('DEL', bell .. token)
  if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
  return {4, 0}
end
local remaining = tonumber(redis.call('HGET', deadlines, token)) - now
if remaining <= 0 then
  forget_waiter(token)
  redis.call('DEL', bell .. token)
  redis.call('HINCRBY', stats, 'rejected_timeout', 1)
  return {3, 0}
end
redis.call('ZADD', alive, now + presence_ms, token)
return {2, remaining}
"""

# ARGV[5..] tokens. Replies the tokens no longer held (their lease was lost).
_RENEW = _PRELUDE + """
local lost = {}
for i = 5, #ARGV do
  if redis.call('ZSCORE', holders, ARGV[i]) then
    redis.call('ZADD', holders, now + lease_ms, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

_STATS = _PRELUDE + """
return {held, queued, redis.call('HGETALL', stats)}
"""

_COUNTERS = (
    "displaced",
    "peak_active",
    "peak_queued",
    "acquired",
    "rejected_full",
    "rejected_timeout",
    "cancelled",
    "lease_lost",
)


@dataclass(frozen=True, slots=True)
class RedisLimiterStats(LimiterStats):
    """The figures of :class:`~reachlimit.LimiterStats`, for all processes together, plus
    ``backend`` (``"redis"``), ``degraded`` (False from Redis itself; True when
    :class:`ResilientLimiter` answers from its in-process fallback, Redis being unreachable)
    and ``lease_lost``: grants whose lease ran out before they were released."""

    backend: str = "redis"
    degraded: bool = False
    lease_lost: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RedisGrant(Grant):
    """One build slot of a :class:`RedisColdLimiter`, held as a renewed lease.

    Same use as :class:`~reachlimit.Grant`: leaving the ``with`` block releases it;
    ``release()`` releases it early; a second ``release()`` raises ``RuntimeError``. The
    slot it frees is only ever its own: after a lost lease the release changes nothing.
    """

    __slots__ = ("_owner", "token", "_lost")

    def __init__(self, owner: RedisColdLimiter, token: str) -> None:
        # Grant.__init__ is not called: there is no in-process ColdLimiter behind this grant.
        self._owner = owner
        self.token = token
        self._held = True  # guarded by owner._lock
        self._lost = False  # set (once) by the renewer or the release; racy read

    @property
    def lease_lost(self) -> bool:
        """Racy read: whether this grant is known to have lost its lease."""
        return self._lost

    def _give_back(self, strict: bool) -> None:
        self._owner._give_back(self, strict)


class RedisColdLimiter(LimiterFigures):
    """:class:`~reachlimit.ColdLimiter`'s contract, kept by every process that uses the same
    Redis and ``name``: at most ``active`` grants held in all of them together, at most
    ``queue`` waiters, each at most ``wait`` seconds (Redis's clock), promoted first-in
    first-out by a ticket from Redis, with a direct hand-off.

    ``client`` is a ``redis.Redis``. Make it with short timeouts, say
    ``redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)``: a waiter
    blocks in ``BLPOP`` for at most half the socket timeout, so that the read never times out
    first. Redis 6 or newer (``BLPOP`` with a fractional timeout).

    ``lease`` is how long a grant outlives its process: it is renewed in the background every
    ``lease / 3`` seconds while held. Every process must use the same ``active``, ``queue``,
    ``wait`` and ``lease`` for a name.

    Errors of Redis itself (``redis.exceptions.RedisError``: connection refused, timeout)
    propagate out of ``acquire``, ``release`` and ``stats`` of this class; wrap it in
    :class:`ResilientLimiter` (as the Flask extension does) to fall back to an in-process
    limiter instead. A waiter that meets one leaves the queue (or Redis drops it within a
    presence period); a grant whose release fails keeps its slot until its lease ends.

    Call :meth:`close` at the end to stop its two threads, the lease renewer and the waker
    that ends waiters' blocking reads on time (daemon threads either way).
    A preloaded master (gunicorn ``preload_app``) may make the limiter before it forks: both
    threads are started lazily, on first use (the renewer with the first grant, the waker
    with the first wait), never here, and a process forked since starts its own on its first
    use, as threads do not survive a fork (redis-py's pool opens new connections in the
    child). Just hold no grant across the fork: the child would inherit it and renew it too.

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

    def __init__(
        self,
        client: redis.Redis,
        name: str = "reachlimit",
        active: int = 2,
        queue: int = 8,
        wait: float = 3.0,
        retry_after: int = 2,
        *,
        lease: float = 10.0,
        prefix: str = "reachlimit",
    ) -> None:
        self._set_figures(active, queue, wait, retry_after)
        if (
            isinstance(lease, bool)
            or not isinstance(lease, (int, float))
            or not 0 < lease < math.inf
        ):
            raise ValueError("lease > 0")
        for label, value in (("name", name), ("prefix", prefix)):
            if not isinstance(value, str) or not value or "{" in value or "}" in value:
                raise ValueError(f"{label} must be a non-empty string without braces")
        self._client = client
        self._name = name
        self._lease = float(lease)
        tag = "{" + prefix + ":" + name + "}"
        self._keys = [f"{tag}:{suffix}" for suffix in _KEY_SUFFIXES]
        self._bell = f"{tag}:w:"
        self._common: list[str | int] = [
            self._bell,
            active,
            max(1, round(self._lease * 1000)),
            max(1, round(self.PRESENCE * 1000)),
        ]
        self._wait_ms = max(1, round(self._wait * 1000))
        lease_ms, presence_ms = int(self._common[2]), int(self._common[3])
        hot = (active, queue, lease_ms, presence_ms, self._wait_ms)
        self._acquire_script = client.register_script(
            _hot_script(_ACQUIRE_FIRST, _ACQUIRE, *hot)
        )
        # The same, checking for the refusal first: sent while the last acquire was refused.
        self._refusing_script = client.register_script(
            _hot_script(_ACQUIRE_FIRST, _ACQUIRE, *hot, refusal_first=True)
        )
        self._release_script = client.register_script(
            _hot_script(_RELEASE_FIRST, _RELEASE, *hot)
        )
        self._poll_script = client.register_script(_POLL)
        self._renew_script = client.register_script(_RENEW)
        self._stats_script = client.register_script(_STATS)
        # The hot paths and the poll send EVALSHA themselves, with everything but the token
        # encoded once here: redis-py's Script object builds and encodes the keys and the
        # arguments again on every call, and packing an argument costs more than it seems.
        keys = (str(len(self._keys)).encode(), *(key.encode() for key in self._keys))
        self._acquire_head = (self._acquire_script.sha.encode(), *keys)
        self._refusing_head = (self._refusing_script.sha.encode(), *keys)
        self._refusing = False  # racy: only picks which of the two acquire scripts is sent
        self._release_head = (self._release_script.sha.encode(), *keys)
        self._poll_head = (
            self._poll_script.sha.encode(),
            *keys,
            *(str(arg).encode() for arg in self._common),
        )
        self._execute: Callable[..., Any] = client.execute_command
        socket_timeout = _socket_timeout(client)
        # A blocking read must end before the socket's own timeout does.
        self._block_cap = socket_timeout / 2 if socket_timeout else math.inf
        self._lock = threading.Lock()
        self._renew_wake = threading.Condition(self._lock)  # notified on close, and on a
        # grant taken while the renewer is idle (it found nothing held: then it waits untimed)
        self._renewer_idle = False  # guarded by _lock
        self._held: dict[str, RedisGrant] = {}  # guarded by _lock: grants to renew
        self._closed = False  # guarded by _lock
        self._renewer: threading.Thread | None = None  # guarded by _lock
        #: Test hook: while set, the renewer skips its renewals (as if the process were paused).
        self._renewal_paused = threading.Event()
        self._waker = _Waker(client)

    # -- public ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def lease(self) -> float:
        return self._lease

    @property
    def keys(self) -> list[str]:
        """The fixed keys of this limiter (each waiter also has a doorbell key of the same
        hash tag while it is promoted)."""
        return list(self._keys)

    def acquire(self, cancel: CancelToken | None = None, client: Hashable = None) -> Grant:
        """Take a build slot, waiting in the shared queue if needed; return the grant.

        ``client`` names whoever asks, the same way in every process (str, bytes, int, or a
        tuple of those; None is one anonymous client): queue places are shared fairly among
        clients, as :class:`~reachlimit.ColdLimiter` shares them. Anything else is a
        ``TypeError``, raised before any call to Redis.

        Raises ``Cancelled`` if ``cancel`` is set before (then without a call to Redis) or
        while waiting, ``Busy("queue_full")`` at once when every queue place is taken (one
        round trip), ``Busy("displaced")`` when a leader of a client holding fewer places took
        this waiter's place, ``Busy("timeout")`` when the wait ends without a slot (or the
        waiter lost its place: Redis restarted empty, or it was dropped for not polling in
        time). Errors of Redis propagate as ``redis`` exceptions.
        """
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        if self._closed:  # racy read: close() is meant for the end of the process
            raise RuntimeError("limiter closed")
        who = _ANONYMOUS if client is None else client_id(client)
        token = owner_prefix() + secrets.token_hex(12)
        if self._refusing:
            status = self._evalsha(self._refusing_script, self._refusing_head, token, who)
        else:
            status = self._evalsha(self._acquire_script, self._acquire_head, token, who)
        self._refusing = status == _FULL
        if status == _GRANTED:
            return self._granted(token)
        if status == _FULL:
            raise Busy(Busy.QUEUE_FULL, self._retry_after)
        return self._wait_for_slot(token, self._wait_ms / 1000, cancel)

    def stats(self) -> RedisLimiterStats:
        """The figures of every process together (one round trip, which also reaps)."""
        held, queued, flat = self._stats_script(keys=self._keys, args=self._common)
        counters = dict.fromkeys(_COUNTERS, 0)
        for field, value in zip(flat[::2], flat[1::2], strict=True):
            key = field.decode() if isinstance(field, bytes) else str(field)
            if key in counters:
                try:
                    counters[key] = int(value)
                except ValueError:  # written by something else: read as 0, never an error
                    log.warning("reachlimit: counter %r of %s is not a number: %r",
                                key, self._keys[0], value)
        return RedisLimiterStats(
            active=int(held),
            queued=int(queued),
            # The fast path records a peak only above one: any grant made it at least one.
            peak_active=max(counters["peak_active"], min(1, counters["acquired"])),
            peak_queued=counters["peak_queued"],
            acquired=counters["acquired"],
            rejected_full=counters["rejected_full"],
            rejected_timeout=counters["rejected_timeout"],
            cancelled=counters["cancelled"],
            capacity_active=self._capacity,
            capacity_queue=self._queue_capacity,
            wait=self._wait,
            displaced=counters["displaced"],
            lease_lost=counters["lease_lost"],
        )

    def close(self, timeout: float = 5.0) -> None:
        """Stop the renewer and waker threads, for good: grants still held are no longer
        renewed (their release still works) and ``acquire`` raises ``RuntimeError`` from now
        on."""
        with self._lock:
            self._closed = True
            self._renew_wake.notify_all()
            renewer = self._renewer
        self._waker.close(timeout)
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout)

    def __repr__(self) -> str:
        return (
            f"<RedisColdLimiter {self._keys[0].rsplit(':', 1)[0]} active={self._capacity} "
            f"queue={self._queue_capacity} wait={self._wait} lease={self._lease}>"
        )

    # -- the scripts ----------------------------------------------------------------------

    def _evalsha(self, script: Script, head: tuple[bytes, ...], *args: str | bytes) -> Any:
        """One EVALSHA of ``script``: ``head`` is its SHA, the key count, the keys and the
        common arguments, encoded; ``args`` follow. A Redis that does not know the script
        (restarted, flushed) gets it loaded and the call made again, as ``Script`` does."""
        try:
            return self._execute("EVALSHA", *head, *args)
        except NoScriptError:
            self._client.script_load(script.script)
            return self._execute("EVALSHA", *head, *args)

    def _admit(self, token: str, who: str = "-") -> tuple[int, int]:
        """The acquire script for client id ``who``: (status, wait in ms)."""
        status = self._evalsha(self._acquire_script, self._acquire_head, token, who)
        return int(status), self._wait_ms

    def _free(self, token: str) -> int:
        """The release script: 1 if the slot was still ``token``'s (now freed), else 0."""
        return int(self._evalsha(self._release_script, self._release_head, token))

    def _poll(self, token: str, leaving: int) -> tuple[int, int]:
        """The poll script: (outcome, milliseconds left of the wait)."""
        reply = self._evalsha(self._poll_script, self._poll_head, token, str(leaving))
        return int(reply[0]), int(reply[1])

    # -- waiting --------------------------------------------------------------------------

    def _wait_for_slot(self, token: str, remaining: float, cancel: CancelToken | None) -> Grant:
        """Wait as a queued waiter until promoted, timed out, cancelled or dropped. Runs in
        the requesting thread. The local clock only schedules the next poll; whether the wait
        is over is decided by the poll script, on Redis's clock."""
        bell = self._bell + token
        slice_cap = self.CANCEL_POLL_INTERVAL if cancel is not None else self.POLL_EVERY
        slice_cap = min(slice_cap, self._block_cap)
        try:
            now = time.monotonic()
            next_poll = now + self.POLL_EVERY
            deadline = now + remaining
            while True:
                if cancel is not None and cancel.is_set():
                    # Cancelled, or already gone: either way; displaced is counted as such.
                    if self._poll(token, _GIVE_UP)[0] == _DISPLACED:
                        outcome = _DISPLACED
                        break
                    raise Cancelled()
                now = time.monotonic()
                block = max(0.001, min(slice_cap, next_poll - now, deadline - now + 0.001))
                self._waker.wake_at(time.monotonic() + block)
                rang = self._client.blpop([bell], timeout=block)
                if rang is not None and rang[1] in _DISPLACED_BELL:
                    outcome = _DISPLACED  # the displacer took us out of the queue
                    break
                now = time.monotonic()
                if rang is None and now < next_poll and now < deadline:
                    continue
                outcome, remaining_ms = self._poll(token, _STAY)
                if outcome != _WAITING:
                    break
                now = time.monotonic()
                next_poll = now + self.POLL_EVERY
                deadline = now + remaining_ms / 1000
        except Cancelled:
            raise
        except BaseException:
            # A Redis error, or an exception thrown into this thread: leave the queue (or pass
            # on a slot handed over meanwhile). If Redis cannot be reached, it drops us anyway
            # one presence period after our last poll.
            try:
                self._poll(token, _ABANDON)
            except redis.RedisError:
                pass
            raise
        if outcome == _GRANTED:
            return self._granted(token)
        if outcome == _DISPLACED:
            raise Busy(Busy.DISPLACED, self._retry_after)
        raise Busy(Busy.TIMEOUT, self._retry_after)  # _TIMEOUT, or _GONE: the place was lost

    # -- grants and their leases ------------------------------------------------------------

    def _granted(self, token: str) -> RedisGrant:
        grant = RedisGrant(self, token)
        with self._lock:
            if self._renewer_idle:  # waiting untimed: it has a lease to renew now
                self._renewer_idle = False
                self._renew_wake.notify()
            self._held[token] = grant
            if self._renewer is None or not self._renewer.is_alive():
                # None yet, or the process forked since: threads do not survive a fork.
                self._renewer = threading.Thread(
                    target=self._renew_forever, name="reachlimit-lease-renewer", daemon=True
                )
                self._renewer.start()
        return grant

    def _give_back(self, grant: RedisGrant, strict: bool) -> None:
        """Release ``grant``: exactly once, and in Redis only if the slot is still its own."""
        with self._lock:
            if not grant._held:
                if strict:
                    raise RuntimeError("grant released twice")
                return
            grant._held = False
            del self._held[grant.token]
        if not self._free(grant.token):
            grant._lost = True

    def _renew_forever(self) -> None:
        """The renewer thread: every ``lease / 3`` seconds, renew every grant held here in one
        round trip; grants Redis no longer knows are marked lost (and never revived)."""
        interval = self._lease / 3
        while True:
            with self._lock:
                if not self._closed and not self._held:
                    # Idle until a grant is taken (it clears the flag) or close. Woken, we
                    # wait a whole interval before we may go idle again: a limiter whose
                    # grants come and go wakes this thread at most once an interval, not on
                    # every acquire.
                    self._renewer_idle = True
                    while not self._closed and self._renewer_idle:
                        self._renew_wake.wait()
                    self._renewer_idle = False
                if self._closed:
                    return
                self._renew_wake.wait(interval)
                if self._closed:
                    return
                grants = dict(self._held)
            if not grants or self._renewal_paused.is_set():
                continue
            try:
                lost = self._renew_script(keys=self._keys, args=[*self._common, *grants])
            except redis.RedisError as exc:
                log.warning("reachlimit: could not renew %d lease(s): %s", len(grants), exc)
                continue
            with self._lock:
                for token in lost:
                    key = token.decode() if isinstance(token, bytes) else token
                    # Released meanwhile: not lost, its release removed it.
                    if key in self._held:
                        grants[key]._lost = True


class _Waker:
    """Ends a waiter's timed-out ``BLPOP`` on time: sends Redis a ``PING`` when it is due.

    Redis notices a blocking command that timed out only when its event loop runs: at once
    on a busy server, but on a server with no other traffic at its next cron tick (every
    100 ms at the default ``hz 10``), so a 50 ms slice could last 100 ms. Any command makes
    the loop run, so a ``PING`` on another connection just after the slice's end makes the
    ``BLPOP`` end then. One daemon thread per limiter object, started with the first wait;
    a ``PING`` that comes when the ``BLPOP`` has already ended is harmless. A failing
    ``PING`` is ignored: the waiter then ends on Redis's tick, as it would without this.
    """

    #: After a slice's end: the first nudge, and a second in case the first came too early
    #: for Redis's clock (the BLPOP's timeout starts when Redis reads it).
    NUDGES = (0.001, 0.005)

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cond = threading.Condition(threading.Lock())
        self._due: list[float] = []  # guarded by _cond: a heap of monotonic times
        self._closed = False  # guarded by _cond
        self._thread: threading.Thread | None = None  # guarded by _cond

    def wake_at(self, end: float) -> None:
        """A ``BLPOP`` sent now times out at ``end`` (monotonic): nudge Redis just after."""
        with self._cond:
            if self._closed:
                return
            earliest = self._due[0] if self._due else math.inf
            for nudge in self.NUDGES:
                heapq.heappush(self._due, end + nudge)
            if self._thread is None or not self._thread.is_alive():
                # None yet, or the process forked since: threads do not survive a fork.
                self._thread = threading.Thread(
                    target=self._run, name="reachlimit-blpop-waker", daemon=True
                )
                self._thread.start()
            elif self._due[0] < earliest:
                self._cond.notify()

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._due:
                    self._cond.wait()
                if self._closed:
                    return
                wait = self._due[0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                now = time.monotonic()
                while self._due and self._due[0] <= now:
                    heapq.heappop(self._due)
            try:
                self._client.ping()
            except redis.RedisError:
                pass


#: The id of the anonymous client (``client=None``): not a hash, so never one of theirs.
_ANONYMOUS = "-"


def client_id(client: Hashable) -> str:
    """The id under which Redis knows ``client`` (str, bytes, int or a tuple of those): the
    same in every process and on every host, short and of bounded size whatever the name
    (16 hex digits of a BLAKE2b hash of an unambiguous encoding). ``TypeError`` otherwise."""
    return hashlib.blake2b(_encode_client(client), digest_size=8).hexdigest()


def _encode_client(client: object) -> bytes:
    if isinstance(client, str):
        data = client.encode("utf-8", "surrogatepass")
        return b"s%d:" % len(data) + data
    if isinstance(client, bytes):
        return b"b%d:" % len(client) + client
    if isinstance(client, int) and not isinstance(client, bool):
        return b"i%d;" % client
    if isinstance(client, tuple):
        return b"t%d:" % len(client) + b"".join(_encode_client(item) for item in client)
    raise TypeError(
        f"client must be str, bytes, int or a tuple of those, got {type(client).__name__}"
    )


def _socket_timeout(client: Any) -> float | None:
    """The socket timeout the client's connections read with, if it can be found."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    value = kwargs.get("socket_timeout")
    return float(value) if value else None


# -- owners: freeing the places of a process that died ----------------------------------------
#
# Every token starts with its owner, "<hostname>:<pid>:", so that the parent of a process that
# died (the gunicorn master) can free its slots and queue places at once instead of waiting
# for their leases and presence periods to end.

import os  # noqa: E402
import socket  # noqa: E402

_HOSTNAME = socket.gethostname()


def owner_prefix(pid: int | None = None) -> str:
    """The prefix of every token made by process ``pid`` (this one when None) on this host."""
    return f"{_HOSTNAME}:{os.getpid() if pid is None else pid}:"


# ARGV[5] the owner prefix. Replies {slots freed, queue places removed}.
_RELEASE_OWNER = _PRELUDE + """
local owner = ARGV[5]
local n = #owner
local freed, dropped = 0, 0
for _, token in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
  if string.sub(token, 1, n) == owner then
    redis.call('ZREM', holders, token)
    redis.call('DEL', bell .. token)
    freed = freed + 1
  end
end
for _, token in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  if string.sub(token, 1, n) == owner then
    forget_waiter(token)
    redis.call('DEL', bell .. token)
    dropped = dropped + 1
  end
end
fill()
return {freed, dropped}
"""


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
    script = client.register_script(_RELEASE_OWNER)
    freed, dropped = script(keys=limiter._keys, args=[*limiter._common, owner])
    return int(freed), int(dropped)


# The resilient layer (fallbacks when Redis fails), re-exported here: only modules named
# after redis import redis-py.
from ._redis_resilient import (  # noqa: E402
    FALLBACKS,
    RedisHealth,
    ResilientCache,
    ResilientFlight,
    ResilientLimiter,
    connect,
)
from ._urls import mask_url  # noqa: E402

__all__ += [
    "FALLBACKS",
    "RedisHealth",
    "ResilientCache",
    "ResilientFlight",
    "ResilientLimiter",
    "connect",
    "mask_url",
    "client_id",
    "owner_prefix",
    "release_owner",
]
