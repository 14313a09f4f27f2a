-- The general steps every limiter script shares, after limiter_count.lua. They keep ``held``
-- and ``queued`` up to date (``promote()``), so that each is counted once; ``fill()`` counts
-- afresh first, for a script that changed ``holders`` or ``queue`` itself.
--
-- Every script ends with nobody waiting while a slot is free (it fills), and only scripts
-- change ``holders`` (and the settings: limiter_record.lua fills after writing them); so at
-- the start of a script, fewer entries in ``holders`` than ``capacity`` (those whose lease
-- ended included) means an empty queue. The hot scripts (``lean``) rely on that and do not
-- look at the queue then. The other scripts count the queue every time, so a waiter's regular
-- poll would repair a state that broke the rule (a key evicted, say). When every slot is held
-- (in a lean script), the waiters are counted by their live presences: a queue full of live
-- waiters is one read, and nothing in it is due for reaping (there are never more than
-- ``queue_cap`` waiters, unless the queue was just made shorter: then the extra ones are
-- reaped once the queue is no longer full of live waiters).
--
-- The fair queue: each waiter's client in ``clientof``, each client's waiters (by ticket) in
-- ``of_client .. id``, the waiting clients in turn order in ``clients``.
local bell = tag .. 'w:'  -- .. token: a waiter's doorbell

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
  local nobody_waits = lean and held < capacity  -- the rule above
  -- Counted first, removed only if there is something to remove: a refusal writes nothing.
  if held > 0 then
    local lost = redis.call('ZCOUNT', holders, '-inf', now)
    if lost > 0 then
      for _, token in ipairs(redis.call('ZRANGEBYSCORE', holders, '-inf', now)) do
        redis.call('HDEL', since, token)
      end
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
      redis.call('HINCRBY', stats, 'lease_lost', lost)
      held = held - lost
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
-- client waiting, the oldest ticket. A client entry or a waiter of a client that is no
-- longer in the queue (a key evicted under an allkeys-* policy) is dropped on the way.
local function next_in_turn()
  while redis.call('ZCARD', clients) > 1 do
    local id = redis.call('ZRANGE', clients, 0, 0)[1]
    local token = redis.call('ZRANGE', of_client .. id, 0, 0)[1]
    if not token then
      redis.call('ZREM', clients, id)
    elseif not redis.call('ZSCORE', queue, token) then
      redis.call('ZREM', of_client .. id, token)
      redis.call('HDEL', clientof, token)
    else
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

local function promote()
  if held >= capacity or queued == 0 then return end
  -- As many waiters as there are free slots, each the next in turn.
  local promoted = 0
  while held < capacity and queued > 0 do
    local token = next_in_turn()  -- out of the queue already
    if not token then break end
    redis.call('ZADD', holders, now + presence_ms, token)
    -- A promoted grant is timed from here (no wasted waits: limiter_took.lua), when the
    -- budget's deadline is on; off, nothing is timed and nothing is refused for it.
    if deadline_on then redis.call('HSET', since, token, now) end
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
