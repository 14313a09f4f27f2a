-- A cold limiter shared through Redis (RedisColdLimiter, reachlimit/redis/_limiter.py): every
-- operation on a budget's state, the first argument naming which, and the cold lead
-- (reachlimit/redis/_lead.py). README.md, beside this file, says what each key holds and
-- the rules every operation keeps; each operation's section below says what it answers.
--
-- KEYS, every operation: 1 T:holders, where T = {<prefix>:<name>} (one hash tag: one Cluster
-- slot) is the text of KEYS[1] before "holders". Every other key of the budget is built here
-- from T (same hash tag, same slot; README.md says what each holds):
--   T:queue   T:alive   T:deadline   T:stats   T:seq   T:clientof   T:clients   T:settings
--   T:gone    T:since   T:took
--   T:members          the budget's live processes (members.lua): whose shares a recovery
--                      reserves (hold_fallback_builds)
--   T:c:<client id>    one client's waiters         T:w:<token>   a waiter's doorbell
-- (One KEYS entry, not twelve: Redis handles every KEYS entry of every call, and the hot
-- operations touch four or five of the keys; README.md's Cost has the figure.)
-- and the cold lead's (three hash tags: a single Redis only, never a Cluster)
--    2 the cache entry of the key    3 the key's flight claim, F:lead    4 its counter, F:n
--
-- Reservations. A process back from an outage (hold_fallback_builds with a recovery) that
-- finds no other recovery under way reserves, for `reserve ms`, the share ceil(active / N)
-- of every other live member of the budget (T:members; N-1 members in all, those Redis no
-- longer lists - it restarted empty - anonymously): holders "#<member id>#<i>" ("#?#<i>"),
-- since those processes may still admit their share on their in-process fallbacks until
-- they learn that Redis is back; so Redis admits nobody beside those shares meanwhile. Each member's own
-- recovery (or its announce while it uses Redis: members.lua) drops its reservation, and one
-- that finds none drops an anonymous share; the rest simply end. A reservation is no build:
-- it is never counted as acquired, its end is no lost lease, and `stats` does not count it
-- among the slots held.
--
-- ARGV, every operation
--    1 the operation (below)
--    2 "<presence> <lease> <active> <queue> <wait> <deadline>": this process's own figures
--      in one argument (times in ms, deadline 1 on, 0 off): its presence period and lease
--      (Settings, below, says how the lease counts), and its other settings, used only for
--      what the budget's settings hash lacks (Settings)
-- and each operation's own, from ARGV[3]
--   acquire                          3 token, 4 client id (none: '-', the anonymous client)
--   lead                             3 token, 4 client id, 5 the flight's token (whose
--                                    claim it is), 6 the claim's lease (ms), 7 how long the
--                                    flight counter outlives its last write (ms)
--   release                          3 token, 4 "t" for a timed grant (none: not timed)
--   poll                             3 token, 4 0 stay / 1 give up (cancelled) / 2 abandon
--   renew                            3.. tokens
--   hold_fallback_builds             3 "-", or a recovery: "<member id> <N> <reserve ms>"
--                                    (Reservations, below), 4.. tokens
--   give_up                          3 how long a token is remembered (ms), 4.. tokens
--   record                           3 who writes (the process's owner id)
--   release_owner                    3 the owner's prefix, "<host>:<boot id>:<pid>:"
--   stats                            none
--
-- Run on its own (README.md has an example): redis-cli --eval limiter.lua T:holders , <args>

local op = ARGV[1]
local holders = KEYS[1]
local tag = string.sub(holders, 1, -8)  -- "T:" of "T:holders"
-- The keys every operation touches; the others are built where first needed (the hot cases
-- below build the one or two they touch, the general steps the rest).
local settings, stats = tag .. 'settings', tag .. 'stats'
local leading = op == 'lead'
local acquiring = leading or op == 'acquire'
local token = ARGV[3]

-- The cold lead: a cold request's one round trip once its process's own cache missed. First
-- the shared cache: an entry (fresh or stale: its PTTL says) is answered {3, entry, PTTL},
-- then a claimed flight {1} (the caller joins it: flight.lua); neither, the acquire below, and
-- its answer claims the flight for a leader that builds or waits (lead_answer).
if leading then
  local entry = redis.call('GET', KEYS[2])
  if entry then return {3, entry, redis.call('PTTL', KEYS[2])} end
  if redis.call('EXISTS', KEYS[3]) == 1 then return {1} end
end

-- Settings are data: the budget's settings hash, which every process writes when it starts
-- using the budget (record), the newest start winning; every operation reads it here, so the
-- text is the same for every budget. A setting the hash lacks (Redis restarted empty, the key
-- evicted, a field that is not a number) is this process's own (ARGV[2]), written back, so
-- an operation never fails for want of its settings and the first process to notice
-- re-creates the hash; but by release_owner, run by a parent that is no process of the
-- budget: it uses its figures and does not record them. A process's start (record) empties
-- the hash first, so that every setting is then written, as any missing one is.
local before  -- record: what was recorded before this start (its reply)
if op == 'record' then
  before = redis.call('HMGET', settings, 'by', 'active', 'queue', 'wait_ms', 'lease_ms',
                      'deadline')
  redis.call('DEL', settings)
  redis.call('HSET', settings, 'by', ARGV[3])
end
local recorded = redis.call('HMGET', settings, 'active', 'queue', 'wait_ms', 'lease_ms',
                            'deadline')
local capacity, queue_cap = tonumber(recorded[1]), tonumber(recorded[2])
local wait_ms, lease_ms = tonumber(recorded[3]), tonumber(recorded[4])
local deadline_on = tonumber(recorded[5])  -- no wasted waits (refuse_late, below): 1 on
-- The hot operations take the shortcuts of the rule (below), but just after a setting was
-- missing: the rule may not hold against a setting just changed.
local lean = acquiring or op == 'release'
if not (capacity and queue_cap and wait_ms and lease_ms and deadline_on) then
  local names = {'active', 'queue', 'wait_ms', 'lease_ms', 'deadline'}
  local mine_lease, mine_active, mine_queue, mine_wait, mine_deadline =
      string.match(ARGV[2], '^%d+ (%d+) (%d+) (%d+) (%d+) (%d+)$')
  local own = {mine_active, mine_queue, mine_wait, mine_lease, mine_deadline}
  for i = 1, 5 do
    if tonumber(recorded[i]) then
      recorded[i] = tonumber(recorded[i])
    else
      recorded[i] = tonumber(own[i])
      if op ~= 'release_owner' then redis.call('HSET', settings, names[i], own[i]) end
    end
  end
  capacity, queue_cap, wait_ms, lease_ms = recorded[1], recorded[2], recorded[3], recorded[4]
  deadline_on = recorded[5]
  lean = false
end
deadline_on = deadline_on == 1

-- Redis's clock, in ms: every deadline and lease is decided by it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The cold lead's answer to its acquire's (status, and `left`: a queued leader's wait in ms,
-- a late refusal's Retry-After in s, else 0):
--   {0, flight, status, left}  1 granted or 2 queued: the flight is claimed, as flight.lua
--                              claims one ("<flight>:<token>" with its lease, the flight's
--                              number from the counter), so that same-key requests follow it
--   {4, 0, status, left}       refused (0 queue full, 3 token given up, 7 late): nothing is
--                              claimed, so nobody follows it and nothing is published for it
-- Built for the lead only (Lua builds a function when its definition runs).
local lead_answer
if leading then
  lead_answer = function(status, left)
    if status == 1 or status == 2 then
      local n = redis.call('INCR', KEYS[4])
      redis.call('SET', KEYS[3], n .. ':' .. ARGV[5], 'PX', ARGV[6])
      redis.call('PEXPIRE', KEYS[4], ARGV[7])
      return {0, n, status, left}
    end
    return {4, 0, status, left}
  end
end

-- The hot operations' common cases, answered before the general steps (whose functions Lua
-- would otherwise build on every call). The rule that makes them cheap: every operation ends
-- with nobody waiting while a slot is free (it fills), and only operations change `holders`
-- (and the settings: record fills after writing them); so at the start of one, fewer holders
-- than `capacity` (those whose lease ended included) means an empty queue. Each case is one
-- where the general steps would find nothing to reap and nobody to promote, and it makes the
-- calls they would have made, and no more.
local held  -- the slots held (their leases ended or not), once counted
if acquiring then
  -- Acquire: a free slot -> hold it (1); the queue full -> refused (0), counting
  -- `rejected_full` and writing nothing else; a token given up -> 3 (never granted or
  -- queued, also when this call reaches Redis after the give-up: give_up, below).
  local admitted
  local full = false  -- every slot held, no lease ended: nothing to reap, nobody to promote
  if lean then
    held = redis.call('ZCARD', holders)
    if held == 0 or redis.call('ZCOUNT', holders, '-inf', now) == 0 then
      if held >= capacity then
        full = true
      elseif redis.call('ZSCORE', tag .. 'gone', token) then
        admitted = 3
      else
        local own_lease = tonumber(string.match(ARGV[2], '^%d+ (%d+)'))  -- as below
        redis.call('ZADD', holders, now + math.max(lease_ms, own_lease), token)
        redis.call('HINCRBY', stats, 'acquired', 1)
        -- A peak of one needs no write: any grant implies it (stats reads it so).
        if held > 0 and held + 1 > (tonumber(redis.call('HGET', stats, 'peak_active')) or 0) then
          redis.call('HSET', stats, 'peak_active', held + 1)
        end
        admitted = 1
      end
    end
  end
  -- The queue full of live waiters, and this client too small a part of it to displace
  -- anybody (displace(), below: twice its places and two more would have to be fewer).
  if full and redis.call('ZCOUNT', tag .. 'alive', '(' .. now, '+inf') >= queue_cap
      and queue_cap < 2 * redis.call('ZCARD', tag .. 'c:' .. (ARGV[4] or '-')) + 2 then
    redis.call('HINCRBY', stats, 'rejected_full', 1)
    admitted = 0
  end
  if admitted then
    if leading then return lead_answer(admitted, 0) end
    return admitted
  end
