-- No wasted waits, on Redis's clock: the rule of reachlimit._limiter's design note, for every
-- process of the budget. With an estimate E (ms), the queue is walked in the order it will be
-- promoted (round-robin over ``clients`` in turn order, each client's waiters by ticket; a
-- refused waiter passes its turn to the next of its client and counts for nobody), the p-th
-- waiter kept starting at
--
--     now + free[p % capacity] + floor(p / capacity) * E
--
-- ``free`` being how long each slot still needs, soonest first: E less what a timed holder (a
-- promotion, in ``since``) has run, never below 0, and 0 for one whose start is not known (a
-- fast-path grant: counted as ending now). A waiter whose start is later than its deadline
-- (exactly at it is in time; one past it already is its own timeout) is refused: it leaves the
-- queue, its doorbell gets "l<s>" (s: its Retry-After, ceil((start - deadline) / 1000)) and
-- ``deadline`` is counted here, so a refused waiter whose process died loses nothing. Run by
-- the acquire that has just queued a newcomer (which, refused, gets no doorbell: its reply
-- says so) and by each timed release (the estimate may have grown, the line has moved).
local function slots_free(estimate)
  local free = {}
  for _, token in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    local started = tonumber(redis.call('HGET', since, token))
    free[#free + 1] = started and estimate - math.min(estimate, math.max(0, now - started))
        or 0
  end
  while #free < capacity do free[#free + 1] = 0 end
  table.sort(free)
  return free
end

-- Refuse every late waiter; returns the Retry-After (s) of ``newcomer`` if it was one of them.
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
        local token = list[next_of[i]]
        next_of[i] = next_of[i] + 1
        local start = now + free[(kept % capacity) + 1] + math.floor(kept / capacity) * estimate
        local deadline = tonumber(redis.call('HGET', deadlines, token))
        if deadline and now < deadline and deadline < start then
          late[#late + 1] = {token, math.ceil((start - deadline) / 1000)}
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
    local token, retry = refused[1], refused[2]
    forget_waiter(token)
    redis.call('HINCRBY', stats, 'deadline', 1)
    queued = queued - 1
    if token == newcomer then
      mine = retry
    else
      redis.call('RPUSH', bell .. token, 'l' .. retry)
      redis.call('PEXPIRE', bell .. token, 2 * presence_ms)
    end
  end
  return mine
end
