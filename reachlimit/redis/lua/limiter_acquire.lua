-- Acquire's general path, after the steps. Replies 1 granted, 0 refused (queue full), or
-- {2, ms}: queued, with the milliseconds its wait lasts (the budget's wait: the waiter's
-- deadline is Redis's, and so is its length).
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
local deadline = tonumber(redis.call('HGET', deadlines, token))
if deadline then return {2, math.max(deadline - now, 0)} end
if held < capacity then  -- after promote(), a free slot means nobody is waiting
  redis.call('ZADD', holders, now + lease_ms, token)
  redis.call('HINCRBY', stats, 'acquired', 1)
  raise_peak('peak_active', held + 1)
  return 1
end
local id = ARGV[5] or '-'  -- a bare token (none sent) is the anonymous client
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
return {2, wait_ms}