elseif op == 'release' and lean and not ARGV[4] then
  -- Release of a grant that is not timed, a slot still free besides (nobody waits) and no
  -- lease ended: 1 if the slot was still this grant's (now freed), else 0.
  held = redis.call('ZCARD', holders)
  if held < capacity and redis.call('ZCOUNT', holders, '-inf', now) == 0 then
    return redis.call('ZREM', holders, token)
  end
end

-- The general steps. They keep `held` and `queued` up to date (promote()), so that each is
-- counted once; fill() counts afresh first, for an operation that changed `holders` or
-- `queue` itself. The hot operations (`lean`) rely on the rule above and do not look at the
-- queue while a slot is free; the others count it every time, so a waiter's regular poll
-- repairs a state that broke the rule (a key evicted, say). When every slot is held (in a
-- lean operation), the waiters are counted by their live presences: a queue full of live
-- waiters is one read, and nothing in it is due for reaping (there are never more than
-- `queue_cap` waiters, unless the queue was just made shorter: then the extra ones are reaped
-- once the queue is no longer full of live waiters).
--
-- The fair queue: each waiter's client in `clientof`, each client's waiters (by ticket) in
-- T:c:<id>, the waiting clients in turn order in `clients`.
local queue, alive, deadlines = tag .. 'queue', tag .. 'alive', tag .. 'deadline'
local seq, clientof, clients = tag .. 'seq', tag .. 'clientof', tag .. 'clients'
local gone, since, durations = tag .. 'gone', tag .. 'since', tag .. 'took'
local of_client = tag .. 'c:'  -- .. client id
local bell = tag .. 'w:'  -- .. token: a waiter's doorbell
held = held or redis.call('ZCARD', holders)
local queued = 0  -- never more than queue_cap, but just after the budget was given fewer
-- This process's presence period and lease, ARGV[2]'s first two figures (read only here
-- and in a fast grant). A grant's lease is the budget's, or its holder's own when that is
-- longer: a process renews its grants every third of its own lease, so they must outlast it.
local presence_ms, own_lease = string.match(ARGV[2], '^(%d+) (%d+)')
presence_ms, lease_ms = tonumber(presence_ms), math.max(lease_ms, tonumber(own_lease))

local function recount()
  held = redis.call('ZCARD', holders)
  queued = redis.call('ZCARD', queue)
end

local function raise_peak(field, value)
  if value > (tonumber(redis.call('HGET', stats, field)) or 0) then
    redis.call('HSET', stats, field, value)
  end
end

local function forget_waiter(waiter)
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', alive, waiter)
  redis.call('HDEL', deadlines, waiter)
  local id = redis.call('HGET', clientof, waiter)
  if id then
    redis.call('HDEL', clientof, waiter)
    redis.call('ZREM', of_client .. id, waiter)
    if redis.call('ZCARD', of_client .. id) == 0 then redis.call('ZREM', clients, id) end
  end
end

-- Reap: holders whose lease ended leave (counted `lease_lost`), and so do waiters whose
-- presence ended (they stopped polling: their process died).
local function reap()
  local nobody_waits = lean and held < capacity  -- the rule above
  -- Counted first, removed only if there is something to remove: a refusal writes nothing.
  if held > 0 then
    local ended = redis.call('ZCOUNT', holders, '-inf', now)
    if ended > 0 then
      local lost = 0  -- a reservation that ends (Reservations, above) is no lost lease
      for _, holder in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now)) do
        if string.sub(holder, 1, 1) ~= '#' then
          lost = lost + 1
          redis.call('HDEL', since, holder)
        end
      end
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
      if lost > 0 then redis.call('HINCRBY', stats, 'lease_lost', lost) end
      held = held - ended
    end
  end
  if nobody_waits then
    queued = 0
    return
  end
  if lean and held >= capacity then
    local live = redis.call('ZCOUNT', alive, '(' .. now, '+inf')
    if live >= queue_cap then
      queued = live
      return
    end
  end
  queued = redis.call('ZCARD', queue)
  if queued > 0 then
    local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
    for _, waiter in ipairs(dead) do
      forget_waiter(waiter)
      redis.call('DEL', bell .. waiter)
    end
    if #dead > 0 then queued = redis.call('ZCARD', queue) end
  end
end

-- Queue `waiter` of client `id` with `ticket`: a client new to the queue waits last.
local function join(waiter, id, ticket)
  redis.call('ZADD', of_client .. id, ticket, waiter)
  redis.call('HSET', clientof, waiter, id)
  if not redis.call('ZSCORE', clients, id) then
    redis.call('ZADD', clients, redis.call('INCR', seq), id)
  end
end

-- Take the waiter to promote out of the queue and return it (nil if none): the oldest of
-- the first client in turn, which goes to the back of the turn if it still waits. With one
-- client waiting, the oldest ticket. A client entry or a waiter of a client that is no
-- longer in the queue (a key evicted under an allkeys-* policy) is dropped on the way.
local function next_in_turn()
  while redis.call('ZCARD', clients) > 1 do
    local id = redis.call('ZRANGE', clients, 0, 0)[1]
    local first = redis.call('ZRANGE', of_client .. id, 0, 0)[1]
    if not first then
      redis.call('ZREM', clients, id)
    elseif not redis.call('ZSCORE', queue, first) then
      redis.call('ZREM', of_client .. id, first)
      redis.call('HDEL', clientof, first)
    else
      forget_waiter(first)
      if redis.call('ZSCORE', clients, id) then
        redis.call('ZADD', clients, redis.call('INCR', seq), id)
      end
      return first
    end
  end
  local first = redis.call('ZRANGE', queue, 0, 0)[1]
  if first then forget_waiter(first) end
  return first
end

-- A newcomer whose client holds `mine` places found the queue full: displace the newest
-- waiter of the client holding most places if that is `mine + 2` or more (ties: whose
-- newest waiter has the higher ticket). The victim's doorbell gets "d"; counted here, so a
-- victim whose process died loses nothing.
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
  if not victim or most < mine + 2 or not redis.call('ZSCORE', queue, victim) then
    return false
  end
  forget_waiter(victim)
  redis.call('RPUSH', bell .. victim, 'd')
  redis.call('PEXPIRE', bell .. victim, 2 * presence_ms)
  redis.call('HINCRBY', stats, 'displaced', 1)
  queued = queued - 1
  return true
end

-- Fill: as many waiters as there are free slots are promoted, each the next in turn: moved
-- into `holders` with a short claim lease (one presence period) and its doorbell pushed; its
-- next poll turns the claim into a full lease.
local function promote()
  if held >= capacity or queued == 0 then return end
  local promoted = 0
  while held < capacity and queued > 0 do
    local waiter = next_in_turn()  -- out of the queue already
    if not waiter then break end
    redis.call('ZADD', holders, now + presence_ms, waiter)
    -- A promoted grant is timed from here (no wasted waits: took(), below), when the
    -- budget's deadline is on; off, nothing is timed and nothing is refused for it.
    if deadline_on then redis.call('HSET', since, waiter, now) end
    redis.call('RPUSH', bell .. waiter, 1)
    redis.call('PEXPIRE', bell .. waiter, 2 * presence_ms)
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

-- No wasted waits, on Redis's clock: the rule of reachlimit._limiter's design note, for every
-- process of the budget. A timed grant (one a waiter was promoted to: its promotion time is
-- in `since`) has just been released: took() records how long it held its slot in
-- `durations` (the latest 16, newest first), and the budget's estimate of build time from
-- them in the stats hash (`estimate_ms`): the ((n - 1) // 4)-th smallest of n, none before 4
-- (reachlimit._limiter's ESTIMATE_AFTER and ESTIMATE_SAMPLES; its design note says why a low
-- percentile). Whatever the build returned or raised: its slot was held all the same.
local function took(grant)
  local started = tonumber(redis.call('HGET', since, grant))
  if not started then return end
  redis.call('HDEL', since, grant)
  redis.call('LPUSH', durations, math.max(0, now - started))
  redis.call('LTRIM', durations, 0, 15)
  local times = redis.call('LRANGE', durations, 0, -1)
  if #times >= 4 then
    for i = 1, #times do times[i] = tonumber(times[i]) end
    table.sort(times)
    redis.call('HSET', stats, 'estimate_ms', times[math.floor((#times - 1) / 4) + 1])
  end
end

-- With an estimate E (ms), the queue is walked in the order it will be promoted (round-robin
-- over `clients` in turn order, each client's waiters by ticket; a refused waiter passes its
-- turn to the next of its client and counts for nobody), the p-th waiter kept starting at
--
--     now + free[p % capacity] + floor(p / capacity) * E
--
-- `free` being how long each slot still needs, soonest first: E less what a timed holder (a
-- promotion, in `since`) has run, never below 0, and 0 for one whose start is not known (a
-- fast-path grant: counted as ending now). A waiter whose start is later than its deadline
-- (exactly at it is in time; one past it already is its own timeout) is refused: it leaves the
-- queue, its doorbell gets "l<s>" (s: its Retry-After, ceil((start - deadline) / 1000)) and
-- `deadline` is counted here, so a refused waiter whose process died loses nothing. Run by
-- the acquire that has just queued a newcomer (which, refused, gets no doorbell: its reply
-- says so) and by each timed release (the estimate may have grown, the line has moved).
local function slots_free(estimate)
  local free = {}
  for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    local started = tonumber(redis.call('HGET', since, holder))
    free[#free + 1] = started and estimate - math.min(estimate, math.max(0, now - started))
        or 0
  end
  while #free < capacity do free[#free + 1] = 0 end
  table.sort(free)
  return free
end

-- Refuse every late waiter; returns the Retry-After (s) of `newcomer` if it was one of them.
local function refuse_late(estimate, newcomer)
  local free = slots_free(estimate)
  local ids = redis.call('ZRANGE', clients, 0, -1)
  local lists, next_of, turn = {}, {}, {}
  for i, id in ipairs(ids) do
    lists[i] = redis.call('ZRANGE', of_client .. id, 0, -1)
    next_of[i], turn[i] = 1, i
  end
  local kept, late = 0, {}
  while #turn > 0 do
    local next_round = {}
    for _, i in ipairs(turn) do
      local list = lists[i]
      while next_of[i] <= #list do
        local waiter = list[next_of[i]]
        next_of[i] = next_of[i] + 1
        local start = now + free[(kept % capacity) + 1] + math.floor(kept / capacity) * estimate
        local deadline = tonumber(redis.call('HGET', deadlines, waiter))
        if deadline and now < deadline and deadline < start then
          late[#late + 1] = {waiter, math.ceil((start - deadline) / 1000)}
        else
          kept = kept + 1
          next_round[#next_round + 1] = i
          break
        end
      end
    end
    turn = next_round
  end
  local mine = nil
  for _, refused in ipairs(late) do
    local waiter, retry = refused[1], refused[2]
    forget_waiter(waiter)
    redis.call('HINCRBY', stats, 'deadline', 1)
    queued = queued - 1
    if waiter == newcomer then
      mine = retry
    else
      redis.call('RPUSH', bell .. waiter, 'l' .. retry)
      redis.call('PEXPIRE', bell .. waiter, 2 * presence_ms)
    end
  end
  return mine
end

-- Every operation that gets here reaps and fills first, so no state depends on a process
-- staying alive.
reap()
promote()

if acquiring then
  -- Acquire's general path. Replies 1 granted, 0 refused (queue full), 3 token given up,
  -- {2, ms}: queued, with the milliseconds its wait lasts (the budget's wait: the waiter's
  -- deadline is Redis's, and so is its length), or {7, s}: refused because its place cannot
  -- start within its wait (refuse_late), with its Retry-After in seconds. The lead: as
  -- lead_answer says.
  local function answer(status, left)
    if leading then return lead_answer(status, left or 0) end
    if left then return {status, left} end
    return status
  end
  if redis.call('ZSCORE', gone, token) then return answer(3) end
  -- A token Redis knows already: the client is retrying this call after losing its reply.
  -- Answer what the first run decided (a slot handed over meanwhile is claimed here), so that
  -- the token never both holds and waits and nothing is counted twice. Only here, on the
  -- general path: the common cases above cannot meet a known token, but for the one written
  -- down in _limiter.py's design note (a retry that finds every place taken).
  if redis.call('ZSCORE', holders, token) then
    if redis.call('DEL', bell .. token) == 1 then redis.call('HINCRBY', stats, 'acquired', 1) end
    redis.call('ZADD', holders, now + lease_ms, token)
    return answer(1)
  end
  local deadline = tonumber(redis.call('HGET', deadlines, token))
  if deadline then return answer(2, math.max(deadline - now, 0)) end
  if held < capacity then  -- after promote(), a free slot means nobody is waiting
    redis.call('ZADD', holders, now + lease_ms, token)
    redis.call('HINCRBY', stats, 'acquired', 1)
    raise_peak('peak_active', held + 1)
    return answer(1)
  end
  local id = ARGV[4] or '-'  -- a bare token (none sent) is the anonymous client
  if queued >= queue_cap then
    local mine = redis.call('ZCARD', of_client .. id)
    if queued < 2 * mine + 2 or not displace(mine) then
      redis.call('HINCRBY', stats, 'rejected_full', 1)
      return answer(0)
    end
  end
  local ticket = redis.call('INCR', seq)
  redis.call('ZADD', queue, ticket, token)
  redis.call('ZADD', alive, now + presence_ms, token)
  redis.call('HSET', deadlines, token, now + wait_ms)
  join(token, id, ticket)
  -- No wasted waits: with an estimate, a newcomer whose place cannot start within its wait is
  -- refused now, {7, its Retry-After in s} (and the waiters it put behind theirs with it).
  local estimate = deadline_on and tonumber(redis.call('HGET', stats, 'estimate_ms'))
  if estimate then
    local retry = refuse_late(estimate, token)
    if retry then return answer(7, retry) end
    raise_peak('peak_queued', redis.call('ZCARD', queue))
    return answer(2, wait_ms)
  end
  raise_peak('peak_queued', queued + 1)
  return answer(2, wait_ms)
end

if op == 'release' then
  -- Release's general path: remove the grant's token from `holders` (only its own: a token
  -- reaped for a lost lease is gone, so a late release frees nothing) and fill. Replies 1 if
  -- the slot was still this grant's, else 0. A timed release records its time (the estimate
  -- may grow) and, with the budget's deadline on, refuses the waiters who are now late.
  local mine = redis.call('ZREM', holders, token)
  if mine == 1 then
    if ARGV[4] then took(token) end
    held = held - 1
    promote()
    if ARGV[4] and deadline_on and queued > 0 then
      local estimate = tonumber(redis.call('HGET', stats, 'estimate_ms'))
      if estimate then refuse_late(estimate) end
    end
  end
  return mine
end

if op == 'poll' then
  -- A waiter's poll, run after its doorbell rang, every POLL_EVERY seconds and when its
  -- cancel token is set: promoted -> keep the slot (or, when giving up, pass it on); its
  -- deadline passed -> leave (timeout); giving up -> leave (cancelled); else refresh its
  -- presence. All in one script, so a promotion racing a timeout or a cancel ends in exactly
  -- one outcome. Replies {outcome, ms left}: 1 granted, 2 still waiting, 3 timed out, 4 gave
  -- up, 5 its place gone (dropped, or Redis emptied), 6 displaced, {7, s} refused late.
  local leaving = tonumber(ARGV[4])
  if redis.call('ZSCORE', holders, token) then
    redis.call('DEL', bell .. token)
    if leaving ~= 0 then  -- promoted at the instant we gave up: pass the slot on
      redis.call('ZREM', holders, token)
      redis.call('HDEL', since, token)
      held = held - 1
      if leaving == 1 then redis.call('HINCRBY', stats, 'cancelled', 1) end
      promote()
      return {4, 0}
    end
    redis.call('ZADD', holders, now + lease_ms, token)
    redis.call('HINCRBY', stats, 'acquired', 1)
    return {1, 0}
  end
  if not redis.call('ZSCORE', queue, token) then  -- displaced, late, dropped or Redis emptied
    local rung = redis.call('LPOP', bell .. token)
    if rung == 'd' then  -- counted by its displacer
      redis.call('DEL', bell .. token)
      return {6, 0}
    end
    if rung and string.sub(rung, 1, 1) == 'l' then  -- refused late: counted by its refuser
      redis.call('DEL', bell .. token)
      return {7, tonumber(string.sub(rung, 2)) or 1}
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
  -- A deadline that is gone (evicted under an allkeys-* policy) ends the wait now: a timeout,
  -- never a script error (which would be taken for Redis failing).
  local remaining = (tonumber(redis.call('HGET', deadlines, token)) or now) - now
  if remaining <= 0 then
    forget_waiter(token)
    redis.call('DEL', bell .. token)
    redis.call('HINCRBY', stats, 'rejected_timeout', 1)
    return {3, 0}
  end
  redis.call('ZADD', alive, now + presence_ms, token)
  return {2, remaining}
end

if op == 'renew' then
  -- Push the lease end of the tokens still held; a reaped token is not revived. Replies the
  -- tokens no longer held.
  local lost = {}
  for i = 3, #ARGV do
    if redis.call('ZSCORE', holders, ARGV[i]) then
      redis.call('ZADD', holders, now + lease_ms, ARGV[i])
    else
      lost[#lost + 1] = ARGV[i]
    end
  end
  return lost
end

if op == 'stats' then
  -- The figures, after the reap and fill, with the budget's settings as Redis holds them.
  -- Replies {held, queued, HGETALL stats, {active, queue, wait (ms)}}, `held` without the
  -- reservations (Reservations, above): they are no builds.
  if held > 0 then
    for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
      if string.sub(holder, 1, 1) == '#' then held = held - 1 end
    end
  end
  return {held, queued, redis.call('HGETALL', stats), {capacity, queue_cap, wait_ms}}
end

if op == 'give_up' then
  -- Give up the tokens of calls whose replies were lost (a socket timeout after the script
  -- ran): each slot one of them holds is freed and each queue place left, and each is
  -- remembered in `gone` for a while, so that a call of it still on its way (sent on a
  -- timed-out connection) is refused when it arrives (acquire). Idempotent. Replies {slots
  -- freed, places left}.
  local remember = tonumber(ARGV[3])
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  local freed, left = 0, 0
  for i = 4, #ARGV do
    local lost = ARGV[i]
    if redis.call('ZREM', holders, lost) == 1 then freed = freed + 1 end
    redis.call('HDEL', since, lost)
    if redis.call('ZSCORE', queue, lost) then
      forget_waiter(lost)
      left = left + 1
    end
    redis.call('DEL', bell .. lost)
    redis.call('ZADD', gone, now + remember, lost)
  end
  redis.call('PEXPIRE', gone, remember)
  fill()
  return {freed, left}
end

if op == 'hold_fallback_builds' then
  -- The builds an in-process fallback admitted while Redis was away, still running as Redis
  -- comes back (ResilientLimiter). Each becomes a holder with a lease, whatever `held` is
  -- (they run already: over the capacity if need be), so that no slot is given to anyone
  -- while fewer than `capacity` of them have ended; their release is the release's general
  -- path. A token held already or given up is left as it is. Not counted as acquired (the
  -- fallback admitted it). A recovery (ARGV[3]: the process is back from an outage) then
  -- ends this member's reservation (its builds are holders now), or reserves the other
  -- members' shares (Reservations, above). Replies how many it made holders.
  local added = 0
  for i = 4, #ARGV do
    if not redis.call('ZSCORE', holders, ARGV[i])
        and not redis.call('ZSCORE', gone, ARGV[i]) then
      redis.call('ZADD', holders, now + lease_ms, ARGV[i])
      added = added + 1
    end
  end
  local me, processes, reserve_ms = string.match(ARGV[3], '^(%S+) (%d+) (%d+)$')
  if me then
    local share = math.ceil(capacity / math.max(1, tonumber(processes)))
    local mine = '#' .. me .. '#'
    local dropped = 0
    for i = 1, share do dropped = dropped + redis.call('ZREM', holders, mine .. i) end
    local until_ms = tonumber(redis.call('HGET', stats, 'reserved_until'))
    if until_ms and until_ms > now then  -- another member's recovery reserved the shares
      if dropped == 0 then  -- reserved anonymously: one share of those is this member's
        for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
          if dropped >= share then break end
          if string.sub(holder, 1, 3) == '#?#' then
            dropped = dropped + redis.call('ZREM', holders, holder)
          end
        end
      end
    else  -- the first member back: every other one's share is reserved
      local ends = now + tonumber(reserve_ms)
      redis.call('HSET', stats, 'reserved_until', ends)
      local others = 0
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', tag .. 'members', '(' .. now, '+inf')) do
        if id ~= me and others < tonumber(processes) - 1 then
          others = others + 1
          for i = 1, share do redis.call('ZADD', holders, ends, '#' .. id .. '#' .. i) end
        end
      end
      for i = 1, (tonumber(processes) - 1 - others) * share do
        redis.call('ZADD', holders, ends, '#?#' .. i)
      end
    end
    if dropped > 0 then fill() end  -- the slots its reservation held go to the waiters
  end
  if added > 0 then
    local builds = redis.call('ZCARD', holders)
    for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
      if string.sub(holder, 1, 1) == '#' then builds = builds - 1 end
    end
    raise_peak('peak_active', builds)
  end
  return added
end

if op == 'record' then
  -- A process's start (its first call of the budget): its settings, written above, replaced
  -- the ones recorded, and the reap and fill above ran under them, so that a budget given
  -- more slots promotes its waiters in this same script (the rule above holds). Replies what
  -- was recorded before: {who, active, queue, wait (ms), lease (ms), deadline (1/0)}, nil
  -- for each one that was not.
  return before
end

if op == 'release_owner' then
  -- Free every slot and place of one owner (a process that died; run by its parent). Replies
  -- {slots freed, places removed}.
  local owner = ARGV[3]
  local n = #owner
  local freed, dropped = 0, 0
  for _, holder in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    if string.sub(holder, 1, n + 1) == '#' .. owner then  -- its reservation: no slot of its
      redis.call('ZREM', holders, holder)
    elseif string.sub(holder, 1, n) == owner then
      redis.call('ZREM', holders, holder)
      redis.call('HDEL', since, holder)
      redis.call('DEL', bell .. holder)
      freed = freed + 1
    end
  end
  for _, waiter in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    if string.sub(waiter, 1, n) == owner then
      forget_waiter(waiter)
      redis.call('DEL', bell .. waiter)
      dropped = dropped + 1
    end
  end
  fill()
  return {freed, dropped}
end

return redis.error_reply('limiter.lua: no operation ' .. tostring(op))
